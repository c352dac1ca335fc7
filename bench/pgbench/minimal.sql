-- Baseline: the smallest hand-written protocol (one table with a primary key and an expiry
-- index, no function call, no token, no lease): claim the key, the business insert, finish it.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
INSERT INTO idem_minimal (key, status, expires_at) VALUES ('u' || :u || '/k' || :k, 'PROCESSING', now() + interval '1 day')
ON CONFLICT DO NOTHING;
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
UPDATE idem_minimal SET status = 'SUCCESS', response = '{"status": 201}' WHERE key = 'u' || :u || '/k' || :k AND status = 'PROCESSING';
COMMIT;
