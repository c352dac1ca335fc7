-- idempotency, portable build only: idem_replay in PL/pgSQL. Replaces the LANGUAGE c function of
-- the same signature in sql/replay.sql (extension/src/native/replay.rs); its comment and
-- privileges come from sql/ unchanged. The answer is PL/pgSQL idem_reserve's first step
-- (sql/reserve.sql) for a live record, kept when it is final; tests/tests/round_trips.rs and the
-- flows' suites run the same checks on both installs.

CREATE FUNCTION @extschema@.idem_replay(
    operation    text,
    user_id      text,
    key          text,
    request_hash text)
    RETURNS @extschema@.idem_reservation
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_rec     record;
    v_outcome text;
    v_counted boolean; -- receives _idem_check_owner and _idem_count
BEGIN
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_check_request_hash(request_hash)) THEN
        RETURN NULL; -- not reached: a failed check raises
    END IF;
    SELECT r.request_hash, r.status, r.response, r.lease_expires_at, r.expires_at, r.owner, r.step,
           r.attempts
      INTO v_rec
      FROM @extschema@.idem_records AS r
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation
       AND r.user_id = user_id AND r.key = key;
    IF NOT FOUND OR NOT (v_rec.expires_at > v_now
                         OR (v_rec.status = 'p' AND v_rec.lease_expires_at > v_now)) THEN
        RETURN NULL; -- absent or expired: idem_reserve creates or takes over
    END IF;
    -- As idem_reserve: another role learns nothing of a live record (guarantee 8).
    v_counted := @extschema@._idem_check_owner(v_rec.owner, 'replay a key');
    -- idem_reserve's answer where it is final; in progress or resumable: NULL.
    v_outcome := CASE WHEN v_rec.request_hash <> @extschema@._idem_hash(request_hash) THEN 'mismatch'
                      WHEN v_rec.status = 's' THEN 'replay'
                      WHEN v_rec.status = 'f' THEN 'failed' END;
    IF v_outcome IS NULL THEN
        RETURN NULL;
    END IF;
    v_counted := @extschema@._idem_count('reservations_' || v_outcome);
    RETURN ROW(v_outcome, NULL, CASE WHEN v_outcome IN ('replay', 'failed') THEN v_rec.response END,
               coalesce(v_rec.attempts, 0), v_rec.expires_at, NULL, NULL)::@extschema@.idem_reservation;
END
$fn$;
