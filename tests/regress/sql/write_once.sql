-- The native hot path's write-once flow (extension/src/native/pending.rs): a fresh reservation
-- completed in its own transaction writes its record once, finished; one that is not completed
-- is written as PROCESSING when the transaction commits. Extension only: the portable install
-- inserts every reservation at once (the other files pin what both answer alike).
\set VERBOSITY sqlstate
CREATE TABLE wo_charges (k text);

-- Completed in the transaction: no row until idem_complete, then one finished row.
BEGIN;
SELECT token AS t, expires_at AS e FROM idem_reserve('wo', 'u', 'k1', 'h') \gset
SELECT count(*) AS rows_before_complete FROM idem_records WHERE operation = 'wo';
INSERT INTO wo_charges VALUES ('k1');
SELECT idem_complete('wo', 'u', 'k1', :t, '{"n": 1}');
SELECT status, response, token = :t AS same_token, expires_at = :'e' AS same_expiry,
       created_at <= updated_at AS ordered, lease_expires_at > created_at AS leased
  FROM idem_records WHERE operation = 'wo';
COMMIT;
SELECT * FROM res('wo', 'u', 'k1', 'h');

-- Committed without idem_complete (the two-phase flow, or a forgotten completion): the
-- pre-commit callback writes the PROCESSING record with the token, so the key stays reserved
-- and the token completes it later.
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 'k2', 'h') \gset
INSERT INTO wo_charges VALUES ('k2');
COMMIT;
SELECT status, token = :t AS same_token FROM idem_records WHERE operation = 'wo' AND key = 'k2';
SELECT * FROM res('wo', 'u', 'k2', 'h');
SELECT idem_complete('wo', 'u', 'k2', :t, '{"n": 2}');
SELECT * FROM res('wo', 'u', 'k2', 'h');

-- The same in autocommit: one statement, one transaction.
SELECT token AS t FROM idem_reserve('wo', 'u', 'k3', 'h') \gset
SELECT status, token = :t AS same_token FROM idem_records WHERE operation = 'wo' AND key = 'k3';

-- If the record cannot be written at commit, the commit fails and the business write with it.
CREATE FUNCTION wo_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'records refused' USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER wo_refuse BEFORE INSERT ON idem_records FOR EACH ROW EXECUTE FUNCTION wo_refuse();
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'u', 'k4', 'h');
INSERT INTO wo_charges VALUES ('k4');
COMMIT;
DROP TRIGGER wo_refuse ON idem_records;
SELECT count(*) AS k4_charges FROM wo_charges WHERE k = 'k4';
SELECT count(*) AS k4_records FROM idem_records WHERE operation = 'wo' AND key = 'k4';
SELECT * FROM res('wo', 'u', 'k4', 'h');

-- Reserved twice in one transaction: the second call writes the first's record and answers
-- from it (in_progress; replay once completed).
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 'k5', 'h') \gset
SELECT * FROM res('wo', 'u', 'k5', 'h');
SELECT status FROM idem_records WHERE operation = 'wo' AND key = 'k5';
SELECT idem_complete('wo', 'u', 'k5', :t, '{"n": 5}');
SELECT * FROM res('wo', 'u', 'k5', 'h');
COMMIT;

-- idem_lookup in the reserving transaction shows the reservation as its record.
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 'k6', 'h') \gset
SELECT status, token = :t AS same_token FROM idem_lookup('wo', 'u', 'k6');
SELECT idem_complete('wo', 'u', 'k6', :t, '{"n": 6}');
COMMIT;
SELECT status, response FROM idem_lookup('wo', 'u', 'k6');

-- A stale token leaves the reservation pending: false, and the record is written at commit.
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 'k7', 'h') \gset
SELECT idem_complete('wo', 'u', 'k7', :t + 1000000, '{}');
COMMIT;
SELECT status, token = :t AS same_token FROM idem_records WHERE operation = 'wo' AND key = 'k7';

-- Heartbeat and release of a pending reservation act on its record, as before.
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 'k8', 'h', lease => '1 minute') \gset
SELECT idem_heartbeat('wo', 'u', 'k8', :t, '2 hours');
SELECT lease_expires_at > now() + interval '1 hour' AS extended FROM idem_records WHERE operation = 'wo' AND key = 'k8';
SELECT idem_release('wo', 'u', 'k8', :t);
COMMIT;
SELECT count(*) AS k8_records FROM idem_records WHERE operation = 'wo' AND key = 'k8';
SELECT * FROM res('wo', 'u', 'k8', 'h');

-- Savepoints. Completed in a savepoint that rolls back: pending again, written PROCESSING at
-- commit, and the token still completes it.
BEGIN;
SELECT token AS t FROM idem_reserve('wo', 'u', 's1', 'h') \gset
SAVEPOINT a;
SELECT idem_complete('wo', 'u', 's1', :t, '{"n": 1}');
ROLLBACK TO SAVEPOINT a;
SELECT count(*) AS s1_rows FROM idem_records WHERE operation = 'wo' AND key = 's1';
COMMIT;
SELECT status FROM idem_records WHERE operation = 'wo' AND key = 's1';
SELECT idem_complete('wo', 'u', 's1', :t, '{"n": 1}');

-- Reserved in nested savepoints, completed in the inner one, the outer rolled back: nothing.
BEGIN;
SAVEPOINT a;
SELECT token AS t FROM idem_reserve('wo', 'u', 's2', 'h') \gset
SAVEPOINT b;
SELECT idem_complete('wo', 'u', 's2', :t, '{"n": 2}');
RELEASE SAVEPOINT b;
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT count(*) AS s2_rows FROM idem_records WHERE operation = 'wo' AND key = 's2';
SELECT * FROM res('wo', 'u', 's2', 'h');

-- Reserved in a savepoint that is released, completed after it: one finished row.
BEGIN;
SAVEPOINT a;
SELECT token AS t FROM idem_reserve('wo', 'u', 's3', 'h') \gset
RELEASE SAVEPOINT a;
SELECT idem_complete('wo', 'u', 's3', :t, '{"n": 3}');
COMMIT;
SELECT status, response FROM idem_records WHERE operation = 'wo' AND key = 's3';

-- A transaction that fails after reserving leaves nothing; the key is free at once.
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'u', 'f1', 'h');
SELECT 1 / 0;
COMMIT;
SELECT count(*) AS f1_rows FROM idem_records WHERE operation = 'wo' AND key = 'f1';

-- REPEATABLE READ and SERIALIZABLE: the same flow, the same single finished row.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT token AS t FROM idem_reserve('wo', 'u', 'rr', 'h') \gset
SELECT idem_complete('wo', 'u', 'rr', :t, '{"n": "rr"}');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT token AS t FROM idem_reserve('wo', 'u', 'sz', 'h') \gset
SELECT idem_complete('wo', 'u', 'sz', :t, '{"n": "sz"}');
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT outcome FROM idem_reserve('wo', 'u', 'sz2', 'h');
COMMIT;
SELECT key, status, response FROM idem_records WHERE operation = 'wo' AND key IN ('rr', 'sz', 'sz2') ORDER BY key;

DROP TABLE wo_charges;
DROP FUNCTION wo_refuse();
