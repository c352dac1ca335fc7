-- idem_distribute and _idem_distributed on a server without Citus (xtask/src/layers/citus.rs tests
-- them on a Citus cluster): not distributed, so recovery and sweep keep their set-based path;
-- idem_distribute refuses clearly and changes nothing.
\set VERBOSITY sqlstate
SELECT _idem_distributed() AS distributed;
SELECT idem_distribute(NULL);
SELECT idem_distribute('idem_retries');
\set VERBOSITY default
SELECT idem_distribute('idem_retries');
SELECT _idem_distributed() AS still_distributed;
