-- Input rules: every public function refuses bad operation / user_id / key / request_hash with
-- the documented SQLSTATE and a message naming the argument and the rule. No input gives XX000.
\set VERBOSITY sqlstate

SELECT f AS call, a AS args, err(format(f, a)) AS result
  FROM (VALUES ('SELECT idem_reserve(%s, ''h'')'),
               ('SELECT idem_complete(%s, 1, ''{}'')'),
               ('SELECT idem_release(%s, 1)'),
               ('SELECT idem_heartbeat(%s, 1)'),
               ('SELECT idem_lookup(%s)')) AS fns(f)
 CROSS JOIN (VALUES ('NULL, ''u'', ''k'''),
                    ('''op'', NULL, ''k'''),
                    ('''op'', ''u'', NULL'),
                    ('''''::text, ''u'', ''k'''),
                    ('''op'', repeat(''u'', 256), ''k'''),
                    ('''op'', ''u'', repeat(''é'', 128)'),
                    ('''op'', ''u'', E''k\n'''),
                    ('''op'', E''u\u0085'', ''k'''),
                    ('''o'' || chr(127), ''u'', ''k''')) AS args(a)
 ORDER BY f, a;

-- Exactly 255 bytes, and non-control unicode, are fine.
SELECT outcome FROM idem_reserve(repeat('o', 255), 'ü', repeat('é', 127) || 'k', repeat('h', 255));
SELECT outcome FROM idem_reserve('op', 'u', E'k\u00a0', 'h');

-- request_hash: non-NULL, 1 to 255 bytes (any characters).
SELECT err($$SELECT idem_reserve('op', 'u', 'k', NULL)$$);
SELECT err($$SELECT idem_reserve('op', 'u', 'k', '')$$);
SELECT err($$SELECT idem_reserve('op', 'u', 'k', repeat('h', 256))$$);
SELECT outcome FROM idem_reserve('op', 'u', 'tab', E'h\th');

-- With VERBOSITY sqlstate, as the contract asks for, the codes alone.
SELECT idem_reserve(NULL, 'u', 'k', 'h');
SELECT idem_reserve('op', 'u', repeat('k', 300), 'h');
SELECT idem_reserve('op', 'u', E'\x01', 'h');
DELETE FROM idem_records;
