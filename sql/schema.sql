-- idempotency: tables, the token sequence and the reservation type.
--
-- Every object is qualified with @extschema@ and every operator with pg_catalog: nothing here
-- depends on the search_path at CREATE EXTENSION time.

-- Tokens fence every mutating call. One sequence (no per-backend cache), so tokens are unique and
-- increase over the life of the database; registered below so a dump and restore keeps its position.
CREATE SEQUENCE @extschema@.idem_token_seq AS bigint;

COMMENT ON SEQUENCE @extschema@.idem_token_seq IS
    'Fencing tokens for idem_reserve: unique and increasing over the life of the database.';

-- How a record is keyed and stored (docs/record-layout.md, "The chosen layout"). _idem_id and
-- _idem_hash are the core crate's (core/src/record.rs; the portable install's SQL twins are in
-- sql/portable/record.sql, and tests/tests/args_parity.rs proves them equal); the status codes
-- are core/src/vocabulary.rs's Status::code. The SQL functions below have no SET clause, so
-- the planner inlines them (in the expiry index's expression too): their bodies name only
-- pg_catalog's objects.

-- The record's id: the first 16 bytes of SHA-256(operation, 0x1F, user_id, 0x1F, key) over the
-- texts' bytes in the database's encoding, as a uuid (a fixed-width primary key compared by
-- memcmp). Every probe re-checks the three texts, so keys whose ids collide never answer as each
-- other's record.
CREATE FUNCTION @extschema@._idem_id(operation text, user_id text, key text) RETURNS uuid
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_id_wrapper';

COMMENT ON FUNCTION @extschema@._idem_id(text, text, text) IS
    'Internal: the id of (operation, user_id, key): the first 16 bytes of SHA-256 over the three texts (database encoding) separated by 0x1F.';

-- A request hash as stored: the 32 bytes of 64 lowercase hex digits (the fingerprint clients
-- send), any other text its SHA-256 (so equal texts stay equal and different ones differ).
CREATE FUNCTION @extschema@._idem_hash(request_hash text) RETURNS bytea
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', '_idem_hash_wrapper';

COMMENT ON FUNCTION @extschema@._idem_hash(text) IS
    'Internal: request_hash as stored: the bytes of 64 lowercase hex digits, else the SHA-256 of the text.';

-- The status vocabulary's SQL side: the word every function takes and answers <-> the one-byte
-- code the table stores (core/src/vocabulary.rs, Status::code). NULL for anything else.
CREATE FUNCTION @extschema@._idem_status_code(word text) RETURNS pg_catalog."char"
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $fn$
    SELECT (CASE WHEN word OPERATOR(pg_catalog.=) 'PROCESSING' THEN 'p'
                 WHEN word OPERATOR(pg_catalog.=) 'SUCCESS' THEN 's'
                 WHEN word OPERATOR(pg_catalog.=) 'FAILED' THEN 'f'
                 WHEN word OPERATOR(pg_catalog.=) 'RESUMABLE' THEN 'r' END)::pg_catalog."char"
$fn$;

COMMENT ON FUNCTION @extschema@._idem_status_code(text) IS
    'Internal: the code idem_records.status stores for a status word (PROCESSING p, SUCCESS s, FAILED f, RESUMABLE r).';

CREATE FUNCTION @extschema@._idem_status_word(code pg_catalog."char") RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $fn$
    SELECT CASE WHEN code OPERATOR(pg_catalog.=) 'p' THEN 'PROCESSING'
                WHEN code OPERATOR(pg_catalog.=) 's' THEN 'SUCCESS'
                WHEN code OPERATOR(pg_catalog.=) 'f' THEN 'FAILED'
                WHEN code OPERATOR(pg_catalog.=) 'r' THEN 'RESUMABLE' END
$fn$;

COMMENT ON FUNCTION @extschema@._idem_status_word(pg_catalog."char") IS
    'Internal: the status word of a code of idem_records.status.';

-- The sweep's index key: expires_at in 64-second buckets since 2000-01-01 UTC, so the expiry
-- index keeps one deduplicated posting list per bucket instead of an entry per timestamp.
CREATE FUNCTION @extschema@._idem_expiry_bucket(expires_at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $fn$
    SELECT pg_catalog.floor(EXTRACT(epoch FROM expires_at OPERATOR(pg_catalog.-) '2000-01-01 00:00+00'::pg_catalog.timestamptz)
                            OPERATOR(pg_catalog./) 64)::integer
$fn$;

COMMENT ON FUNCTION @extschema@._idem_expiry_bucket(timestamptz) IS
    'Internal: the 64-second bucket of an expiry, the key of idem_records_expiry_idx.';

-- Both tables churn: every row is deleted by the sweep some time after it is written, and the
-- maintenance worker vacuums after a large sweep (extension/src/vacuum.rs). vacuum_truncate = false
-- keeps the space a VACUUM frees for the next rows instead of giving the empty tail back to the
-- file system, which would take an ACCESS EXCLUSIVE lock on the table at each such VACUUM (and
-- replay it on every standby) only to grow the file again (docs/operations.md, "Table size").
-- Fixed-width columns first, so no padding falls before the variable ones.
CREATE TABLE @extschema@.idem_records (
    id               uuid        NOT NULL, -- _idem_id(operation, user_id, key)
    token            bigint      NOT NULL,
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
    -- The transient failures counted for the key when the record was created (its live retry
    -- counter's), and again when a release poisons it: a replay answers from the record alone.
    attempts         integer     NOT NULL,
    status           pg_catalog."char" NOT NULL, -- _idem_status_code: p, s, f, r (no CHECK: only the functions write)
    request_hash     bytea       NOT NULL, -- _idem_hash: 32 bytes
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    response         jsonb,
    -- The recovery point (0.7.0, docs/recovery-points.md): the ordinal of the last step an
    -- attempt recorded with idem_checkpoint (0 = started, kept after completion) and that
    -- step's state (cleared by idem_complete). Both NULL on a record without one.
    step             integer,
    state            jsonb,
    CONSTRAINT idem_records_pkey PRIMARY KEY (id)
) WITH (vacuum_truncate = false);

COMMENT ON TABLE @extschema@.idem_records IS
    'One record per (operation, user_id, key), keyed by its id digest: the reservation, its fencing token and the stored response.';

-- idem_recover_stuck walks PROCESSING records by lease end; the partial index holds only those, so
-- its cost grows with the in-flight rows, not with the table.
CREATE INDEX idem_records_lease_idx ON @extschema@.idem_records (lease_expires_at)
    WHERE status OPERATOR(pg_catalog.=) 'p'::pg_catalog."char";

-- idem_sweep deletes finished and RESUMABLE records by expiry; PROCESSING rows (recovered, not
-- swept) stay out. Keyed by the 64-second bucket (deduplicated: a few bytes per record); the sweep
-- reads the buckets up to now's and re-checks expires_at.
CREATE INDEX idem_records_expiry_idx ON @extschema@.idem_records (@extschema@._idem_expiry_bucket(expires_at))
    WHERE status OPERATOR(pg_catalog.<>) 'p'::pg_catalog."char";

-- The transient-failure counter outlives the record that idem_release deletes, so a retried key
-- keeps counting towards max_retries. A counter belongs to every record created before it expired.
CREATE TABLE @extschema@.idem_retries (
    operation  text        NOT NULL,
    user_id    text        NOT NULL,
    key        text        NOT NULL,
    attempts   integer     NOT NULL CHECK (attempts OPERATOR(pg_catalog.>) 0),
    expires_at timestamptz NOT NULL,
    -- The owner of the record whose failure started the count (guarantee 8, as idem_records'
    -- owner): while the counter lives the released key stays that role's, so another role can
    -- neither reserve it (42501) nor count toward it. NULL on counters written before 0.7.0:
    -- any role's, as before, until they expire.
    owner      regrole,
    CONSTRAINT idem_retries_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);

COMMENT ON TABLE @extschema@.idem_retries IS
    'Transient failures per (operation, user_id, key); kept after the record is released, swept once expired and unneeded.';

CREATE INDEX idem_retries_expiry_idx ON @extschema@.idem_retries (expires_at);

-- What idem_lookup answers: the record's columns as every version answered them (0.6.0's table,
-- with 0.7.0's step and state): the status as its word, the request hash as 64 hex digits (the
-- text sent, when it was 64 lowercase hex digits; else its SHA-256), no id and no attempts.
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

CREATE TYPE @extschema@.idem_reservation AS (
    outcome    text,
    token      bigint,
    response   jsonb,
    attempts   integer,
    expires_at timestamptz,
    step       integer,
    state      jsonb
);

COMMENT ON TYPE @extschema@.idem_reservation IS
    'The answer of idem_reserve: outcome (created | resume | replay | failed | in_progress | mismatch), the token when created or resumed, the stored response on replay or failed, transient failures so far, the record''s expiry, and on resume the last recovery point''s step and state.';

-- pg_dump keeps the rows of both tables and the sequence's position.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_records'::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_retries'::pg_catalog.regclass, '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_token_seq'::pg_catalog.regclass, '');
