-- The tables and the sequence: only their owner holds privileges (nothing granted to PUBLIC). From
-- 17 PostgreSQL has a MAINTAIN privilege (`m` in an ACL), which the owner holds too, so from 17
-- pg_regress compares with expected/table_acl_1.out, which differs in that letter only.
SELECT c.relname, c.relacl FROM pg_class c WHERE c.relname IN ('idem_records', 'idem_retries', 'idem_token_seq') ORDER BY 1;
