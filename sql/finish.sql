-- idempotency: the calls an attempt makes with its token.
--
-- Each is a conditional update fenced by (token, status = 'PROCESSING'): a stale token, or a
-- record that completed, was recovered or was taken over, changes nothing and answers
-- false / 'stale'. Expected races are values, never errors. The fence compares the status
-- code as text (the same answer) so that no plan matches the partial index
-- idem_records_lease_idx instead of probing the primary key (extension/src/native/plans.rs).

CREATE FUNCTION @extschema@.idem_complete(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    response  jsonb,
    status    text DEFAULT 'SUCCESS')
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_limit   bigint;
    v_size    bigint;
    v_now     timestamptz := clock_timestamp(); -- a value, not a call inside the UPDATE (Citus)
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)
            AND @extschema@._idem_require('status', status IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    IF status NOT IN ('SUCCESS', 'FAILED') THEN
        RAISE EXCEPTION 'status must be ''SUCCESS'' or ''FAILED'', got %',
            @extschema@._idem_echo(status)
            USING ERRCODE = '22023';
    END IF;
    IF response IS NOT NULL THEN
        v_limit := @extschema@._idem_max_response_bytes();
        v_size := @extschema@._idem_utf8_length(response::text);  -- UTF-8 bytes, as native
        IF v_size > v_limit THEN
            -- Never echo the value: it may be huge, and it may be private.
            RAISE EXCEPTION 'response must be at most % bytes (idempotency.max_response_bytes), got %',
                v_limit, v_size USING ERRCODE = '54000';
        END IF;
    END IF;
    v_counted := @extschema@._idem_require_writable('complete a key');
    -- After the update from 0.6.0: the key's record moved from idem_records_060 first.
    PERFORM @extschema@._idem_adopt(operation, user_id, key);

    -- The recovery point's state goes (the response is the answer now); its step stays.
    UPDATE @extschema@.idem_records AS r
       SET status = @extschema@._idem_status_code(status), response = response, state = NULL, updated_at = v_now
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status::text = 'p'
       AND @extschema@._idem_owns(r.owner);
    IF FOUND THEN
        v_counted := @extschema@._idem_count(CASE status WHEN 'SUCCESS' THEN 'completions_success'
                                                                        ELSE 'completions_failed' END);
        RETURN true;
    END IF;
    -- Another role's record holding this token is refused (guarantee 8: a token is a fence, not a
    -- password); any other token is stale, a value.
    v_counted := @extschema@._idem_check_owner(
        (SELECT r.owner FROM @extschema@.idem_records AS r
          WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
            AND r.token = token), 'complete a key');
    v_counted := @extschema@._idem_count('stale_tokens');
    RETURN false;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_complete(text, text, text, bigint, jsonb, text) IS
    'Finishes the attempt holding token: SUCCESS (the default) or FAILED (a permanent failure), storing response for replays. false, changing nothing, when the token is stale or the record is no longer PROCESSING: roll the business write back.';

-- A batch: idem_complete for each key of one operation and user, in input order, in one
-- statement, each answered as its own call (a key repeated with its token completes once; its
-- later occurrences find it no longer PROCESSING and answer false). responses[i] may be NULL
-- (no stored response), as idem_complete's response. One fenced UPDATE completes every key
-- whose PROCESSING record is written (the first occurrence of each key and token); the others
-- (a reservation of this transaction not written yet, a stale token, a repeat) each go through
-- idem_complete. On Citus every key goes through idem_complete (a join is not routable).
CREATE FUNCTION @extschema@.idem_complete_many(
    operation text,
    user_id   text,
    keys      text[],
    tokens    bigint[],
    responses jsonb[],
    status    text DEFAULT 'SUCCESS')
    RETURNS TABLE (key text, completed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_n       integer;
    v_now     timestamptz := clock_timestamp();
    v_limit   bigint;
    v_bad     record;
    v_done    integer[] := '{}';
    v_counted boolean; -- receives _idem_count
BEGIN
    IF NOT (@extschema@._idem_check_scope(operation, user_id, 'k')
            AND @extschema@._idem_require('status', status IS NULL)) THEN
        RETURN; -- not reached: a failed check raises
    END IF;
    v_n := @extschema@._idem_check_array('keys', keys, NULL, NULL, false);
    PERFORM @extschema@._idem_check_array('tokens', tokens, 'keys', v_n, false);
    PERFORM @extschema@._idem_check_array('responses', responses, 'keys', v_n, true);
    -- idem_complete's rules for what the UPDATE below writes without it.
    IF status NOT IN ('SUCCESS', 'FAILED') THEN
        RAISE EXCEPTION 'status must be ''SUCCESS'' or ''FAILED'', got %',
            @extschema@._idem_echo(status)
            USING ERRCODE = '22023';
    END IF;
    v_limit := @extschema@._idem_max_response_bytes();
    SELECT x.i, @extschema@._idem_utf8_length(x.r::text) AS size INTO v_bad
      FROM unnest(idem_complete_many.responses) WITH ORDINALITY AS x(r, i)
     WHERE @extschema@._idem_utf8_length(x.r::text) > v_limit
     LIMIT 1;
    IF FOUND THEN
        -- Never echo the value: it may be huge, and it may be private.
        RAISE EXCEPTION 'responses[%] must be at most % bytes (idempotency.max_response_bytes), got %',
            v_bad.i, v_limit, v_bad.size USING ERRCODE = '54000';
    END IF;
    -- After the update from 0.6.0: the keys' records moved from idem_records_060 first.
    IF to_regclass('@extschema@.idem_records_060') IS NOT NULL THEN
        PERFORM @extschema@._idem_adopt(operation, user_id, u.k) FROM unnest(keys) AS u(k);
    END IF;
    IF NOT @extschema@._idem_distributed() THEN
        WITH u AS (
            SELECT DISTINCT ON (u.k, u.t) u.k, u.t, u.r, u.i
              FROM unnest(idem_complete_many.keys, idem_complete_many.tokens,
                          idem_complete_many.responses) WITH ORDINALITY AS u(k, t, r, i)
             ORDER BY u.k, u.t, u.i),
        done AS (
            UPDATE @extschema@.idem_records AS x
               SET status = @extschema@._idem_status_code(idem_complete_many.status), response = u.r,
                   state = NULL, updated_at = v_now
              FROM u
             WHERE x.id = @extschema@._idem_id(idem_complete_many.operation, idem_complete_many.user_id, u.k)
               AND x.operation = idem_complete_many.operation
               AND x.user_id = idem_complete_many.user_id AND x.key = u.k AND x.token = u.t
               AND x.status::text = 'p'
               AND @extschema@._idem_owns(x.owner)
            RETURNING u.i)
        SELECT coalesce(array_agg(done.i::integer), '{}') INTO v_done FROM done;
        IF cardinality(v_done) > 0 THEN
            v_counted := @extschema@._idem_count(CASE idem_complete_many.status
                                                     WHEN 'SUCCESS' THEN 'completions_success'
                                                     ELSE 'completions_failed' END,
                                                 cardinality(v_done));
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.k, s.done
      FROM (SELECT u.i, u.k,
                   CASE WHEN d.i IS NOT NULL THEN true
                        ELSE @extschema@.idem_complete(idem_complete_many.operation,
                                                       idem_complete_many.user_id, u.k, u.t, u.r,
                                                       idem_complete_many.status) END AS done
              FROM unnest(idem_complete_many.keys, idem_complete_many.tokens,
                          idem_complete_many.responses) WITH ORDINALITY AS u(k, t, r, i)
              LEFT JOIN unnest(v_done) AS d(i) ON d.i = u.i
             ORDER BY u.i
            OFFSET 0) AS s
     ORDER BY s.i;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text) IS
    'Completes many attempts of one operation and user in one statement: one row per element of keys, in input order, completed as idem_complete(operation, user_id, keys[i], tokens[i], responses[i], status) answers it. keys, tokens and responses: equal lengths; no NULL key or token (a NULL response stores none).';

CREATE FUNCTION @extschema@.idem_release(
    operation   text,
    user_id     text,
    key         text,
    token       bigint,
    max_retries integer DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_max     integer;
    v_rec     record;
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    v_max := @extschema@._idem_max_retries(max_retries);
    v_counted := @extschema@._idem_require_writable('release a key');
    -- After the update from 0.6.0: the key's record moved from idem_records_060 first.
    PERFORM @extschema@._idem_adopt(operation, user_id, key);

    SELECT r.created_at, r.expires_at INTO v_rec
      FROM @extschema@.idem_records AS r
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status::text = 'p'
       AND @extschema@._idem_owns(r.owner)
       FOR UPDATE;
    IF NOT FOUND THEN
        -- Another role's record holding this token is refused (guarantee 8); else stale.
        v_counted := @extschema@._idem_check_owner(
            (SELECT r.owner FROM @extschema@.idem_records AS r
              WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
                AND r.token = token), 'release a key');
        v_counted := @extschema@._idem_count('stale_tokens');
        RETURN 'stale';
    END IF;
    RETURN @extschema@._idem_release_locked(operation, user_id, key, v_rec.created_at,
                                            v_rec.expires_at, v_max);
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_release(text, text, text, bigint, integer) IS
    'Gives the key back after a transient failure: counts it, then deletes the record so a retry runs again (''released''; a record with a recovery point is kept RESUMABLE, so a retry resumes it), or marks it FAILED once max_retries failures are counted (''poisoned''). ''stale'' for a wrong token.';

CREATE FUNCTION @extschema@.idem_heartbeat(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    lease     interval DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_lease   interval;
    v_until   timestamptz;
    v_ttl     interval;
    v_ceiling timestamptz;
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    -- The lease's ceiling is the record's own: its expiry, or idempotency.ttl past now,
    -- whichever is later (a record reserved with a ttl above the session's keeps a lease within
    -- that ttl, as idem_reserve allowed it). An explicit longer lease is 22023 (checked below,
    -- against the record); the default, idempotency.lease, is capped there. So a heartbeat
    -- cannot wedge a key for longer than its reservation or one idempotency.ttl from now.
    v_lease := @extschema@._idem_lease(lease, NULL);
    v_until := v_now + v_lease;
    v_ttl := @extschema@._idem_ttl(NULL);
    v_ceiling := v_now + v_ttl;
    v_counted := @extschema@._idem_require_writable('extend a lease');
    -- After the update from 0.6.0: the key's record moved from idem_records_060 first.
    PERFORM @extschema@._idem_adopt(operation, user_id, key);

    -- expires_at moves to at least the lease end, so a live, heartbeating attempt is never
    -- taken over as expired.
    UPDATE @extschema@.idem_records AS r
       SET lease_expires_at = least(v_until, greatest(r.expires_at, v_ceiling)),
           expires_at = greatest(r.expires_at, least(v_until, greatest(r.expires_at, v_ceiling))),
           updated_at = v_now
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status::text = 'p'
       AND @extschema@._idem_owns(r.owner)
       AND (lease IS NULL OR v_until <= greatest(r.expires_at, v_ceiling));
    IF NOT FOUND THEN
        -- Another role's record holding this token is refused (guarantee 8).
        v_counted := @extschema@._idem_check_owner(
            (SELECT r.owner FROM @extschema@.idem_records AS r
              WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
                AND r.token = token), 'extend a lease');
        -- The attempt holding this token asked for a lease past its ceiling; else stale.
        IF lease IS NOT NULL AND EXISTS (
               SELECT FROM @extschema@.idem_records AS r
                WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
                  AND r.token = token AND r.status::text = 'p') THEN
            RAISE EXCEPTION 'lease must not exceed the record''s remaining ttl or idempotency.ttl (%), whichever is longer, got %',
                v_ttl, v_lease USING ERRCODE = '22023';
        END IF;
        v_counted := @extschema@._idem_count('stale_tokens');
        RETURN false;
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_heartbeat(text, text, text, bigint, interval) IS
    'Extends the lease of the PROCESSING attempt holding token to now + lease (default idempotency.lease), within the record''s own ceiling: its expiry, or idempotency.ttl past now, whichever is later (an explicit lease past it is 22023); false when the token is stale; 42501 for another role''s key.';

-- A recovery point (docs/recovery-points.md): the attempt holding token reached step, with state
-- to continue from. Called in the transaction of the step's local writes, so both commit or
-- neither; fenced as idem_complete (false, changing nothing, for a stale token: roll the step
-- back), and it extends the lease as idem_heartbeat does, within the same ceiling.
CREATE FUNCTION @extschema@.idem_checkpoint(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    step      integer,
    state     jsonb,
    lease     interval DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_limit    bigint;
    v_size     bigint;
    v_lease    interval;
    v_until    timestamptz;
    v_ttl      interval;
    v_ceiling  timestamptz;
    v_recorded integer;
    v_counted  boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)
            AND @extschema@._idem_check_step(step)) THEN
        RETURN NULL; -- not reached
    END IF;
    IF state IS NOT NULL THEN
        v_limit := @extschema@._idem_max_response_bytes();
        v_size := @extschema@._idem_utf8_length(state::text);  -- UTF-8 bytes, as a response
        IF v_size > v_limit THEN
            -- Never echo the value: it may be huge, and it may be private.
            RAISE EXCEPTION 'state must be at most % bytes (idempotency.max_response_bytes), got %',
                v_limit, v_size USING ERRCODE = '54000';
        END IF;
    END IF;
    -- The lease and its ceiling exactly as idem_heartbeat's.
    v_lease := @extschema@._idem_lease(lease, NULL);
    v_until := v_now + v_lease;
    v_ttl := @extschema@._idem_ttl(NULL);
    v_ceiling := v_now + v_ttl;
    v_counted := @extschema@._idem_require_writable('record a recovery point');
    -- After the update from 0.6.0: the key's record moved from idem_records_060 first.
    PERFORM @extschema@._idem_adopt(operation, user_id, key);
    -- A reservation this transaction made and has not written yet (the native write-once flow:
    -- recovery point 0 may share the reservation's transaction) is written first.
    PERFORM @extschema@._idem_write_pending(operation, user_id, key);
    -- Another role's record holding this token is refused (guarantee 8). Checked first, not as
    -- a condition of the UPDATE (Citus refuses a STABLE function of a column there): a record
    -- never changes owner under one token (a takeover writes a new token).
    v_counted := @extschema@._idem_check_owner(
        (SELECT r.owner FROM @extschema@.idem_records AS r
          WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
            AND r.token = token), 'record a recovery point');

    UPDATE @extschema@.idem_records AS r
       SET step = step, state = state,
           lease_expires_at = least(v_until, greatest(r.expires_at, v_ceiling)),
           expires_at = greatest(r.expires_at, least(v_until, greatest(r.expires_at, v_ceiling))),
           updated_at = v_now
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status::text = 'p'
       AND (r.step IS NULL OR r.step < step)
       AND (lease IS NULL OR v_until <= greatest(r.expires_at, v_ceiling));
    IF FOUND THEN
        RETURN true;
    END IF;
    -- The attempt holding this token sent a step that does not advance, or asked for a lease
    -- past its ceiling; else the token is stale (a value).
    SELECT r.step INTO v_recorded
      FROM @extschema@.idem_records AS r
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status::text = 'p';
    IF FOUND THEN
        IF v_recorded >= step THEN
            RAISE EXCEPTION 'step must exceed the recorded step %, got %', v_recorded, step
                USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'lease must not exceed the record''s remaining ttl or idempotency.ttl (%), whichever is longer, got %',
            v_ttl, v_lease USING ERRCODE = '22023';
    END IF;
    v_counted := @extschema@._idem_count('stale_tokens');
    RETURN false;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_checkpoint(text, text, text, bigint, integer, jsonb, interval) IS
    'Records a recovery point of the PROCESSING attempt holding token: step (above the recorded one) and state, which idem_reserve answers as outcome resume to the attempt that takes the key over if this one dies or releases it. Extends the lease as idem_heartbeat. false, changing nothing, when the token is stale: roll the step back. Call it in the transaction of the step''s writes.';
