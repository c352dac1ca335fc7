-- idempotency 0.5.0 -> 0.6.0, the part a replay of the functions cannot do.
--
-- 0.6.0: a record belongs to the role that reserved it (guarantee 8), the write API is granted
-- to the role idempotency_user, heartbeat leases obey the reservation's ceiling. The new and
-- changed functions arrive with the replay of every 0.6.0 function that scripts/sqlbuild.py
-- appends to this file, with their comments and privilege statements (among them the GRANT to
-- idempotency_user). PUBLIC keeps the EXECUTE it has on the write API, so no running
-- application breaks: the fresh install's REVOKE is a DO block, which the replay leaves out
-- (docs/upgrading.md, "0.6.0", says how to take it away).
--
-- Below: the owner column (NULL on every existing record: any role with the API may act on
-- those, as before, until they expire; ADD COLUMN without a default rewrites nothing, but takes
-- idem_records' ACCESS EXCLUSIVE lock until the update commits), and the role the GRANTs of the
-- replay name, created when absent.
ALTER TABLE @extschema@.idem_records ADD COLUMN owner regrole;

DO $do$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) 'idempotency_user') THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r
                    WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER AND (r.rolsuper OR r.rolcreaterole)) THEN
        RAISE EXCEPTION 'idempotency: role idempotency_user does not exist, and % may not create it', CURRENT_USER
            USING ERRCODE = '42501',
                  HINT = 'A role with CREATEROLE runs CREATE ROLE idempotency_user NOLOGIN first (once per cluster).';
    END IF;
    CREATE ROLE idempotency_user NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
    NULL; -- created meanwhile by an install in another database
END
$do$;
