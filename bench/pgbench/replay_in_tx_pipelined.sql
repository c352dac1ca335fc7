-- replay_in_tx.sql in one pipeline with one Sync: one round trip and one ReadyForQuery (the
-- Rust client sends one Sync per statement, which tokio-postgres does not let it merge).
\set k random(1, 100000)
\startpipeline
BEGIN;
SELECT outcome, response FROM idem_reserve('bench.replay', 'u', 'r' || :k, 'h');
ROLLBACK;
\endpipeline
