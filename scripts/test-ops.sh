#!/usr/bin/env bash
# Operations tests: the maintenance worker, the shared-memory counters, idem_stats and the pg_cron
# recipe, each on a private cluster of its own. The last line is `N passed, N failed`.
#
#   PG_CONFIG            the PostgreSQL the extension is installed in (default Debian's 15); a
#                        cluster of it, idempotency preloaded, on IDEM_OPS_PORT (default 55815)
#   IDEM_CRON_PG_CONFIG  a PostgreSQL with pg_cron and the extension installed, for the pg_cron
#                        recipe, on IDEM_CRON_PORT (default 55816). Default: PG_CONFIG if it has
#                        pg_cron, else Debian's 15 if it has; otherwise (or `none`) that part
#                        is skipped.
#   IDEM_OPS_PARTS       which parts to run (default `worker cron`)
#   IDEM_OPS_ROWS        the backlog each part sweeps (default 1000000)
#   IDEM_OPS_RECIPE_FROM_SOURCE=1  when the extension installed for pg_cron predates idem_maintain,
#                        create the procedure from sql/operations.sql (for testing the recipe
#                        against an older build); otherwise its absence is a failure.
#
# Logs and data under target/ops/. Run as root, the servers run as the `postgres` OS user.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
port=${IDEM_OPS_PORT:-55815}
cron_port=${IDEM_CRON_PORT:-55816}
work=$root/target/ops
rows=${IDEM_OPS_ROWS:-1000000}
parts=${IDEM_OPS_PARTS:-worker cron}
mkdir -p "$work"

passed=0
failed=0
check() { # check NAME COMMAND...: one assertion
    local name=$1
    shift
    if "$@"; then
        passed=$((passed + 1))
        printf 'ok      %s\n' "$name"
    else
        failed=$((failed + 1))
        printf 'FAILED  %s\n' "$name"
    fi
}
note() { printf '        %s\n' "$*"; }

as_server() { if [ "$(id -u)" = 0 ]; then sudo -u postgres -- "$@"; else "$@"; fi; }

# cluster_start NAME PG_CONFIG PORT CONF: a fresh cluster under target/ops/NAME.
cluster_start() {
    local name=$1 pgc=$2 p=$3 conf=$4 bin dir
    bin=$("$pgc" --bindir)
    dir=$work/$name
    cluster_stop "$name" "$pgc" 2>/dev/null
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    as_server "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 \
        >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log"; return 1; }
    cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $p
unix_socket_directories = '$dir'
log_line_prefix = '%m [%p] %b: '
$conf
CONF
    # The port is in the kernel's ephemeral range: a client connection elsewhere may hold it
    # for a moment, so retry a bind failure.
    local try
    for try in 1 2 3 4 5; do
        as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null && return 0
        grep -q 'Address already in use' "$dir/server.log" || break
        sleep 2
    done
    tail -20 "$dir/server.log"
    return 1
}

cluster_stop() { # cluster_stop NAME PG_CONFIG
    local dir=$work/$1 bin
    bin=$("$2" --bindir)
    if [ -f "$dir/data/PG_VERSION" ]; then
        as_server "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null
    fi
}

# q PORT DB SQL: one value (or rows), unaligned.
q() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -At -h 127.0.0.1 -p "$1" -U postgres -d "$2" -c "$3"; }

# until_equal SECONDS PORT DB SQL EXPECTED: polls every 0.2 s until SQL returns EXPECTED.
until_equal() {
    local deadline=$((SECONDS + $1)) got
    while :; do
        got=$(q "$2" "$3" "$4" 2>/dev/null)
        [ "$got" = "$5" ] && return 0
        [ $SECONDS -ge $deadline ] && { note "waited $1 s for [$4] = [$5], last [$got]"; return 1; }
        sleep 0.2
    done
}

# log_count CLUSTER REGEX: matching lines in the server log.
log_count() { grep -cE "$2" "$work/$1/server.log"; }

# until_logged SECONDS CLUSTER REGEX [N]: until more than N (default 0) lines match.
until_logged() {
    local deadline=$((SECONDS + $1))
    until [ "$(log_count "$2" "$3")" -gt "${4:-0}" ]; do
        [ $SECONDS -ge $deadline ] && { note "no log line matching [$3] within $1 s"; return 1; }
        sleep 0.2
    done
}

eq() { [ "$1" = "$2" ] || { note "expected [$2], got [$1]"; return 1; }; }
ge() { [ "$1" -ge "$2" ] 2>/dev/null || { note "expected >= $2, got [$1]"; return 1; }; }

# fill_expired PORT DB N: N finished records whose ttl has passed, in one transaction.
fill_expired() {
    q "$1" "$2" "INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response,
                                         lease_expires_at, expires_at, created_at, updated_at)
                 SELECT 'bulk', 'u', 'k' || i, 'h', CASE WHEN i % 10 = 0 THEN 'FAILED' ELSE 'SUCCESS' END,
                        nextval('idem_token_seq'), '{\"status\": 201}',
                        now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now()
                   FROM generate_series(1, $3) AS i"
}

# watch_drain PORT DB N SECONDS: polls the bulk rows until none is left; sets `intermediate`
# (how many polls saw 0 < remaining < N: batches committed one by one) and `drain_seconds`.
watch_drain() {
    local start=$SECONDS deadline=$((SECONDS + $4)) left
    intermediate=0
    while :; do
        left=$(q "$1" "$2" "SELECT count(*) FROM idem_records WHERE operation = 'bulk'")
        if [ "$left" -gt 0 ] && [ "$left" -lt "$3" ]; then intermediate=$((intermediate + 1)); fi
        [ "$left" = 0 ] && break
        [ $SECONDS -ge $deadline ] && { note "$left rows left after $4 s"; drain_seconds=-1; return 1; }
        sleep 0.2
    done
    drain_seconds=$((SECONDS - start))
}

bindir=$("$PG_CONFIG" --bindir)

# ---------------------------------------------------------------------------------------------
if [[ " $parts " == *" worker "* ]]; then
printf '== maintenance worker and counters (%s, port %s)\n' "$("$PG_CONFIG" --version)" "$port"
cluster_start worker "$PG_CONFIG" "$port" "shared_preload_libraries = 'idempotency'
idempotency.maintenance_databases = 'idem_ops, idem_noext, idem_noconn, idem_nosuchdb'
idempotency.maintenance_interval = 1
max_worker_processes = 16" || { echo "0 passed, 1 failed"; exit 1; }
P=$port

check "the launcher runs when preloaded" \
    until_equal 30 $P postgres "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher'" 1
check "the launcher logs its settings at start" \
    until_logged 10 worker 'idempotency maintenance launcher started: databases idem_ops, idem_noext, idem_noconn, idem_nosuchdb, every 1 s, batch size 10000, recover action fail'

q $P postgres "CREATE DATABASE idem_ops" && q $P postgres "CREATE DATABASE idem_noext"
q $P postgres "CREATE DATABASE idem_noconn ALLOW_CONNECTIONS false"
q $P idem_ops "CREATE EXTENSION idempotency"
q $P idem_ops "CREATE ROLE idem_watcher LOGIN; GRANT pg_monitor TO idem_watcher; CREATE ROLE idem_plain LOGIN"

# No call from the test: only the worker can change these records.
q $P idem_ops "SELECT (idem_reserve('ops', 'u', 'stuck', 'h', lease => '1 second')).outcome" >/dev/null
q $P idem_ops "SELECT idem_complete('ops', 'u', 'done', (idem_reserve('ops', 'u', 'done', 'h', ttl => '1 second')).token, '{}')" >/dev/null
check "a stuck reservation is recovered by the worker (FAILED)" \
    until_equal 30 $P idem_ops "SELECT status FROM idem_records WHERE key = 'stuck'" FAILED
check "an expired record is swept by the worker" \
    until_equal 30 $P idem_ops "SELECT count(*) FROM idem_records WHERE key = 'done'" 0
check "the worker logs a one-line summary of its recovery" \
    until_logged 10 worker 'idempotency maintenance in database "idem_ops": recovered 1 \(action fail\)'
check "and of its sweep" \
    until_logged 10 worker 'idempotency maintenance in database "idem_ops": recovered [0-9]+ \(action fail\), swept [1-9]'
passes=$(q $P idem_ops "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'")
sleep 3 # a few more passes: conditions below must still have been logged only once
check "a database without the extension is logged once" \
    eq "$(log_count worker 'database "idem_noext" does not have the idempotency extension; skipping it')" 1
check "a database that does not allow connections is logged once" \
    eq "$(log_count worker 'database "idem_noconn" does not allow connections; skipping it')" 1
check "a database that does not exist is logged once" \
    eq "$(log_count worker 'database "idem_nosuchdb" does not exist; skipping it')" 1
summaries=$(log_count worker 'idempotency maintenance in database "idem_ops"')
later_passes=$(q $P idem_ops "SELECT value - $passes FROM idem_metrics() WHERE name = 'worker_passes'")
note "$summaries summary lines, $later_passes passes since"
check "passes that did nothing log nothing" test "$summaries" -le 2 -a "$later_passes" -ge 2

printf -- '-- counters\n'
metrics() { q $P idem_ops "SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics()"; }
api_metrics() { q $P idem_ops "SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics() WHERE name NOT IN ('recovered', 'swept', 'worker_passes')"; }
before=$(api_metrics)
q $P idem_ops "
SELECT idem_complete('m', 'u', 'k1', (idem_reserve('m', 'u', 'k1', 'h')).token, '{}');      -- created, completions_success
SELECT idem_reserve('m', 'u', 'k1', 'h');                                                  -- replay
SELECT idem_reserve('m', 'u', 'k1', 'other');                                              -- mismatch
SELECT idem_reserve('m', 'u', 'k2', 'h');                                                  -- created
SELECT idem_reserve('m', 'u', 'k2', 'h');                                                  -- in_progress
SELECT idem_complete('m', 'u', 'k2', 0, '{}');                                             -- stale_tokens
SELECT idem_heartbeat('m', 'u', 'k2', 0);                                                  -- stale_tokens
SELECT idem_release('m', 'u', 'k2', 0);                                                    -- stale_tokens
SELECT idem_release('m', 'u', 'k2', (SELECT token FROM idem_records WHERE key = 'k2'));    -- releases
SELECT idem_release('m', 'u', 'k2', (idem_reserve('m', 'u', 'k2', 'h')).token, max_retries => 2); -- created, poisonings
SELECT idem_reserve('m', 'u', 'k2', 'h');                                                  -- failed
SELECT idem_complete('m', 'u', 'k3', (idem_reserve('m', 'u', 'k3', 'h')).token, '{}', 'FAILED'); -- created, completions_failed
" >/dev/null
after=$(api_metrics)
delta=$(join -t= <(tr ' ' '\n' <<<"$before" | sort) <(tr ' ' '\n' <<<"$after" | sort) | awk -F= '{ printf "%s%s=%d", sep, $1, $3 - $2; sep = " " }')
check "each API outcome increments exactly its counter" eq "$delta" \
    "completions_failed=1 completions_success=1 poisonings=1 releases=1 reservations_created=4 reservations_failed=1 reservations_in_progress=1 reservations_mismatch=1 reservations_replay=1 stale_tokens=3"
check "recovered and swept count the worker's work" \
    eq "$(q $P idem_ops "SELECT count(*) FROM idem_metrics() WHERE name IN ('recovered', 'swept', 'worker_passes') AND value >= 1")" 3
check "pg_monitor may read the counters" \
    eq "$("$bindir/psql" -X -At -h 127.0.0.1 -p $P -U idem_watcher -d idem_ops -c "SELECT count(*) FROM idem_metrics()" 2>&1)" 13
check "PUBLIC may not (42501)" \
    eq "$("$bindir/psql" -X -At -h 127.0.0.1 -p $P -U idem_plain -d idem_ops -v VERBOSITY=sqlstate -c "SELECT count(*) FROM idem_metrics()" 2>&1)" "ERROR:  42501"

printf -- '-- settings reload (SIGHUP) and interval 0\n'
set_interval() {
    q $P postgres "ALTER SYSTEM SET idempotency.maintenance_interval = $1"
    q $P postgres "SELECT pg_reload_conf()" >/dev/null
}
set_interval 0
check "a reload is logged with the new settings" \
    until_logged 10 worker 'idempotency maintenance settings reloaded: disabled \(idempotency.maintenance_interval = 0\)'
passes=$(q $P idem_ops "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'")
q $P idem_ops "SELECT (idem_reserve('ops', 'u', 'stuck2', 'h', lease => '1 second')).outcome" >/dev/null
sleep 4
check "interval 0: no pass runs" \
    eq "$(q $P idem_ops "SELECT value FROM idem_metrics() WHERE name = 'worker_passes'")" "$passes"
check "interval 0: a stuck reservation stays stuck" \
    eq "$(q $P idem_ops "SELECT status FROM idem_records WHERE key = 'stuck2'")" PROCESSING
set_interval 1
check "back to 1 s: it is recovered" \
    until_equal 30 $P idem_ops "SELECT status FROM idem_records WHERE key = 'stuck2'" FAILED

printf -- '-- restart after the launcher is killed\n'
old_pid=$(q $P postgres "SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher'")
q $P postgres "SELECT pg_terminate_backend($old_pid)" >/dev/null
check "the launcher comes back after pg_terminate_backend" \
    until_equal 60 $P postgres "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher' AND pid <> $old_pid" 1
q $P idem_ops "SELECT (idem_reserve('ops', 'u', 'stuck3', 'h', lease => '1 second')).outcome" >/dev/null
check "and keeps maintaining" \
    until_equal 30 $P idem_ops "SELECT status FROM idem_records WHERE key = 'stuck3'" FAILED

printf -- '-- idem_stats on %s rows without a full scan\n' "$rows"
reloads=$(log_count worker 'settings reloaded: disabled')
set_interval 0
until_logged 10 worker 'settings reloaded: disabled' "$reloads" >/dev/null
q $P idem_ops "DELETE FROM idem_records"
fill_expired $P idem_ops "$rows"
q $P idem_ops "SELECT idem_complete('live', 'u', 'k' || i, (idem_reserve('live', 'u', 'k' || i, 'h')).token, '{}') FROM generate_series(1, 500) AS i" >/dev/null
q $P idem_ops "SELECT idem_reserve('live', 'u', 'p' || i, 'h', lease => '1 second') FROM generate_series(1, 7) AS i" >/dev/null
q $P idem_ops "SELECT idem_reserve('live', 'u', 'q' || i, 'h') FROM generate_series(1, 5) AS i" >/dev/null
q $P idem_ops "ANALYZE idem_records"
sleep 1.1 # the seven 1 s leases run out
# A session's table statistics reach pg_stat_user_tables when it exits.
seq_scans() { sleep 0.5; q $P idem_ops "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'idem_records'"; }
scans_before=$(seq_scans)
stats=$(q $P idem_ops "SELECT processing, stuck, expired, success, failed FROM idem_stats()")
scans_after=$(seq_scans)
note "idem_stats: processing|stuck|expired|success|failed = $stats (true: 12|7|$rows|$((rows * 9 / 10 + 500))|$((rows / 10)))"
check "idem_stats does not scan the table" eq "$scans_after" "$scans_before"
check "idem_stats: processing, stuck and expired are exact" eq "$(cut -d'|' -f1-3 <<<"$stats")" "12|7|$rows"
IFS='|' read -r _ _ _ est_success est_failed <<<"$stats"
within() { # within GOT TRUE PERCENT
    awk -v g="$1" -v t="$2" -v p="$3" 'BEGIN { d = g - t; if (d < 0) d = -d; exit !(g != "" && d <= t * p / 100) }' \
        || { note "estimate $1 is not within $3% of $2"; return 1; }
}
check "idem_stats: success is estimated within 5%" within "$est_success" $((rows * 9 / 10 + 500)) 5
check "idem_stats: failed is estimated within 5%" within "$est_failed" $((rows / 10)) 5

printf -- '-- a sweep of %s expired rows by the worker\n' "$rows"
xid_before=$(q $P idem_ops "SELECT txid_current()")
set_interval 1
watch_drain $P idem_ops "$rows" 300
check "the worker sweeps them all" ge "$drain_seconds" 0
xid_after=$(q $P idem_ops "SELECT txid_current()")
check "in many transactions: another session saw a partial count" ge "$intermediate" 1
check "at least one transaction per batch of 10000 (xids used)" ge $((xid_after - xid_before)) $((rows / 10000))
# The pass logs its summary after its VACUUM: wait for the line (a deadline), then read it.
until_logged 60 worker 'idempotency maintenance in database "idem_ops": .*swept [0-9]{6,}' >/dev/null
sweep_line=$(grep -E 'idempotency maintenance in database "idem_ops": .*swept [0-9]{6,}' "$work/worker/server.log" | tail -1)
note "drained in ~${drain_seconds} s; ${intermediate} polls saw a partial count; $((xid_after - xid_before)) xids"
note "log: ${sweep_line#*: }"
check "the worker's summary shows the batch transactions" \
    ge "$(sed -nE 's/.*in ([0-9]+) transactions.*/\1/p' <<<"$sweep_line")" $((rows / 10000))
check "after that sweep the worker vacuums both tables, and logs it" \
    until_logged 60 worker 'idempotency maintenance in database "idem_ops": vacuumed idem_records and idem_retries after sweeping [0-9]+ rows'

printf -- '-- counters after the run\n'
metrics | tr ' ' '\n' | sed 's/^/        /'

printf -- '-- clean shutdown\n'
cluster_stop worker "$PG_CONFIG"
check "the launcher logs its shutdown" eq "$(log_count worker 'idempotency maintenance launcher shutting down')" 2
check "no process of ours crashed" \
    eq "$(log_count worker 'terminated by signal|PANIC|exited with exit code [2-9]')" 0
check "the server shut down cleanly" eq "$(log_count worker 'database system is shut down')" 1
printf -- '-- worker log lines\n'
grep -E 'idempotency maintenance' "$work/worker/server.log" | sed -E 's/^[^ ]+ /        /' | head -40
fi

# ---------------------------------------------------------------------------------------------
cron_pg_config=${IDEM_CRON_PG_CONFIG:-}
if [ -z "$cron_pg_config" ]; then
    for c in "$PG_CONFIG" /usr/lib/postgresql/15/bin/pg_config; do
        if [ -x "$c" ] && [ -f "$("$c" --pkglibdir)/pg_cron.so" ]; then cron_pg_config=$c; break; fi
    done
fi
if [ "$cron_pg_config" = none ] || [[ " $parts " != *" cron "* ]]; then cron_pg_config=; fi
if [ -z "$cron_pg_config" ]; then
    printf '== pg_cron recipe: skipped (no PostgreSQL with pg_cron; apt-get install postgresql-15-cron)\n'
else
    bindir=$("$cron_pg_config" --bindir)
    P=$cron_port
    printf '== pg_cron recipe (%s, port %s)\n' "$("$cron_pg_config" --version)" "$P"
    cluster_start cron "$cron_pg_config" "$P" "shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
cron.host = '$work/cron'" || { echo "$passed passed, $((failed + 1)) failed"; exit 1; }
    q $P postgres "CREATE DATABASE idem_cron"
    q $P idem_cron "CREATE EXTENSION idempotency"
    if [ "$(q $P idem_cron "SELECT count(*) FROM pg_proc WHERE proname = 'idem_maintain'")" = 0 ] \
        && [ "${IDEM_OPS_RECIPE_FROM_SOURCE:-0}" = 1 ]; then
        note "the installed extension has no idem_maintain: creating it from sql/operations.sql"
        sed -n '/^CREATE PROCEDURE @extschema@.idem_maintain/,/^\$fn\$;/p' "$root/sql/operations.sql" \
            | sed 's/@extschema@/public/g' | q $P idem_cron "$(cat)"
    fi
    check "the extension has the procedure idem_maintain" \
        eq "$(q $P idem_cron "SELECT count(*) FROM pg_proc WHERE proname = 'idem_maintain'")" 1
    q $P idem_cron "SELECT (idem_reserve('ops', 'u', 'stuck', 'h', lease => '1 second')).outcome" >/dev/null
    fill_expired $P idem_cron "$rows"
    xid_before=$(q $P idem_cron "SELECT txid_current()")
    # The recipe, as docs/operations.md gives it.
    q $P postgres "CREATE EXTENSION pg_cron"
    q $P postgres "SELECT cron.schedule_in_database('idem-maintenance', '* * * * *', 'CALL public.idem_maintain()', 'idem_cron')" >/dev/null
    watch_drain $P idem_cron "$rows" 200
    check "the pg_cron job sweeps them all" ge "$drain_seconds" 0
    xid_after=$(q $P idem_cron "SELECT txid_current()")
    check "in many transactions: another session saw a partial count" ge "$intermediate" 1
    check "at least one transaction per batch of 10000 (xids used)" ge $((xid_after - xid_before)) $((rows / 10000))
    check "and recovers the stuck reservation" \
        until_equal 30 $P idem_cron "SELECT status FROM idem_records WHERE key = 'stuck'" FAILED
    check "the job run succeeded" \
        until_equal 30 $P postgres "SELECT status FROM cron.job_run_details ORDER BY runid LIMIT 1" succeeded
    cron_line=$(grep -E 'idempotency maintenance in database "idem_cron"' "$work/cron/server.log" | head -1)
    note "drained in ~${drain_seconds} s after scheduling (the job starts on the next minute); $((xid_after - xid_before)) xids"
    note "log: ${cron_line#*: }"
    check "the procedure logs its summary with the batch transactions" \
        ge "$(sed -nE 's/.*in ([0-9]+) transactions.*/\1/p' <<<"$cron_line")" $((rows / 10000))
    cluster_stop cron "$cron_pg_config"
fi

printf '%d passed, %d failed\n' "$passed" "$failed"
[ "$failed" = 0 ]
