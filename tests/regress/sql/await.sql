-- idem_await: idem_reserve's answer after a bounded wait for a key in progress (issue 44).
\set VERBOSITY sqlstate

-- No holder: created at once, exactly as idem_reserve creates (here in a transaction that
-- rolls back).
BEGIN;
SELECT outcome, token IS NOT NULL AS has_token FROM idem_await('aw', 'u', 'free', 'h', '1 second');
ROLLBACK;
SELECT count(*) AS left_behind FROM idem_records WHERE operation = 'aw';
-- A committed two-phase holder (lease 1 minute): in_progress once the timeout has passed.
SELECT token AS t FROM idem_reserve('aw', 'u', 'k', 'h', lease => '1 minute') \gset
SELECT clock_timestamp() AS before \gset
SELECT outcome, token IS NULL AS no_token, response IS NULL AS no_response
  FROM idem_await('aw', 'u', 'k', 'h', '200 milliseconds');
SELECT clock_timestamp() - :'before'::timestamptz >= interval '200 milliseconds' AS waited_the_timeout;
-- Another request under the key: mismatch at once, not after a wait (the holder's lease and
-- the timeout are a minute away).
SELECT clock_timestamp() AS before \gset
SELECT outcome FROM idem_await('aw', 'u', 'k', 'other', '1 minute');
SELECT clock_timestamp() - :'before'::timestamptz < interval '30 seconds' AS at_once;
-- Never past the holder's lease: a holder whose lease has ended is not waited for.
UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second'
 WHERE operation = 'aw' AND key = 'k';
SELECT clock_timestamp() AS before \gset
SELECT outcome FROM idem_await('aw', 'u', 'k', 'h', '1 minute');
SELECT clock_timestamp() - :'before'::timestamptz < interval '30 seconds' AS not_past_the_lease;
-- The holder completes (fenced by its token alone): the answer is its replay, at once.
SELECT idem_complete('aw', 'u', 'k', :t, '{"done": 1}');
SELECT outcome, response FROM idem_await('aw', 'u', 'k', 'h', '1 minute');
-- Errors: the timeout's rules, then idem_reserve's.
SELECT err($$SELECT idem_await('aw', 'u', 'k', 'h', NULL)$$);
SELECT err($$SELECT idem_await('aw', 'u', 'k', 'h', '0 seconds')$$);
SELECT err($$SELECT idem_await('aw', 'u', 'k', 'h', '-1 seconds')$$);
SELECT err($$SELECT idem_await('aw', 'u', 'k', 'h', '61 seconds')$$);
SELECT err($$SELECT idem_await('aw', 'u', 'k', NULL, '1 second')$$);
SELECT err($$SELECT idem_await('aw', 'u', '', 'h', '1 second')$$);
DELETE FROM idem_records WHERE operation = 'aw';
