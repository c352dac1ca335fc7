#!/usr/bin/env bash
# Upgrade tests (released versions to the current one), on the PostgreSQL of PG_CONFIG, in a throwaway cluster on IDEM_PG_PORT.
# The extension must be installed there with every released and update script
# (cargo pgrx install, then python3 scripts/sqlbuild.py install-files SHAREDIR/extension).
#
#   files      every released install script and every update script is installed
#   update     from each released version: records in every state and a two-phase reservation in
#              flight, ALTER EXTENSION idempotency UPDATE, then every record answers as before
#              (tests/upgrade/before.sql, after.sql)
#   schema     the updated schema equals a fresh install's (tests/upgrade/schema.sql, diff -u);
#              deliberate mismatches prove the comparison sees each kind of difference
#   suites     the regress and isolation suites on an updated database
#   load       clients reserve and complete through the update: no wrong answer, no key run twice;
#              prints the locks the update holds and how long it takes (not asserted)
#
# Ends with `N passed, N failed`; exits non-zero on any failure.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test-lib.sh"

mapfile -t versions < <(python3 scripts/sqlbuild.py versions)
current=${versions[-1]}
oldest=${versions[0]}
extdir=$("$PG_CONFIG" --sharedir)/extension
echo "== upgrade tests, PostgreSQL $major, versions: ${versions[*]}"

echo "-- files"
for v in "${versions[@]}"; do
    check "installed: idempotency--$v.sql" test -f "$extdir/idempotency--$v.sql"
done
for ((i = 1; i < ${#versions[@]}; i++)); do
    check "installed: idempotency--${versions[i - 1]}--${versions[i]}.sql" \
        cmp -s "$extdir/idempotency--${versions[i - 1]}--${versions[i]}.sql" \
        <(python3 scripts/sqlbuild.py upgrade "${versions[i - 1]}" "${versions[i]}")
done

cluster_start upgrade || { fail "start a cluster on port $port"; summary; exit 1; }

echo "-- update"
psql_db postgres -c "CREATE DATABASE idem_fresh" -c "CREATE DATABASE idem_mismatch_template"
psql_db idem_fresh -c "CREATE EXTENSION idempotency"
schema_of idem_fresh public >"$logs/upgrade-schema-fresh.txt"
for old in "${versions[@]}"; do
    [ "$old" = "$current" ] && continue
    db=idem_from_${old//./_}
    psql_db postgres -c "CREATE DATABASE $db"
    check "CREATE EXTENSION idempotency VERSION '$old'" psql_db "$db" -c "CREATE EXTENSION idempotency VERSION '$old'"
    check "records in every state on $old" psql_db "$db" -f tests/upgrade/before.sql
    check "ALTER EXTENSION idempotency UPDATE from $old" psql_db "$db" -c "ALTER EXTENSION idempotency UPDATE"
    check "the extension is at version $current" \
        test "$(psql_db "$db" -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = "$current"
    sql_checks "$db" tests/upgrade/after.sql

    echo "-- schema ($old updated vs fresh $current)"
    schema_of "$db" public >"$logs/upgrade-schema-from-$old.txt"
    if diff -u "$logs/upgrade-schema-from-$old.txt" "$logs/upgrade-schema-fresh.txt" >"$logs/upgrade-schema-from-$old.diff"; then
        pass "schema updated from $old equals a fresh install ($(grep -c '' "$logs/upgrade-schema-fresh.txt") lines compared)"
    else
        fail "schema updated from $old differs from a fresh install" "$(head -60 "$logs/upgrade-schema-from-$old.diff")"
    fi
done

# Each deliberate difference must be reported: the comparison can fail, for every kind of object.
echo "-- schema comparison sees each kind of difference"
psql_db idem_mismatch_template -c "CREATE EXTENSION idempotency"
mismatches=(
    "function attribute|ALTER FUNCTION idem_sweep(integer) STABLE"
    "function body|CREATE OR REPLACE FUNCTION _idem_echo(value text) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS \$\$ SELECT quote_literal(value) \$\$"
    "function comment|COMMENT ON FUNCTION idem_stats() IS 'changed'"
    "function grant|GRANT EXECUTE ON FUNCTION idem_sweep(integer) TO PUBLIC"
    "table grant|GRANT SELECT ON idem_records TO PUBLIC"
    "column default|ALTER TABLE idem_retries ALTER COLUMN attempts SET DEFAULT 1"
    "index|CREATE INDEX idem_records_created_idx ON idem_records (created_at)"
    "constraint|ALTER TABLE idem_retries DROP CONSTRAINT idem_retries_attempts_check"
    "type|ALTER TYPE idem_reservation ADD ATTRIBUTE extra integer"
    "table comment|COMMENT ON TABLE idem_retries IS 'changed'"
    "config_dump registration|ALTER EXTENSION idempotency DROP SEQUENCE idem_token_seq"
)
for m in "${mismatches[@]}"; do
    what=${m%%|*}
    sql=${m#*|}
    psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS idem_mismatch" -c "CREATE DATABASE idem_mismatch TEMPLATE idem_mismatch_template"
    psql_db idem_mismatch -c "$sql"
    if diff -u "$logs/upgrade-schema-fresh.txt" <(schema_of idem_mismatch public) >"$logs/upgrade-mismatch.diff"; then
        fail "a deliberate $what difference is reported" "$sql"
    else
        pass "a deliberate $what difference is reported ($(grep -c '^[-+][^-+]' "$logs/upgrade-mismatch.diff") changed lines)"
        [ "$what" = "function attribute" ] && cp "$logs/upgrade-mismatch.diff" "$logs/upgrade-mismatch-example.diff"
    fi
done
echo "   (example: $logs/upgrade-mismatch-example.diff)"

echo "-- suites on a database updated from $oldest"
prepare_updated() {
    psql_db "$1" -c "CREATE EXTENSION idempotency VERSION '$oldest'" -c "ALTER EXTENSION idempotency UPDATE"
}
suites "updated-from-$oldest" prepare_updated

if [ "$oldest" != "$current" ]; then
    echo "-- load through the update ($oldest -> $current)"
    psql_db postgres -c "CREATE DATABASE idem_load"
    psql_db idem_load -c "CREATE EXTENSION idempotency VERSION '$oldest'" \
        -c "CREATE TABLE charges (id bigserial PRIMARY KEY, k integer NOT NULL)"
    clients=8
    "$bindir/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c $clients -j 4 -T 8 -P 1 \
        -f tests/upgrade/load.pgbench idem_load >"$logs/upgrade-load.log" 2>&1 &
    bench=$!
    sleep 3
    psql_db idem_load -At -F ' ' >"$logs/upgrade-lock.log" 2>&1 <<'SQL'
BEGIN;
SELECT 'update_started', clock_timestamp();
ALTER EXTENSION idempotency UPDATE;
SELECT 'lock', l.mode, 'on', count(*),
       CASE WHEN l.locktype = 'object' THEN 'objects of ' || l.classid::regclass::text || ': '
                || string_agg(pg_describe_object(l.classid, l.objid, l.objsubid), ', ' ORDER BY 1)
            ELSE l.locktype || ' ' || coalesce(string_agg(l.relation::regclass::text, ', '), '') END
  FROM pg_locks AS l WHERE l.pid = pg_backend_pid() AND l.granted AND l.locktype <> 'virtualxid'
 GROUP BY l.locktype, l.mode, l.classid ORDER BY 2, 5;
SELECT 'waiting_clients', count(*) FROM pg_stat_activity WHERE datname = 'idem_load' AND wait_event_type = 'Lock';
SELECT 'update_done', clock_timestamp();
COMMIT;
SELECT 'committed', clock_timestamp();
SQL
    check "ALTER EXTENSION idempotency UPDATE under load" grep -q '^committed' "$logs/upgrade-lock.log"
    wait $bench
    status=$?
    if [ $status = 0 ] && grep -q 'number of failed transactions: 0' "$logs/upgrade-load.log"; then
        pass "$clients clients ran through the update without an error or a wrong answer ($(grep -o 'number of transactions actually processed: [0-9]*' "$logs/upgrade-load.log" | grep -o '[0-9]*$') transactions)"
    elif [ $status = 0 ] && ! grep -q 'number of failed' "$logs/upgrade-load.log" && ! grep -q 'aborted' "$logs/upgrade-load.log"; then
        pass "$clients clients ran through the update without an error or a wrong answer"
    else
        fail "$clients clients ran through the update without an error or a wrong answer" "$(grep -iE 'error|abort|fail' "$logs/upgrade-load.log" | head -10)"
    fi
    check "extension updated to $current under load" test "$(psql_db idem_load -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" = "$current"
    sql_checks idem_load tests/upgrade/load-check.sql -v updated_at="$(awk '/^committed/ { print $2 " " $3 }' "$logs/upgrade-lock.log")"
    echo "   locks held by the update until commit (not asserted):"
    grep '^lock' "$logs/upgrade-lock.log" | cut -c1-220 | sed 's/^lock /     /'
    awk '/^update_started/ { s = $2 " " $3 } /^committed/ { c = $2 " " $3 } /^waiting_clients/ { w = $2 }
         END { printf "     update transaction: started %s, committed %s; clients waiting on a lock meanwhile: %s\n", s, c, w }' "$logs/upgrade-lock.log"
    grep -E '^progress' "$logs/upgrade-load.log" | sed 's/^/     /'
fi

cluster_stop
summary
