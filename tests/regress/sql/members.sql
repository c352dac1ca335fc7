-- The extension's members (what `\dx+ idempotency` lists), less the types PostgreSQL makes
-- implicitly: a table's row type and every array type, which have an internal dependency on their
-- parent. From 17 PostgreSQL records those as extension members too, so `\dx+` itself differs by
-- major; this list is the same on every major (the implicit types are left out on each).
SELECT pg_describe_object(d.classid, d.objid, 0) AS "Object description"
  FROM pg_depend AS d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT e.oid FROM pg_extension AS e WHERE e.extname = 'idempotency')
   AND d.deptype = 'e'
   AND NOT (d.classid = 'pg_type'::regclass
            AND EXISTS (SELECT FROM pg_depend AS i WHERE i.classid = d.classid AND i.objid = d.objid AND i.deptype = 'i'))
 ORDER BY 1;
