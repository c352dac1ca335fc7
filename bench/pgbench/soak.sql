-- The soak: fresh executions whose records expire a second later (ttl 1 s: a cycle's rows are all
-- written before the worker may sweep the first of them); one in ten is a transient
-- failure (released: the record goes, its retry counter stays until it expires). Only the
-- maintenance worker sweeps; autovacuum runs as configured.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
\set fail random(1, 10)
BEGIN;
SELECT token FROM idem_reserve('bench.soak', 'u' || :u, 'k' || :k, 'h', ttl => '1 s') \gset
\if :fail = 1
SELECT idem_release('bench.soak', 'u' || :u, 'k' || :k, :token);
\else
SELECT idem_complete('bench.soak', 'u' || :u, 'k' || :k, :token, '{"status": 201}');
\endif
COMMIT;
