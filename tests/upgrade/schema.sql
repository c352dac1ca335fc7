-- The canonical description of everything idempotency owns in schema :schema (psql -v schema=),
-- one sorted block per object, for a textual diff between two databases: an upgraded and a fresh
-- install, or two portable installs. Anything here that differs fails the comparison.
SET search_path = pg_catalog;
WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = :'schema'),
objects(sort, description) AS (
    -- Functions: pg_get_functiondef carries signature, result, language, volatility, strictness,
    -- security, parallel safety, cost, rows, SET clauses and the body; then owner, ACL, comment.
    SELECT 'function ' || p.oid::regprocedure::text,
           pg_get_functiondef(p.oid) || E'\n  owner ' || p.proowner::regrole::text
           || E'\n  acl ' || coalesce(p.proacl::text, '(default)')
           || E'\n  comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '(none)')
      FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
    UNION ALL
    -- Relations (tables, sequences, indexes, views, composite types' relations).
    SELECT 'relation ' || c.relname,
           format('relation %s kind %s persistence %s owner %s acl %s options %s rls %s/%s comment %s',
                  c.relname, c.relkind, c.relpersistence, c.relowner::regrole, coalesce(c.relacl::text, '(default)'),
                  coalesce(c.reloptions::text, '()'), c.relrowsecurity, c.relforcerowsecurity,
                  coalesce(obj_description(c.oid, 'pg_class'), '(none)'))
      FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    -- Columns, in order, with type, nullability, default, identity, collation, ACL and comment.
    SELECT 'relation ' || c.relname || ' column ' || lpad(a.attnum::text, 4, '0'),
           format('  column %s %s %s notnull %s default %s identity %s generated %s collation %s acl %s comment %s',
                  a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  coalesce(pg_get_expr(d.adbin, d.adrelid), '(none)'), a.attidentity, a.attgenerated,
                  coalesce(a.attcollation::regcollation::text, '-'), coalesce(a.attacl::text, '(default)'),
                  coalesce(col_description(c.oid, a.attnum), '(none)'))
      FROM pg_class c
      JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
     WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind <> 'i'
    UNION ALL
    -- Indexes by definition.
    SELECT 'relation ' || c.relname || ' index', '  index ' || pg_get_indexdef(i.indexrelid)
      FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    -- Constraints (on tables and on domains) by definition, with comments.
    SELECT 'constraint ' || co.conname || ' on ' || coalesce(co.conrelid::regclass::text, co.contypid::regtype::text),
           format('constraint %s on %s type %s deferrable %s/%s validated %s: %s comment %s', co.conname,
                  coalesce(co.conrelid::regclass::text, co.contypid::regtype::text), co.contype,
                  co.condeferrable, co.condeferred, co.convalidated, pg_get_constraintdef(co.oid),
                  coalesce(obj_description(co.oid, 'pg_constraint'), '(none)'))
      FROM pg_constraint co WHERE co.connamespace = (SELECT oid FROM ns)
    UNION ALL
    -- Sequences' parameters (not their position).
    SELECT 'sequence ' || s.seqrelid::regclass::text,
           format('sequence %s type %s start %s increment %s min %s max %s cache %s cycle %s', s.seqrelid::regclass,
                  s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
      FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    -- Types other than the row types of tables: kind, owner, ACL, comment (attributes of composite
    -- types are listed as the columns of their relation above).
    SELECT 'type ' || t.typname,
           format('type %s kind %s owner %s acl %s comment %s', t.typname, t.typtype, t.typowner::regrole,
                  coalesce(t.typacl::text, '(default)'), coalesce(obj_description(t.oid, 'pg_type'), '(none)'))
      FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
     WHERE t.typnamespace = (SELECT oid FROM ns) AND (c.oid IS NULL OR c.relkind = 'c') AND t.typelem = 0
    UNION ALL
    -- Triggers and policies, if any ever appear.
    SELECT 'trigger ' || tg.tgname, '  trigger ' || pg_get_triggerdef(tg.oid)
      FROM pg_trigger tg JOIN pg_class c ON c.oid = tg.tgrelid
     WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT tg.tgisinternal
    UNION ALL
    SELECT 'policy ' || po.polname, format('  policy %s on %s %s', po.polname, po.polrelid::regclass, po.polcmd)
      FROM pg_policy po JOIN pg_class c ON c.oid = po.polrelid WHERE c.relnamespace = (SELECT oid FROM ns)
    UNION ALL
    -- The extension: version, membership and what pg_dump keeps (pg_extension_config_dump).
    SELECT 'extension ' || e.extname,
           format('extension %s version %s relocatable %s config %s conditions %s', e.extname, e.extversion,
                  e.extrelocatable,
                  -- As a set: the order is the order of registration, which an update that
                  -- replaces a table changes (0.6.0 -> 0.7.0), and pg_dump does not depend on.
                  coalesce((SELECT array_agg(c::regclass::text ORDER BY c::regclass::text) FROM unnest(e.extconfig) AS c), '{}'),
                  coalesce((SELECT array_agg(c ORDER BY c) FROM unnest(e.extcondition) AS c), '{}'))
      FROM pg_extension e WHERE e.extnamespace = (SELECT oid FROM ns)
    UNION ALL
    SELECT 'extension ' || e.extname || ' member ' || pg_describe_object(d.classid, d.objid, d.objsubid),
           '  member ' || pg_describe_object(d.classid, d.objid, d.objsubid)
      FROM pg_extension e JOIN pg_depend d ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
     WHERE e.extnamespace = (SELECT oid FROM ns) AND d.deptype = 'e'
)
SELECT description FROM objects ORDER BY sort COLLATE "C", description COLLATE "C";
