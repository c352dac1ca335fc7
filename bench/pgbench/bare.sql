-- Baseline: the business write alone.
\set u random(1, 1000)
BEGIN;
INSERT INTO bench_charges (user_id, amount) VALUES ('u' || :u, 100);
COMMIT;
