-- idempotency: fingerprints and the operators' lookup.

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

-- The native hot path keeps a fresh reservation in memory until idem_complete writes its record
-- once, finished (extension/src/native/pending.rs); this writes it now, as PROCESSING, for
-- what reads the table in the reserving transaction. The portable install has nothing pending.
CREATE FUNCTION @extschema@._idem_write_pending(operation text, user_id text, key text) RETURNS void
    LANGUAGE c VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', 'idem_write_pending_native';

COMMENT ON FUNCTION @extschema@._idem_write_pending(text, text, text) IS
    'Internal: writes the reservation of (operation, user_id, key) that this transaction made and has not written yet (the write-once flow), as its PROCESSING record.';

REVOKE EXECUTE ON FUNCTION @extschema@._idem_write_pending(text, text, text) FROM PUBLIC;

-- The record as every version answered it (the type idem_record, sql/schema.sql).
CREATE FUNCTION @extschema@.idem_lookup(operation text, user_id text, key text)
    RETURNS SETOF @extschema@.idem_record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
BEGIN
    PERFORM @extschema@._idem_check_scope(operation, user_id, key);
    -- A reservation this transaction made and has not written yet shows as its record.
    PERFORM @extschema@._idem_write_pending(operation, user_id, key);
    -- After the update from 0.6.0: the key's record moved from idem_records_060 first.
    PERFORM @extschema@._idem_adopt(operation, user_id, key);
    -- Another role's record is refused (guarantee 8), to operators too unless members of it.
    PERFORM @extschema@._idem_check_owner(
        (SELECT r.owner FROM @extschema@.idem_records AS r
          WHERE r.id = @extschema@._idem_id(operation, user_id, key)
            AND r.operation = operation AND r.user_id = user_id AND r.key = key), 'read a key');
    RETURN QUERY
        SELECT r.operation, r.user_id, r.key, encode(r.request_hash, 'hex'),
               @extschema@._idem_status_word(r.status), r.token, r.response, r.lease_expires_at,
               r.expires_at, r.created_at, r.updated_at, r.owner, r.step, r.state
          FROM @extschema@.idem_records AS r
         WHERE r.id = @extschema@._idem_id(operation, user_id, key)
           AND r.operation = operation AND r.user_id = user_id AND r.key = key;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_lookup(text, text, text) IS
    'For operators: the record of (operation, user_id, key), zero or one row. Not granted to PUBLIC.';

-- What a completer walks (docs/recovery-points.md): the RESUMABLE keys of one operation that the
-- caller may act on (its own role's, or a role it is a member of), oldest updated_at first. A
-- plain read, no lock: each key is then resumed by idem_reserve, which decides under the key's
-- lock; a resume touches updated_at, so a key that keeps failing goes to the back of the queue.
CREATE FUNCTION @extschema@.idem_resumable(operation text, batch_size integer DEFAULT 100)
    RETURNS TABLE (user_id text, key text, request_hash text, step integer, state jsonb,
                   attempts integer, updated_at timestamptz)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp(); -- a value, not a call in the query (Citus)
BEGIN
    PERFORM @extschema@._idem_check_scope(idem_resumable.operation, 'u', 'k');
    PERFORM @extschema@._idem_check_batch_size(idem_resumable.batch_size);
    RETURN QUERY
        SELECT r.user_id, r.key, encode(r.request_hash, 'hex'), r.step, r.state, r.attempts,
               r.updated_at
          FROM @extschema@.idem_records AS r
         WHERE r.operation = idem_resumable.operation AND r.status = 'r'
           AND r.expires_at > v_now
           AND @extschema@._idem_owns(r.owner)
         ORDER BY r.updated_at
         LIMIT idem_resumable.batch_size;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_resumable(text, integer) IS
    'For a completer: up to batch_size RESUMABLE keys of operation that the caller''s role owns (or is a member of), oldest updated_at first, with the step and state to resume from and the transient failures counted; takes no lock (resume each with idem_reserve).';

-- idem_stats: sql/operations.sql.
