-- Settings as a session sets them before anything has loaded the library (each part starts a new
-- session; the portable install never has the library): an empty or RESET setting means the
-- default, an invalid one is 22023 naming the setting.

-- A setting made before the library loads, used, then RESET: the default applies again.
\c
SET idempotency.ttl = '90s';
SELECT outcome FROM idem_reserve('settings', 'u', 'k1', 'h', lease => '1 min');
RESET idempotency.ttl;
-- (Loading the library now, the extension warns that the empty placeholder is no valid value.)
SET client_min_messages = error;
SELECT outcome FROM idem_reserve('settings', 'u', 'k2', 'h');

-- A ttl set before the library loads leaves the lease at its own default (capped at the ttl).
\c
SET idempotency.ttl = '2h';
SELECT outcome FROM idem_reserve('settings', 'u', 'k3', 'h');

-- An empty setting means the default.
\c
SET idempotency.lease = '';
SET client_min_messages = error;
SELECT outcome FROM idem_reserve('settings', 'u', 'k4', 'h');

SELECT key, round(extract(epoch FROM expires_at - created_at)) AS ttl_seconds,
       round(extract(epoch FROM lease_expires_at - created_at)) AS lease_seconds
  FROM idem_records WHERE operation = 'settings' ORDER BY key;

-- Invalid values, named. (PostgreSQL itself warns when the extension's library loads and
-- finds the value unusable; the portable install loads no library: only errors are shown.)
\c
SET client_min_messages = error;
SET idempotency.ttl = 'banana';
SELECT err($$SELECT idem_reserve('settings', 'u', 'k5', 'h')$$);
\c
SET client_min_messages = error;
SET idempotency.lease = '1 fortnight';
SELECT err($$SELECT idem_reserve('settings', 'u', 'k5', 'h', ttl => '1h')$$);
SELECT err($$SELECT idem_heartbeat('settings', 'u', 'k1', 1)$$);
\c
SET client_min_messages = error;
SET idempotency.max_retries = 'three';
SELECT err($$SELECT idem_release('settings', 'u', 'k1', 1)$$);
SELECT err($$SELECT idem_recover_stuck()$$);
\c
SET client_min_messages = error;
SET idempotency.max_retries = '99999999999';
SELECT err($$SELECT idem_release('settings', 'u', 'k1', 1)$$);
SELECT count(*) AS nothing_created FROM idem_records WHERE key = 'k5';
DELETE FROM idem_records;
