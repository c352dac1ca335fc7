# Shared by scripts/test-upgrade.sh and scripts/test-portable.sh (sourced, not run).
#
# Each test script runs its own throwaway cluster of the PostgreSQL that PG_CONFIG names, on the
# port IDEM_PG_PORT, with data under target/test-clusters/, and ends with `N passed, N failed`.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
: "${PG_CONFIG:?set PG_CONFIG to the pg_config of the PostgreSQL to test}"
: "${IDEM_PG_PORT:?set IDEM_PG_PORT to a free port for the test cluster}"
bindir=$("$PG_CONFIG" --bindir)
pgxs=$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs)")")")
major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
port=$IDEM_PG_PORT
logs=$root/target/test-logs
mkdir -p "$logs"
passed=0
failed=0

as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }

# psql_db DB ARGS...: psql against the test cluster, stopping at the first error; as the role
# in $as (default postgres).
psql_db() {
    local db=$1
    shift
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U "${as:-postgres}" -d "$db" "$@"
}

# cluster_start NAME [CONF]: a fresh cluster under target/test-clusters/NAME-MAJOR; CONF, lines
# added to its postgresql.conf.
cluster_start() {
    cluster=$root/target/test-clusters/$1-$major
    as_server "$bindir/pg_ctl" -D "$cluster/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$cluster"
    mkdir -p "$cluster"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$cluster"
    as_server "$bindir/initdb" -D "$cluster/data" -U postgres --auth=trust --encoding=UTF8 \
        --locale=C.UTF-8 >"$cluster/initdb.log" 2>&1 || { cat "$cluster/initdb.log"; return 1; }
    cat >>"$cluster/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$cluster'
max_connections = 100
max_prepared_transactions = 10
log_min_messages = warning
${2:-}
CONF
    as_server "$bindir/pg_ctl" -D "$cluster/data" -l "$cluster/server.log" -w -t 60 start >/dev/null \
        || { tail -20 "$cluster/server.log"; return 1; }
    trap cluster_stop EXIT
}

cluster_stop() {
    [ -n "${cluster:-}" ] && as_server "$bindir/pg_ctl" -D "$cluster/data" -m fast -w stop >/dev/null 2>&1
    cluster=
}

# pass LABEL / fail LABEL [DETAIL]
pass() { passed=$((passed + 1)); printf 'ok     %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAILED %s\n' "$1"; [ -z "${2:-}" ] || printf '%s\n' "$2" | sed 's/^/       /'; }

# check LABEL COMMAND...: passes when the command succeeds.
check() {
    local label=$1 out
    shift
    if out=$("$@" 2>&1); then pass "$label"; else fail "$label" "$(printf '%s\n' "$out" | tail -15)"; fi
}

# sql_checks DB FILE [psql args]: FILE prints rows `label|t` or `label|f`; each is one test.
sql_checks() {
    local db=$1 file=$2 out label ok
    shift 2
    if ! out=$(psql_db "$db" -At -F '|' -f "$file" "$@" 2>&1); then
        fail "$file" "$(printf '%s\n' "$out" | tail -15)"
        return
    fi
    while IFS='|' read -r label ok; do
        [ -n "$label" ] || continue
        if [ "$ok" = t ]; then pass "$label"; else fail "$label" "got: $ok"; fi
    done <<<"$out"
}

# schema_of DB SCHEMA: the canonical description of everything idempotency owns in SCHEMA.
schema_of() {
    psql_db "$1" -At -v schema="$2" -f tests/upgrade/schema.sql
}

# suites NAME PREPARE: the regress and isolation suites on databases PREPARE DB has set up.
# SCHEDULE (default tests/regress/schedule) picks the regress files; SPECS_SKIP (a regular
# expression, default none) leaves isolation specs out.
suites() {
    local name=$1 prepare=$2 schedule=${SCHEDULE:-tests/regress/schedule} status p f
    for suite in regress isolation; do
        local db=idem_$suite out=$root/target/$name-$suite
        psql_db postgres -c "SET client_min_messages = warning" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" &&
            "$prepare" "$db" || { fail "$name $suite: prepare $db"; continue; }
        rm -rf "$out"
        local args=(--schedule="$schedule")
        local driver=$pgxs/src/test/regress/pg_regress
        if [ $suite = isolation ]; then
            driver=$pgxs/src/test/isolation/pg_isolation_regress
            # shellcheck disable=SC2207
            args=($(cd tests/isolation/specs && ls -- *.spec | sed 's/\.spec$//' | grep -vxE "${SPECS_SKIP:-}" | sort))
        fi
        "$driver" --bindir="$bindir" --host=127.0.0.1 --port="$port" --user=postgres --use-existing \
            --dbname="$db" --inputdir="tests/$suite" --outputdir="$out" "${args[@]}" \
            >"$logs/$name-$suite.log" 2>&1
        status=$?
        p=$(grep -cE '\.\.\. +ok|^ok ' "$logs/$name-$suite.log")
        f=$(grep -cE '\.\.\. +FAILED|\.\.\. +failed|^not ok ' "$logs/$name-$suite.log")
        # Every test of the suite counts as one.
        if [ $status != 0 ] && [ "$f" = 0 ]; then f=1; fi
        passed=$((passed + p))
        failed=$((failed + f))
        if [ "$f" = 0 ]; then
            printf 'ok     %s %s suite: %s passed\n' "$name" "$suite" "$p"
        else
            printf 'FAILED %s %s suite: %s passed, %s failed\n' "$name" "$suite" "$p" "$f"
            head -80 "$out/regression.diffs" 2>/dev/null | sed 's/^/       /'
        fi
    done
}

summary() {
    printf '%d passed, %d failed\n' "$passed" "$failed"
    [ "$failed" = 0 ]
}
