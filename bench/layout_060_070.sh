#!/usr/bin/env bash
# The record layout of 0.7.0 against 0.6.0's table, in one run on one server (issue 43): the same
# library serves a database created at 0.6.0 (its text layout) and one at 0.7.0 (the compact one).
#
#   bench/layout_060_070.sh start          a server of its own (PG_CONFIG, PORT default 56243, data
#                                          in OUT, default target/hlayout, fsync on, shared_buffers 256MB,
#                                          max_wal_size 8GB, checkpoint_timeout 1h, autovacuum off)
#   bench/layout_060_070.sh wal [N=3000]   WAL per fresh cycle (bench/pgbench/fresh.sql), exact, by
#                                          pg_walinspect, at 10k records, both layouts (HASH=hex:
#                                          a 64-hex-digit request hash, as clients send)
#   bench/layout_060_070.sh size [ROWS]    bytes per record (heap and each index) after ROWS records
#                                          (default 1,000,000) and VACUUM ANALYZE, both layouts
#   bench/layout_060_070.sh update [ROWS]  ALTER EXTENSION idempotency UPDATE of a 0.6.0 database of
#                                          ROWS records (1,000 PROCESSING): its time, which is the
#                                          time it holds idem_records' ACCESS EXCLUSIVE lock (catalog
#                                          only: it moves no record); then the move that follows it,
#                                          idem_move_records(BATCH, default 10000) until it answers 0
#                                          (each call its own transaction, as the worker runs it):
#                                          rows per second, WAL per row, the old table dropped
#   bench/layout_060_070.sh stop
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$root/target/postgres/18/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir); port=${PORT:-56243}
out=${OUT:-$root/target/hlayout}; data=$out/data
url() { echo "postgresql://postgres@127.0.0.1:$port/$1"; }
as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }
q() { "$bindir/psql" -X -At -v ON_ERROR_STOP=1 "$(url "$1")" -c "$2"; }
# A database at VERSION with the benchmark's table (bench/pgbench/setup.sql's business table).
db() {
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url postgres)" -c "DROP DATABASE IF EXISTS $1" -c "CREATE DATABASE $1"
    q "$1" "CREATE EXTENSION idempotency VERSION '$2'; CREATE EXTENSION pg_walinspect;
            CREATE TABLE bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)"
}
# ROWS records as bench/src/scale.rs writes them (users u1..u1000, keys k + a uniform 63-bit
# number, a 64-hex-digit hash, a 65-byte response, an owner, expiries over 22 hours), the first
# 1,000 PROCESSING, in the database's layout.
fill() {
    local rows=$2
    local common="FROM generate_series(1, $rows::bigint) AS i,
         LATERAL (SELECT 'u' || (1 + i % 1000) AS u, 'k' || abs(hashint8extended(i, 0)) AS k,
                         encode(sha256(i::text::bytea), 'hex') AS h, CASE WHEN i <= 1000 THEN 'PROCESSING' ELSE 'SUCCESS' END AS st,
                         now() + interval '2 hours' + (i::float8 / $rows) * interval '22 hours' AS e) AS t"
    if [ "$(q "$1" "SELECT count(*) FROM pg_attribute WHERE attrelid = 'idem_records'::regclass AND attname = 'id'")" = 1 ]; then
        q "$1" "INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response, lease_expires_at,
                                          expires_at, created_at, updated_at, owner, attempts)
                SELECT _idem_id('bench.fresh', u, k), 'bench.fresh', u, k, _idem_hash(h), _idem_status_code(st), i,
                       '{\"status\": 201, \"body\": {\"id\": 1}}', e - interval '1 day' + interval '5 minutes', e,
                       e - interval '1 day', e - interval '1 day', to_regrole(current_user), 0 $common"
    else
        q "$1" "INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response, lease_expires_at,
                                          expires_at, created_at, updated_at, owner)
                SELECT 'bench.fresh', u, k, h, st, i, '{\"status\": 201, \"body\": {\"id\": 1}}',
                       e - interval '1 day' + interval '5 minutes', e, e - interval '1 day', e - interval '1 day',
                       to_regrole(current_user) $common"
    fi
    q "$1" "SELECT setval('idem_token_seq', $rows)" >/dev/null
    q "$1" "VACUUM ANALYZE idem_records" >/dev/null
}
case ${1:?usage: $0 start|wal|size|update|stop} in
start)
    [ ! -f "$data/postmaster.pid" ] || as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$out"; mkdir -p "$out"; [ "$(id -u)" != 0 ] || chown postgres:postgres "$out"
    as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$out/initdb.log" 2>&1
    printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nshared_buffers = 256MB\nfsync = on\nmax_wal_size = 8GB\ncheckpoint_timeout = 1h\nautovacuum = off\nlog_min_messages = warning\n" "$port" "$out" >>"$data/postgresql.conf"
    as_server "$bindir/pg_ctl" -D "$data" -l "$out/server.log" -w -t 60 start >/dev/null
    ;;
stop) as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop ;;
wal)
    # fresh.sql sends the request hash 'h'; HASH=hex sends 64 lowercase hex digits instead, as
    # the clients do (their fingerprint), which 0.6.0 stores as 65 bytes of text and 0.7.0 as 33.
    n=${2:-3000} script=$root/bench/pgbench/fresh.sql
    if [ "${HASH:-}" = hex ]; then
        script=$out/fresh_hex.sql
        sed "s/'k' || :k, 'h')/'k' || :k, '$(printf '%064x' 0 | tr 0 a)')/" "$root/bench/pgbench/fresh.sql" >"$script"
        grep -q "'aaaa" "$script"
    fi
    for v in 0.6.0 0.7.0; do
        d=w${v//./}; db "$d" "$v"; fill "$d" 10000
        run() { "$bindir/pgbench" -n -M prepared -c1 -t "$1" -f "$script" "$(url "$d")" >/dev/null; }
        run 200; q "$d" "CHECKPOINT" >/dev/null; run 500
        a=$(q "$d" "SELECT pg_current_wal_insert_lsn()"); run "$n"; b=$(q "$d" "SELECT pg_current_wal_insert_lsn()")
        q "$d" "SELECT '$v fresh: ' || $n || ' cycles, ' || round(pg_wal_lsn_diff('$b', '$a') / $n::numeric, 1) || ' B per cycle ('
                   || round(sum(combined_size - fpi_size) / $n::numeric, 1) || ' B without full-page images)'
              FROM pg_get_wal_stats('$a', '$b', false)"
        q "$d" "SELECT '  ' || \"resource_manager/record_type\" || ': ' || round(combined_size / $n::numeric, 1) || ' B, '
                   || round(count / $n::numeric, 2) || ' records per cycle'
              FROM pg_get_wal_stats('$a', '$b', true) WHERE count > 0 ORDER BY combined_size DESC"
    done
    ;;
size)
    rows=${2:-1000000}
    for v in 0.6.0 0.7.0; do
        d=s${v//./}; db "$d" "$v"; fill "$d" "$rows"
        q "$d" "SELECT '$v, $rows records: ' || string_agg(w || ' ' || round(b / $rows::numeric, 1) || ' B', ', ' ORDER BY o)
                       || ', all ' || round(sum(b) / $rows::numeric, 1) || ' B per record'
                  FROM (SELECT 0 AS o, 'heap' AS w, pg_relation_size('idem_records') AS b
                        UNION ALL SELECT 1, 'TOAST', coalesce(pg_total_relation_size(NULLIF(reltoastrelid, 0)), 0)
                                    FROM pg_class WHERE oid = 'idem_records'::regclass
                        UNION ALL SELECT 2, indexrelid::regclass::text, pg_relation_size(indexrelid)
                                    FROM pg_index WHERE indrelid = 'idem_records'::regclass) AS x"
    done
    ;;
update)
    rows=${2:-1000000}
    d=u060; db "$d" 0.6.0; fill "$d" "$rows"
    q "$d" "CHECKPOINT" >/dev/null
    a=$(q "$d" "SELECT pg_current_wal_insert_lsn()")
    t=$( { /usr/bin/time -f %e "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url "$d")" -c "ALTER EXTENSION idempotency UPDATE" ; } 2>&1 )
    b=$(q "$d" "SELECT pg_current_wal_insert_lsn()")
    q "$d" "SELECT 'update 0.6.0 -> ' || extversion || ' of $rows records: ${t} s in one transaction holding idem_records''s ACCESS EXCLUSIVE lock, '
                   || pg_wal_lsn_diff('$b', '$a') || ' B of WAL; records after: ' || (SELECT count(*) FROM idem_records)
                   || ' in idem_records, ' || (SELECT count(*) FROM idem_records_060) || ' in idem_records_060'
              FROM pg_extension WHERE extname = 'idempotency'"
    batch=${BATCH:-10000} calls=0 started=$(date +%s.%N)
    while [ "$(q "$d" "SELECT idem_move_records($batch)")" != 0 ]; do calls=$((calls + 1)); done
    ended=$(date +%s.%N)
    c=$(q "$d" "SELECT pg_current_wal_insert_lsn()")
    q "$d" "SELECT 'the move: $rows records in ' || round(($ended - $started)::numeric, 1) || ' s, $calls batches of $batch ('
                   || round($rows / ($ended - $started)::numeric) || ' rows/s, ' || round(pg_wal_lsn_diff('$c', '$b') / $rows::numeric, 1)
                   || ' B of WAL per row); records after: ' || (SELECT count(*) FROM idem_records)
                   || ', idem_records_060 ' || CASE WHEN to_regclass('idem_records_060') IS NULL THEN 'dropped' ELSE 'left' END"
    ;;
esac
