-- The state machine twice: the extension's native idem_reserve/complete/release/heartbeat
-- (schema ext) against the portable PL/pgSQL ones (schema port), in one database. One scenario
-- of steps, each its own statement (so each its own transaction unless a step opens one), runs
-- against each schema; every column of every answer is compared, the stored rows too, and the
-- values the contract fixes are checked on both sides. Tokens and instants differ between two
-- runs by nature: each becomes a label by order of first appearance, and an instant also its
-- distance from the step's start in whole hours (the scenario's durations are hours and days).
-- Each row is one test: `label|t` passes. Needs dblink (a second session holds a key).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS dblink;
CREATE TEMP TABLE steps (n int PRIMARY KEY, kind text NOT NULL CHECK (kind IN ('answer', 'do')), sql text NOT NULL, expect jsonb);
CREATE TEMP TABLE answers (s text, n int, clock timestamptz, a jsonb);
-- The token of an earlier step's answer.
CREATE FUNCTION pg_temp.tok(s text, step int) RETURNS bigint LANGUAGE sql AS
    $$ SELECT (a -> 0 ->> 'token')::bigint FROM answers WHERE answers.s = tok.s AND n = step $$;
-- A step's error as its answer (SQLSTATE: message).
CREATE FUNCTION pg_temp.err(q text) RETURNS text LANGUAGE plpgsql AS
    $$ BEGIN EXECUTE q; RETURN 'ok'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE || ': ' || SQLERRM; END $$;
-- Two roles without privileges of their own (the superuser is a member of every role), with the
-- API of both installs: a key's retry counter is owned like its record.
CREATE ROLE parity_a;
CREATE ROLE parity_b;
GRANT USAGE ON SCHEMA ext, port TO parity_a, parity_b;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA ext, port TO parity_a, parity_b;
GRANT SELECT, INSERT ON answers TO parity_a, parity_b;
-- Refuses to update key 'blocked': a takeover of that key loses its race on every attempt.
CREATE FUNCTION public.parity_refuse_update() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN RETURN NULL; END $$;

INSERT INTO steps (n, kind, sql, expect) VALUES
    -- created, replay, mismatch
    (1, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'a', 'h1', ttl => '3 days', lease => '2 hours')$$, '{"outcome": "created", "attempts": 0}'),
    (2, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'a', pg_temp.tok('@s', 1), '{"id": 1}') AS v$$, '{"v": true}'),
    (3, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'a', 'h1')$$, '{"outcome": "replay", "response": {"id": 1}}'),
    (4, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'a', 'h2')$$, '{"outcome": "mismatch"}'),
    -- a failed outcome is stored and answered
    (5, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'b', 'h1', ttl => '1 day')$$, NULL),
    (6, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'b', pg_temp.tok('@s', 5), '{"error": "declined"}', status => 'FAILED') AS v$$, '{"v": true}'),
    (7, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'b', 'h1')$$, '{"outcome": "failed", "response": {"error": "declined"}}'),
    -- transient failures counted, then poisoned
    (8, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'c', 'h1')$$, '{"attempts": 0}'),
    (9, 'answer', $$SELECT @s.idem_release('parity', 'u', 'c', pg_temp.tok('@s', 8)) AS v$$, '{"v": "released"}'),
    (10, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'c', 'h1')$$, '{"outcome": "created", "attempts": 1}'),
    (11, 'answer', $$SELECT @s.idem_release('parity', 'u', 'c', pg_temp.tok('@s', 10)) AS v$$, '{"v": "released"}'),
    (12, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'c', 'h1')$$, '{"outcome": "created", "attempts": 2}'),
    (13, 'answer', $$SELECT @s.idem_release('parity', 'u', 'c', pg_temp.tok('@s', 12), max_retries => 3) AS v$$, '{"v": "poisoned"}'),
    (14, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'c', 'h1')$$, '{"outcome": "failed", "attempts": 3}'),
    -- stale tokens
    (15, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'c', pg_temp.tok('@s', 8), '{}') AS v$$, '{"v": false}'),
    (16, 'answer', $$SELECT @s.idem_heartbeat('parity', 'u', 'c', pg_temp.tok('@s', 8)) AS v$$, '{"v": false}'),
    (17, 'answer', $$SELECT @s.idem_release('parity', 'u', 'c', pg_temp.tok('@s', 8)) AS v$$, '{"v": "stale"}'),
    -- a heartbeat moves the lease and the expiry; the live attempt answers in_progress
    (18, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'd', 'h1', ttl => '1 hour', lease => '1 hour')$$, NULL),
    (19, 'answer', $$SELECT @s.idem_heartbeat('parity', 'u', 'd', pg_temp.tok('@s', 18), lease => '5 hours') AS v$$, '{"v": true}'),
    (20, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'd', 'h1')$$, '{"outcome": "in_progress"}'),
    -- in one transaction: reserve, the same key again, complete, replay
    (21, 'do', 'BEGIN', NULL),
    (22, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'e', 'h1')$$, '{"outcome": "created"}'),
    (23, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'e', 'h1')$$, '{"outcome": "in_progress"}'),
    (24, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'e', pg_temp.tok('@s', 22), '{"id": 5}') AS v$$, '{"v": true}'),
    (25, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'e', 'h1')$$, '{"outcome": "replay"}'),
    (26, 'do', 'COMMIT', NULL),
    -- a rolled-back reservation leaves nothing
    (27, 'do', 'BEGIN', NULL),
    (28, 'do', $step$DO $d$ BEGIN PERFORM @s.idem_reserve('parity', 'u', 'f', 'h1'); END $d$$step$, NULL),
    (29, 'do', 'ROLLBACK', NULL),
    (30, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'f', 'h1')$$, '{"outcome": "created", "attempts": 0}'),
    -- another session holds a key with one failure counted: busy, with the count
    (31, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'g', 'h1')$$, NULL),
    (32, 'answer', $$SELECT @s.idem_release('parity', 'u', 'g', pg_temp.tok('@s', 31)) AS v$$, '{"v": "released"}'),
    (33, 'do', $step$DO $d$ BEGIN
                    PERFORM dblink_connect('holder', format('host=127.0.0.1 port=%s user=postgres dbname=%s', current_setting('port'), current_database()));
                    PERFORM dblink_exec('holder', 'BEGIN');
                    PERFORM * FROM dblink('holder', $q$SELECT outcome FROM @s.idem_reserve('parity', 'u', 'g', 'h1')$q$) AS t(outcome text);
                 END $d$$step$, NULL),
    (34, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'g', 'h1')$$, '{"outcome": "in_progress", "attempts": 1, "token": null, "expires_at": null}'),
    (35, 'do', $step$DO $d$ BEGIN PERFORM dblink_exec('holder', 'ROLLBACK'); PERFORM dblink_disconnect('holder'); END $d$$step$, NULL),
    -- an expired record is taken over
    (36, 'do', $$UPDATE @s.idem_records SET expires_at = now() - interval '5 hours', lease_expires_at = now() - interval '5 hours' WHERE key = 'a'$$, NULL),
    (37, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'a', 'h2', ttl => '2 days')$$, '{"outcome": "created", "attempts": 0}'),
    -- a takeover that loses its race on every attempt answers busy, with the failures counted
    (38, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'blocked', 'h1')$$, NULL),
    (39, 'answer', $$SELECT @s.idem_release('parity', 'u', 'blocked', pg_temp.tok('@s', 38)) AS v$$, '{"v": "released"}'),
    (40, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'blocked', 'h1')$$, '{"outcome": "created", "attempts": 1}'),
    (41, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'blocked', pg_temp.tok('@s', 40), '{}') AS v$$, '{"v": true}'),
    (42, 'do', $$UPDATE @s.idem_records SET expires_at = now() - interval '5 hours' WHERE key = 'blocked'$$, NULL),
    (43, 'do', $$CREATE TRIGGER parity_refuse BEFORE UPDATE ON @s.idem_records FOR EACH ROW WHEN (OLD.key = 'blocked') EXECUTE FUNCTION public.parity_refuse_update()$$, NULL),
    (44, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'blocked', 'h1')$$, '{"outcome": "in_progress", "attempts": 1, "token": null, "expires_at": null}'),
    (45, 'do', $$DROP TRIGGER parity_refuse ON @s.idem_records$$, NULL),
    -- recovery of a stuck attempt, then sweep
    (46, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'i', 'h1', lease => '1 hour')$$, NULL),
    (47, 'do', $$UPDATE @s.idem_records SET lease_expires_at = now() - interval '1 hour' WHERE key = 'i'$$, NULL),
    (48, 'answer', $$SELECT @s.idem_recover_stuck(action => 'release') AS v$$, '{"v": 1}'),
    (49, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'i', 'h1')$$, '{"outcome": "created", "attempts": 1}'),
    (50, 'do', $$UPDATE @s.idem_records SET expires_at = now() - interval '5 hours' WHERE key IN ('b', 'e')$$, NULL),
    (51, 'answer', $$SELECT @s.idem_sweep() AS v$$, NULL),
    (52, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'e')$$, NULL),
    (53, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'c')$$, NULL),
    -- what is stored, every column
    (54, 'answer', $$SELECT * FROM @s.idem_records ORDER BY key$$, NULL),
    (55, 'answer', $$SELECT * FROM @s.idem_retries ORDER BY key$$, NULL),
    -- a released key's live retry counter is its owner's: another role may not reserve the key
    (56, 'do', 'SET ROLE parity_b', NULL),
    (57, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'owned', 'h1')$$, '{"outcome": "created", "attempts": 0}'),
    (58, 'answer', $$SELECT @s.idem_release('parity', 'u', 'owned', pg_temp.tok('@s', 57)) AS v$$, '{"v": "released"}'),
    (59, 'do', 'SET ROLE parity_a', NULL),
    (60, 'answer', $$SELECT pg_temp.err($q$SELECT @s.idem_reserve('parity', 'u', 'owned', 'h1')$q$) AS v$$,
     '{"v": "42501: permission denied to reserve a key: the key belongs to role parity_b (only that role and its members may act on it)"}'),
    (61, 'do', 'RESET ROLE', NULL),
    (62, 'answer', $$SELECT owner::text, attempts FROM @s.idem_retries WHERE key = 'owned'$$, '{"owner": "parity_b", "attempts": 1}'),
    -- a heartbeat's lease has the record's own ceiling: its expiry or idempotency.ttl past now
    (63, 'do', $$SET idempotency.ttl = '1h'$$, NULL),
    (64, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'long', 'h1', ttl => '48 hours', lease => '2 hours')$$, '{"outcome": "created"}'),
    (65, 'answer', $$SELECT @s.idem_heartbeat('parity', 'u', 'long', pg_temp.tok('@s', 64), lease => '2 hours') AS v$$, '{"v": true}'),
    (66, 'answer', $$SELECT pg_temp.err(format('SELECT %s.idem_heartbeat(%L, %L, %L, %s, lease => %L)', '@s', 'parity', 'u', 'long', pg_temp.tok('@s', 64), '49 hours')) AS v$$, NULL),
    (67, 'answer', $$SELECT @s.idem_heartbeat('parity', 'u', 'long', pg_temp.tok('@s', 64) + 1000, lease => '100 hours') AS v$$, '{"v": false}'),
    (68, 'do', 'RESET idempotency.ttl', NULL),
    (69, 'answer', $$SELECT * FROM @s.idem_records WHERE key IN ('owned', 'long') ORDER BY key$$, NULL),
    -- recovery points (issue 45): idem_checkpoint, its answers and errors
    (70, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h1', lease => '1 hour')$$, '{"outcome": "created", "step": null, "state": null}'),
    (71, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 70), 0, '{"input": 1}') AS v$$, '{"v": true}'),
    (72, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 70), 1, '{"ride": 7}', lease => '2 hours') AS v$$, '{"v": true}'),
    (73, 'answer', $$SELECT pg_temp.err(format('SELECT %s.idem_checkpoint(%L, %L, %L, %s, 1, %L)', '@s', 'parity', 'u', 'steps', pg_temp.tok('@s', 70), '{}')) AS v$$,
     '{"v": "22023: step must exceed the recorded step 1, got 1"}'),
    (74, 'answer', $$SELECT pg_temp.err(format('SELECT %s.idem_checkpoint(%L, %L, %L, %s, -1, %L)', '@s', 'parity', 'u', 'steps', pg_temp.tok('@s', 70), '{}')) AS v$$,
     '{"v": "22023: step must be at least 0, got -1"}'),
    (75, 'answer', $$SELECT left(e, 5) AS code, e AS v FROM pg_temp.err(format('SELECT %s.idem_checkpoint(%L, %L, %L, %s, NULL, %L)', '@s', 'parity', 'u', 'steps', pg_temp.tok('@s', 70), '{}')) AS e$$,
     '{"code": "22004"}'),
    (76, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 70) + 1000, 2, '{}') AS v$$, '{"v": false}'),
    (77, 'do', $$SET idempotency.max_response_bytes = 20$$, NULL),
    (78, 'answer', $$SELECT pg_temp.err(format('SELECT %s.idem_checkpoint(%L, %L, %L, %s, 2, %L)', '@s', 'parity', 'u', 'steps', pg_temp.tok('@s', 70), '{"card": "4242-secret"}')) AS v$$,
     '{"v": "54000: state must be at most 20 bytes (idempotency.max_response_bytes), got 23"}'),
    (79, 'do', 'RESET idempotency.max_response_bytes', NULL),
    -- a release keeps a checkpointed key RESUMABLE (counted); another request is a mismatch; the
    -- same one resumes at the recovery point, the released attempt stale
    (80, 'answer', $$SELECT @s.idem_release('parity', 'u', 'steps', pg_temp.tok('@s', 70)) AS v$$, '{"v": "released"}'),
    (81, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'steps')$$, '{"status": "RESUMABLE", "step": 1}'),
    (82, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h2')$$, '{"outcome": "mismatch", "token": null}'),
    (83, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h1')$$, '{"outcome": "resume", "attempts": 1, "step": 1, "state": {"ride": 7}}'),
    (84, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 70), 2, '{}') AS v$$, '{"v": false}'),
    (85, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h1')$$, '{"outcome": "in_progress", "step": null}'),
    -- a PROCESSING key with a recovery point whose lease ran out resumes, counted
    (86, 'do', $$UPDATE @s.idem_records SET lease_expires_at = now() - interval '1 hour' WHERE key = 'steps'$$, NULL),
    (87, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h1')$$, '{"outcome": "resume", "attempts": 2, "step": 1, "state": {"ride": 7}}'),
    (88, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 83), 2, '{}') AS v$$, '{"v": false}'),
    (89, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'steps', pg_temp.tok('@s', 87), 2, '{"ride": 7, "charge": "ch_1"}') AS v$$, '{"v": true}'),
    -- idem_complete keeps the step, clears the state
    (90, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'steps', pg_temp.tok('@s', 87), '{"ride": 7}') AS v$$, '{"v": true}'),
    (91, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'steps')$$, '{"status": "SUCCESS", "step": 2}'),
    (92, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'steps', 'h1')$$, '{"outcome": "replay", "response": {"ride": 7}, "step": null, "state": null}'),
    -- recovery: a checkpointed key becomes RESUMABLE (counted) whatever the action, another FAILED
    (93, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rec', 'h1', lease => '1 hour')$$, NULL),
    (94, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'rec', pg_temp.tok('@s', 93), 1, '{"ride": 8}') AS v$$, '{"v": true}'),
    (95, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rec-plain', 'h1', lease => '1 hour')$$, NULL),
    (96, 'do', $$UPDATE @s.idem_records SET lease_expires_at = now() - interval '1 hour' WHERE key IN ('rec', 'rec-plain')$$, NULL),
    (97, 'answer', $$SELECT @s.idem_recover_stuck(action => 'fail') AS v$$, '{"v": 2}'),
    (98, 'answer', $$SELECT * FROM @s.idem_records WHERE key IN ('rec', 'rec-plain') ORDER BY key$$, '{"key": "rec", "status": "r", "step": 1}'),
    (99, 'answer', $$SELECT * FROM @s.idem_retries WHERE key IN ('rec', 'rec-plain') ORDER BY key$$, '{"key": "rec", "attempts": 1}'),
    (100, 'answer', $$SELECT @s.idem_recover_stuck() AS v$$, '{"v": 0}'),
    (101, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rec', 'h1')$$, '{"outcome": "resume", "attempts": 1, "step": 1, "state": {"ride": 8}}'),
    -- a release at max_retries poisons it, the state cleared
    (102, 'answer', $$SELECT @s.idem_release('parity', 'u', 'rec', pg_temp.tok('@s', 101), max_retries => 1) AS v$$, '{"v": "poisoned"}'),
    (103, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'rec')$$, '{"status": "FAILED", "state": null}'),
    -- idem_resumable, idem_reserve_many and idem_await
    (104, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'q1', 'h1')$$, NULL),
    (105, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'q1', pg_temp.tok('@s', 104), 3, '{"q": 1}') AS v$$, '{"v": true}'),
    (106, 'answer', $$SELECT @s.idem_release('parity', 'u', 'q1', pg_temp.tok('@s', 104)) AS v$$, '{"v": "released"}'),
    (107, 'answer', $$SELECT * FROM @s.idem_resumable('parity')$$, '{"user_id": "u", "key": "q1", "request_hash": "33112ee14ee469c3eb52fe90322ec81dd404a0093d565a6d71ce77cbc8124e3b", "step": 3, "state": {"q": 1}, "attempts": 1}'), -- request_hash: SHA-256 of h1 in hex (the record keeps 32 bytes)
    (108, 'answer', $$SELECT * FROM @s.idem_reserve_many('parity', 'u', ARRAY['q1', 'q2'], ARRAY['h1', 'h1'])$$, '{"key": "q1", "outcome": "resume", "attempts": 1, "step": 3, "state": {"q": 1}}'),
    (109, 'answer', $$SELECT @s.idem_release('parity', 'u', 'q1', pg_temp.tok('@s', 108)) AS v$$, '{"v": "released"}'),
    (110, 'answer', $$SELECT * FROM @s.idem_await('parity', 'u', 'q1', 'h1', '1 second')$$, '{"outcome": "resume", "attempts": 2, "step": 3, "state": {"q": 1}}'),
    -- a RESUMABLE key past its expiry: created afresh, no step; swept like a FAILED record
    (111, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'q3', 'h1')$$, NULL),
    (112, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'q3', pg_temp.tok('@s', 111), 1, '{}') AS v$$, '{"v": true}'),
    (113, 'answer', $$SELECT @s.idem_release('parity', 'u', 'q3', pg_temp.tok('@s', 111)) AS v$$, '{"v": "released"}'),
    (114, 'do', $$UPDATE @s.idem_records SET expires_at = now() - interval '1 hour', lease_expires_at = now() - interval '1 hour' WHERE key = 'q3'$$, NULL),
    (115, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'q3', 'h1')$$, '{"outcome": "created", "step": null, "state": null}'),
    (116, 'answer', $$SELECT * FROM @s.idem_lookup('parity', 'u', 'q3')$$, '{"status": "PROCESSING", "step": null}'),
    (117, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'q3', pg_temp.tok('@s', 115), 1, '{}') AS v$$, '{"v": true}'),
    (118, 'answer', $$SELECT @s.idem_release('parity', 'u', 'q3', pg_temp.tok('@s', 115)) AS v$$, NULL),
    (119, 'do', $$UPDATE @s.idem_records SET expires_at = now() - interval '1 hour' WHERE key = 'q3'$$, NULL),
    (120, 'answer', $$SELECT @s.idem_sweep() AS v$$, NULL),
    (121, 'answer', $$SELECT count(*) AS v FROM @s.idem_lookup('parity', 'u', 'q3')$$, '{"v": 0}'),
    -- guarantee 8: another role sending the holder's token is refused (42501); once released,
    -- the key is neither resumed nor listed by another role
    (122, 'do', 'SET ROLE parity_a', NULL),
    (123, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'role-cp', 'h1')$$, '{"outcome": "created"}'),
    (124, 'answer', $$SELECT @s.idem_checkpoint('parity', 'u', 'role-cp', pg_temp.tok('@s', 123), 0, '{}') AS v$$, '{"v": true}'),
    (125, 'do', 'SET ROLE parity_b', NULL),
    (126, 'answer', $$SELECT left(e, 5) AS code, e AS v FROM pg_temp.err(format('SELECT %s.idem_checkpoint(%L, %L, %L, %s, 1, %L)', '@s', 'parity', 'u', 'role-cp', pg_temp.tok('@s', 123), '{}')) AS e$$,
     '{"code": "42501"}'),
    (127, 'do', 'SET ROLE parity_a', NULL),
    (128, 'answer', $$SELECT @s.idem_release('parity', 'u', 'role-cp', pg_temp.tok('@s', 123)) AS v$$, '{"v": "released"}'),
    (129, 'answer', $$SELECT key, step FROM @s.idem_resumable('parity')$$, '{"key": "role-cp", "step": 0}'),
    (130, 'do', 'SET ROLE parity_b', NULL),
    (131, 'answer', $$SELECT left(e, 5) AS code, e AS v FROM pg_temp.err($q$SELECT @s.idem_reserve('parity', 'u', 'role-cp', 'h1')$q$) AS e$$,
     '{"code": "42501"}'),
    (132, 'answer', $$SELECT count(*) AS v FROM @s.idem_resumable('parity')$$, '{"v": 0}'),
    (133, 'do', 'RESET ROLE', NULL),
    (134, 'answer', $$SELECT * FROM @s.idem_records WHERE key IN ('steps', 'rec', 'rec-plain', 'q1', 'q2', 'role-cp') ORDER BY key$$, NULL),
    -- idem_replay (issue 43): idem_reserve's final answers, NULL otherwise, 42501 for another role
    (135, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rp', 'h1', ttl => '1 day')$$, '{"outcome": "created"}'),
    (136, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'rp', pg_temp.tok('@s', 135), '{"id": 9}') AS v$$, '{"v": true}'),
    (137, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp', 'h1')$$, '{"outcome": "replay", "response": {"id": 9}, "token": null}'),
    (138, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp', 'h2')$$, '{"outcome": "mismatch", "response": null}'),
    (139, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rp-failed', 'h1')$$, '{"outcome": "created"}'),
    (140, 'answer', $$SELECT @s.idem_complete('parity', 'u', 'rp-failed', pg_temp.tok('@s', 139), '{"error": "declined"}', status => 'FAILED') AS v$$, '{"v": true}'),
    (141, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp-failed', 'h1')$$, '{"outcome": "failed", "response": {"error": "declined"}}'),
    (142, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp-absent', 'h1')$$, '{"outcome": null, "expires_at": null}'),
    (143, 'answer', $$SELECT * FROM @s.idem_reserve('parity', 'u', 'rp-held', 'h1', lease => '1 hour')$$, '{"outcome": "created"}'),
    (144, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp-held', 'h1')$$, '{"outcome": null}'),
    (145, 'answer', $$SELECT * FROM @s.idem_replay('parity', 'u', 'rp-held', 'h2')$$, '{"outcome": "mismatch"}'),
    (147, 'do', 'SET ROLE parity_b', NULL),
    (148, 'answer', $$SELECT left(e, 5) AS code, e AS v FROM pg_temp.err($q$SELECT @s.idem_replay('parity', 'u', 'rp', 'h1')$q$) AS e$$,
     '{"code": "42501"}'),
    (149, 'do', 'RESET ROLE', NULL);

-- Run the scenario against each schema, step by step.
SELECT CASE kind
         WHEN 'answer' THEN format('INSERT INTO answers SELECT %L, %s, statement_timestamp(), (SELECT jsonb_agg(to_jsonb(r)) FROM (%s) AS r)',
                                   s, n, replace(sql, '@s', s))
         ELSE replace(sql, '@s', s) END
  FROM steps, unnest(ARRAY['ext', 'port']) AS s
 ORDER BY s, n \gexec

-- Every column of every row of every answer, tokens and instants as labels.
CREATE TEMP VIEW cells AS
WITH raw AS (
    SELECT a.s, a.n, e.i, kv.key, kv.value, a.clock
      FROM answers AS a
      CROSS JOIN LATERAL jsonb_array_elements(coalesce(a.a, '[]')) WITH ORDINALITY AS e(r, i)
      CROSS JOIN LATERAL jsonb_each(e.r) AS kv(key, value)
), labelled AS (
    SELECT *, CASE WHEN key = 'token' THEN 'token' WHEN key LIKE '%\_at' THEN 'instant' END AS kind FROM raw
), firsts AS (
    SELECT s, kind, value, dense_rank() OVER (PARTITION BY s, kind ORDER BY min(n), min(i), min(key)) AS rank
      FROM labelled WHERE kind IS NOT NULL AND value <> 'null' GROUP BY s, kind, value
)
SELECT l.s, l.n, l.i, l.key,
       CASE WHEN l.kind IS NULL OR l.value = 'null' THEN l.value
            WHEN l.kind = 'token' THEN to_jsonb('token #' || f.rank)
            ELSE to_jsonb(format('instant #%s, %s h from the step', f.rank,
                                 round(extract(epoch FROM (l.value #>> '{}')::timestamptz - l.clock) / 3600)))
       END AS v
  FROM labelled AS l LEFT JOIN firsts AS f USING (s, kind, value);

CREATE TEMP TABLE compared AS
SELECT n, i, key, e.v AS ext, p.v AS port
  FROM (SELECT * FROM cells WHERE s = 'ext') AS e
  FULL JOIN (SELECT * FROM cells WHERE s = 'port') AS p USING (n, i, key);

SELECT format('native and portable state machines: %s answers of %s steps, %s cells, every column of every answer equal',
              (SELECT count(*) FROM answers WHERE s = 'ext'), (SELECT count(*) FROM steps), count(*)),
       count(*) >= 200 AND bool_and(ext IS NOT DISTINCT FROM port)
  FROM compared;
SELECT format('both answered every step (%s and %s answers)',
              count(*) FILTER (WHERE s = 'ext'), count(*) FILTER (WHERE s = 'port')),
       count(*) FILTER (WHERE s = 'ext') = (SELECT count(*) FROM steps WHERE kind = 'answer')
       AND count(*) FILTER (WHERE s = 'port') = count(*) FILTER (WHERE s = 'ext')
  FROM answers;
-- The values the contract fixes (outcome, attempts = transient failures recorded so far, ...).
SELECT format('%s step %s answers what the contract says: %s', a.s, t.n, t.expect),
       coalesce(a.a -> 0 @> t.expect, false)
  FROM steps AS t JOIN answers AS a USING (n)
 WHERE t.expect IS NOT NULL
 ORDER BY a.s, t.n;

-- On failure, the differences.
SELECT format('differs: step %s row %s column %s: ext=%s port=%s', n, i, key, ext, port), false
  FROM compared WHERE ext IS DISTINCT FROM port ORDER BY n, i, key LIMIT 20;

DROP FUNCTION public.parity_refuse_update();
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ext, port FROM parity_a, parity_b;
REVOKE ALL ON SCHEMA ext, port FROM parity_a, parity_b;
REVOKE ALL ON answers FROM parity_a, parity_b;
DROP ROLE parity_a;
DROP ROLE parity_b;
