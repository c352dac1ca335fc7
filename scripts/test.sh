#!/usr/bin/env bash
# The README's test command: every test layer on every supported major, run by the Rust harness
# (xtask/, `cargo run -p xtask -- test`; the layers are listed in CONTRIBUTING.md). The last line
# is `N passed, N failed, N skipped`; exits non-zero if any layer fails. Options pass through:
#   --all-majors  --majors "14 17"  --layers "regress upgrade"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# A CI run builds once from a fresh clone: incremental compilation's files (gigabytes) would
# only take disk.
if [ "${CI:-}" = true ]; then export CARGO_INCREMENTAL=0; fi
exec cargo run -q -p xtask -- test "$@"
