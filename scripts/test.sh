#!/usr/bin/env bash
# The README's test command: every test layer on every supported major, run by the Rust harness
# (xtask/, `cargo run -p xtask -- test`; the layers are listed in CONTRIBUTING.md). The last line
# is `N passed, N failed, N skipped (N distinct checks over ...)`; exits non-zero if any layer
# fails. Options pass through:
#   --all-majors  --majors "14 17"  --layers "regress upgrade"
#   --quick                          the inner loop (unit, lint, install, regress, isolation, one
#                                    e2e pass; the default major)
#   --test checklist -- NAME         one e2e test binary with a filter (after the install)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec cargo run -q -p xtask -- test "$@"
