-- A package's smoke test (scripts/test.sh, layer package): the extension installed from a package
-- creates, and one key goes through reserve, complete and replay.
CREATE EXTENSION idempotency;
SELECT outcome, token > 0 AS has_token FROM idem_reserve('smoke', 'u', 'k', 'h');
SELECT idem_complete('smoke', 'u', 'k', token, '{"id": 1}') AS completed FROM idem_lookup('smoke', 'u', 'k');
SELECT outcome, token IS NULL AS no_token, response FROM idem_reserve('smoke', 'u', 'k', 'h');
DROP EXTENSION idempotency;
-- The package carries every released version and its update scripts: the first release installs
-- and updates in place to this one, keeping its record.
CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT outcome FROM idem_reserve('smoke', 'u', 'old', 'h');
ALTER EXTENSION idempotency UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempotency') AS updated
  FROM pg_extension WHERE extname = 'idempotency';
SELECT outcome FROM idem_reserve('smoke', 'u', 'old', 'h');
DROP EXTENSION idempotency;
