-- Layout bare: v060's tables, and a cycle of the business insert alone (bench/pgbench/bare.sql):
-- what any protocol adds to.
CREATE SEQUENCE idem_token_seq AS bigint;
CREATE TABLE bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL);
CREATE TABLE idem_records (
    operation        text        NOT NULL,
    user_id          text        NOT NULL,
    key              text        NOT NULL,
    request_hash     text        NOT NULL,
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
SELECT 'bench.fresh', 'u' || (1 + i % 1000), 'k' || abs(hashint8extended(i, 0)), encode(sha256(i::text::bytea), 'hex'),
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
\set u random(1, 1000)
BEGIN;
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
COMMIT;
