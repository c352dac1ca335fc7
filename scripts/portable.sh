#!/usr/bin/env bash
# The portable install of idempotency: plain SQL, no native library, no superuser.
#
#   bash scripts/portable.sh > idempotency-portable.sql       the install of the current version
#       then: psql -v schema=NAME -f idempotency-portable.sql  (NAME exists and you own it)
#   bash scripts/portable.sh upgrade FROM TO > FILE           the portable upgrade FROM -> TO
#       then: psql -v schema=NAME -f FILE
#   bash scripts/portable.sh pgtle > idempotency-pgtle.sql    the pg_tle wrapper (not tested here)
#
# Built from sql/ by scripts/sqlbuild.py (see docs/upgrading.md).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
case "${1:-}" in
"") exec python3 "$here/sqlbuild.py" portable ;;
upgrade) exec python3 "$here/sqlbuild.py" portable-upgrade "${2:?FROM}" "${3:?TO}" ;;
pgtle) exec python3 "$here/sqlbuild.py" pgtle ;;
*) sed -n '2,10p' "$0" >&2; exit 2 ;;
esac
