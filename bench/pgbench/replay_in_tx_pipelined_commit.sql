-- replay_in_tx_pipelined.sql ending the read-only transaction with COMMIT instead of ROLLBACK
-- (no AbortTransaction).
\set k random(1, 100000)
\startpipeline
BEGIN;
SELECT outcome, response FROM idem_reserve('bench.replay', 'u', 'r' || :k, 'h');
COMMIT;
\endpipeline
