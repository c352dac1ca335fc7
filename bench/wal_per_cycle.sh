#!/usr/bin/env bash
# WAL per cycle of a pgbench script, exact whatever the machine's load: pg_walinspect's record
# sizes over N cycles from one client (after 200 cycles of warm-up, a CHECKPOINT and 500 more
# past the first-touch full-page images), with a per-record-type breakdown.
#
#   bench/wal_per_cycle.sh start              a server of its own (PG_CONFIG, PORT default 56220,
#                                             data in target/hbench or BENCH_DIR, fsync on, data
#                                             checksums off (CHECKSUMS=on: on), database b with
#                                             bench/pgbench/setup.sql and pg_walinspect; PG 15+)
#   bench/wal_per_cycle.sh SCRIPT [N=3000]    e.g. fresh, minimal, bare
#   bench/wal_per_cycle.sh stop
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$root/target/postgres/16/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir); port=${PORT:-56220}
out=${BENCH_DIR:-$root/target/hbench}; data=$out/data; url=postgresql://postgres@127.0.0.1:$port/b
as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }
q() { "$bindir/psql" -X -At -v ON_ERROR_STOP=1 "$url" -c "$1"; }
case ${1:?usage: $0 start|stop|SCRIPT [N]} in
start)
    [ ! -f "$data/postmaster.pid" ] || as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$out"; mkdir -p "$out"; [ "$(id -u)" != 0 ] || chown postgres:postgres "$out"
    # Data checksums off, as before PostgreSQL 18 turned them on by default (with them the first
    # hint bit set on a page after a checkpoint logs the whole page); CHECKSUMS=on keeps them.
    major=$("$PG_CONFIG" --version | sed 's/[^0-9]*\([0-9]*\).*/\1/'); sums=()
    if [ "${CHECKSUMS:-}" = on ]; then sums=(--data-checksums); elif [ "$major" -ge 18 ]; then sums=(--no-data-checksums); fi
    as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 "${sums[@]}" >"$out/initdb.log" 2>&1
    printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 100\nshared_buffers = 256MB\nfsync = on\nlog_min_messages = warning\n" "$port" "$out" >>"$data/postgresql.conf"
    as_server "$bindir/pg_ctl" -D "$data" -l "$out/server.log" -w -t 60 start >/dev/null
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "postgresql://postgres@127.0.0.1:$port/postgres" -c 'CREATE DATABASE b'
    "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$url" -f "$root/bench/pgbench/setup.sql" -c 'CREATE EXTENSION pg_walinspect'
    ;;
stop) as_server "$bindir/pg_ctl" -D "$data" -m fast -w stop ;;
*)
    script=$1 n=${2:-3000}
    run() { "$bindir/pgbench" -n -M prepared -c1 -t "$1" -f "$root/bench/pgbench/$script.sql" "$url" >/dev/null; }
    run 200; q "CHECKPOINT" >/dev/null; run 500
    a=$(q "SELECT pg_current_wal_insert_lsn()"); run "$n"; b=$(q "SELECT pg_current_wal_insert_lsn()")
    q "SELECT '$script: ' || $n || ' cycles, ' || round(pg_wal_lsn_diff('$b', '$a') / $n::numeric, 1) || ' B per cycle ('
              || round(sum(combined_size - fpi_size) / $n::numeric, 1) || ' B without full-page images)'
         FROM pg_get_wal_stats('$a', '$b', false)"
    q "SELECT '  ' || \"resource_manager/record_type\" || ': ' || round(combined_size / $n::numeric, 1) || ' B, '
              || round(count / $n::numeric, 2) || ' records per cycle'
         FROM pg_get_wal_stats('$a', '$b', true) WHERE count > 0 ORDER BY combined_size DESC"
    ;;
esac
