-- idempotency, portable build only: the settings without the native library. Replaces the
-- LANGUAGE c functions of the same signatures (scripts/sqlbuild.py; comments and privileges
-- come from sql/ unchanged).
--
-- Without the library PostgreSQL keeps `idempotency.*` as plain placeholder strings, so the
-- defaults (registered by extension/src/guc.rs) are spelled here;
-- xtask/src/layers/portable.rs checks them against the extension's.

CREATE FUNCTION @extschema@._idem_setting(name text) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT coalesce(nullif(current_setting(name, true), ''),
                    CASE name WHEN 'idempotency.ttl' THEN '1d'
                              WHEN 'idempotency.lease' THEN '5min'
                              WHEN 'idempotency.max_retries' THEN '3'
                              WHEN 'idempotency.max_response_bytes' THEN '1MB' END)
$fn$;

-- idempotency.max_response_bytes as the extension's integer setting (unit bytes) reads it.
CREATE FUNCTION @extschema@._idem_max_response_bytes() RETURNS integer
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v     text := @extschema@._idem_setting('idempotency.max_response_bytes');
    parts text[] := regexp_match(v, '^[[:space:]]*([0-9]+)[[:space:]]*(B|kB|MB|GB|TB)?[[:space:]]*$');
    n     numeric := parts[1]::numeric * CASE parts[2] WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
                                                       WHEN 'GB' THEN 1073741824 WHEN 'TB' THEN 1099511627776
                                                       ELSE 1 END;
BEGIN
    IF n IS NULL OR n > 2147483647 THEN
        RAISE EXCEPTION 'invalid value for parameter "idempotency.max_response_bytes": %',
            @extschema@._idem_echo(v) USING ERRCODE = '22023',
            HINT = 'Use a number of bytes up to 2147483647, optionally with a unit: B, kB, MB, GB or TB.';
    END IF;
    RETURN n;
END
$fn$;
