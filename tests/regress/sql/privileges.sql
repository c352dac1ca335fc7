-- Privileges: the API needs only USAGE + EXECUTE; nobody ungranted reads records; the operator
-- functions are not PUBLIC. Checked on the default install and on a locked-down schema install.
\set VERBOSITY sqlstate

-- Default install (schema public): the write API is executable by idempotency_user, the
-- fingerprints (and _idem_utf8, which the portable one calls) by PUBLIC, the rest by neither.
-- Whether PUBLIC may call the write API depends on the install's history (none on a fresh
-- install, below; an update keeps what PUBLIC had: tests/upgrade/after.sql), so it is not shown
-- here.
SELECT p.oid::regprocedure AS function,
       has_function_privilege('idempotency_user', p.oid, 'EXECUTE') AS app_execute,
       CASE WHEN p.proname IN ('idem_reserve', 'idem_complete', 'idem_release', 'idem_heartbeat',
                               'idem_reserve_many', 'idem_complete_many') THEN NULL
            ELSE has_function_privilege('public', p.oid, 'EXECUTE') END AS public_execute
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 ORDER BY p.oid::regprocedure::text;

-- idempotency.max_response_bytes: any role may lower it, and raise it only up to
-- idempotency.max_response_bytes_limit (PGC_SUSET, default 64MB): a larger setting counts as
-- the ceiling. Only a superuser sets the ceiling. (A call loads the library, which defines it.)
SELECT idem_fingerprint('{}'::jsonb) IS NOT NULL AS loaded;
SHOW idempotency.max_response_bytes_limit;
CREATE ROLE idem_plain;
GRANT idempotency_user TO idem_plain;
SET idempotency.max_response_bytes_limit = 100;
SET ROLE idem_plain;
SET idempotency.max_response_bytes = '1GB';
SELECT token AS t FROM idem_reserve('priv', 'u', 'big', 'h') \gset
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'priv', 'u', 'big', :t, jsonb_build_object('x', repeat('x', 200))));
SET idempotency.max_response_bytes = 50;
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'priv', 'u', 'big', :t, jsonb_build_object('x', repeat('x', 60))));
SELECT idem_complete('priv', 'u', 'big', :t, jsonb_build_object('x', repeat('x', 10)));
SET idempotency.max_response_bytes_limit = '1GB';
RESET idempotency.max_response_bytes;
RESET ROLE;
RESET idempotency.max_response_bytes_limit;
DELETE FROM idem_records WHERE key = 'big';

-- idempotency.ttl_limit and idempotency.lease_limit (PGC_SUSET, default 0: none): a longer
-- setting counts as the ceiling, a longer argument is 22023 naming the ceiling.
SHOW idempotency.ttl_limit;
SHOW idempotency.lease_limit;
SET idempotency.ttl_limit = '1h';
SET idempotency.lease_limit = '1min';
SET ROLE idem_plain;
SET idempotency.ttl = '10d';
SET idempotency.lease = '1h';
SELECT * FROM res('priv', 'u', 'ceiling', 'h');
SELECT err($$SELECT idem_reserve('priv', 'u', 'ceiling2', 'h', ttl => '2 hours')$$);
SELECT err($$SELECT idem_reserve('priv', 'u', 'ceiling2', 'h', lease => '2 minutes')$$);
SET idempotency.ttl_limit = 0;
RESET idempotency.ttl;
RESET idempotency.lease;
RESET ROLE;
SELECT expires_at - created_at AS ttl, lease_expires_at - created_at AS lease
  FROM idem_records WHERE key = 'ceiling';
RESET idempotency.ttl_limit;
RESET idempotency.lease_limit;
DELETE FROM idem_records WHERE key = 'ceiling';

SET ROLE idem_plain;
SELECT * FROM res('priv', 'u', 'k', 'h');
SELECT idem_complete('priv', 'u', 'k', 1, '{}');
SELECT count(*) FROM idem_records;
SELECT count(*) FROM idem_retries;
UPDATE idem_records SET status = 's';
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
-- A fresh install grants the write API to idempotency_user and nobody else.
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute,
       (SELECT array_agg(a.grantee::regrole ORDER BY a.grantee::regrole::text)
          FROM aclexplode(p.proacl) AS a WHERE a.grantee <> p.proowner) AS granted_to
  FROM pg_proc p
 WHERE p.pronamespace = 'idem'::regnamespace
   AND p.proname IN ('idem_reserve', 'idem_complete', 'idem_release', 'idem_heartbeat',
                     'idem_reserve_many', 'idem_complete_many')
 ORDER BY 1;
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
SELECT processing FROM idem.idem_stats();
RESET ROLE;

-- The install found idempotency_user already there (roles are cluster-wide), and DROP EXTENSION
-- leaves it: other databases may use it.
DROP EXTENSION idempotency;
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = 'idempotency_user';

\c idem_regress
DROP DATABASE idem_priv;
DROP ROLE idem_app;
DROP ROLE idem_stranger;
