#!/usr/bin/env bash
# The record's layout, measured on prototypes (issue 43; docs/record-layout.md): each layout is
# bench/layout/NAME.sql, a psql setup (the tables, the sequence, bench_charges, and two functions:
# proto_fill(rows bigint, hours integer) writes finished records as the fresh cycle writes them,
# expiring from `hours` ahead over 22 hours; proto_sweep(batch integer) deletes one batch of
# expired records as idem_sweep does) followed, after a line `-- cycle`, by the pgbench script of
# one fresh cycle written by hand with the same round trips and the same writes as the
# extension's native path (reserve: the two probes and the key's advisory lock; the business
# insert; complete: one plain INSERT of the finished record with a token from the layout's
# source). No extension is installed: any PostgreSQL 15+ tree with pg_walinspect works.
#
#   bench/layout.sh start                  a server of its own (PG_CONFIG, PORT default 56240,
#                                          data in target/h7; fsync on, shared_buffers 256MB,
#                                          max_wal_size 8GB, checkpoint_timeout 1h: only the
#                                          script's CHECKPOINTs)
#   bench/layout.sh wal LAYOUT [N=3000]    10,000 records, then WAL per fresh cycle exactly as
#                                          bench/wal_per_cycle.sh (1 client, 200 cycles, CHECKPOINT,
#                                          500 cycles, then N measured), with a breakdown
#   bench/layout.sh size LAYOUT ROWS       ROWS records (random key order), VACUUM ANALYZE: bytes
#                                          per record of the heap and of each index
#   bench/layout.sh scale LAYOUT ROWS [N=20000] [CLIENTS=4]
#                                          ROWS records, CHECKPOINT, then N fresh cycles: WAL per
#                                          cycle (full-page images apart, and those per relation),
#                                          blocks read per cycle; N may be a list (20000,200000),
#                                          each figure over the cycles since the CHECKPOINT;
#                                          SIZES=1 prints the bytes per record first
#   bench/layout.sh cpu LAYOUT [SECONDS=6]  10,000 records: backend CPU per fresh cycle (1 client)
#   bench/layout.sh churn LAYOUT ROWS [BATCH=10000]
#                                          one sweep batch after churn (the expiry index's cost)
#   bench/layout.sh sweep LAYOUT ROWS [BATCH=10000]
#                                          ROWS expired records: proto_sweep(BATCH) until a short
#                                          batch, time per batch (first/last decile), WAL per row
#   bench/layout.sh upgrade TARGET ROWS [BATCH=10000]
#                                          0.6.0's table with ROWS records to TARGET's: ALTER TABLE
#                                          ways timed, then the plan's rename and batched move
#                                          (LOAD=SECONDS: fresh cycles before and during the move)
#   bench/layout.sh stop
# Each command but start/stop creates the database l_LAYOUT and drops it at the end (KEEP=1 keeps
# it). The fill runs with fsync on (exact WAL is not read from it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$root/target/postgres/17/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir); port=${PORT:-56240}
out=$root/target/h7; data=$out/data
as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }
url() { echo "postgresql://postgres@127.0.0.1:$port/$1"; }
q() { "$bindir/psql" -X -At -v ON_ERROR_STOP=1 "$(url "$db")" -c "$1"; }
setup() {
    layout=$1 db=l_$1 file=$root/bench/layout/$1.sql
    [ -f "$file" ] || { echo "no layout $file" >&2; exit 2; }
    cycle=$out/$1.cycle.sql
    sed -n '/^-- cycle$/,$p' "$file" >"$cycle"
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url postgres)" -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    sed '/^-- cycle$/,$d' "$file" | (cd "$root/bench/layout" && "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url "$db")" -f -)
    q "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null
}
sizes() {
    q "SELECT '  ' || c.relname || ': ' || round(pg_relation_size(c.oid) / $1::numeric, 1) || ' B per record ('
              || pg_size_pretty(pg_relation_size(c.oid)) || ')'
         FROM pg_class c WHERE c.relname LIKE 'idem_records%' AND c.relkind IN ('r', 'i') ORDER BY c.relkind DESC, c.relname"
    q "SELECT '  all: ' || round(pg_total_relation_size('idem_records') / $1::numeric, 1) || ' B per record ('
              || pg_size_pretty(pg_total_relation_size('idem_records')) || ')'"
}
drop() { [ -n "${KEEP:-}" ] || "$bindir/psql" -X -q "$(url postgres)" -c "DROP DATABASE IF EXISTS $db"; }
cycles() { "$bindir/pgbench" -n -M prepared -c "$2" -j "$(( $2 < 2 ? 1 : 2 ))" -t "$1" -f "$cycle" "$(url "$db")" >/dev/null; }
case ${1:?usage: $0 start|stop|wal|size|scale|sweep ...} in
start)
    [ ! -f "$data/postmaster.pid" ] || as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$data"; mkdir -p "$out"; [ "$(id -u)" != 0 ] || chown postgres:postgres "$out"
    as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$out/initdb.log" 2>&1
    printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 100\nshared_buffers = 256MB\nfsync = on\nmax_wal_size = 8GB\ncheckpoint_timeout = 1h\nlog_min_messages = warning\nlog_checkpoints = on\nautovacuum = off\n" "$port" "$out" >>"$data/postgresql.conf"
    as_server "$bindir/pg_ctl" -D "$data" -l "$out/server.log" -w -t 60 start >/dev/null
    ;;
stop) as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop ;;
wal)
    setup "$2"; n=${3:-3000}
    q "SELECT proto_fill(10000, 2)" >/dev/null; q "VACUUM ANALYZE" >/dev/null
    cycles 200 1; q "CHECKPOINT" >/dev/null; cycles 500 1
    a=$(q "SELECT pg_current_wal_insert_lsn()"); cycles "$n" 1; b=$(q "SELECT pg_current_wal_insert_lsn()")
    q "SELECT '$layout wal: ' || $n || ' cycles, ' || round(pg_wal_lsn_diff('$b', '$a') / $n::numeric, 1) || ' B per cycle ('
              || round(sum(combined_size - fpi_size) / $n::numeric, 1) || ' B without full-page images)'
         FROM pg_get_wal_stats('$a', '$b', false)"
    q "SELECT '  ' || \"resource_manager/record_type\" || ': ' || round(combined_size / $n::numeric, 1) || ' B, '
              || round(count / $n::numeric, 2) || ' records per cycle'
         FROM pg_get_wal_stats('$a', '$b', true) WHERE count > 0 ORDER BY combined_size DESC"
    drop
    ;;
size)
    setup "$2"; rows=$3
    t0=$(date +%s.%N); q "SELECT proto_fill($rows, 2)" >/dev/null; t1=$(date +%s.%N)
    q "VACUUM ANALYZE" >/dev/null
    echo "$layout size: $rows records, fill $(echo "$t1 - $t0" | bc) s"
    sizes "$rows"
    drop
    ;;
scale)
    # N may be a list (20000,200000): each figure is over the cycles since the CHECKPOINT.
    setup "$2"; rows=$3 list=${4:-20000} clients=${5:-4}
    q "SELECT proto_fill($rows, 2)" >/dev/null; q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
    [ -z "${SIZES:-}" ] || sizes "$rows"
    read0=$(q "SELECT sum(heap_blks_read + coalesce(idx_blks_read, 0)) FROM pg_statio_user_tables")
    a=$(q "SELECT pg_current_wal_insert_lsn()"); t0=$(date +%s.%N); done_n=0
    for n in ${list//,/ }; do
        cycles $(( (n - done_n) / clients )) "$clients"; done_n=$n
        t1=$(date +%s.%N); b=$(q "SELECT pg_current_wal_insert_lsn()")
        read1=$(q "SELECT sum(heap_blks_read + coalesce(idx_blks_read, 0)) FROM pg_statio_user_tables")
        q "SELECT '$layout scale: $rows records, ' || $n || ' cycles after a CHECKPOINT ($clients clients, '
                  || round($n / ($t1 - $t0)) || ' tps): ' || round(pg_wal_lsn_diff('$b', '$a') / $n::numeric, 1) || ' B per cycle ('
                  || round(sum(combined_size - fpi_size) / $n::numeric, 1) || ' B without full-page images, '
                  || round(sum(fpi_size) / $n::numeric, 1) || ' B of them), blocks read per cycle '
                  || round(($read1 - $read0) / $n::numeric, 2)
             FROM pg_get_wal_stats('$a', '$b', false)"
        q "SELECT '  ' || c.relname || ': ' || count(*) || ' full-page images, ' || round(count(*) / $n::numeric, 3) || ' per cycle'
             FROM pg_get_wal_block_info('$a', '$b') w JOIN pg_class c ON c.relfilenode = w.relfilenode
            WHERE w.block_fpi_length > 0 GROUP BY c.relname ORDER BY count(*) DESC LIMIT 3"
    done
    drop
    ;;
cpu)
    # Backend CPU per cycle: the scheduler's exact CPU time of the pgbench client's backend
    # (/proc/PID/schedstat, nanoseconds) over SECONDS of cycles in the middle of a run, divided by
    # the business rows written meanwhile (one per cycle).
    setup "$2"; secs=${3:-6}
    q "SELECT proto_fill(10000, 2)" >/dev/null; q "VACUUM ANALYZE" >/dev/null
    "$bindir/pgbench" -n -M prepared -c 1 -T $(( secs + 4 )) -f "$cycle" "$(url "$db")" >/dev/null & bench=$!
    sleep 2
    pid=$(q "SELECT pid FROM pg_stat_activity WHERE datname = '$db' AND application_name = 'pgbench'")
    sample() { echo "$(cut -d' ' -f1 "/proc/$pid/schedstat") $(q "SELECT last_value FROM bench_charges_id_seq")"; }
    read -r ns0 n0 < <(sample); sleep "$secs"; read -r ns1 n1 < <(sample); wait $bench
    echo "$layout cpu: $(( n1 - n0 )) cycles, $(( (ns1 - ns0) / (n1 - n0) / 1000 )) us of backend CPU per cycle"
    drop
    ;;
churn)
    # The expiry index after churn: ROWS records expiring from 11 hours ago over 22 hours, the
    # expired half swept and vacuumed, ROWS/2 new records (expiring 11 to 22 hours ahead) written
    # into the freed space; then one sweep batch of the records expiring within the next hour, as
    # the sweep will meet them: its time and the blocks it touched (heap and indexes).
    setup "$2"; rows=$3 batch=${4:-10000}
    q "SELECT proto_fill($rows, -11)" >/dev/null; q "VACUUM ANALYZE" >/dev/null
    while [ "$(q "SELECT proto_sweep(100000)")" -ge 100000 ]; do :; done
    q "VACUUM" >/dev/null; q "SELECT proto_fill($rows / 2, 11)" >/dev/null; q "VACUUM ANALYZE" >/dev/null
    blocks() { sleep 1; q "SELECT sum(heap_blks_read + heap_blks_hit + coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0))
                            FROM pg_statio_user_tables WHERE relname = 'idem_records'"; }
    b0=$(blocks); t0=$(date +%s.%N)
    got=$(q "SELECT proto_sweep($batch, now() + interval '1 hour')"); t1=$(date +%s.%N); b1=$(blocks)
    echo "$layout churn: $rows records, after churn one batch deleted $got rows in $(echo "($t1 - $t0) * 1000 / 1" | bc) ms, $(( b1 - b0 )) blocks touched (heap $(q "SELECT pg_relation_size('idem_records') / 8192") pages)"
    drop
    ;;
upgrade)
    # From 0.6.0's table (layout v060, ROWS live records, 1,000 of them PROCESSING) to the layout
    # of bench/layout/TARGET.sql's idem_records: the time of each ALTER TABLE way (rolled back),
    # then the plan's: the old table renamed aside and the new one created in one transaction,
    # then the old rows moved in batches of BATCH (one transaction each): rows/s and WAL per row.
    target=$2; setup v060; rows=$3 batch=${4:-10000}
    q "SELECT proto_fill($rows, 2)" >/dev/null
    q "UPDATE idem_records SET status = 'PROCESSING', response = NULL WHERE token <= 1000" >/dev/null
    q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
    timed() { local t0 t1; t0=$(date +%s.%N); q "$2" >/dev/null; t1=$(date +%s.%N); echo "  $1: $(echo "($t1 - $t0) * 1000 / 1" | bc) ms"; }
    echo "upgrade to $target: $rows records"
    timed "ALTER TABLE .. ALTER COLUMN request_hash TYPE bytea, status TYPE \"char\" (a rewrite, rolled back)" \
        "BEGIN; ALTER TABLE idem_records DROP CONSTRAINT idem_records_status_check,
                ALTER COLUMN request_hash TYPE bytea USING decode(request_hash, 'hex'),
                ALTER COLUMN status TYPE \"char\" USING lower(left(status, 1))::\"char\"; ROLLBACK"
    timed "ALTER TABLE .. ADD COLUMN id uuid, ADD COLUMN step integer, ADD COLUMN state jsonb, DROP COLUMN updated_at (catalog only, rolled back)" \
        "BEGIN; ALTER TABLE idem_records ADD COLUMN id uuid, ADD COLUMN step integer, ADD COLUMN state jsonb, DROP COLUMN updated_at; ROLLBACK"
    # The new table: the target layout's DDL, from its file, under the same names.
    sed '/^-- cycle$/,$d' "$root/bench/layout/$target.sql" | sed -n '/^CREATE TABLE idem_records (/,/^) WITH/p;/^CREATE INDEX idem_records_/p;/^CREATE FUNCTION proto_\(id\|bucket\)/,/\$\$;$/p' >"$out/new_table.sql"
    q "ALTER TABLE idem_records RENAME TO idem_records_060" >/dev/null
    q "ALTER TABLE idem_records_060 RENAME TO idem_records" >/dev/null
    t0=$(date +%s.%N)
    { echo "BEGIN;"; echo "ALTER TABLE idem_records RENAME TO idem_records_060;"
      echo "ALTER TABLE idem_records_060 RENAME CONSTRAINT idem_records_pkey TO idem_records_060_pkey;"
      echo "ALTER INDEX idem_records_lease_idx RENAME TO idem_records_060_lease_idx;"
      echo "ALTER INDEX idem_records_expiry_idx RENAME TO idem_records_060_expiry_idx;"
      cat "$out/new_table.sql"; echo "COMMIT;"; } | "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$(url "$db")" -f - >/dev/null
    t1=$(date +%s.%N); echo "  rename aside + create the new table (committed): $(echo "($t1 - $t0) * 1000 / 1" | bc) ms"
    cols=$(q "SELECT string_agg(attname, ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'idem_records'::regclass AND attnum > 0 AND NOT attisdropped")
    # The new columns from the old row: the digest, the decoded hash, the status code, the live
    # retry count (as reserve reads it), no recovery point.
    expr=$(echo "$cols" | sed "s/\bid\b/proto_id(m.operation, m.user_id, m.key)/; s/request_hash/decode(m.request_hash, 'hex')/;
        s/status/lower(left(m.status, 1))::\"char\"/; s/\bstep\b/NULL::integer/; s/\bstate\b/NULL::jsonb/;
        s/\battempts\b/coalesce((SELECT t.attempts FROM idem_retries AS t WHERE t.operation = m.operation AND t.user_id = m.user_id AND t.key = m.key AND t.expires_at > m.created_at), 0)/")
    q "CREATE PROCEDURE proto_move(batch integer) LANGUAGE plpgsql AS \$\$
       DECLARE got bigint;
       BEGIN
           LOOP
               WITH m AS (DELETE FROM idem_records_060 AS r
                           WHERE r.ctid = ANY (ARRAY(SELECT x.ctid FROM idem_records_060 AS x LIMIT batch FOR UPDATE OF x SKIP LOCKED))
                          RETURNING r.*)
               INSERT INTO idem_records ($cols) SELECT $expr FROM m;
               GET DIAGNOSTICS got = ROW_COUNT;
               COMMIT;
               EXIT WHEN got < batch;
           END LOOP;
       END \$\$" >/dev/null
    # LOAD=SECONDS: fresh cycles of the migration (both tables probed, new records into the new
    # table; 4 clients) for SECONDS before the move and again while it runs: tps, p99, slowest.
    if [ -n "${LOAD:-}" ]; then
        cat >"$out/during.sql" <<'SQL'
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT (SELECT r.request_hash FROM idem_records AS r WHERE r.id = proto_id('bench.fresh', 'u' || :u, 'k' || :k)
           AND r.operation = 'bench.fresh' AND r.user_id = 'u' || :u AND r.key = 'k' || :k),
       (SELECT o.request_hash FROM idem_records_060 AS o WHERE o.operation = 'bench.fresh' AND o.user_id = 'u' || :u AND o.key = 'k' || :k),
       (SELECT t.attempts FROM idem_retries AS t WHERE t.operation = 'bench.fresh' AND t.user_id = 'u' || :u AND t.key = 'k' || :k),
       pg_advisory_xact_lock(hashtextextended('bench.fresh' || E'\x1f' || 'u' || :u || E'\x1f' || 'k' || :k, 0));
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, updated_at, owner, attempts)
VALUES (proto_id('bench.fresh', 'u' || :u, 'k' || :k), 'bench.fresh', 'u' || :u, 'k' || :k, sha256(('k' || :k)::bytea), 's',
        nextval('idem_token_seq'), '{"status": 201}', clock_timestamp() + interval '5 minutes', clock_timestamp() + interval '1 day',
        clock_timestamp(), clock_timestamp(), to_regrole(current_user), 0);
COMMIT;
SQL
        load() {
            rm -f "$out"/load.*; (cd "$out" && "$bindir/pgbench" -n -M prepared -c 4 -j 2 -T "$LOAD" -l --log-prefix=load -f during.sql "$(url "$db")" >/dev/null)
            cat "$out"/load.* | awk '{ print $3 }' | sort -n | awk -v what="$1" -v secs="$LOAD" '{ l[++n] = $1 }
                END { printf "  fresh cycles %s: %d in %d s, p99 %.1f ms, slowest %.1f ms\n", what, n, secs, l[int(n * 0.99)] / 1000, l[n] / 1000 }'
        }
        load "before the move"
        load "while the move runs" & loader=$!
    fi
    a=$(q "SELECT pg_current_wal_insert_lsn()"); t0=$(date +%s.%N)
    q "CALL proto_move($batch)" >/dev/null; t1=$(date +%s.%N); b=$(q "SELECT pg_current_wal_insert_lsn()")
    [ -z "${LOAD:-}" ] || wait "$loader"
    q "SELECT '  moved ' || (SELECT count(*) FROM idem_records) || ' records (' || (SELECT count(*) FROM idem_records WHERE status = 'p')
              || ' PROCESSING, ' || (SELECT count(*) FROM idem_records_060) || ' left) in ' || round($t1 - $t0, 1) || ' s: '
              || round((SELECT count(*) FROM idem_records) / ($t1 - $t0)) || ' rows/s, WAL '
              || round(pg_wal_lsn_diff('$b', '$a') / (SELECT count(*) FROM idem_records), 1) || ' B per row'"
    drop
    ;;
sweep)
    setup "$2"; rows=$3 batch=${4:-10000}
    q "SELECT proto_fill($rows, -26)" >/dev/null; q "VACUUM ANALYZE" >/dev/null; q "CHECKPOINT" >/dev/null
    a=$(q "SELECT pg_current_wal_insert_lsn()")
    # One transaction per batch (a procedure that commits after each), timed by the server's clock.
    q "CREATE TABLE sweep_times (n serial, rows bigint, ms float8)" >/dev/null
    q "CREATE PROCEDURE proto_drain(batch integer) LANGUAGE plpgsql AS \$\$
       DECLARE t0 timestamptz; got bigint;
       BEGIN
           LOOP
               t0 := clock_timestamp(); got := proto_sweep(batch);
               INSERT INTO sweep_times (rows, ms) VALUES (got, extract(epoch FROM clock_timestamp() - t0) * 1000);
               COMMIT;
               EXIT WHEN got < batch;
           END LOOP;
       END \$\$" >/dev/null
    q "CALL proto_drain($batch)" >/dev/null
    b=$(q "SELECT pg_current_wal_insert_lsn()")
    q "SELECT '$layout sweep: ' || sum(rows) || ' rows in ' || count(*) || ' batches, ' || round(sum(rows) / (sum(ms) / 1000)) || ' rows/s; first decile '
              || round(avg(ms) FILTER (WHERE n <= count_all / 10)::numeric, 1) || ' ms, last decile '
              || round(avg(ms) FILTER (WHERE n > count_all - count_all / 10 AND rows = $batch)::numeric, 1) || ' ms per batch; the last (short) batch '
              || round(max(ms) FILTER (WHERE n = count_all)::numeric, 1) || ' ms; WAL per row '
              || round(pg_wal_lsn_diff('$b', '$a') / sum(rows), 1) || ' B'
         FROM (SELECT *, count(*) OVER () AS count_all FROM sweep_times) s"
    drop
    ;;
*) echo "usage: $0 start|stop|wal|size|scale|sweep ..." >&2; exit 2 ;;
esac
