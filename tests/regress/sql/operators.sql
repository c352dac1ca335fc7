-- idem_lookup and idem_stats.
\set VERBOSITY sqlstate

SELECT (idem_reserve('ops', 'u', 'p1', 'h')).outcome;
SELECT (idem_reserve('ops', 'u', 'p2', 'h', lease => '10 ms')).outcome;
SELECT idem_complete('ops', 'u', 's1', (idem_reserve('ops', 'u', 's1', 'h')).token, '{"ok": 1}');
SELECT idem_complete('ops', 'u', 'f1', (idem_reserve('ops', 'u', 'f1', 'h', ttl => '10 ms')).token, NULL, 'FAILED');
SELECT pg_sleep(0.05);

SELECT operation, user_id, key, request_hash, status, response FROM idem_lookup('ops', 'u', 's1');
SELECT count(*) AS rows_for_missing_key FROM idem_lookup('ops', 'u', 'nope');
-- success and failed are estimates from planner statistics: unknown before the first ANALYZE,
-- exact right after ANALYZE of a table this small. The other columns are always exact.
SELECT success IS NULL AND failed IS NULL AS estimates_unknown, processing, stuck, expired FROM idem_stats();
ANALYZE idem_records;
SELECT processing, success, failed, stuck, expired,
       oldest_processing_age > interval '0' AS has_oldest_age
  FROM idem_stats();
DELETE FROM idem_records;
ANALYZE idem_records;
SELECT * FROM idem_stats();
SELECT err($$SELECT * FROM idem_lookup('ops', NULL, 'k')$$);
