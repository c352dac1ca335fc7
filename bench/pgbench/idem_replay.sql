-- The extension: idem_replay of a key that completed (replay first: the read-only answer, in
-- autocommit, no reservation).
\set k random(1, 100000)
SELECT outcome, response FROM idem_replay('bench.replay', 'u', 'r' || :k, 'h');
