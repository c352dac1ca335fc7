-- idempotency 0.1.0 -> 0.2.0, the part a replay of the functions cannot do.
--
-- 0.2.0 checks the arguments natively (extension/src/args.rs, on the client crate's key rules)
-- and reads its settings natively (an empty or reset setting means its default). The PL/pgSQL
-- helpers those native functions replace are dropped here, and so are the ones whose return type
-- or parameter names change (CREATE OR REPLACE cannot change either); the API functions call
-- them by name only, so nothing depends on them. scripts/sqlbuild.py appends every function of
-- 0.2.0, its comment and its privileges to this file.

DROP FUNCTION @extschema@._idem_check_text(text, text, boolean);
DROP FUNCTION @extschema@._idem_check_scope(text, text, text);
DROP FUNCTION @extschema@._idem_require(text, boolean);
DROP FUNCTION @extschema@._idem_interval(text, interval);
DROP FUNCTION @extschema@._idem_durations(interval, interval);
DROP FUNCTION @extschema@._idem_max_retries(integer);
