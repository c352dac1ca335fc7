-- The idempotency.* prefix is reserved: a misspelt name is an error, not a silent placeholder. Not
-- on 14, which cannot reserve a prefix (MarkGUCPrefixReserved is 15+; 14 has only
-- EmitWarningsOnPlaceholders): there the misspelt name is accepted as a placeholder, and
-- pg_regress compares with expected/guc_prefix_1.out, which differs in that line only.
LOAD 'idempotency';
\set VERBOSITY sqlstate
SET idempotency.tll = '1h';
SET idempotency.max_retries = 0;
SET idempotency.ttl = '-1';
