-- idempotency: idem_replay, the read-only first half of idem_reserve.
--
-- A retry whose key is complete is the commonest call of a retry storm. idem_reserve answers it
-- in one statement, but inside the transaction of the business write: the caller has a
-- transaction to open and to end around it. idem_replay answers the same retry in autocommit:
-- it only reads (no reservation, no lock, no write, no sequence), so a client may call it on a
-- pooled connection outside any transaction and stop there when it answers
-- (docs/rust-client.md, "Replay first").
--
-- What it answers is what idem_reserve's first step answers, by the same code (the native
-- idem_reserve's answer, extension/src/native/reserve.rs; the portable install's PL/pgSQL twin,
-- sql/portable/replay.sql, repeats sql/reserve.sql's first step, and tests/regress/sql/replay.sql
-- compares each answer with idem_reserve's on both installs):
--   - a live record the caller may not act on: 42501, as idem_reserve (guarantee 8);
--   - a live record of another request_hash: mismatch;
--   - a live SUCCESS or FAILED record: replay or failed, its response and attempts;
-- each counted in idem_stats as idem_reserve's answer is (reservations_replay, ...). Anything
-- else answers NULL (a row of NULLs when called in FROM), and the caller takes the normal path:
-- no record or an expired one (a reservation creates or takes over), a record in progress or
-- with a recovery point to resume (idem_reserve answers or resumes it under the key's lock).
-- During an update from 0.6.0, a record still in the old table (idem_records_060, moved on
-- touch) is not read: NULL, and idem_reserve, which moves it, answers.
CREATE FUNCTION @extschema@.idem_replay(
    operation    text,
    user_id      text,
    key          text,
    request_hash text)
    RETURNS @extschema@.idem_reservation
    LANGUAGE c STABLE SECURITY DEFINER
    AS 'MODULE_PATHNAME', 'idem_replay_native';

COMMENT ON FUNCTION @extschema@.idem_replay(text, text, text, text) IS
    'Answers a retry of a finished key without reserving anything: the row idem_reserve(operation, user_id, key, request_hash) would answer for a live record of outcome replay, failed or mismatch (42501 for another role''s record); NULL for anything else (absent, expired, in progress, resumable), where idem_reserve must be called. Reads only: callable in autocommit and on a standby.';
