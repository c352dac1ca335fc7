-- The extension: idem_reserve of a key that completed (a replay).
\set k random(1, 100000)
SELECT outcome, response FROM idem_reserve('bench.replay', 'u', 'r' || :k, 'h');
