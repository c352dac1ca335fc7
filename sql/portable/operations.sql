-- idempotency, portable build only: the counters without shared memory. Replaces the LANGUAGE c
-- functions of the same signatures in sql/operations.sql; their comments and privileges come from
-- sql/ unchanged. The portable install cannot be preloaded, so it counts nothing and
-- idem_metrics() says so, exactly as the extension does when it is not preloaded.

CREATE FUNCTION @extschema@._idem_count(event text, n bigint DEFAULT 1) RETURNS boolean
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$ SELECT false $fn$;

CREATE FUNCTION @extschema@.idem_metrics() RETURNS TABLE (name text, value bigint)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    RAISE EXCEPTION 'idem_metrics() needs the idempotency library preloaded: its counters live in shared memory reserved at server start'
        USING ERRCODE = '55000',
              HINT = 'The portable install has no library and counts nothing; the extension counts with shared_preload_libraries = ''idempotency''.';
END
$fn$;
