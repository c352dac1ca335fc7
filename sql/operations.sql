-- idempotency 0.2.0: operations - the counters, the operators' statistics and the maintenance
-- procedure for pg_cron. docs/operations.md is the guide.

-- Counting is an atomic add in shared memory (no table write); a no-op returning false unless
-- the library is in shared_preload_libraries. The API functions call it in an assignment, which
-- PL/pgSQL evaluates as a simple expression, without executor start-up. STABLE, truthfully: it
-- changes no database state and answers the same for the same arguments; so the assignment
-- takes no new snapshot (a VOLATILE one would). No pinned search_path: it runs no SQL, and a SET
-- clause would cost a GUC save and restore on every call (measured: ~2.5 us of ~3 us).
CREATE FUNCTION @extschema@._idem_count(event text, n bigint DEFAULT 1) RETURNS boolean
    LANGUAGE c STABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', '_idem_count_wrapper';

COMMENT ON FUNCTION @extschema@._idem_count(text, bigint) IS
    'Internal: adds n to the shared-memory counter event; false, counting nothing, when the library is not preloaded.';

REVOKE EXECUTE ON FUNCTION @extschema@._idem_count(text, bigint) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_metrics() RETURNS TABLE (name text, value bigint)
    LANGUAGE c VOLATILE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
    AS 'MODULE_PATHNAME', 'idem_metrics_wrapper';

COMMENT ON FUNCTION @extschema@.idem_metrics() IS
    'For monitoring: what the extension decided since the server started (reservations by outcome, completions by status, releases, poisonings, stale tokens, recovered, swept, worker passes), one row per counter. Raises 55000 unless idempotency is in shared_preload_libraries. Granted to pg_monitor, not PUBLIC.';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_metrics() TO pg_monitor;

-- Cheap enough to call every 15 s on a table of 100M records: no column needs a full scan.
-- Exact: processing, stuck and oldest_processing_age (the partial index of PROCESSING records:
-- cost grows with the in-flight records) and expired (the partial expiry index: cost grows with
-- the records awaiting a sweep). Estimated: success and failed, from the planner's statistics
-- (the row count scaled to the table's current size, as the planner does, minus the exact
-- processing count, split by the status frequencies ANALYZE measured); NULL until the table has
-- been analyzed. Sequential scans are off inside: when most rows have expired the planner would
-- otherwise prefer one, and the function must stay cheap whatever the table holds.
CREATE FUNCTION @extschema@.idem_stats(
    OUT processing            bigint,
    OUT success               bigint,
    OUT failed                bigint,
    OUT stuck                 bigint,
    OUT expired               bigint,
    OUT oldest_processing_age interval)
    LANGUAGE plpgsql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET enable_seqscan = off
    AS $fn$
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_rel       regclass := '@extschema@.idem_records'::regclass;
    v_tuples    double precision;
    v_pages     double precision;
    v_rows      double precision;
    v_success   double precision;
    v_failed    double precision;
    v_schema    name;
    v_null_frac real;
    v_distinct  double precision;
    v_mcv       text[];
    v_mcf       real[];
    v_other     double precision;
BEGIN
    SELECT count(*), count(*) FILTER (WHERE r.lease_expires_at <= v_now), v_now - min(r.created_at)
      INTO processing, stuck, oldest_processing_age
      FROM @extschema@.idem_records AS r
     WHERE r.status = 'p';

    SELECT count(*) INTO expired
      FROM @extschema@.idem_records AS r
     WHERE r.status <> 'p'
       AND @extschema@._idem_expiry_bucket(r.expires_at) <= @extschema@._idem_expiry_bucket(v_now)
       AND r.expires_at <= v_now;

    SELECT c.reltuples, c.relpages, n.nspname INTO v_tuples, v_pages, v_schema
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
     WHERE c.oid = v_rel;
    SELECT s.null_frac, s.n_distinct, s.most_common_vals::text::text[], s.most_common_freqs
      INTO v_null_frac, v_distinct, v_mcv, v_mcf
      FROM pg_stats AS s
     WHERE s.schemaname = v_schema AND s.tablename = 'idem_records' AND s.attname = 'status';
    IF NOT FOUND OR v_tuples < 0 THEN
        RETURN; -- never analyzed: no estimate to give
    END IF;
    -- As the planner estimates `status = value`: its frequency among the most common values, else
    -- an equal share of what they leave to the other distinct values.
    IF v_distinct < 0 THEN
        v_distinct := -v_distinct * v_tuples;
    END IF;
    v_other := (1 - v_null_frac - coalesce((SELECT sum(f) FROM unnest(v_mcf) AS f), 0))
               / greatest(v_distinct - coalesce(cardinality(v_mcv), 0), 1);
    v_success := coalesce(v_mcf[array_position(v_mcv, @extschema@._idem_status_code('SUCCESS')::text)], v_other);
    v_failed := coalesce(v_mcf[array_position(v_mcv, @extschema@._idem_status_code('FAILED')::text)], v_other);
    -- The row count scaled to the table's current size, as the planner does; the finished records
    -- are what the exact processing count leaves, split by the two frequencies.
    v_rows := CASE WHEN v_pages > 0
                   THEN v_tuples / v_pages * (pg_relation_size(v_rel) / current_setting('block_size')::integer)
                   ELSE v_tuples END;
    v_rows := greatest(v_rows - processing, 0);
    IF v_success + v_failed > 0 THEN
        success := round(v_rows * v_success / (v_success + v_failed));
        failed := round(v_rows) - success;
    ELSE
        success := 0;
        failed := 0;
    END IF;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_stats() IS
    'For operators: PROCESSING records, stuck ones (lease expired), expired records awaiting idem_sweep and the age of the oldest PROCESSING record, all exact from the partial indexes; SUCCESS and FAILED records estimated from planner statistics (NULL before the first ANALYZE). Never scans the whole table. Not granted to PUBLIC.';

-- For servers that cannot preload the library: schedule this with pg_cron every minute. Each
-- batch commits on its own, so no transaction is long and a crash loses at most one batch.
-- A procedure with transaction control cannot pin its search_path (SET clause), so every name
-- and operator here is qualified; it is not SECURITY DEFINER: its caller needs EXECUTE on
-- idem_move_records, idem_recover_stuck and idem_sweep.
CREATE PROCEDURE @extschema@.idem_maintain(batch_size integer DEFAULT 10000, action text DEFAULT 'fail')
    LANGUAGE plpgsql
    AS $fn$
DECLARE
    v_started    timestamptz := pg_catalog.clock_timestamp();
    v_n          bigint;
    v_recovered  bigint := 0;
    v_swept      bigint := 0;
    v_xacts      integer := 0;
    v_moved      bigint := 0;
BEGIN
    -- After the update from 0.6.0: the records kept in idem_records_060 moved into idem_records,
    -- then the emptied table dropped (idem_move_records answers 0 at once on any other install).
    LOOP
        v_n := @extschema@.idem_move_records(batch_size => batch_size);
        COMMIT;
        v_moved := v_moved OPERATOR(pg_catalog.+) v_n;
        v_xacts := v_xacts OPERATOR(pg_catalog.+) 1;
        EXIT WHEN v_n OPERATOR(pg_catalog.=) 0;
    END LOOP;
    LOOP
        v_n := @extschema@.idem_recover_stuck(batch_size => batch_size, action => action);
        COMMIT;
        v_recovered := v_recovered OPERATOR(pg_catalog.+) v_n;
        v_xacts := v_xacts OPERATOR(pg_catalog.+) 1;
        EXIT WHEN v_n OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    LOOP
        v_n := @extschema@.idem_sweep(batch_size => batch_size);
        COMMIT;
        v_swept := v_swept OPERATOR(pg_catalog.+) v_n;
        v_xacts := v_xacts OPERATOR(pg_catalog.+) 1;
        EXIT WHEN v_n OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    IF v_moved OPERATOR(pg_catalog.+) v_recovered OPERATOR(pg_catalog.+) v_swept OPERATOR(pg_catalog.>) 0 THEN
        RAISE LOG 'idempotency maintenance in database "%": moved % (kept from 0.6.0), recovered % (action %), swept %, in % transactions of at most % rows, % s',
            pg_catalog.current_database(), v_moved, v_recovered, action, v_swept, v_xacts, batch_size,
            pg_catalog.round(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) v_started)::numeric, 3);
    END IF;
END
$fn$;

COMMENT ON PROCEDURE @extschema@.idem_maintain(integer, text) IS
    'Maintenance for pg_cron: idem_move_records (after the update from 0.6.0, until the old table is gone), idem_recover_stuck, then idem_sweep, batch after batch, each batch committed on its own, until a batch comes back less than full; logs a summary when it did work. CALL it outside a transaction block. Not granted to PUBLIC.';

REVOKE EXECUTE ON PROCEDURE @extschema@.idem_maintain(integer, text) FROM PUBLIC;

-- Citus: distribute the records with the business rows they guard, and run the API where they
-- live. Run once, on the coordinator, as the extension's owner, after CREATE EXTENSION citus and
-- idempotency and after the business table is distributed by its user_id (text) column. The
-- Citus functions are named as constant text: without Citus they do not exist.
CREATE FUNCTION @extschema@.idem_distribute(colocate_with regclass) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $fn$
DECLARE
    v_records regclass := '@extschema@.idem_records'::regclass;
    v_fn      regprocedure;
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'colocate_with must not be NULL: name the business table distributed by user_id'
            USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'citus') THEN
        RAISE EXCEPTION 'idem_distribute needs the citus extension in this database (CREATE EXTENSION citus on the coordinator first)'
            USING ERRCODE = '55000';
    END IF;
    IF NOT @extschema@._idem_distributed() THEN
        -- Records an update from 0.6.0 kept in idem_records_060 (docs/record-layout.md, "The
        -- update from 0.6.0"): moved now, while both tables are local (the move's statement is
        -- not one Citus can plan once idem_records is distributed), and the emptied table
        -- dropped. A row another transaction holds stops the distribution instead of being lost.
        IF pg_catalog.to_regclass('@extschema@.idem_records_060') IS NOT NULL THEN
            LOOP
                EXIT WHEN coalesce(@extschema@._idem_legacy_batch(10000, 'any'), 0) = 0;
            END LOOP;
            IF EXISTS (SELECT FROM @extschema@.idem_records_060) THEN
                RAISE EXCEPTION 'idem_distribute: records kept from 0.6.0 in idem_records_060 are held by another transaction; run it again when they are free'
                    USING ERRCODE = '55006';
            END IF;
            PERFORM pg_catalog.pg_advisory_xact_lock(1768189296, 60); -- as idem_move_records
            DROP TABLE @extschema@.idem_records_060;
        END IF;
        -- The workers' own idem_records_060: the update ran there too, on tables never written
        -- (the rows live on the coordinator until now), so each is empty; dropped when it is, or
        -- every call delegated there would keep looking for records to move.
        EXECUTE 'SELECT count(*) FROM pg_catalog.run_command_on_workers($1)' USING
            $cmd$DO $do$ BEGIN
                IF pg_catalog.to_regclass('@extschema@.idem_records_060') IS NOT NULL THEN
                    IF NOT EXISTS (SELECT FROM @extschema@.idem_records_060) THEN
                        DROP TABLE @extschema@.idem_records_060;
                    END IF;
                END IF;
            END $do$$cmd$;
        -- A distributed table's unique keys must hold the distribution column: the records'
        -- primary key becomes (user_id, id) (docs/record-layout.md, "Citus"). Every statement
        -- names the id and the three texts, so either key serves it.
        ALTER TABLE @extschema@.idem_records DROP CONSTRAINT idem_records_pkey,
            ADD CONSTRAINT idem_records_pkey PRIMARY KEY (user_id, id);
        -- Both tables by user_id, in the business table's colocation group: a key's record, its
        -- retry counter and the user's business rows are on one shard, so the reservation, the
        -- business write and the completion are one single-node transaction.
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''user_id'', colocate_with => $2)'
            USING v_records, colocate_with::text;
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''user_id'', colocate_with => $2)'
            USING '@extschema@.idem_retries'::regclass, v_records::text;
        -- The rows were copied into the shards; the local copies left in the coordinator's
        -- table would only mislead a direct reader and take space.
        EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)' USING v_records;
        EXECUTE 'SELECT pg_catalog.truncate_local_data_after_distributing_table($1)'
            USING '@extschema@.idem_retries'::regclass;
    END IF;
    -- force_delegation: a call runs on the node of its user_id's shard, even inside a
    -- transaction block, so the advisory lock and the rows of one key live on one node.
    FOREACH v_fn IN ARRAY ARRAY[
        '@extschema@.idem_reserve(text, text, text, text, interval, interval, boolean)',
        '@extschema@.idem_replay(text, text, text, text)',
        '@extschema@.idem_complete(text, text, text, bigint, jsonb, text)',
        '@extschema@.idem_release(text, text, text, bigint, integer)',
        '@extschema@.idem_heartbeat(text, text, text, bigint, interval)',
        '@extschema@.idem_checkpoint(text, text, text, bigint, integer, jsonb, interval)',
        '@extschema@.idem_lookup(text, text, text)',
        -- A batch is one operation and user: one shard, so one node as well.
        '@extschema@.idem_reserve_many(text, text, text[], text[], interval, interval, boolean)',
        '@extschema@.idem_complete_many(text, text, text[], bigint[], jsonb[], text)']::regprocedure[]
    LOOP
        EXECUTE 'SELECT pg_catalog.create_distributed_function($1, ''user_id'', colocate_with => $2, force_delegation => true)'
            USING v_fn, v_records::text;
    END LOOP;
END
$fn$;

COMMENT ON FUNCTION @extschema@.idem_distribute(regclass) IS
    'Citus: distributes idem_records and idem_retries by user_id, co-located with colocate_with (a business table distributed by its text user_id), and delegates idem_reserve, idem_replay, idem_complete, idem_release, idem_heartbeat, idem_checkpoint, idem_lookup, idem_reserve_many and idem_complete_many to the node of the user''s shard (force_delegation). Run on the coordinator, once and again after an update (it then only delegates what is new). Not granted to PUBLIC.';

REVOKE EXECUTE ON FUNCTION @extschema@.idem_distribute(regclass) FROM PUBLIC;
