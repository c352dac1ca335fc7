-- The two flows of the contract, and the release checklist as far as SQL can express it.
\set VERBOSITY sqlstate
CREATE TABLE charges (id serial PRIMARY KEY, user_id text, amount int);

-- In-transaction flow: reserve, business write, complete, commit.
BEGIN;
SELECT token AS t FROM idem_reserve('payments.create', 'user-42', 'k-1', idem_fingerprint('{"amount": 100}')) \gset
INSERT INTO charges (user_id, amount) VALUES ('user-42', 100) RETURNING id;
SELECT idem_complete('payments.create', 'user-42', 'k-1', :t, '{"status": 201, "body": {"id": 1}}');
COMMIT;
-- Checklist: a duplicate replays and the work ran once.
SELECT * FROM res('payments.create', 'user-42', 'k-1', idem_fingerprint('{"amount": 100}'));
SELECT count(*) AS charges FROM charges;
-- Checklist: same key, different payload: mismatch.
SELECT * FROM res('payments.create', 'user-42', 'k-1', idem_fingerprint('{"amount": 200}'));
-- Checklist: keys are isolated per user and per operation.
SELECT * FROM res('payments.create', 'user-43', 'k-1', idem_fingerprint('{"amount": 100}'));
SELECT * FROM res('payments.refund', 'user-42', 'k-1', idem_fingerprint('{"amount": 100}'));

-- Atomic with the business write: a rollback after complete leaves neither the charge nor the key.
BEGIN;
SELECT token AS t FROM idem_reserve('payments.create', 'user-42', 'k-2', 'h') \gset
INSERT INTO charges (user_id, amount) VALUES ('user-42', 5);
SELECT idem_complete('payments.create', 'user-42', 'k-2', :t, '{"status": 201}');
ROLLBACK;
SELECT count(*) AS records, (SELECT count(*) FROM charges WHERE amount = 5) AS charges
  FROM idem_lookup('payments.create', 'user-42', 'k-2');
SELECT * FROM res('payments.create', 'user-42', 'k-2', 'h');

-- Checklist: a permanent failure is stored as FAILED (an error response is never a success),
-- and replays as failed.
BEGIN;
SELECT token AS t FROM idem_reserve('payments.create', 'user-42', 'k-3', 'h') \gset
SELECT idem_complete('payments.create', 'user-42', 'k-3', :t, '{"status": 402, "error": "declined"}', 'FAILED');
COMMIT;
SELECT * FROM res('payments.create', 'user-42', 'k-3', 'h');

-- Checklist: a transient failure releases (business write undone, count kept) and re-executes;
-- max_retries transient failures poison.
CREATE FUNCTION attempt(k text, fail boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r idem_reservation;
BEGIN
    r := idem_reserve('payments.create', 'user-42', k, 'h');
    IF r.outcome <> 'created' THEN
        RETURN r.outcome;
    END IF;
    BEGIN -- a subtransaction: the savepoint after the reservation
        INSERT INTO charges (user_id, amount) VALUES ('user-42', 7);
        IF fail THEN
            RAISE EXCEPTION 'upstream timeout';
        END IF;
    EXCEPTION WHEN raise_exception THEN
        RETURN 'transient: ' || idem_release('payments.create', 'user-42', k, r.token);
    END;
    PERFORM idem_complete('payments.create', 'user-42', k, r.token, '{"status": 201}');
    RETURN 'executed';
END $$;
SELECT attempt('k-4', true);
SELECT attempt('k-4', false);
SELECT attempt('k-4', false);
SELECT attempt('k-5', true), attempt('k-5', true), attempt('k-5', true), attempt('k-5', false);
SELECT (SELECT count(*) FROM charges WHERE amount = 7) AS charges_of_7,
       (SELECT attempts FROM idem_retries WHERE key = 'k-5') AS k5_attempts;

-- Two-phase flow: reserve and commit, call the outside world, then complete in a new transaction.
SELECT token AS t FROM idem_reserve('card.charge', 'user-42', 'k-6', 'h', lease => '10 ms') \gset
SELECT * FROM res('card.charge', 'user-42', 'k-6', 'h');
-- Checklist: the worker "crashes": idem_recover_stuck unblocks the key once the lease expires.
SELECT pg_sleep(0.05);
SELECT idem_recover_stuck(action => 'release');
SELECT * FROM res('card.charge', 'user-42', 'k-6', 'h');
-- Checklist: a stale token can never complete.
BEGIN;
INSERT INTO charges (user_id, amount) VALUES ('user-42', 9);
SELECT idem_complete('card.charge', 'user-42', 'k-6', :t, '{"status": 201}') AS stale_complete;
ROLLBACK; -- what a client does when complete says false
SELECT status FROM idem_lookup('card.charge', 'user-42', 'k-6');

-- Checklist: idem_sweep frees an expired key.
SELECT idem_complete('sweep.me', 'u', 'k', (idem_reserve('sweep.me', 'u', 'k', 'h', ttl => '10 ms')).token, '{}');
SELECT pg_sleep(0.05);
SELECT idem_sweep();
SELECT count(*) AS records FROM idem_lookup('sweep.me', 'u', 'k');
SELECT * FROM res('sweep.me', 'u', 'k', 'h2');

DROP FUNCTION attempt(text, boolean);
DROP TABLE charges;
DELETE FROM idem_records;
DELETE FROM idem_retries;
