-- Baseline: a store as the seed libraries build it, from the client: look the key up, reserve,
-- run, save, each statement its own transaction.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
SELECT status, response FROM idem_records WHERE operation = 'bench.seed' AND user_id = 'u' || :u AND key = 'k' || :k;
INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, lease_expires_at, expires_at, created_at, updated_at)
     VALUES ('bench.seed', 'u' || :u, 'k' || :k, 'h', 'PROCESSING', nextval('idem_token_seq'),
             clock_timestamp() + interval '5 minutes', clock_timestamp() + interval '1 day', clock_timestamp(), clock_timestamp())
ON CONFLICT DO NOTHING RETURNING token \gset
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
UPDATE idem_records SET status = 'SUCCESS', response = '{"status": 201}', updated_at = clock_timestamp()
 WHERE operation = 'bench.seed' AND user_id = 'u' || :u AND key = 'k' || :k AND token = :token;
