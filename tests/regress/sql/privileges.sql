-- Privileges: the API needs only USAGE + EXECUTE; nobody ungranted reads records; the operator
-- functions are not PUBLIC. Checked on the default install and on a locked-down schema install.
\set VERBOSITY sqlstate

-- Default install (schema public): the core API is executable by PUBLIC, the rest is not.
SELECT p.oid::regprocedure AS function, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 ORDER BY p.oid::regprocedure::text;

CREATE ROLE idem_plain;
SET ROLE idem_plain;
SELECT * FROM res('priv', 'u', 'k', 'h');
SELECT idem_complete('priv', 'u', 'k', 1, '{}');
SELECT count(*) FROM idem_records;
SELECT count(*) FROM idem_retries;
UPDATE idem_records SET status = 'SUCCESS';
DELETE FROM idem_records;
SELECT nextval('idem_token_seq');
SELECT idem_lookup('priv', 'u', 'k');
SELECT idem_stats();
SELECT idem_sweep();
SELECT idem_recover_stuck();
SELECT _idem_release_locked('priv', 'u', 'k', now(), now(), 1);
RESET ROLE;
DELETE FROM idem_records;
DROP ROLE idem_plain;

-- A locked-down install: its own schema, nothing for PUBLIC; an app role with USAGE + EXECUTE.
CREATE DATABASE idem_priv;
\c idem_priv
\set VERBOSITY sqlstate
CREATE SCHEMA idem;
CREATE EXTENSION idempotency SCHEMA idem;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA idem FROM PUBLIC;
CREATE ROLE idem_app;
CREATE ROLE idem_stranger;
GRANT USAGE ON SCHEMA idem TO idem_app;
GRANT EXECUTE ON FUNCTION idem.idem_reserve(text, text, text, text, interval, interval, boolean),
                          idem.idem_complete(text, text, text, bigint, jsonb, text),
                          idem.idem_release(text, text, text, bigint, integer),
                          idem.idem_heartbeat(text, text, text, bigint, interval),
                          idem.idem_fingerprint(jsonb)
   TO idem_app;
CREATE TABLE orders (id int);
GRANT INSERT ON orders TO idem_app;

SET ROLE idem_app;
BEGIN;
SELECT token AS t FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{"a": 1}'::jsonb)) \gset
INSERT INTO orders VALUES (1);
SELECT idem.idem_complete('o', 'u', 'k', :t, '{"id": 1}');
COMMIT;
SELECT outcome, response FROM idem.idem_reserve('o', 'u', 'k', idem.idem_fingerprint('{"a": 1}'::jsonb));
SELECT token AS t FROM idem.idem_reserve('o', 'u', 'k2', 'h') \gset
SELECT idem.idem_heartbeat('o', 'u', 'k2', :t);
SELECT idem.idem_release('o', 'u', 'k2', :t);
-- ... but no direct access, and no operator functions.
SELECT count(*) FROM idem.idem_records;
SELECT count(*) FROM idem.idem_retries;
SELECT idem.idem_sweep();
SELECT idem.idem_lookup('o', 'u', 'k');
RESET ROLE;

-- A role without grants reaches nothing.
SET ROLE idem_stranger;
SELECT idem.idem_reserve('o', 'u', 'k', 'h');
SELECT count(*) FROM idem.idem_records;
RESET ROLE;

-- Operators get the maintenance functions by explicit grant.
GRANT EXECUTE ON FUNCTION idem.idem_sweep(integer), idem.idem_stats() TO idem_stranger;
GRANT USAGE ON SCHEMA idem TO idem_stranger;
SET ROLE idem_stranger;
SELECT idem.idem_sweep();
SELECT success FROM idem.idem_stats();
RESET ROLE;

\c idem_regress
DROP DATABASE idem_priv;
DROP ROLE idem_app;
DROP ROLE idem_stranger;
