-- idempotency, portable install: the argument rules in PL/pgSQL, replacing the native functions
-- of the same names and signatures in sql/internal.sql (extension/src/args.rs). The extension
-- never loads this file; the test suite runs both against the same generated inputs
-- (tests/tests/args_parity.rs) and the same regress and isolation suites.

CREATE FUNCTION @extschema@._idem_check_part(name text, value text, forbid_controls boolean)
    RETURNS boolean
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
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_part(text, text, boolean) IS
    'Internal (portable install): true, or 22004/22023 naming the argument when a key part or request_hash breaks the input rules.';

CREATE FUNCTION @extschema@._idem_check_scope(operation text, user_id text, key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT @extschema@._idem_check_part('operation', operation, true)
       AND @extschema@._idem_check_part('user_id', user_id, true)
       AND @extschema@._idem_check_part('key', key, true)
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_scope(text, text, text) IS
    'Internal: true, or 22004/22023 naming the first of operation, user_id, key that breaks the input rules.';

CREATE FUNCTION @extschema@._idem_check_request_hash(request_hash text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT @extschema@._idem_check_part('request_hash', request_hash, false)
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_request_hash(text) IS
    'Internal: true, or 22004/22023 when request_hash is NULL or not 1 to 255 bytes.';

CREATE FUNCTION @extschema@._idem_require(name text, is_null boolean) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF is_null IS NOT false THEN
        RAISE EXCEPTION '% must not be NULL', name USING ERRCODE = '22004';
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_require(text, boolean) IS
    'Internal: true, or 22004 naming the argument when a required argument is NULL.';

-- A duration setting: its value, or the documented default when it is unset, empty or reset; an
-- invalid one is 22023 naming the setting.
CREATE FUNCTION @extschema@._idem_setting_interval(name text, fallback interval) RETURNS interval
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v text := nullif(current_setting('idempotency.' || name, true), '');
BEGIN
    IF v IS NULL THEN
        RETURN fallback;
    END IF;
    -- A bare number is seconds, as for the extension's setting.
    RETURN CASE WHEN v ~ '^[0-9]+$' THEN make_interval(secs => v::double precision) ELSE v::interval END;
EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR interval_field_overflow THEN
    RAISE EXCEPTION 'idempotency.% must be a duration, got %', name, quote_literal(left(v, 32))
        USING ERRCODE = '22023';
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_setting_interval(text, interval) IS
    'Internal (portable install): idempotency.ttl or .lease as an interval, the default when unset or empty.';

CREATE FUNCTION @extschema@._idem_checked_interval(name text, value interval) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF value <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval, got %', name, value USING ERRCODE = '22023';
    END IF;
    IF value > interval '1000 years' THEN
        RAISE EXCEPTION '% must be at most 1000 years, got %', name, value USING ERRCODE = '22023';
    END IF;
    RETURN value;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_checked_interval(text, interval) IS
    'Internal (portable install): an explicit ttl or lease; 22023 unless positive and at most 1000 years.';

CREATE FUNCTION @extschema@._idem_ttl(ttl interval) RETURNS interval
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN ttl IS NULL THEN @extschema@._idem_setting_interval('ttl', interval '1 day')
                ELSE @extschema@._idem_checked_interval('ttl', ttl) END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_ttl(interval) IS
    'Internal: an explicit ttl (22023 unless positive and at most 1000 years) or idempotency.ttl.';

CREATE FUNCTION @extschema@._idem_lease(lease interval, ttl interval) RETURNS interval
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v interval;
BEGIN
    IF lease IS NULL THEN
        v := @extschema@._idem_setting_interval('lease', interval '5 minutes');
        RETURN CASE WHEN ttl IS NOT NULL AND v > ttl THEN ttl ELSE v END;
    END IF;
    v := @extschema@._idem_checked_interval('lease', lease);
    IF v > ttl THEN
        RAISE EXCEPTION 'lease must not exceed ttl, got lease % and ttl %', v, ttl USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_lease(interval, interval) IS
    'Internal: an explicit lease (22023 unless positive, at most 1000 years and at most ttl) or idempotency.lease capped at ttl; ttl NULL means no cap.';

CREATE FUNCTION @extschema@._idem_max_retries(max_retries integer) RETURNS integer
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v text;
BEGIN
    IF max_retries IS NOT NULL THEN
        IF max_retries < 1 THEN
            RAISE EXCEPTION 'max_retries must be at least 1, got %', max_retries USING ERRCODE = '22023';
        END IF;
        RETURN max_retries;
    END IF;
    v := nullif(current_setting('idempotency.max_retries', true), '');
    IF v IS NULL THEN
        RETURN 3;
    END IF;
    IF v !~ '^[0-9]{1,9}$' OR v::integer < 1 THEN
        RAISE EXCEPTION 'idempotency.max_retries must be an integer of at least 1, got %', quote_literal(left(v, 32))
            USING ERRCODE = '22023';
    END IF;
    RETURN v::integer;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_max_retries(integer) IS
    'Internal: an explicit max_retries (22023 below 1) or idempotency.max_retries.';
