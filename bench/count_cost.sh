#!/usr/bin/env bash
# What counting (_idem_count, the shared-memory counters of idem_metrics) costs on the hot path:
# bench/fresh.sql and bench/replay.sql in two databases of one preloaded server, `before` with the
# API functions as they were before counting (from git, BASE below) and `after` as installed,
# interleaved A/B/B/A, ratio after/before per round.
#
#   PG_CONFIG    the PostgreSQL the extension is installed in (release build)
#   PORT         a free port (default 55816); data under target/count-cost
#   BASE         the commit whose sql/ has no counting (default: the parent of the commit that
#                added it)
#   SECONDS_PER_RUN (default 10), ROUNDS (default 2), CLIENTS (default 8)
#   SCRIPTS (default "fresh.sql replay.sql"; empty: only the single-session measurement)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$PG_CONFIG" --bindir)
port=${PORT:-55816}
run_s=${SECONDS_PER_RUN:-10}
rounds=${ROUNDS:-2}
clients=${CLIENTS:-8}
base=${BASE:-$(git -C "$root" log --format=%H -1 -S"_idem_count('reservations_created')" -- sql/reserve.sql)~1}
dir=$root/target/count-cost

as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }
q() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p "$port" -U postgres -d "$1" "${@:2}"; }

if [ -f "$dir/data/PG_VERSION" ]; then as_server "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true; fi
rm -rf "$dir"
mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
shared_preload_libraries = 'idempotency'
shared_buffers = 256MB
max_connections = 100
CONF
# The port is in the kernel's ephemeral range: a client socket elsewhere may hold it for a moment.
for try in 1 2 3 4 5 6; do
    as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null && break
    [ "$try" = 6 ] && { tail -5 "$dir/server.log"; exit 1; }
    sleep 2
done
trap 'as_server "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null' EXIT

for db in before after; do
    q postgres -c "CREATE DATABASE $db"
    q "$db" -f "$root/bench/setup.sql" >/dev/null
done
# `before`: the same extension, with the API functions replaced by their versions at $base.
for f in internal reserve finish maintenance; do
    git -C "$root" show "$base:sql/$f.sql" | sed -e 's/@extschema@/public/g' -e 's/^CREATE FUNCTION/CREATE OR REPLACE FUNCTION/' \
        -e 's|MODULE_PATHNAME|$libdir/idempotency|'
done | q before >/dev/null
# AFTER_SQL: a statement to run in `after` first (an experiment, e.g. a different volatility).
[ -n "${AFTER_SQL:-}" ] && q after -c "$AFTER_SQL"
[ "$(q before -c "SELECT count(*) FROM pg_proc WHERE strpos(prosrc, '_idem_count(') > 0")" = 0 ]
[ "$(q after -c "SELECT count(*) FROM pg_proc WHERE strpos(prosrc, '_idem_count(') > 0")" -gt 0 ]

tps() { # tps DB SCRIPT
    "$bindir/pgbench" -n -M prepared -c "$clients" -j 2 -T "$run_s" -h 127.0.0.1 -p "$port" -U postgres \
        -f "$root/bench/$2" "$1" 2>/dev/null | sed -nE 's/^tps = ([0-9.]+).*/\1/p'
}

printf 'base %s, %s clients, %s s per run, %s (%s)\n' "$(git -C "$root" rev-parse --short "$base")" "$clients" "$run_s" \
    "$("$bindir/postgres" --version)" "$(nproc) cores"
printf '%-12s %5s %10s %10s %10s %10s %7s\n' script round before after after before 'after/before'
for script in ${SCRIPTS-fresh.sql replay.sql}; do
    for r in $(seq "$rounds"); do
        a1=$(tps before "$script"); b1=$(tps after "$script"); b2=$(tps after "$script"); a2=$(tps before "$script")
        awk -v s="$script" -v r="$r" -v a1="$a1" -v b1="$b1" -v b2="$b2" -v a2="$a2" \
            'BEGIN { printf "%-12s %5d %10.0f %10.0f %10.0f %10.0f %7.3f\n", s, r, a1, b1, b2, a2, (b1 + b2) / (a1 + a2) }'
    done
done

# The same question without pgbench and the scheduler: one session, CPU time per call.
# A PL/pgSQL loop of one counting assignment against the same loop without the call, and a loop
# of idem_reserve replays in each database, alternated.
micro() { # micro DB N: µs per replay, µs per counting assignment, µs per empty assignment
    q "$1" -c "
CREATE FUNCTION pg_temp.per_call(what text, n integer) RETURNS numeric LANGUAGE plpgsql AS \$f\$
DECLARE v boolean; r record; t timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1..n LOOP
        CASE what
            WHEN 'replay' THEN r := idem_reserve('bench.replay', 'u', 'r' || (i % 100000 + 1), 'h');
            WHEN 'count' THEN v := _idem_count('reservations_replay', 0);
            ELSE v := i > 0;
        END CASE;
    END LOOP;
    RETURN round((extract(epoch FROM clock_timestamp() - t) * 1e6 / n)::numeric, 3);
END \$f\$;
SELECT pg_temp.per_call('replay', $2) || ' ' || pg_temp.per_call('count', $2 * 10) || ' ' || pg_temp.per_call('empty', $2 * 10)"
}
printf '\n%-6s %24s %24s %22s %22s\n' round 'replay µs/call before' 'replay µs/call after' 'counting µs/assign' 'empty µs/assign'
for r in $(seq "$rounds"); do
    read -r b1 _ _ < <(micro before 100000)
    read -r a1 c1 e1 < <(micro after 100000)
    read -r a2 c2 e2 < <(micro after 100000)
    read -r b2 _ _ < <(micro before 100000)
    awk -v r="$r" -v b="$b1 $b2" -v a="$a1 $a2" -v c="$c1 $c2" -v e="$e1 $e2" 'BEGIN {
        split(b, B, " "); split(a, A, " "); split(c, C, " "); split(e, E, " ");
        printf "%-6d %24.3f %24.3f %22.3f %22.3f\n", r, (B[1] + B[2]) / 2, (A[1] + A[2]) / 2, (C[1] + C[2]) / 2, (E[1] + E[2]) / 2 }'
done
q after -c "SELECT name || ' = ' || value FROM idem_metrics() WHERE value > 0"
