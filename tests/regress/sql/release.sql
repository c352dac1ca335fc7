-- idem_release: transient failures, the persistent retry counter, poisoning at max_retries.
\set VERBOSITY sqlstate

-- released: the record is deleted, the counter kept; the retry executes again.
SELECT token AS t FROM idem_reserve('r', 'u', 'k', 'h') \gset
SELECT idem_release('r', 'u', 'k', :t);
SELECT count(*) AS records FROM idem_lookup('r', 'u', 'k');
SELECT attempts, expires_at > now() AS live FROM idem_retries WHERE operation = 'r';
-- The stale token cannot release again.
SELECT idem_release('r', 'u', 'k', :t);
SELECT * FROM res('r', 'u', 'k', 'h');
SELECT token AS t FROM idem_lookup('r', 'u', 'k') \gset
SELECT idem_release('r', 'u', 'k', :t);
SELECT * FROM res('r', 'u', 'k', 'h');
-- The third transient failure reaches the default max_retries (3): poisoned.
SELECT token AS t FROM idem_lookup('r', 'u', 'k') \gset
SELECT idem_release('r', 'u', 'k', :t);
SELECT status, response FROM idem_lookup('r', 'u', 'k');
SELECT * FROM res('r', 'u', 'k', 'h');
-- A poisoned record is FAILED: no token works on it any more.
SELECT idem_release('r', 'u', 'k', :t);
SELECT idem_complete('r', 'u', 'k', :t, '{}');

-- An explicit max_retries.
SELECT token AS t FROM idem_reserve('r', 'u', 'one', 'h') \gset
SELECT idem_release('r', 'u', 'one', :t, max_retries => 1);
SELECT token AS t FROM idem_reserve('r', 'u', 'five', 'h') \gset
SELECT idem_release('r', 'u', 'five', :t, max_retries => 5);
-- ... and through the GUC.
SET idempotency.max_retries = 1;
SELECT token AS t FROM idem_reserve('r', 'u', 'guc', 'h') \gset
SELECT idem_release('r', 'u', 'guc', :t);
RESET idempotency.max_retries;

-- A completed record cannot be released.
SELECT token AS t FROM idem_reserve('r', 'u', 'done', 'h') \gset
SELECT idem_complete('r', 'u', 'done', :t, '{"ok": true}');
SELECT idem_release('r', 'u', 'done', :t);
SELECT status FROM idem_lookup('r', 'u', 'done');

-- In-transaction flow: roll back the business write to a savepoint, release, commit.
CREATE TABLE charges (id serial, k text);
BEGIN;
SELECT token AS t FROM idem_reserve('r', 'u', 'tx', 'h') \gset
SAVEPOINT work;
INSERT INTO charges (k) VALUES ('tx');
ROLLBACK TO SAVEPOINT work;
SELECT idem_release('r', 'u', 'tx', :t);
COMMIT;
SELECT count(*) AS charges FROM charges;
SELECT attempts FROM idem_retries WHERE key = 'tx';
SELECT * FROM res('r', 'u', 'tx', 'h');

-- The counter of an earlier life of the key (expired before the record was created) restarts.
UPDATE idem_retries SET attempts = 2, expires_at = now() - interval '1 hour' WHERE key = 'tx';
UPDATE idem_records SET created_at = now() WHERE key = 'tx';
SELECT token AS t FROM idem_lookup('r', 'u', 'tx') \gset
SELECT idem_release('r', 'u', 'tx', :t);
SELECT attempts FROM idem_retries WHERE key = 'tx';

-- Errors.
SELECT err($$SELECT idem_release('r', 'u', 'k', NULL)$$);
SELECT err($$SELECT idem_release('r', 'u', 'k', 1, max_retries => 0)$$);
SELECT idem_release('r', 'u', 'k', 1, max_retries => -1);

DROP TABLE charges;
DELETE FROM idem_records;
DELETE FROM idem_retries;
