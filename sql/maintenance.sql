-- idempotency: recovery of stuck attempts and the sweep of expired records.
--
-- Both work in batches over partial indexes, lock with SKIP LOCKED (never waiting on, nor touching,
-- a row a live transaction holds), and re-check every condition on the locked row version, so
-- they are safe to run concurrently with themselves and with traffic.
--
-- On Citus (idem_records distributed, _idem_distributed()) a read across shards cannot lock rows,
-- so both work key by key: a plain read across shards picks the batch's candidates, then each key
-- is locked by a single-shard SELECT ... FOR UPDATE SKIP LOCKED that re-checks the conditions, and
-- changed by a single-shard statement. Same rules, one round trip to the key's node per statement.

CREATE FUNCTION @extschema@.idem_recover_stuck(
    batch_size  integer DEFAULT 100,
    action      text    DEFAULT 'fail',
    max_retries integer DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now timestamptz := clock_timestamp();
    v_max integer;
    v_n       bigint := 0;
    v_rec     record;
    v_key     record;
    v_counted boolean; -- receives _idem_count
BEGIN
    PERFORM @extschema@._idem_check_batch_size(batch_size);
    PERFORM @extschema@._idem_require('action', action IS NULL);
    IF action NOT IN ('fail', 'release') THEN
        RAISE EXCEPTION 'action must be ''fail'' or ''release'', got %',
            @extschema@._idem_echo(action)
            USING ERRCODE = '22023';
    END IF;
    v_max := @extschema@._idem_max_retries(max_retries);
    v_counted := @extschema@._idem_require_writable('recover stuck reservations');
    -- Stuck records kept from 0.6.0 and not moved yet: moved first, then recovered below.
    PERFORM @extschema@._idem_legacy_batch(batch_size, 'stuck');

    IF @extschema@._idem_distributed() THEN
        -- Citus: candidates by a plain read across shards, then key by key (see above).
        FOR v_key IN
            SELECT r.id, r.operation, r.user_id, r.key
              FROM @extschema@.idem_records AS r
             WHERE r.status = 'p' AND r.lease_expires_at <= v_now
             ORDER BY r.lease_expires_at
             LIMIT batch_size
        LOOP
            SELECT r.created_at, r.expires_at, r.step INTO v_rec
              FROM @extschema@.idem_records AS r
             WHERE r.id = v_key.id AND r.operation = v_key.operation AND r.user_id = v_key.user_id
               AND r.key = v_key.key AND r.status = 'p' AND r.lease_expires_at <= v_now
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND; -- completed, recovered or taken over meanwhile, or held
            IF action = 'fail' AND v_rec.step IS NULL THEN
                UPDATE @extschema@.idem_records AS r
                   SET status = 'f', updated_at = v_now
                 WHERE r.id = v_key.id AND r.operation = v_key.operation AND r.user_id = v_key.user_id AND r.key = v_key.key;
            ELSE
                PERFORM @extschema@._idem_release_locked(v_key.operation, v_key.user_id, v_key.key,
                                                         v_rec.created_at, v_rec.expires_at, v_max);
            END IF;
            v_n := v_n + 1;
        END LOOP;
        v_counted := @extschema@._idem_count('recovered', v_n);
        RETURN v_n;
    END IF;

    IF action = 'fail' THEN
        -- At most once: the dead worker may have done the work, so never run it again. A key
        -- with a recovery point is left to the loop below.
        WITH stuck AS (
            SELECT r.id
              FROM @extschema@.idem_records AS r
             WHERE r.status = 'p' AND r.lease_expires_at <= v_now AND r.step IS NULL
             ORDER BY r.lease_expires_at
             LIMIT batch_size
               FOR UPDATE SKIP LOCKED)
        UPDATE @extschema@.idem_records AS r
           SET status = 'f', updated_at = v_now
          FROM stuck AS s
         WHERE r.id = s.id;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;

    -- 'release', and a key with a recovery point whatever the action: each stuck attempt is a
    -- transient failure, exactly as idem_release counts it (_idem_release_locked: a key with a
    -- recovery point becomes RESUMABLE, never FAILED below max_retries: the work is known up to
    -- that point, and what came after it either rolled back or called out with a derived key).
    FOR v_rec IN
        SELECT r.operation, r.user_id, r.key, r.created_at, r.expires_at
          FROM @extschema@.idem_records AS r
         WHERE r.status = 'p' AND r.lease_expires_at <= v_now
           AND (action = 'release' OR r.step IS NOT NULL)
         ORDER BY r.lease_expires_at
         LIMIT batch_size - v_n
           FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM @extschema@._idem_release_locked(v_rec.operation, v_rec.user_id, v_rec.key,
                                                 v_rec.created_at, v_rec.expires_at, v_max);
        v_n := v_n + 1;
    END LOOP;
    v_counted := @extschema@._idem_count('recovered', v_n);
    RETURN v_n;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_recover_stuck(integer, text, integer) IS
    'Handles up to batch_size PROCESSING records whose lease expired (skipping rows locked by live transactions): action ''fail'' marks them FAILED, ''release'' counts a transient failure as idem_release does; a record with a recovery point is counted and kept RESUMABLE (or poisoned at max_retries) whatever the action. Returns how many.';

CREATE FUNCTION @extschema@.idem_sweep(batch_size integer DEFAULT 1000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    -- The expiry index's key (idem_records_expiry_idx): the buckets up to now's, expires_at
    -- re-checked on each row.
    v_bucket   integer := @extschema@._idem_expiry_bucket(v_now);
    v_records  bigint;
    v_counters bigint := 0;
    v_legacy   bigint;
    v_key      record;
    v_counted  boolean; -- receives _idem_count
BEGIN
    PERFORM @extschema@._idem_check_batch_size(batch_size);
    v_counted := @extschema@._idem_require_writable('sweep expired records');
    -- Expired records kept from 0.6.0 and not moved yet: deleted, counted as swept. While any
    -- is left, no retry counter is swept (an old record's move reads its counter).
    v_legacy := @extschema@._idem_legacy_batch(batch_size, 'expired');

    IF @extschema@._idem_distributed() THEN
        -- Citus: candidates by a plain read across shards, then key by key (see above).
        v_records := 0;
        FOR v_key IN
            SELECT x.id, x.operation, x.user_id, x.key
              FROM @extschema@.idem_records AS x
             WHERE x.status <> 'p' AND @extschema@._idem_expiry_bucket(x.expires_at) <= v_bucket
               AND x.expires_at <= v_now
             LIMIT batch_size
        LOOP
            PERFORM FROM @extschema@.idem_records AS r
             WHERE r.id = v_key.id AND r.operation = v_key.operation AND r.user_id = v_key.user_id
               AND r.key = v_key.key AND r.status <> 'p' AND r.expires_at <= v_now
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            DELETE FROM @extschema@.idem_records AS r
             WHERE r.id = v_key.id AND r.operation = v_key.operation AND r.user_id = v_key.user_id
               AND r.key = v_key.key AND r.status <> 'p' AND r.expires_at <= v_now;
            v_records := v_records + 1;
        END LOOP;
        IF v_records < batch_size THEN
            -- The correlated NOT EXISTS joins on the distribution column: Citus runs it shard by shard.
            FOR v_key IN
                SELECT x.operation, x.user_id, x.key
                  FROM @extschema@.idem_retries AS x
                 WHERE x.expires_at <= v_now
                   AND NOT EXISTS (
                       SELECT FROM @extschema@.idem_records AS r
                        WHERE r.id = @extschema@._idem_id(x.operation, x.user_id, x.key)
                          AND r.operation = x.operation AND r.user_id = x.user_id AND r.key = x.key
                          AND r.created_at < x.expires_at)
                 LIMIT batch_size - v_records
            LOOP
                PERFORM FROM @extschema@.idem_retries AS t
                 WHERE t.operation = v_key.operation AND t.user_id = v_key.user_id AND t.key = v_key.key
                   AND t.expires_at <= v_now
                   FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                DELETE FROM @extschema@.idem_retries AS t
                 WHERE t.operation = v_key.operation AND t.user_id = v_key.user_id AND t.key = v_key.key
                   AND t.expires_at <= v_now;
                v_counters := v_counters + 1;
            END LOOP;
        END IF;
        v_counted := @extschema@._idem_count('swept', v_records + v_counters);
        RETURN v_records + v_counters;
    END IF;

    -- Lock a batch (skipping rows live transactions hold), then delete it by ctid with a TID
    -- scan, re-checking the conditions on the row version being deleted: a row taken over since
    -- the scan is a newer version and no longer matches.
    DELETE FROM @extschema@.idem_records AS r
     WHERE r.ctid = ANY (ARRAY(
               SELECT x.ctid
                 FROM @extschema@.idem_records AS x
                WHERE x.status <> 'p' AND @extschema@._idem_expiry_bucket(x.expires_at) <= v_bucket
                  AND x.expires_at <= v_now
                LIMIT batch_size - coalesce(v_legacy, 0)
                  FOR UPDATE OF x SKIP LOCKED))
       AND r.status <> 'p' AND r.expires_at <= v_now;
    GET DIAGNOSTICS v_records = ROW_COUNT;
    v_records := v_records + coalesce(v_legacy, 0);

    -- Retry counters: expired, and no remaining record was created while the counter was live.
    IF v_records < batch_size AND v_legacy IS NULL THEN
        DELETE FROM @extschema@.idem_retries AS t
         WHERE t.ctid = ANY (ARRAY(
                   SELECT x.ctid
                     FROM @extschema@.idem_retries AS x
                    WHERE x.expires_at <= v_now
                      AND NOT EXISTS (
                          SELECT FROM @extschema@.idem_records AS r
                           WHERE r.id = @extschema@._idem_id(x.operation, x.user_id, x.key)
                             AND r.operation = x.operation AND r.user_id = x.user_id AND r.key = x.key
                             AND r.created_at < x.expires_at)
                    LIMIT batch_size - v_records
                      FOR UPDATE OF x SKIP LOCKED))
           AND t.expires_at <= v_now;
        GET DIAGNOSTICS v_counters = ROW_COUNT;
    END IF;
    v_counted := @extschema@._idem_count('swept', v_records + v_counters);
    RETURN v_records + v_counters;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_sweep(integer) IS
    'Deletes up to batch_size expired SUCCESS/FAILED/RESUMABLE records, then expired retry counters no remaining record needs. Returns how many rows it deleted. Safe to run concurrently with itself and with traffic.';

-- The records kept from 0.6.0 (docs/record-layout.md, "The update from 0.6.0"; docs/upgrading.md):
-- one batch of idem_records_060 moved into idem_records (PROCESSING first, finished expired ones
-- deleted), rows live transactions hold skipped. Once the old table is empty it is dropped, under
-- a short lock_timeout (a transaction still holding it, such as a call that moved a key of it and
-- has not committed, makes the drop wait for the next call instead). The maintenance worker calls
-- it each pass while the old table exists, and idem_maintain; without either, call it until it
-- answers 0 (docs/upgrading.md). Returns how many rows left the old table; 0 once it is gone.
CREATE FUNCTION @extschema@.idem_move_records(batch_size integer DEFAULT 10000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_n       bigint;
    v_counted boolean; -- receives _idem_count
BEGIN
    PERFORM @extschema@._idem_check_batch_size(batch_size);
    v_counted := @extschema@._idem_require_writable('move records');
    v_n := @extschema@._idem_legacy_batch(batch_size, 'any');
    IF v_n IS NULL THEN
        RETURN 0; -- no old table (a fresh install, or the move is over)
    END IF;
    IF v_n > 0 THEN
        RETURN v_n;
    END IF;
    -- Empty, or every row left is held by a live transaction. Nothing inserts into the old
    -- table after the update, so it is checked empty under SHARE, which only a call moving a row
    -- of it waits for (its DELETE; a call whose key has no row there takes ROW SHARE): the check
    -- scans the emptied heap, 0.8 s over 10M dead rows (docs/performance.md), and held ACCESS
    -- EXCLUSIVE that long stalled every call. SHARE kept, no row can leave or come in until the
    -- drop, whose ACCESS EXCLUSIVE then waits only for the transactions that read the table.
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        LOCK TABLE @extschema@.idem_records_060 IN SHARE MODE;
        IF NOT EXISTS (SELECT FROM @extschema@.idem_records_060) THEN
            -- No call between its look at the table and its transaction's end (_idem_adopt).
            PERFORM pg_advisory_xact_lock(1768189296, 60);
            LOCK TABLE @extschema@.idem_records_060 IN ACCESS EXCLUSIVE MODE;
            DROP TABLE @extschema@.idem_records_060;
            RAISE LOG 'idempotency: every record kept from 0.6.0 is in idem_records; idem_records_060 dropped';
        END IF;
    EXCEPTION WHEN lock_not_available OR undefined_table THEN
        NULL; -- in use (tried again by the next call), or dropped meanwhile
    END;
    RETURN 0;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_move_records(integer) IS
    'After the update from 0.6.0: moves up to batch_size records kept in idem_records_060 into idem_records (PROCESSING first; finished expired ones deleted), and drops idem_records_060 once it is empty. Returns how many rows left the old table: call it until it answers 0 (the maintenance worker and idem_maintain do). Not granted to PUBLIC.';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_move_records(integer) FROM PUBLIC;
