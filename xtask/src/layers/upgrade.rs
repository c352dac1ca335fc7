//! Layer upgrade, in a throwaway server on the private cluster's port (the extension installed
//! with every released and update script):
//!
//!   files      every released install script and every update script is installed
//!   update     from each released version: records in every state and a two-phase reservation
//!              in flight, ALTER EXTENSION idempotency UPDATE, then every record answers as
//!              before (tests/upgrade/before.sql, after.sql)
//!   schema     the updated schema equals a fresh install's (tests/upgrade/schema.sql, diff -u);
//!              deliberate mismatches prove the comparison sees each kind of difference
//!   suites     the regress and isolation suites on an updated database
//!   load       clients reserve and complete through the update and through the move of the
//!              records kept from 0.6.0 that follows it (idem_maintain, in batches): no wrong
//!              answer, no key run twice; prints the locks the update holds and how long it
//!              takes (not asserted)

use super::{diff, schema_of, suites, throwaway};
use crate::ctx::Ctx;
use crate::psql::sql_checks;
use crate::report::{ensure, eq, Checks};
use std::path::Path;
use std::process::{Command, Stdio};

/// Each deliberate difference must be reported: the comparison can fail, for every kind of
/// object.
const MISMATCHES: &[(&str, &str)] = &[
    ("function attribute", "ALTER FUNCTION idem_sweep(integer) STABLE"),
    ("function body", "CREATE OR REPLACE FUNCTION _idem_echo(value text) RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$ SELECT quote_literal(value) $$"),
    ("function comment", "COMMENT ON FUNCTION idem_stats() IS 'changed'"),
    ("function grant", "GRANT EXECUTE ON FUNCTION idem_sweep(integer) TO PUBLIC"),
    ("table grant", "GRANT SELECT ON idem_records TO PUBLIC"),
    ("column default", "ALTER TABLE idem_retries ALTER COLUMN attempts SET DEFAULT 1"),
    ("index", "CREATE INDEX idem_records_created_idx ON idem_records (created_at)"),
    ("constraint", "ALTER TABLE idem_retries DROP CONSTRAINT idem_retries_attempts_check"),
    ("type", "ALTER TYPE idem_reservation ADD ATTRIBUTE extra integer"),
    ("table comment", "COMMENT ON TABLE idem_retries IS 'changed'"),
    ("config_dump registration", "ALTER EXTENSION idempotency DROP SEQUENCE idem_token_seq"),
];

const LOCKS_SQL: &str = "BEGIN;
SELECT 'update_started', clock_timestamp();
ALTER EXTENSION idempotency UPDATE;
SELECT 'lock', l.mode, 'on', count(*),
       CASE WHEN l.locktype = 'object' THEN 'objects of ' || l.classid::regclass::text || ': '
                || string_agg(pg_describe_object(l.classid, l.objid, l.objsubid), ', ' ORDER BY 1)
            ELSE l.locktype || ' ' || coalesce(string_agg(l.relation::regclass::text, ', '), '') END
  FROM pg_locks AS l WHERE l.pid = pg_backend_pid() AND l.granted AND l.locktype <> 'virtualxid'
 GROUP BY l.locktype, l.mode, l.classid ORDER BY 2, 5;
SELECT 'waiting_clients', count(*) FROM pg_stat_activity WHERE datname = 'idem_load' AND wait_event_type = 'Lock';
-- The load overlaps the update: while the update's transaction is open, clients commit new keys
-- (each poll's statement sees what committed since) or wait on its locks (pg_blocking_pids).
-- Awaited, for at most 60 s; `overlap COMMITTED BLOCKED` says what was seen.
SELECT 'load_keys', set_config('idem_load.before', count(*)::text, true) FROM idem_records WHERE operation = 'load';
DO $$
DECLARE
    before    bigint := current_setting('idem_load.before')::bigint;
    deadline  timestamptz := clock_timestamp() + interval '60 seconds';
    committed bigint;
    blocked   bigint;
BEGIN
    LOOP
        SELECT count(*) - before INTO committed FROM idem_records WHERE operation = 'load';
        SELECT count(*) INTO blocked FROM pg_stat_activity WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid));
        EXIT WHEN committed > 0 OR blocked > 0 OR clock_timestamp() > deadline;
        PERFORM pg_sleep(0.05);
    END LOOP;
    PERFORM set_config('idem_load.overlap', committed || ' ' || blocked, true);
END
$$;
SELECT 'overlap', current_setting('idem_load.overlap');
SELECT 'update_done', clock_timestamp();
COMMIT;
SELECT 'committed', clock_timestamp();
-- The records kept in idem_records_060 (0.7.0's update moves none) move in batches of 20 while
-- the load runs (idem_maintain, as pg_cron would call it), and the emptied table goes.
SELECT 'kept_rows', count(*) FROM idem_records_060;
CALL idem_maintain(batch_size => 20);
SELECT 'moved', clock_timestamp(), to_regclass('idem_records_060') IS NULL;
";

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let versions = crate::sh::versions();
    let current = versions.last().expect("a version").clone();
    let oldest = versions[0].clone();
    let extdir = ctx.extdir();
    checks.note(&format!("== upgrade tests, PostgreSQL {}, versions: {}", ctx.major, versions.join(" ")));

    for v in &versions {
        let f = extdir.join(format!("idempotency--{v}.sql"));
        checks.check(&format!("installed: idempotency--{v}.sql"), ensure(f.is_file(), format!("{} is missing", f.display())));
    }
    for w in versions.windows(2) {
        let name = format!("idempotency--{}--{}.sql", w[0], w[1]);
        let want = crate::sh::capture(Command::new("python3").args(["scripts/sqlbuild.py", "upgrade", &w[0], &w[1]]));
        let got = std::fs::read_to_string(extdir.join(&name)).map_err(|e| e.to_string());
        let same = match (got, want) {
            (Ok(g), Ok(w)) => ensure(g.trim_end() == w.trim_end(), "differs from scripts/sqlbuild.py upgrade's"),
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        checks.check(&format!("installed: {name}"), same);
    }

    let server = throwaway(ctx, "upgrade", ctx.port, "");
    let psql = ctx.psql(ctx.port);
    let logs = &ctx.logs;

    psql.run("CREATE DATABASE idem_fresh");
    psql.run("CREATE DATABASE idem_mismatch_template");
    psql.db("idem_fresh").run("CREATE EXTENSION idempotency");
    let fresh = schema_of(&psql, "idem_fresh", "public").unwrap_or_else(|e| panic!("describe the fresh schema: {e}"));
    std::fs::write(logs.join("upgrade-schema-fresh.txt"), &fresh).expect("write the fresh schema");
    for old in versions.iter().filter(|v| **v != current) {
        let db = format!("idem_from_{}", old.replace('.', "_"));
        let p = psql.db(&db);
        psql.run(&format!("CREATE DATABASE {db}"));
        checks.check(&format!("CREATE EXTENSION idempotency VERSION '{old}'"), p.q(&format!("CREATE EXTENSION idempotency VERSION '{old}'")).map(drop));
        checks.check(&format!("records in every state on {old}"), p.file(Path::new("tests/upgrade/before.sql"), &[]).map(drop));
        checks.check(&format!("ALTER EXTENSION idempotency UPDATE from {old}"), p.q("ALTER EXTENSION idempotency UPDATE").map(drop));
        checks.check(
            &format!("the extension is at version {current}"),
            p.q("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").and_then(|v| eq(v, &current)),
        );
        sql_checks(checks, "tests/upgrade/after.sql", p.file(Path::new("tests/upgrade/after.sql"), &[]));

        let updated = schema_of(&psql, &db, "public").unwrap_or_else(|e| e);
        match diff(logs, &format!("upgrade-schema-from-{old}"), &updated, &fresh) {
            Ok(()) => checks.pass(&format!("schema updated from {old} equals a fresh install ({} lines compared)", fresh.lines().count())),
            Err(d) => checks.fail(&format!("schema updated from {old} differs from a fresh install"), &d),
        }
    }

    psql.db("idem_mismatch_template").run("CREATE EXTENSION idempotency");
    for (what, sql) in MISMATCHES {
        psql.stdin("SET client_min_messages = warning;\nDROP DATABASE IF EXISTS idem_mismatch;\nCREATE DATABASE idem_mismatch TEMPLATE idem_mismatch_template;\n", &[])
            .unwrap_or_else(|e| panic!("recreate idem_mismatch: {e}"));
        let applied = psql.db("idem_mismatch").q(sql);
        let changed = schema_of(&psql, "idem_mismatch", "public").unwrap_or_else(|e| e);
        match (applied, diff(logs, "upgrade-mismatch", &fresh, &changed)) {
            (Ok(_), Err(d)) => {
                let n = d.lines().filter(|l| (l.starts_with('-') || l.starts_with('+')) && !l.starts_with("--") && !l.starts_with("++")).count();
                checks.pass(&format!("a deliberate {what} difference is reported ({n} changed lines)"));
            }
            (Err(e), _) => checks.fail(&format!("a deliberate {what} difference is reported"), &format!("{sql}: {e}")),
            (Ok(_), Ok(())) => checks.fail(&format!("a deliberate {what} difference is reported"), sql),
        }
    }

    // The one rerun of the suites this layer keeps: on a database the update scripts made,
    // under this build's library. The schema comparison above reads the catalog's description;
    // this runs every function of the updated install (the update chain's C symbols, sequences
    // and the extension's membership as the suites use them). The portable layer runs them on
    // a fresh portable install; no other layer reruns them.
    // (The update leaves 0.6.0's table to the move: empty here, idem_move_records drops it.)
    let prepare = |db: &str| {
        psql.db(db)
            .q(&format!("CREATE EXTENSION idempotency VERSION '{oldest}'; ALTER EXTENSION idempotency UPDATE; SELECT idem_move_records()"))
            .map(drop)
    };
    suites(checks, ctx, &psql, &format!("updated-from-{oldest}"), Path::new("tests/regress/schedule"), &[], &prepare);

    // The load starts at the oldest version whose idem_reserve is native (0.2.0): 0.1.0's is
    // PL/pgSQL, and a PL/pgSQL call in flight when an update that appends attributes to
    // idem_reservation commits (0.7.0's step and state) fails once with 42804, which no update
    // script can change in a body already running (docs/upgrading.md, "0.7.0"). The native
    // idem_reserve answers the row its query was planned with, and resolves the table 0.7.0
    // puts in idem_records' place (docs/record-layout.md) once it gets the lock: this load
    // proves it.
    let loaded_from = versions.iter().find(|v| v.as_str() != "0.1.0").unwrap_or(&oldest).clone();
    if loaded_from != current {
        load(ctx, checks, &psql, &loaded_from, &current);
    }
    super::finish(server, checks);
}

/// Clients reserve and complete through the update (pgbench, tests/upgrade/load.pgbench).
fn load(ctx: &Ctx, checks: &mut Checks, psql: &crate::psql::Psql, oldest: &str, current: &str) {
    let clients = 8;
    psql.run("CREATE DATABASE idem_load");
    let p = psql.db("idem_load");
    p.run(&format!("CREATE EXTENSION idempotency VERSION '{oldest}'"));
    p.run("CREATE TABLE charges (id bigserial PRIMARY KEY, k integer NOT NULL)");
    let load_log = ctx.logs.join("upgrade-load.log");
    let out = std::fs::File::create(&load_log).expect("create the load log");
    let mut bench = Command::new(ctx.bin("pgbench"))
        .args(["-n", "-h", "127.0.0.1", "-p", &p.port().to_string(), "-U", "postgres", "-c", &clients.to_string(), "-j", "4", "-T", "8", "-P", "1"])
        .args(["-f", "tests/upgrade/load.pgbench", "idem_load"])
        .stdout(out.try_clone().expect("clone"))
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .expect("start pgbench");
    // The load is under way (awaited: keys committed), then the update runs.
    let started = p.until_script_equal(60, "SELECT count(*) >= 100 FROM idem_records WHERE operation = 'load'", &[], "t");
    checks.check("the load commits keys before the update", started);
    let locks = p.stdin(LOCKS_SQL, &["-F", " "]).unwrap_or_else(|e| e);
    std::fs::write(ctx.logs.join("upgrade-lock.log"), &locks).expect("write the lock log");
    let committed = locks.lines().find_map(|l| l.strip_prefix("committed ")).map(str::to_owned);
    checks.check("ALTER EXTENSION idempotency UPDATE under load", ensure(committed.is_some(), crate::sh::tail(&locks, 10)));
    // Overlap, seen by the server while the update's transaction was open.
    let overlap = locks.lines().find_map(|l| l.strip_prefix("overlap ")).unwrap_or("? ?").to_owned();
    let seen: Vec<i64> = overlap.split(' ').filter_map(|n| n.parse().ok()).collect();
    checks.check(
        "the load overlapped the update (clients committed keys, or waited on its locks, while its transaction was open)",
        ensure(seen.len() == 2 && (seen[0] > 0 || seen[1] > 0), format!("overlap [{overlap}] (committed, waiting): nothing seen within 60 s")),
    );
    checks.note(&format!("  while the update's transaction was open: keys committed, clients waiting on its locks = {overlap}"));
    let status = bench.wait().expect("wait for pgbench");
    let text = std::fs::read_to_string(&load_log).unwrap_or_default();
    let label = format!("{clients} clients ran through the update without an error or a wrong answer");
    if status.success() && text.contains("number of failed transactions: 0") {
        let n = text.lines().find_map(|l| l.strip_prefix("number of transactions actually processed: ")).unwrap_or("?");
        checks.pass(&format!("{label} ({n} transactions)"));
    } else if status.success() && !text.contains("number of failed") && !text.contains("aborted") {
        checks.pass(&label);
    } else {
        let bad: Vec<&str> = text.lines().filter(|l| { let l = l.to_lowercase(); l.contains("error") || l.contains("abort") || l.contains("fail") }).take(10).collect();
        checks.fail(&label, &bad.join("\n"));
    }
    checks.check(
        &format!("extension updated to {current} under load"),
        p.q("SELECT extversion FROM pg_extension WHERE extname = 'idempotency'").and_then(|v| eq(v, current)),
    );
    let updated_at = committed.unwrap_or_default();
    // The move after the update, under the load: batches of 20, the table dropped at the end.
    let kept: i64 = locks.lines().find_map(|l| l.strip_prefix("kept_rows ")).and_then(|n| n.trim().parse().ok()).unwrap_or(-1);
    let moved = locks.lines().find_map(|l| l.strip_prefix("moved ")).unwrap_or("").to_owned();
    checks.check(
        &format!("the records kept from 0.6.0 moved in batches under the load (idem_maintain, batches of 20: {kept} rows), idem_records_060 dropped"),
        ensure(kept > 20 && moved.ends_with(" t"), format!("kept_rows {kept}, moved [{moved}]")),
    );
    let moved_at = moved.rsplit_once(' ').map(|(at, _)| at.to_owned()).unwrap_or_default();
    sql_checks(
        checks,
        "tests/upgrade/load-check.sql",
        p.file(Path::new("tests/upgrade/load-check.sql"), &[("updated_at", &updated_at), ("moved_at", &moved_at)]),
    );
    checks.note("locks held by the update until commit (not asserted):");
    for l in locks.lines().filter_map(|l| l.strip_prefix("lock ")) {
        checks.note(&format!("  {}", l.chars().take(215).collect::<String>()));
    }
    let field = |k: &str| locks.lines().find_map(|l| l.strip_prefix(k)).unwrap_or("?").to_owned();
    checks.note(&format!(
        "  update transaction: started {}, committed {}; clients waiting on a lock meanwhile: {}",
        field("update_started "),
        updated_at,
        field("waiting_clients ")
    ));
    for l in text.lines().filter(|l| l.starts_with("progress")) {
        checks.note(&format!("  {l}"));
    }
}
