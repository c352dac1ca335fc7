-- The Citus layer's statements about the nodes (xtask/src/layers/citus.rs). Each `-- [name]`
-- line starts a statement the layer runs by name through psql, with psql variables (`:'user'`
-- a literal, `:"table"` an identifier, `:port` as is).

-- [node_of] the port of the worker that holds :user's shard of idem_records
SELECT n.nodeport FROM pg_dist_placement AS p JOIN pg_dist_node AS n ON n.groupid = p.groupid
 WHERE p.shardid = get_shard_id_for_distribution_column('idem_records', :'user');

-- [active] sessions running a query that starts with :prefix
SELECT count(*) FROM pg_stat_activity WHERE query LIKE :'prefix' || '%' AND state = 'active';

-- [shard_of] the shard of :table that holds :user
SELECT get_shard_id_for_distribution_column(:'table', :'user');

-- [nodeid] the node id of the node on :port
SELECT nodeid FROM pg_dist_node WHERE nodeport = :port;
