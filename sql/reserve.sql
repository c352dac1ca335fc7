-- idempotency: idem_reserve.
--
-- How one key stays at most once:
--   1. Read the committed record (and its retry counter) in one primary-key probe. A live record
--      answers at once: replay, failed, in_progress or mismatch. No lock is taken, so a replay
--      costs one statement and never makes a concurrent duplicate wait.
--   2. The key is absent or expired: a live retry counter of a role the caller may not act on
--      refuses (42501: a released key stays its owner's while its count lives). Then take the
--      key's transaction-scoped advisory lock. Every transaction that creates or takes over a
--      record holds it until it commits or rolls back, so an uncommitted reservation is
--      detected without blocking (wait => false answers in_progress) or waited for
--      (wait => true).
--   3. Create with INSERT ... ON CONFLICT DO NOTHING, or take over an expired record with an
--      UPDATE that re-checks expiry on the newest row version. The primary key and the re-check,
--      not the lock, are what make two `created` for one key impossible; if either loses a
--      race, loop and read again.
--   4. The locks live in the server's shared lock table (about max_locks_per_transaction per
--      session): a transaction keeps fewer than half of max_locks_per_transaction of them. Past
--      that it takes no key lock for good; its uncommitted row holds the key, as a row of the
--      hand-written INSERT ... ON CONFLICT does. Such a transaction holds the shared "past its
--      budget" lock (advisory lock (1768189296, 1), one slot for the whole transaction, the last
--      of its budget) and probes the key's lock for an instant (taken and given back in one
--      expression), so a key another transaction holds by its lock answers in_progress at once.
--   5. A live record with a recovery point and no live holder (RESUMABLE, or PROCESSING with a
--      step and its lease run out; docs/recovery-points.md) is resumed, not answered: for the
--      same request_hash and the owner's role, the key's lock is taken as for a takeover, then
--      _idem_resume_locked re-reads the row under FOR UPDATE and hands it a new token with the
--      last recovery point (outcome resume; an expired holder's failure counted first).
--   6. No subtransaction: PL/pgSQL cannot read another transaction's uncommitted row, and
--      INSERT waits for one, so only a key that some transaction past its budget may hold by its
--      row needs an insert that gives up instead of waiting (_idem_write_nowait: lock_timeout,
--      caught in an EXCEPTION block, a subtransaction). An insert takes it only with
--      wait => false while another transaction holds the "past its budget" lock (probed for an
--      instant); every other insert is a plain INSERT ... ON CONFLICT DO NOTHING, which cannot
--      wait: any other uncommitted row of the key belongs to a transaction holding the key's
--      lock (which this one holds now, or probed free) or the "past its budget" lock (probed
--      free after this transaction took the key's lock, and taken by that transaction before
--      its probe of the key's lock). One race is left to a transaction past its budget: a
--      transaction that takes the key's lock and inserts in the instant between its probe and
--      its insert makes it wait for that transaction's end (never an error, never a second
--      created). A takeover waits for a row another transaction holds (a sweep or a recovery,
--      briefly; or the takeover of a transaction past its budget, until it ends).

CREATE FUNCTION @extschema@._idem_write_nowait(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    token        bigint,
    now          timestamptz,
    lease_end    timestamptz,
    expires_at   timestamptz,
    attempts     integer)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms'
    AS $fn$
#variable_conflict use_variable
BEGIN
    INSERT INTO @extschema@.idem_records AS r
           (id, operation, user_id, key, request_hash, status, token, response,
            lease_expires_at, expires_at, created_at, updated_at, owner, attempts)
    VALUES (@extschema@._idem_id(operation, user_id, key), operation, user_id, key,
            @extschema@._idem_hash(request_hash), 'p', token, NULL,
            lease_end, expires_at, now, now, @extschema@._idem_caller(), attempts)
    ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING;
    RETURN FOUND;
EXCEPTION WHEN lock_not_available THEN
    -- Another transaction holds the key by its uncommitted row: busy.
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz, integer) IS
    'Internal (PL/pgSQL idem_reserve): the insert of a new record; NULL instead of waiting (lock_timeout) for another transaction''s uncommitted row of the key.';

-- The resume of a key with a recovery point and no live holder, for idem_reserve (both
-- versions: the native one calls it by SPI), which holds the key's advisory lock and has checked
-- the caller's role. Re-reads the record under its row lock, so a commit, a takeover, a recovery
-- or a sweep since idem_reserve read it answers NULL (read again). A PROCESSING holder whose
-- lease ran out is counted as a transient failure first, exactly as recovery would count it
-- (_idem_release_locked: RESUMABLE, or poisoned at max_retries, then answered failed); a
-- RESUMABLE record was counted when it was released. Then the attempt holding token owns the
-- key from its last recovery point: lease from now, expiry at least the lease's end.
CREATE FUNCTION @extschema@._idem_resume_locked(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    token        bigint,
    lease        interval)
    RETURNS @extschema@.idem_reservation
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_rec      record;
    v_expires  timestamptz;
    v_attempts integer;
    v_counted  boolean; -- receives _idem_count
BEGIN
    SELECT r.status, r.request_hash, r.step, r.state, r.created_at, r.expires_at, r.lease_expires_at
      INTO v_rec
      FROM @extschema@.idem_records AS r
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key
       FOR UPDATE;
    IF NOT FOUND OR v_rec.request_hash <> @extschema@._idem_hash(request_hash) OR v_rec.expires_at <= v_now
       OR NOT (v_rec.status = 'r'
               OR (v_rec.status = 'p' AND v_rec.step IS NOT NULL
                   AND v_rec.lease_expires_at <= v_now)) THEN
        RETURN NULL;
    END IF;
    v_expires := v_rec.expires_at;
    IF v_rec.status = 'p' THEN
        IF @extschema@._idem_release_locked(operation, user_id, key, v_rec.created_at, v_rec.expires_at,
                                            @extschema@._idem_max_retries(NULL)) = 'poisoned' THEN
            SELECT t.attempts INTO v_attempts
              FROM @extschema@.idem_retries AS t
             WHERE t.operation = operation AND t.user_id = user_id AND t.key = key;
            v_counted := @extschema@._idem_count('reservations_failed');
            RETURN ROW('failed', NULL, NULL, v_attempts, v_rec.expires_at, NULL, NULL)::@extschema@.idem_reservation;
        END IF;
        SELECT r.expires_at INTO v_expires
          FROM @extschema@.idem_records AS r
         WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
    END IF;
    v_expires := greatest(v_expires, v_now + lease);
    UPDATE @extschema@.idem_records AS r
       SET status = 'p', token = token, lease_expires_at = v_now + lease,
           expires_at = v_expires, updated_at = v_now
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
    -- The retry counter lives as long as the record (as a created retry's).
    UPDATE @extschema@.idem_retries AS t
       SET expires_at = greatest(t.expires_at, v_expires)
     WHERE t.operation = operation AND t.user_id = user_id AND t.key = key AND t.expires_at > v_now
    RETURNING t.attempts INTO v_attempts;
    v_counted := @extschema@._idem_count('reservations_resume');
    RETURN ROW('resume', token, NULL, coalesce(v_attempts, 0), v_expires, v_rec.step,
               v_rec.state)::@extschema@.idem_reservation;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_resume_locked(text, text, text, text, bigint, interval) IS
    'Internal (idem_reserve, under the key''s lock): resumes a key with a recovery point and no live holder with token, counting an expired holder''s failure; NULL when the record changed since it was read.';

CREATE FUNCTION @extschema@.idem_reserve(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         boolean  DEFAULT false)
    RETURNS @extschema@.idem_reservation
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_ttl      interval;
    v_lease    interval;
    v_now      timestamptz;
    v_rec      record;
    v_attempts integer;
    v_token    bigint;
    v_locked   boolean := false;
    v_outcome  text;
    v_kept     integer;
    v_keep     boolean := true;
    v_found    boolean;
    v_hash     bigint;
    v_busy     boolean;
    v_counted  boolean; -- receives _idem_count: an assignment is PL/pgSQL's cheapest call
    v_owner    oid;
    v_resume   boolean;
    v_answer   @extschema@.idem_reservation;
    v_id       uuid;
    v_stored   bytea; -- request_hash as the record stores it
    v_adopted  boolean := false;
BEGIN
    -- The argument rules, checked natively (extension/src/args.rs, on the client crate's key
    -- rules): each check raises 22004/22023 naming the argument, or answers true.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_check_request_hash(request_hash)
            AND @extschema@._idem_require('wait', wait IS NULL)) THEN
        RETURN NULL; -- not reached: a failed check raises
    END IF;
    -- The durations: explicit values checked, NULL the idempotency.* defaults (a defaulted
    -- lease capped at the ttl).
    v_ttl := @extschema@._idem_ttl(ttl);
    v_lease := @extschema@._idem_lease(lease, v_ttl);
    v_id := @extschema@._idem_id(operation, user_id, key);
    v_stored := @extschema@._idem_hash(request_hash);

    FOR attempt IN 1..8 LOOP
        v_now := clock_timestamp();
        -- One statement, a primary-key probe of each table: the record, and the retry counter
        -- (which counts toward the record if it was live when the record was created). With no
        -- record the row is all NULL but the counter's.
        v_resume := false;
        SELECT r.request_hash, r.status, r.response, r.lease_expires_at, r.expires_at, r.owner, r.step,
               r.attempts, t.expires_at AS counter_expires_at, t.owner AS counter_owner
          INTO v_rec
          FROM (SELECT) AS one
          LEFT JOIN @extschema@.idem_records AS r
            ON r.id = v_id AND r.operation = operation AND r.user_id = user_id AND r.key = key
          LEFT JOIN @extschema@.idem_retries AS t
            ON t.operation = operation AND t.user_id = user_id AND t.key = key;

        IF v_rec.status IS NOT NULL
           AND (v_rec.expires_at > v_now
                OR (v_rec.status = 'p' AND v_rec.lease_expires_at > v_now)) THEN
            -- A live record decides, for its owner (and the owner's members) only: another role
            -- learns nothing of it, its response least of all (guarantee 8).
            v_counted := @extschema@._idem_check_owner(v_rec.owner, 'reserve a key');
            -- A recovery point and no live holder: resumed below, under the key's lock.
            v_resume := v_rec.request_hash = v_stored AND v_rec.expires_at > v_now
                        AND (v_rec.status = 'r'
                             OR (v_rec.status = 'p' AND v_rec.step IS NOT NULL
                                 AND v_rec.lease_expires_at <= v_now));
            IF NOT v_resume THEN
                v_outcome := CASE WHEN v_rec.request_hash <> v_stored THEN 'mismatch'
                                  WHEN v_rec.status = 's' THEN 'replay'
                                  WHEN v_rec.status = 'f' THEN 'failed'
                                  ELSE 'in_progress' END;
                v_counted := @extschema@._idem_count('reservations_' || v_outcome);
                RETURN ROW(v_outcome, NULL,
                           CASE WHEN v_outcome IN ('replay', 'failed') THEN v_rec.response END,
                           coalesce(v_rec.attempts, 0), v_rec.expires_at, NULL, NULL)::@extschema@.idem_reservation;
            END IF;
        END IF;

        -- Absent, expired and free to take over, or to resume. A live retry counter keeps a
        -- released key its owner's (guarantee 8): another role may not start an attempt that
        -- would count toward it, or reset it.
        IF v_rec.counter_expires_at > v_now THEN
            v_counted := @extschema@._idem_check_owner(v_rec.counter_owner, 'reserve a key');
        END IF;
        -- A new attempt would start now, and write.
        v_counted := @extschema@._idem_require_writable('reserve a key');
        IF NOT v_locked THEN
            -- Keep the key's lock until the transaction ends while this transaction keeps fewer
            -- than half of max_locks_per_transaction less one (the "past its budget" lock's
            -- slot), counted in a transaction-local setting.
            v_kept := coalesce(nullif(current_setting('idem_portable.kept_locks', true), '')::integer, 0);
            v_keep := v_kept < current_setting('max_locks_per_transaction')::integer / 2 - 1;
        END IF;
        IF NOT v_locked AND v_keep THEN
            IF wait THEN
                PERFORM pg_advisory_xact_lock(
                    hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0));
            ELSIF NOT pg_try_advisory_xact_lock(
                    hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0)) THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL, NULL, NULL)::@extschema@.idem_reservation;
            END IF;
            PERFORM set_config('idem_portable.kept_locks', (v_kept + 1)::text, true);
            v_locked := true;
            IF wait THEN
                CONTINUE; -- the holder may have committed while we waited: read again
            END IF;
        ELSIF NOT v_locked THEN
            -- Past the budget: say so to every other transaction (held until this one ends),
            -- then probe the key's lock for an instant, taken and given back in one expression.
            PERFORM pg_advisory_xact_lock_shared(1768189296, 1);
            v_hash := hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0);
            IF wait THEN
                -- Wait for the holder, if any, to end; then read again.
                PERFORM pg_advisory_lock(v_hash), pg_advisory_unlock(v_hash);
                v_locked := true;
                CONTINUE;
            ELSIF NOT (pg_try_advisory_lock(v_hash) AND pg_advisory_unlock(v_hash)) THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL, NULL, NULL)::@extschema@.idem_reservation;
            END IF;
        END IF;

        v_locked := true;
        -- After the update from 0.6.0, the key's record may still be in idem_records_060: moved
        -- now (under the key's lock, so no reservation of the key runs meanwhile), then read
        -- again. NULL: no old table, nothing to do.
        IF NOT v_adopted THEN
            v_adopted := true;
            v_found := @extschema@._idem_adopt(operation, user_id, key, wait);
            IF NOT v_found THEN
                -- Another transaction holds the key's old row (moving it, or completing it).
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, coalesce(v_attempts, 0), NULL, NULL, NULL)::@extschema@.idem_reservation;
            ELSIF v_found THEN
                CONTINUE;
            END IF;
        END IF;
        v_token := nextval('@extschema@.idem_token_seq');
        v_owner := @extschema@._idem_caller();
        IF v_resume THEN
            v_answer := @extschema@._idem_resume_locked(operation, user_id, key, request_hash, v_token, v_lease);
            -- (Not v_answer IS NOT NULL: a row is NOT NULL only when every column is.)
            IF v_answer.outcome IS NOT NULL THEN
                RETURN v_answer;
            END IF;
            CONTINUE; -- the record changed since it was read: read it again
        END IF;
        -- The retry counter, if one is live: this attempt continues its count, and its record
        -- carries it (so a replay answers from the record alone). (A statement of its own, not
        -- a subquery in the write: Citus cannot route a subquery inside INSERT or UPDATE on a
        -- distributed table.)
        SELECT t.attempts INTO v_attempts
          FROM @extschema@.idem_retries AS t
         WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
           AND t.expires_at > v_now;
        v_attempts := coalesce(v_attempts, 0);
        v_busy := false;
        IF NOT wait AND v_rec.status IS NULL THEN
            -- Does another transaction hold the "past its budget" lock? Probed up to three times
            -- (another call's probe holds it for an instant too).
            v_busy := true;
            FOR probe IN 1..3 LOOP
                IF pg_try_advisory_lock(1768189296, 1) AND pg_advisory_unlock(1768189296, 1) THEN
                    v_busy := false;
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        IF v_busy THEN
            -- It may hold this key by an uncommitted row: an insert that gives up instead of
            -- waiting (one subtransaction, only while such a transaction is open).
            v_found := @extschema@._idem_write_nowait(operation, user_id, key, request_hash, v_token,
                                                      v_now, v_now + v_lease, v_now + v_ttl, v_attempts);
            IF v_found IS NULL THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL, NULL, NULL)::@extschema@.idem_reservation;
            END IF;
        ELSIF v_rec.status IS NULL THEN
            INSERT INTO @extschema@.idem_records AS r
                   (id, operation, user_id, key, request_hash, status, token, response,
                    lease_expires_at, expires_at, created_at, updated_at, owner, attempts)
            VALUES (v_id, operation, user_id, key, v_stored, 'p', v_token, NULL,
                    v_now + v_lease, v_now + v_ttl, v_now, v_now, v_owner, v_attempts)
            ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING;
        ELSE
            UPDATE @extschema@.idem_records AS r
               SET request_hash = v_stored, status = 'p', token = v_token,
                   response = NULL, lease_expires_at = v_now + v_lease,
                   expires_at = v_now + v_ttl, created_at = v_now, updated_at = v_now,
                   owner = v_owner, attempts = v_attempts, step = NULL, state = NULL
             WHERE r.id = v_id AND r.operation = operation AND r.user_id = user_id AND r.key = key
               AND r.expires_at <= v_now
               AND (r.status <> 'p' OR r.lease_expires_at <= v_now);
        END IF;
        IF NOT v_busy THEN
            v_found := FOUND;
        END IF;
        IF v_found THEN
            IF v_attempts > 0 THEN
                -- A retry of a released key: keep its counter alive as long as this record.
                UPDATE @extschema@.idem_retries AS t
                   SET expires_at = greatest(t.expires_at, v_now + v_ttl)
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key;
            END IF;
            v_counted := @extschema@._idem_count('reservations_created');
            RETURN ROW('created', v_token, NULL, v_attempts, v_now + v_ttl, NULL, NULL)::@extschema@.idem_reservation;
        END IF;
        -- Lost a race with a commit, a takeover, a recovery or a sweep: read the key again.
    END LOOP;
    -- The key kept changing under us; answer as a busy key so the caller retries later, with
    -- the transient failures counted for it so far (as every other answer).
    SELECT t.attempts INTO v_attempts
      FROM @extschema@.idem_retries AS t
     WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
       AND t.expires_at > clock_timestamp();
    v_counted := @extschema@._idem_count('reservations_in_progress');
    RETURN ROW('in_progress', NULL, NULL, coalesce(v_attempts, 0), NULL, NULL, NULL)::@extschema@.idem_reservation;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_reserve(text, text, text, text, interval, interval, boolean) IS
    'Reserves (operation, user_id, key) for one attempt. outcome: created (token to complete with), resume (token, and the step and state of the last recovery point to continue from), replay (stored response), failed, in_progress, or mismatch (the key was used with another request_hash). Call in the transaction of the business write.';

-- A batch: idem_reserve for each key of one operation and user, in input order, in one
-- statement. Each key is reserved exactly as by its own idem_reserve call, one after the other,
-- so a key repeated in the batch answers as a repeated call would (in_progress, or mismatch
-- under another request_hash: its first occurrence holds it). No key is reserved when an array
-- breaks the batch rules; a key that breaks the key rules raises idem_reserve's error, and the
-- statement's reservations roll back with it.
CREATE FUNCTION @extschema@.idem_reserve_many(
    operation      text,
    user_id        text,
    keys           text[],
    request_hashes text[],
    ttl            interval DEFAULT NULL,
    lease          interval DEFAULT NULL,
    wait           boolean  DEFAULT false)
    RETURNS TABLE (key text, outcome text, token bigint, response jsonb, attempts integer,
                   expires_at timestamptz, step integer, state jsonb)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_n integer;
BEGIN
    IF NOT (@extschema@._idem_check_scope(operation, user_id, 'k')
            AND @extschema@._idem_require('wait', wait IS NULL)) THEN
        RETURN; -- not reached: a failed check raises
    END IF;
    v_n := @extschema@._idem_check_array('keys', keys, NULL, NULL, false);
    PERFORM @extschema@._idem_check_array('request_hashes', request_hashes, 'keys', v_n, false);
    -- One idem_reserve per element, evaluated in input order (OFFSET 0 keeps the call in the
    -- subquery: once per row, whatever the outer query reads of its result).
    RETURN QUERY
    SELECT s.k, (s.r).outcome, (s.r).token, (s.r).response, (s.r).attempts, (s.r).expires_at,
           (s.r).step, (s.r).state
      FROM (SELECT u.i, u.k,
                   @extschema@.idem_reserve(idem_reserve_many.operation, idem_reserve_many.user_id,
                                            u.k, u.h, idem_reserve_many.ttl,
                                            idem_reserve_many.lease, idem_reserve_many.wait) AS r
              FROM unnest(idem_reserve_many.keys, idem_reserve_many.request_hashes)
                   WITH ORDINALITY AS u(k, h, i)
             ORDER BY u.i
            OFFSET 0) AS s
     ORDER BY s.i;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean) IS
    'Reserves many keys of one operation and user in one statement: one row per element of keys, in input order, each answered as idem_reserve(operation, user_id, keys[i], request_hashes[i], ttl, lease, wait) would answer it. keys and request_hashes: equal lengths, no NULL element.';
