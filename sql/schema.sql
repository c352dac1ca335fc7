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
    status           text        NOT NULL, -- checked by idem_records_status_check below
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
    -- The recovery point (0.7.0, docs/recovery-points.md): the ordinal of the last step an
    -- attempt recorded with idem_checkpoint (0 = started, kept after completion) and that
    -- step's state (cleared by idem_complete). Both NULL on a record without one.
    step             integer,
    state            jsonb,
    CONSTRAINT idem_records_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);

-- The statuses: RESUMABLE (0.7.0) is a key with a recovery point whose attempt ended without
-- finishing, waiting for a retry or a completer to resume it (docs/recovery-points.md). Added
-- NOT VALID, as the update from 0.6.0 adds it (sql/upgrade/idempotency--0.6.0--0.7.0.sql: it
-- widens the old check without scanning the table under the update's lock): every row written
-- is checked all the same, and a fresh install's schema stays the updated one's.
ALTER TABLE @extschema@.idem_records
    ADD CONSTRAINT idem_records_status_check CHECK (status OPERATOR(pg_catalog.=) ANY
        (ARRAY['PROCESSING', 'SUCCESS', 'FAILED', 'RESUMABLE']::pg_catalog.text[])) NOT VALID;

COMMENT ON TABLE @extschema@.idem_records IS
    'One record per (operation, user_id, key): the reservation, its fencing token and the stored response.';

-- idem_recover_stuck walks PROCESSING records by lease end; the partial index holds only those, so
-- its cost grows with the in-flight rows, not with the table.
CREATE INDEX idem_records_lease_idx ON @extschema@.idem_records (lease_expires_at)
    WHERE status OPERATOR(pg_catalog.=) 'PROCESSING'::pg_catalog.text;

-- idem_sweep deletes finished and RESUMABLE records by expiry; PROCESSING rows (recovered, not
-- swept) stay out.
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
