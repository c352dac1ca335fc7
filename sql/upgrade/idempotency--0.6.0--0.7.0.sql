-- idempotency 0.6.0 -> 0.7.0, the part a replay of the functions cannot do.
--
-- The new and changed functions arrive with the replay of every 0.7.0 function that
-- scripts/sqlbuild.py appends to this file, with their comments and privilege statements.

-- A key's retry counter is owned like its record (guarantee 8, issue 40): the owner of the
-- record whose failure started the count. The counters kept from 0.6.0 have none (NULL: any
-- role's, as before, until they expire). No default: adding the column rewrites no row.
ALTER TABLE @extschema@.idem_retries ADD COLUMN owner regrole;
