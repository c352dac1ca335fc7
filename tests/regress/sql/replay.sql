-- idem_replay (issue 43 item 3): the read-only first step of idem_reserve. It answers a live
-- record idem_reserve would answer for good (replay, failed, mismatch) with idem_reserve's row,
-- refuses another role's live record as idem_reserve does (42501), and answers NULL for anything
-- else (absent, expired, in progress, resumable), writing, locking and reserving nothing.
-- Runs on every install (the extension, updated or fresh, and the portable install).
\set VERBOSITY sqlstate
CREATE ROLE idem_rp_owner;
CREATE ROLE idem_rp_other;
GRANT idempotency_user TO idem_rp_owner, idem_rp_other;
-- idem_replay's row without its volatile column (expires_at); is_null: it answered NULL.
CREATE FUNCTION rp(k text, h text DEFAULT 'h')
    RETURNS TABLE (is_null boolean, outcome text, token bigint, response jsonb, attempts integer,
                   has_expiry boolean, step integer, state jsonb)
    LANGUAGE sql AS $$
        SELECT r IS NULL, r.outcome, r.token, r.response, r.attempts, r.expires_at IS NOT NULL,
               r.step, r.state
          FROM idem_replay('rp', 'u', k, h) AS r $$;
GRANT EXECUTE ON FUNCTION rp(text, text) TO PUBLIC;
-- Whatever the session holds: no advisory lock may be left by idem_replay.
CREATE FUNCTION rp_locks() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() $$;

SET ROLE idem_rp_owner;
-- An absent key: NULL, and nothing reserved (idem_reserve then creates it).
SELECT * FROM rp('absent');
RESET ROLE;
SELECT count(*) AS records FROM idem_records WHERE operation = 'rp';
SET ROLE idem_rp_owner;
-- In progress: NULL, in the reserving transaction and after its commit.
BEGIN;
SELECT token FROM idem_reserve('rp', 'u', 'done', 'h') \gset
SELECT * FROM rp('done');
COMMIT;
SELECT * FROM rp('done');
-- Completed: idem_reserve's replay, the same row (expiry included).
SELECT idem_complete('rp', 'u', 'done', :token, '{"id": 1}');
SELECT * FROM rp('done');
SELECT idem_replay('rp', 'u', 'done', 'h') IS NOT DISTINCT FROM idem_reserve('rp', 'u', 'done', 'h') AS same_as_reserve;
-- Another request under the key: mismatch, no response, as idem_reserve.
SELECT * FROM rp('done', 'another hash');
SELECT idem_replay('rp', 'u', 'done', 'another hash') IS NOT DISTINCT FROM idem_reserve('rp', 'u', 'done', 'another hash') AS same_as_reserve;
-- Failed: idem_reserve's failed, the stored failure.
SELECT t AS token FROM (SELECT (idem_reserve('rp', 'u', 'bad', 'h')).token AS t) AS s \gset
SELECT idem_complete('rp', 'u', 'bad', :token, '{"error": "declined"}', 'FAILED');
SELECT * FROM rp('bad');
SELECT idem_replay('rp', 'u', 'bad', 'h') IS NOT DISTINCT FROM idem_reserve('rp', 'u', 'bad', 'h') AS same_as_reserve;
-- Released with a retry left: no record answers for good (attempts counted, RESUMABLE or not):
-- NULL, idem_reserve starts the next attempt.
SELECT t AS token FROM (SELECT (idem_reserve('rp', 'u', 'again', 'h')).token AS t) AS s \gset
SELECT idem_release('rp', 'u', 'again', :token);
SELECT * FROM rp('again');
-- A recovery point and no live holder (RESUMABLE): NULL; idem_reserve resumes it.
SELECT t AS token FROM (SELECT (idem_reserve('rp', 'u', 'steps', 'h')).token AS t) AS s \gset
SELECT idem_checkpoint('rp', 'u', 'steps', :token, 1, '{"charged": true}');
SELECT idem_release('rp', 'u', 'steps', :token);
SELECT * FROM rp('steps');
SELECT outcome FROM idem_reserve('rp', 'u', 'steps', 'h');
-- Nothing written, locked or reserved by any of these calls, in a read-only transaction too.
SELECT rp_locks() AS advisory_locks;
BEGIN READ ONLY;
SELECT outcome, response FROM idem_replay('rp', 'u', 'done', 'h');
SELECT rp_locks() AS advisory_locks;
COMMIT;
RESET ROLE;
SELECT x AS before FROM (SELECT xmin::text AS x FROM idem_records WHERE operation = 'rp' AND key = 'done') AS s \gset
SELECT count(*) FROM idem_replay('rp', 'u', 'done', 'h');
SELECT xmin::text = :'before' AS not_rewritten FROM idem_records WHERE operation = 'rp' AND key = 'done';

-- Expired: NULL (idem_reserve takes it over).
UPDATE idem_records SET expires_at = now() - interval '1 second' WHERE operation = 'rp' AND key = 'bad';
SELECT * FROM rp('bad');

-- Another role learns nothing of a live record: 42501, as idem_reserve; NULL for an expired one.
SET ROLE idem_rp_other;
SELECT err($$SELECT idem_replay('rp', 'u', 'done', 'h')$$);
SELECT err($$SELECT idem_replay('rp', 'u', 'done', 'another hash')$$);
SELECT err($$SELECT idem_reserve('rp', 'u', 'done', 'h')$$);
SELECT * FROM rp('bad');
RESET ROLE;

-- The argument rules of idem_reserve, naming the argument.
SELECT err($$SELECT idem_replay(NULL, 'u', 'k', 'h')$$);
SELECT err($$SELECT idem_replay('rp', NULL, 'k', 'h')$$);
SELECT err($$SELECT idem_replay('rp', 'u', '', 'h')$$);
SELECT err($$SELECT idem_replay('rp', 'u', 'k', NULL)$$);
SELECT err($$SELECT idem_replay('rp', 'u', 'k', '')$$);

-- Granted to idempotency_user, not to PUBLIC.
SELECT has_function_privilege('idempotency_user', 'idem_replay(text, text, text, text)', 'EXECUTE') AS app,
       has_function_privilege('public', 'idem_replay(text, text, text, text)', 'EXECUTE') AS public;

DROP FUNCTION rp(text, text);
DROP FUNCTION rp_locks();
DELETE FROM idem_records;
DELETE FROM idem_retries;
DROP ROLE idem_rp_owner;
DROP ROLE idem_rp_other;
