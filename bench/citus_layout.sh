#!/usr/bin/env bash
# The record's layout on Citus (issue 43 item 6; docs/record-layout.md, "Citus"): a coordinator
# and two workers of their own, the extension at a given version, idem_records distributed by
# idem_distribute with a business table, filled through the coordinator by the API's fresh cycle
# (delegated idem_reserve then idem_complete in one transaction, pgbench), then the bytes per record of the
# distributed table's shards: heap and each index, summed over every shard.
#
#   bench/citus_layout.sh start            the three nodes (PG_CONFIG, default Debian's 15 with
#                                          Citus installed: ../shared/citus-build.md; PORT default
#                                          56380 for the coordinator, +1 and +2 for the workers;
#                                          data in target/citus-bench)
#   bench/citus_layout.sh size VERSION ROWS [CLIENTS=4]
#                                          a database cl_VERSION on every node, the extension at
#                                          VERSION (0.6.0: the released script; the update
#                                          scripts and the library as installed), ROWS fresh
#                                          cycles of users u1..u1000 and random keys, VACUUM
#                                          ANALYZE, then bytes per record of each relation's shards
#   bench/citus_layout.sh update ROWS      a database cl_update at 0.6.0, distributed, ROWS
#                                          records, a PROCESSING reservation and a retry counter;
#                                          ALTER EXTENSION idempotency UPDATE (refused on a
#                                          distributed table: printed), then docs/citus.md's
#                                          manual update (below, fn manual_update) and its checks
#   bench/citus_layout.sh stop
# KEEP=1 keeps the database (dropped on every node otherwise).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir); port=${PORT:-56380}
out=$root/target/citus-bench
nodes=(c w1 w2)
as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }
url() { echo "postgresql://postgres@127.0.0.1:$1/$2"; }
# q PORT DB SQL...: each SQL a statement of its own (autocommit).
q() {
    local p=$1 d=$2; shift 2
    local args=(); for s in "$@"; do args+=(-c "$s"); done
    "$bindir/psql" -X -At -q -v ON_ERROR_STOP=1 "$(url "$p" "$d")" "${args[@]}"
}
# database DB VERSION: DB on every node with Citus, the workers added, the extension at VERSION,
# the business table charges distributed by user_id, then idem_distribute('charges').
database() {
    local db=$1 version=$2
    for i in 0 1 2; do
        q $((port + i)) postgres "SET client_min_messages = warning" "DROP DATABASE IF EXISTS $db WITH (FORCE)" "CREATE DATABASE $db"
        q $((port + i)) "$db" "CREATE EXTENSION citus"
    done
    q "$port" "$db" "SELECT citus_set_coordinator_host('127.0.0.1', $port)" \
        "SELECT citus_add_node('127.0.0.1', $((port + 1)))" "SELECT citus_add_node('127.0.0.1', $((port + 2)))" >/dev/null
    q "$port" "$db" "CREATE EXTENSION idempotency VERSION '$version'" \
        "CREATE TABLE charges (user_id text NOT NULL, id bigserial, key text NOT NULL, PRIMARY KEY (user_id, id))" \
        "SELECT create_distributed_table('charges', 'user_id')" \
        "SET client_min_messages = warning; SELECT idem_distribute('charges')" >/dev/null
}
# fill DB ROWS CLIENTS: ROWS fresh cycles through the coordinator, each the in-transaction flow
# (BEGIN, idem_reserve, idem_complete, COMMIT: delegated, one transaction on the key's worker,
# the record written once), with bench/src/scale.rs's records: users u1..u1000, a key of a
# uniform 63-bit number, a 64-hex-digit hash, the response {"status": 201, "body": {"id": 1}}.
fill() {
    local cycle=$out/cycle-$1.pgbench
    printf '%s\n' '\set u random(1, 1000)' '\set k random(1, 9223372036854775807)' 'BEGIN;' \
        "SELECT token FROM idem_reserve('charge', 'u:u', 'k:k', '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08') \\gset" \
        "SELECT idem_complete('charge', 'u:u', 'k:k', :token, '{\"status\": 201, \"body\": {\"id\": 1}}');" 'COMMIT;' >"$cycle"
    "$bindir/pgbench" -n -M simple -c "$3" -j "$3" -t $(($2 / $3)) -f "$cycle" "$(url "$port" "$1")" >"$out/fill-$1.log" 2>&1 \
        || { tail -5 "$out/fill-$1.log" >&2; exit 1; }
}
drop() {
    [ -n "${KEEP:-}" ] || for i in 0 1 2; do q $((port + i)) postgres "DROP DATABASE IF EXISTS $1 WITH (FORCE)"; done
}
# The manual update from 0.6.0 on a cluster whose idem_records is distributed: the SQL block of
# docs/citus.md after its line "<!-- the manual update from 0.6.0 on Citus ... -->", run as written
# on the coordinator (the document is its one source).
manual_update() {
    awk '/<!-- the manual update from 0.6.0 on Citus/ { on = 1; next }
         on && /```sql/ { inside = 1; next }
         inside && /```/ { exit }
         inside { print }' "$root/docs/citus.md" >"$out/manual_update.sql"
    [ -s "$out/manual_update.sql" ] || { echo "no manual update block in docs/citus.md" >&2; exit 1; }
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url "$port" "$1")" -f "$out/manual_update.sql" >"$out/manual_update.log" 2>&1 \
        || { cat "$out/manual_update.log" >&2; exit 1; }
}
case ${1:?usage: $0 start|size|update|stop ...} in
start)
    mkdir -p "$out"; [ "$(id -u)" != 0 ] || chown postgres:postgres "$out"
    for i in 0 1 2; do
        data=$out/${nodes[$i]}; p=$((port + i))
        [ ! -f "$data/postmaster.pid" ] || as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$data"
        as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$out/initdb.log" 2>&1
        printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nshared_preload_libraries = 'citus'\nmax_connections = 200\nmax_prepared_transactions = 100\nshared_buffers = 256MB\nlog_min_messages = warning\ncitus.node_conninfo = 'sslmode=disable'\ncitus.shard_count = 8\n" \
            "$p" "$out" >>"$data/postgresql.conf"
        as_server "$bindir/pg_ctl" -D "$data" -l "$out/${nodes[$i]}.log" -w -t 60 start >/dev/null
    done
    ;;
stop)
    for i in 0 1 2; do as_server "$bindir/pg_ctl" -D "$out/${nodes[$i]}" -m fast -w stop >/dev/null; done
    ;;
size)
    version=${2:?version}; rows=${3:?rows}; clients=${4:-4}
    db=cl_${version//./_}
    database "$db" "$version"
    start=$(date +%s)
    fill "$db" "$rows" "$clients"
    n=$(q "$port" "$db" "SELECT count(*) FROM idem_records")
    q "$port" "$db" "VACUUM ANALYZE idem_records" >/dev/null
    echo "$version on Citus $(q "$port" "$db" "SELECT extversion FROM pg_extension WHERE extname = 'citus'"): $n records (pgbench $(grep -o 'tps = [0-9.]*' "$out/fill-$db.log"), $(( $(date +%s) - start )) s), primary key: $(q "$port" "$db" "SELECT pg_get_indexdef('idem_records_pkey'::regclass)" | sed 's/.* USING //')"
    # Each relation of idem_records summed over its shards (run_command_on_shards: %1$s is the shard).
    q "$port" "$db" "
        WITH per_shard AS (
            SELECT r.result::jsonb AS sizes
              FROM run_command_on_shards('idem_records', \$\$
                  SELECT jsonb_build_object('heap', pg_relation_size('%1\$s'))
                         || coalesce((SELECT jsonb_object_agg(regexp_replace(i.indexrelid::regclass::text, '_[0-9]+\$', ''),
                                                              pg_relation_size(i.indexrelid))
                                        FROM pg_index i WHERE i.indrelid = '%1\$s'::regclass), '{}')\$\$) AS r),
             summed AS (
            SELECT e.key AS relation, sum(e.value::bigint) AS bytes
              FROM per_shard, jsonb_each_text(per_shard.sizes) AS e GROUP BY e.key)
        SELECT '  ' || relation || ': ' || round(bytes / $n::numeric, 1) || ' B per record (' || pg_size_pretty(bytes) || ')'
          FROM summed
         UNION ALL
        SELECT '  all: ' || round(sum(bytes) / $n::numeric, 1) || ' B per record (' || pg_size_pretty(sum(bytes)) || ')' FROM summed"
    drop "$db"
    ;;
update)
    rows=${2:?rows}; db=cl_update
    database "$db" 0.6.0
    fill "$db" "$rows" 4
    # A reservation in flight, and a released key's counter (attempts 1).
    held=$(q "$port" "$db" "SELECT token FROM idem_reserve('charge', 'u-held', 'k', 'h')")
    q "$port" "$db" "SELECT idem_release('charge', 'u-rel', 'k', token) FROM idem_reserve('charge', 'u-rel', 'k', 'h')" >/dev/null
    before=$(q "$port" "$db" "SELECT count(*) || ' records, max token ' || max(token) FROM idem_records")
    echo "0.6.0, distributed: $before; in flight: u-held's token $held"
    echo "ALTER EXTENSION idempotency UPDATE on the coordinator:"
    q "$port" "$db" "ALTER EXTENSION idempotency UPDATE" 2>&1 | sed 's/^/  /' || true
    echo "  versions after it (coordinator, workers): $(for i in 0 1 2; do q $((port + i)) "$db" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"; done | tr '\n' ' ')"
    start=$(date +%s.%N)
    manual_update "$db"
    echo "the manual update: $(echo "$(date +%s.%N) - $start" | bc) s"
    echo "  versions (coordinator, workers): $(for i in 0 1 2; do q $((port + i)) "$db" "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"; done | tr '\n' ' ')"
    echo "  distributed: $(q "$port" "$db" "SELECT string_agg(logicalrelid::text, ' ' ORDER BY 1) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'idem%'"); idem_records_060 left: $(q "$port" "$db" "SELECT to_regclass('idem_records_060') IS NOT NULL")"
    echo "  after: $(q "$port" "$db" "SELECT count(*) || ' records, max token ' || max(token) FROM idem_records")"
    echo "  the reservation in flight completes with its token: $(q "$port" "$db" "SELECT idem_complete('charge', 'u-held', 'k', $held, '{\"done\": 1}')")"
    read -r ru rk <<<"$(q "$port" "$db" "SELECT user_id || ' ' || key FROM idem_records WHERE operation = 'charge' AND user_id LIKE 'u%' AND status = 's' LIMIT 1")"
    echo "  a replay of an old record ($ru): $(q "$port" "$db" "SELECT outcome || ' ' || response::text FROM idem_reserve('charge', '$ru', '$rk', '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08')")"
    echo "  the released key again, its counter kept: $(q "$port" "$db" "SELECT outcome || ' attempts ' || attempts FROM idem_reserve('charge', 'u-rel', 'k', 'h')")"
    # New keys of 20 users (delegated: their tokens come from the workers' sequences).
    for u in $(seq 1 20); do q "$port" "$db" "SELECT token FROM idem_reserve('after', 'u$u', 'k', 'h')" >/dev/null; done
    echo "  new tokens (20 users, both workers) above every old one in each node's range: $(q "$port" "$db" "
        SELECT (min(token & ((1::bigint << 48) - 1)) FILTER (WHERE operation = 'after')
                > max(token & ((1::bigint << 48) - 1)) FILTER (WHERE operation <> 'after' AND user_id <> 'u-rel'))
               || ' (' || count(DISTINCT token >> 48) FILTER (WHERE operation = 'after') || ' node ranges)'
          FROM idem_records")"
    drop "$db"
    ;;
*) echo "usage: $0 start|size VERSION ROWS [CLIENTS]|update ROWS|stop" >&2; exit 2 ;;
esac
