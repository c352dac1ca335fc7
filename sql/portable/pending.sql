-- idempotency, portable build only: the PL/pgSQL idem_reserve inserts every reservation at once,
-- so there is never a pending one to write. Replaces the LANGUAGE c function of the same
-- signature in sql/helpers.sql; its comment and privileges come from sql/ unchanged.

CREATE FUNCTION @extschema@._idem_write_pending(operation text, user_id text, key text) RETURNS void
    LANGUAGE sql VOLATILE STRICT
    SET search_path = pg_catalog, pg_temp
    AS $fn$ SELECT $fn$;
