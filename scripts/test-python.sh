#!/usr/bin/env bash
# The SQL API from another language: the Python example (examples/python, psycopg 3) against the
# extension and against the portable install, on the PostgreSQL of PG_CONFIG, in a throwaway
# cluster on IDEM_PG_PORT. The extension must be installed there (cargo pgrx install --release).
#
#   extension   examples/python/check.py on a database with CREATE EXTENSION idempotency
#   portable    the same checks on a database with the portable install (scripts/portable.sh)
#
# Each check is one test: every outcome of the in-transaction and two-phase flows mapped to HTTP,
# concurrent duplicates on one key from many threads executing once, no SAVEPOINT on any
# in-transaction outcome (counted by pg_stat_statements, preloaded here), and charges.py over HTTP.
# psycopg is installed by scripts/setup.sh (`python3 -m pip install 'psycopg[binary]'`).
# Ends with `N passed, N failed`; exits non-zero on any failure.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test-lib.sh"

echo "== Python example (psycopg 3), PostgreSQL $major"
if ! python3 -c 'import psycopg' 2>/dev/null; then
    fail "psycopg is importable by python3" "missing: run bash scripts/setup.sh (or python3 -m pip install 'psycopg[binary]')"
    summary
    exit 1
fi
script=$root/target/idempotency-portable.sql
check "bash scripts/portable.sh > target/idempotency-portable.sql" bash -c "bash scripts/portable.sh > '$script'"
# pg_stat_statements: check.py counts the SAVEPOINTs the server ran (none, on every outcome).
cluster_start python "shared_preload_libraries = 'pg_stat_statements'" || { fail "start a cluster on port $port"; summary; exit 1; }

# run_checks LABEL DB: check.py's lines become this script's tests.
run_checks() {
    local label=$1 db=$2 out p f
    out=$(cd examples/python && python3 check.py "postgresql://postgres@127.0.0.1:$port/$db" "$label" 2>&1)
    printf '%s\n' "$out" | grep -vE '^[0-9]+ passed, [0-9]+ failed$'
    read -r p f < <(printf '%s\n' "$out" | tail -1 | awk '/^[0-9]+ passed, [0-9]+ failed$/ { print $1, $3; next } { print 0, 1 }')
    passed=$((passed + p))
    failed=$((failed + f))
}

for kind in extension portable; do
    db=idem_python_$kind
    psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    if [ $kind = extension ]; then
        install=(psql_db "$db" -c "CREATE EXTENSION idempotency")
    else
        install=(psql_db "$db" -v schema=public -f "$script")
    fi
    if "${install[@]}" >"$logs/python-$kind-install.log" 2>&1; then
        run_checks "$kind" "$db"
    else
        fail "$kind: install idempotency into $db" "$(tail -5 "$logs/python-$kind-install.log")"
    fi
done

cluster_stop
summary
