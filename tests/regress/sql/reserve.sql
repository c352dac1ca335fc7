-- idem_reserve: every outcome, takeover of expired records, ttl/lease rules.
\set VERBOSITY sqlstate

-- created: a new key; the token comes from the sequence.
SELECT * FROM res('pay', 'u1', 'k1', 'h1');
SELECT status, token > 0 AS has_token, response, expires_at > now() AS live,
       lease_expires_at <= expires_at AS lease_within_ttl
  FROM idem_lookup('pay', 'u1', 'k1');

-- in_progress: a committed PROCESSING record with a live lease.
SELECT * FROM res('pay', 'u1', 'k1', 'h1');
-- mismatch: a live record with another request_hash (PROCESSING or not).
SELECT * FROM res('pay', 'u1', 'k1', 'h2');

-- replay: after SUCCESS the stored response comes back, with no token.
SELECT idem_complete('pay', 'u1', 'k1', token, '{"status": 201, "id": 7}') FROM idem_lookup('pay', 'u1', 'k1');
SELECT * FROM res('pay', 'u1', 'k1', 'h1');
SELECT * FROM res('pay', 'u1', 'k1', 'h1');
SELECT * FROM res('pay', 'u1', 'k1', 'h2');

-- failed: a FAILED record replays its stored error response.
SELECT (idem_reserve('pay', 'u1', 'k2', 'h1')).outcome;
SELECT idem_complete('pay', 'u1', 'k2', token, '{"status": 402}', 'FAILED') FROM idem_lookup('pay', 'u1', 'k2');
SELECT * FROM res('pay', 'u1', 'k2', 'h1');
SELECT * FROM res('pay', 'u1', 'k2', 'h9');

-- Keys are scoped by (operation, user_id): the same key elsewhere is a new key.
SELECT * FROM res('pay', 'u2', 'k1', 'h1');
SELECT * FROM res('refund', 'u1', 'k1', 'h1');
SELECT operation, user_id, key, status FROM idem_records ORDER BY 1, 2, 3;

-- Tokens increase.
SELECT (SELECT token FROM idem_lookup('pay', 'u2', 'k1')) > (SELECT token FROM idem_lookup('pay', 'u1', 'k1')) AS increasing;

-- Takeover: an expired SUCCESS record counts as absent, whatever its hash; a new token.
SELECT * FROM res('exp', 'u', 'k', 'h1', ttl => '50 ms');
SELECT token AS old_token FROM idem_lookup('exp', 'u', 'k') \gset
SELECT idem_complete('exp', 'u', 'k', :old_token, '{"n": 1}');
SELECT pg_sleep(0.1);
SELECT * FROM res('exp', 'u', 'k', 'h2');
SELECT status, token > :old_token AS newer_token, response IS NULL AS response_cleared,
       request_hash, expires_at > now() + interval '23 hours' AS default_ttl
  FROM idem_lookup('exp', 'u', 'k');
-- The stale token of the first life cannot complete the new one.
SELECT idem_complete('exp', 'u', 'k', :old_token, '{"n": 2}');

-- A PROCESSING record past its ttl but with a live lease is not taken over.
SELECT * FROM res('exp2', 'u', 'k', 'h', ttl => '1 hour', lease => '1 hour');
UPDATE idem_records SET expires_at = clock_timestamp() - interval '1 second' WHERE operation = 'exp2';
SELECT * FROM res('exp2', 'u', 'k', 'h');
-- ... once the lease has passed too, it is.
UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE operation = 'exp2';
SELECT * FROM res('exp2', 'u', 'k', 'h');

-- A PROCESSING record whose lease expired but whose ttl is live stays in_progress (recover it).
SELECT * FROM res('stuck', 'u', 'k', 'h', lease => '10 ms');
SELECT pg_sleep(0.05);
SELECT * FROM res('stuck', 'u', 'k', 'h');

-- ttl and lease: explicit values are used; a defaulted lease is capped at the ttl.
SELECT * FROM res('tl', 'u', 'a', 'h', ttl => '2 hours', lease => '30 seconds');
SELECT * FROM res('tl', 'u', 'b', 'h', ttl => '1 minute');
SELECT key, expires_at - created_at AS ttl, lease_expires_at - created_at AS lease
  FROM idem_records WHERE operation = 'tl' ORDER BY key;
SET idempotency.ttl = '2h';
SET idempotency.lease = '90s';
SELECT * FROM res('tl', 'u', 'c', 'h');
SELECT key, expires_at - created_at AS ttl, lease_expires_at - created_at AS lease
  FROM idem_records WHERE operation = 'tl' AND key = 'c';
RESET idempotency.ttl;
RESET idempotency.lease;

-- Errors: ttl/lease must be positive, an explicit lease no longer than the ttl, wait non-NULL.
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', ttl => '0 seconds')$$);
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', ttl => '-1 hour')$$);
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', ttl => '200000 years')$$);
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', lease => '0 seconds')$$);
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', ttl => '1 minute', lease => '2 minutes')$$);
SELECT err($$SELECT idem_reserve('tl', 'u', 'x', 'h', wait => NULL)$$);
SELECT idem_reserve('tl', 'u', 'x', 'h', wait => NULL);
SELECT count(*) AS nothing_reserved_by_errors FROM idem_records WHERE operation = 'tl' AND key = 'x';

-- Inside a transaction that rolls back, nothing is left behind.
BEGIN;
SELECT * FROM res('rb', 'u', 'k', 'h');
ROLLBACK;
SELECT count(*) AS left_behind FROM idem_records WHERE operation = 'rb';

-- The compact record (docs/record-layout.md): keyed by _idem_id of its three texts, whoever
-- wrote it (the native path computes the digest in Rust, over the same bytes); the request hash
-- kept as 32 bytes: a 64-lowercase-hex-digit hash as its bytes, answered as sent, any other
-- text as its SHA-256 (idem_lookup answers its hex), so equal texts stay equal.
SELECT t AS hex_token FROM (SELECT (idem_reserve('lay', 'u', 'hex', repeat('0f', 32))).token AS t) AS x \gset
SELECT idem_complete('lay', 'u', 'hex', :hex_token, '{"n": 1}');
SELECT (idem_reserve('lay', 'u', 'text', 'Some Text')).outcome;
SELECT (idem_reserve('lay', 'u', 'hex', repeat('0f', 32))).outcome AS same_hex,
       (idem_reserve('lay', 'u', 'hex', repeat('0F', 32))).outcome AS upper_case_is_another_text,
       (idem_reserve('lay', 'u', 'text', 'Some Text')).outcome AS same_text;
SELECT key, request_hash FROM idem_lookup('lay', 'u', 'hex')
UNION ALL
SELECT key, (request_hash = encode(sha256('Some Text'::bytea), 'hex'))::text FROM idem_lookup('lay', 'u', 'text');
SELECT count(*) AS records,
       count(*) FILTER (WHERE id <> _idem_id(operation, user_id, key)) AS misfiled,
       count(*) FILTER (WHERE octet_length(request_hash) <> 32) AS hashes_not_32_bytes
  FROM idem_records;
-- _idem_id is the first 16 bytes of SHA-256(operation, 0x1F, user_id, 0x1F, key).
SELECT _idem_id('pay', 'u1', 'k1') = encode(substr(sha256('pay\037u1\037k1'::bytea), 1, 16), 'hex')::uuid AS digest;

DELETE FROM idem_records;
