-- idempotency 0.1.0: internal helpers (not API; EXECUTE revoked from PUBLIC in privileges.sql).

CREATE FUNCTION @extschema@._idem_setting(name text) RETURNS text
    LANGUAGE c VOLATILE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_setting_wrapper';

COMMENT ON FUNCTION @extschema@._idem_setting(text) IS
    'Internal: loads the library (which defines the idempotency.* settings) and returns a setting''s current value.';

CREATE FUNCTION @extschema@._idem_max_response_bytes() RETURNS integer
    LANGUAGE c VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_max_response_bytes_wrapper';

COMMENT ON FUNCTION @extschema@._idem_max_response_bytes() IS
    'Internal: idempotency.max_response_bytes in bytes.';

-- Raises the documented error for a bad text argument. Called only once a cheap combined check
-- in the API function has failed, so the happy path pays for one expression, not for this call.
CREATE FUNCTION @extschema@._idem_check_text(name text, value text, forbid_controls boolean)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', name USING ERRCODE = '22004';
    END IF;
    IF octet_length(value) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '% must be 1 to 255 bytes, got %', name, octet_length(value)
            USING ERRCODE = '22023';
    END IF;
    IF forbid_controls AND value ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        RAISE EXCEPTION '% must not contain control characters (U+0000-U+001F, U+007F-U+009F), found one at byte %',
            name, octet_length(substring(value FROM E'^[^\\x01-\\x1f\\x7f-\\x9f]*'))
            USING ERRCODE = '22023';
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_text(text, text, boolean) IS
    'Internal: raises 22004/22023 naming the argument when a key part or request_hash breaks the input rules.';

CREATE FUNCTION @extschema@._idem_check_scope(operation text, user_id text, key text)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    PERFORM @extschema@._idem_check_text('operation', operation, true);
    PERFORM @extschema@._idem_check_text('user_id', user_id, true);
    PERFORM @extschema@._idem_check_text('key', key, true);
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_scope(text, text, text) IS
    'Internal: raises the documented error for a bad operation, user_id or key.';

-- Raises 22004 for a NULL where the API needs a value.
CREATE FUNCTION @extschema@._idem_require(name text, is_null boolean) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF is_null THEN
        RAISE EXCEPTION '% must not be NULL', name USING ERRCODE = '22004';
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_require(text, boolean) IS
    'Internal: raises 22004 naming the argument when a required argument is NULL.';

-- batch_size of the maintenance functions: non-NULL (22004) and at least 1 (22023).
CREATE FUNCTION @extschema@._idem_check_batch_size(batch_size integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    PERFORM @extschema@._idem_require('batch_size', batch_size IS NULL);
    IF batch_size < 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1, got %', batch_size USING ERRCODE = '22023';
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_batch_size(integer) IS
    'Internal: raises 22004/22023 for a NULL or non-positive batch_size.';

-- How an error message shows a rejected word: quoted when short, only its size otherwise, so
-- a huge argument is never echoed.
CREATE FUNCTION @extschema@._idem_echo(value text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN octet_length(value) <= 32 THEN quote_literal(value)
                ELSE format('a %s-byte value', octet_length(value)) END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_echo(text) IS
    'Internal: a rejected argument as error messages show it (quoted if at most 32 bytes, else its size).';

-- The interval settings, with NULL meaning the GUC default; positive or 22023.
CREATE FUNCTION @extschema@._idem_interval(name text, value interval) RETURNS interval
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v interval := coalesce(value,
                           current_setting('idempotency.' || name, true)::interval,
                           @extschema@._idem_setting('idempotency.' || name)::interval);
BEGIN
    IF v <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval, got %', name, v USING ERRCODE = '22023';
    END IF;
    -- Far beyond any real use, and short of timestamptz overflow (which would be 22008).
    IF v > interval '1000 years' THEN
        RAISE EXCEPTION '% must be at most 1000 years, got %', name, v USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_interval(text, interval) IS
    'Internal: an explicit ttl or lease, or its idempotency.* default; raises 22023 unless positive and at most 1000 years.';

CREATE FUNCTION @extschema@._idem_max_retries(value integer) RETURNS integer
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v integer := coalesce(value,
                          current_setting('idempotency.max_retries', true)::integer,
                          @extschema@._idem_setting('idempotency.max_retries')::integer);
BEGIN
    IF v < 1 THEN
        RAISE EXCEPTION 'max_retries must be at least 1, got %', v USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_max_retries(integer) IS
    'Internal: an explicit max_retries or idempotency.max_retries; raises 22023 below 1.';

-- ttl and lease as idem_reserve uses them: explicit values or the GUC defaults, validated; a
-- defaulted lease is capped at the ttl, an explicit one longer than the ttl is an error.
CREATE FUNCTION @extschema@._idem_durations(ttl interval, lease interval,
                                            OUT settled_ttl interval, OUT settled_lease interval)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    settled_ttl := @extschema@._idem_interval('ttl', ttl);
    IF lease IS NULL THEN
        settled_lease := least(@extschema@._idem_interval('lease', NULL), settled_ttl);
    ELSE
        settled_lease := @extschema@._idem_interval('lease', lease);
        IF settled_lease > settled_ttl THEN
            RAISE EXCEPTION 'lease must not exceed ttl, got lease % and ttl %', settled_lease, settled_ttl
                USING ERRCODE = '22023';
        END IF;
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_durations(interval, interval) IS
    'Internal: the ttl and lease of a reservation (GUC defaults, lease capped at the ttl); raises 22023 for bad values.';

-- A transient failure of the attempt whose PROCESSING record the caller has locked: count it in
-- the retry counter, then poison the record at max_retries or delete it so a retry runs again.
-- Shared by idem_release and idem_recover_stuck(action => 'release').
CREATE FUNCTION @extschema@._idem_release_locked(
    operation text, user_id text, key text, created_at timestamptz, expires_at timestamptz,
    max_retries integer)
    RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_attempts integer;
    v_counted  boolean; -- receives _idem_count
BEGIN
    -- A counter that expired before this record was created belongs to an earlier life of the
    -- key: start again from 1.
    INSERT INTO @extschema@.idem_retries AS t (operation, user_id, key, attempts, expires_at)
    VALUES (operation, user_id, key, 1, expires_at)
    ON CONFLICT ON CONSTRAINT idem_retries_pkey DO UPDATE
        SET attempts   = CASE WHEN t.expires_at > created_at THEN t.attempts + 1 ELSE 1 END,
            expires_at = greatest(t.expires_at, excluded.expires_at)
    RETURNING t.attempts INTO v_attempts;

    IF v_attempts >= max_retries THEN
        UPDATE @extschema@.idem_records AS r
           SET status = 'FAILED', updated_at = v_now
         WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
        v_counted := @extschema@._idem_count('poisonings');
        RETURN 'poisoned';
    END IF;
    DELETE FROM @extschema@.idem_records AS r
     WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
    v_counted := @extschema@._idem_count('releases');
    RETURN 'released';
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer) IS
    'Internal: counts a transient failure of a locked PROCESSING record, then poisons (FAILED) or deletes it.';
