-- The Citus layer's flow through the coordinator (xtask/src/layers/citus.rs, fn flow). Run by
-- name (see nodes.sql); :u1 and :u2 are users whose shards are on worker 1 and worker 2.

-- [flow] the in-transaction flow, with the remote commands logged as NOTICEs
SET citus.log_remote_commands = on;
SET client_min_messages = notice;
BEGIN;
SELECT outcome, token FROM idem_reserve('pay', :'u1', 'k-1', 'h1') \gset
INSERT INTO charges (user_id, key, amount) VALUES (:'u1', 'k-1', 100);
SELECT ok AS completed FROM idem_complete('pay', :'u1', 'k-1', :token, '{"status": 201}') AS c(ok) \gset
COMMIT;
\echo RESULT :outcome :completed

-- [record_status] on the worker: the record in its shard :records_shard (its status code as the
-- word, by the extension's own vocabulary)
SELECT _idem_status_word(status) FROM :"records_shard" WHERE user_id = :'u1' AND key = 'k-1';

-- [business_rows_in_shard] on the worker: the business row in its shard :charges_shard
SELECT count(*) FROM :"charges_shard" WHERE user_id = :'u1' AND key = 'k-1';

-- [replay]
SELECT outcome || ' ' || response::text FROM idem_reserve('pay', :'u1', 'k-1', 'h1');

-- [replay_first] idem_replay in autocommit, with the remote commands logged as NOTICEs
SET citus.log_remote_commands = on;
SET client_min_messages = notice;
SELECT 'RESULT ' || outcome || ' ' || response::text FROM idem_replay('pay', :'u1', 'k-1', 'h1');

-- [mismatch]
SELECT outcome FROM idem_reserve('pay', :'u1', 'k-1', 'other');

-- [other_user]
SELECT outcome FROM idem_reserve('pay', :'u2', 'k-1', 'h1');

-- [business_rows]
SELECT count(*) FROM charges WHERE user_id = :'u1' AND key = 'k-1';

-- [holder] a session holding a reservation in an open transaction
BEGIN;
SELECT outcome FROM idem_reserve('pay', :'u2', 'k-open', 'h');
SELECT pg_sleep(4) /* holder */;
COMMIT;

-- [open_duplicate] on the coordinator and on the worker (`\;`: one query, as `psql -c` sends it)
SET statement_timeout = '5s' \; SELECT outcome FROM idem_reserve('pay', :'u2', 'k-open', 'h');

-- [open_status]
SELECT status FROM idem_lookup('pay', :'u2', 'k-open');

-- [nodeleg] a session holding a reservation made on the coordinator (not delegated)
BEGIN;
SELECT (idem_reserve('pay', :'u2', 'k-nodeleg', 'h')).outcome;
SELECT pg_sleep(2) /* nodeleg */;
COMMIT;

-- [nodeleg_duplicate] (`\;`: one query, as `psql -c` sends it)
SET statement_timeout = '20s' \; SELECT outcome FROM idem_reserve('pay', :'u2', 'k-nodeleg', 'h');

-- [multi] a transaction for users on two workers, with the remote commands logged
SET citus.log_remote_commands = on;
BEGIN;
SELECT outcome FROM idem_reserve('pay', :'u1', 'k-multi', 'h');
SELECT outcome FROM idem_reserve('pay', :'u2', 'k-multi', 'h');
COMMIT;

-- [release]
SELECT idem_release('pay', :'u2', 'k-rel', token) FROM idem_reserve('pay', :'u2', 'k-rel', 'h');

-- [retry_attempts]
SELECT outcome || ' ' || attempts FROM idem_reserve('pay', :'u2', 'k-rel', 'h');

-- [heartbeat]
SELECT idem_heartbeat('pay', :'u2', 'k-rel', token, '1 hour') FROM idem_lookup('pay', :'u2', 'k-rel');

-- [heartbeat_wrong_token]
SELECT idem_heartbeat('pay', :'u2', 'k-rel', 1);

-- [stats_processing]
SELECT processing FROM idem_stats();

-- [processing]
SELECT count(*) FROM idem_records WHERE status = 'p';
