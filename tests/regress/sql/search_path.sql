-- search_path hijack: a hostile schema first on the caller's path, holding look-alike tables,
-- functions and operators, must be ignored by every API function.
\set VERBOSITY sqlstate

CREATE SCHEMA evil;
CREATE TABLE evil.idem_records (LIKE idem_records);
CREATE TABLE evil.idem_retries (LIKE idem_retries);
CREATE TABLE evil.calls (fn text);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS
    $$ INSERT INTO evil.calls VALUES ('now') RETURNING '2000-01-01'::timestamptz $$;
CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS
    $$ INSERT INTO evil.calls VALUES ('clock_timestamp') RETURNING '2000-01-01'::timestamptz $$;
CREATE FUNCTION evil.octet_length(text) RETURNS integer LANGUAGE sql AS
    $$ INSERT INTO evil.calls VALUES ('octet_length') RETURNING 1 $$;
CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE sql AS
    $$ INSERT INTO evil.calls VALUES ('=') RETURNING true $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE FUNCTION evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS
    $$ INSERT INTO evil.calls VALUES ('nextval') RETURNING 1::bigint $$;
CREATE TEMP TABLE idem_records (LIKE public.idem_records);

SET search_path = evil, pg_temp, public, pg_catalog;
SELECT * FROM res('sp', 'u', 'k', 'h');
SELECT * FROM res('sp', 'u', 'k', 'other');
SELECT public.idem_complete('sp', 'u', 'k', t.token, '{"ok": true}')
  FROM public.idem_lookup('sp', 'u', 'k') AS t;
SELECT * FROM res('sp', 'u', 'k', 'h');
SELECT token AS t FROM public.idem_reserve('sp', 'u', 'k2', 'h', lease => '10 ms') \gset
SELECT public.idem_heartbeat('sp', 'u', 'k2', :t, lease => '10 ms');
SELECT public.idem_release('sp', 'u', 'k2', :t);
SELECT (public.idem_reserve('sp', 'u', 'k3', 'h', lease => '10 ms')).outcome;
SELECT pg_catalog.pg_sleep(0.05);
SELECT public.idem_recover_stuck();
SELECT public.idem_sweep();
ANALYZE public.idem_records;
SELECT processing, success, failed FROM public.idem_stats();
SELECT length(public.idem_fingerprint('{"a": 1}'::jsonb)) AS fingerprint_length;
SELECT public.err($$SELECT public.idem_reserve('sp', 'u', '', 'h')$$);

-- Nothing of the hostile schema was used, and the real table holds the records.
SELECT count(*) AS hostile_calls FROM evil.calls;
SELECT count(*) AS hostile_rows FROM evil.idem_records;
SELECT count(*) AS temp_rows FROM pg_temp.idem_records;
SELECT key, status FROM public.idem_records ORDER BY key;

RESET search_path;
DROP SCHEMA evil CASCADE;
DELETE FROM idem_records;
DELETE FROM idem_retries;
