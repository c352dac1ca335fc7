-- Issue 45, stage A: a prototype of recovery points (docs/recovery-points.md). NOT the
-- extension: a scratch schema `proto` with the record's columns the design needs and PL/pgSQL
-- stand-ins for idem_reserve, idem_checkpoint, idem_complete and idem_recover_stuck, written
-- only to prove the rules on a scratch database (bench/prototypes/ride_flow.sql walks them).
-- The implementation changes sql/reserve.sql, sql/finish.sql and sql/maintenance.sql instead.
--
-- What it models of the real functions: the fence (token, status PROCESSING, owner), the key's
-- transaction-scoped advisory lock on create and takeover, the retry counter (idem_retries) and
-- max_retries. What it leaves out: wait, the lock budget, the Citus branches, the counters of
-- idem_stats, the argument checks beyond the new ones.

DROP SCHEMA IF EXISTS proto CASCADE;
CREATE SCHEMA proto;

CREATE SEQUENCE proto.token_seq AS bigint;

-- idem_records with the two columns record-layout.md reserves (step, state) and one more
-- status, RESUMABLE (the layout's "char" code 'r'): a checkpointed key released by recovery.
CREATE TABLE proto.records (
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    request_hash     text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('PROCESSING', 'SUCCESS', 'FAILED', 'RESUMABLE')),
    token            bigint      NOT NULL,
    response         jsonb,
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    owner            regrole,
    step             integer,   -- the recovery point reached (NULL: none)
    state            jsonb,     -- its state
    PRIMARY KEY (operation, user_id, key));
CREATE INDEX ON proto.records (lease_expires_at) WHERE status = 'PROCESSING';

CREATE TABLE proto.retries (
    operation  text        NOT NULL,
    user_id    text        NOT NULL,
    key        text        NOT NULL,
    attempts   integer     NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (operation, user_id, key));

-- idem_reservation plus the two attributes (appended: ALTER TYPE .. ADD ATTRIBUTE).
CREATE TYPE proto.reservation AS (
    outcome    text,      -- created | resume | replay | failed | in_progress | mismatch
    token      bigint,
    response   jsonb,
    attempts   integer,
    expires_at timestamptz,
    step       integer,   -- resume only
    state      jsonb);    -- resume only

CREATE FUNCTION proto.owns(owner regrole) RETURNS boolean
    LANGUAGE sql STABLE AS
$$ SELECT owner IS NULL OR pg_has_role(current_user, owner, 'MEMBER') $$;

-- One transient failure of a locked record: as _idem_release_locked counts it. Answers the
-- new count.
CREATE FUNCTION proto.count_failure(p_op text, p_user text, p_key text, p_created timestamptz,
                                    p_expires timestamptz)
    RETURNS integer LANGUAGE plpgsql AS $fn$
DECLARE
    v_attempts integer;
BEGIN
    INSERT INTO proto.retries AS t (operation, user_id, key, attempts, expires_at)
    VALUES (p_op, p_user, p_key, 1, p_expires)
    ON CONFLICT (operation, user_id, key) DO UPDATE
        SET attempts = CASE WHEN t.expires_at > p_created THEN t.attempts + 1 ELSE 1 END,
            expires_at = greatest(t.expires_at, excluded.expires_at)
    RETURNING t.attempts INTO v_attempts;
    RETURN v_attempts;
END
$fn$;

CREATE FUNCTION proto.reserve(p_op text, p_user text, p_key text, p_hash text,
                              p_ttl interval DEFAULT '1 day', p_lease interval DEFAULT '30 s',
                              p_max_retries integer DEFAULT 5)
    RETURNS proto.reservation LANGUAGE plpgsql AS $fn$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_rec      proto.records;
    v_token    bigint;
    v_attempts integer;
BEGIN
    -- The key's lock first (the real function reads first and locks only to write; the
    -- prototype keeps one order for brevity).
    IF NOT pg_try_advisory_xact_lock(hashtextextended(p_op || E'\x1f' || p_user || E'\x1f' || p_key, 0)) THEN
        RETURN ROW('in_progress', NULL, NULL, 0, NULL, NULL, NULL)::proto.reservation;
    END IF;
    SELECT * INTO v_rec FROM proto.records r
     WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
    SELECT t.attempts INTO v_attempts FROM proto.retries t
     WHERE t.operation = p_op AND t.user_id = p_user AND t.key = p_key AND t.expires_at > v_now;
    v_attempts := coalesce(v_attempts, 0);

    IF v_rec.status IS NOT NULL AND NOT proto.owns(v_rec.owner) THEN
        RAISE EXCEPTION 'permission denied to reserve a key of role %', v_rec.owner USING ERRCODE = '42501';
    END IF;

    -- A live checkpointed key whose holder is gone: RESUMABLE (recovery or a release counted
    -- the failure), or PROCESSING with its lease run out (counted here, as recovery would).
    -- Past its expiry the key is created afresh below, as any expired record.
    IF v_rec.expires_at > v_now
       AND (v_rec.status = 'RESUMABLE'
            OR (v_rec.status = 'PROCESSING' AND v_rec.step IS NOT NULL AND v_rec.lease_expires_at <= v_now)) THEN
        IF v_rec.request_hash <> p_hash THEN
            RETURN ROW('mismatch', NULL, NULL, v_attempts, v_rec.expires_at, NULL, NULL)::proto.reservation;
        END IF;
        IF v_rec.status = 'PROCESSING' THEN
            v_attempts := proto.count_failure(p_op, p_user, p_key, v_rec.created_at, v_rec.expires_at);
            IF v_attempts >= p_max_retries THEN
                UPDATE proto.records r SET status = 'FAILED', state = NULL, updated_at = v_now
                 WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
                RETURN ROW('failed', NULL, v_rec.response, v_attempts, v_rec.expires_at, NULL, NULL)::proto.reservation;
            END IF;
        END IF;
        v_token := nextval('proto.token_seq');
        UPDATE proto.records r
           SET status = 'PROCESSING', token = v_token, lease_expires_at = v_now + p_lease,
               expires_at = greatest(r.expires_at, v_now + p_lease), updated_at = v_now
         WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
        RETURN ROW('resume', v_token, NULL, v_attempts, greatest(v_rec.expires_at, v_now + p_lease),
                   v_rec.step, v_rec.state)::proto.reservation;
    END IF;

    -- Everything else as idem_reserve answers today.
    IF v_rec.status IS NOT NULL
       AND (v_rec.expires_at > v_now OR (v_rec.status = 'PROCESSING' AND v_rec.lease_expires_at > v_now)) THEN
        RETURN ROW(CASE WHEN v_rec.request_hash <> p_hash THEN 'mismatch'
                        WHEN v_rec.status = 'SUCCESS' THEN 'replay'
                        WHEN v_rec.status = 'FAILED' THEN 'failed'
                        ELSE 'in_progress' END,
                   NULL,
                   CASE WHEN v_rec.request_hash = p_hash AND v_rec.status IN ('SUCCESS', 'FAILED') THEN v_rec.response END,
                   v_attempts, v_rec.expires_at, NULL, NULL)::proto.reservation;
    END IF;
    v_token := nextval('proto.token_seq');
    -- Absent, or expired: created afresh (a takeover forgets step and state: past its expiry a
    -- key's history is gone, as a FAILED record's is).
    INSERT INTO proto.records AS r VALUES
        (p_op, p_user, p_key, p_hash, 'PROCESSING', v_token, NULL, v_now + p_lease, v_now + p_ttl,
         v_now, v_now, current_user::regrole, NULL, NULL)
    ON CONFLICT (operation, user_id, key) DO UPDATE
        SET request_hash = excluded.request_hash, status = 'PROCESSING', token = v_token,
            response = NULL, lease_expires_at = excluded.lease_expires_at,
            expires_at = excluded.expires_at, created_at = v_now, updated_at = v_now,
            owner = excluded.owner, step = NULL, state = NULL;
    RETURN ROW('created', v_token, NULL, v_attempts, v_now + p_ttl, NULL, NULL)::proto.reservation;
END
$fn$;

-- idem_checkpoint: fenced like idem_complete; in the transaction of the step's local writes.
CREATE FUNCTION proto.checkpoint(p_op text, p_user text, p_key text, p_token bigint,
                                 p_step integer, p_state jsonb, p_lease interval DEFAULT '30 s')
    RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_limit bigint := 65536;  -- idempotency.max_response_bytes
    v_rec   proto.records;
BEGIN
    IF p_token IS NULL THEN
        RAISE EXCEPTION 'token must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF p_step IS NULL THEN
        RAISE EXCEPTION 'step must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF p_step < 0 THEN
        RAISE EXCEPTION 'step must be at least 0, got %', p_step USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_state::text) > v_limit THEN
        RAISE EXCEPTION 'state must be at most % bytes (idempotency.max_response_bytes), got %',
            v_limit, octet_length(p_state::text) USING ERRCODE = '54000';
    END IF;
    UPDATE proto.records r
       SET step = p_step, state = p_state, lease_expires_at = v_now + p_lease,
           expires_at = greatest(r.expires_at, v_now + p_lease), updated_at = v_now
     WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key
       AND r.token = p_token AND r.status = 'PROCESSING' AND proto.owns(r.owner)
       AND (r.step IS NULL OR r.step < p_step)
    RETURNING r.* INTO v_rec;
    IF FOUND THEN
        RETURN true;
    END IF;
    SELECT * INTO v_rec FROM proto.records r
     WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key AND r.token = p_token;
    IF FOUND AND NOT proto.owns(v_rec.owner) THEN
        RAISE EXCEPTION 'permission denied to checkpoint a key of role %', v_rec.owner USING ERRCODE = '42501';
    END IF;
    IF FOUND AND v_rec.status = 'PROCESSING' THEN
        RAISE EXCEPTION 'step must exceed the recorded step %, got %', v_rec.step, p_step USING ERRCODE = '22023';
    END IF;
    RETURN false;  -- stale: taken over, recovered or finished
END
$fn$;

-- idem_complete as today, plus: the state goes (the response is the answer now); step stays.
CREATE FUNCTION proto.complete(p_op text, p_user text, p_key text, p_token bigint, p_response jsonb,
                               p_status text DEFAULT 'SUCCESS')
    RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE proto.records r
       SET status = p_status, response = p_response, state = NULL, updated_at = clock_timestamp()
     WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key
       AND r.token = p_token AND r.status = 'PROCESSING' AND proto.owns(r.owner);
    RETURN FOUND;
END
$fn$;

-- idem_recover_stuck: a checkpointed key is released for resumption (a new token fences the
-- dead holder out; counted toward max_retries; poisoned past it), whatever the action; the
-- others as today.
CREATE FUNCTION proto.recover_stuck(p_batch integer DEFAULT 100, p_action text DEFAULT 'fail',
                                    p_max_retries integer DEFAULT 5, p_ttl interval DEFAULT '1 day')
    RETURNS TABLE (key text, became text) LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_rec record;
    v_n   integer;
BEGIN
    FOR v_rec IN
        SELECT r.operation, r.user_id, r.key, r.step, r.created_at, r.expires_at
          FROM proto.records r
         WHERE r.status = 'PROCESSING' AND r.lease_expires_at <= v_now
         ORDER BY r.lease_expires_at LIMIT p_batch
           FOR UPDATE SKIP LOCKED
    LOOP
        key := v_rec.key;
        IF v_rec.step IS NULL AND p_action = 'fail' THEN
            UPDATE proto.records r SET status = 'FAILED', updated_at = v_now
             WHERE r.operation = v_rec.operation AND r.user_id = v_rec.user_id AND r.key = v_rec.key;
            became := 'FAILED';
        ELSE
            v_n := proto.count_failure(v_rec.operation, v_rec.user_id, v_rec.key, v_rec.created_at, v_rec.expires_at);
            IF v_n >= p_max_retries THEN
                UPDATE proto.records r SET status = 'FAILED', state = NULL, updated_at = v_now
                 WHERE r.operation = v_rec.operation AND r.user_id = v_rec.user_id AND r.key = v_rec.key;
                became := 'FAILED (poisoned)';
            ELSIF v_rec.step IS NULL THEN
                DELETE FROM proto.records r
                 WHERE r.operation = v_rec.operation AND r.user_id = v_rec.user_id AND r.key = v_rec.key;
                became := 'released';
            ELSE
                UPDATE proto.records r
                   SET status = 'RESUMABLE', token = nextval('proto.token_seq'),
                       expires_at = greatest(r.expires_at, v_now + p_ttl), updated_at = v_now
                 WHERE r.operation = v_rec.operation AND r.user_id = v_rec.user_id AND r.key = v_rec.key;
                became := 'RESUMABLE';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- idem_release: a transient failure of the holder. Without a checkpoint as today (the record
-- deleted, or FAILED at max_retries); with one, the record is kept RESUMABLE (a new token), so a
-- retry continues from it instead of starting over. Answers released | poisoned | stale.
CREATE FUNCTION proto.release(p_op text, p_user text, p_key text, p_token bigint,
                              p_max_retries integer DEFAULT 5, p_ttl interval DEFAULT '1 day')
    RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_rec proto.records;
BEGIN
    SELECT * INTO v_rec FROM proto.records r
     WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key
       AND r.token = p_token AND r.status = 'PROCESSING' AND proto.owns(r.owner)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    IF proto.count_failure(p_op, p_user, p_key, v_rec.created_at, v_rec.expires_at) >= p_max_retries THEN
        UPDATE proto.records r SET status = 'FAILED', state = NULL, updated_at = v_now
         WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
        RETURN 'poisoned';
    END IF;
    IF v_rec.step IS NULL THEN
        DELETE FROM proto.records r WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
    ELSE
        UPDATE proto.records r
           SET status = 'RESUMABLE', token = nextval('proto.token_seq'), lease_expires_at = v_now,
               expires_at = greatest(r.expires_at, v_now + p_ttl), updated_at = v_now
         WHERE r.operation = p_op AND r.user_id = p_user AND r.key = p_key;
    END IF;
    RETURN 'released';
END
$fn$;

-- idem_resumable: what a completer walks (its caller's roles' keys only).
CREATE FUNCTION proto.resumable(p_op text, p_batch integer DEFAULT 100)
    RETURNS TABLE (user_id text, key text, request_hash text, step integer, state jsonb)
    LANGUAGE sql STABLE AS $$
    SELECT r.user_id, r.key, r.request_hash, r.step, r.state
      FROM proto.records r
     WHERE r.operation = p_op AND r.status = 'RESUMABLE' AND proto.owns(r.owner)
     ORDER BY r.updated_at LIMIT p_batch $$;

-- The derived key of an outside step: SHA-256 over the length-prefixed (4-byte big-endian
-- length, then the UTF-8 bytes) domain tag, operation, user_id, key and step name; answered as
-- the step name, '-', and 64 hex digits (at most 64 + 1 + 64 bytes).
CREATE FUNCTION proto.derive(p_op text, p_user text, p_key text, p_step text)
    RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT p_step || '-' || encode(sha256(
        int4send(octet_length('idempotency.derive.v1')) || convert_to('idempotency.derive.v1', 'UTF8') ||
        int4send(octet_length(p_op))   || convert_to(p_op, 'UTF8') ||
        int4send(octet_length(p_user)) || convert_to(p_user, 'UTF8') ||
        int4send(octet_length(p_key))  || convert_to(p_key, 'UTF8') ||
        int4send(octet_length(p_step)) || convert_to(p_step, 'UTF8')), 'hex') $$;
