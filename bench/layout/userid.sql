-- Layout userid: bucket with the primary key on (user_id, id), the shape a Citus distributed
-- table needs (its unique keys must hold the distribution column, user_id).
CREATE SEQUENCE idem_token_seq AS bigint;
CREATE TABLE bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL);
CREATE FUNCTION proto_id(operation text, user_id text, key text) RETURNS uuid IMMUTABLE STRICT LANGUAGE sql
    AS $$ SELECT encode(substr(sha256((operation || E'\x1f' || user_id || E'\x1f' || key)::bytea), 1, 16), 'hex')::uuid $$;
CREATE TABLE idem_records (
    id               uuid        NOT NULL,
    token            bigint      NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    owner            regrole,
    status           "char"      NOT NULL,
    request_hash     bytea       NOT NULL,
    operation        text        NOT NULL,
    user_id          text        COLLATE "C" NOT NULL,
    key              text        NOT NULL,
    response         jsonb,
    CONSTRAINT idem_records_pkey PRIMARY KEY (user_id, id)
) WITH (vacuum_truncate = false);
CREATE INDEX idem_records_lease_idx ON idem_records (lease_expires_at) WHERE status = 'p';
CREATE FUNCTION proto_bucket(t timestamptz) RETURNS integer IMMUTABLE STRICT LANGUAGE sql
    AS $$ SELECT floor(extract(epoch FROM t - timestamptz '2000-01-01 00:00:00+00') / 64)::integer $$;
CREATE INDEX idem_records_expiry_idx ON idem_records (proto_bucket(expires_at)) WHERE status <> 'p';
CREATE TABLE idem_retries (
    id         uuid        NOT NULL,
    attempts   integer     NOT NULL,
    expires_at timestamptz NOT NULL,
    owner      regrole,
    operation  text        NOT NULL,
    user_id    text        NOT NULL,
    key        text        NOT NULL,
    CONSTRAINT idem_retries_pkey PRIMARY KEY (id)
) WITH (vacuum_truncate = false);
CREATE INDEX idem_retries_expiry_idx ON idem_retries (expires_at);

CREATE FUNCTION proto_fill(n bigint, hours integer) RETURNS void LANGUAGE sql AS $$
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, owner)
SELECT proto_id(o, u, k), o, u, k, sha256(i::text::bytea), 's', nextval('idem_token_seq'), '{"status": 201, "body": {"id": 1}}',
       e - interval '1 day' + interval '5 minutes', e, e - interval '1 day', to_regrole(current_user)
  FROM generate_series(1, n) AS i,
       LATERAL (SELECT 'bench.fresh' AS o, 'u' || (1 + i % 1000) AS u, 'k' || abs(hashint8extended(i, 0)) AS k,
                       now() + make_interval(hours => hours) + (i::float8 / n) * interval '22 hours' AS e) AS t
$$;

CREATE FUNCTION proto_sweep(batch integer, at timestamptz DEFAULT clock_timestamp()) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_now timestamptz := at; v_rows bigint;
BEGIN
    DELETE FROM idem_records AS r
     WHERE r.ctid = ANY (ARRAY(SELECT x.ctid FROM idem_records AS x
                                WHERE x.status <> 'p' AND proto_bucket(x.expires_at) <= proto_bucket(v_now) AND x.expires_at <= v_now
                                LIMIT batch FOR UPDATE OF x SKIP LOCKED))
       AND r.status <> 'p' AND r.expires_at <= v_now;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END $$;

-- cycle
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT (SELECT r.request_hash = sha256(('k' || :k)::bytea) FROM idem_records AS r
         WHERE r.id = proto_id('bench.fresh', 'u' || :u, 'k' || :k)
           AND r.operation = 'bench.fresh' AND r.user_id = 'u' || :u AND r.key = 'k' || :k),
       (SELECT t.attempts FROM idem_retries AS t WHERE t.id = proto_id('bench.fresh', 'u' || :u, 'k' || :k)
           AND t.operation = 'bench.fresh' AND t.user_id = 'u' || :u AND t.key = 'k' || :k),
       pg_advisory_xact_lock(hashtextextended('bench.fresh' || E'\x1f' || 'u' || :u || E'\x1f' || 'k' || :k, 0));
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, owner)
VALUES (proto_id('bench.fresh', 'u' || :u, 'k' || :k), 'bench.fresh', 'u' || :u, 'k' || :k, sha256(('k' || :k)::bytea), 's',
        nextval('idem_token_seq'), '{"status": 201}', clock_timestamp() + interval '5 minutes', clock_timestamp() + interval '1 day',
        clock_timestamp(), to_regrole(current_user));
COMMIT;
