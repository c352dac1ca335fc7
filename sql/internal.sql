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

-- A text argument as UTF-8 bytes, as the native functions read every text argument
-- (extension/src/encoding.rs): converted from the database's encoding by PostgreSQL (its own
-- error, 22P05, for a character with no UTF-8 equivalent); in SQL_ASCII, which converts nothing,
-- its bytes as they are when they are valid UTF-8 (the longest valid prefix, matched on their hex
-- form, is all of them), else 22021 naming the argument and the first invalid byte.
CREATE FUNCTION @extschema@._idem_utf8(name text, value text) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    b     bytea;
    valid integer;
BEGIN
    IF getdatabaseencoding() <> 'SQL_ASCII' THEN
        RETURN convert_to(value, 'UTF8');
    END IF;
    b := convert_to(value, 'SQL_ASCII');
    valid := octet_length(substring(encode(b, 'hex') FROM
        '^(?:[0-7][0-9a-f]|(?:c[2-9a-f]|d[0-9a-f])[89ab][0-9a-f]|e0[ab][0-9a-f][89ab][0-9a-f]'
        '|(?:e[1-9a-cef])(?:[89ab][0-9a-f]){2}|ed[89][0-9a-f][89ab][0-9a-f]'
        '|f0(?:9[0-9a-f]|[ab][0-9a-f])(?:[89ab][0-9a-f]){2}|f[1-3](?:[89ab][0-9a-f]){3}'
        '|f48[0-9a-f](?:[89ab][0-9a-f]){2})*')) / 2;
    IF valid < length(b) THEN
        RAISE EXCEPTION '% must be valid UTF-8 (SQL_ASCII text is not converted), found an invalid byte sequence at byte %',
            name, valid USING ERRCODE = '22021';
    END IF;
    RETURN b;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_utf8(text, text) IS
    'Internal: a text argument as UTF-8 bytes (converted from the database''s encoding); in SQL_ASCII its bytes, or 22021 naming the argument when they are not UTF-8.';

-- The length of a text in UTF-8 bytes, as the native functions measure a response: its own
-- where text is stored unconverted (UTF8; SQL_ASCII keeps the client's bytes), else its
-- conversion's.
CREATE FUNCTION @extschema@._idem_utf8_length(value text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN getdatabaseencoding() IN ('UTF8', 'SQL_ASCII') THEN octet_length(value)
                ELSE octet_length(convert_to(value, 'UTF8')) END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_utf8_length(text) IS
    'Internal: the length of a text in UTF-8 bytes (a response''s size, as the native functions measure it).';

-- The rule of one key part or request_hash, for the PL/pgSQL twins of the native checks: on the
-- value's UTF-8 bytes, as the native checks (in a UTF-8 database, the text itself).
CREATE FUNCTION @extschema@._idem_check_part(name text, value text, forbid_controls boolean)
    RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    utf8 boolean := getdatabaseencoding() = 'UTF8';
    b    bytea;
    n    integer;
BEGIN
    IF value IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', name USING ERRCODE = '22004';
    END IF;
    IF utf8 THEN
        n := octet_length(value);
    ELSE
        b := @extschema@._idem_utf8(name, value);
        n := length(b);
    END IF;
    IF n NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION '% must be 1 to 255 bytes, got %', name, n
            USING ERRCODE = '22023';
    END IF;
    IF NOT forbid_controls THEN
        RETURN true;
    END IF;
    -- The first control character's byte offset in UTF-8 (U+0080-U+009F are C2 80-C2 9F), or NULL.
    IF utf8 THEN
        n := CASE WHEN value ~ E'[\\x01-\\x1f\\x7f-\\x9f]'
                  THEN octet_length(substring(value FROM E'^[^\\x01-\\x1f\\x7f-\\x9f]*')) END;
    ELSE
        n := octet_length(substring(encode(b, 'hex') FROM '^((?:..)*?)(?:0[1-9a-f]|1[0-9a-f]|7f|c2[89][0-9a-f])')) / 2;
    END IF;
    IF n IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain control characters (U+0000-U+001F, U+007F-U+009F), found one at byte %',
            name, n
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

CREATE FUNCTION @extschema@._idem_check_step(step integer) RETURNS boolean
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_check_step_wrapper';

COMMENT ON FUNCTION @extschema@._idem_check_step(integer) IS
    'Internal: true, or 22004/22023 when the step of a recovery point is NULL or below 0.';

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

-- How an error message shows a rejected word: quoted when short (at most 32 bytes of UTF-8),
-- only its size otherwise, so a huge argument is never echoed; by its size too when it is not
-- ASCII in a database that is not UTF-8 (extension/src/encoding.rs: the native messages keep to
-- ASCII there, and SQL_ASCII bytes need not be UTF-8).
CREATE FUNCTION @extschema@._idem_echo(value text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
    SELECT CASE WHEN x.n <= 32 AND (x.utf8 OR value ~ '^[\x01-\x7f]*$') THEN quote_literal(value)
                ELSE format('a %s-byte value', x.n) END
      FROM (SELECT getdatabaseencoding() = 'UTF8' AS utf8,
                   CASE WHEN getdatabaseencoding() IN ('UTF8', 'SQL_ASCII') THEN octet_length(value)
                        ELSE octet_length(convert_to(value, 'UTF8')) END AS n) AS x
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
-- the retry counter, then poison the record at max_retries, or else delete it so a retry runs
-- again; a record with a recovery point (step, docs/recovery-points.md) is kept RESUMABLE
-- instead, so a retry or a completer continues from that point. Shared by idem_release,
-- idem_recover_stuck and the resume of an expired holder in idem_reserve.
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
    v_owner    oid;
    v_step     integer;
    v_until    timestamptz;
    v_token    bigint;
    v_counted  boolean; -- receives _idem_count
BEGIN
    -- The count belongs to the record's owner (guarantee 8; a statement of its own, which
    -- Citus routes to the key's shard as the INSERT below).
    SELECT r.owner, r.step INTO v_owner, v_step
      FROM @extschema@.idem_records AS r
     WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
    -- A counter that expired before this record was created belongs to an earlier life of the
    -- key: start again from 1, as the record's owner's. A live one continues, and keeps its
    -- owner (this record's owner or a role it is a member of: idem_reserve refuses anyone else
    -- while the counter lives; or none, a counter from before 0.7.0).
    INSERT INTO @extschema@.idem_retries AS t (operation, user_id, key, attempts, expires_at, owner)
    VALUES (operation, user_id, key, 1, expires_at, v_owner)
    ON CONFLICT ON CONSTRAINT idem_retries_pkey DO UPDATE
        SET attempts   = CASE WHEN t.expires_at > created_at THEN t.attempts + 1 ELSE 1 END,
            owner      = CASE WHEN t.expires_at > created_at THEN t.owner ELSE excluded.owner END,
            expires_at = greatest(t.expires_at, excluded.expires_at)
    RETURNING t.attempts INTO v_attempts;

    IF v_attempts >= max_retries THEN
        UPDATE @extschema@.idem_records AS r
           SET status = 'f', state = NULL, attempts = v_attempts, updated_at = v_now
         WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
        v_counted := @extschema@._idem_count('poisonings');
        RETURN 'poisoned';
    END IF;
    IF v_step IS NULL THEN
        DELETE FROM @extschema@.idem_records AS r
         WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
    ELSE
        -- Kept for a resume: a new token fences the attempt that held it out, and the record
        -- (with its counter) lives at least one idempotency.ttl more, for a retry or a completer.
        -- (Values, not calls inside the UPDATE: Citus refuses a volatile call there.)
        v_until := greatest(expires_at, v_now + @extschema@._idem_ttl(NULL));
        v_token := nextval('@extschema@.idem_token_seq');
        UPDATE @extschema@.idem_records AS r
           SET status = 'r', token = v_token, attempts = v_attempts,
               lease_expires_at = v_now, expires_at = v_until, updated_at = v_now
         WHERE r.id = @extschema@._idem_id(operation, user_id, key) AND r.operation = operation AND r.user_id = user_id AND r.key = key;
        UPDATE @extschema@.idem_retries AS t
           SET expires_at = greatest(t.expires_at, v_until)
         WHERE t.operation = operation AND t.user_id = user_id AND t.key = key;
    END IF;
    v_counted := @extschema@._idem_count('releases');
    RETURN 'released';
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_release_locked(text, text, text, timestamptz, timestamptz, integer) IS
    'Internal: counts a transient failure of a locked PROCESSING record, then poisons (FAILED) it, keeps it RESUMABLE (a record with a recovery point) or deletes it.';

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

-- The records kept from 0.6.0 (docs/record-layout.md, "The update from 0.6.0"). The update
-- renames 0.6.0's table to idem_records_060 and creates the new idem_records empty, catalog only;
-- the old rows move one key at a time when a call reaches their key (_idem_adopt) and in batches
-- behind it (idem_move_records: the maintenance worker, idem_maintain), and the old table is
-- dropped once empty. A fresh install never has idem_records_060: each function below then
-- answers at its first line, a catalog lookup. The table is named only inside PL/pgSQL bodies,
-- planned when they run. Its drop takes the advisory lock (1768189296, 60) exclusively, and
-- _idem_adopt holds it shared from its second look on, so a call never meets the table dropped
-- halfway; the batch functions, which the maintenance calls alone run, catch undefined_table.
--
-- The one conversion rule: the given rows of idem_records_060 deleted and inserted into
-- idem_records (in a batch, not the finished expired ones: idem_sweep would delete them) with their id digest, their
-- hash as stored (64 lowercase hex digits decoded, any other text hashed), their status code and
-- the retry count they were created with (their counter's, if it was live then: what a replay
-- answered). The delete and the insert are one statement: a reader sees the record in one table
-- or the other, never in neither. A key that already has a record in the new table (written
-- after the old one expired) keeps it: the old row goes.
CREATE FUNCTION @extschema@._idem_legacy_move(ctids tid[], batch boolean) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_n   bigint;
BEGIN
    WITH gone AS (
        DELETE FROM @extschema@.idem_records_060 AS o
         WHERE o.ctid = ANY (ctids)
        RETURNING o.*
    ), moved AS (
        INSERT INTO @extschema@.idem_records
               (id, token, lease_expires_at, expires_at, created_at, updated_at, owner, attempts, status,
                request_hash, operation, user_id, key, response)
        SELECT @extschema@._idem_id(o.operation, o.user_id, o.key), o.token, o.lease_expires_at, o.expires_at,
               o.created_at, o.updated_at, o.owner,
               coalesce((SELECT t.attempts FROM @extschema@.idem_retries AS t
                          WHERE t.operation = o.operation AND t.user_id = o.user_id AND t.key = o.key
                            AND t.expires_at > o.created_at), 0),
               @extschema@._idem_status_code(o.status), @extschema@._idem_hash(o.request_hash),
               o.operation, o.user_id, o.key, o.response
          FROM gone AS o
         WHERE NOT batch OR o.status = 'PROCESSING' OR o.expires_at > v_now
        ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM gone;
    RETURN v_n;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_legacy_move(tid[], boolean) IS
    'Internal (the update from 0.6.0): moves the given rows of idem_records_060 into idem_records (in a batch, finished expired ones only deleted); returns how many rows left the old table.';

-- One batch of the old rows, rows other transactions hold skipped: 'stuck' (PROCESSING, lease
-- run out: idem_recover_stuck's), 'expired' (finished, expired: idem_sweep's) or 'any'
-- (PROCESSING first, by lease end, so recovery meets them early; then the rest in table order).
-- NULL when there is no old table; else how many rows left it.
CREATE FUNCTION @extschema@._idem_legacy_batch(batch_size integer, kind text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_n     bigint := 0;
BEGIN
    IF to_regclass('@extschema@.idem_records_060') IS NULL THEN
        RETURN NULL;
    END IF;
    BEGIN
        IF kind IN ('stuck', 'any') THEN
            v_n := @extschema@._idem_legacy_move(ARRAY(
                SELECT x.ctid FROM @extschema@.idem_records_060 AS x
                 WHERE x.status = 'PROCESSING' AND (kind = 'any' OR x.lease_expires_at <= v_now)
                 ORDER BY x.lease_expires_at
                 LIMIT batch_size
                   FOR UPDATE OF x SKIP LOCKED), true);
        END IF;
        IF kind = 'expired' THEN
            v_n := @extschema@._idem_legacy_move(ARRAY(
                SELECT x.ctid FROM @extschema@.idem_records_060 AS x
                 WHERE x.status <> 'PROCESSING' AND x.expires_at <= v_now
                 ORDER BY x.expires_at
                 LIMIT batch_size
                   FOR UPDATE OF x SKIP LOCKED), true);
        ELSIF kind = 'any' AND v_n < batch_size THEN
            v_n := v_n + @extschema@._idem_legacy_move(ARRAY(
                SELECT x.ctid FROM @extschema@.idem_records_060 AS x
                 LIMIT batch_size - v_n
                   FOR UPDATE OF x SKIP LOCKED), true);
        END IF;
    EXCEPTION WHEN undefined_table THEN
        RETURN NULL; -- dropped since the lookup
    END;
    RETURN v_n;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_legacy_batch(integer, text) IS
    'Internal (the update from 0.6.0): moves one batch of idem_records_060 into idem_records: kind stuck, expired or any (PROCESSING first). NULL without the old table, else the rows that left it.';

-- A key's record kept from 0.6.0, moved before a call reads or writes the key: every function
-- that reads or writes a record by its key calls this first (idem_reserve once it holds the
-- key's advisory lock). NULL when there is no old table (the only cost then: a catalog lookup).
-- Otherwise the key's old row, if any, is moved under its row lock, waiting for a transaction
-- that holds it (a batch moving it, another call moving it): after that wait the row is gone and
-- its record committed in idem_records, which the caller's next statement (a new snapshot) sees.
-- Never skipped: a call that skipped a row another transaction is moving would see no record and
-- could run the request twice. With wait => false (a reservation that must not wait) a row
-- another transaction holds answers false instead (the caller answers in_progress); true once the
-- key has nothing left in the old table. In a read-only transaction (a standby) nothing moves:
-- NULL. The caller reads the key again after a non-NULL answer.
CREATE FUNCTION @extschema@._idem_adopt(operation text, user_id text, key text, wait boolean DEFAULT true)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
#variable_conflict use_variable
DECLARE
    v_rows tid[];
BEGIN
    IF to_regclass('@extschema@.idem_records_060') IS NULL
       OR current_setting('transaction_read_only')::boolean THEN
        RETURN NULL;
    END IF;
    -- Held until this transaction ends: idem_move_records drops the old table only under the
    -- exclusive form, so once seen here it stays (no undefined_table to catch, so no
    -- subtransaction: a batch of keys calls this once per key). Looked up again in pg_class under
    -- a snapshot taken after the lock (the catalog cache may not have heard of a drop committed
    -- while this call waited: an advisory lock processes no invalidation). Gone: dropped since
    -- the first look, every row moved; true, so the caller reads the key again.
    PERFORM pg_advisory_xact_lock_shared(1768189296, 60);
    IF NOT EXISTS (SELECT FROM pg_class AS c
                    WHERE c.relname = 'idem_records_060'
                      AND c.relnamespace = '@extschema@'::regnamespace) THEN
        RETURN true;
    END IF;
    IF wait THEN
        v_rows := ARRAY(SELECT o.ctid FROM @extschema@.idem_records_060 AS o
                         WHERE o.operation = operation AND o.user_id = user_id AND o.key = key
                           FOR UPDATE);
    ELSE
        v_rows := ARRAY(SELECT o.ctid FROM @extschema@.idem_records_060 AS o
                         WHERE o.operation = operation AND o.user_id = user_id AND o.key = key
                           FOR UPDATE SKIP LOCKED);
        IF cardinality(v_rows) = 0
           AND EXISTS (SELECT FROM @extschema@.idem_records_060 AS o
                        WHERE o.operation = operation AND o.user_id = user_id AND o.key = key) THEN
            RETURN false; -- another transaction holds the key's old row
        END IF;
    END IF;
    IF cardinality(v_rows) > 0 THEN
        PERFORM @extschema@._idem_legacy_move(v_rows, false);
    END IF;
    RETURN true;
END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_adopt(text, text, text, boolean) IS
    'Internal (the update from 0.6.0): moves the key''s record from idem_records_060 into idem_records before a call reads or writes it. NULL without the old table (or read-only), false when wait is false and another transaction holds the old row, else true.';

REVOKE EXECUTE ON FUNCTION
    @extschema@._idem_legacy_move(tid[], boolean),
    @extschema@._idem_legacy_batch(integer, text),
    @extschema@._idem_adopt(text, text, text, boolean)
    FROM PUBLIC;
