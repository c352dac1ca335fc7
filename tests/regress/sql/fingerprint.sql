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
-- The canonical form is bounded by the text's length: 16 bytes per byte plus 8192. A number is
-- sized from its exponent before a digit is written, so these cost what their text costs.
SELECT idem_fingerprint('{"a":1e60000000}');
SELECT err($$SELECT idem_fingerprint('{"a":1e60000000}')$$);
SELECT err($$SELECT idem_fingerprint('-1e-60000000')$$);
SELECT err($$SELECT idem_fingerprint('1.5e999999999')$$);
-- Only JSON is refused for its size: a text that is not JSON is 22023 as ever.
SELECT err($$SELECT idem_fingerprint('{"a":1e60000000,}')$$);
-- The edge: '1e8287' writes 8288 = 16 * 6 + 8192 bytes, allowed; '1e8288' is one over, and so
-- is '-1e-8318' (8321 bytes: its sign counts).
SELECT idem_fingerprint('1e8287') AS at_the_bound;
SELECT err($$SELECT idem_fingerprint('1e8288')$$);
SELECT idem_fingerprint('-1e-8317') AS negative_at_the_bound, err($$SELECT idem_fingerprint('-1e-8318')$$);
-- One bound for the whole text: each number alone fits, two together do not.
SELECT length(idem_fingerprint('[1e8000]')) AS one_fits, err($$SELECT idem_fingerprint('[1e8000,1e8000]')$$);
-- A longer text carries a longer number: 16 bytes per byte.
SELECT length(idem_fingerprint(format('["%s",1e1500000]', repeat('x', 100000)))) AS long_text_long_number;
-- jsonb's own text writes numbers out in full, so the jsonb form is within the bound where the
-- text form of the same literal is not.
SELECT idem_fingerprint('1e100000'::jsonb) = encode(sha256(convert_to('1' || repeat('0', 100000), 'UTF8')), 'hex') AS jsonb_form_in_full,
       err($$SELECT idem_fingerprint('1e100000')$$) AS text_form;
-- Fingerprints computed by 0.5.0, before the bound: unchanged (core/tests/pinned_fingerprints.rs).
SELECT idem_fingerprint('1e1000') AS e1000, idem_fingerprint('-7e-8000') AS neg_e8000,
       idem_fingerprint('{"b": 1, "aa": 2, "é": 3, "z": 4, "B": 5, "\u0061": 6, "a": 7}') AS keys;
SELECT length(idem_fingerprint(repeat('[', 1000) || repeat(']', 1000))) AS deep_but_allowed;
