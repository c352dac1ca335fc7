-- Baseline: a store as the seed libraries build it, from the client: look the key up, reserve,
-- run, save, each statement its own transaction.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
SELECT status, response FROM idem_records WHERE id = _idem_id('bench.seed', 'u' || :u, 'k' || :k) AND operation = 'bench.seed' AND user_id = 'u' || :u AND key = 'k' || :k;
INSERT INTO idem_records (id, operation, user_id, key, request_hash, status, token, lease_expires_at, expires_at, created_at, updated_at, attempts)
     VALUES (_idem_id('bench.seed', 'u' || :u, 'k' || :k), 'bench.seed', 'u' || :u, 'k' || :k, _idem_hash('h'), 'p', nextval('idem_token_seq'),
             clock_timestamp() + interval '5 minutes', clock_timestamp() + interval '1 day', clock_timestamp(), clock_timestamp(), 0)
ON CONFLICT DO NOTHING RETURNING token \gset
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
UPDATE idem_records SET status = 's', response = '{"status": 201}', updated_at = clock_timestamp()
 WHERE id = _idem_id('bench.seed', 'u' || :u, 'k' || :k) AND operation = 'bench.seed' AND user_id = 'u' || :u AND key = 'k' || :k AND token = :token;
