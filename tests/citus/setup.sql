-- The Citus layer's set-up (xtask/src/layers/citus.rs, fn setup): the nodes, the extension
-- through the coordinator, the business table, idem_distribute. Run by name (see nodes.sql).

-- [create_citus]
CREATE EXTENSION citus;

-- [citus_version]
SELECT citus_version();

-- [coordinator_host]
SELECT citus_set_coordinator_host('127.0.0.1', :port);

-- [add_node]
SELECT citus_add_node('127.0.0.1', :port);

-- [active_workers]
SELECT count(*) FROM citus_get_active_worker_nodes();

-- [extversion]
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- [create_extension]
CREATE EXTENSION idempotency VERSION :'version';

-- [before_update] at the previous release, before the update: a finished record and one in flight
SELECT idem_complete('pre', 'o-1', 'k', (idem_reserve('pre', 'o-1', 'k', 'h')).token, '{"pre": 1}');
SELECT token FROM idem_reserve('pre', 'o-2', 'k', 'h');

-- [update_extension]
ALTER EXTENSION idempotency UPDATE;

-- [charges] the business table
CREATE TABLE charges (user_id text NOT NULL, id bigserial, key text NOT NULL, amount integer NOT NULL, PRIMARY KEY (user_id, id));

-- [distribute_charges]
SELECT create_distributed_table('charges', 'user_id');

-- [early] a session that uses the API before the distribution, then after it
SELECT idem_complete('early', 'e-1', 'k', (idem_reserve('early', 'e-1', 'k', 'h')).token, '{"early": 1}');
SELECT 'waiting for the distribution' /* early */;
DO $$ BEGIN FOR i IN 1..600 LOOP EXIT WHEN _idem_distributed(); PERFORM pg_sleep(0.1); END LOOP; END $$;
SELECT (x).outcome || ' ' || (x).response::text FROM (SELECT idem_reserve('early', 'e-1', 'k', 'h') AS x OFFSET 0) AS s;
SELECT (idem_reserve('early', 'e-1', 'k2', 'h')).outcome;

-- [distribute] (`\;`: one query, as `psql -c` sends it)
SET client_min_messages = warning \; SELECT idem_distribute('charges');

-- [distributed_tables]
SELECT string_agg(logicalrelid::text || ':' || column_to_column_name(logicalrelid, partkey), ' ' ORDER BY logicalrelid::text)
        || ' ' || count(DISTINCT colocationid)
   FROM pg_dist_partition WHERE logicalrelid IN ('charges'::regclass, 'idem_records'::regclass, 'idem_retries'::regclass);

-- [delegated_functions]
SELECT string_agg(p.proname || ':' || o.distribution_argument_index || ':' || o.force_delegation, ' ' ORDER BY p.proname)
   FROM pg_dist_object AS o JOIN pg_proc AS p ON o.classid = 'pg_proc'::regclass AND o.objid = p.oid
  WHERE p.proname LIKE 'idem\_%';

-- [distribute_again]
SELECT idem_distribute('charges');

-- [records_distributed] on a worker
SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'idem_records'::regclass;

-- [legacy_table] on each node: the table an update from 0.6.0 kept its records in
SELECT to_regclass('idem_records_060') IS NOT NULL;

-- [old_replay] the finished record written before the update
SELECT outcome || ' ' || response::text FROM idem_reserve('pre', 'o-1', 'k', 'h');

-- [old_complete] the reservation in flight across the update and the distribution
SELECT idem_complete('pre', 'o-2', 'k', :token, '{"pre": 2}');
