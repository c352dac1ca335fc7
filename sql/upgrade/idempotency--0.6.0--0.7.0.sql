-- idempotency 0.6.0 -> 0.7.0, the part a replay of the functions cannot do.
--
-- The new and changed functions arrive with the replay of every 0.7.0 function that
-- scripts/sqlbuild.py appends to this file, with their comments and privilege statements.

-- The update changes both tables (and the reservation type): their locks are taken in the order
-- every reservation takes them, idem_records first, so an update under load waits for the
-- reservations in flight instead of deadlocking with one (which reads idem_records, then
-- idem_retries, while the update would hold idem_retries and wait for idem_records).
LOCK TABLE @extschema@.idem_records, @extschema@.idem_retries IN ACCESS EXCLUSIVE MODE;

-- A key's retry counter is owned like its record (guarantee 8, issue 40): the owner of the
-- record whose failure started the count. The counters kept from 0.6.0 have none (NULL: any
-- role's, as before, until they expire). No default: adding the column rewrites no row.
ALTER TABLE @extschema@.idem_retries ADD COLUMN owner regrole;

-- idem_reservation gains the resume's step and state, appended (no table stores the type, so
-- nothing is rewritten; a 0.6.0 body's ROW of 5 values still casts to it until the replay below
-- replaces it, the new attributes NULL).
ALTER TYPE @extschema@.idem_reservation ADD ATTRIBUTE step integer, ADD ATTRIBUTE state jsonb;

COMMENT ON TYPE @extschema@.idem_reservation IS
    'The answer of idem_reserve: outcome (created | resume | replay | failed | in_progress | mismatch), the token when created or resumed, the stored response on replay or failed, transient failures so far, the record''s expiry, and on resume the last recovery point''s step and state.';

-- idem_reserve_many's result type changes (it gains step and state), which CREATE OR REPLACE
-- refuses: dropped here and re-created at once with the new result type and a body the replay
-- replaces (with its comment and grants), keeping the EXECUTE that PUBLIC has (an update never
-- takes it away, sql/privileges.sql). idem_lookup answers the table's row type, which gains the
-- new columns by itself.
DO $do$
DECLARE
    v_public boolean := pg_catalog.has_function_privilege('public',
        '@extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean)', 'EXECUTE');
BEGIN
    DROP FUNCTION @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean);
    CREATE FUNCTION @extschema@.idem_reserve_many(
        operation      text,
        user_id        text,
        keys           text[],
        request_hashes text[],
        ttl            interval DEFAULT NULL,
        lease          interval DEFAULT NULL,
        wait           boolean  DEFAULT false)
        RETURNS TABLE (key text, outcome text, token bigint, response jsonb, attempts integer,
                       expires_at timestamptz, step integer, state jsonb)
        LANGUAGE sql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $fn$ SELECT NULL::text, NULL::text, NULL::bigint, NULL::jsonb, NULL::integer,
                       NULL::timestamptz, NULL::integer, NULL::jsonb WHERE false $fn$;
    IF NOT v_public THEN
        REVOKE EXECUTE ON FUNCTION
            @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean)
            FROM PUBLIC;
    END IF;
END
$do$;

-- The record's layout (issue 43, docs/record-layout.md, "The update from 0.6.0"): 0.6.0's table is
-- renamed aside and a new idem_records created in the compact layout, with issue 45's step and
-- state. The records' rows change type (a digest key, a 32-byte hash, a status code), so no ALTER
-- TABLE gets there without rewriting the table under its lock. Nothing is moved here: this
-- script changes the catalog only, so its lock lasts milliseconds (plus the wait for the
-- transactions already holding a lock on the tables). The records move afterwards, each key's
-- when a call reaches it (_idem_adopt, under the key's lock) and the rest in batches
-- (idem_move_records: the maintenance worker, idem_maintain); the old table goes once empty.

-- What the new table and the move need before the replay below (which replaces each with the
-- sources' definition, its comment and its privileges): the record's id and stored hash, the
-- status code and the expiry bucket, as sql/schema.sql defines them.
CREATE FUNCTION @extschema@._idem_id(operation text, user_id text, key text) RETURNS uuid
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_id_wrapper';
CREATE FUNCTION @extschema@._idem_hash(request_hash text) RETURNS bytea
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_hash_wrapper';
CREATE FUNCTION @extschema@._idem_status_code(word text) RETURNS pg_catalog."char"
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $fn$
    SELECT (CASE WHEN word OPERATOR(pg_catalog.=) 'PROCESSING' THEN 'p'
                 WHEN word OPERATOR(pg_catalog.=) 'SUCCESS' THEN 's'
                 WHEN word OPERATOR(pg_catalog.=) 'FAILED' THEN 'f'
                 WHEN word OPERATOR(pg_catalog.=) 'RESUMABLE' THEN 'r' END)::pg_catalog."char"
$fn$;
CREATE FUNCTION @extschema@._idem_expiry_bucket(expires_at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $fn$
    SELECT pg_catalog.floor(EXTRACT(epoch FROM expires_at OPERATOR(pg_catalog.-) '2000-01-01 00:00+00'::pg_catalog.timestamptz)
                            OPERATOR(pg_catalog./) 64)::integer
$fn$;

-- idem_lookup answered 0.6.0's table's row type; it answers the type idem_record now (the same
-- columns and meanings, with step and state). CREATE OR REPLACE cannot change a result type:
-- dropped and re-created at once with the new one and a body the replay replaces, keeping every
-- EXECUTE granted on it (an operator's role included).
CREATE TYPE @extschema@.idem_record AS (
    operation        text,
    user_id          text,
    key              text,
    request_hash     text,
    status           text,
    token            bigint,
    response         jsonb,
    lease_expires_at timestamptz,
    expires_at       timestamptz,
    created_at       timestamptz,
    updated_at       timestamptz,
    owner            regrole,
    step             integer,
    state            jsonb
);

COMMENT ON TYPE @extschema@.idem_record IS
    'A record as idem_lookup answers it: its key, request_hash (64 hex digits), status word, token, response, lease and expiry, timestamps, owner and recovery point.';

DO $do$
DECLARE
    v_acl pg_catalog.aclitem[] := (SELECT p.proacl FROM pg_catalog.pg_proc AS p
                                    WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure);
    v_grantee oid;
BEGIN
    DROP FUNCTION @extschema@.idem_lookup(text, text, text);
    CREATE FUNCTION @extschema@.idem_lookup(operation text, user_id text, key text)
        RETURNS SETOF @extschema@.idem_record
        LANGUAGE sql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $fn$ SELECT NULL::@extschema@.idem_record WHERE false $fn$;
    REVOKE EXECUTE ON FUNCTION @extschema@.idem_lookup(text, text, text) FROM PUBLIC;
    FOR v_grantee IN
        SELECT a.grantee FROM pg_catalog.aclexplode(v_acl) AS a
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE'
           AND a.grantee OPERATOR(pg_catalog.<>) a.grantor
    LOOP
        IF v_grantee OPERATOR(pg_catalog.=) 0 THEN
            GRANT EXECUTE ON FUNCTION @extschema@.idem_lookup(text, text, text) TO PUBLIC;
        ELSE
            EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION @extschema@.idem_lookup(text, text, text) TO %I',
                                      v_grantee::pg_catalog.regrole::pg_catalog.text);
        END IF;
    END LOOP;
END
$do$;

-- The PL/pgSQL idem_reserve's insert without waiting gained the record's attempts.
DROP FUNCTION @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz);

-- 0.6.0's table aside, with its constraints and indexes.
ALTER TABLE @extschema@.idem_records RENAME TO idem_records_060;
ALTER TABLE @extschema@.idem_records_060 RENAME CONSTRAINT idem_records_pkey TO idem_records_060_pkey;
ALTER INDEX @extschema@.idem_records_lease_idx RENAME TO idem_records_060_lease_idx;
ALTER INDEX @extschema@.idem_records_expiry_idx RENAME TO idem_records_060_expiry_idx;
-- PostgreSQL 18 names NOT NULL constraints (idem_records_COLUMN_not_null) and picks names unused in
-- the schema: renamed after the old table, so the new table's get the names a fresh install gives.
DO $do$
DECLARE
    v_name name;
BEGIN
    FOR v_name IN
        SELECT c.conname FROM pg_catalog.pg_constraint AS c
         WHERE c.conrelid OPERATOR(pg_catalog.=) '@extschema@.idem_records_060'::pg_catalog.regclass
           AND c.contype OPERATOR(pg_catalog.=) 'n'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE @extschema@.idem_records_060 RENAME CONSTRAINT %I TO %I',
                                  v_name, pg_catalog.replace(v_name, 'idem_records_', 'idem_records_060_'));
    END LOOP;
END
$do$;

-- The new table, as sql/schema.sql creates it (tests/upgrade/schema.sql compares the two).
CREATE TABLE @extschema@.idem_records (
    id               uuid        NOT NULL,
    token            bigint      NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    owner            regrole,
    attempts         integer     NOT NULL,
    status           pg_catalog."char" NOT NULL,
    request_hash     bytea       NOT NULL,
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    response         jsonb,
    step             integer,
    state            jsonb,
    CONSTRAINT idem_records_pkey PRIMARY KEY (id)
) WITH (vacuum_truncate = false);

COMMENT ON TABLE @extschema@.idem_records IS
    'One record per (operation, user_id, key), keyed by its id digest: the reservation, its fencing token and the stored response.';

-- The new table's indexes (the table is empty: built at once).
CREATE INDEX idem_records_lease_idx ON @extschema@.idem_records (lease_expires_at)
    WHERE status OPERATOR(pg_catalog.=) 'p'::pg_catalog."char";
CREATE INDEX idem_records_expiry_idx ON @extschema@.idem_records (@extschema@._idem_expiry_bucket(expires_at))
    WHERE status OPERATOR(pg_catalog.<>) 'p'::pg_catalog."char";

-- pg_dump keeps the new table's rows. The old table leaves the extension (and pg_dump's list of
-- its members' rows): as a plain table, a dump carries it whole (definition and rows) and a
-- restore re-creates it beside a fresh install, where the move carries on. (As a member, a dump
-- would carry its rows but not the table, which a fresh install of 0.7.0 does not create.)
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_records'::pg_catalog.regclass, '');
ALTER EXTENSION idempotency DROP TABLE @extschema@.idem_records_060;
COMMENT ON TABLE @extschema@.idem_records_060 IS
    'The records kept from idempotency 0.6.0, moving into idem_records (idem_move_records; docs/upgrading.md). Dropped once empty.';
