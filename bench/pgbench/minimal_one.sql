-- Baseline: the minimal hand-written protocol as one statement (autocommit): the business insert,
-- then the finished record with the new row's id; a duplicate key fails the statement (23505)
-- and rolls its business insert back.
\set u random(1, 1000)
\set k random(1, 9000000000000000000)
WITH w AS (INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100) RETURNING id)
INSERT INTO idem_minimal (key, status, response, expires_at)
SELECT 'u' || :u || '/k' || :k, 'SUCCESS', jsonb_build_object('status', 201, 'id', w.id), now() + interval '1 day' FROM w;
