-- idempotency: idem_await, the bounded wait for a key's holder (issue 44).
--
-- A duplicate that finds its key in progress - a two-phase attempt's committed PROCESSING
-- record while its outside call runs, or another transaction's uncommitted reservation - may
-- wait for the holder instead of answering in_progress at once. The wait polls: idem_reserve
-- with wait => false (which never blocks), again after a pause of 20 ms doubling up to 250 ms,
-- half of each random, until another answer or the bound: the timeout, and never past the
-- holder's lease as last read (a heartbeat moves it; a holder that died is not waited for past
-- its lease, and its key is recovered as before). Measured against a wait on LISTEN/NOTIFY (a
-- NOTIFY in every completion serialises commits) and a procedure committing between polls (it
-- cannot be SECURITY DEFINER, pin its search_path, or run in the caller's transaction):
-- docs/performance.md, "Waiting for a holder".
--
-- What a waiter holds: its session, and its statement's snapshot (READ COMMITTED: each poll
-- reads with a fresh one, so the holder's commit is seen); no lock on the key, no advisory lock,
-- no row lock. The holder, idem_recover_stuck and idem_sweep never wait for it. One function for
-- both installs: PL/pgSQL over idem_reserve (native or PL/pgSQL), so it has no portable twin.

CREATE FUNCTION @extschema@.idem_await(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    timeout      interval,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL)
    RETURNS @extschema@.idem_reservation
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_deadline timestamptz;
    v_answer   @extschema@.idem_reservation;
    v_lease    timestamptz;
    v_pause    float8 := 0.02;
    v_left     float8;
BEGIN
    IF timeout IS NULL THEN
        RAISE EXCEPTION 'timeout must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF timeout <= interval '0' OR timeout > interval '1 minute' THEN
        RAISE EXCEPTION 'timeout must be a positive interval of at most 1 minute, got %', timeout
            USING ERRCODE = '22023';
    END IF;
    v_deadline := clock_timestamp() + timeout;
    LOOP
        v_answer := @extschema@.idem_reserve(operation, user_id, key, request_hash, ttl, lease, false);
        EXIT WHEN v_answer.outcome <> 'in_progress';
        -- The holder's lease as committed now (NULL: an uncommitted holder, waited for up to
        -- the timeout). idem_reserve has checked the caller may act on the record.
        SELECT r.lease_expires_at INTO v_lease
          FROM @extschema@.idem_records AS r
         WHERE r.id = @extschema@._idem_id(operation, user_id, key)
           AND r.operation = operation AND r.user_id = user_id AND r.key = key
           AND r.status = 'p';
        v_left := extract(epoch FROM least(v_deadline, coalesce(v_lease, v_deadline)) - clock_timestamp());
        EXIT WHEN v_left <= 0;
        PERFORM pg_sleep(least(v_pause * (0.5 + random() / 2), v_left));
        v_pause := least(v_pause * 2, 0.25);
    END LOOP;
    RETURN v_answer;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_await(text, text, text, text, interval, interval, interval) IS
    'Answers as idem_reserve(..., wait => false), after waiting up to timeout (at most 1 minute, never past the holder''s lease) for a key in progress: polls, holding no lock on the key.';
