-- The Citus layer's lock budget (xtask/src/layers/citus.rs, fn lock_budget; issue 34): one
-- transaction reserves :n keys of :u1 with idem_reserve_many, delegated to the worker of the
-- user's shard, and keeps at most half of max_locks_per_transaction key locks there (0.5.0 kept
-- one per key on Citus and ran out of the worker's lock table). Run by name (see nodes.sql).

-- [budget_lock_table] on a worker: max_locks_per_transaction, then the size of the shared lock
-- table (max_locks_per_transaction × (MaxBackends + max_prepared_transactions))
SELECT current_setting('max_locks_per_transaction') || ' '
       || current_setting('max_locks_per_transaction')::int
          * (current_setting('max_connections')::int + current_setting('autovacuum_max_workers')::int + 1
             + current_setting('max_worker_processes')::int + current_setting('max_wal_senders')::int
             + current_setting('max_prepared_transactions')::int);

-- [budget_big] a session reserving the keys b-1 .. b-:n of :u1 in one transaction (the arrays as
-- constants: the call is delegated), then holding the transaction open for 5 s
SELECT array_agg('b-' || g ORDER BY g)::text AS keys, array_fill('h'::text, ARRAY[:n])::text AS hashes
  FROM generate_series(1, :n) AS g \gset
BEGIN;
SELECT 'created ' || count(*) FILTER (WHERE outcome = 'created' AND token IS NOT NULL)
  FROM idem_reserve_many('budget', :'u1', :'keys'::text[], :'hashes'::text[]);
SELECT pg_sleep(5) /* budget */;
COMMIT;
SELECT 'committed';

-- [budget_locks] on the worker: the key locks idem_reserve takes (pg_advisory_xact_lock(bigint):
-- objsubid 1), then every other advisory lock (Citus's own)
SELECT count(*) FILTER (WHERE objsubid = 1) || ' ' || count(*) FILTER (WHERE objsubid <> 1)
  FROM pg_locks WHERE locktype = 'advisory' AND granted;

-- [budget_duplicate] a duplicate of key :key of the open batch, through the coordinator
-- (`\;`: one query, as `psql -c` sends it)
SET statement_timeout = '30s' \; SELECT outcome FROM idem_reserve('budget', :'u1', :'key', 'h');

-- [budget_records] after the commit: the batch's records, PROCESSING, and all of them
SELECT count(*) FILTER (WHERE status = 'p') || ' ' || count(*)
  FROM idem_records WHERE operation = 'budget' AND user_id = :'u1';
