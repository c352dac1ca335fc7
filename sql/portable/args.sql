-- idempotency, portable build only: the argument rules in PL/pgSQL. Replaces the LANGUAGE c
-- functions of the same signatures in sql/internal.sql (extension/src/args.rs); their comments
-- and privileges come from sql/ unchanged. tests/tests/args_parity.rs proves both answer alike.

CREATE FUNCTION @extschema@._idem_check_scope(operation text, user_id text, key text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT @extschema@._idem_check_part('operation', operation, true)
       AND @extschema@._idem_check_part('user_id', user_id, true)
       AND @extschema@._idem_check_part('key', key, true)
$fn$;

CREATE FUNCTION @extschema@._idem_check_request_hash(request_hash text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT @extschema@._idem_check_part('request_hash', request_hash, false)
$fn$;

CREATE FUNCTION @extschema@._idem_check_step(step integer) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF step IS NULL THEN
        RAISE EXCEPTION 'step must not be NULL' USING ERRCODE = '22004';
    END IF;
    IF step < 0 THEN
        RAISE EXCEPTION 'step must be at least 0, got %', step USING ERRCODE = '22023';
    END IF;
    RETURN true;
END
$fn$;

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

CREATE FUNCTION @extschema@._idem_ttl(ttl interval) RETURNS interval
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN ttl IS NULL THEN @extschema@._idem_conf('ttl')::interval
                ELSE @extschema@._idem_checked_interval('ttl', ttl) END
$fn$;

CREATE FUNCTION @extschema@._idem_lease(lease interval, ttl interval) RETURNS interval
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v interval;
BEGIN
    IF lease IS NULL THEN
        v := @extschema@._idem_conf('lease')::interval;
        RETURN CASE WHEN ttl IS NOT NULL AND v > ttl THEN ttl ELSE v END;
    END IF;
    v := @extschema@._idem_checked_interval('lease', lease);
    IF v > ttl THEN
        RAISE EXCEPTION 'lease must not exceed ttl, got lease % and ttl %', v, ttl USING ERRCODE = '22023';
    END IF;
    RETURN v;
END
$fn$;

CREATE FUNCTION @extschema@._idem_max_retries(max_retries integer) RETURNS integer
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF max_retries < 1 THEN
        RAISE EXCEPTION 'max_retries must be at least 1, got %', max_retries USING ERRCODE = '22023';
    END IF;
    RETURN coalesce(max_retries, @extschema@._idem_conf('max_retries')::integer);
END
$fn$;
