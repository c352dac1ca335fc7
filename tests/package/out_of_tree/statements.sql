-- PostgreSQL 18 out of its tree (scripts/test.sh, layer package_out_of_tree,
-- xtask/src/layers/package/out_of_tree.rs): the statements it runs by name on a server whose own
-- directories hold no idempotency file, which finds the extension through
-- extension_control_path and dynamic_library_path in the unpacked tarball.

-- [launchers] the maintenance launcher (loaded by the name in its registration)
SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher';

-- [database] the database the worker maintains
CREATE DATABASE idem_out_of_tree;

-- [create] the release :version, from the unpacked tarball's install script
CREATE EXTENSION idempotency VERSION :'version';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- [reserve_complete] key :key reserved and completed
SELECT outcome FROM idem_reserve('package', 'u', :'key', 'h');
SELECT idem_complete('package', 'u', :'key', token, '{"id": 1}') FROM idem_lookup('package', 'u', :'key');

-- [update] to the tarball's default version, through its update scripts
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';

-- [replay] key :key again
SELECT outcome || ' ' || response::text FROM idem_reserve('package', 'u', :'key', 'h');

-- [metric] the counter :name (the preloaded library's shared memory)
SELECT value FROM idem_metrics() WHERE name = :'name';

-- [expired] a completed record of key :key with a 1 s ttl
SELECT idem_complete('package', 'u', :'key', (idem_reserve('package', 'u', :'key', 'h', ttl => '1 second')).token, '{}');

-- [left] the records of key :key
SELECT count(*) FROM idem_records WHERE key = :'key';
