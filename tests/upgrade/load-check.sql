-- After the load of tests/upgrade/load.pgbench ran through the update: `label|t` passes.
-- The tables were filled a moment ago, before autovacuum could analyze them: without statistics
-- the planner joins 10,000 records to 10,000 business rows by nested loops over whole scans
-- (32 s for the two joins below), so they are analyzed first, and each lookup of a record names
-- its whole primary key (operation, user_id, key).
\set QUIET on
ANALYZE charges, idem_records;
SELECT 'the load created keys before the update', count(*) > 0
  FROM idem_records WHERE operation = 'load' AND created_at < :'updated_at';
SELECT 'the load created keys after the update', count(*) > 0
  FROM idem_records WHERE operation = 'load' AND created_at > :'updated_at';
SELECT 'the load created keys after the move of the records kept from 0.6.0 ended', count(*) > 0
  FROM idem_records WHERE operation = 'load' AND created_at > :'moved_at';
SELECT 'no key ran twice (one business row per key at most)',
       coalesce(max(n), 0) <= 1 FROM (SELECT count(*) AS n FROM charges GROUP BY k) AS c;
SELECT 'every completed key has exactly its one business row and its own response',
       bool_and(r.response = jsonb_build_object('k', c.k) AND c.n = 1)
  FROM idem_records AS r
  JOIN (SELECT k, count(*) AS n FROM charges GROUP BY k) AS c ON r.key = 'k' || c.k
 WHERE r.operation = 'load' AND r.user_id = 'u' AND r.status = 's';
SELECT 'no business row without its completed record',
       NOT EXISTS (SELECT FROM charges AS c WHERE NOT EXISTS (
           SELECT FROM idem_records AS r
            WHERE r.operation = 'load' AND r.user_id = 'u' AND r.key = 'k' || c.k AND r.status = 's'));
SELECT 'no reservation left behind', NOT EXISTS (SELECT FROM idem_records WHERE operation = 'load' AND status <> 's');
