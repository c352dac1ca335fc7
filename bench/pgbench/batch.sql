-- A batch of 1,000 keys of one user in one transaction: idem_reserve_many, then
-- idem_complete_many with the tokens it answered (the arrays travel back and forth as a client
-- would send them). Per key: divide the transaction's time by 1,000.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
BEGIN;
SELECT array_agg(key) AS keys, array_agg(token) AS tokens
  FROM idem_reserve_many('bench.batch', 'u' || :u,
                         ARRAY(SELECT 'k' || :k || '-' || g FROM generate_series(1, 1000) AS g),
                         array_fill('h'::text, ARRAY[1000])) \gset
SELECT count(*) FILTER (WHERE completed) AS completed
  FROM idem_complete_many('bench.batch', 'u' || :u, :keys::text[], :tokens::bigint[],
                          array_fill('{"status": 201}'::jsonb, ARRAY[1000]));
COMMIT;
