-- The in-transaction flow as one statement (docs/sql-reference.md, "The in-transaction flow in
-- one statement"): the reservation, the business insert only when the key was created, and the
-- completion with a response that holds the new row's id, in one autocommit statement.
\set VERBOSITY sqlstate
CREATE TABLE one_charges (id serial PRIMARY KEY, user_id text NOT NULL, amount int NOT NULL CHECK (amount > 0));
PREPARE charge_once(text, text, text, int) AS
WITH r AS (SELECT * FROM idem_reserve('payments.one', $1, $2, $3)),
     w AS (INSERT INTO one_charges (user_id, amount)
           SELECT $1, $4 FROM r WHERE r.outcome = 'created' RETURNING id)
SELECT r.outcome, r.response,
       CASE WHEN w.id IS NOT NULL
            THEN idem_complete('payments.one', $1, $2, r.token, jsonb_build_object('status', 201, 'id', w.id)) END AS completed
  FROM r LEFT JOIN w ON true;

-- Created: charged once, completed with the row's id.
EXECUTE charge_once('u1', 'k1', 'h', 100);
SELECT status, response FROM idem_lookup('payments.one', 'u1', 'k1');
-- A retry replays the stored response and charges nothing.
EXECUTE charge_once('u1', 'k1', 'h', 100);
-- Another payload under the key: mismatch, nothing charged.
EXECUTE charge_once('u1', 'k1', 'other', 100);
-- Keys are per user.
EXECUTE charge_once('u2', 'k1', 'h', 100);
SELECT user_id, amount, count(*) FROM one_charges GROUP BY user_id, amount ORDER BY user_id;

-- The business insert fails: the statement rolls back whole, the reservation with it; the key
-- is free and a corrected retry executes.
EXECUTE charge_once('u1', 'k2', 'h', -1);
SELECT count(*) AS records FROM idem_lookup('payments.one', 'u1', 'k2');
EXECUTE charge_once('u1', 'k2', 'h', 5);
SELECT count(*) AS charges_of_k2 FROM one_charges WHERE amount = 5;

-- Inside a transaction block it is one statement of that transaction: a rollback undoes the
-- charge and the key.
BEGIN;
EXECUTE charge_once('u1', 'k3', 'h', 7);
ROLLBACK;
SELECT count(*) AS records, (SELECT count(*) FROM one_charges WHERE amount = 7) AS charges
  FROM idem_lookup('payments.one', 'u1', 'k3');
EXECUTE charge_once('u1', 'k3', 'h', 7);
SELECT status FROM idem_lookup('payments.one', 'u1', 'k3');

DEALLOCATE charge_once;
DROP TABLE one_charges;
