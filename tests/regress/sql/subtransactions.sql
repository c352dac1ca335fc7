-- Reservations inside savepoints and subtransactions: a rolled-back subtransaction undoes its
-- reservation, its completion or its release exactly as it undoes a business write, and the
-- key's advisory lock goes with it. Also the per-backend cache of the native functions: the
-- extension dropped and created again, and the records table changed, in the same session.
\set VERBOSITY sqlstate

-- A reservation rolled back to a savepoint leaves nothing; the same transaction creates again.
BEGIN;
SAVEPOINT s;
SELECT * FROM res('sub', 'u', 'k1', 'h');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS records FROM idem_lookup('sub', 'u', 'k1');
SELECT * FROM res('sub', 'u', 'k1', 'h');
COMMIT;
SELECT status FROM idem_lookup('sub', 'u', 'k1');

-- A completion rolled back to a savepoint: the record is PROCESSING again and the token still
-- completes it.
BEGIN;
SELECT token AS t FROM idem_reserve('sub', 'u', 'k2', 'h') \gset
SAVEPOINT s;
SELECT idem_complete('sub', 'u', 'k2', :t, '{"n": 1}');
SELECT * FROM res('sub', 'u', 'k2', 'h');
ROLLBACK TO SAVEPOINT s;
SELECT status, response FROM idem_lookup('sub', 'u', 'k2');
SELECT idem_complete('sub', 'u', 'k2', :t, '{"n": 2}');
COMMIT;
SELECT * FROM res('sub', 'u', 'k2', 'h');

-- A release rolled back to a savepoint: the record and the retry count come back.
BEGIN;
SELECT token AS t FROM idem_reserve('sub', 'u', 'k3', 'h') \gset
SAVEPOINT s;
SELECT idem_release('sub', 'u', 'k3', :t);
SELECT count(*) AS records FROM idem_lookup('sub', 'u', 'k3');
ROLLBACK TO SAVEPOINT s;
SELECT status FROM idem_lookup('sub', 'u', 'k3');
SELECT count(*) AS counters FROM idem_retries WHERE operation = 'sub';
SELECT idem_release('sub', 'u', 'k3', :t);
COMMIT;
SELECT * FROM res('sub', 'u', 'k3', 'h');

-- A reservation in a released (committed) subtransaction commits with the transaction.
BEGIN;
SAVEPOINT s;
SELECT token AS t FROM idem_reserve('sub', 'u', 'k4', 'h') \gset
RELEASE SAVEPOINT s;
SELECT idem_complete('sub', 'u', 'k4', :t, '{"n": 4}');
COMMIT;
SELECT * FROM res('sub', 'u', 'k4', 'h');

-- A PL/pgSQL exception block (a subtransaction) whose body reserves, then fails: nothing stays.
CREATE FUNCTION reserve_then_fail(k text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM idem_reserve('sub', 'u', k, 'h');
        RAISE EXCEPTION 'handler failed';
    EXCEPTION WHEN raise_exception THEN
        RETURN 'caught';
    END;
END $$;
SELECT reserve_then_fail('k5');
SELECT count(*) AS records FROM idem_lookup('sub', 'u', 'k5');
SELECT * FROM res('sub', 'u', 'k5', 'h');

-- Two reservations of one key in one statement: the second sees the first (in_progress).
SELECT a.outcome AS first, b.outcome AS second
  FROM idem_reserve('sub', 'u', 'k6', 'h') AS a, idem_reserve('sub', 'u', 'k6', 'h') AS b;

-- An error inside a native function, caught by a savepoint: the session keeps working.
BEGIN;
SAVEPOINT s;
SELECT idem_complete('sub', 'u', 'k7', NULL, NULL);
ROLLBACK TO SAVEPOINT s;
SELECT * FROM res('sub', 'u', 'k7', 'h');
COMMIT;

-- The records table changed under the cached column numbers: a column dropped and added back
-- moves it; the next calls read the new layout.
ALTER TABLE idem_records DROP COLUMN response;
ALTER TABLE idem_records ADD COLUMN response jsonb;
SELECT token AS t FROM idem_reserve('sub', 'u', 'k8', 'h') \gset
SELECT idem_complete('sub', 'u', 'k8', :t, '{"n": 8}');
SELECT * FROM res('sub', 'u', 'k8', 'h');

-- The extension dropped and created again in this session: new relations, new OIDs.
\set regress_db :DBNAME
CREATE DATABASE idem_subtransactions;
\c idem_subtransactions
SET client_min_messages = warning;
CREATE EXTENSION idempotency;
SELECT outcome FROM idem_reserve('sub', 'u', 'k', 'h');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT outcome, token FROM idem_reserve('sub', 'u', 'k', 'h');
SELECT idem_complete('sub', 'u', 'k', 1, '{"again": true}');
SELECT outcome, response FROM idem_reserve('sub', 'u', 'k', 'h');
\c :regress_db
DROP DATABASE idem_subtransactions;
