-- Bloat cycles: fresh executions whose records expire almost at once (swept between cycles).
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT token FROM idem_reserve('bench.cycle', 'u' || :u, 'k' || :k, 'h', ttl => '1 ms') \gset
SELECT idem_complete('bench.cycle', 'u' || :u, 'k' || :k, :token, '{"status": 201}');
COMMIT;
