-- The Citus layer's maintenance across shards (xtask/src/layers/citus.rs, fn maintenance). Run
-- by name (see nodes.sql).

-- [stuck_fill] 30 reservations of 10 users with a 1 s lease
SELECT count(*) FROM (SELECT idem_reserve('stuck', 's-' || i % 10, 'k' || i, 'h', lease => '1 second') FROM generate_series(1, 30) AS i) AS s;

-- [old_fill] 25 results with a 1 s ttl
SELECT count(*) FROM (SELECT idem_complete('old', 'o-' || i % 10, 'k' || i, (idem_reserve('old', 'o-' || i % 10, 'k' || i, 'h', ttl => '1 second')).token, '{}') FROM generate_series(1, 25) AS i) AS s;

-- [recover_batch]
SELECT idem_recover_stuck(batch_size => 10);

-- [stuck_statuses]
SELECT string_agg(DISTINCT _idem_status_word(status), ',') FROM idem_records WHERE operation = 'stuck';

-- [rel_fill] 6 reservations with a 1 s lease
SELECT count(*) FROM (SELECT idem_reserve('rel', 's-' || i % 10, 'k' || i, 'h', lease => '1 second') FROM generate_series(1, 6) AS i) AS s;

-- [recover_release]
SELECT idem_recover_stuck(action => 'release');

-- [rel_records]
SELECT count(*) FROM idem_records WHERE operation = 'rel';

-- [rel_retries_once]
SELECT count(*) FROM idem_retries WHERE operation = 'rel' AND attempts = 1;

-- [sweep_batch]
SELECT idem_sweep(batch_size => 20);

-- [old_records]
SELECT count(*) FROM idem_records WHERE operation = 'old';

-- [sweep_batch_rest]
SELECT idem_sweep(batch_size => 20) >= 5;

-- [rel_retries_expire]
UPDATE idem_retries SET expires_at = now() - interval '1 second' WHERE operation = 'rel';

-- [sweep_retries]
SELECT idem_sweep() >= 6;

-- [rel_retries]
SELECT count(*) FROM idem_retries WHERE operation = 'rel';

-- [held_reserve]
SELECT idem_reserve('held', :'u1', 'k', 'h', lease => '1 second');

-- [locker] a session holding the record's row
BEGIN;
SELECT 1 FROM idem_records WHERE operation = 'held' AND user_id = :'u1' FOR UPDATE;
SELECT pg_sleep(30) /* locker */;
COMMIT;

-- [recover_no_wait] (`\;`: one query, as `psql -c` sends it)
SET statement_timeout = '5s' \; SELECT idem_recover_stuck();

-- [cancel] the sessions running a query that starts with :prefix
SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE :'prefix' || '%';

-- [bg_stuck]
SELECT idem_reserve('bg', 'b-' || i, 'k', 'h', lease => '1 second') FROM generate_series(1, 10) AS i;

-- [bg_expired]
SELECT idem_complete('bg', 'b-' || i, 'done', (idem_reserve('bg', 'b-' || i, 'done', 'h', ttl => '1 second')).token, '{}') FROM generate_series(1, 10) AS i;

-- [maintenance_interval] the worker's interval, :interval seconds
ALTER SYSTEM SET idempotency.maintenance_interval = :interval;
SELECT pg_reload_conf();

-- [bg_stuck_statuses]
SELECT string_agg(DISTINCT _idem_status_word(status), ',') FROM idem_records WHERE operation = 'bg' AND key = 'k';

-- [bg_expired_left]
SELECT count(*) FROM idem_records WHERE operation = 'bg' AND key = 'done';
