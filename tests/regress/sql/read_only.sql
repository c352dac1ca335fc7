-- Read-only transactions (a primary's; a standby's are read-only too): every call that would
-- write raises 25006 saying so, not the error of an internal statement (nextval, FOR UPDATE);
-- calls that need no write (replays, failed, mismatch, in_progress, idem_lookup) still answer.
-- The standby's wording ("on a server in recovery") is checked by tests/tests/failover.rs.
\set VERBOSITY sqlstate
CREATE FUNCTION err_hint(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_hint text;
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_hint = PG_EXCEPTION_HINT;
    RETURN SQLSTATE || ': ' || SQLERRM || ' (hint: ' || v_hint || ')';
END $$;

SELECT token AS ro_done FROM idem_reserve('ro', 'u', 'done', 'h') \gset
SELECT idem_complete('ro', 'u', 'done', :ro_done, '{"id": 1}');
SELECT token AS ro_failed FROM idem_reserve('ro', 'u', 'failed', 'h') \gset
SELECT idem_complete('ro', 'u', 'failed', :ro_failed, '{"error": "declined"}', 'FAILED');
SELECT token AS ro_busy FROM idem_reserve('ro', 'u', 'busy', 'h') \gset

BEGIN READ ONLY;
-- Answered from the committed records, no write needed.
SELECT * FROM res('ro', 'u', 'done', 'h');
SELECT * FROM res('ro', 'u', 'failed', 'h');
SELECT * FROM res('ro', 'u', 'done', 'other');
SELECT * FROM res('ro', 'u', 'busy', 'h');
SELECT status, response FROM idem_lookup('ro', 'u', 'done');
SELECT processing IS NOT NULL AS answers FROM idem_stats();
-- Everything that would write is refused, naming the transaction.
SELECT err_hint($$SELECT idem_reserve('ro', 'u', 'new', 'h')$$);
SELECT err_hint(format('SELECT idem_complete(%L, %L, %L, %s, %L)', 'ro', 'u', 'busy', :ro_busy, '{}'));
SELECT err_hint(format('SELECT idem_release(%L, %L, %L, %s)', 'ro', 'u', 'busy', :ro_busy));
SELECT err_hint(format('SELECT idem_heartbeat(%L, %L, %L, %s)', 'ro', 'u', 'busy', :ro_busy));
SELECT err_hint(format('SELECT idem_checkpoint(%L, %L, %L, %s, 0, %L)', 'ro', 'u', 'busy', :ro_busy, '{}'));
-- The completer's list is a read: it answers.
SELECT count(*) AS resumable FROM idem_resumable('ro');
SELECT err_hint($$SELECT idem_recover_stuck()$$);
SELECT err_hint($$SELECT idem_sweep()$$);
-- A stale token is refused too: the caller asked to write.
SELECT err_hint($$SELECT idem_complete('ro', 'u', 'busy', 1, '{}')$$);
COMMIT;

-- default_transaction_read_only makes every transaction of the session read-only: the same.
SET default_transaction_read_only = on;
SELECT err_hint($$SELECT idem_reserve('ro', 'u', 'new', 'h')$$);
SELECT * FROM res('ro', 'u', 'done', 'h');
RESET default_transaction_read_only;

-- Nothing was written; the busy key is still held by its token.
SELECT count(*) FROM idem_lookup('ro', 'u', 'new');
SELECT idem_complete('ro', 'u', 'busy', :ro_busy, '{"id": 3}');
DROP FUNCTION err_hint(text);
