-- Layout hash32: v060 with the request hash stored as 32 bytes (bytea: the SHA-256 the client's
-- 64 hex digits spell; any other text would be stored as its SHA-256).
CREATE SEQUENCE idem_token_seq AS bigint;
CREATE TABLE bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL);
CREATE TABLE idem_records (
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    request_hash     bytea       NOT NULL,
    status           text        NOT NULL CHECK (status = ANY (ARRAY['PROCESSING', 'SUCCESS', 'FAILED'])),
    token            bigint      NOT NULL,
    response         jsonb,
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    owner            regrole,
    CONSTRAINT idem_records_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);
CREATE INDEX idem_records_lease_idx ON idem_records (lease_expires_at) WHERE status = 'PROCESSING';
CREATE INDEX idem_records_expiry_idx ON idem_records (expires_at) WHERE status <> 'PROCESSING';
CREATE TABLE idem_retries (
    operation  text        NOT NULL,
    user_id    text        NOT NULL,
    key        text        NOT NULL,
    attempts   integer     NOT NULL CHECK (attempts > 0),
    expires_at timestamptz NOT NULL,
    owner      regrole,
    CONSTRAINT idem_retries_pkey PRIMARY KEY (operation, user_id, key)
) WITH (vacuum_truncate = false);
CREATE INDEX idem_retries_expiry_idx ON idem_retries (expires_at);

-- Records as bench/src/scale.rs fills them: users u1..u1000, keys k + a uniform 63-bit number.
CREATE FUNCTION proto_fill(n bigint, hours integer) RETURNS void LANGUAGE sql AS $$
INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, updated_at, owner)
SELECT 'bench.fresh', 'u' || (1 + i % 1000), 'k' || abs(hashint8extended(i, 0)), sha256(i::text::bytea),
       'SUCCESS', nextval('idem_token_seq'), '{"status": 201, "body": {"id": 1}}',
       e - interval '1 day' + interval '5 minutes', e, e - interval '1 day', e - interval '1 day', to_regrole(current_user)
  FROM generate_series(1, n) AS i,
       LATERAL (SELECT now() + make_interval(hours => hours) + (i::float8 / n) * interval '22 hours' AS e) AS t
$$;

-- idem_sweep's statement (sql/maintenance.sql).
CREATE FUNCTION proto_sweep(batch integer, at timestamptz DEFAULT clock_timestamp()) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_now timestamptz := at; v_rows bigint;
BEGIN
    DELETE FROM idem_records AS r
     WHERE r.ctid = ANY (ARRAY(SELECT x.ctid FROM idem_records AS x
                                WHERE x.status <> 'PROCESSING' AND x.expires_at <= v_now
                                LIMIT batch FOR UPDATE OF x SKIP LOCKED))
       AND r.status <> 'PROCESSING' AND r.expires_at <= v_now;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END $$;

-- cycle
-- Reserve (the record's and the retry counter's probes, the key's advisory lock), the business
-- insert, complete (the finished record, one plain INSERT with a token from the sequence).
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT (SELECT r.request_hash = sha256(('k' || :k)::bytea) FROM idem_records AS r
         WHERE r.operation = 'bench.fresh' AND r.user_id = 'u' || :u AND r.key = 'k' || :k),
       (SELECT t.attempts FROM idem_retries AS t WHERE t.operation = 'bench.fresh' AND t.user_id = 'u' || :u AND t.key = 'k' || :k),
       pg_advisory_xact_lock(hashtextextended('bench.fresh' || E'\x1f' || 'u' || :u || E'\x1f' || 'k' || :k, 0));
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, updated_at, owner)
VALUES ('bench.fresh', 'u' || :u, 'k' || :k, sha256(('k' || :k)::bytea), 'SUCCESS', nextval('idem_token_seq'),
        '{"status": 201}', clock_timestamp() + interval '5 minutes', clock_timestamp() + interval '1 day',
        clock_timestamp(), clock_timestamp(), to_regrole(current_user));
COMMIT;
