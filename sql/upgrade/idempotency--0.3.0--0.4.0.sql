-- Churn without bloat: the storage option of both tables that a fresh 0.4.0 install creates them
-- with (sql/schema.sql): VACUUM keeps their freed space for the next rows instead of truncating
-- the file (docs/operations.md, "Table size").
ALTER TABLE @extschema@.idem_records SET (vacuum_truncate = false);
ALTER TABLE @extschema@.idem_retries SET (vacuum_truncate = false);
