-- idem_reserve_many and idem_complete_many: one row per key in input order, each answered as
-- its own idem_reserve / idem_complete call would answer it; the batch rules; and a transaction
-- of many reservations keeping at most half of max_locks_per_transaction key locks.
\set VERBOSITY sqlstate

-- Fresh keys: created, in input order; a key repeated answers as a repeated call (in_progress
-- under the same request_hash, mismatch under another: its first occurrence holds it).
BEGIN;
CREATE TEMP TABLE b1 AS
SELECT row_number() OVER () AS n, * FROM idem_reserve_many('batch', 'u', ARRAY['c', 'a', 'b', 'a', 'b'],
                                                        ARRAY['h', 'h', 'h', 'h', 'other']);
SELECT n, key, outcome, token IS NOT NULL AS has_token, attempts, expires_at IS NOT NULL AS has_expiry
  FROM b1 ORDER BY n;
SELECT count(DISTINCT token) AS distinct_tokens FROM b1;
-- Completed with the tokens it answered: c and a SUCCESS, b with a NULL response; a repeated key
-- completes once; a wrong token completes nothing.
SELECT * FROM idem_complete_many('batch', 'u',
    ARRAY['c', 'a', 'a', 'b', 'zz'],
    ARRAY[(SELECT token FROM b1 WHERE n = 1), (SELECT token FROM b1 WHERE n = 2),
          (SELECT token FROM b1 WHERE n = 2), (SELECT token FROM b1 WHERE n = 3), 1],
    ARRAY['{"r": "c"}', '{"r": "a"}', '{"r": "again"}', NULL]::jsonb[] || ARRAY['{}'::jsonb]);
COMMIT;
SELECT key, status, response FROM idem_records WHERE operation = 'batch' ORDER BY key;
-- After the commit: replays, in input order, with the stored responses; a new key is created.
SELECT key, outcome, response, token IS NOT NULL AS has_token
  FROM idem_reserve_many('batch', 'u', ARRAY['b', 'new', 'a', 'c'], ARRAY['h', 'h', 'h', 'x']);
-- FAILED, as idem_complete's status.
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['new'],
    ARRAY[(SELECT token FROM idem_records WHERE operation = 'batch' AND key = 'new')],
    ARRAY['{"error": "declined"}'::jsonb], 'FAILED');
SELECT outcome, response FROM idem_reserve_many('batch', 'u', ARRAY['new'], ARRAY['h']);
-- Empty arrays: no row.
SELECT count(*) FROM idem_reserve_many('batch', 'u', '{}', '{}');
SELECT count(*) FROM idem_complete_many('batch', 'u', '{}', '{}', '{}');

-- The batch rules: each error names the argument (or element) and changes nothing.
SELECT * FROM idem_reserve_many('batch', 'u', NULL, ARRAY['h']);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k'], NULL);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1', 'k2'], ARRAY['h']);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1', NULL], ARRAY['h', 'h']);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1', 'k2'], ARRAY['h', NULL]);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY[['k1'], ['k2']], ARRAY['h', 'h']);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1'], ARRAY['h'], wait => NULL);
SELECT * FROM idem_reserve_many(NULL, 'u', ARRAY['k1'], ARRAY['h']);
SELECT * FROM idem_reserve_many('batch', '', ARRAY['k1'], ARRAY['h']);
-- A key that breaks the key rules: idem_reserve's error; the keys before it roll back with it.
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1', repeat('x', 256)], ARRAY['h', 'h']);
SELECT * FROM idem_reserve_many('batch', 'u', ARRAY['k1'], ARRAY['h'], ttl => '-1 day');
SELECT * FROM idem_complete_many('batch', 'u', NULL, ARRAY[1], ARRAY[NULL::jsonb]);
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1'], ARRAY[1, 2], ARRAY[NULL::jsonb]);
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1'], ARRAY[NULL::bigint], ARRAY[NULL::jsonb]);
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1'], ARRAY[1], NULL);
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1'], ARRAY[1], ARRAY[NULL::jsonb], NULL);
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1'], ARRAY[1], ARRAY[NULL::jsonb], 'DONE');
SELECT count(*) AS k1_records FROM idem_records WHERE operation = 'batch' AND key = 'k1';
-- An oversized response: 54000 naming the element, before anything is completed.
SET idempotency.max_response_bytes = 16;
SELECT * FROM idem_complete_many('batch', 'u', ARRAY['k1', 'k2'], ARRAY[1, 2],
                                 ARRAY['{}', '{"long": "response text"}']::jsonb[]);
RESET idempotency.max_response_bytes;

-- Committed reservations (written records): a repeated key with its token completes once; a
-- wrong token before the right one answers false, then true.
CREATE TEMP TABLE b3 AS
SELECT * FROM idem_reserve_many('batch.written', 'u', ARRAY['w1', 'w2'], ARRAY['h', 'h']);
SELECT * FROM idem_complete_many('batch.written', 'u', ARRAY['w1', 'w1', 'w2', 'w2'],
    ARRAY[(SELECT token FROM b3 WHERE key = 'w1'), (SELECT token FROM b3 WHERE key = 'w1'),
          (SELECT token FROM b3 WHERE key = 'w2') + 1000, (SELECT token FROM b3 WHERE key = 'w2')],
    ARRAY['{"n": 1}', '{"n": "again"}', '{"n": "stale"}', '{"n": 2}']::jsonb[]);
SELECT key, status, response FROM idem_records WHERE operation = 'batch.written' ORDER BY key;
DROP TABLE b3;

-- Many reservations in one transaction keep at most half of max_locks_per_transaction key
-- locks (the rest are held by their uncommitted rows); every key is created, commits as
-- PROCESSING, and completes with its token.
BEGIN;
CREATE TEMP TABLE b2 AS
SELECT * FROM idem_reserve_many('batch.many', 'u', ARRAY(SELECT 'k' || g FROM generate_series(1, 500) AS g),
                                array_fill('h'::text, ARRAY[500]));
SELECT outcome, count(*) FROM b2 GROUP BY outcome;
SELECT count(*) > 0 AS holds_locks,
       count(*) <= current_setting('max_locks_per_transaction')::integer / 2 AS within_budget
  FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
SELECT status, count(*) FROM idem_records WHERE operation = 'batch.many' GROUP BY status;
SELECT completed, count(*)
  FROM idem_complete_many('batch.many', 'u', (SELECT array_agg(key ORDER BY key) FROM b2),
                          (SELECT array_agg(token ORDER BY key) FROM b2),
                          array_fill('{"ok": true}'::jsonb, ARRAY[500]))
 GROUP BY completed;
SELECT outcome, count(*)
  FROM idem_reserve_many('batch.many', 'u', ARRAY(SELECT 'k' || g FROM generate_series(1, 500) AS g),
                         array_fill('h'::text, ARRAY[500]))
 GROUP BY outcome;
-- Single calls past the budget, in one transaction, completed in it: the same.
BEGIN;
SELECT count(*) FILTER (WHERE idem_complete('batch.singles', 'u', 'k' || g, (r).token, '{}')) AS completed
  FROM (SELECT g, idem_reserve('batch.singles', 'u', 'k' || g, 'h') AS r
          FROM generate_series(1, 300) AS g OFFSET 0) AS s;
SELECT count(*) <= current_setting('max_locks_per_transaction')::integer / 2 AS within_budget
  FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
SELECT status, count(*) FROM idem_records WHERE operation = 'batch.singles' GROUP BY status;
DROP TABLE b1, b2;
