-- The Citus layer's tokens (xtask/src/layers/citus.rs, fn tokens). Run by name (see nodes.sql).

-- [tokens_delegated] one delegated call per statement: tokens issued on the workers
SELECT idem_reserve('tok', 'u-1', 'k', 'h');
SELECT idem_reserve('tok', 'u-2', 'k', 'h');
SELECT idem_reserve('tok', 'u-3', 'k', 'h');
SELECT idem_reserve('tok', 'u-4', 'k', 'h');
SELECT idem_reserve('tok', 'u-5', 'k', 'h');
SELECT idem_reserve('tok', 'u-6', 'k', 'h');
SELECT idem_reserve('tok', 'u-7', 'k', 'h');
SELECT idem_reserve('tok', 'u-8', 'k', 'h');
SELECT idem_reserve('tok', 'u-9', 'k', 'h');
SELECT idem_reserve('tok', 'u-10', 'k', 'h');
SELECT idem_reserve('tok', 'u-11', 'k', 'h');
SELECT idem_reserve('tok', 'u-12', 'k', 'h');
SELECT idem_reserve('tok', 'u-13', 'k', 'h');
SELECT idem_reserve('tok', 'u-14', 'k', 'h');
SELECT idem_reserve('tok', 'u-15', 'k', 'h');
SELECT idem_reserve('tok', 'u-16', 'k', 'h');
SELECT idem_reserve('tok', 'u-17', 'k', 'h');
SELECT idem_reserve('tok', 'u-18', 'k', 'h');
SELECT idem_reserve('tok', 'u-19', 'k', 'h');
SELECT idem_reserve('tok', 'u-20', 'k', 'h');

-- [tokens_on_coordinator] calls inside a larger query run on the coordinator
SELECT count(*) FROM (SELECT idem_reserve('tok', 'u-' || i, 'k', 'h') FROM generate_series(21, 40) AS i) AS s;

-- [tokens_unique]
SELECT count(DISTINCT token) = count(*) AND count(*) = 40 AND count(DISTINCT token >> 48) = 3 FROM idem_records WHERE operation = 'tok';

-- [stale_reserve]
SELECT token FROM idem_reserve('pay', :'u1', 'k-stale', 'h', lease => '1 second');

-- [stale_recover]
SELECT idem_recover_stuck(batch_size => 1000, action => 'release');

-- [stale_new_reserve]
SELECT token FROM idem_reserve('pay', :'u1', 'k-stale', 'h');

-- [stale_complete] with :token
SELECT idem_complete('pay', :'u1', 'k-stale', :token, '{}');
