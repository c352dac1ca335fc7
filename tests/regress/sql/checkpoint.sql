-- Recovery points (issue 45, docs/recovery-points.md): idem_checkpoint records the step an
-- attempt reached and its state, fenced by the attempt's token; a key with a recovery point and
-- no live holder is RESUMABLE (released by its holder or by recovery) or PROCESSING with its
-- lease run out, and idem_reserve answers it `resume` with the step and the state instead of
-- starting over. Leases run out by an admin UPDATE here, never by a sleep.
-- Runs on every install (the extension, updated or fresh, and the portable install).
\set VERBOSITY sqlstate
CREATE TABLE cp_rides (key text, ride integer);
-- A reservation with the new attributes, without its volatile columns.
CREATE FUNCTION cp_res(k text, h text DEFAULT 'h', op text DEFAULT 'cp', wait boolean DEFAULT false)
    RETURNS TABLE (outcome text, has_token boolean, response jsonb, attempts integer, step integer, state jsonb)
    LANGUAGE sql AS $$
        SELECT r.outcome, r.token IS NOT NULL, r.response, r.attempts, r.step, r.state
          FROM idem_reserve(op, 'u', k, h, wait => wait) AS r $$;
-- A key reserved, checkpointed and released in one transaction: RESUMABLE at `step`.
CREATE FUNCTION cp_make_resumable(op text, k text, h text, step integer, state jsonb) RETURNS text
    LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint := (idem_reserve(op, 'u', k, h)).token;
BEGIN
    IF NOT idem_checkpoint(op, 'u', k, v_token, step, state) THEN
        RAISE EXCEPTION 'the checkpoint of % was refused', k;
    END IF;
    RETURN idem_release(op, 'u', k, v_token);
END $$;
-- The stored record of key k, its state too.
CREATE FUNCTION cp_rec(k text) RETURNS SETOF idem_records LANGUAGE sql AS $$
    SELECT * FROM idem_records WHERE operation = 'cp' AND user_id = 'u' AND key = k $$;
-- An error's SQLSTATE, message, detail and hint: what a caller's log would show.
CREATE FUNCTION cp_err_all(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_detail text;
    v_hint   text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || SQLERRM || ' / detail: ' || coalesce(v_detail, '') || ' / hint: ' || coalesce(v_hint, '');
END $$;

-- idem_checkpoint ---------------------------------------------------------------------------

-- A fresh reservation answers no step and no state.
SELECT * FROM cp_res('k');
SELECT token AS t FROM idem_lookup('cp', 'u', 'k') \gset
-- Recovery point 0 (the request's input): true; the lease extended by idempotency.lease.
SET idempotency.lease = '45s';
SELECT clock_timestamp() AS before \gset
SELECT idem_checkpoint('cp', 'u', 'k', :t, 0, '{"input": {"amount": 100}}');
SELECT status, step, state,
       lease_expires_at >= :'before'::timestamptz + interval '45 seconds'
       AND lease_expires_at <= clock_timestamp() + interval '45 seconds' AS default_lease
  FROM cp_rec('k');
RESET idempotency.lease;
-- A local step: its writes and its recovery point commit together, with an explicit lease that
-- moves the record's expiry to at least the lease's end.
UPDATE idem_records SET expires_at = now() + interval '1 minute' WHERE operation = 'cp' AND key = 'k';
BEGIN;
INSERT INTO cp_rides VALUES ('k', 1);
SELECT idem_checkpoint('cp', 'u', 'k', :t, 1, '{"ride": 1}', lease => '10 minutes');
COMMIT;
SELECT step, state, lease_expires_at > now() + interval '9 minutes' AS lease_extended,
       expires_at >= lease_expires_at AS expiry_covers_lease
  FROM cp_rec('k');
-- ... or neither: a step rolled back leaves the last recovery point and none of its writes.
BEGIN;
INSERT INTO cp_rides VALUES ('k', 2);
SELECT idem_checkpoint('cp', 'u', 'k', :t, 2, '{"ride": 2}');
ROLLBACK;
SELECT step, state, (SELECT count(*) FROM cp_rides WHERE key = 'k') AS rides FROM cp_rec('k');
-- The state may be NULL (nothing to carry).
SELECT idem_checkpoint('cp', 'u', 'k', :t, 2, NULL);
SELECT step, state FROM cp_rec('k');
-- The step only moves forward: the same step or an earlier one is 22023, by the token's holder.
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 2, %L)', 'cp', 'u', 'k', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 1, %L)', 'cp', 'u', 'k', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, -1, %L)', 'cp', 'u', 'k', :t, '{}'));
-- NULL arguments: 22004 naming each; the key rules: 22023.
SELECT err(format('SELECT idem_checkpoint(NULL, %L, %L, %s, 3, %L)', 'u', 'k', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, NULL, %L, %s, 3, %L)', 'cp', 'k', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, NULL, %s, 3, %L)', 'cp', 'u', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, NULL, 3, %L)', 'cp', 'u', 'k', '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, NULL, %L)', 'cp', 'u', 'k', :t, '{}'));
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 3, %L)', 'cp', 'u', '', :t, '{}'));
-- The state is bounded like a response (its jsonb text against idempotency.max_response_bytes):
-- 54000 naming the sizes, never echoing the value.
SET idempotency.max_response_bytes = 20;
SELECT cp_err_all(format('SELECT idem_checkpoint(%L, %L, %L, %s, 3, %L)', 'cp', 'u', 'k', :t, '{"card": "4242-secret"}')) AS e \gset
SELECT :'e' AS error, strpos(:'e', '4242') = 0 AS value_not_echoed;
SELECT octet_length('{"a": "0123456789a"}'::jsonb::text) AS bytes,
       idem_checkpoint('cp', 'u', 'k', :t, 3, '{"a": "0123456789a"}') AS at_the_bound;
RESET idempotency.max_response_bytes;
-- A lease past the record's ceiling: idem_heartbeat's 22023.
SET idempotency.ttl = '1h';
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 4, %L, lease => %L)', 'cp', 'u', 'k', :t, '{}', '2 hours'));
RESET idempotency.ttl;
-- Every write is refused in a read-only transaction.
BEGIN READ ONLY;
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 4, %L)', 'cp', 'u', 'k', :t, '{}'));
COMMIT;
-- Nothing of the refused calls was recorded.
SELECT status, step, state FROM cp_rec('k');
-- A stale token or a missing key: false, changing nothing.
SELECT idem_checkpoint('cp', 'u', 'k', :t + 1000, 9, '{}') AS wrong_token;
SELECT idem_checkpoint('cp', 'u', 'missing', :t, 9, '{}') AS missing_key;
-- idem_complete keeps the step that finished the request and clears the state (the response is
-- the answer now); after it the token's checkpoint is false.
SELECT idem_complete('cp', 'u', 'k', :t, '{"ride": 1, "done": true}');
SELECT status, step, state, response FROM cp_rec('k');
SELECT idem_checkpoint('cp', 'u', 'k', :t, 4, '{}') AS after_complete;
SELECT * FROM cp_res('k');
-- A checkpoint in the reservation's own transaction (recovery point 0 written with the
-- reservation).
BEGIN;
SELECT token AS t FROM idem_reserve('cp', 'u', 'one-tx', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'one-tx', :t, 0, '{"input": 2}');
COMMIT;
SELECT status, step, state FROM cp_rec('one-tx');
SELECT idem_complete('cp', 'u', 'one-tx', :t, '{}');

-- Guarantee 8: another role sending the holder's token is refused (42501); a wrong token is a
-- stale token for every role.
CREATE ROLE idem_cp_owner;
CREATE ROLE idem_cp_other;
GRANT idempotency_user TO idem_cp_owner, idem_cp_other;
SET ROLE idem_cp_owner;
SELECT token AS t_owned FROM idem_reserve('cp', 'u', 'owned', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'owned', :t_owned, 0, '{"input": 3}');
RESET ROLE;
SET ROLE idem_cp_other;
SELECT err(format('SELECT idem_checkpoint(%L, %L, %L, %s, 1, %L)', 'cp', 'u', 'owned', :t_owned, '{"forged": true}'));
SELECT idem_checkpoint('cp', 'u', 'owned', :t_owned + 1000, 1, '{"forged": true}') AS wrong_token;
RESET ROLE;
SELECT owner, status, step, state FROM idem_records WHERE operation = 'cp' AND key = 'owned';
-- Released by its owner, the key is RESUMABLE: another role may neither resume it nor list it.
SET ROLE idem_cp_owner;
SELECT idem_release('cp', 'u', 'owned', :t_owned);
RESET ROLE;
SET ROLE idem_cp_other;
SELECT err($$SELECT idem_reserve('cp', 'u', 'owned', 'h')$$);
SELECT count(*) AS listed FROM idem_resumable('cp');
RESET ROLE;
-- Its owner lists it and resumes it (wait => true waits for the key's lock only: none here).
SET ROLE idem_cp_owner;
SELECT key, step, state FROM idem_resumable('cp');
SELECT outcome, step, state FROM idem_reserve('cp', 'u', 'owned', 'h', wait => true);
RESET ROLE;

-- idem_reserve: resume --------------------------------------------------------------------

-- A RESUMABLE key (its holder released it after recovery point 1; counted): the release fences
-- the holder out (a new token) and keeps the record for at least idempotency.ttl.
SELECT token AS t FROM idem_reserve('cp', 'u', 'rel', 'h', ttl => '1 hour') \gset
BEGIN;
INSERT INTO cp_rides VALUES ('rel', 1);
SELECT idem_checkpoint('cp', 'u', 'rel', :t, 1, '{"ride": 1}');
COMMIT;
SET idempotency.ttl = '5h';
SELECT clock_timestamp() AS before \gset
SELECT idem_release('cp', 'u', 'rel', :t);
RESET idempotency.ttl;
SELECT status, step, state, token <> :t AS new_token,
       expires_at >= :'before'::timestamptz + interval '5 hours' AS kept_for_the_ttl
  FROM cp_rec('rel');
SELECT attempts FROM idem_retries WHERE operation = 'cp' AND key = 'rel';
-- idem_lookup answers the status and the step.
SELECT status, step FROM idem_lookup('cp', 'u', 'rel');
SELECT idem_checkpoint('cp', 'u', 'rel', :t, 2, '{}') AS stale_checkpoint;
SELECT idem_heartbeat('cp', 'u', 'rel', :t) AS stale_heartbeat;
SELECT idem_complete('cp', 'u', 'rel', :t, '{}') AS stale_complete;
SELECT idem_release('cp', 'u', 'rel', :t) AS stale_release;
-- Recovery never walks a RESUMABLE key again.
SELECT idem_recover_stuck();
-- Another request under the key: mismatch, the record untouched.
SELECT token AS t_rel FROM idem_lookup('cp', 'u', 'rel') \gset
SELECT * FROM cp_res('rel', 'other');
SELECT status, step, state, token = :t_rel AS same_token FROM cp_rec('rel');
-- The same request resumes at the recovery point, with a new token and a live lease; not counted
-- again (the release counted it).
SELECT * FROM cp_res('rel');
SELECT status, token > :t_rel AS newer_token, lease_expires_at > now() AS lease_live
  FROM idem_lookup('cp', 'u', 'rel');
SELECT attempts FROM idem_retries WHERE operation = 'cp' AND key = 'rel';
-- Resumed, the key has a live holder again: in_progress.
SELECT * FROM cp_res('rel');
-- The resumed attempt continues: the next step, then completion; one ride.
SELECT token AS t FROM idem_lookup('cp', 'u', 'rel') \gset
SELECT idem_checkpoint('cp', 'u', 'rel', :t, 2, '{"ride": 1, "charge": "ch_1"}');
SELECT idem_complete('cp', 'u', 'rel', :t, '{"ride": 1, "charge": "ch_1"}');
SELECT status, step, state, response, (SELECT count(*) FROM cp_rides WHERE key = 'rel') AS rides
  FROM cp_rec('rel');
SELECT * FROM cp_res('rel');

-- A PROCESSING key with a recovery point whose lease ran out (its holder is gone): resumable at
-- once, recovery or not.
SELECT token AS t FROM idem_reserve('cp', 'u', 'lost', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'lost', :t, 1, '{"ride": 2}');
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'lost';
-- Another request: mismatch, nothing counted, the record untouched.
SELECT * FROM cp_res('lost', 'other');
SELECT status, step, token = :t AS same_token FROM idem_lookup('cp', 'u', 'lost');
SELECT count(*) AS counted FROM idem_retries WHERE operation = 'cp' AND key = 'lost';
-- The same request: resume, counted as one transient failure (as recovery would have).
SELECT * FROM cp_res('lost');
SELECT status, token <> :t AS new_token, lease_expires_at > now() AS lease_live FROM idem_lookup('cp', 'u', 'lost');
-- The lost holder is stale: its checkpoint and its completion change nothing.
SELECT idem_checkpoint('cp', 'u', 'lost', :t, 2, '{"late": true}') AS stale_checkpoint;
SELECT idem_complete('cp', 'u', 'lost', :t, '{"late": true}') AS stale_complete;
-- Lost again: counted 2; a third time reaches max_retries (3): failed, the key FAILED, its
-- state cleared.
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'lost';
SELECT * FROM cp_res('lost');
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'lost';
SELECT * FROM cp_res('lost');
SELECT status, state FROM cp_rec('lost');
SELECT * FROM cp_res('lost');

-- A key without a recovery point is answered as before: in_progress while PROCESSING, its lease
-- run out or not, until recovery decides.
SELECT token AS t FROM idem_reserve('cp', 'u', 'plain', 'h') \gset
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'plain';
SELECT * FROM cp_res('plain');
SELECT status, step FROM idem_lookup('cp', 'u', 'plain');
SELECT idem_complete('cp', 'u', 'plain', :t, '{}');

-- A RESUMABLE key past its expiry: its history is gone, as an expired FAILED record's: created
-- afresh, with no step.
SELECT token AS t FROM idem_reserve('cp', 'u', 'old', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'old', :t, 1, '{"ride": 3}');
SELECT idem_release('cp', 'u', 'old', :t);
UPDATE idem_records SET expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'old';
SELECT outcome, has_token, step, state FROM cp_res('old');
SELECT status, step, state FROM cp_rec('old');

-- idem_release and idem_recover_stuck ---------------------------------------------------------

-- idem_release at max_retries: poisoned, FAILED, the state cleared.
SELECT token AS t FROM idem_reserve('cp', 'u', 'rel-poison', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'rel-poison', :t, 1, '{"ride": 4}');
SELECT idem_release('cp', 'u', 'rel-poison', :t, max_retries => 1);
SELECT status, state FROM cp_rec('rel-poison');

-- idem_recover_stuck: a key with a recovery point whose lease ran out is counted and left
-- RESUMABLE, whatever the action (never FAILED below max_retries); a key without one is
-- handled as before. The result counts both.
SELECT token AS t FROM idem_reserve('cp', 'u', 'stuck', 'h') \gset
SELECT idem_checkpoint('cp', 'u', 'stuck', :t, 2, '{"charge": "ch_2"}');
SELECT (idem_reserve('cp', 'u', 'stuck-plain', 'h')).outcome;
UPDATE idem_records SET lease_expires_at = now() - interval '1 second'
 WHERE operation = 'cp' AND key IN ('stuck', 'stuck-plain');
SELECT idem_recover_stuck(action => 'fail');
SELECT key, status, step, state FROM idem_records WHERE operation = 'cp' AND key LIKE 'stuck%' ORDER BY key;
SELECT key, attempts FROM idem_retries WHERE operation = 'cp' AND key LIKE 'stuck%' ORDER BY key;
-- The dead holder is fenced out; the retry resumes, not counted again.
SELECT idem_checkpoint('cp', 'u', 'stuck', :t, 3, '{}') AS stale_checkpoint;
SELECT idem_recover_stuck();
SELECT * FROM cp_res('stuck');
-- action => 'release': the same, counted 2.
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'stuck';
SELECT idem_recover_stuck(action => 'release');
SELECT status, step, state FROM cp_rec('stuck');
SELECT * FROM cp_res('stuck');
-- At max_retries: poisoned, FAILED, the state cleared.
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cp' AND key = 'stuck';
SELECT idem_recover_stuck();
SELECT status, state FROM cp_rec('stuck');
SELECT attempts FROM idem_retries WHERE operation = 'cp' AND key = 'stuck';

-- idem_resumable ----------------------------------------------------------------------------

-- For a completer: the RESUMABLE keys of an operation, oldest updated_at first, at most
-- batch_size; PROCESSING and finished keys are not listed.
SELECT k AS key, cp_make_resumable('cpq', k, 'h-' || k, 1, jsonb_build_object('at', k))
  FROM unnest(ARRAY['a', 'b', 'c']) AS k;
SELECT token AS t FROM idem_reserve('cpq', 'u', 'live', 'h') \gset
SELECT idem_checkpoint('cpq', 'u', 'live', :t, 1, '{}');
UPDATE idem_records SET updated_at = now() - (CASE key WHEN 'b' THEN 3 WHEN 'c' THEN 2 ELSE 1 END) * interval '1 minute'
 WHERE operation = 'cpq' AND status = 'RESUMABLE';
SELECT user_id, key, request_hash, step, state, attempts FROM idem_resumable('cpq');
SELECT key FROM idem_resumable('cpq', batch_size => 2);
-- request_hash as idem_lookup answers it.
SELECT bool_and(q.request_hash = l.request_hash) AS as_lookup
  FROM idem_resumable('cpq') AS q, LATERAL idem_lookup('cpq', q.user_id, q.key) AS l;
-- A resume touches updated_at: a key that fails again goes to the back of the queue.
SELECT token AS t FROM idem_reserve('cpq', 'u', 'b', 'h-b') \gset
SELECT idem_release('cpq', 'u', 'b', :t);
SELECT key, attempts FROM idem_resumable('cpq');
-- Errors.
SELECT err($$SELECT * FROM idem_resumable(NULL)$$);
SELECT err($$SELECT * FROM idem_resumable('cpq', batch_size => 0)$$);
SELECT err($$SELECT * FROM idem_resumable('cpq', batch_size => NULL)$$);

-- idem_sweep: an expired RESUMABLE record is swept like a FAILED one.
UPDATE idem_records SET expires_at = now() - interval '1 second' WHERE operation = 'cpq' AND key = 'c';
SELECT idem_sweep();
SELECT key, status FROM idem_records WHERE operation = 'cpq' ORDER BY key;

-- idem_reserve_many and idem_await answer resume as idem_reserve does ------------------------

SELECT key, outcome, token IS NOT NULL AS has_token, attempts, step, state
  FROM idem_reserve_many('cpq', 'u', ARRAY['a', 'new', 'b'], ARRAY['h-a', 'h', 'other']);
-- A RESUMABLE key, and a PROCESSING key with a recovery point whose lease ran out (its holder
-- is not waited for): resume.
SELECT outcome, token IS NOT NULL AS has_token, attempts, step, state FROM idem_await('cpq', 'u', 'b', 'h-b', '1 second');
UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = 'cpq' AND key = 'live';
SELECT outcome, token IS NOT NULL AS has_token, attempts, step, state FROM idem_await('cpq', 'u', 'live', 'h', '1 second');

DROP FUNCTION cp_res(text, text, text, boolean);
DROP FUNCTION cp_err_all(text);
DROP FUNCTION cp_rec(text);
DROP FUNCTION cp_make_resumable(text, text, text, integer, jsonb);
DROP TABLE cp_rides;
DELETE FROM idem_records;
DELETE FROM idem_retries;
DROP ROLE idem_cp_owner;
DROP ROLE idem_cp_other;
