-- The extension, in-transaction flow: reserve, business insert, complete.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT token FROM idem_reserve('bench.fresh', 'u' || :u, 'k' || :k, 'h') \gset
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
SELECT idem_complete('bench.fresh', 'u' || :u, 'k' || :k, :token, '{"status": 201}');
COMMIT;
