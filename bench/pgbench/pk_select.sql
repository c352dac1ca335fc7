-- Baseline of a replay: the primary-key SELECT of one record.
\set k random(1, 100000)
SELECT request_hash, status, response, expires_at FROM idem_records
 WHERE operation = 'bench.replay' AND user_id = 'u' AND key = 'r' || :k;
