-- idem_fingerprint parity: the portable PL/pgSQL port (schema port) against the extension's Rust
-- canonicaliser (schema ext), in one database, on generated JSON texts: nested objects and
-- arrays, duplicate keys, whitespace, every escape, raw and escaped unicode (surrogate pairs
-- too), and numbers from tiny to huge. Then invalid texts: the same SQLSTATE and message.
-- Each row is one test: `label|t` passes. psql -v count=N (at least 5000).
SELECT setseed(0.1511);

CREATE FUNCTION pg_temp.pick(a text[]) RETURNS text LANGUAGE sql AS
    $$ SELECT a[1 + floor(random() * array_length(a, 1))::int] $$;

CREATE FUNCTION pg_temp.ws() RETURNS text LANGUAGE sql AS
    $$ SELECT pg_temp.pick(ARRAY['', '', '', ' ', E'\n', E'\t', E' \r\n ']) $$;

CREATE FUNCTION pg_temp.str() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text := '"';
BEGIN
    FOR i IN 1..floor(random() * 8)::int LOOP
        s := s || pg_temp.pick(ARRAY['a', 'b', 'Z', '0', ' ', 'é', '中', '😀', E'\u007f', E'\u0085',
            '\"', '\\', '\/', '/', '\b', '\f', '\n', '\r', '\t', '\u0001', '\u001F', '\u001f', '\u0000',
            '\u00e9', '\u00E9', '\u4e2d', '\ud83d\ude00', '\uD83D\uDE00', '\u0022', '\u005c', '\u007f', '\u2028']);
    END LOOP;
    RETURN s || '"';
END $$;

CREATE FUNCTION pg_temp.num() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    s text := pg_temp.pick(ARRAY['', '', '-']);
BEGIN
    s := s || CASE WHEN random() < 0.3 THEN '0'
                   ELSE (1 + floor(random() * 9))::text || substr(md5(random()::text), 1, floor(random() * 6)::int) END;
    s := translate(s, 'abcdef', '012345');
    IF random() < 0.5 THEN
        s := s || '.' || translate(substr(md5(random()::text), 1, 1 + floor(random() * 12)::int), 'abcdef', '000000');
    END IF;
    IF random() < 0.4 THEN
        s := s || pg_temp.pick(ARRAY['e', 'E']) || pg_temp.pick(ARRAY['', '+', '-'])
               || CASE WHEN random() < 0.1 THEN (1000 + floor(random() * 3000))::text
                       ELSE floor(random() * 40)::text END;
    END IF;
    IF random() < 0.05 THEN
        s := pg_temp.pick(ARRAY['12345678901234567890123456789.000000000000000000001', '-0', '-0.0e-5',
                                '1e-400', '0.00000000000000000000000000001', '9007199254740993', '1E400']);
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION pg_temp.json(depth integer) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r float8 := random();
    s text;
BEGIN
    IF depth > 0 AND r < 0.25 THEN
        s := '{';
        FOR i IN 1..floor(random() * 5)::int LOOP
            s := s || CASE WHEN i > 1 THEN ',' ELSE '' END || pg_temp.ws()
                 || CASE WHEN random() < 0.6
                         THEN pg_temp.pick(ARRAY['"a"', '"b"', '"aa"', '"é"', '"\u00e9"', '"A"', '"z"', '""', '"a\u0000"', '"😀"'])
                         ELSE pg_temp.str() END
                 || pg_temp.ws() || ':' || pg_temp.ws() || pg_temp.json(depth - 1) || pg_temp.ws();
        END LOOP;
        RETURN s || pg_temp.ws() || '}';
    ELSIF depth > 0 AND r < 0.45 THEN
        s := '[';
        FOR i IN 1..floor(random() * 5)::int LOOP
            s := s || CASE WHEN i > 1 THEN ',' ELSE '' END || pg_temp.ws() || pg_temp.json(depth - 1) || pg_temp.ws();
        END LOOP;
        RETURN s || ']';
    ELSIF r < 0.65 THEN
        RETURN pg_temp.str();
    ELSIF r < 0.9 THEN
        RETURN pg_temp.num();
    END IF;
    RETURN pg_temp.pick(ARRAY['true', 'false', 'null']);
END $$;

-- The fingerprint, or the error as SQLSTATE: message.
CREATE FUNCTION pg_temp.fp(schema text, t text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    EXECUTE format('SELECT %I.idem_fingerprint($1::text)', schema) INTO v USING t;
    RETURN v;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE FUNCTION pg_temp.fpj(schema text, t text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v text;
BEGIN
    EXECUTE format('SELECT %I.idem_fingerprint($1::jsonb)', schema) INTO v USING t;
    RETURN v;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE TEMP TABLE generated AS
SELECT i, pg_temp.json(1 + i % 5) AS t FROM generate_series(1, :count) AS i;
-- Fixed edge cases besides.
INSERT INTO generated (i, t)
SELECT -row_number() OVER (), v FROM unnest(ARRAY[
    repeat('[', 1024) || repeat(']', 1024), repeat('[', 1025) || repeat(']', 1025),
    repeat('{"a":', 1024) || '1' || repeat('}', 1024), '1e100000000000', '1e-100000000000', '1e5000', '-1.5e-5000',
    '{"b": 1, "aa": 2, "é": 3, "z": 4}', '{"a": 1, "b": 2, "a": 3}', '  {  }  ', '[ ]', '"\ud83d\ude00"',
    '0', '-0', '0e10', '100e-2', '123.456e-1']) AS v;

CREATE TEMP TABLE results AS
SELECT i, t, pg_temp.fp('ext', t) AS ext_text, pg_temp.fp('port', t) AS port_text,
       pg_temp.fpj('ext', t) AS ext_jsonb, pg_temp.fpj('port', t) AS port_jsonb
  FROM generated;

-- Invalid variants: each generated text cut short, or followed by a stray character.
CREATE TEMP TABLE invalid AS
SELECT i, t, pg_temp.fp('ext', t) AS ext, pg_temp.fp('port', t) AS port
  FROM (SELECT i, CASE WHEN i % 2 = 0 THEN left(t, floor(random() * length(t))::int)
                       ELSE t || pg_temp.pick(ARRAY[' x', ',', ']', '}', ' 1', '"']) END AS t
          FROM generated WHERE i > 0 AND i % 4 = 0) AS g;

SELECT format('text form: %s texts (%s of them valid JSON), portable equals extension',
              count(*), count(*) FILTER (WHERE ext_text ~ '^[0-9a-f]{64}$')),
       count(*) >= :count AND bool_and(ext_text = port_text)
  FROM results;
SELECT format('jsonb form: %s values (%s that jsonb accepts), portable equals extension',
              count(*), count(*) FILTER (WHERE ext_jsonb ~ '^[0-9a-f]{64}$')),
       count(*) FILTER (WHERE ext_jsonb ~ '^[0-9a-f]{64}$') >= :count / 2 AND bool_and(ext_jsonb = port_jsonb)
  FROM results;
SELECT 'jsonb form equals text form wherever jsonb accepts the text',
       bool_and(ext_jsonb = ext_text) FROM results WHERE ext_jsonb ~ '^[0-9a-f]{64}$';
SELECT format('texts cut short or with a stray character: %s (%s not JSON), the same fingerprint or the same SQLSTATE and message',
              count(*), count(*) FILTER (WHERE ext LIKE '22023: %')),
       count(*) FILTER (WHERE ext LIKE '22023: %') > 0 AND bool_and(ext = port)
  FROM invalid;
SELECT 'the limits: 1025 levels and a 10^100000000000 number are 54000 in both',
       bool_and(ext_text = port_text AND ext_text LIKE '54000: %')
  FROM results WHERE i < 0 AND (t LIKE '[[[[%' AND length(t) = 2050 OR t = '1e100000000000' OR t = '1e-100000000000');

-- On failure, the first differences.
SELECT 'differs: ' || left(t, 120) || ' ext=' || ext_text || ' port=' || port_text, false
  FROM results WHERE ext_text IS DISTINCT FROM port_text LIMIT 5;
SELECT 'differs (jsonb): ' || left(t, 120) || ' ext=' || ext_jsonb || ' port=' || port_jsonb, false
  FROM results WHERE ext_jsonb IS DISTINCT FROM port_jsonb LIMIT 5;
SELECT 'differs (invalid): ' || left(t, 120) || ' ext=' || ext || ' port=' || port, false
  FROM invalid WHERE ext IS DISTINCT FROM port LIMIT 5;
