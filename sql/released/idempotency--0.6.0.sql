-- idempotency: tables, the token sequence and the reservation type.
--
-- Every object is qualified with @extschema@ and every operator with pg_catalog: nothing here
-- depends on the search_path at CREATE EXTENSION time.

-- Tokens fence every mutating call. One sequence (no per-backend cache), so tokens are unique and
-- increase over the life of the database; registered below so a dump and restore keeps its position.
CREATE SEQUENCE @extschema@.idem_token_seq AS bigint;

COMMENT ON SEQUENCE @extschema@.idem_token_seq IS
    'Fencing tokens for idem_reserve: unique and increasing over the life of the database.';

-- Both tables churn: every row is deleted by the sweep some time after it is written, and the
-- maintenance worker vacuums after a large sweep (extension/src/vacuum.rs). vacuum_truncate = false
-- keeps the space a VACUUM frees for the next rows instead of giving the empty tail back to the
-- file system, which would take an ACCESS EXCLUSIVE lock on the table at each such VACUUM (and
-- replay it on every standby) only to grow the file again (docs/operations.md, "Table size").
CREATE TABLE @extschema@.idem_records (
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    request_hash     text        NOT NULL,
    status           text        NOT NULL CHECK (status OPERATOR(pg_catalog.=) ANY
                                        (ARRAY['PROCESSING', 'SUCCESS', 'FAILED']::pg_catalog.text[])),
    token            bigint      NOT NULL,
    response         jsonb,
    -- The in-flight lease and the result TTL are separate: a lease decides when a stuck attempt
    -- may be recovered, expires_at when the whole record may be reused and swept.
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    -- The role that reserved (or took over) the record: the session's role (SET ROLE's, else the
    -- login role). Only it and its members may complete, release, extend, read or replay it
    -- (guarantee 8). NULL on records written before 0.6.0: any role with the API may act on
    -- those, as before, until they expire.
    owner            regrole,
    CONSTRAINT idem_records_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);

COMMENT ON TABLE @extschema@.idem_records IS
    'One record per (operation, user_id, key): the reservation, its fencing token and the stored response.';

-- idem_recover_stuck walks PROCESSING records by lease end; the partial index holds only those, so
-- its cost grows with the in-flight rows, not with the table.
CREATE INDEX idem_records_lease_idx ON @extschema@.idem_records (lease_expires_at)
    WHERE status OPERATOR(pg_catalog.=) 'PROCESSING'::pg_catalog.text;

-- idem_sweep deletes finished records by expiry; PROCESSING rows (recovered, not swept) stay out.
CREATE INDEX idem_records_expiry_idx ON @extschema@.idem_records (expires_at)
    WHERE status OPERATOR(pg_catalog.<>) 'PROCESSING'::pg_catalog.text;

-- The transient-failure counter outlives the record that idem_release deletes, so a retried key
-- keeps counting towards max_retries. A counter belongs to every record created before it expired.
CREATE TABLE @extschema@.idem_retries (
    operation  text        NOT NULL,
    user_id    text        NOT NULL,
    key        text        NOT NULL,
    attempts   integer     NOT NULL CHECK (attempts OPERATOR(pg_catalog.>) 0),
    expires_at timestamptz NOT NULL,
    CONSTRAINT idem_retries_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);

COMMENT ON TABLE @extschema@.idem_retries IS
    'Transient failures per (operation, user_id, key); kept after the record is released, swept once expired and unneeded.';

CREATE INDEX idem_retries_expiry_idx ON @extschema@.idem_retries (expires_at);

CREATE TYPE @extschema@.idem_reservation AS (
    outcome    text,
    token      bigint,
    response   jsonb,
    attempts   integer,
    expires_at timestamptz
);

COMMENT ON TYPE @extschema@.idem_reservation IS
    'The answer of idem_reserve: outcome (created | replay | failed | in_progress | mismatch), the token when created, the stored response on replay or failed, transient failures so far, and the record''s expiry.';

-- pg_dump keeps the rows of both tables and the sequence's position.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_records'::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_retries'::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_token_seq'::pg_catalog.regclass, '');

-- idempotency: internal helpers (not API; EXECUTE revoked from PUBLIC in privileges.sql).

CREATE FUNCTION @extschema@._idem_setting(name text) RETURNS text
    LANGUAGE c VOLATILE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_setting_wrapper';

COMMENT ON FUNCTION @extschema@._idem_setting(text) IS
    'Internal: loads the library (which defines the idempotency.* settings) and returns a setting''s current value.';

-- A duration or count setting's text as the PL/pgSQL twins of the native argument rules read it
-- (sql/portable/args.sql; the extension reads its settings natively): the session's value, or
-- the default when it is unset or empty (RESET of a setting made before the library loaded leaves
-- an empty placeholder). A value the setting would not accept is 22023 naming it.
CREATE FUNCTION @extschema@._idem_conf(name text) RETURNS text
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v       text := coalesce(nullif(current_setting('idempotency.' || name, true), ''),
                             @extschema@._idem_setting('idempotency.' || name));
    pattern text := CASE name
                        WHEN 'max_retries' THEN '^[[:space:]]*[0-9]+[[:space:]]*$'
                        ELSE '^[[:space:]]*[0-9]+([.][0-9]+)?[[:space:]]*(us|ms|s|min|h|d)?[[:space:]]*$' END;
    valid   boolean := v ~ pattern;
BEGIN
    IF valid AND name = 'max_retries' THEN
        valid := v::numeric <= 2147483647;
    END IF;
    IF valid IS NOT TRUE THEN
        RAISE EXCEPTION 'invalid value for parameter "idempotency.%": %', name, @extschema@._idem_echo(v)
            USING ERRCODE = '22023',
                  HINT = CASE name
                             WHEN 'max_retries' THEN 'Use a whole number.'
                             ELSE 'Use a number of seconds, optionally with a unit: us, ms, s, min, h or d (such as 90s or 5min).' END;
    END IF;
    RETURN v;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_conf(text) IS
    'Internal: the text of setting idempotency.<name>, its default when unset or empty; raises 22023 naming the setting when invalid.';

-- The rule of one key part or request_hash, for the PL/pgSQL twins of the native checks.
CREATE FUNCTION @extschema@._idem_check_part(name text, value text, forbid_controls boolean)
    RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', name USING ERRCODE = '22004';
    END IF;
    IF octet_length(value) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '% must be 1 to 255 bytes, got %', name, octet_length(value)
            USING ERRCODE = '22023';
    END IF;
    IF forbid_controls AND value ~ E'[\\x01-\\x1f\\x7f-\\x9f]' THEN
        RAISE EXCEPTION '% must not contain control characters (U+0000-U+001F, U+007F-U+009F), found one at byte %',
            name, octet_length(substring(value FROM E'^[^\\x01-\\x1f\\x7f-\\x9f]*'))
            USING ERRCODE = '22023';
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_part(text, text, boolean) IS
    'Internal (PL/pgSQL twins of the native checks): true, or 22004/22023 naming the argument when a key part or request_hash breaks the input rules.';

-- An explicit ttl or lease, for the PL/pgSQL twins: positive and at most 1000 years.
CREATE FUNCTION @extschema@._idem_checked_interval(name text, value interval) RETURNS interval
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF value <= interval '0' THEN
        RAISE EXCEPTION '% must be a positive interval, got %', name, value USING ERRCODE = '22023';
    END IF;
    IF value > interval '1000 years' THEN
        RAISE EXCEPTION '% must be at most 1000 years, got %', name, value USING ERRCODE = '22023';
    END IF;
    RETURN value;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_checked_interval(text, interval) IS
    'Internal (PL/pgSQL twins of the native checks): an explicit ttl or lease; 22023 unless positive and at most 1000 years.';

CREATE FUNCTION @extschema@._idem_max_response_bytes() RETURNS integer
    LANGUAGE c VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_max_response_bytes_wrapper';

COMMENT ON FUNCTION @extschema@._idem_max_response_bytes() IS
    'Internal: idempotency.max_response_bytes in bytes.';

-- The argument rules, native (extension/src/args.rs): the key rules are the client crate's, so
-- the client refuses exactly what these refuse. Each answers true or raises 22004/22023 naming
-- the argument.
CREATE FUNCTION @extschema@._idem_check_scope(operation text, user_id text, key text) RETURNS boolean
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_check_scope_wrapper';

COMMENT ON FUNCTION @extschema@._idem_check_scope(text, text, text) IS
    'Internal: true, or 22004/22023 naming the first of operation, user_id, key that breaks the input rules.';

CREATE FUNCTION @extschema@._idem_check_request_hash(request_hash text) RETURNS boolean
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_check_request_hash_wrapper';

COMMENT ON FUNCTION @extschema@._idem_check_request_hash(text) IS
    'Internal: true, or 22004/22023 when request_hash is NULL or not 1 to 255 bytes.';

CREATE FUNCTION @extschema@._idem_require(name text, is_null boolean) RETURNS boolean
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_require_wrapper';

COMMENT ON FUNCTION @extschema@._idem_require(text, boolean) IS
    'Internal: true, or 22004 naming the argument when a required argument is NULL.';

-- An array argument of the batch functions: non-NULL (22004), one-dimensional (22023), as many
-- elements as the first array (22023, when n is given), and no NULL element unless allowed
-- (22004 naming the element). Answers the number of elements.
CREATE FUNCTION @extschema@._idem_check_array(name text, value anyarray, first text, n integer,
                                              allow_nulls boolean)
    RETURNS integer
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_at integer;
BEGIN
    PERFORM @extschema@._idem_require(name, value IS NULL);
    IF array_ndims(value) > 1 THEN
        RAISE EXCEPTION '% must be a one-dimensional array, got % dimensions', name, array_ndims(value)
            USING ERRCODE = '22023';
    END IF;
    IF n IS NOT NULL AND cardinality(value) <> n THEN
        RAISE EXCEPTION '% must have as many elements as % (%), got %', name, first, n, cardinality(value)
            USING ERRCODE = '22023';
    END IF;
    IF NOT allow_nulls THEN
        v_at := array_position(value, NULL);
        IF v_at IS NOT NULL THEN
            RAISE EXCEPTION '%[%] must not be NULL', name, v_at USING ERRCODE = '22004';
        END IF;
    END IF;
    RETURN cardinality(value);
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_array(text, anyarray, text, integer, boolean) IS
    'Internal (the batch functions): the number of elements, or 22004/22023 naming the array argument (or its NULL element) that breaks the batch rules.';

-- batch_size of the maintenance functions: non-NULL (22004) and at least 1 (22023).
CREATE FUNCTION @extschema@._idem_check_batch_size(batch_size integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    PERFORM @extschema@._idem_require('batch_size', batch_size IS NULL);
    IF batch_size < 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1, got %', batch_size USING ERRCODE = '22023';
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_batch_size(integer) IS
    'Internal: raises 22004/22023 for a NULL or non-positive batch_size.';

-- Where a write is refused: on a server in recovery (a hot standby: every transaction there is
-- read-only) and in a read-only transaction on a primary. Every mutating function calls this
-- before its first write (the native ones too, so the message has this one source), and raises
-- 25006 saying why, instead of the error of whichever internal write came first. A call that
-- needs no write (a replay, idem_lookup) never gets here. True when writing is allowed.
CREATE FUNCTION @extschema@._idem_require_writable(action text) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'idempotency: cannot % on a server in recovery (a standby)', action
            USING ERRCODE = '25006',
                  HINT = 'Writes go to the primary: retry there (after a failover, on the promoted server). A standby answers only calls that write nothing, such as idem_lookup and replays of finished keys.';
    END IF;
    IF current_setting('transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'idempotency: cannot % in a read-only transaction', action
            USING ERRCODE = '25006',
                  HINT = 'Run it in a read-write transaction (see default_transaction_read_only and SET TRANSACTION).';
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_require_writable(text) IS
    'Internal: true, or 25006 saying that the server is in recovery (a standby) or the transaction is read-only, so action cannot write.';

-- Guarantee 8: a record belongs to the role that reserved it. The caller is the session's role
-- (SET ROLE's, else the login role), which GetOuterUserId() answers natively: inside these
-- SECURITY DEFINER functions current_user is the extension's owner, and an application's own
-- SECURITY DEFINER function does not change it.
CREATE FUNCTION @extschema@._idem_caller() RETURNS oid
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT r.oid
      FROM pg_catalog.pg_roles AS r
     WHERE r.rolname OPERATOR(pg_catalog.=)
           CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.=) 'none' THEN SESSION_USER
                ELSE pg_catalog.current_setting('role')::pg_catalog.name END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_caller() IS
    'Internal: the OID of the session''s role (SET ROLE''s, else the login role), whom a new record belongs to.';

-- Whether the caller may act on a record whose owner is owner_role: a record without an owner
-- (written before 0.6.0), or the caller is that role or a member of it (pg_has_role MEMBER;
-- superusers are members of every role).
CREATE FUNCTION @extschema@._idem_owns(owner_role oid) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT owner_role IS NULL
        OR pg_catalog.pg_has_role(@extschema@._idem_caller(), owner_role, 'MEMBER')
$fn$;

COMMENT ON FUNCTION @extschema@._idem_owns(oid) IS
    'Internal: whether the session''s role may act on a record owned by owner_role (NULL: a record from before 0.6.0, any role may).';

-- 42501 unless the caller may act on a record owned by owner_role (see _idem_owns); true
-- otherwise. action says what was refused ('complete a key').
CREATE FUNCTION @extschema@._idem_check_owner(owner_role oid, action text) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
BEGIN
    IF NOT @extschema@._idem_owns(owner_role) THEN
        RAISE EXCEPTION 'permission denied to %: the key belongs to role % (only that role and its members may act on it)',
            action, owner_role::pg_catalog.regrole USING ERRCODE = '42501';
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_check_owner(oid, text) IS
    'Internal: true, or 42501 when the session''s role may not act on a record owned by owner_role (guarantee 8).';

-- How an error message shows a rejected word: quoted when short, only its size otherwise, so
-- a huge argument is never echoed.
CREATE FUNCTION @extschema@._idem_echo(value text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN octet_length(value) <= 32 THEN quote_literal(value)
                ELSE format('a %s-byte value', octet_length(value)) END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_echo(text) IS
    'Internal: a rejected argument as error messages show it (quoted if at most 32 bytes, else its size).';

-- Durations and retry limits: explicit values checked, NULL the idempotency.* defaults (native,
-- reading the settings directly: an empty or reset setting is its default).
CREATE FUNCTION @extschema@._idem_ttl(ttl interval) RETURNS interval
    LANGUAGE c STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_ttl_wrapper';

COMMENT ON FUNCTION @extschema@._idem_ttl(interval) IS
    'Internal: an explicit ttl (22023 unless positive and at most 1000 years) or idempotency.ttl.';

CREATE FUNCTION @extschema@._idem_lease(lease interval, ttl interval) RETURNS interval
    LANGUAGE c STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_lease_wrapper';

COMMENT ON FUNCTION @extschema@._idem_lease(interval, interval) IS
    'Internal: an explicit lease (22023 unless positive, at most 1000 years and at most ttl) or idempotency.lease capped at ttl; ttl NULL means no cap.';

CREATE FUNCTION @extschema@._idem_max_retries(max_retries integer) RETURNS integer
    LANGUAGE c STABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_max_retries_wrapper';

COMMENT ON FUNCTION @extschema@._idem_max_retries(integer) IS
    'Internal: an explicit max_retries (22023 below 1) or idempotency.max_retries.';

-- A transient failure of the attempt whose PROCESSING record the caller has locked: count it in
-- the retry counter, then poison the record at max_retries or delete it so a retry runs again.
-- Shared by idem_release and idem_recover_stuck(action => 'release').
CREATE FUNCTION @extschema@._idem_release_locked(
    operation text, user_id text, key text, created_at timestamptz, expires_at timestamptz,
    max_retries integer)
    RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_attempts integer;
    v_counted  boolean; -- receives _idem_count
BEGIN
    -- A counter that expired before this record was created belongs to an earlier life of the
    -- key: start again from 1.
    INSERT INTO @extschema@.idem_retries AS t (operation, user_id, key, attempts, expires_at)
    VALUES (operation, user_id, key, 1, expires_at)
    ON CONFLICT ON CONSTRAINT idem_retries_pkey DO UPDATE
        SET attempts   = CASE WHEN t.expires_at > created_at THEN t.attempts + 1 ELSE 1 END,
            expires_at = greatest(t.expires_at, excluded.expires_at)
    RETURNING t.attempts INTO v_attempts;

    IF v_attempts >= max_retries THEN
        UPDATE @extschema@.idem_records AS r
           SET status = 'FAILED', updated_at = v_now
         WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
        v_counted := @extschema@._idem_count('poisonings');
        RETURN 'poisoned';
    END IF;
    DELETE FROM @extschema@.idem_records AS r
     WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
    v_counted := @extschema@._idem_count('releases');
    RETURN 'released';
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer) IS
    'Internal: counts a transient failure of a locked PROCESSING record, then poisons (FAILED) or deletes it.';

-- Whether idem_records is a Citus distributed (or reference) table: Citus's catalog
-- pg_dist_partition exists and lists it. Maintenance then works key by key, with single-shard
-- statements only (Citus cannot lock rows with a read across shards). The catalog's name is
-- constant text: without Citus it does not exist, so the query cannot be written statically.
CREATE FUNCTION @extschema@._idem_distributed() RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_distributed boolean;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition AS p
                             WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1)'
       INTO v_distributed USING '@extschema@.idem_records'::regclass;
    RETURN v_distributed;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_distributed() IS
    'Internal: true when idem_records is a Citus distributed or reference table.';

-- idempotency: idem_reserve.
--
-- How one key stays at most once:
--   1. Read the committed record (and its retry counter) in one primary-key probe. A live record
--      answers at once: replay, failed, in_progress or mismatch. No lock is taken, so a replay
--      costs one statement and never makes a concurrent duplicate wait.
--   2. The key is absent or expired: take the key's transaction-scoped advisory lock. Every
--      transaction that creates or takes over a record holds it until it commits or rolls back,
--      so an uncommitted reservation is detected without blocking (wait => false answers
--      in_progress) or waited for (wait => true).
--   3. Create with INSERT ... ON CONFLICT DO NOTHING, or take over an expired record with an
--      UPDATE that re-checks expiry on the newest row version. The primary key and the re-check,
--      not the lock, are what make two `created` for one key impossible; if either loses a
--      race, loop and read again.
--   4. The locks live in the server's shared lock table (about max_locks_per_transaction per
--      session): a transaction keeps fewer than half of max_locks_per_transaction of them. Past
--      that it takes no key lock for good; its uncommitted row holds the key, as a row of the
--      hand-written INSERT ... ON CONFLICT does. Such a transaction holds the shared "past its
--      budget" lock (advisory lock (1768189296, 1), one slot for the whole transaction, the last
--      of its budget) and probes the key's lock for an instant (taken and given back in one
--      expression), so a key another transaction holds by its lock answers in_progress at once.
--   5. No subtransaction: PL/pgSQL cannot read another transaction's uncommitted row, and
--      INSERT waits for one, so only a key that some transaction past its budget may hold by its
--      row needs an insert that gives up instead of waiting (_idem_write_nowait: lock_timeout,
--      caught in an EXCEPTION block, a subtransaction). An insert takes it only with
--      wait => false while another transaction holds the "past its budget" lock (probed for an
--      instant); every other insert is a plain INSERT ... ON CONFLICT DO NOTHING, which cannot
--      wait: any other uncommitted row of the key belongs to a transaction holding the key's
--      lock (which this one holds now, or probed free) or the "past its budget" lock (probed
--      free after this transaction took the key's lock, and taken by that transaction before
--      its probe of the key's lock). One race is left to a transaction past its budget: a
--      transaction that takes the key's lock and inserts in the instant between its probe and
--      its insert makes it wait for that transaction's end (never an error, never a second
--      created). A takeover waits for a row another transaction holds (a sweep or a recovery,
--      briefly; or the takeover of a transaction past its budget, until it ends).

CREATE FUNCTION @extschema@._idem_write_nowait(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    token        bigint,
    now          timestamptz,
    lease_end    timestamptz,
    expires_at   timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    SET lock_timeout = '100ms'
    AS $fn$
#variable_conflict use_variable
BEGIN
    INSERT INTO @extschema@.idem_records AS r
           (operation, user_id, key, request_hash, status, token, response,
            lease_expires_at, expires_at, created_at, updated_at, owner)
    VALUES (operation, user_id, key, request_hash, 'PROCESSING', token, NULL,
            lease_end, expires_at, now, now, @extschema@._idem_caller())
    ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING;
    RETURN FOUND;
EXCEPTION WHEN lock_not_available THEN
    -- Another transaction holds the key by its uncommitted row: busy.
    RETURN NULL;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz) IS
    'Internal (PL/pgSQL idem_reserve): the insert of a new record; NULL instead of waiting (lock_timeout) for another transaction''s uncommitted row of the key.';

CREATE FUNCTION @extschema@.idem_reserve(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         boolean  DEFAULT false)
    RETURNS @extschema@.idem_reservation
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_ttl      interval;
    v_lease    interval;
    v_now      timestamptz;
    v_rec      record;
    v_attempts integer;
    v_token    bigint;
    v_locked   boolean := false;
    v_outcome  text;
    v_kept     integer;
    v_keep     boolean := true;
    v_found    boolean;
    v_hash     bigint;
    v_busy     boolean;
    v_counted  boolean; -- receives _idem_count: an assignment is PL/pgSQL's cheapest call
    v_owner    oid;
BEGIN
    -- The argument rules, checked natively (extension/src/args.rs, on the client crate's key
    -- rules): each check raises 22004/22023 naming the argument, or answers true.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_check_request_hash(request_hash)
            AND @extschema@._idem_require('wait', wait IS NULL)) THEN
        RETURN NULL; -- not reached: a failed check raises
    END IF;
    -- The durations: explicit values checked, NULL the idempotency.* defaults (a defaulted
    -- lease capped at the ttl).
    v_ttl := @extschema@._idem_ttl(ttl);
    v_lease := @extschema@._idem_lease(lease, v_ttl);

    FOR attempt IN 1..8 LOOP
        v_now := clock_timestamp();
        -- One primary-key probe; the retry counter counts if it was live when the record was
        -- created (a scalar subquery, evaluated only when the record exists).
        SELECT r.request_hash, r.status, r.response, r.lease_expires_at, r.expires_at, r.owner,
               (SELECT t.attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > r.created_at) AS attempts
          INTO v_rec
          FROM @extschema@.idem_records AS r
         WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;

        IF v_rec.status IS NOT NULL
           AND (v_rec.expires_at > v_now
                OR (v_rec.status = 'PROCESSING' AND v_rec.lease_expires_at > v_now)) THEN
            -- A live record decides, for its owner (and the owner's members) only: another role
            -- learns nothing of it, its response least of all (guarantee 8).
            v_counted := @extschema@._idem_check_owner(v_rec.owner, 'reserve a key');
            v_outcome := CASE WHEN v_rec.request_hash <> request_hash THEN 'mismatch'
                              WHEN v_rec.status = 'SUCCESS' THEN 'replay'
                              WHEN v_rec.status = 'FAILED' THEN 'failed'
                              ELSE 'in_progress' END;
            v_counted := @extschema@._idem_count('reservations_' || v_outcome);
            RETURN ROW(v_outcome, NULL,
                       CASE WHEN v_outcome IN ('replay', 'failed') THEN v_rec.response END,
                       coalesce(v_rec.attempts, 0), v_rec.expires_at)::@extschema@.idem_reservation;
        END IF;

        -- Absent, or expired and free to take over: a new attempt would start now, and write.
        v_counted := @extschema@._idem_require_writable('reserve a key');
        IF NOT v_locked THEN
            -- Keep the key's lock until the transaction ends while this transaction keeps fewer
            -- than half of max_locks_per_transaction less one (the "past its budget" lock's
            -- slot), counted in a transaction-local setting.
            v_kept := coalesce(nullif(current_setting('idem_portable.kept_locks', true), '')::integer, 0);
            v_keep := v_kept < current_setting('max_locks_per_transaction')::integer / 2 - 1;
        END IF;
        IF NOT v_locked AND v_keep THEN
            IF wait THEN
                PERFORM pg_advisory_xact_lock(
                    hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0));
            ELSIF NOT pg_try_advisory_xact_lock(
                    hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0)) THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL)::@extschema@.idem_reservation;
            END IF;
            PERFORM set_config('idem_portable.kept_locks', (v_kept + 1)::text, true);
            v_locked := true;
            IF wait THEN
                CONTINUE; -- the holder may have committed while we waited: read again
            END IF;
        ELSIF NOT v_locked THEN
            -- Past the budget: say so to every other transaction (held until this one ends),
            -- then probe the key's lock for an instant, taken and given back in one expression.
            PERFORM pg_advisory_xact_lock_shared(1768189296, 1);
            v_hash := hashtextextended(operation || E'\x1f' || user_id || E'\x1f' || key, 0);
            IF wait THEN
                -- Wait for the holder, if any, to end; then read again.
                PERFORM pg_advisory_lock(v_hash), pg_advisory_unlock(v_hash);
                v_locked := true;
                CONTINUE;
            ELSIF NOT (pg_try_advisory_lock(v_hash) AND pg_advisory_unlock(v_hash)) THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL)::@extschema@.idem_reservation;
            END IF;
        END IF;

        v_locked := true;
        v_token := nextval('@extschema@.idem_token_seq');
        v_owner := @extschema@._idem_caller();
        v_busy := false;
        IF NOT wait AND v_rec.status IS NULL THEN
            -- Does another transaction hold the "past its budget" lock? Probed up to three times
            -- (another call's probe holds it for an instant too).
            v_busy := true;
            FOR probe IN 1..3 LOOP
                IF pg_try_advisory_lock(1768189296, 1) AND pg_advisory_unlock(1768189296, 1) THEN
                    v_busy := false;
                    EXIT;
                END IF;
            END LOOP;
        END IF;
        IF v_busy THEN
            -- It may hold this key by an uncommitted row: an insert that gives up instead of
            -- waiting (one subtransaction, only while such a transaction is open).
            v_found := @extschema@._idem_write_nowait(operation, user_id, key, request_hash, v_token,
                                                      v_now, v_now + v_lease, v_now + v_ttl);
            IF v_found IS NULL THEN
                -- Another transaction is creating this key and has not committed.
                SELECT t.attempts INTO v_attempts
                  FROM @extschema@.idem_retries AS t
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
                   AND t.expires_at > v_now;
                v_attempts := coalesce(v_attempts, 0);
                v_counted := @extschema@._idem_count('reservations_in_progress');
                RETURN ROW('in_progress', NULL, NULL, v_attempts, NULL)::@extschema@.idem_reservation;
            END IF;
        ELSIF v_rec.status IS NULL THEN
            INSERT INTO @extschema@.idem_records AS r
                   (operation, user_id, key, request_hash, status, token, response,
                    lease_expires_at, expires_at, created_at, updated_at, owner)
            VALUES (operation, user_id, key, request_hash, 'PROCESSING', v_token, NULL,
                    v_now + v_lease, v_now + v_ttl, v_now, v_now, v_owner)
            ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING;
        ELSE
            UPDATE @extschema@.idem_records AS r
               SET request_hash = request_hash, status = 'PROCESSING', token = v_token,
                   response = NULL, lease_expires_at = v_now + v_lease,
                   expires_at = v_now + v_ttl, created_at = v_now, updated_at = v_now,
                   owner = v_owner
             WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
               AND r.expires_at <= v_now
               AND (r.status <> 'PROCESSING' OR r.lease_expires_at <= v_now);
        END IF;
        IF NOT v_busy THEN
            v_found := FOUND;
        END IF;
        IF v_found THEN
            -- The retry counter, if one is live: this attempt continues its count. (A statement
            -- of its own, not a subquery in RETURNING: Citus cannot route a subquery inside
            -- INSERT or UPDATE on a distributed table.)
            SELECT t.attempts INTO v_attempts
              FROM @extschema@.idem_retries AS t
             WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
               AND t.expires_at > v_now;
            v_attempts := coalesce(v_attempts, 0);
            IF v_attempts > 0 THEN
                -- A retry of a released key: keep its counter alive as long as this record.
                UPDATE @extschema@.idem_retries AS t
                   SET expires_at = greatest(t.expires_at, v_now + v_ttl)
                 WHERE t.operation = operation AND t.user_id = user_id AND t.key = key;
            END IF;
            v_counted := @extschema@._idem_count('reservations_created');
            RETURN ROW('created', v_token, NULL, v_attempts, v_now + v_ttl)::@extschema@.idem_reservation;
        END IF;
        -- Lost a race with a commit, a takeover, a recovery or a sweep: read the key again.
    END LOOP;
    -- The key kept changing under us; answer as a busy key so the caller retries later, with
    -- the transient failures counted for it so far (as every other answer).
    SELECT t.attempts INTO v_attempts
      FROM @extschema@.idem_retries AS t
     WHERE t.operation = operation AND t.user_id = user_id AND t.key = key
       AND t.expires_at > clock_timestamp();
    v_counted := @extschema@._idem_count('reservations_in_progress');
    RETURN ROW('in_progress', NULL, NULL, coalesce(v_attempts, 0), NULL)::@extschema@.idem_reservation;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_reserve(text, text, text, text, interval, interval, boolean) IS
    'Reserves (operation, user_id, key) for one attempt. outcome: created (token to complete with), replay (stored response), failed, in_progress, or mismatch (the key was used with another request_hash). Call in the transaction of the business write.';

-- A batch: idem_reserve for each key of one operation and user, in input order, in one
-- statement. Each key is reserved exactly as by its own idem_reserve call, one after the other,
-- so a key repeated in the batch answers as a repeated call would (in_progress, or mismatch
-- under another request_hash: its first occurrence holds it). No key is reserved when an array
-- breaks the batch rules; a key that breaks the key rules raises idem_reserve's error, and the
-- statement's reservations roll back with it.
CREATE FUNCTION @extschema@.idem_reserve_many(
    operation      text,
    user_id        text,
    keys           text[],
    request_hashes text[],
    ttl            interval DEFAULT NULL,
    lease          interval DEFAULT NULL,
    wait           boolean  DEFAULT false)
    RETURNS TABLE (key text, outcome text, token bigint, response jsonb, attempts integer,
                   expires_at timestamptz)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_n integer;
BEGIN
    IF NOT (@extschema@._idem_check_scope(operation, user_id, 'k')
            AND @extschema@._idem_require('wait', wait IS NULL)) THEN
        RETURN; -- not reached: a failed check raises
    END IF;
    v_n := @extschema@._idem_check_array('keys', keys, NULL, NULL, false);
    PERFORM @extschema@._idem_check_array('request_hashes', request_hashes, 'keys', v_n, false);
    -- One idem_reserve per element, evaluated in input order (OFFSET 0 keeps the call in the
    -- subquery: once per row, whatever the outer query reads of its result).
    RETURN QUERY
    SELECT s.k, (s.r).outcome, (s.r).token, (s.r).response, (s.r).attempts, (s.r).expires_at
      FROM (SELECT u.i, u.k,
                   @extschema@.idem_reserve(idem_reserve_many.operation, idem_reserve_many.user_id,
                                            u.k, u.h, idem_reserve_many.ttl,
                                            idem_reserve_many.lease, idem_reserve_many.wait) AS r
              FROM unnest(idem_reserve_many.keys, idem_reserve_many.request_hashes)
                   WITH ORDINALITY AS u(k, h, i)
             ORDER BY u.i
            OFFSET 0) AS s
     ORDER BY s.i;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean) IS
    'Reserves many keys of one operation and user in one statement: one row per element of keys, in input order, each answered as idem_reserve(operation, user_id, keys[i], request_hashes[i], ttl, lease, wait) would answer it. keys and request_hashes: equal lengths, no NULL element.';

-- idempotency: the calls an attempt makes with its token.
--
-- Each is a conditional update fenced by (token, status = 'PROCESSING'): a stale token, or a
-- record that completed, was recovered or was taken over, changes nothing and answers
-- false / 'stale'. Expected races are values, never errors. The fence compares the status
-- under the C collation (the same answer) so that no plan matches the partial index
-- idem_records_lease_idx instead of probing the primary key (extension/src/native/plans.rs).

CREATE FUNCTION @extschema@.idem_complete(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    response  jsonb,
    status    text DEFAULT 'SUCCESS')
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_limit   bigint;
    v_size    bigint;
    v_now     timestamptz := clock_timestamp(); -- a value, not a call inside the UPDATE (Citus)
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)
            AND @extschema@._idem_require('status', status IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    IF status NOT IN ('SUCCESS', 'FAILED') THEN
        RAISE EXCEPTION 'status must be ''SUCCESS'' or ''FAILED'', got %',
            @extschema@._idem_echo(status)
            USING ERRCODE = '22023';
    END IF;
    IF response IS NOT NULL THEN
        v_limit := @extschema@._idem_max_response_bytes();
        v_size := octet_length(response::text);
        IF v_size > v_limit THEN
            -- Never echo the value: it may be huge, and it may be private.
            RAISE EXCEPTION 'response must be at most % bytes (idempotency.max_response_bytes), got %',
                v_limit, v_size USING ERRCODE = '54000';
        END IF;
    END IF;
    v_counted := @extschema@._idem_require_writable('complete a key');

    UPDATE @extschema@.idem_records AS r
       SET status = status, response = response, updated_at = v_now
     WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status = ('PROCESSING' COLLATE pg_catalog."C")
       AND @extschema@._idem_owns(r.owner);
    IF FOUND THEN
        v_counted := @extschema@._idem_count(CASE status WHEN 'SUCCESS' THEN 'completions_success'
                                                                        ELSE 'completions_failed' END);
        RETURN true;
    END IF;
    -- Another role's record holding this token is refused (guarantee 8: a token is a fence, not a
    -- password); any other token is stale, a value.
    v_counted := @extschema@._idem_check_owner(
        (SELECT r.owner FROM @extschema@.idem_records AS r
          WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
            AND r.token = token), 'complete a key');
    v_counted := @extschema@._idem_count('stale_tokens');
    RETURN false;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_complete(text, text, text, bigint, jsonb, text) IS
    'Finishes the attempt holding token: SUCCESS (the default) or FAILED (a permanent failure), storing response for replays. false, changing nothing, when the token is stale or the record is no longer PROCESSING: roll the business write back.';

-- A batch: idem_complete for each key of one operation and user, in input order, in one
-- statement, each answered as its own call (a key repeated with its token completes once; its
-- later occurrences find it no longer PROCESSING and answer false). responses[i] may be NULL
-- (no stored response), as idem_complete's response. One fenced UPDATE completes every key
-- whose PROCESSING record is written (the first occurrence of each key and token); the others
-- (a reservation of this transaction not written yet, a stale token, a repeat) each go through
-- idem_complete. On Citus every key goes through idem_complete (a join is not routable).
CREATE FUNCTION @extschema@.idem_complete_many(
    operation text,
    user_id   text,
    keys      text[],
    tokens    bigint[],
    responses jsonb[],
    status    text DEFAULT 'SUCCESS')
    RETURNS TABLE (key text, completed boolean)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_column
DECLARE
    v_n       integer;
    v_now     timestamptz := clock_timestamp();
    v_limit   bigint;
    v_bad     record;
    v_done    integer[] := '{}';
    v_counted boolean; -- receives _idem_count
BEGIN
    IF NOT (@extschema@._idem_check_scope(operation, user_id, 'k')
            AND @extschema@._idem_require('status', status IS NULL)) THEN
        RETURN; -- not reached: a failed check raises
    END IF;
    v_n := @extschema@._idem_check_array('keys', keys, NULL, NULL, false);
    PERFORM @extschema@._idem_check_array('tokens', tokens, 'keys', v_n, false);
    PERFORM @extschema@._idem_check_array('responses', responses, 'keys', v_n, true);
    -- idem_complete's rules for what the UPDATE below writes without it.
    IF status NOT IN ('SUCCESS', 'FAILED') THEN
        RAISE EXCEPTION 'status must be ''SUCCESS'' or ''FAILED'', got %',
            @extschema@._idem_echo(status)
            USING ERRCODE = '22023';
    END IF;
    v_limit := @extschema@._idem_max_response_bytes();
    SELECT x.i, octet_length(x.r::text) AS size INTO v_bad
      FROM unnest(idem_complete_many.responses) WITH ORDINALITY AS x(r, i)
     WHERE octet_length(x.r::text) > v_limit
     LIMIT 1;
    IF FOUND THEN
        -- Never echo the value: it may be huge, and it may be private.
        RAISE EXCEPTION 'responses[%] must be at most % bytes (idempotency.max_response_bytes), got %',
            v_bad.i, v_limit, v_bad.size USING ERRCODE = '54000';
    END IF;
    IF NOT @extschema@._idem_distributed() THEN
        WITH u AS (
            SELECT DISTINCT ON (u.k, u.t) u.k, u.t, u.r, u.i
              FROM unnest(idem_complete_many.keys, idem_complete_many.tokens,
                          idem_complete_many.responses) WITH ORDINALITY AS u(k, t, r, i)
             ORDER BY u.k, u.t, u.i),
        done AS (
            UPDATE @extschema@.idem_records AS x
               SET status = idem_complete_many.status, response = u.r, updated_at = v_now
              FROM u
             WHERE x.operation = idem_complete_many.operation
               AND x.user_id = idem_complete_many.user_id AND x.key = u.k AND x.token = u.t
               AND x.status = ('PROCESSING' COLLATE pg_catalog."C")
               AND @extschema@._idem_owns(x.owner)
            RETURNING u.i)
        SELECT coalesce(array_agg(done.i::integer), '{}') INTO v_done FROM done;
        IF cardinality(v_done) > 0 THEN
            v_counted := @extschema@._idem_count(CASE idem_complete_many.status
                                                     WHEN 'SUCCESS' THEN 'completions_success'
                                                     ELSE 'completions_failed' END,
                                                 cardinality(v_done));
        END IF;
    END IF;
    RETURN QUERY
    SELECT s.k, s.done
      FROM (SELECT u.i, u.k,
                   CASE WHEN d.i IS NOT NULL THEN true
                        ELSE @extschema@.idem_complete(idem_complete_many.operation,
                                                       idem_complete_many.user_id, u.k, u.t, u.r,
                                                       idem_complete_many.status) END AS done
              FROM unnest(idem_complete_many.keys, idem_complete_many.tokens,
                          idem_complete_many.responses) WITH ORDINALITY AS u(k, t, r, i)
              LEFT JOIN unnest(v_done) AS d(i) ON d.i = u.i
             ORDER BY u.i
            OFFSET 0) AS s
     ORDER BY s.i;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text) IS
    'Completes many attempts of one operation and user in one statement: one row per element of keys, in input order, completed as idem_complete(operation, user_id, keys[i], tokens[i], responses[i], status) answers it. keys, tokens and responses: equal lengths; no NULL key or token (a NULL response stores none).';

CREATE FUNCTION @extschema@.idem_release(
    operation   text,
    user_id     text,
    key         text,
    token       bigint,
    max_retries integer DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_max     integer;
    v_rec     record;
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    v_max := @extschema@._idem_max_retries(max_retries);
    v_counted := @extschema@._idem_require_writable('release a key');

    SELECT r.created_at, r.expires_at INTO v_rec
      FROM @extschema@.idem_records AS r
     WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status = ('PROCESSING' COLLATE pg_catalog."C")
       AND @extschema@._idem_owns(r.owner)
       FOR UPDATE;
    IF NOT FOUND THEN
        -- Another role's record holding this token is refused (guarantee 8); else stale.
        v_counted := @extschema@._idem_check_owner(
            (SELECT r.owner FROM @extschema@.idem_records AS r
              WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
                AND r.token = token), 'release a key');
        v_counted := @extschema@._idem_count('stale_tokens');
        RETURN 'stale';
    END IF;
    RETURN @extschema@._idem_release_locked(operation, user_id, key, v_rec.created_at,
                                            v_rec.expires_at, v_max);
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_release(text, text, text, bigint, integer) IS
    'Gives the key back after a transient failure: counts it, then deletes the record so a retry runs again (''released''), or marks it FAILED once max_retries failures are counted (''poisoned''). ''stale'' for a wrong token.';

CREATE FUNCTION @extschema@.idem_heartbeat(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    lease     interval DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_until   timestamptz;
    v_counted boolean; -- receives _idem_count
BEGIN
    -- The argument rules (native: see idem_reserve); a failed check raises.
    IF NOT (@extschema@._idem_check_scope(operation, user_id, key)
            AND @extschema@._idem_require('token', token IS NULL)) THEN
        RETURN NULL; -- not reached
    END IF;
    -- The lease obeys the reservation's rule with ttl => NULL: at most idempotency.ttl (an
    -- explicit longer lease is 22023), so a heartbeat cannot wedge a key for longer.
    v_until := v_now + @extschema@._idem_lease(lease, @extschema@._idem_ttl(NULL));
    v_counted := @extschema@._idem_require_writable('extend a lease');

    -- expires_at moves to at least the lease end, so a live, heartbeating attempt is never
    -- taken over as expired.
    UPDATE @extschema@.idem_records AS r
       SET lease_expires_at = v_until, expires_at = greatest(r.expires_at, v_until),
           updated_at = v_now
     WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
       AND r.token = token AND r.status = ('PROCESSING' COLLATE pg_catalog."C")
       AND @extschema@._idem_owns(r.owner);
    IF NOT FOUND THEN
        -- Another role's record holding this token is refused (guarantee 8); else stale.
        v_counted := @extschema@._idem_check_owner(
            (SELECT r.owner FROM @extschema@.idem_records AS r
              WHERE r.operation = operation AND r.user_id = user_id AND r.key = key
                AND r.token = token), 'extend a lease');
        v_counted := @extschema@._idem_count('stale_tokens');
        RETURN false;
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_heartbeat(text, text, text, bigint, interval) IS
    'Extends the lease of the PROCESSING attempt holding token to now + lease (default idempotency.lease, capped at idempotency.ttl; an explicit lease longer than idempotency.ttl is 22023); false when the token is stale; 42501 for another role''s key.';

-- idempotency: recovery of stuck attempts and the sweep of expired records.
--
-- Both work in batches over partial indexes, lock with SKIP LOCKED (never waiting on, nor touching,
-- a row a live transaction holds), and re-check every condition on the locked row version, so
-- they are safe to run concurrently with themselves and with traffic.
--
-- On Citus (idem_records distributed, _idem_distributed()) a read across shards cannot lock rows,
-- so both work key by key: a plain read across shards picks the batch's candidates, then each key
-- is locked by a single-shard SELECT ... FOR UPDATE SKIP LOCKED that re-checks the conditions, and
-- changed by a single-shard statement. Same rules, one round trip to the key's node per statement.

CREATE FUNCTION @extschema@.idem_recover_stuck(
    batch_size  integer DEFAULT 100,
    action      text    DEFAULT 'fail',
    max_retries integer DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now timestamptz := clock_timestamp();
    v_max integer;
    v_n       bigint := 0;
    v_rec     record;
    v_key     record;
    v_counted boolean; -- receives _idem_count
BEGIN
    PERFORM @extschema@._idem_check_batch_size(batch_size);
    PERFORM @extschema@._idem_require('action', action IS NULL);
    IF action NOT IN ('fail', 'release') THEN
        RAISE EXCEPTION 'action must be ''fail'' or ''release'', got %',
            @extschema@._idem_echo(action)
            USING ERRCODE = '22023';
    END IF;
    v_max := @extschema@._idem_max_retries(max_retries);
    v_counted := @extschema@._idem_require_writable('recover stuck reservations');

    IF @extschema@._idem_distributed() THEN
        -- Citus: candidates by a plain read across shards, then key by key (see above).
        FOR v_key IN
            SELECT r.operation, r.user_id, r.key
              FROM @extschema@.idem_records AS r
             WHERE r.status = 'PROCESSING' AND r.lease_expires_at <= v_now
             ORDER BY r.lease_expires_at
             LIMIT batch_size
        LOOP
            SELECT r.created_at, r.expires_at INTO v_rec
              FROM @extschema@.idem_records AS r
             WHERE r.operation = v_key.operation AND r.user_id = v_key.user_id AND r.key = v_key.key
               AND r.status = 'PROCESSING' AND r.lease_expires_at <= v_now
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND; -- completed, recovered or taken over meanwhile, or held
            IF action = 'fail' THEN
                UPDATE @extschema@.idem_records AS r
                   SET status = 'FAILED', updated_at = v_now
                 WHERE r.operation = v_key.operation AND r.user_id = v_key.user_id AND r.key = v_key.key;
            ELSE
                PERFORM @extschema@._idem_release_locked(v_key.operation, v_key.user_id, v_key.key,
                                                         v_rec.created_at, v_rec.expires_at, v_max);
            END IF;
            v_n := v_n + 1;
        END LOOP;
        v_counted := @extschema@._idem_count('recovered', v_n);
        RETURN v_n;
    END IF;

    IF action = 'fail' THEN
        -- At most once: the dead worker may have done the work, so never run it again.
        WITH stuck AS (
            SELECT r.operation, r.user_id, r.key
              FROM @extschema@.idem_records AS r
             WHERE r.status = 'PROCESSING' AND r.lease_expires_at <= v_now
             ORDER BY r.lease_expires_at
             LIMIT batch_size
               FOR UPDATE SKIP LOCKED)
        UPDATE @extschema@.idem_records AS r
           SET status = 'FAILED', updated_at = v_now
          FROM stuck AS s
         WHERE r.operation = s.operation AND r.user_id = s.user_id AND r.key = s.key;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counted := @extschema@._idem_count('recovered', v_n);
        RETURN v_n;
    END IF;

    -- 'release': each stuck attempt is a transient failure, exactly as idem_release counts it.
    FOR v_rec IN
        SELECT r.operation, r.user_id, r.key, r.created_at, r.expires_at
          FROM @extschema@.idem_records AS r
         WHERE r.status = 'PROCESSING' AND r.lease_expires_at <= v_now
         ORDER BY r.lease_expires_at
         LIMIT batch_size
           FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM @extschema@._idem_release_locked(v_rec.operation, v_rec.user_id, v_rec.key,
                                                 v_rec.created_at, v_rec.expires_at, v_max);
        v_n := v_n + 1;
    END LOOP;
    v_counted := @extschema@._idem_count('recovered', v_n);
    RETURN v_n;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_recover_stuck(integer, text, integer) IS
    'Handles up to batch_size PROCESSING records whose lease expired (skipping rows locked by live transactions): action ''fail'' marks them FAILED, ''release'' counts a transient failure as idem_release does. Returns how many.';

CREATE FUNCTION @extschema@.idem_sweep(batch_size integer DEFAULT 1000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_records  bigint;
    v_counters bigint := 0;
    v_key      record;
    v_counted  boolean; -- receives _idem_count
BEGIN
    PERFORM @extschema@._idem_check_batch_size(batch_size);
    v_counted := @extschema@._idem_require_writable('sweep expired records');

    IF @extschema@._idem_distributed() THEN
        -- Citus: candidates by a plain read across shards, then key by key (see above).
        v_records := 0;
        FOR v_key IN
            SELECT x.operation, x.user_id, x.key
              FROM @extschema@.idem_records AS x
             WHERE x.status <> 'PROCESSING' AND x.expires_at <= v_now
             LIMIT batch_size
        LOOP
            PERFORM FROM @extschema@.idem_records AS r
             WHERE r.operation = v_key.operation AND r.user_id = v_key.user_id AND r.key = v_key.key
               AND r.status <> 'PROCESSING' AND r.expires_at <= v_now
               FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            DELETE FROM @extschema@.idem_records AS r
             WHERE r.operation = v_key.operation AND r.user_id = v_key.user_id AND r.key = v_key.key
               AND r.status <> 'PROCESSING' AND r.expires_at <= v_now;
            v_records := v_records + 1;
        END LOOP;
        IF v_records < batch_size THEN
            -- The correlated NOT EXISTS joins on the distribution column: Citus runs it shard by shard.
            FOR v_key IN
                SELECT x.operation, x.user_id, x.key
                  FROM @extschema@.idem_retries AS x
                 WHERE x.expires_at <= v_now
                   AND NOT EXISTS (
                       SELECT FROM @extschema@.idem_records AS r
                        WHERE r.operation = x.operation AND r.user_id = x.user_id AND r.key = x.key
                          AND r.created_at < x.expires_at)
                 LIMIT batch_size - v_records
            LOOP
                PERFORM FROM @extschema@.idem_retries AS t
                 WHERE t.operation = v_key.operation AND t.user_id = v_key.user_id AND t.key = v_key.key
                   AND t.expires_at <= v_now
                   FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                DELETE FROM @extschema@.idem_retries AS t
                 WHERE t.operation = v_key.operation AND t.user_id = v_key.user_id AND t.key = v_key.key
                   AND t.expires_at <= v_now;
                v_counters := v_counters + 1;
            END LOOP;
        END IF;
        v_counted := @extschema@._idem_count('swept', v_records + v_counters);
        RETURN v_records + v_counters;
    END IF;

    -- Lock a batch (skipping rows live transactions hold), then delete it by ctid with a TID
    -- scan, re-checking the conditions on the row version being deleted: a row taken over since
    -- the scan is a newer version and no longer matches.
    DELETE FROM @extschema@.idem_records AS r
     WHERE r.ctid = ANY (ARRAY(
               SELECT x.ctid
                 FROM @extschema@.idem_records AS x
                WHERE x.status <> 'PROCESSING' AND x.expires_at <= v_now
                LIMIT batch_size
                  FOR UPDATE OF x SKIP LOCKED))
       AND r.status <> 'PROCESSING' AND r.expires_at <= v_now;
    GET DIAGNOSTICS v_records = ROW_COUNT;

    -- Retry counters: expired, and no remaining record was created while the counter was live.
    IF v_records < batch_size THEN
        DELETE FROM @extschema@.idem_retries AS t
         WHERE t.ctid = ANY (ARRAY(
                   SELECT x.ctid
                     FROM @extschema@.idem_retries AS x
                    WHERE x.expires_at <= v_now
                      AND NOT EXISTS (
                          SELECT FROM @extschema@.idem_records AS r
                           WHERE r.operation = x.operation AND r.user_id = x.user_id AND r.key = x.key
                             AND r.created_at < x.expires_at)
                    LIMIT batch_size - v_records
                      FOR UPDATE OF x SKIP LOCKED))
           AND t.expires_at <= v_now;
        GET DIAGNOSTICS v_counters = ROW_COUNT;
    END IF;
    v_counted := @extschema@._idem_count('swept', v_records + v_counters);
    RETURN v_records + v_counters;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_sweep(integer) IS
    'Deletes up to batch_size expired SUCCESS/FAILED records, then expired retry counters no remaining record needs. Returns how many rows it deleted. Safe to run concurrently with itself and with traffic.';

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

CREATE FUNCTION @extschema@.idem_lookup(operation text, user_id text, key text)
    RETURNS SETOF @extschema@.idem_records
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
BEGIN
    PERFORM @extschema@._idem_check_scope(operation, user_id, key);
    -- A reservation this transaction made and has not written yet shows as its record.
    PERFORM @extschema@._idem_write_pending(operation, user_id, key);
    -- Another role's record is refused (guarantee 8), to operators too unless members of it.
    PERFORM @extschema@._idem_check_owner(
        (SELECT r.owner FROM @extschema@.idem_records AS r
          WHERE r.operation = operation AND r.user_id = user_id AND r.key = key), 'read a key');
    RETURN QUERY
        SELECT r.*
          FROM @extschema@.idem_records AS r
         WHERE r.operation = operation AND r.user_id = user_id AND r.key = key;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_lookup(text, text, text) IS
    'For operators: the record of (operation, user_id, key), zero or one row. Not granted to PUBLIC.';

-- idem_stats: sql/operations.sql.

-- idempotency 0.2.0: operations — the counters, the operators' statistics and the maintenance
-- procedure for pg_cron. docs/operations.md is the guide.

-- Counting is an atomic add in shared memory (no table write); a no-op returning false unless
-- the library is in shared_preload_libraries. The API functions call it in an assignment, which
-- PL/pgSQL evaluates as a simple expression, without executor start-up. STABLE, truthfully: it
-- changes no database state and answers the same for the same arguments; so the assignment
-- takes no new snapshot (a VOLATILE one would). No pinned search_path: it runs no SQL, and a SET
-- clause would cost a GUC save and restore on every call (measured: ~2.5 µs of ~3 µs).
CREATE FUNCTION @extschema@._idem_count(event text, n bigint DEFAULT 1) RETURNS boolean
    LANGUAGE c STABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', '_idem_count_wrapper';

COMMENT ON FUNCTION @extschema@._idem_count(text, bigint) IS
    'Internal: adds n to the shared-memory counter event; false, counting nothing, when the library is not preloaded.';

REVOKE EXECUTE ON FUNCTION @extschema@._idem_count(text, bigint) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_metrics() RETURNS TABLE (name text, value bigint)
    LANGUAGE c VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', 'idem_metrics_wrapper';

COMMENT ON FUNCTION @extschema@.idem_metrics() IS
    'For monitoring: what the extension decided since the server started (reservations by outcome, completions by status, releases, poisonings, stale tokens, recovered, swept, worker passes), one row per counter. Raises 55000 unless idempotency is in shared_preload_libraries. Granted to pg_monitor, not PUBLIC.';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_metrics() TO pg_monitor;

-- Cheap enough to call every 15 s on a table of 100M records: no column needs a full scan.
-- Exact: processing, stuck and oldest_processing_age (the partial index of PROCESSING records:
-- cost grows with the in-flight records) and expired (the partial expiry index: cost grows with
-- the records awaiting a sweep). Estimated: success and failed, from the planner's statistics
-- (the row count scaled to the table's current size, as the planner does, minus the exact
-- processing count, split by the status frequencies ANALYZE measured); NULL until the table has
-- been analyzed. Sequential scans are off inside: when most rows have expired the planner would
-- otherwise prefer one, and the function must stay cheap whatever the table holds.
CREATE FUNCTION @extschema@.idem_stats(
    OUT processing            bigint,
    OUT success               bigint,
    OUT failed                bigint,
    OUT stuck                 bigint,
    OUT expired               bigint,
    OUT oldest_processing_age interval)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $fn$
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_rel       regclass := '@extschema@.idem_records'::regclass;
    v_tuples    double precision;
    v_pages     double precision;
    v_rows      double precision;
    v_success   double precision;
    v_failed    double precision;
    v_schema    name;
    v_null_frac real;
    v_distinct  double precision;
    v_mcv       text[];
    v_mcf       real[];
    v_other     double precision;
BEGIN
    SELECT count(*), count(*) FILTER (WHERE r.lease_expires_at <= v_now), v_now - min(r.created_at)
      INTO processing, stuck, oldest_processing_age
      FROM @extschema@.idem_records AS r
     WHERE r.status = 'PROCESSING';

    SELECT count(*) INTO expired
      FROM @extschema@.idem_records AS r
     WHERE r.status <> 'PROCESSING' AND r.expires_at <= v_now;

    SELECT c.reltuples, c.relpages, n.nspname INTO v_tuples, v_pages, v_schema
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_rel;
    SELECT s.null_frac, s.n_distinct, s.most_common_vals::text::text[], s.most_common_freqs
      INTO v_null_frac, v_distinct, v_mcv, v_mcf
      FROM pg_stats AS s
     WHERE s.schemaname = v_schema AND s.tablename = 'idem_records' AND s.attname = 'status';
    IF NOT FOUND OR v_tuples < 0 THEN
        RETURN; -- never analyzed: no estimate to give
    END IF;
    -- As the planner estimates `status = value`: its frequency among the most common values, else
    -- an equal share of what they leave to the other distinct values.
    IF v_distinct < 0 THEN
        v_distinct := -v_distinct * v_tuples;
    END IF;
    v_other := (1 - v_null_frac - coalesce((SELECT sum(f) FROM unnest(v_mcf) AS f), 0))
               / greatest(v_distinct - coalesce(cardinality(v_mcv), 0), 1);
    v_success := coalesce(v_mcf[array_position(v_mcv, 'SUCCESS')], v_other);
    v_failed := coalesce(v_mcf[array_position(v_mcv, 'FAILED')], v_other);
    -- The row count scaled to the table's current size, as the planner does; the finished records
    -- are what the exact processing count leaves, split by the two frequencies.
    v_rows := CASE WHEN v_pages > 0
                   THEN v_tuples / v_pages * (pg_relation_size(v_rel) / current_setting('block_size')::integer)
                   ELSE v_tuples END;
    v_rows := greatest(v_rows - processing, 0);
    IF v_success + v_failed > 0 THEN
        success := round(v_rows * v_success / (v_success + v_failed));
        failed := round(v_rows) - success;
    ELSE
        success := 0;
        failed := 0;
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_stats() IS
    'For operators: PROCESSING records, stuck ones (lease expired), expired records awaiting idem_sweep and the age of the oldest PROCESSING record, all exact from the partial indexes; SUCCESS and FAILED records estimated from planner statistics (NULL before the first ANALYZE). Never scans the whole table. Not granted to PUBLIC.';

-- For servers that cannot preload the library: schedule this with pg_cron every minute. Each
-- batch commits on its own, so no transaction is long and a crash loses at most one batch.
-- A procedure with transaction control cannot pin its search_path (SET clause), so every name
-- and operator here is qualified; it is not SECURITY DEFINER: its caller needs EXECUTE on
-- idem_recover_stuck and idem_sweep.
CREATE PROCEDURE @extschema@.idem_maintain(batch_size integer DEFAULT 10000, action text DEFAULT 'fail')
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_started    timestamptz := pg_catalog.clock_timestamp();
    v_n          bigint;
    v_recovered  bigint := 0;
    v_swept      bigint := 0;
    v_xacts      integer := 0;
BEGIN
    LOOP
        v_n := @extschema@.idem_recover_stuck(batch_size => batch_size, action => action);
        COMMIT;
        v_recovered := v_recovered OPERATOR(pg_catalog.+) v_n;
        v_xacts := v_xacts OPERATOR(pg_catalog.+) 1;
        EXIT WHEN v_n OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    LOOP
        v_n := @extschema@.idem_sweep(batch_size => batch_size);
        COMMIT;
        v_swept := v_swept OPERATOR(pg_catalog.+) v_n;
        v_xacts := v_xacts OPERATOR(pg_catalog.+) 1;
        EXIT WHEN v_n OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    IF v_recovered OPERATOR(pg_catalog.+) v_swept OPERATOR(pg_catalog.>) 0 THEN
        RAISE LOG 'idempotency maintenance in database "%": recovered % (action %), swept %, in % transactions of at most % rows, % s',
            pg_catalog.current_database(), v_recovered, action, v_swept, v_xacts, batch_size,
            pg_catalog.round(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) v_started)::numeric, 3);
    END IF;
END
$fn$;

COMMENT ON PROCEDURE @extschema@.idem_maintain(integer, text) IS
    'Maintenance for pg_cron: idem_recover_stuck, then idem_sweep, batch after batch, each batch committed on its own, until a batch comes back less than full; logs a summary when it did work. CALL it outside a transaction block. Not granted to PUBLIC.';

REVOKE EXECUTE ON PROCEDURE @extschema@.idem_maintain(integer, text) FROM PUBLIC;

-- Citus: distribute the records with the business rows they guard, and run the API where they
-- live. Run once, on the coordinator, as the extension's owner, after CREATE EXTENSION citus and
-- idempotency and after the business table is distributed by its user_id (text) column. The
-- Citus functions are named as constant text: without Citus they do not exist.
CREATE FUNCTION @extschema@.idem_distribute(colocate_with regclass) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_records regclass := '@extschema@.idem_records'::regclass;
    v_fn      regprocedure;
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'colocate_with must not be NULL: name the business table distributed by user_id'
            USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'idem_distribute needs the citus extension in this database (CREATE EXTENSION citus on the coordinator first)'
            USING ERRCODE = '55000';
    END IF;
    IF NOT @extschema@._idem_distributed() THEN
        -- Both tables by user_id, in the business table's colocation group: a key's record, its
        -- retry counter and the user's business rows are on one shard, so the reservation, the
        -- business write and the completion are one single-node transaction.
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''user_id'', colocate_with => $2)'
            USING v_records, colocate_with::text;
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''user_id'', colocate_with => $2)'
            USING '@extschema@.idem_retries'::regclass, v_records::text;
        -- The rows were copied into the shards; the local copies left in the coordinator's
        -- table would only mislead a direct reader and take space.
        EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)' USING v_records;
        EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)'
            USING '@extschema@.idem_retries'::regclass;
    END IF;
    -- force_delegation: a call runs on the node of its user_id's shard, even inside a
    -- transaction block, so the advisory lock and the rows of one key live on one node.
    FOREACH v_fn IN ARRAY ARRAY[
        '@extschema@.idem_reserve(text, text, text, text, interval, interval, boolean)',
        '@extschema@.idem_complete(text, text, text, bigint, jsonb, text)',
        '@extschema@.idem_release(text, text, text, bigint, integer)',
        '@extschema@.idem_heartbeat(text, text, text, bigint, interval)',
        '@extschema@.idem_lookup(text, text, text)',
        -- A batch is one operation and user: one shard, so one node as well.
        '@extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean)',
        '@extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text)']::regprocedure[]
    LOOP
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''user_id'', colocate_with => $2, force_delegation => true)'
            USING v_fn, v_records::text;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_distribute(regclass) IS
    'Citus: distributes idem_records and idem_retries by user_id, co-located with colocate_with (a business table distributed by its text user_id), and delegates idem_reserve, idem_complete, idem_release, idem_heartbeat, idem_lookup, idem_reserve_many and idem_complete_many to the node of the user''s shard (force_delegation). Run on the coordinator, once and again after an update (it then only delegates what is new). Not granted to PUBLIC.';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_distribute(regclass) FROM PUBLIC;

-- idempotency: the native hot path (extension/src/native). Replaces the PL/pgSQL
-- idem_reserve, idem_complete, idem_release and idem_heartbeat of reserve.sql and finish.sql
-- with C-language functions of the same signatures, defaults, attributes and comments; the
-- portable (pure SQL) install leaves this file out and keeps the PL/pgSQL versions.
--
-- Same semantics, less machinery: the argument rules checked once in Rust, a replay answered
-- by one direct probe of idem_records_pkey (no executor), the writes run as SPI plans kept per
-- backend. They keep SECURITY DEFINER (the writes run as the extension's owner) but pin no
-- search_path: they resolve nothing by name at call time (relations, the row type and the
-- sequence by OID, looked up in their own schema once per backend; the SPI statements qualify
-- every relation with the schema and every operator with pg_catalog; builtins called directly),
-- so a SET clause would only cost its GUC save and restore on every call — measured: a replay
-- at 0.80x a primary-key SELECT with it, 0.90x without, 8 clients (bench/ab.sh, 6 x 5 s).
-- pgspot's PS003 is expected for exactly these functions (scripts/test.sh), and the regress
-- file search_path hijacks a caller's path.

CREATE OR REPLACE FUNCTION @extschema@.idem_reserve(
    operation    text,
    user_id      text,
    key          text,
    request_hash text,
    ttl          interval DEFAULT NULL,
    lease        interval DEFAULT NULL,
    wait         boolean  DEFAULT false)
    RETURNS @extschema@.idem_reservation
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_reserve_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_complete(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    response  jsonb,
    status    text DEFAULT 'SUCCESS')
    RETURNS boolean
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_complete_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_release(
    operation   text,
    user_id     text,
    key         text,
    token       bigint,
    max_retries integer DEFAULT NULL)
    RETURNS text
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_release_native';

CREATE OR REPLACE FUNCTION @extschema@.idem_heartbeat(
    operation text,
    user_id   text,
    key       text,
    token     bigint,
    lease     interval DEFAULT NULL)
    RETURNS boolean
    LANGUAGE c VOLATILE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_heartbeat_native';

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

-- Internals run inside the API functions, as their owner.
REVOKE EXECUTE ON FUNCTION
    @extschema@._idem_setting(text),
    @extschema@._idem_conf(text),
    @extschema@._idem_check_part(text, text, boolean),
    @extschema@._idem_checked_interval(text, interval),
    @extschema@._idem_max_response_bytes(),
    @extschema@._idem_check_scope(text, text, text),
    @extschema@._idem_check_request_hash(text),
    @extschema@._idem_require(text, boolean),
    @extschema@._idem_check_batch_size(integer),
    @extschema@._idem_check_array(text, anyarray, text, integer, boolean),
    @extschema@._idem_echo(text),
    @extschema@._idem_require_writable(text),
    @extschema@._idem_ttl(interval),
    @extschema@._idem_lease(interval, interval),
    @extschema@._idem_max_retries(integer),
    @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer),
    @extschema@._idem_write_nowait(text, text, text, text, bigint, timestamptz, timestamptz, timestamptz),
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
    @extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text)
    TO idempotency_user;

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
