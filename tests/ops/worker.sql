-- The ops layer's maintenance worker and counters (xtask/src/layers/ops.rs, fn worker). Run by
-- name (see records.sql).

-- [metric] the counter :name
SELECT value FROM idem_metrics() WHERE name = :'name';

-- [launchers]
SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher';

-- [launcher_pid]
SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher';

-- [new_launchers] launchers other than :pid
SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher' AND pid <> :pid;

-- [terminate]
SELECT pg_terminate_backend(:pid);

-- [databases] one with the extension, one without, one that allows no connection
CREATE DATABASE idem_ops;
CREATE DATABASE idem_noext;
CREATE DATABASE idem_noconn ALLOW_CONNECTIONS false;

-- [roles] one that may read the counters, one that may not
CREATE ROLE idem_watcher LOGIN;
GRANT pg_monitor TO idem_watcher;
CREATE ROLE idem_plain LOGIN;

-- [expired_done] a record of key 'done' with a 1 s ttl
SELECT idem_complete('ops', 'u', 'done', (idem_reserve('ops', 'u', 'done', 'h', ttl => '1 second')).token, '{}');

-- [done_left]
SELECT count(*) FROM idem_records WHERE key = 'done';

-- [api_metrics] the counters of the API's outcomes
SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics() WHERE name NOT IN ('recovered', 'swept', 'worker_passes');

-- [outcomes] each outcome of the API once or more, in one query (`\;`)
SELECT idem_complete('m', 'u', 'k1', (idem_reserve('m', 'u', 'k1', 'h')).token, '{}') \;
SELECT idem_reserve('m', 'u', 'k1', 'h') \;
SELECT idem_reserve('m', 'u', 'k1', 'other') \;
SELECT idem_reserve('m', 'u', 'k2', 'h') \;
SELECT idem_reserve('m', 'u', 'k2', 'h') \;
SELECT idem_complete('m', 'u', 'k2', 0, '{}') \;
SELECT idem_heartbeat('m', 'u', 'k2', 0) \;
SELECT idem_release('m', 'u', 'k2', 0) \;
SELECT idem_release('m', 'u', 'k2', (SELECT token FROM idem_records WHERE key = 'k2')) \;
SELECT idem_release('m', 'u', 'k2', (idem_reserve('m', 'u', 'k2', 'h')).token, max_retries => 2) \;
SELECT idem_reserve('m', 'u', 'k2', 'h') \;
SELECT idem_complete('m', 'u', 'k3', (idem_reserve('m', 'u', 'k3', 'h')).token, '{}', 'FAILED') \;
SELECT idem_checkpoint('m', 'u', 'k4', (idem_reserve('m', 'u', 'k4', 'h')).token, 0, '{}') \;
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'm' AND key = 'k4' \;
SELECT idem_reserve('m', 'u', 'k4', 'h');

-- [worker_metrics] the worker's counters that have counted
SELECT count(*) FROM idem_metrics() WHERE name IN ('recovered', 'swept', 'worker_passes') AND value >= 1;

-- [metrics_count] as the role of the session
SELECT count(*) FROM idem_metrics();

-- [maintenance_interval] the worker's interval, :interval seconds
ALTER SYSTEM SET idempotency.maintenance_interval = :interval;
SELECT pg_reload_conf();

-- [delete_records]
DELETE FROM idem_records;

-- [live_success] 500 finished records
SELECT idem_complete('live', 'u', 'k' || i, (idem_reserve('live', 'u', 'k' || i, 'h')).token, '{}') FROM generate_series(1, 500) AS i;

-- [live_stuck] 7 reservations with a 1 s lease
SELECT idem_reserve('live', 'u', 'p' || i, 'h', lease => '1 second') FROM generate_series(1, 7) AS i;

-- [live_processing] 5 reservations
SELECT idem_reserve('live', 'u', 'q' || i, 'h') FROM generate_series(1, 5) AS i;

-- [analyze]
ANALYZE idem_records;

-- [stuck_passed] how many of live_stuck's leases have run out on the database's clock
SELECT count(*) FROM idem_records WHERE operation = 'live' AND key LIKE 'p%' AND lease_expires_at < clock_timestamp();

-- [stats_scans] idem_stats(), the sequential scans of idem_records its transaction made so far,
-- the rows, and the scans again after a count(*) made to scan (the control): all in one
-- transaction of a new session, read from pg_stat_xact_user_tables (this backend's own counts,
-- which need no statistics flush)
BEGIN;
SELECT processing, stuck, expired, success, failed FROM idem_stats();
SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'idem_records';
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL max_parallel_workers_per_gather = 0;
SELECT count(*) FROM idem_records;
SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'idem_records';
COMMIT;

-- [all_metrics]
SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics();

-- [install_060] idem_noext at 0.6.0 with 300 finished records and one in-flight reservation
CREATE EXTENSION idempotency VERSION '0.6.0';
SELECT count(idem_complete('ops', 'u', 'k' || i, (idem_reserve('ops', 'u', 'k' || i, 'h')).token, '{}')) FROM generate_series(1, 300) AS i;
SELECT (idem_reserve('ops', 'u', 'inflight', 'h', ttl => '1 hour', lease => '1 hour')).outcome;

-- [update_070] the update, which moves no record (counted before the worker can move any)
BEGIN;
ALTER EXTENSION idempotency UPDATE;
SELECT count(*) FROM idem_records_060;
COMMIT;

-- [kept_gone] the old table dropped, every record in the new one
SELECT to_regclass('idem_records_060') IS NULL AND (SELECT count(*) FROM idem_records) = 301;
