-- Run after the update (ALTER EXTENSION idempotency UPDATE, or the portable upgrade script) on the
-- database tests/upgrade/before.sql filled.
-- Each row is one test: `label|t` passes.
SELECT 'the update changed no record and no retry counter',
       (SELECT count(*) FROM (SELECT * FROM upgrade_test.records EXCEPT SELECT * FROM idem_records) AS d) = 0
       AND (SELECT count(*) FROM idem_records) = (SELECT count(*) FROM upgrade_test.records)
       AND (SELECT count(*) FROM (SELECT * FROM upgrade_test.retries EXCEPT SELECT * FROM idem_retries) AS d) = 0
       AND (SELECT count(*) FROM idem_retries) = (SELECT count(*) FROM upgrade_test.retries);
SELECT 'the answers before the update were replay, failed, in_progress and mismatch',
       array_agg(DISTINCT outcome ORDER BY outcome) = '{failed,in_progress,mismatch,replay}'
  FROM upgrade_test.answers;
SELECT 'every record answers as before (outcome, response, attempts, expiry)',
       count(*) = 0
  FROM (SELECT * FROM upgrade_test.answers
        EXCEPT
        SELECT q.key, q.hash, r.outcome, r.token, r.response, r.attempts, r.expires_at
          FROM upgrade_test.answers AS q, LATERAL idem_reserve('up', 'u', q.key, q.hash) AS r) AS d;
SELECT 'the in-flight reservation''s token completes it',
       idem_complete('up', 'u', 'inflight', token, '{"id": 3}')
  FROM upgrade_test.tokens WHERE key = 'inflight';
SELECT 'and the key then replays that response',
       outcome = 'replay' AND response = '{"id": 3}'
  FROM idem_reserve('up', 'u', 'inflight', 'h');
SELECT 'a stale token of the old version still changes nothing',
       NOT idem_complete('up', 'u', 'success', token + 1000, '{"x": 1}')
  FROM upgrade_test.tokens WHERE key = 'success';
CREATE TEMP TABLE retry AS SELECT * FROM idem_reserve('up', 'u', 'released', 'h');
SELECT 'the released key runs again, its retry counter carried over (attempts 1)',
       outcome = 'created' AND attempts = 1 FROM retry;
SELECT 'the next token exceeds every earlier one',
       token > (SELECT last_value FROM upgrade_test.last_token)
       AND token > (SELECT max(token) FROM upgrade_test.records) FROM retry;
SELECT 'a second release counts 2 of 3: released',
       idem_release('up', 'u', 'released', token, max_retries => 3) = 'released' FROM retry;
SELECT 'a third attempt counts 3 of 3: poisoned',
       idem_release('up', 'u', 'released', r.token, max_retries => 3) = 'poisoned'
  FROM idem_reserve('up', 'u', 'released', 'h') AS r;
SELECT 'recovery takes the old stuck row (and only it)', idem_recover_stuck() = 1;
SELECT 'the stuck row is now FAILED', status = 'FAILED' FROM idem_records WHERE key = 'stuck';
SELECT 'sweep deletes the old expired row (and only it)', idem_sweep() = 1;
SELECT 'the expired row is gone', NOT EXISTS (SELECT FROM idem_records WHERE key = 'expired');
SELECT 'the expired key can be reserved again', outcome = 'created'
  FROM idem_reserve('up', 'u', 'expired', 'h');
-- From 0.4.0 on (an update to an earlier version, as the portable chain's steps, keeps the default).
SELECT 'both tables keep the space VACUUM frees (vacuum_truncate = false, as a fresh install of 0.4.0 on)',
       string_to_array(v.version, '.')::int[] < '{0,4,0}'
       OR (SELECT count(*) FROM pg_class
            WHERE oid IN ('idem_records'::regclass, 'idem_retries'::regclass)
              AND reloptions @> '{vacuum_truncate=false}') = 2
  FROM (SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
                        (SELECT substring(prosrc, '''([0-9][^'']*)''') FROM pg_proc
                          WHERE proname = '_idem_portable_version' LIMIT 1)) AS version) AS v;
