-- Run after the update (ALTER EXTENSION idempotency UPDATE, or the portable upgrade script) on the
-- database tests/upgrade/before.sql filled.
-- Each row is one test: `label|t` passes.
-- (owner came with 0.6.0 and the recovery point's step and state with 0.7.0: compared below.)
-- Each record as idem_lookup answers it: from 0.7.0 on (the compact layout, docs/record-layout.md)
-- a request hash that is not 64 lowercase hex digits is kept as its SHA-256, answered in hex.
CREATE TEMP VIEW installed AS
SELECT string_to_array(coalesce((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
                                (SELECT substring(prosrc, '''([0-9][^'']*)''') FROM pg_proc
                                  WHERE proname = '_idem_portable_version' LIMIT 1)), '.')::int[] AS version;
-- 0.7.0's update moves no record (docs/record-layout.md, "The update from 0.6.0"): they stay in
-- idem_records_060, each key's moved when a call reaches it, the rest by idem_move_records.
CREATE FUNCTION pg_temp.kept(k text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('idem_records_060') IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT FROM idem_records_060 WHERE operation = 'up' AND user_id = 'u' AND key = k);
END $$;
-- The rows still in the old table, as the calling statement's snapshot sees them (STABLE).
CREATE FUNCTION pg_temp.kept_count() RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF to_regclass('idem_records_060') IS NULL THEN
        RETURN 0;
    END IF;
    RETURN (SELECT count(*) FROM idem_records_060);
END $$;
SELECT 'the update moved no record: all in idem_records_060, idem_records empty (0.7.0 on)',
       version < '{0,7,0}'
       OR (pg_temp.kept_count() = (SELECT count(*) FROM upgrade_test.records) AND NOT EXISTS (SELECT FROM idem_records))
  FROM installed;
SELECT 'the in-flight reservation''s record is still in idem_records_060 (0.7.0 on)',
       version < '{0,7,0}' OR pg_temp.kept('kept')
  FROM installed;
SELECT 'its token completes it (moved by the call)',
       idem_complete('up', 'u', 'kept', token, '{"id": 5}')
  FROM upgrade_test.tokens WHERE key = 'kept';
SELECT 'and the key then replays that response',
       outcome = 'replay' AND response = '{"id": 5}' AND NOT pg_temp.kept('kept')
  FROM idem_reserve('up', 'u', 'kept', 'h');
SELECT 'the records answered below are still in idem_records_060 (0.7.0 on)',
       version < '{0,7,0}' OR bool_and(pg_temp.kept(key))
  FROM upgrade_test.answers, installed GROUP BY version;
SELECT 'every record answers as before (outcome, response, attempts, expiry)',
       count(*) = 0
  FROM (SELECT * FROM upgrade_test.answers
        EXCEPT
        SELECT q.key, q.hash, r.outcome, r.token, r.response, r.attempts, r.expires_at
          FROM upgrade_test.answers AS q, LATERAL idem_reserve('up', 'u', q.key, q.hash) AS r) AS d;
SELECT 'the update changed no record and no retry counter',
       (SELECT count(*)
          FROM (SELECT o.operation, o.user_id, o.key, o.status, o.token, o.response, o.lease_expires_at,
                       o.expires_at, o.created_at, o.updated_at,
                       CASE WHEN (SELECT version FROM installed) >= '{0,7,0}' AND o.request_hash !~ '^[0-9a-f]{64}$'
                            THEN encode(sha256(convert_to(o.request_hash, getdatabaseencoding())), 'hex')
                            ELSE o.request_hash END
                  FROM upgrade_test.records AS o
                 WHERE o.key NOT LIKE 'kept%' AND o.key <> 'moving'
                EXCEPT
                SELECT l.operation, l.user_id, l.key, l.status, l.token, l.response, l.lease_expires_at,
                       l.expires_at, l.created_at, l.updated_at, l.request_hash
                  FROM upgrade_test.records AS o, LATERAL idem_lookup(o.operation, o.user_id, o.key) AS l
                 WHERE o.key NOT LIKE 'kept%' AND o.key <> 'moving') AS d) = 0
       AND (SELECT count(*) FROM idem_records) + pg_temp.kept_count() = (SELECT count(*) FROM upgrade_test.records)
       AND (SELECT count(*) FROM (SELECT to_jsonb(o) - 'owner' FROM upgrade_test.retries AS o
                              EXCEPT
                              SELECT to_jsonb(t) - 'owner' FROM idem_retries AS t) AS d) = 0
       AND (SELECT count(*) FROM idem_retries) = (SELECT count(*) FROM upgrade_test.retries);
SELECT 'the answers before the update were replay, failed, in_progress and mismatch',
       array_agg(DISTINCT outcome ORDER BY outcome) = '{failed,in_progress,mismatch,replay}'
  FROM upgrade_test.answers;
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
-- 0.7.0: a retry counter belongs to the owner of the record that started it; the ones kept
-- from before the update have none (any role's, as before, until they expire), and counting on
-- them again gives them none.
SELECT 'the retry counters kept from before the update have no owner, counted again or not (0.7.0 on)',
       string_to_array(v.version, '.')::int[] < '{0,7,0}'
       OR ((SELECT count(*) FROM idem_retries AS t JOIN upgrade_test.retries AS o USING (operation, user_id, key)
             WHERE (to_jsonb(t) ->> 'owner') IS NULL) = (SELECT count(*) FROM upgrade_test.retries)
           AND (SELECT attempts FROM idem_retries WHERE key = 'released') = 3)
  FROM (SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
                        (SELECT substring(prosrc, '''([0-9][^'']*)''') FROM pg_proc
                          WHERE proname = '_idem_portable_version' LIMIT 1)) AS version) AS v;
SELECT 'another in-flight reservation, still in idem_records_060, heartbeats and is released with its token (0.7.0 on)',
       version < '{0,7,0}'
       OR (pg_temp.kept('kept_released')
           AND (SELECT idem_heartbeat('up', 'u', 'kept_released', token) FROM upgrade_test.tokens WHERE key = 'kept_released')
           AND (SELECT idem_release('up', 'u', 'kept_released', token) = 'released' FROM upgrade_test.tokens WHERE key = 'kept_released')
           AND NOT EXISTS (SELECT FROM idem_records WHERE key = 'kept_released') AND NOT pg_temp.kept('kept_released'))
  FROM installed;
-- (A function, so that versions without idem_checkpoint never parse a call of it.)
CREATE FUNCTION pg_temp.kept_many_and_step() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_many bigint := (SELECT token FROM upgrade_test.tokens WHERE key = 'kept_many');
    v_step bigint := (SELECT token FROM upgrade_test.tokens WHERE key = 'kept_step');
BEGIN
    RETURN pg_temp.kept('kept_many') AND pg_temp.kept('kept_step')
           AND (SELECT bool_and(c.completed) FROM idem_complete_many('up', 'u', '{kept_many}', ARRAY[v_many], ARRAY['{"id": 8}'::jsonb]) AS c)
           AND idem_checkpoint('up', 'u', 'kept_step', v_step, 0, '{"s": 1}')
           AND (SELECT step = 0 AND state = '{"s": 1}' FROM idem_lookup('up', 'u', 'kept_step'))
           AND idem_complete('up', 'u', 'kept_step', v_step, '{"id": 9}')
           AND NOT pg_temp.kept('kept_many') AND NOT pg_temp.kept('kept_step')
           AND (SELECT outcome = 'replay' AND response = '{"id": 8}' FROM idem_reserve('up', 'u', 'kept_many', 'h'));
END $$;
SELECT 'two more in-flight reservations still in idem_records_060: one completes by idem_complete_many, one records a recovery point and completes (0.7.0 on)',
       CASE WHEN version < '{0,7,0}' THEN true ELSE pg_temp.kept_many_and_step() END
  FROM installed;
SELECT 'a stuck and an expired record are still in idem_records_060 (0.7.0 on)',
       version < '{0,7,0}' OR (pg_temp.kept('kept_stuck') AND pg_temp.kept('kept_expired'))
  FROM installed;
SELECT 'recovery takes the two old stuck rows (and only them)', idem_recover_stuck() = 2;
SELECT 'the stuck rows are now FAILED', count(*) = 2 AND bool_and(status::text IN ('FAILED', 'f'))
  FROM idem_records WHERE key IN ('stuck', 'kept_stuck');
SELECT 'sweep deletes the two old expired rows (and only them)', idem_sweep() = 2;
SELECT 'the expired rows are gone, in both tables', NOT EXISTS (SELECT FROM idem_records WHERE key IN ('expired', 'kept_expired'))
       AND NOT pg_temp.kept('kept_expired');
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
-- 0.6.0: records belong to the role that reserved them; the ones written before 0.6.0 have no
-- owner (any role with the API may act on them, as before, until they expire), the ones
-- written by 0.6.0 keep theirs.
SELECT 'the records written before the update keep their owner, none before 0.6.0 (0.6.0 on)',
       string_to_array(v.version, '.')::int[] < '{0,6,0}'
       OR NOT EXISTS (SELECT FROM idem_records AS r JOIN upgrade_test.records AS o USING (operation, user_id, key)
                       WHERE (to_jsonb(r) ->> 'owner') IS DISTINCT FROM (to_jsonb(o) ->> 'owner')
                         AND r.token = o.token)
  FROM (SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
                        (SELECT substring(prosrc, '''([0-9][^'']*)''') FROM pg_proc
                          WHERE proname = '_idem_portable_version' LIMIT 1)) AS version) AS v;
SELECT 'the update kept the EXECUTE PUBLIC had on the write API (no running application breaks)',
       count(*) > 0 AND bool_and(g.public_execute = has_function_privilege('public', p.oid, 'EXECUTE'))
  FROM upgrade_test.public_grants AS g
  JOIN pg_proc AS p ON p.proname = g.proname AND p.pronamespace = 'public'::regnamespace;
-- 0.7.0: recovery points (issue 45, docs/recovery-points.md). The records written before the
-- update have none; the reservation type gains step and state, appended (a 0.6 client selects
-- the first five by name); a key reserved after the update checkpoints, is released RESUMABLE
-- and resumes at its recovery point. (A function, so that versions without idem_checkpoint
-- never parse a call of it.)
CREATE FUNCTION pg_temp.recovery_point_resumes() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_token  bigint := (idem_reserve('up', 'u', 'steps', 'h')).token;
    v_answer record;
BEGIN
    IF NOT idem_checkpoint('up', 'u', 'steps', v_token, 0, '{"input": 1}') THEN
        RETURN false;
    END IF;
    IF idem_release('up', 'u', 'steps', v_token) <> 'released' THEN
        RETURN false;
    END IF;
    IF (SELECT status FROM idem_records WHERE operation = 'up' AND key = 'steps') <> 'r' THEN
        RETURN false;
    END IF;
    SELECT * INTO v_answer FROM idem_reserve('up', 'u', 'steps', 'h');
    RETURN v_answer.outcome = 'resume' AND v_answer.step = 0 AND v_answer.state = '{"input": 1}'
           AND v_answer.attempts = 1
           AND idem_checkpoint('up', 'u', 'steps', v_answer.token, 1, '{"done": 1}')
           AND idem_complete('up', 'u', 'steps', v_answer.token, '{"id": 4}');
END $$;
SELECT 'the records written before the update have no recovery point (0.7.0 on; but the one given one above)',
       version < '{0,7,0}'
       OR NOT EXISTS (SELECT FROM idem_records AS r JOIN upgrade_test.records AS o USING (operation, user_id, key)
                       WHERE (to_jsonb(r) ->> 'step' IS NOT NULL OR to_jsonb(r) ->> 'state' IS NOT NULL)
                         AND o.key <> 'kept_step')
  FROM installed;
SELECT 'idem_reservation has the attributes of 0.6.0 then step and state, appended (0.7.0 on)',
       version < '{0,7,0}'
       OR (SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
             FROM pg_attribute AS a
            WHERE a.attrelid = (SELECT t.typrelid FROM pg_type AS t
                                 WHERE t.typname = 'idem_reservation' AND t.typnamespace = 'public'::regnamespace)
              AND a.attnum > 0 AND NOT a.attisdropped)
          = '{"outcome text","token bigint","response jsonb","attempts integer","expires_at timestamp with time zone","step integer","state jsonb"}'
  FROM installed;
SELECT 'a key reserved after the update checkpoints, is released RESUMABLE, resumes at its recovery point and completes (0.7.0 on)',
       CASE WHEN version < '{0,7,0}' THEN true ELSE pg_temp.recovery_point_resumes() END
  FROM installed;
SELECT 'and replays its response (0.7.0 on)',
       version < '{0,7,0}' OR (SELECT outcome = 'replay' AND response = '{"id": 4}' FROM idem_reserve('up', 'u', 'steps', 'h'))
  FROM installed;
-- From 0.6.0, a fresh install grants the write API to idempotency_user alone. The tightening
-- docs/upgrading.md gives for an updated install, applied where the update granted the write
-- API to idempotency_user, so that the schema comparison that follows holds.
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_proc AS p, aclexplode(p.proacl) AS a
                WHERE p.oid = 'idem_reserve(text,text,text,text,interval,interval,boolean)'::regprocedure
                  AND a.grantee = (SELECT r.oid FROM pg_roles AS r WHERE r.rolname = 'idempotency_user')) THEN
        REVOKE EXECUTE ON FUNCTION
            idem_reserve(text, text, text, text, interval, interval, boolean),
            idem_complete(text, text, text, bigint, jsonb, text),
            idem_release(text, text, text, bigint, integer),
            idem_heartbeat(text, text, text, bigint, interval),
            idem_reserve_many(text, text, text[], text[], interval, interval, boolean),
            idem_complete_many(text, text, text[], bigint[], jsonb[], text)
            FROM PUBLIC;
    END IF;
END
$$;
SELECT 'after the documented REVOKE (0.6.0 on), PUBLIC may not reserve; idempotency_user may',
       string_to_array(v.version, '.')::int[] < '{0,6,0}'
       OR (NOT has_function_privilege('public', 'idem_reserve(text,text,text,text,interval,interval,boolean)', 'EXECUTE')
           AND has_function_privilege('idempotency_user', 'idem_reserve(text,text,text,text,interval,interval,boolean)', 'EXECUTE'))
  FROM (SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'idempotency'),
                        (SELECT substring(prosrc, '''([0-9][^'']*)''') FROM pg_proc
                          WHERE proname = '_idem_portable_version' LIMIT 1)) AS version) AS v;
-- 0.7.0: the move in batches (idem_move_records) while reservations of a moving key run. A
-- second session (dblink) moves every row left and holds its transaction open; a reservation
-- that must not wait answers in_progress (never created: the record it cannot see yet is
-- moving), one that waits blocks on the moved row until the mover commits, then reads the record
-- the mover committed after its statement began: replay (docs/record-layout.md).
CREATE EXTENSION IF NOT EXISTS dblink SCHEMA upgrade_test;
CREATE FUNCTION pg_temp.reserve_while_moving() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_conn     text := format('host=127.0.0.1 port=%s user=postgres dbname=%s', current_setting('port'), current_database());
    v_pid      integer;
    v_moved    bigint;
    v_nowait   text;
    v_blocked  boolean := false;
    v_deadline timestamptz := clock_timestamp() + interval '30 seconds';
    v_waited   record;
BEGIN
    PERFORM upgrade_test.dblink_connect('mover', v_conn);
    PERFORM upgrade_test.dblink_connect('waiter', v_conn);
    PERFORM upgrade_test.dblink_exec('mover', 'BEGIN');
    SELECT n INTO v_moved FROM upgrade_test.dblink('mover', 'SELECT idem_move_records(100000)') AS t(n bigint);
    -- (In a session of its own: the PL/pgSQL idem_reserve keeps the key's lock to the end of
    -- its transaction, and this function's transaction lasts until the waiter has answered.)
    SELECT outcome INTO v_nowait
      FROM upgrade_test.dblink('waiter', $q$SELECT outcome FROM idem_reserve('up', 'u', 'moving', 'h')$q$) AS t(outcome text);
    SELECT p INTO v_pid FROM upgrade_test.dblink('waiter', 'SELECT pg_backend_pid()') AS t(p integer);
    PERFORM upgrade_test.dblink_send_query('waiter', $q$SELECT outcome, response FROM idem_reserve('up', 'u', 'moving', 'h', wait => true)$q$);
    LOOP
        v_blocked := cardinality(pg_blocking_pids(v_pid)) > 0;
        EXIT WHEN v_blocked OR clock_timestamp() > v_deadline;
        PERFORM pg_sleep(0.01);
    END LOOP;
    PERFORM upgrade_test.dblink_exec('mover', 'COMMIT');
    SELECT * INTO v_waited FROM upgrade_test.dblink_get_result('waiter') AS t(outcome text, response jsonb);
    PERFORM upgrade_test.dblink_disconnect('mover');
    PERFORM upgrade_test.dblink_disconnect('waiter');
    RETURN format('moved>0 %s, without waiting %s, blocked %s, then %s %s', v_moved > 0, v_nowait, v_blocked,
                  v_waited.outcome, v_waited.response);
END $$;
SELECT 'a batch moving the key: a reservation answers in_progress, one that waits blocks and then replays (0.7.0 on)',
       CASE WHEN version < '{0,7,0}' THEN 't'
            ELSE (SELECT CASE WHEN r = 'moved>0 t, without waiting in_progress, blocked t, then replay {"id": 6}'
                              THEN 't' ELSE r END
                    FROM pg_temp.reserve_while_moving() AS r) END
  FROM installed;
-- (A function, so that versions without idem_move_records never parse a call of it.)
CREATE FUNCTION pg_temp.move_records() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN idem_move_records();
END $$;
SELECT 'the next idem_move_records finds idem_records_060 empty: it drops it and answers 0 (0.7.0 on)',
       CASE WHEN version < '{0,7,0}' THEN true ELSE pg_temp.move_records() = 0 END
  FROM installed;
SELECT 'idem_records_060 is gone, and idem_move_records answers 0 without it (0.7.0 on)',
       CASE WHEN version < '{0,7,0}' THEN true
            ELSE to_regclass('idem_records_060') IS NULL AND pg_temp.move_records() = 0 END
  FROM installed;
SELECT 'every record kept from before the update is in idem_records (the swept expired ones and the released one aside)',
       NOT EXISTS (SELECT FROM upgrade_test.records AS o
                    WHERE o.key NOT IN ('expired', 'kept_expired', 'kept_released')
                      AND NOT EXISTS (SELECT FROM idem_records AS r
                                       WHERE r.operation = o.operation AND r.user_id = o.user_id AND r.key = o.key));
SELECT 'and a record moved by a batch replays after the move',
       outcome = 'replay' AND response = '{"id": 6}'
  FROM idem_reserve('up', 'u', 'moving', 'h');
