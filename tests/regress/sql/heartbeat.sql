-- idem_heartbeat: extends a live attempt's lease (and its expiry), fenced by token.
\set VERBOSITY sqlstate

SELECT token AS t FROM idem_reserve('hb', 'u', 'k', 'h', ttl => '1 minute', lease => '1 second') \gset
SELECT idem_heartbeat('hb', 'u', 'k', :t, lease => '10 minutes');
SELECT lease_expires_at > now() + interval '9 minutes' AS lease_extended,
       expires_at >= lease_expires_at AS expiry_covers_lease
  FROM idem_lookup('hb', 'u', 'k');
-- The default lease is idempotency.lease.
SELECT idem_heartbeat('hb', 'u', 'k', :t);
SELECT lease_expires_at - updated_at AS lease FROM idem_lookup('hb', 'u', 'k');
-- A heartbeating attempt is never taken over, even past its original ttl.
SELECT idem_heartbeat('hb', 'u', 'k', :t, lease => '1 hour');
UPDATE idem_records SET created_at = created_at - interval '2 minutes' WHERE operation = 'hb';
SELECT * FROM res('hb', 'u', 'k', 'h');
-- Wrong token, or no longer PROCESSING: false.
SELECT idem_heartbeat('hb', 'u', 'k', :t + 1);
SELECT idem_complete('hb', 'u', 'k', :t, '{}');
SELECT idem_heartbeat('hb', 'u', 'k', :t);
SELECT idem_heartbeat('hb', 'u', 'missing', :t);
-- Errors.
SELECT err($$SELECT idem_heartbeat('hb', 'u', 'k', 1, lease => '0 seconds')$$);
SELECT err($$SELECT idem_heartbeat('hb', 'u', 'k', NULL)$$);
DELETE FROM idem_records;
-- A heartbeat's ceiling is the record's own (issue 40): a lease may reach the record's expiry,
-- or idempotency.ttl past now, whichever is later. A record reserved for 48 hours keeps a
-- 2-hour lease under a session whose idempotency.ttl is 1 hour; past both it is 22023.
SET idempotency.ttl = '1h';
SELECT token AS t2 FROM idem_reserve('hb', 'u', 'long', 'h', ttl => '48 hours', lease => '2 hours') \gset
SELECT idem_heartbeat('hb', 'u', 'long', :t2, lease => '2 hours');
SELECT idem_heartbeat('hb', 'u', 'long', :t2, lease => '47 hours');
SELECT lease_expires_at > now() + interval '46 hours' AS lease_extended,
       expires_at - created_at = interval '48 hours' AS expiry_kept
  FROM idem_lookup('hb', 'u', 'long');
SELECT err(format('SELECT idem_heartbeat(%L, %L, %L, %s, lease => %L)', 'hb', 'u', 'long', :t2, '49 hours'));
-- Near its expiry the record's ceiling is idempotency.ttl: a lease within it still extends
-- both, as before.
UPDATE idem_records SET expires_at = now() + interval '1 minute' WHERE operation = 'hb' AND key = 'long';
SELECT err(format('SELECT idem_heartbeat(%L, %L, %L, %s, lease => %L)', 'hb', 'u', 'long', :t2, '2 hours'));
SELECT idem_heartbeat('hb', 'u', 'long', :t2, lease => '30 minutes');
SELECT expires_at >= lease_expires_at AS expiry_covers_lease FROM idem_lookup('hb', 'u', 'long');
-- A stale token with too long a lease is still only stale.
SELECT idem_heartbeat('hb', 'u', 'long', :t2 + 1, lease => '100 hours') AS stale;
RESET idempotency.ttl;
DELETE FROM idem_records;
