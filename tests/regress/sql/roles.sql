-- Guarantee 8, Owned: a record belongs to the role that reserved it (the session's role). No
-- other role, unless a member of it, can complete, release, extend, read or replay it, whatever
-- token it guesses: the record's token is 42501, any other a stale token. The application
-- role idempotency_user holds EXECUTE on the write API.
-- Runs on every install (the extension, updated or fresh, and the portable install); the
-- PUBLIC grants of a fresh install and the max_response_bytes ceiling are in privileges.
\set VERBOSITY sqlstate
CREATE ROLE idem_alice;
CREATE ROLE idem_mallory;
CREATE ROLE idem_alice_worker;
GRANT idempotency_user TO idem_alice, idem_mallory, idem_alice_worker;
GRANT idem_alice TO idem_alice_worker;

-- idempotency_user may call the write API (and the fingerprints), not the operator functions.
SELECT p.oid::regprocedure AS function, has_function_privilege('idempotency_user', p.oid, 'EXECUTE') AS app_execute
  FROM pg_proc p
 WHERE p.pronamespace = (SELECT n.oid FROM pg_namespace n JOIN pg_proc f ON f.pronamespace = n.oid
                          WHERE f.proname = 'idem_reserve')
   AND p.proname LIKE 'idem\_%'
 ORDER BY p.oid::regprocedure::text;

-- Alice reserves; the record is hers.
SET ROLE idem_alice;
SELECT token AS t FROM idem_reserve('roles', 'u', 'k', 'h') \gset
RESET ROLE;
SELECT owner, status FROM idem_records WHERE operation = 'roles';

-- Mallory guesses the token: every call with it is refused. (A wrong token is a stale token, a
-- value, for every role: it changes nothing and says nothing of the record.)
SET ROLE idem_mallory;
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'roles', 'u', 'k', :t, '{"forged": true}'));
SELECT idem_complete('roles', 'u', 'k', :t + 1, '{"forged": true}') AS wrong_token_completes;
SELECT err(format('SELECT idem_heartbeat(%L, %L, %L, %s)', 'roles', 'u', 'k', :t));
SELECT err(format('SELECT idem_heartbeat(%L, %L, %L, %s, lease => %L)', 'roles', 'u', 'k', :t, '1 hour'));
SELECT err(format('SELECT idem_release(%L, %L, %L, %s)', 'roles', 'u', 'k', :t));
SELECT err(format('SELECT * FROM idem_complete_many(%L, %L, ARRAY[%L], ARRAY[%s]::bigint[], ARRAY[%L]::jsonb[])',
                  'roles', 'u', 'k', :t, '{"forged": true}'));
-- ... and reserving her live key tells Mallory nothing but that it is not hers.
SELECT err($$SELECT idem_reserve('roles', 'u', 'k', 'h')$$);
SELECT err($$SELECT idem_reserve('roles', 'u', 'k', 'another hash')$$);
SELECT err($$SELECT * FROM idem_reserve_many('roles', 'u', ARRAY['k'], ARRAY['h'])$$);
RESET ROLE;
-- Nothing changed.
SELECT status, response, lease_expires_at - created_at AS lease FROM idem_records WHERE operation = 'roles';

-- A heartbeat's lease has the record's ceiling: at most its remaining ttl or idempotency.ttl,
-- whichever is longer (22023), even for the owner; a lease within it extends.
SET ROLE idem_alice;
SELECT err(format('SELECT idem_heartbeat(%L, %L, %L, %s, lease => %L)', 'roles', 'u', 'k', :t, '10 years'));
SELECT idem_heartbeat('roles', 'u', 'k', :t, lease => '1 hour');
RESET ROLE;

-- A member of Alice's role (her worker) acts for her: it completes, and Alice replays.
SET ROLE idem_alice_worker;
SELECT idem_complete('roles', 'u', 'k', :t, '{"id": 1}');
RESET ROLE;
SET ROLE idem_alice;
SELECT * FROM res('roles', 'u', 'k', 'h');
RESET ROLE;
-- Mallory cannot read the stored response by replaying the key.
SET ROLE idem_mallory;
SELECT err($$SELECT idem_reserve('roles', 'u', 'k', 'h')$$);
RESET ROLE;

-- idem_lookup refuses another role's record too, to a role granted it.
GRANT EXECUTE ON FUNCTION idem_lookup(text, text, text) TO idem_mallory;
SET ROLE idem_mallory;
SELECT err($$SELECT idem_lookup('roles', 'u', 'k')$$);
SELECT count(*) FROM idem_lookup('roles', 'u', 'absent');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_lookup(text, text, text) FROM idem_mallory;

-- Within one transaction too: a reservation not written yet (the native write-once flow) is
-- refused to another role the session switched to.
BEGIN;
SET LOCAL ROLE idem_alice;
SELECT token AS t2 FROM idem_reserve('roles', 'u', 'in-tx', 'h') \gset
SET LOCAL ROLE idem_mallory;
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'roles', 'u', 'in-tx', :t2, '{"forged": true}'));
SET LOCAL ROLE idem_alice;
SELECT idem_complete('roles', 'u', 'in-tx', :t2, '{"id": 2}');
COMMIT;
SELECT owner, status, response FROM idem_records WHERE operation = 'roles' AND key = 'in-tx';

-- An expired record counts as absent: another role takes the key over, and it is hers then.
SET ROLE idem_alice;
SELECT idem_complete('roles', 'u', 'old', token, '{"id": 3}') FROM idem_reserve('roles', 'u', 'old', 'h', ttl => '10 ms');
RESET ROLE;
SELECT pg_sleep(0.05);
SET ROLE idem_mallory;
SELECT * FROM res('roles', 'u', 'old', 'h');
RESET ROLE;
SELECT owner, status FROM idem_records WHERE operation = 'roles' AND key = 'old';
-- Alice's stale worker of a key Mallory has taken over learns it lost the lease as a value.
SET ROLE idem_alice;
SELECT token AS t4 FROM idem_reserve('roles', 'u', 'lost', 'h', ttl => '10 ms', lease => '10 ms') \gset
RESET ROLE;
SELECT pg_sleep(0.05);
SET ROLE idem_mallory;
SELECT * FROM res('roles', 'u', 'lost', 'h');
RESET ROLE;
SET ROLE idem_alice;
SELECT idem_complete('roles', 'u', 'lost', :t4, '{"late": true}') AS stale_worker_completes;
SELECT idem_heartbeat('roles', 'u', 'lost', :t4) AS stale_worker_extends;
SELECT idem_release('roles', 'u', 'lost', :t4) AS stale_worker_releases;
RESET ROLE;

-- A record without an owner (written before 0.6.0) is any role's, as before, until it expires.
SET ROLE idem_alice;
SELECT token AS t3 FROM idem_reserve('roles', 'u', 'legacy', 'h') \gset
RESET ROLE;
UPDATE idem_records SET owner = NULL WHERE operation = 'roles' AND key = 'legacy';
SET ROLE idem_mallory;
SELECT idem_heartbeat('roles', 'u', 'legacy', :t3, lease => '1 minute');
SELECT idem_complete('roles', 'u', 'legacy', :t3, '{"id": 4}');
SELECT * FROM res('roles', 'u', 'legacy', 'h');
RESET ROLE;

-- A key's retry counter is owned like its record (issue 40): the transient failures Mallory
-- counts on a key never count toward Alice's reservations of it. While Mallory's counter lives
-- (as long as her record would have), the released key stays hers: Alice's reservation is
-- refused (alone or in a batch) and changes nothing.
SET ROLE idem_mallory;
SELECT idem_release('roles', 'u', 'counted', token) FROM idem_reserve('roles', 'u', 'counted', 'h');
SELECT idem_release('roles', 'u', 'counted', token) FROM idem_reserve('roles', 'u', 'counted', 'h');
RESET ROLE;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'counted';
SET ROLE idem_alice;
SELECT err($$SELECT idem_reserve('roles', 'u', 'counted', 'h')$$);
SELECT err($$SELECT * FROM idem_reserve_many('roles', 'u', ARRAY['counted'], ARRAY['h'])$$);
RESET ROLE;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'counted';
SELECT count(*) AS records FROM idem_records WHERE operation = 'roles' AND key = 'counted';
-- Once it expired, Alice's reservation starts a count of its own, hers.
UPDATE idem_retries SET expires_at = now() - interval '1 second'
 WHERE operation = 'roles' AND key = 'counted';
SET ROLE idem_alice;
SELECT outcome, attempts, idem_release('roles', 'u', 'counted', token) AS released
  FROM idem_reserve('roles', 'u', 'counted', 'h');
RESET ROLE;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'counted';
-- Her worker (a member) continues her count, which stays hers; Mallory cannot touch it.
SET ROLE idem_alice_worker;
SELECT outcome, attempts, idem_release('roles', 'u', 'counted', token) AS released
  FROM idem_reserve('roles', 'u', 'counted', 'h');
RESET ROLE;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'counted';
SET ROLE idem_mallory;
SELECT err($$SELECT idem_reserve('roles', 'u', 'counted', 'h')$$);
RESET ROLE;
-- A counter without an owner (counted before 0.7.0) is any role's, as before, until it expires.
UPDATE idem_retries SET owner = NULL WHERE operation = 'roles' AND key = 'counted';
SET ROLE idem_mallory;
SELECT outcome, attempts, idem_release('roles', 'u', 'counted', token) AS released
  FROM idem_reserve('roles', 'u', 'counted', 'h');
RESET ROLE;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'counted';
-- A recovery's release (by an operator) counts toward the record's owner, not the operator.
SET ROLE idem_alice;
SELECT outcome FROM idem_reserve('roles', 'u', 'recovered', 'h', lease => '1 second');
RESET ROLE;
UPDATE idem_records SET lease_expires_at = now() - interval '1 second'
 WHERE operation = 'roles' AND key = 'recovered';
SELECT idem_recover_stuck(action => 'release') >= 1 AS recovered;
SELECT owner, attempts FROM idem_retries WHERE operation = 'roles' AND key = 'recovered';
DELETE FROM idem_retries WHERE operation = 'roles';

-- A superuser is a member of every role.
SELECT * FROM res('roles', 'u', 'k', 'h');

DELETE FROM idem_records WHERE operation = 'roles';
DROP ROLE idem_alice_worker;
DROP ROLE idem_mallory;
DROP ROLE idem_alice;
