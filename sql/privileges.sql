-- idempotency: privileges.
--
-- The API functions are SECURITY DEFINER (owned by the role that ran CREATE EXTENSION), so a role
-- needs only USAGE on the schema and EXECUTE on them. Nobody else reads or changes records, and a
-- record belongs to the role that reserved it (guarantee 8; the functions check it).
--
-- EXECUTE on the write API goes to one documented role, idempotency_user (NOLOGIN): an
-- application role gets it with GRANT idempotency_user TO app. Roles are cluster-wide: the role
-- is created here when absent (another database's install may have made it already), and DROP
-- EXTENSION leaves it, since other databases may use it. An install by a role that may not create
-- roles (the portable install) needs it to exist first.
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

REVOKE ALL ON TABLE @extschema@.idem_records, @extschema@.idem_retries FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.idem_token_seq FROM PUBLIC;

-- Operators only: these read every user's records or act on many keys at once.
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_lookup(text, text, text),
    @extschema@.idem_stats(),
    @extschema@.idem_recover_stuck(integer, text, integer),
    @extschema@.idem_sweep(integer)
    FROM PUBLIC;

-- Internals run inside the API functions, as their owner. Not _idem_utf8: the portable install's
-- idem_fingerprint (PUBLIC's, running as its caller) reads its argument through it; it reads
-- nothing but its arguments.
REVOKE EXECUTE ON FUNCTION
    @extschema@._idem_setting(text),
    @extschema@._idem_conf(text),
    @extschema@._idem_utf8_length(text),
    @extschema@._idem_check_part(text, text, boolean),
    @extschema@._idem_checked_interval(text, interval),
    @extschema@._idem_max_response_bytes(),
    @extschema@._idem_check_scope(text, text, text),
    @extschema@._idem_check_request_hash(text),
    @extschema@._idem_require(text, boolean),
    @extschema@._idem_check_step(integer),
    @extschema@._idem_check_batch_size(integer),
    @extschema@._idem_check_array(text, anyarray, text, integer, boolean),
    @extschema@._idem_echo(text),
    @extschema@._idem_require_writable(text),
    @extschema@._idem_ttl(interval),
    @extschema@._idem_lease(interval, interval),
    @extschema@._idem_max_retries(integer),
    @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer),
    @extschema@._idem_resume_locked(text, text, text, text, bigint, interval),
    @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz, integer),
    @extschema@._idem_distributed(),
    @extschema@._idem_caller(),
    @extschema@._idem_owns(oid),
    @extschema@._idem_check_owner(oid, text)
    FROM PUBLIC;

-- The write API: EXECUTE for idempotency_user.
GRANT EXECUTE ON FUNCTION
    @extschema@.idem_reserve(text, text, text, text, interval, interval, boolean),
    @extschema@.idem_complete(text, text, text, bigint, jsonb, text),
    @extschema@.idem_release(text, text, text, bigint, integer),
    @extschema@.idem_heartbeat(text, text, text, bigint, interval),
    @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean),
    @extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text),
    @extschema@.idem_await(text, text, text, text, interval, interval, interval),
    @extschema@.idem_checkpoint(text, text, text, bigint, integer, jsonb, interval),
    @extschema@.idem_resumable(text, integer),
    @extschema@.idem_replay(text, text, text, text)
    TO idempotency_user;

-- idem_await, idem_checkpoint, idem_resumable and idem_replay are new in 0.7.0, so no install
-- has an application relying on PUBLIC's EXECUTE on them: a plain REVOKE, replayed by the update
-- too.
REVOKE EXECUTE ON FUNCTION
    @extschema@.idem_await(text, text, text, text, interval, interval, interval),
    @extschema@.idem_checkpoint(text, text, text, bigint, integer, jsonb, interval),
    @extschema@.idem_resumable(text, integer),
    @extschema@.idem_replay(text, text, text, text)
    FROM PUBLIC;

-- ... and for nobody else on a fresh install. A DO block, not a REVOKE statement, on purpose: the
-- update scripts replay every GRANT and REVOKE of this file (scripts/sqlbuild.py), and an update
-- keeps the EXECUTE that PUBLIC has on an existing install, so that no running application
-- breaks; docs/upgrading.md says how to take it away.
DO $do$
BEGIN
    REVOKE EXECUTE ON FUNCTION
        @extschema@.idem_reserve(text, text, text, text, interval, interval, boolean),
        @extschema@.idem_complete(text, text, text, bigint, jsonb, text),
        @extschema@.idem_release(text, text, text, bigint, integer),
        @extschema@.idem_heartbeat(text, text, text, bigint, interval),
        @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean),
        @extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text)
        FROM PUBLIC;
END
$do$;
