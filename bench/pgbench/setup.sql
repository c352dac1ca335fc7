-- The benchmark database: the extension, a business table, and completed keys to replay.
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE IF NOT EXISTS bench_charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL);
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, response,
                          lease_expires_at, expires_at, created_at, updated_at, attempts)
SELECT _idem_id('bench.replay', 'u', 'r' || i), 'bench.replay', 'u', 'r' || i, _idem_hash('h'), 's',
       nextval('idem_token_seq'), '{"status": 201, "body": {"id": 1}}',
       now(), now() + interval '10 days', now(), now(), 0
  FROM generate_series(1, 100000) AS i
    ON CONFLICT DO NOTHING;
-- The minimal hand-written protocol's table (minimal.sql): one key column, one expiry index.
CREATE TABLE IF NOT EXISTS idem_minimal (key text PRIMARY KEY, status text NOT NULL, response jsonb,
                                         expires_at timestamptz NOT NULL);
CREATE INDEX IF NOT EXISTS idem_minimal_expires_at ON idem_minimal (expires_at);
