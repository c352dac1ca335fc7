-- idem_fingerprint: canonical JSON (jsonb and text forms agree), raw bytes.
\set VERBOSITY sqlstate

-- Equal JSON values, spelled differently, have one fingerprint.
SELECT count(DISTINCT idem_fingerprint(v::jsonb)) AS distinct_fingerprints
  FROM (VALUES ('{"amount": 100, "currency": "EUR"}'),
               ('{"currency":"EUR","amount":100}'),
               ('{"currency": "EUR", "amount": 1.00e2}'),
               ('{"amount": 100.000, "currency": "EUR", "amount": 100}')) AS t(v);
-- Different values differ; numbers stay exact beyond double precision.
SELECT idem_fingerprint('{"amount": 100}'::jsonb) <> idem_fingerprint('{"amount": 101}'::jsonb) AS differ,
       idem_fingerprint('12345678901234567890.000000000000000001'::jsonb)
           <> idem_fingerprint('12345678901234567890'::jsonb) AS exact;
-- The text form reads JSON, so an untyped literal works and agrees with jsonb.
SELECT idem_fingerprint('{"b": [1, 2.50, -0], "a": null}') = idem_fingerprint('{"a":null,"b":[1,2.5,0]}'::jsonb) AS text_equals_jsonb;
-- The canonical text of this value is {"a":"é","b":[true,false]}: its SHA-256.
SELECT idem_fingerprint('{"b": [true, false], "a": "\u00e9"}'::jsonb)
     = encode(sha256(convert_to('{"a":"é","b":[true,false]}', 'UTF8')), 'hex') AS canonical_sha256;
-- bytea: plain SHA-256 of the bytes.
SELECT idem_fingerprint('abc'::bytea), idem_fingerprint(''::bytea);
-- NULL in, NULL out (STRICT), so a NULL request_hash is then refused by idem_reserve.
SELECT idem_fingerprint(NULL::jsonb) IS NULL AS null_jsonb, idem_fingerprint(NULL::bytea) IS NULL AS null_bytea;
-- Not JSON (text form only): 22023, with the position.
SELECT err($$SELECT idem_fingerprint('{"a": 1,}')$$);
SELECT err($$SELECT idem_fingerprint('')$$);
-- Limits: 54000, no crash.
SELECT err(format('SELECT idem_fingerprint(%L::jsonb)', repeat('[', 1100) || repeat(']', 1100)));
SELECT err($$SELECT idem_fingerprint('1e100000000000')$$);
SELECT length(idem_fingerprint(repeat('[', 1000) || repeat(']', 1000))) AS deep_but_allowed;
