#!/usr/bin/env bash
# Portable install tests (issue 11), on the PostgreSQL of PG_CONFIG, in a throwaway cluster on
# IDEM_PG_PORT. The extension must be installed there too (fingerprint parity compares with it).
#
#   build      bash scripts/portable.sh: one plain-SQL script, no LANGUAGE c, no library
#   install    by a role that only owns the schema (no superuser); the API works for an app role
#              with USAGE + EXECUTE; nobody else reads records; operator functions not PUBLIC
#   refuse     a second install, a schema holding the extension, a missing schema, no -v schema:
#              each fails and changes nothing (schema compared before and after)
#   parity     idem_fingerprint: PL/pgSQL against the extension's Rust, on IDEM_PARITY_COUNT
#              (default 5000) generated JSON texts and their jsonb values, plus invalid texts
#   defaults   the portable defaults of the settings equal the extension's
#   suites     the regress suite (less install, members, guc_prefix and privileges, which test the extension's own
#              catalog entries and CREATE EXTENSION, and write_once, the native hot path's own flow) and
#              the isolation suite (less lock_budget_nowait, the native dirty read), on a portable install
#   upgrade    the portable upgrade script between consecutive versions: records kept, answers
#              unchanged, schema equal to a fresh portable install, suites pass, a second run refused
#
# Ends with `N passed, N failed`; exits non-zero on any failure.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test-lib.sh"

mapfile -t versions < <(python3 scripts/sqlbuild.py versions)
current=${versions[-1]}
script=$root/target/idempotency-portable.sql
echo "== portable install tests, PostgreSQL $major, version $current"

echo "-- build"
check "bash scripts/portable.sh > target/idempotency-portable.sql" bash -c "bash scripts/portable.sh > '$script'"
check "the script has no LANGUAGE c function and names no library" \
    bash -c "! grep -v '^[[:space:]]*--' '$script' | grep -inE 'language[[:space:]]+c\\b|MODULE_PATHNAME|\\\$libdir'"
check "the pg_tle wrapper builds (not installable here: no pg_tle)" bash -c "bash scripts/portable.sh pgtle >'$root/target/idempotency-pgtle.sql'"

cluster_start portable || { fail "start a cluster on port $port"; summary; exit 1; }

# install_portable DB SCHEMA [ROLE]: the documented command.
install_portable() {
    as=${3:-postgres} psql_db "$1" -v ON_ERROR_STOP=0 -v schema="$2" -f "${4:-$script}"
}

echo "-- install (no superuser)"
psql_db postgres -c "CREATE ROLE idem_owner LOGIN" -c "CREATE ROLE idem_app LOGIN" -c "CREATE ROLE idem_other LOGIN" \
    -c "CREATE DATABASE idem_portable"
psql_db idem_portable -c "CREATE SCHEMA idem AUTHORIZATION idem_owner" -c "CREATE SCHEMA ext" \
    -c "CREATE EXTENSION idempotency SCHEMA ext" -c "CREATE TABLE public.orders (id int)" -c "GRANT INSERT ON public.orders TO idem_app"
check "psql -v schema=idem -f idempotency-portable.sql, as the schema's owner (not a superuser)" \
    install_portable idem_portable idem idem_owner
sql_checks idem_portable /dev/stdin <<'SQL'
SELECT 'the installing role is no superuser', NOT rolsuper FROM pg_roles WHERE rolname = 'idem_owner';
SELECT 'no function of the install is LANGUAGE c',
       NOT EXISTS (SELECT FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                    WHERE p.pronamespace = 'idem'::regnamespace AND l.lanname NOT IN ('plpgsql', 'sql'));
SELECT 'every function the extension has, the portable install has (same arguments, defaults, result)',
       NOT EXISTS (SELECT p.proname, pg_get_function_arguments(p.oid),
                          replace(pg_get_function_result(p.oid), 'ext.', '')
                     FROM pg_proc p WHERE p.pronamespace = 'ext'::regnamespace
                   EXCEPT
                   SELECT p.proname, pg_get_function_arguments(p.oid),
                          replace(pg_get_function_result(p.oid), 'idem.', '')
                     FROM pg_proc p WHERE p.pronamespace = 'idem'::regnamespace);
SELECT 'the same tables, columns and types as the extension',
       NOT EXISTS (SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                    WHERE c.relnamespace = 'ext'::regnamespace
                   EXCEPT
                   SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
                     FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                    WHERE c.relnamespace = 'idem'::regnamespace);
SELECT 'PUBLIC cannot read or change the tables',
       NOT has_table_privilege('public', 'idem.idem_records', 'SELECT, INSERT, UPDATE, DELETE')
       AND NOT has_table_privilege('public', 'idem.idem_retries', 'SELECT, INSERT, UPDATE, DELETE');
SELECT 'the operator functions are not PUBLIC',
       NOT has_function_privilege('public', 'idem.idem_sweep(integer)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_recover_stuck(integer,text,integer)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_lookup(text,text,text)', 'EXECUTE')
       AND NOT has_function_privilege('public', 'idem.idem_stats()', 'EXECUTE');
SQL
# The schema's owner grants the app role what the README's recipe grants.
as=idem_owner psql_db idem_portable -c "GRANT USAGE ON SCHEMA idem TO idem_app"
as=idem_app sql_checks idem_portable /dev/stdin <<'SQL'
BEGIN;
SELECT token AS t FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{"a": 1}'::jsonb)) \gset
INSERT INTO public.orders VALUES (1);
SELECT 'an app role with USAGE completes a reservation in its transaction', idem.idem_complete('o', 'u', 'k', :t, '{"id": 1}');
COMMIT;
SELECT 'and the key replays its response', outcome = 'replay' AND response = '{"id": 1}'
  FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{"a": 1}'::jsonb));
SELECT 'the app role cannot read the records', NOT has_table_privilege('idem.idem_records', 'SELECT');
SQL

echo "-- refuse, changing nothing"
schema_of idem_portable idem >"$logs/portable-schema-before.txt"
refused() { # refused LABEL EXPECTED-MESSAGE COMMAND...: fails, says why, changes nothing
    local label=$1 want=$2 out
    shift 2
    if out=$("$@" 2>&1); then
        fail "$label: refused" "it succeeded"
    elif ! grep -q -- "$want" <<<"$out"; then
        fail "$label: refused with a clear error" "$out"
    elif ! diff -u "$logs/portable-schema-before.txt" <(schema_of idem_portable idem) >/dev/null ||
        [ "$(object_count)" != "$objects" ]; then
        fail "$label: refused, changing nothing" "the schema changed"
    else
        pass "$label: refused ($(grep -m1 -o 'ERROR: .*' <<<"$out" | cut -c1-110)), nothing changed"
    fi
}
object_count() { # every relation, function and type outside the system schemas
    psql_db idem_portable -At -c "WITH sys(ns) AS (SELECT oid FROM pg_namespace WHERE nspname IN ('pg_catalog', 'information_schema', 'pg_toast'))
        SELECT (SELECT count(*) FROM pg_class WHERE relnamespace NOT IN (SELECT ns FROM sys))
             + (SELECT count(*) FROM pg_proc WHERE pronamespace NOT IN (SELECT ns FROM sys))
             + (SELECT count(*) FROM pg_type WHERE typnamespace NOT IN (SELECT ns FROM sys))"
}
psql_db idem_portable -c "CREATE SCHEMA locked" -c "GRANT USAGE ON SCHEMA locked TO idem_other"
objects=$(object_count)
refused "a second install into the same schema" "already holds idempotency" install_portable idem_portable idem idem_owner
refused "an install into the schema holding the extension" "holds the idempotency extension" install_portable idem_portable ext
refused "an install into a missing schema" "does not exist" install_portable idem_portable nosuchschema
refused "an install without -v schema" "missing -v schema" psql_db idem_portable -v ON_ERROR_STOP=0 -f "$script"
refused "an install by a role without CREATE on the schema" "permission denied" install_portable idem_portable locked idem_other

echo "-- parity of idem_fingerprint with the extension"
psql_db idem_portable -c "CREATE SCHEMA port"
install_portable idem_portable port
sql_checks idem_portable tests/portable/parity.sql -v count="${IDEM_PARITY_COUNT:-5000}"

echo "-- defaults"
for setting in ttl lease max_retries max_response_bytes; do
    # Each side in a new session, the portable one first: the extension's call loads its library.
    p=$(psql_db idem_portable -At -c "SELECT port._idem_setting('idempotency.$setting'), port._idem_max_response_bytes()")
    e=$(psql_db idem_portable -At -c "SELECT ext._idem_setting('idempotency.$setting'), ext._idem_max_response_bytes()")
    check "default of idempotency.$setting: portable ${p%%|*} = extension ${e%%|*}" test "$p" = "$e"
done

echo "-- suites on a portable install"
grep -vxE 'test: (install|members|guc_prefix|privileges|write_once)' tests/regress/schedule >"$root/target/portable-schedule"
prepare_portable() { install_portable "$1" public; }
SCHEDULE=$root/target/portable-schedule SPECS_SKIP=lock_budget_nowait suites portable prepare_portable

echo "-- portable upgrade"
for ((i = 1; i < ${#versions[@]}; i++)); do
    old=${versions[i - 1]}
    new=${versions[i]}
    # The first portable version is 0.2.0; an older one is built from its released snapshot only
    # to prove the upgrade mechanism.
    python3 scripts/sqlbuild.py portable "$old" >"$root/target/idempotency-portable-$old.sql"
    bash scripts/portable.sh upgrade "$old" "$new" >"$root/target/idempotency-portable-$old--$new.sql"
    db=idem_portable_from_${old//./_}
    psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    check "portable $old installs" install_portable "$db" public postgres "$root/target/idempotency-portable-$old.sql"
    check "records in every state on portable $old" psql_db "$db" -f tests/upgrade/before.sql
    check "portable upgrade $old -> $new" install_portable "$db" public postgres "$root/target/idempotency-portable-$old--$new.sql"
    check "the schema records version $new" test "$(psql_db "$db" -At -c "SELECT _idem_portable_version()")" = "$new"
    sql_checks "$db" tests/upgrade/after.sql
    psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS idem_portable_fresh" -c "CREATE DATABASE idem_portable_fresh"
    # A fresh install of the version the step ends at (built from its released snapshot when
    # that is not the current one).
    python3 scripts/sqlbuild.py portable "$new" >"$root/target/idempotency-portable-fresh-$new.sql"
    install_portable idem_portable_fresh public postgres "$root/target/idempotency-portable-fresh-$new.sql"
    if diff -u <(schema_of "$db" public) <(schema_of idem_portable_fresh public) >"$logs/portable-upgrade-$old.diff"; then
        pass "portable schema upgraded from $old equals a fresh portable install of $new"
    else
        fail "portable schema upgraded from $old equals a fresh portable install of $new" "$(head -40 "$logs/portable-upgrade-$old.diff")"
    fi
    schema_of "$db" public >"$logs/portable-schema-before.txt"
    if out=$(install_portable "$db" public postgres "$root/target/idempotency-portable-$old--$new.sql" 2>&1); then
        fail "the upgrade script refuses a schema already at $new"
    elif diff -q "$logs/portable-schema-before.txt" <(schema_of "$db" public) >/dev/null; then
        pass "the upgrade script refuses a schema already at $new ($(grep -m1 -o 'ERROR: .*' <<<"$out" | cut -c1-90)), nothing changed"
    else
        fail "the upgrade script refuses a schema already at $new, changing nothing"
    fi
    prepare_upgraded_portable() {
        install_portable "$1" public postgres "$root/target/idempotency-portable-$old.sql" &&
            install_portable "$1" public postgres "$root/target/idempotency-portable-$old--$new.sql"
    }
    # The suites are the current version's: they run on the step that ends at it.
    if [ "$new" = "$current" ]; then
        SCHEDULE=$root/target/portable-schedule SPECS_SKIP=lock_budget_nowait suites "portable-from-$old" prepare_upgraded_portable
    fi
done
# Every step in a row, from the oldest version to the current one (0.1.0 -> ... -> current).
if [ ${#versions[@]} -gt 2 ]; then
    db=idem_portable_chain
    psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    install_portable "$db" public postgres "$root/target/idempotency-portable-${versions[0]}.sql" >/dev/null
    check "records in every state on portable ${versions[0]}" psql_db "$db" -f tests/upgrade/before.sql
    chain_ok=1
    for ((i = 1; i < ${#versions[@]}; i++)); do
        install_portable "$db" public postgres "$root/target/idempotency-portable-${versions[i - 1]}--${versions[i]}.sql" >/dev/null 2>&1 || chain_ok=0
    done
    check "portable upgrades in a row ${versions[*]}" test "$chain_ok" = 1 -a "$(psql_db "$db" -At -c "SELECT _idem_portable_version()")" = "$current"
    sql_checks "$db" tests/upgrade/after.sql
    if diff -u <(schema_of "$db" public) <(schema_of idem_portable_fresh public) >"$logs/portable-upgrade-chain.diff"; then
        pass "portable schema upgraded from ${versions[0]} step by step equals a fresh portable install of $current"
    else
        fail "portable schema upgraded from ${versions[0]} step by step equals a fresh portable install of $current" "$(head -40 "$logs/portable-upgrade-chain.diff")"
    fi
fi
if [ "$current" = 0.2.0 ]; then
    echo "   (0.2.0 is the first portable version: no portable upgrade from it exists yet; the mechanism"
    echo "    is proven above on 0.1.0 -> 0.2.0, 0.1.0 built from its released snapshot for the test.)"
fi

cluster_stop
summary
