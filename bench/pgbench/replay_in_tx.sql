-- A replay as the Rust client frames it, each statement its own round trip: BEGIN, idem_reserve
-- of a completed key, ROLLBACK (bench/profile-client.sh's comparison in docs/performance.md).
\set k random(1, 100000)
BEGIN;
SELECT outcome, response FROM idem_reserve('bench.replay', 'u', 'r' || :k, 'h');
ROLLBACK;
