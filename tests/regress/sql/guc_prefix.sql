-- The idempotency.* prefix is reserved: a misspelt name is an error (42602), not a silent
-- placeholder. Not on 14, which cannot reserve a prefix (MarkGUCPrefixReserved is 15+; 14 has only
-- EmitWarningsOnPlaceholders): there the misspelt name is accepted as a placeholder. Each major's
-- answer is pinned to it here, so the output is the same on every major and a 15+ that accepts the
-- name, or a 14 that refuses it, prints false.
LOAD 'idempotency';
SELECT split_part(err($$SET idempotency.tll = '1h'$$), ':', 1)
       = CASE WHEN current_setting('server_version_num')::integer >= 150000 THEN '42602' ELSE 'ok' END
       AS misspelt_name_refused_from_15_accepted_on_14;
\set VERBOSITY sqlstate
SET idempotency.max_retries = 0;
SET idempotency.ttl = '-1';
