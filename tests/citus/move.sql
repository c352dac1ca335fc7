-- The Citus layer's shard move under load (xtask/src/layers/citus.rs, fn shard_move; the load
-- is move.pgbench). Run by name (see nodes.sql).

-- [other_worker] a worker other than node :from
SELECT nodeid FROM pg_dist_node WHERE noderole = 'primary' AND groupid > 0 AND nodeid <> :from LIMIT 1;

-- [move_records]
SELECT count(*) FROM idem_records WHERE operation = 'move';

-- [move_shard]
SELECT citus_move_shard_placement(:shard, :from, :to);

-- [no_record_lost] records not SUCCESS or without exactly one business row, and whether at least :before
SELECT count(*) FILTER (WHERE r.status <> 's' OR c.n IS DISTINCT FROM 1) || ' ' || (count(*) >= :before)::int
   FROM idem_records AS r
   LEFT JOIN (SELECT user_id, key, count(*) AS n FROM charges WHERE key LIKE 'move-%' GROUP BY 1, 2) AS c
     ON c.user_id = r.user_id AND c.key = 'move-' || substr(r.key, 3)
  WHERE r.operation = 'move';

-- [orphan_business_rows]
SELECT count(*) FROM charges AS c WHERE c.key LIKE 'move-%' AND NOT EXISTS (
    SELECT FROM idem_records AS r WHERE r.operation = 'move' AND r.user_id = c.user_id AND r.key = 'k-' || substr(c.key, 6));
