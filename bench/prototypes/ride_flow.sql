-- Issue 45, stage A: Brandur's ride flow over the recovery-point prototype
-- (bench/prototypes/recovery_points.sql), crashed at every step boundary in turn, then retried.
-- Run on a scratch database (docs/recovery-points.md, "The prototype"):
--   psql -X -v ON_ERROR_STOP=1 -d scratch -f bench/prototypes/recovery_points.sql -f bench/prototypes/ride_flow.sql
-- Every check prints one row ending in ok = t; the last query counts the failures (0 expected).

\set QUIET on
SET client_min_messages = warning;

-- The business table and the two outside services' stubs. A stub's effect commits on its own
-- (the procedure commits right after the call): it is outside, nothing the caller rolls back
-- undoes it. Each stub keeps one row per idempotency key (the effective call) and counts every
-- call made with that key.
CREATE TABLE proto.rides (id bigserial PRIMARY KEY, idem_key text NOT NULL, origin text, amount integer,
                          done boolean NOT NULL DEFAULT false);
CREATE TABLE proto.stub (service text, idem_key text, calls integer NOT NULL, result text NOT NULL,
                         PRIMARY KEY (service, idem_key));
CREATE FUNCTION proto.call_stub(p_service text, p_idem_key text) RETURNS text LANGUAGE sql AS $$
    INSERT INTO proto.stub AS s VALUES (p_service, p_idem_key, 1,
                                        left(p_service, 2) || '_' || left(md5(p_idem_key), 10))
    ON CONFLICT (service, idem_key) DO UPDATE SET calls = s.calls + 1
    RETURNING s.result $$;
CREATE TABLE proto.checks (scenario text, check_name text, ok boolean, detail text);

-- The ride flow as run_steps would drive it: one transaction per local step (its writes and its
-- checkpoint), an outside step as the call (derived key) then its checkpoint, the completion
-- with the last local write. p_crash names the boundary where the process dies: '' for none.
-- A crash inside a transaction rolls it back (the connection is gone); after a commit it just
-- stops. Answers nothing: the record and the tables are what the checks read.
CREATE PROCEDURE proto.ride_run(p_key text, p_request jsonb, p_crash text DEFAULT '')
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_op    text := 'rides.create';
    v_user  text := 'u1';
    v_hash  text := md5(p_request::text);
    v_res   proto.reservation;
    v_state jsonb;
    v_step  integer;
    v_ride  bigint;
    v_ok    boolean;
    v_id    text;
BEGIN
    -- Transaction 1: reserve, and recovery point 0 holding the request (a completer resumes
    -- from the record alone).
    v_res := proto.reserve(v_op, v_user, p_key, v_hash);
    IF v_res.outcome = 'created' THEN
        v_ok := proto.checkpoint(v_op, v_user, p_key, v_res.token, 0, jsonb_build_object('request', p_request));
        v_step := 0;
        v_state := jsonb_build_object('request', p_request);
    ELSIF v_res.outcome = 'resume' THEN
        v_step := v_res.step;
        v_state := v_res.state;
    ELSE
        RAISE NOTICE 'ride_run %: %', p_key, v_res.outcome;
        COMMIT;
        RETURN;
    END IF;
    IF p_crash = 'in reserve' THEN ROLLBACK; RETURN; END IF;
    COMMIT;
    IF p_crash = 'after reserve' THEN RETURN; END IF;

    -- Step 1 (local): create the ride.
    IF v_step < 1 THEN
        INSERT INTO proto.rides (idem_key, origin, amount)
        VALUES (p_key, v_state->'request'->>'origin', (v_state->'request'->>'amount')::integer)
        RETURNING id INTO v_ride;
        v_state := v_state || jsonb_build_object('ride_id', v_ride);
        IF NOT proto.checkpoint(v_op, v_user, p_key, v_res.token, 1, v_state) THEN
            ROLLBACK; RETURN;  -- stale: someone took over; our writes go
        END IF;
        IF p_crash = 'in create ride' THEN ROLLBACK; RETURN; END IF;
        COMMIT;
        IF p_crash = 'after create ride' THEN RETURN; END IF;
    END IF;

    -- Step 2 (outside): charge, with the derived key.
    IF v_step < 2 THEN
        v_id := proto.call_stub('charge', proto.derive(v_op, v_user, p_key, 'charge'));
        COMMIT;  -- the outside service did it
        IF p_crash = 'after charge call' THEN RETURN; END IF;
        v_state := v_state || jsonb_build_object('charge_id', v_id);
        IF NOT proto.checkpoint(v_op, v_user, p_key, v_res.token, 2, v_state) THEN
            ROLLBACK; RETURN;
        END IF;
        COMMIT;
        IF p_crash = 'after charge checkpoint' THEN RETURN; END IF;
    END IF;

    -- Step 3 (outside): the receipt, with its own derived key.
    IF v_step < 3 THEN
        v_id := proto.call_stub('receipt', proto.derive(v_op, v_user, p_key, 'receipt'));
        COMMIT;
        IF p_crash = 'after receipt call' THEN RETURN; END IF;
        v_state := v_state || jsonb_build_object('receipt_id', v_id);
        IF NOT proto.checkpoint(v_op, v_user, p_key, v_res.token, 3, v_state) THEN
            ROLLBACK; RETURN;
        END IF;
        COMMIT;
        IF p_crash = 'after receipt checkpoint' THEN RETURN; END IF;
    END IF;

    -- Completion (local): mark the ride done and store the answer, one transaction.
    UPDATE proto.rides SET done = true WHERE id = (v_state->>'ride_id')::bigint;
    IF NOT proto.complete(v_op, v_user, p_key, v_res.token,
                          jsonb_build_object('status', 201, 'ride_id', (v_state->>'ride_id')::bigint,
                                             'charge', v_state->>'charge_id',
                                             'receipt', v_state->>'receipt_id')) THEN
        ROLLBACK; RETURN;
    END IF;
    IF p_crash = 'in complete' THEN ROLLBACK; RETURN; END IF;
    COMMIT;
END
$fn$;

-- The checks of one key once it is finished: one ride, one effective call per stub and derived
-- key, SUCCESS, and the answer a run without a crash gives (built from the ride row and the
-- stubs' stored results), replayed as such.
CREATE PROCEDURE proto.check_key(p_scenario text, p_key text)
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_rec      proto.records;
    v_expected jsonb;
    v_replay   proto.reservation;
BEGIN
    SELECT * INTO v_rec FROM proto.records WHERE key = p_key;
    INSERT INTO proto.checks
    SELECT p_scenario, 'one ride, done', count(*) = 1 AND bool_and(done), count(*)::text
      FROM proto.rides WHERE idem_key = p_key;
    INSERT INTO proto.checks
    SELECT p_scenario, 'one effective ' || svc, count(s.*) = 1,
           'rows ' || count(s.*) || ', calls ' || coalesce(sum(s.calls), 0)
      FROM unnest(ARRAY['charge', 'receipt']) AS svc
      LEFT JOIN proto.stub s ON s.service = svc AND s.idem_key = proto.derive('rides.create', 'u1', p_key, svc)
     GROUP BY svc;
    SELECT jsonb_build_object('status', 201, 'ride_id', r.id,
                              'charge', (SELECT result FROM proto.stub WHERE service = 'charge'
                                            AND idem_key = proto.derive('rides.create', 'u1', p_key, 'charge')),
                              'receipt', (SELECT result FROM proto.stub WHERE service = 'receipt'
                                            AND idem_key = proto.derive('rides.create', 'u1', p_key, 'receipt')))
      INTO v_expected FROM proto.rides r WHERE r.idem_key = p_key;
    INSERT INTO proto.checks VALUES
        (p_scenario, 'SUCCESS, state cleared, step 3', v_rec.status = 'SUCCESS' AND v_rec.state IS NULL AND v_rec.step = 3,
         v_rec.status || ' step ' || v_rec.step),
        (p_scenario, 'the uncrashed answer', v_rec.response = v_expected, v_rec.response::text);
    v_replay := proto.reserve('rides.create', 'u1', p_key, md5('{"amount": 1500, "origin": "A"}'::jsonb::text));
    INSERT INTO proto.checks VALUES
        (p_scenario, 'a retry replays it', v_replay.outcome = 'replay' AND v_replay.response = v_expected,
         v_replay.outcome);
    COMMIT;
END
$fn$;

-- The dead worker's lease runs out (time passes): forced, not waited for.
CREATE PROCEDURE proto.expire(p_key text) LANGUAGE sql AS $$
    UPDATE proto.records SET lease_expires_at = clock_timestamp() - interval '1 s' WHERE key = p_key $$;

\set request '''{"amount": 1500, "origin": "A"}'''

-- The baseline: no crash.
CALL proto.ride_run('base', :request);
CALL proto.check_key('no crash', 'base');

-- Every boundary, three ways to continue after the crash:
--   retry:     the lease runs out, the client retries: idem_reserve takes the PROCESSING key over
--              (resume, counted);
--   recovered: the lease runs out, idem_recover_stuck('fail') releases it (RESUMABLE, counted),
--              the client retries (resume);
--   completer: as recovered, then a completer walks idem_resumable and runs each key from its
--              record's state alone.
CREATE PROCEDURE proto.scenario(p_boundary text, p_way text)
    LANGUAGE plpgsql AS $fn$
DECLARE
    v_key  text := p_way || ':' || p_boundary;
    v_name text := p_way || ' / ' || p_boundary;
    v_rec  proto.records;
    v_rows integer;
    v_r    record;
BEGIN
    CALL proto.ride_run(v_key, '{"amount": 1500, "origin": "A"}', p_boundary);  -- dies there
    CALL proto.expire(v_key);
    COMMIT;
    IF p_way IN ('recovered', 'completer') THEN
        SELECT count(*) INTO v_rows FROM proto.recover_stuck(100, 'fail');
        SELECT * INTO v_rec FROM proto.records WHERE key = v_key;
        INSERT INTO proto.checks VALUES (v_name, 'recovery: RESUMABLE if a checkpoint committed',
            coalesce(v_rec.status, 'absent') = CASE WHEN p_boundary = 'in reserve' THEN 'absent'
                                                    ELSE 'RESUMABLE' END,
            coalesce(v_rec.status, 'absent'));
        COMMIT;
    END IF;
    IF p_way = 'completer' THEN
        FOR v_r IN SELECT * FROM proto.resumable('rides.create') WHERE key = v_key LOOP
            -- the request comes from the record's state, not from a client
            CALL proto.ride_run(v_r.key, v_r.state->'request');
        END LOOP;
        IF p_boundary = 'in reserve' THEN  -- nothing committed: the client's retry starts it
            CALL proto.ride_run(v_key, '{"amount": 1500, "origin": "A"}');
        END IF;
    ELSE
        CALL proto.ride_run(v_key, '{"amount": 1500, "origin": "A"}');
    END IF;
    CALL proto.check_key(v_name, v_key);
END
$fn$;

CALL proto.scenario('in reserve', 'retry');
CALL proto.scenario('after reserve', 'retry');
CALL proto.scenario('in create ride', 'retry');
CALL proto.scenario('after create ride', 'retry');
CALL proto.scenario('after charge call', 'retry');
CALL proto.scenario('after charge checkpoint', 'retry');
CALL proto.scenario('after receipt call', 'retry');
CALL proto.scenario('after receipt checkpoint', 'retry');
CALL proto.scenario('in complete', 'retry');
CALL proto.scenario('in reserve', 'recovered');
CALL proto.scenario('after reserve', 'recovered');
CALL proto.scenario('in create ride', 'recovered');
CALL proto.scenario('after create ride', 'recovered');
CALL proto.scenario('after charge call', 'recovered');
CALL proto.scenario('after charge checkpoint', 'recovered');
CALL proto.scenario('after receipt call', 'recovered');
CALL proto.scenario('after receipt checkpoint', 'recovered');
CALL proto.scenario('in complete', 'recovered');
CALL proto.scenario('in reserve', 'completer');
CALL proto.scenario('after reserve', 'completer');
CALL proto.scenario('in create ride', 'completer');
CALL proto.scenario('after create ride', 'completer');
CALL proto.scenario('after charge call', 'completer');
CALL proto.scenario('after charge checkpoint', 'completer');
CALL proto.scenario('after receipt call', 'completer');
CALL proto.scenario('after receipt checkpoint', 'completer');
CALL proto.scenario('in complete', 'completer');

-- The rules around the flow.
CREATE PROCEDURE proto.rules() LANGUAGE plpgsql AS $fn$
DECLARE
    v_a    proto.reservation;
    v_b    proto.reservation;
    v_ok   boolean;
    v_err  text;
    v_n    integer := 0;
    v_rec  proto.records;
BEGIN
    -- A slow holder past its lease, taken over: its checkpoint and its completion are stale.
    v_a := proto.reserve('rides.create', 'u1', 'slow', 'h');
    PERFORM proto.checkpoint('rides.create', 'u1', 'slow', v_a.token, 0, '{}');
    COMMIT;
    CALL proto.expire('slow');
    COMMIT;
    v_b := proto.reserve('rides.create', 'u1', 'slow', 'h');
    COMMIT;
    v_ok := proto.checkpoint('rides.create', 'u1', 'slow', v_a.token, 1, '{}');
    INSERT INTO proto.checks VALUES ('rules', 'takeover answers resume at the step', v_b.outcome = 'resume' AND v_b.step = 0, v_b.outcome || ' ' || v_b.step),
        ('rules', 'the old holder''s checkpoint is stale (false)', v_ok = false, v_ok::text),
        ('rules', 'the old holder''s completion is stale (false)',
         NOT proto.complete('rides.create', 'u1', 'slow', v_a.token, '{}'), 'token ' || v_a.token || ' against ' || v_b.token);
    -- A step that does not advance, a state too large, a NULL step.
    BEGIN
        PERFORM proto.checkpoint('rides.create', 'u1', 'slow', v_b.token, 0, '{}');
        v_err := 'none';
    EXCEPTION WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM; END;
    INSERT INTO proto.checks VALUES ('rules', 'a step not past the recorded one: 22023', v_err LIKE '22023%', v_err);
    BEGIN
        PERFORM proto.checkpoint('rides.create', 'u1', 'slow', v_b.token, 1, jsonb_build_object('x', repeat('y', 70000)));
        v_err := 'none';
    EXCEPTION WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM; END;
    INSERT INTO proto.checks VALUES ('rules', 'a state past max_response_bytes: 54000', v_err LIKE '54000%', v_err);
    BEGIN
        PERFORM proto.checkpoint('rides.create', 'u1', 'slow', v_b.token, NULL, '{}');
        v_err := 'none';
    EXCEPTION WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM; END;
    INSERT INTO proto.checks VALUES ('rules', 'a NULL step: 22004', v_err LIKE '22004%', v_err);
    -- Another role holding the token: 42501 (guarantee 8), on checkpoint and on resume.
    BEGIN
        SET LOCAL ROLE proto_other;
        PERFORM proto.checkpoint('rides.create', 'u1', 'slow', v_b.token, 1, '{}');
        v_err := 'none';
    EXCEPTION WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM; END;
    RESET ROLE;
    INSERT INTO proto.checks VALUES ('rules', 'another role''s checkpoint: 42501', v_err LIKE '42501%', v_err);
    COMMIT;
    CALL proto.expire('slow');
    COMMIT;
    BEGIN
        SET LOCAL ROLE proto_other;
        PERFORM proto.reserve('rides.create', 'u1', 'slow', 'h');
        v_err := 'none';
    EXCEPTION WHEN OTHERS THEN v_err := SQLSTATE || ' ' || SQLERRM; END;
    RESET ROLE;
    INSERT INTO proto.checks VALUES ('rules', 'another role''s resume: 42501', v_err LIKE '42501%', v_err);
    -- Another request under the key: mismatch, the key kept.
    v_a := proto.reserve('rides.create', 'u1', 'slow', 'other hash');
    SELECT * INTO v_rec FROM proto.records WHERE key = 'slow';
    INSERT INTO proto.checks VALUES ('rules', 'another request resuming: mismatch, record kept',
        v_a.outcome = 'mismatch' AND v_rec.step = 0 AND v_rec.status = 'PROCESSING', v_a.outcome);
    COMMIT;
    -- Crashing again and again: counted toward max_retries (5), then FAILED.
    FOR v_i IN 1..6 LOOP
        v_n := v_i;
        CALL proto.expire('slow');
        COMMIT;
        IF v_i % 2 = 0 THEN
            PERFORM proto.recover_stuck(100, 'fail');
            COMMIT;
        END IF;
        v_a := proto.reserve('rides.create', 'u1', 'slow', 'h');
        COMMIT;
        EXIT WHEN v_a.outcome <> 'resume';
    END LOOP;
    SELECT * INTO v_rec FROM proto.records WHERE key = 'slow';
    INSERT INTO proto.checks VALUES ('rules', 'poisoned at max_retries: failed, FAILED',
        v_a.outcome = 'failed' AND v_rec.status = 'FAILED' AND v_a.attempts = 5,
        v_a.outcome || ' after ' || v_n || ' more crashes, attempts ' || v_a.attempts || ', ' || v_rec.status);
    -- A key without a checkpoint: recovery as today (fail: FAILED; never resumed).
    v_a := proto.reserve('rides.create', 'u1', 'plain', 'h');
    COMMIT;
    CALL proto.expire('plain');
    COMMIT;
    v_b := proto.reserve('rides.create', 'u1', 'plain', 'h');
    PERFORM proto.recover_stuck(100, 'fail');
    SELECT * INTO v_rec FROM proto.records WHERE key = 'plain';
    INSERT INTO proto.checks VALUES ('rules', 'no checkpoint: in_progress, then FAILED by recovery',
        v_b.outcome = 'in_progress' AND v_rec.status = 'FAILED', v_b.outcome || ', ' || v_rec.status);
    -- A transient failure after the charge (the holder releases the key): kept RESUMABLE, the
    -- retry resumes after the charge; the ride is not created twice.
    CALL proto.ride_run('released', '{"amount": 1500, "origin": "A"}', 'after charge checkpoint');
    SELECT * INTO v_rec FROM proto.records WHERE key = 'released';
    v_err := proto.release('rides.create', 'u1', 'released', v_rec.token);
    SELECT * INTO v_rec FROM proto.records WHERE key = 'released';
    INSERT INTO proto.checks VALUES ('rules', 'release of a checkpointed key: released, kept RESUMABLE at its step',
        v_err = 'released' AND v_rec.status = 'RESUMABLE' AND v_rec.step = 2, v_err || ', ' || v_rec.status || ' step ' || v_rec.step);
    COMMIT;
    CALL proto.ride_run('released', '{"amount": 1500, "origin": "A"}');
    CALL proto.check_key('release, then retry', 'released');
    -- A resumable key past its expiry: created afresh (its history gone, as a FAILED record's).
    v_a := proto.reserve('rides.create', 'u1', 'released2', 'h');
    PERFORM proto.checkpoint('rides.create', 'u1', 'released2', v_a.token, 0, '{}');
    PERFORM proto.release('rides.create', 'u1', 'released2', v_a.token);
    UPDATE proto.records SET expires_at = clock_timestamp() - interval '1 s' WHERE key = 'released2';
    v_b := proto.reserve('rides.create', 'u1', 'released2', 'h');
    SELECT * INTO v_rec FROM proto.records WHERE key = 'released2';
    INSERT INTO proto.checks VALUES ('rules', 'an expired RESUMABLE key: created afresh, no step',
        v_b.outcome = 'created' AND v_rec.step IS NULL AND v_rec.status = 'PROCESSING', v_b.outcome);
    COMMIT;
    -- Derived keys: distinct where a plain join would collide; stable; short.
    INSERT INTO proto.checks VALUES ('rules', 'derive: user u, key a/b and user u/a, key b differ',
        proto.derive('op', 'u', 'a/b', 'charge') <> proto.derive('op', 'u/a', 'b', 'charge'), proto.derive('op', 'u', 'a/b', 'charge')),
        ('rules', 'derive: another user, another key',
         proto.derive('op', 'u1', 'k', 'charge') <> proto.derive('op', 'u2', 'k', 'charge'), proto.derive('op', 'u2', 'k', 'charge')),
        ('rules', 'derive: 255-byte parts give 71 bytes',
         octet_length(proto.derive(repeat('o', 255), repeat('u', 255), repeat('k', 255), 'charge')) = 71,
         octet_length(proto.derive(repeat('o', 255), repeat('u', 255), repeat('k', 255), 'charge'))::text);
    COMMIT;
END
$fn$;
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'proto_other') THEN CREATE ROLE proto_other; END IF;
END $$;
GRANT USAGE ON SCHEMA proto TO proto_other;
GRANT ALL ON ALL TABLES IN SCHEMA proto TO proto_other;
GRANT ALL ON ALL SEQUENCES IN SCHEMA proto TO proto_other;
CALL proto.rules();

-- The contrast: the same crash (after the ride's commit) on a record without a recovery point,
-- which is what 0.6.0's rules see (the step and state wiped to model it). 'release' runs the
-- request again from the start (a second ride); 'fail' leaves the first ride half done for good.
CREATE PROCEDURE proto.today(p_action text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_key  text := 'today:' || p_action;
    v_rec  proto.records;
    v_rows integer;
    v_done integer;
BEGIN
    CALL proto.ride_run(v_key, '{"amount": 1500, "origin": "A"}', 'after create ride');
    UPDATE proto.records SET step = NULL, state = NULL WHERE key = v_key;
    CALL proto.expire(v_key);
    COMMIT;
    PERFORM proto.recover_stuck(100, p_action);
    COMMIT;
    CALL proto.ride_run(v_key, '{"amount": 1500, "origin": "A"}');
    SELECT * INTO v_rec FROM proto.records WHERE key = v_key;
    SELECT count(*), count(*) FILTER (WHERE done) INTO v_rows, v_done FROM proto.rides WHERE idem_key = v_key;
    INSERT INTO proto.checks VALUES ('without a recovery point', p_action || ': the hazard 0.6.0 has',
        CASE p_action WHEN 'release' THEN v_rows = 2 ELSE v_rec.status = 'FAILED' AND v_done = 0 END,
        v_rows || ' rides, ' || v_done || ' done, ' || v_rec.status);
    COMMIT;
END
$fn$;
CALL proto.today('release');
CALL proto.today('fail');

\pset footer off
\set QUIET off
SELECT scenario, check_name, ok, detail FROM proto.checks ORDER BY ok, scenario, check_name;
SELECT count(*) FILTER (WHERE ok) AS passed, count(*) FILTER (WHERE NOT ok OR ok IS NULL) AS failed FROM proto.checks;
SELECT service, count(*) AS keys, sum(calls) AS calls, count(*) FILTER (WHERE calls > 1) AS keys_called_twice
  FROM proto.stub GROUP BY service ORDER BY service;
