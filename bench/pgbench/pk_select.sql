-- Baseline of a replay: the primary-key SELECT of one record (the key's digest, its texts
-- re-checked, as the extension reads it: docs/record-layout.md).
\set k random(1, 100000)
SELECT request_hash, status, response, expires_at FROM idem_records
 WHERE id = _idem_id('bench.replay', 'u', 'r' || :k)
   AND operation = 'bench.replay' AND user_id = 'u' AND key = 'r' || :k;
