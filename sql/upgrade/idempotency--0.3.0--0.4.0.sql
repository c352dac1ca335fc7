-- idempotency 0.3.0 -> 0.4.0, the part a replay of the functions cannot do: its storage options.
--
-- The new and changed functions of 0.4.0 arrive with the replay of every 0.4.0 function that
-- scripts/sqlbuild.py appends to this file, with their comments and privileges.

-- Churn without bloat: the storage option of both tables that a fresh 0.4.0 install creates them
-- with (sql/schema.sql): VACUUM keeps their freed space for the next rows instead of truncating
-- the file (docs/operations.md, "Table size").
ALTER TABLE @extschema@.idem_records SET (vacuum_truncate = false);
ALTER TABLE @extschema@.idem_retries SET (vacuum_truncate = false);
