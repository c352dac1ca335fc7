-- After the load of tests/upgrade/load.pgbench ran through the update: `label|t` passes.
SELECT 'the load created keys before the update', count(*) > 0
  FROM idem_records WHERE operation = 'load' AND created_at < :'updated_at';
SELECT 'the load created keys after the update', count(*) > 0
  FROM idem_records WHERE operation = 'load' AND created_at > :'updated_at';
SELECT 'no key ran twice (one business row per key at most)',
       coalesce(max(n), 0) <= 1 FROM (SELECT count(*) AS n FROM charges GROUP BY k) AS c;
SELECT 'every completed key has exactly its one business row and its own response',
       bool_and(r.response = jsonb_build_object('k', c.k) AND c.n = 1)
  FROM idem_records AS r
  JOIN (SELECT k, count(*) AS n FROM charges GROUP BY k) AS c ON r.key = 'k' || c.k
 WHERE r.operation = 'load' AND r.status = 'SUCCESS';
SELECT 'no business row without its completed record',
       NOT EXISTS (SELECT FROM charges AS c WHERE NOT EXISTS (
           SELECT FROM idem_records AS r WHERE r.operation = 'load' AND r.key = 'k' || c.k AND r.status = 'SUCCESS'));
SELECT 'no reservation left behind', NOT EXISTS (SELECT FROM idem_records WHERE operation = 'load' AND status <> 'SUCCESS');
