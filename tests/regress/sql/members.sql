-- The extension's members, as psql lists them. PostgreSQL 17 also records the implicit types (each
-- table's row type and every array type) as members of the extension that created them, so from
-- 17 pg_regress compares with expected/members_1.out, which lists those five types as well.
\dx+ idempotency
