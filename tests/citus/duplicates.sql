-- The Citus layer's duplicates (xtask/src/layers/citus.rs, fn duplicates; the load is
-- duplicates.pgbench). Run by name (see nodes.sql).

-- [dup_business_rows] keys with other than one business row, and keys
SELECT count(*) FILTER (WHERE n <> 1) || ' ' || count(*) FROM (SELECT user_id, key, count(*) AS n FROM charges WHERE key LIKE 'dup-%' GROUP BY 1, 2) AS c;

-- [dup_success]
SELECT count(*) FROM idem_records WHERE operation = 'dup' AND status = 's';

-- [dup_unfinished]
SELECT count(*) FROM idem_records WHERE operation = 'dup' AND status <> 's';
