-- idem_complete: fenced by token and PROCESSING; SUCCESS never flips; response size limit.
\set VERBOSITY sqlstate

SELECT token AS t1 FROM idem_reserve('c', 'u', 'k1', 'h') \gset
-- A wrong token changes nothing.
SELECT idem_complete('c', 'u', 'k1', :t1 + 1000, '{"x": 1}');
SELECT status, response FROM idem_lookup('c', 'u', 'k1');
-- The right token completes, once.
SELECT idem_complete('c', 'u', 'k1', :t1, '{"x": 1}');
SELECT idem_complete('c', 'u', 'k1', :t1, '{"x": 2}');
-- SUCCESS can never be flipped to FAILED.
SELECT idem_complete('c', 'u', 'k1', :t1, '{"x": 3}', 'FAILED');
SELECT status, response FROM idem_lookup('c', 'u', 'k1');

-- A permanent failure stores its response for replay.
SELECT token AS t2 FROM idem_reserve('c', 'u', 'k2', 'h') \gset
SELECT idem_complete('c', 'u', 'k2', :t2, '{"error": "card declined"}', status => 'FAILED');
SELECT idem_complete('c', 'u', 'k2', :t2, '{"x": 1}', 'SUCCESS');
SELECT status, response FROM idem_lookup('c', 'u', 'k2');
SELECT * FROM res('c', 'u', 'k2', 'h');

-- A NULL response is allowed (nothing to replay but the outcome).
SELECT token AS t3 FROM idem_reserve('c', 'u', 'k3', 'h') \gset
SELECT idem_complete('c', 'u', 'k3', :t3, NULL);
SELECT * FROM res('c', 'u', 'k3', 'h');

-- Completing after the lease ran out still works while nobody recovered or took over the key.
SELECT token AS t4 FROM idem_reserve('c', 'u', 'k4', 'h', lease => '10 ms') \gset
SELECT pg_sleep(0.05);
SELECT idem_complete('c', 'u', 'k4', :t4, '{"late": true}');

-- Unknown key: false.
SELECT idem_complete('c', 'u', 'nope', 1, '{}');

-- Bad status, NULL token or status.
SELECT token AS t5 FROM idem_reserve('c', 'u', 'k5', 'h') \gset
SELECT err($$SELECT idem_complete('c', 'u', 'k5', 1, '{}', 'success')$$);
SELECT err($$SELECT idem_complete('c', 'u', 'k5', 1, '{}', 'PROCESSING')$$);
SELECT err($$SELECT idem_complete('c', 'u', 'k5', 1, '{}', NULL)$$);
SELECT err($$SELECT idem_complete('c', 'u', 'k5', NULL, '{}')$$);
SELECT idem_complete('c', 'u', 'k5', NULL, '{}');

-- Response size: the byte length of its jsonb text against idempotency.max_response_bytes.
-- The error never echoes the value.
SET idempotency.max_response_bytes = 20;
SELECT octet_length('{"a": "0123456789"}'::jsonb::text) AS size_of_ok_response;
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'c', 'u', 'k5', :t5, '{"secret": "do-not-echo-me"}'));
SELECT status FROM idem_lookup('c', 'u', 'k5');
SELECT idem_complete('c', 'u', 'k5', :t5, '{"a": "0123456789"}');
RESET idempotency.max_response_bytes;
-- The default limit is 1MB.
SELECT token AS t6 FROM idem_reserve('c', 'u', 'k6', 'h') \gset
SELECT err(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'c', 'u', 'k6', :t6,
                  jsonb_build_object('big', repeat('x', 1048576))));
SELECT idem_complete('c', 'u', 'k6', :t6, jsonb_build_object('big', repeat('x', 1000000)));

DELETE FROM idem_records;
