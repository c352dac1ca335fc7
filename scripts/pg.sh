#!/usr/bin/env bash
# A private PostgreSQL cluster for the tests, the demo and the benchmarks, one per major: the major
# is PG_CONFIG's (default: scripts/pg-env.sh's default major), data under target/pg/NN, port
# IDEM_PG_PORT (default 554NN: 55415 for 15), never the system cluster or 5432.
# Run as root, the server runs as the `postgres` OS user (PostgreSQL refuses to run as root).
#
#   scripts/pg.sh start     create the cluster if needed, start it, print its connection string
#   scripts/pg.sh stop      stop it (fast shutdown); `stop immediate` simulates a crash
#   scripts/pg.sh url       print the connection string
#   scripts/pg.sh psql ...  psql against it
#   scripts/pg.sh destroy   stop it and delete its data
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-$("$root/scripts/pg-env.sh" config "$("$root/scripts/pg-env.sh" default)")}
bindir=$("$PG_CONFIG" --bindir)
major=$("$root/scripts/pg-env.sh" major "$PG_CONFIG")
port=${IDEM_PG_PORT:-$((55400 + major))}
dir=$root/target/pg/$major
data=$dir/data
url="postgresql://postgres@127.0.0.1:$port/postgres"

as_server() {
    if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi
}

ensure_dirs() {
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$root/target/pg" "$dir"; fi
}

case "${1:-}" in
start)
    ensure_dirs
    if [ ! -f "$data/PG_VERSION" ]; then
        as_server "$bindir/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 \
            --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
        cat >>"$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 200
max_prepared_transactions = 10
shared_buffers = 256MB
fsync = on
log_min_messages = warning
CONF
    fi
    # The port lies in Linux's ephemeral range, so a client connection elsewhere may hold it for a
    # moment: a start that fails is tried again, three times in all. pg_stat_statements lets the
    # benchmark count the statements the server runs per operation (it turns tracking on only
    # for its counting runs).
    for attempt in 1 2 3; do
        as_server "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1 && break
        if as_server "$bindir/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 \
            -o "-p $port -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=none" start >/dev/null; then
            break
        fi
        [ "$attempt" = 3 ] && { tail -20 "$dir/server.log" >&2; exit 1; }
        sleep 2
    done
    echo "$url"
    ;;
stop)
    if [ -f "$data/PG_VERSION" ] && as_server "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        as_server "$bindir/pg_ctl" -D "$data" -m "${2:-fast}" -w -t 60 stop >/dev/null
    fi
    ;;
url)
    echo "$url"
    ;;
psql)
    shift
    exec "$bindir/psql" -X -v ON_ERROR_STOP=1 "$url" "$@"
    ;;
destroy)
    "$0" stop
    rm -rf "$data"
    ;;
*)
    sed -n '2,13p' "$0" >&2
    exit 2
    ;;
esac
