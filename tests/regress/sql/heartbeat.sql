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
