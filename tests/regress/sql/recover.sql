-- idem_recover_stuck: fail or release PROCESSING records whose lease expired; never live ones.
\set VERBOSITY sqlstate

SELECT (idem_reserve('rs', 'u', 'dead1', 'h', lease => '10 ms')).outcome;
SELECT (idem_reserve('rs', 'u', 'dead2', 'h', lease => '10 ms')).outcome;
SELECT (idem_reserve('rs', 'u', 'dead3', 'h', lease => '10 ms')).outcome;
SELECT (idem_reserve('rs', 'u', 'alive', 'h')).outcome;
SELECT token AS done FROM idem_reserve('rs', 'u', 'done', 'h', lease => '10 ms') \gset
SELECT idem_complete('rs', 'u', 'done', :done, '{"ok": true}');
SELECT token AS dead1 FROM idem_lookup('rs', 'u', 'dead1') \gset
SELECT pg_sleep(0.05);
SELECT stuck, processing FROM idem_stats();

-- fail, in batches: at most once, the crashed worker may have done the work.
SELECT idem_recover_stuck(batch_size => 1);
SELECT idem_recover_stuck(batch_size => 1, action => 'fail');
SELECT key, status FROM idem_records WHERE operation = 'rs' ORDER BY key;
-- A stale worker's late calls are rejected.
SELECT idem_complete('rs', 'u', 'dead1', :dead1, '{"late": true}');
SELECT idem_heartbeat('rs', 'u', 'dead1', :dead1);
SELECT idem_release('rs', 'u', 'dead1', :dead1);
SELECT * FROM res('rs', 'u', 'dead1', 'h');

-- release: a transient failure as idem_release counts it; the key runs again.
SELECT idem_recover_stuck(action => 'release');
SELECT key, status FROM idem_records WHERE operation = 'rs' ORDER BY key;
SELECT key, attempts FROM idem_retries WHERE operation = 'rs';
SELECT * FROM res('rs', 'u', 'dead3', 'h');
-- ... and poisons at max_retries.
SELECT (idem_reserve('rs', 'u', 'poison', 'h', lease => '10 ms')).outcome;
SELECT pg_sleep(0.05);
SELECT idem_recover_stuck(action => 'release', max_retries => 1);
SELECT status FROM idem_lookup('rs', 'u', 'poison');

-- Nothing left to recover: live leases and finished records are never touched.
SELECT idem_recover_stuck();
SELECT key, status FROM idem_records WHERE operation = 'rs' ORDER BY key;

-- Errors.
SELECT err($$SELECT idem_recover_stuck(batch_size => 0)$$);
SELECT err($$SELECT idem_recover_stuck(batch_size => NULL)$$);
SELECT err($$SELECT idem_recover_stuck(action => 'retry')$$);
SELECT err($$SELECT idem_recover_stuck(action => NULL)$$);
SELECT err($$SELECT idem_recover_stuck(max_retries => 0)$$);
SELECT idem_recover_stuck(action => 'FAIL');
DELETE FROM idem_records;
DELETE FROM idem_retries;
