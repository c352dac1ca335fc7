-- Installation (the extension, installed by the harness: pg_regress --load-extension, or
-- CREATE EXTENSION ... VERSION '0.1.0' and ALTER EXTENSION ... UPDATE in xtask/src/layers/upgrade.rs):
-- objects, comments, pinned search_path, GUC defaults, dump registration.

-- (What pg_dump keeps as a set: an update that replaces a table registers it last.)
SELECT extrelocatable, extversion,
       (SELECT array_agg(c ORDER BY c::text) FROM unnest(extconfig::regclass[]) AS c) AS dumped
  FROM pg_extension WHERE extname = 'idempotency';

-- Every function pins its search_path, but these: _idem_count and the native API functions
-- (sql/native.sql) resolve nothing by name, so a SET clause would only cost a GUC save and restore
-- per call; idem_maintain is a procedure that commits (a SET clause would forbid it).
SELECT p.oid::regprocedure AS function_without_pinned_search_path
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE p.proconfig IS NULL OR NOT 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig)
 ORDER BY p.oid::regprocedure::text;

-- Every object of the extension carries a comment. Objects PostgreSQL makes implicitly (a table's
-- row type, array types: extension members from 17, see members.sql) have an internal dependency on
-- their parent and no comment of their own.
SELECT pg_describe_object(d.classid, d.objid, 0) AS object_without_comment
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
 WHERE d.deptype = 'e' AND obj_description(d.objid, d.classid::regclass::name) IS NULL
   AND NOT EXISTS (SELECT FROM pg_depend i WHERE i.classid = d.classid AND i.objid = d.objid AND i.deptype = 'i')
 ORDER BY 1;

-- Which functions run as their owner, and their volatility.
SELECT p.proname, p.prosecdef AS security_definer, p.provolatile AS volatility, l.lanname AS language
  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
  JOIN pg_language l ON l.oid = p.prolang
 ORDER BY p.proname, p.oid::regprocedure::text;

-- GUC defaults, once a call into the library has loaded it.
SELECT length(idem_fingerprint(''::bytea)) AS loads_the_library;
SHOW idempotency.ttl;
SHOW idempotency.lease;
SHOW idempotency.max_retries;
SHOW idempotency.max_response_bytes;

-- A new session has not loaded the library; the API loads it and applies the defaults.
\c
SELECT current_setting('idempotency.ttl', true) AS before_any_call;
SELECT outcome FROM idem_reserve('install', 'u', 'k', 'h');
SELECT current_setting('idempotency.ttl', true) AS after_a_call;
SELECT round(extract(epoch FROM expires_at - created_at)) AS ttl_seconds,
       round(extract(epoch FROM lease_expires_at - created_at)) AS lease_seconds
  FROM idem_records WHERE operation = 'install';
DELETE FROM idem_records;
