-- The extension's in-transaction flow as one statement (autocommit): reserve, the business
-- insert only if the key was created, complete with a response that holds the new row's id.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
WITH r AS (SELECT * FROM idem_reserve('bench.one', 'u' || :u, 'k' || :k, 'h')),
     w AS (INSERT INTO bench_charges (user_id, amount) SELECT 'u' || :u, 100 FROM r WHERE r.outcome = 'created' RETURNING id)
SELECT r.outcome, r.response,
       CASE WHEN w.id IS NOT NULL
            THEN idem_complete('bench.one', 'u' || :u, 'k' || :k, r.token, jsonb_build_object('status', 201, 'id', w.id)) END
  FROM r LEFT JOIN w ON true;
