-- idempotency, portable build only: the record's id and stored request hash in SQL. Replaces the
-- LANGUAGE c functions of the same signatures in sql/schema.sql (extension/src/record.rs, over
-- core/src/record.rs); their comments and privileges come from sql/ unchanged.
-- tests/tests/args_parity.rs proves both answer alike. Both hash the texts' bytes in the
-- database's encoding (convert_to to that encoding copies them as they are), not a ::bytea
-- cast, which would parse a backslash in the text as an escape.

CREATE FUNCTION @extschema@._idem_id(operation text, user_id text, key text) RETURNS uuid
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT pg_catalog.encode(pg_catalog.substr(pg_catalog.sha256(
               pg_catalog.convert_to(operation, pg_catalog.getdatabaseencoding())
               OPERATOR(pg_catalog.||) pg_catalog.decode('1f', 'hex')
               OPERATOR(pg_catalog.||) pg_catalog.convert_to(user_id, pg_catalog.getdatabaseencoding())
               OPERATOR(pg_catalog.||) pg_catalog.decode('1f', 'hex')
               OPERATOR(pg_catalog.||) pg_catalog.convert_to(key, pg_catalog.getdatabaseencoding())),
           1, 16), 'hex')::pg_catalog.uuid
$fn$;

CREATE FUNCTION @extschema@._idem_hash(request_hash text) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN request_hash COLLATE pg_catalog."C" OPERATOR(pg_catalog.~) '^[0-9a-f]{64}$'
                THEN pg_catalog.decode(request_hash, 'hex')
                ELSE pg_catalog.sha256(pg_catalog.convert_to(request_hash, pg_catalog.getdatabaseencoding())) END
$fn$;
