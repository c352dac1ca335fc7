-- Run on the old version, before ALTER EXTENSION idempotency UPDATE: a record in every state, a
-- two-phase reservation in flight, and what each record answers now (tests/upgrade/after.sql
-- asks again after the update).
CREATE SCHEMA upgrade_test;
CREATE TABLE upgrade_test.tokens (key text PRIMARY KEY, token bigint);

-- PROCESSING with a live lease: the two-phase reservation in flight (reserved and committed, not
-- completed); its token completes it after the update.
INSERT INTO upgrade_test.tokens
SELECT 'inflight', token FROM idem_reserve('up', 'u', 'inflight', 'h', ttl => '1 hour', lease => '1 hour');
-- Another in flight, completed after the update while its record is still in 0.6.0's table
-- (0.7.0's update moves no record; tests/upgrade/after.sql).
INSERT INTO upgrade_test.tokens
SELECT 'kept', token FROM idem_reserve('up', 'u', 'kept', 'h', ttl => '1 hour', lease => '1 hour');
-- SUCCESS, moved by a batch while a reservation of the key waits for it (0.7.0).
INSERT INTO upgrade_test.tokens SELECT 'moving', token FROM idem_reserve('up', 'u', 'moving', 'h');
SELECT idem_complete('up', 'u', 'moving', token, '{"id": 6}') FROM upgrade_test.tokens WHERE key = 'moving';
-- In flight, heartbeated and released after the update while still in 0.6.0's table (0.7.0).
INSERT INTO upgrade_test.tokens
SELECT 'kept_released', token FROM idem_reserve('up', 'u', 'kept_released', 'h', ttl => '1 hour', lease => '1 hour');
-- In flight, completed by idem_complete_many, and one that records a recovery point, after the
-- update while still in 0.6.0's table (0.7.0).
INSERT INTO upgrade_test.tokens
SELECT 'kept_many', token FROM idem_reserve('up', 'u', 'kept_many', 'h', ttl => '1 hour', lease => '1 hour');
INSERT INTO upgrade_test.tokens
SELECT 'kept_step', token FROM idem_reserve('up', 'u', 'kept_step', 'h', ttl => '1 hour', lease => '1 hour');
-- Stuck and expired, still in 0.6.0's table when idem_recover_stuck and idem_sweep meet them (0.7.0).
INSERT INTO upgrade_test.tokens
SELECT 'kept_stuck', token FROM idem_reserve('up', 'u', 'kept_stuck', 'h', ttl => '1 hour', lease => '1 ms');
INSERT INTO upgrade_test.tokens SELECT 'kept_expired', token FROM idem_reserve('up', 'u', 'kept_expired', 'h', ttl => '1 ms');
SELECT idem_complete('up', 'u', 'kept_expired', token, '{"id": 7}') FROM upgrade_test.tokens WHERE key = 'kept_expired';
-- PROCESSING stuck: its lease runs out below.
INSERT INTO upgrade_test.tokens
SELECT 'stuck', token FROM idem_reserve('up', 'u', 'stuck', 'h', ttl => '1 hour', lease => '1 ms');
-- SUCCESS and FAILED, with responses.
INSERT INTO upgrade_test.tokens SELECT 'success', token FROM idem_reserve('up', 'u', 'success', 'h');
SELECT idem_complete('up', 'u', 'success', token, '{"id": 1}') FROM upgrade_test.tokens WHERE key = 'success';
INSERT INTO upgrade_test.tokens SELECT 'failed', token FROM idem_reserve('up', 'u', 'failed', 'h');
SELECT idem_complete('up', 'u', 'failed', token, '{"error": "declined"}', 'FAILED') FROM upgrade_test.tokens WHERE key = 'failed';
-- Expired (a finished record past its ttl).
INSERT INTO upgrade_test.tokens SELECT 'expired', token FROM idem_reserve('up', 'u', 'expired', 'h', ttl => '1 ms');
SELECT idem_complete('up', 'u', 'expired', token, '{"id": 2}') FROM upgrade_test.tokens WHERE key = 'expired';
-- Released once: no record, a retry counter of 1.
INSERT INTO upgrade_test.tokens SELECT 'released', token FROM idem_reserve('up', 'u', 'released', 'h');
SELECT idem_release('up', 'u', 'released', token, max_retries => 3) FROM upgrade_test.tokens WHERE key = 'released';
-- Poisoned: FAILED by its retry counter.
INSERT INTO upgrade_test.tokens SELECT 'poisoned', token FROM idem_reserve('up', 'u', 'poisoned', 'h');
SELECT idem_release('up', 'u', 'poisoned', token, max_retries => 1) FROM upgrade_test.tokens WHERE key = 'poisoned';
SELECT pg_sleep(0.05);

-- What every record answers (none of these calls changes a record), and the state itself.
CREATE TABLE upgrade_test.answers AS
SELECT q.key, q.hash, r.outcome, r.token, r.response, r.attempts, r.expires_at
  FROM (VALUES ('success', 'h'), ('success', 'other'), ('failed', 'h'), ('inflight', 'h'),
               ('inflight', 'other'), ('poisoned', 'h'), ('stuck', 'h')) AS q(key, hash),
       LATERAL idem_reserve('up', 'u', q.key, q.hash) AS r;
CREATE TABLE upgrade_test.records AS SELECT * FROM idem_records;
CREATE TABLE upgrade_test.retries AS SELECT * FROM idem_retries;
CREATE TABLE upgrade_test.last_token AS SELECT last_value FROM idem_token_seq;
-- Whether PUBLIC may call each function of the write API (an update keeps it: 0.6.0).
CREATE TABLE upgrade_test.public_grants AS
SELECT p.proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute
  FROM pg_proc p
 WHERE p.pronamespace = 'public'::regnamespace
   AND p.proname IN ('idem_reserve', 'idem_complete', 'idem_release', 'idem_heartbeat',
                     'idem_reserve_many', 'idem_complete_many');
