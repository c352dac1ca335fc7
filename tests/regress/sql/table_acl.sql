-- The tables and the sequence: only their owner holds privileges (nothing granted to PUBLIC or to
-- another role), and it holds exactly every privilege its major defines for the kind of object
-- (acldefault: `arwdDxt` for a table, from 17 `arwdDxtm` with MAINTAIN; `rwU` for a sequence), so
-- the output is the same on every major.
SELECT c.relname,
       (SELECT string_agg(DISTINCT a.grantee::regrole::text, ', ') FROM aclexplode(c.relacl) AS a) AS holders,
       c.relacl = acldefault((CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END)::"char", c.relowner) AS the_owners_full_privileges
  FROM pg_class AS c
 WHERE c.relname IN ('idem_records', 'idem_retries', 'idem_token_seq')
 ORDER BY 1;
