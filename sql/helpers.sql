-- idempotency: fingerprints and the operators' views.

CREATE FUNCTION @extschema@.idem_fingerprint(request jsonb) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_fingerprint_jsonb_wrapper';

COMMENT ON FUNCTION @extschema@.idem_fingerprint(jsonb) IS
    'Lowercase hex SHA-256 of the canonical JSON text of request (keys sorted, no whitespace, exact plain-decimal numbers): equal JSON values give equal fingerprints, and the Rust client computes the same string.';

CREATE FUNCTION @extschema@.idem_fingerprint(request text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_fingerprint_text_wrapper';

COMMENT ON FUNCTION @extschema@.idem_fingerprint(text) IS
    'The fingerprint of request read as JSON text, equal to idem_fingerprint(request::jsonb); raises 22023 when it is not JSON. An untyped literal resolves to this form.';

CREATE FUNCTION @extschema@.idem_fingerprint(request bytea) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_fingerprint_bytea_wrapper';

COMMENT ON FUNCTION @extschema@.idem_fingerprint(bytea) IS
    'Lowercase hex SHA-256 of request''s bytes.';

CREATE FUNCTION @extschema@.idem_lookup(operation text, user_id text, key text)
    RETURNS SETOF @extschema@.idem_records
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
BEGIN
    PERFORM @extschema@._idem_check_scope(operation, user_id, key);
    RETURN QUERY
        SELECT r.*
          FROM @extschema@.idem_records AS r
         WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_lookup(text, text, text) IS
    'For operators: the record of (operation, user_id, key), zero or one row. Not granted to PUBLIC.';

CREATE FUNCTION @extschema@.idem_stats(
    OUT processing            bigint,
    OUT success               bigint,
    OUT failed                bigint,
    OUT stuck                 bigint,
    OUT expired               bigint,
    OUT oldest_processing_age interval)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT count(*) FILTER (WHERE r.status = 'PROCESSING'),
           count(*) FILTER (WHERE r.status = 'SUCCESS'),
           count(*) FILTER (WHERE r.status = 'FAILED'),
           count(*) FILTER (WHERE r.status = 'PROCESSING' AND r.lease_expires_at <= v_now),
           count(*) FILTER (WHERE r.status <> 'PROCESSING' AND r.expires_at <= v_now),
           v_now - min(r.created_at) FILTER (WHERE r.status = 'PROCESSING')
      INTO processing, success, failed, stuck, expired, oldest_processing_age
      FROM @extschema@.idem_records AS r;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_stats() IS
    'For operators: records by status, stuck PROCESSING records (lease expired), expired records awaiting idem_sweep, and the age of the oldest PROCESSING record. Scans the table. Not granted to PUBLIC.';
