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

-- Recovery points (issue 45, docs/recovery-points.md): a record's last recovery point (step,
-- state). Nullable and without a default, so adding them writes the catalog only: no row is
-- rewritten, however large the table.
ALTER TABLE @extschema@.idem_records ADD COLUMN step integer, ADD COLUMN state jsonb;

-- The status RESUMABLE. The new check is added NOT VALID, then the old one dropped: validating
-- would read every row while the update holds idem_records' ACCESS EXCLUSIVE lock (taken
-- above), stopping every reservation for the length of a full scan, and nothing is
-- gained by it: every 0.6.0 row met the narrower check, and every row written from now on is
-- checked. A fresh install adds it NOT VALID too (sql/schema.sql), so both schemas are one.
ALTER TABLE @extschema@.idem_records
    ADD CONSTRAINT idem_records_status_check_0_7_0 CHECK (status OPERATOR(pg_catalog.=) ANY
        (ARRAY['PROCESSING', 'SUCCESS', 'FAILED', 'RESUMABLE']::pg_catalog.text[])) NOT VALID;
ALTER TABLE @extschema@.idem_records DROP CONSTRAINT idem_records_status_check;
ALTER TABLE @extschema@.idem_records
    RENAME CONSTRAINT idem_records_status_check_0_7_0 TO idem_records_status_check;

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
