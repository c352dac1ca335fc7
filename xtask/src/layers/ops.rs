//! Layer ops: the maintenance worker, the shared-memory counters, idem_stats and the pg_cron
//! recipe, each on a preloaded server of its own (ports 20 and 21 above the private cluster's):
//!
//!   IDEM_CRON_PG_CONFIG  a PostgreSQL with pg_cron and the extension installed, for the
//!                        pg_cron recipe. Default: the major's if it has pg_cron, else Debian's
//!                        15 if it has; when neither has it the layer fails (scripts/setup.sh
//!                        installs postgresql-15-cron). `none` leaves that part out.
//!   IDEM_OPS_PARTS       which parts to run (default `worker cron`)
//!   IDEM_OPS_ROWS        the backlog each part sweeps (default 1000000)
//!   IDEM_OPS_RECIPE_FROM_SOURCE=1  when the extension installed for pg_cron predates
//!                        idem_maintain, create the procedure from sql/operations.sql
//!
//! A part left out by IDEM_OPS_PARTS or IDEM_CRON_PG_CONFIG=none counts as skipped. The
//! statements are tests/ops/*.sql, run by name.

use super::{throwaway, throwaway_of};
use crate::ctx::Ctx;
use crate::psql::{Named, Psql};
use crate::report::{eq, ge, Checks};
use idempotency_pgserver::{pg_config_value, Server, Stop};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sleep(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs));
}

/// The layer's statements.
fn statements() -> Named {
    Named::load(Path::new("tests/ops"))
}

/// Matching lines in the server log (`pattern` holds `|`-separated alternatives of plain text).
fn log_count(server: &Server, pattern: &str) -> usize {
    let log = server.log();
    log.lines().filter(|l| pattern.split('|').any(|p| l.contains(p))).count()
}

/// Until more than `after` lines of the log contain `text`, for at most `secs`.
fn until_logged(server: &Server, secs: u64, text: &str, after: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while log_count(server, text) <= after {
        if Instant::now() >= deadline {
            return Err(format!("no log line containing [{text}] within {secs} s"));
        }
        sleep(0.2);
    }
    Ok(())
}

fn num(s: &str) -> i64 {
    s.trim().parse().unwrap_or(i64::MIN)
}

/// Polls the bulk rows until none is left: how many polls saw 0 < remaining < rows (batches
/// committed one by one) and the seconds it took, or what was left at the deadline.
fn watch_drain(sql: &Named, p: &Psql, rows: i64, secs: u64) -> Result<(u32, u64), String> {
    let start = Instant::now();
    let mut intermediate = 0;
    loop {
        let left = num(&sql.run(p, "bulk_left", &[]));
        if left > 0 && left < rows {
            intermediate += 1;
        }
        if left == 0 {
            return Ok((intermediate, start.elapsed().as_secs()));
        }
        if start.elapsed() >= Duration::from_secs(secs) {
            return Err(format!("{left} rows left after {secs} s"));
        }
        sleep(0.2);
    }
}

/// `N` of `... in N transactions ...` in a summary line.
fn transactions_in(line: &str) -> i64 {
    line.rsplit_once(" transactions").and_then(|(head, _)| head.rsplit(' ').next()).map_or(i64::MIN, num)
}

/// Runs the layer.
pub(crate) fn run(ctx: &Ctx, checks: &mut Checks) {
    let rows: i64 = std::env::var("IDEM_OPS_ROWS").ok().and_then(|r| r.parse().ok()).unwrap_or(1_000_000);
    let parts = std::env::var("IDEM_OPS_PARTS").unwrap_or_else(|_| "worker cron".into());
    let sql = statements();
    if parts.split_whitespace().any(|p| p == "worker") {
        worker(ctx, checks, &sql, rows);
    } else {
        checks.skip("the maintenance worker: left out (IDEM_OPS_PARTS)");
    }
    let mut cron = std::env::var("IDEM_CRON_PG_CONFIG").ok().map(PathBuf::from);
    if cron.is_none() {
        cron = [ctx.config.clone(), PathBuf::from("/usr/lib/postgresql/15/bin/pg_config")]
            .into_iter()
            .find(|c| c.is_file() && PathBuf::from(pg_config_value(c, "--pkglibdir")).join("pg_cron.so").is_file());
    }
    if !parts.split_whitespace().any(|p| p == "cron") {
        checks.skip("the pg_cron recipe: left out (IDEM_OPS_PARTS)");
        return;
    }
    // scripts/setup.sh installs postgresql-15-cron: a machine without it cannot run the recipe's
    // test, which fails; only IDEM_CRON_PG_CONFIG=none leaves the part out, by choice.
    match cron {
        Some(c) if c == Path::new("none") => checks.skip("the pg_cron recipe: left out (IDEM_CRON_PG_CONFIG=none)"),
        Some(c) => pg_cron(ctx, checks, &sql, &c, rows),
        None => checks.fail(
            "the pg_cron recipe has a PostgreSQL with pg_cron to run on",
            "no pg_cron.so in this major's or Debian's 15 pkglibdir: run bash scripts/setup.sh (apt-get install postgresql-15-cron), or set IDEM_CRON_PG_CONFIG",
        ),
    }
}

fn worker(ctx: &Ctx, checks: &mut Checks, sql: &Named, rows: i64) {
    let port = ctx.port + 20;
    checks.note(&format!("== maintenance worker and counters ({}, port {port})", ctx.value("--version")));
    let server = throwaway(
        ctx,
        "ops-worker",
        port,
        "shared_preload_libraries = 'idempotency'
idempotency.maintenance_databases = 'idem_ops, idem_noext, idem_noconn, idem_nosuchdb'
idempotency.maintenance_interval = 1
max_worker_processes = 16",
    );
    let pg = ctx.psql(port);
    let p = pg.db("idem_ops");
    let metric = |name: &str| num(&sql.run(&p, "metric", &[("name", name)]));
    let status_of = |key: &str| p.until_script_equal(30, sql.get("status_of"), &[("key", key)], "FAILED");

    checks.check("the launcher runs when preloaded", pg.until_script_equal(30, sql.get("launchers"), &[], "1"));
    checks.check(
        "the launcher logs its settings at start",
        until_logged(&server, 10, "idempotency maintenance launcher started: databases idem_ops, idem_noext, idem_noconn, idem_nosuchdb, every 1 s, batch size 10000, recover action fail", 0),
    );
    sql.run(&pg, "databases", &[]);
    sql.run(&p, "create_extension", &[]);
    sql.run(&p, "roles", &[]);

    // No call from the test: only the worker can change these records.
    sql.run(&p, "stuck_reserve", &[("key", "stuck")]);
    sql.run(&p, "expired_done", &[]);
    checks.check("a stuck reservation is recovered by the worker (FAILED)", status_of("stuck"));
    checks.check("an expired record is swept by the worker", p.until_script_equal(30, sql.get("done_left"), &[], "0"));
    checks.check(
        "the worker logs a one-line summary of its recovery",
        until_logged(&server, 10, "idempotency maintenance in database \"idem_ops\": recovered 1 (action fail)", 0),
    );
    let swept = |s: &Server| {
        s.log().lines().any(|l| {
            l.split_once("idempotency maintenance in database \"idem_ops\": recovered ")
                .and_then(|(_, r)| r.split_once(" (action fail), swept "))
                .is_some_and(|(n, rest)| num(n) >= 0 && rest.starts_with(|c: char| ('1'..='9').contains(&c)))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !swept(&server) && Instant::now() < deadline {
        sleep(0.2);
    }
    checks.check("and of its sweep", if swept(&server) { Ok(()) } else { Err("no summary line with `swept N` (N > 0) within 10 s".into()) });
    let passes = metric("worker_passes");
    sleep(3.0); // a few more passes: the conditions below must still have been logged only once
    checks.check("a database without the extension is logged once", eq(log_count(&server, "database \"idem_noext\" does not have the idempotency extension; skipping it").to_string(), "1"));
    checks.check("a database that does not allow connections is logged once", eq(log_count(&server, "database \"idem_noconn\" does not allow connections; skipping it").to_string(), "1"));
    checks.check("a database that does not exist is logged once", eq(log_count(&server, "database \"idem_nosuchdb\" does not exist; skipping it").to_string(), "1"));
    let summaries = log_count(&server, "idempotency maintenance in database \"idem_ops\"");
    let later = metric("worker_passes") - passes;
    checks.note(&format!("     {summaries} summary lines, {later} passes since"));
    checks.check("passes that did nothing log nothing", if summaries <= 2 && later >= 2 { Ok(()) } else { Err(format!("{summaries} summary lines, {later} passes")) });

    checks.note("-- counters");
    let api_metrics = || sql.run(&p, "api_metrics", &[]);
    let before = api_metrics();
    sql.run(&p, "outcomes", &[]);
    let after = api_metrics();
    let parse = |s: &str| -> std::collections::BTreeMap<String, i64> {
        s.split(' ').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_owned(), num(v))).collect()
    };
    let (b, a) = (parse(&before), parse(&after));
    let delta: Vec<String> = a.iter().filter_map(|(k, v)| b.get(k).map(|old| format!("{k}={}", v - old))).collect();
    checks.check(
        "each API outcome increments exactly its counter",
        eq(
            delta.join(" "),
            "completions_failed=1 completions_success=1 poisonings=1 releases=2 reservations_created=5 reservations_failed=1 reservations_in_progress=1 reservations_mismatch=1 reservations_replay=1 reservations_resume=1 stale_tokens=3",
        ),
    );
    checks.check("recovered and swept count the worker's work", eq(sql.run(&p, "worker_metrics", &[]), "3"));
    let (watcher, plain) = (p.user("idem_watcher"), p.user("idem_plain"));
    checks.check("pg_monitor may read the counters", eq(sql.q(&watcher, "metrics_count", &[]).unwrap_or_else(|e| e), "14"));
    let refused = sql.q(&plain, "metrics_count", &[("VERBOSITY", "sqlstate")]);
    checks.check("PUBLIC may not (42501)", eq(refused.map_or_else(|e| crate::psql::error_code(&e), |v| format!("succeeded: {v}")), "42501"));

    checks.note("-- settings reload (SIGHUP) and interval 0");
    let set_interval = |n: u32| {
        sql.run(&pg, "maintenance_interval", &[("interval", &n.to_string())]);
    };
    set_interval(0);
    checks.check(
        "a reload is logged with the new settings",
        until_logged(&server, 10, "idempotency maintenance settings reloaded: disabled (idempotency.maintenance_interval = 0)", 0),
    );
    let passes = metric("worker_passes");
    sql.run(&p, "stuck_reserve", &[("key", "stuck2")]);
    sleep(4.0);
    checks.check("interval 0: no pass runs", eq(metric("worker_passes").to_string(), passes.to_string()));
    checks.check("interval 0: a stuck reservation stays stuck", eq(sql.run(&p, "status_of", &[("key", "stuck2")]), "PROCESSING"));
    set_interval(1);
    checks.check("back to 1 s: it is recovered", status_of("stuck2"));

    checks.note("-- the move after the update from 0.6.0 (docs/upgrading.md)");
    let noext = pg.db("idem_noext");
    sql.run(&noext, "install_060", &[]);
    checks.check("the update from 0.6.0 leaves the 301 records in idem_records_060", eq(sql.run(&noext, "update_070", &[]), "301"));
    checks.check("the worker moves them into idem_records and drops idem_records_060", noext.until_script_equal(30, sql.get("kept_gone"), &[], "t"));
    checks.check(
        "and logs the move in its summary",
        until_logged(&server, 10, "idempotency maintenance in database \"idem_noext\": moved 301 (kept from 0.6.0)", 0),
    );

    checks.note("-- restart after the launcher is killed");
    let old_pid = sql.run(&pg, "launcher_pid", &[]);
    sql.run(&pg, "terminate", &[("pid", &old_pid)]);
    checks.check("the launcher comes back after pg_terminate_backend", pg.until_script_equal(60, sql.get("new_launchers"), &[("pid", &old_pid)], "1"));
    sql.run(&p, "stuck_reserve", &[("key", "stuck3")]);
    checks.check("and keeps maintaining", status_of("stuck3"));

    checks.note(&format!("-- idem_stats on {rows} rows without a full scan"));
    let reloads = log_count(&server, "settings reloaded: disabled");
    set_interval(0);
    let _ = until_logged(&server, 10, "settings reloaded: disabled", reloads);
    sql.run(&p, "delete_records", &[]);
    sql.run(&p, "fill_expired", &[("rows", &rows.to_string())]);
    sql.run(&p, "live_success", &[]);
    sql.run(&p, "live_stuck", &[]);
    sql.run(&p, "live_processing", &[]);
    sql.run(&p, "analyze", &[]);
    // The seven 1 s leases run out (awaited on the database's clock).
    checks.check("the seven 1 s leases have run out", p.until_script_equal(60, sql.get("stuck_passed"), &[], "7"));
    // idem_stats and the sequential scans of idem_records in its own transaction, read from
    // pg_stat_xact_user_tables in that transaction (this backend's counts: no statistics flush
    // to await), then again after a count(*) made to scan the table: the control that the
    // counter counts here, so a scan by idem_stats could not go unseen.
    let scans = sql.run(&p, "stats_scans", &[]);
    let lines: Vec<&str> = scans.lines().collect();
    let (stats, by_stats, by_control) = match lines[..] {
        [stats, by_stats, _count, by_control] => (stats.to_owned(), by_stats, by_control),
        _ => (String::new(), "?", "?"),
    };
    let (success, failed) = (rows * 9 / 10 + 500, rows / 10);
    checks.note(&format!("     idem_stats: processing|stuck|expired|success|failed = {stats} (true: 12|7|{rows}|{success}|{failed})"));
    checks.check("the scan counter counts a scan in the same transaction (control)", eq(by_control, "1"));
    checks.check("idem_stats does not scan the table", eq(by_stats, "0"));
    let fields: Vec<&str> = stats.split('|').collect();
    checks.check("idem_stats: processing, stuck and expired are exact", eq(fields.get(..3).map(|f| f.join("|")).unwrap_or_default(), format!("12|7|{rows}")));
    let within = |got: Option<&&str>, truth: i64| {
        let g = got.map_or(i64::MIN, |g| num(g));
        if g != i64::MIN && (g - truth).abs() * 100 <= truth * 5 {
            Ok(())
        } else {
            Err(format!("estimate {g} is not within 5% of {truth}"))
        }
    };
    checks.check("idem_stats: success is estimated within 5%", within(fields.get(3), success));
    checks.check("idem_stats: failed is estimated within 5%", within(fields.get(4), failed));

    checks.note(&format!("-- a sweep of {rows} expired rows by the worker"));
    let xid_before = num(&sql.run(&p, "txid", &[]));
    set_interval(1);
    let drained = watch_drain(sql, &p, rows, 300);
    checks.check("the worker sweeps them all", drained.as_ref().map(drop).map_err(Clone::clone));
    let xid_after = num(&sql.run(&p, "txid", &[]));
    let (intermediate, secs) = drained.unwrap_or((0, 0));
    checks.check("in many transactions: another session saw a partial count", ge(intermediate.into(), 1));
    checks.check("at least one transaction per batch of 10000 (xids used)", ge(xid_after - xid_before, rows / 10000));
    // The pass logs its summary when it ends, after the VACUUM that follows a large sweep: await it.
    let is_summary = |l: &&str| {
        l.contains("idempotency maintenance in database \"idem_ops\": ")
            && l.split(" swept ").nth(1).is_some_and(|r| r.bytes().take_while(u8::is_ascii_digit).count() >= 6)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server.log().lines().any(|l| is_summary(&l)) && Instant::now() < deadline {
        sleep(0.2);
    }
    let sweep_line = server.log().lines().rev().find(is_summary).unwrap_or_default().to_owned();
    checks.note(&format!("     drained in ~{secs} s; {intermediate} polls saw a partial count; {} xids", xid_after - xid_before));
    checks.note(&format!("     log: {}", sweep_line.split_once(": ").map_or("", |(_, r)| r)));
    checks.check("the worker's summary shows the batch transactions", ge(transactions_in(&sweep_line), rows / 10000));
    checks.check(
        "after that sweep the worker vacuums both tables, and logs it",
        until_logged(&server, 60, "idempotency maintenance in database \"idem_ops\": vacuumed idem_records and idem_retries after sweeping ", 0),
    );

    checks.note("-- counters after the run");
    for m in sql.run(&p, "all_metrics", &[]).split(' ') {
        checks.note(&format!("     {m}"));
    }

    checks.note("-- clean shutdown");
    server.stop(Stop::Fast);
    checks.check("the launcher logs its shutdown", eq(log_count(&server, "idempotency maintenance launcher shutting down").to_string(), "2"));
    let crashed = server
        .log()
        .lines()
        .filter(|l| l.contains("terminated by signal") || l.contains("PANIC") || (2..=9).any(|c| l.contains(&format!("exited with exit code {c}"))))
        .count();
    checks.check("no process of ours crashed", eq(crashed.to_string(), "0"));
    checks.check("the server shut down cleanly", eq(log_count(&server, "database system is shut down").to_string(), "1"));
    for l in server.log().lines().filter(|l| l.contains("idempotency maintenance")).take(40) {
        checks.log(&format!("        {}", l.split_once(' ').map_or(l, |(_, r)| r)));
    }
    super::finish(server, checks);
}

fn pg_cron(ctx: &Ctx, checks: &mut Checks, sql: &Named, config: &Path, rows: i64) {
    let port = ctx.port + 21;
    checks.note(&format!("== pg_cron recipe ({}, port {port})", pg_config_value(config, "--version")));
    let name = format!("ops-cron-{}", ctx.major);
    let dir = idempotency_pgserver::root().join("target/servers").join(&name);
    let server = throwaway_of(config, &name, port, &format!("shared_preload_libraries = 'pg_cron'\ncron.database_name = 'postgres'\ncron.host = '{}'", dir.display()));
    let pg = Psql::new(&PathBuf::from(pg_config_value(config, "--bindir")), port);
    let p = pg.db("idem_cron");
    sql.run(&pg, "cron_database", &[]);
    sql.run(&p, "create_extension", &[]);
    let have = || sql.run(&p, "have_maintain", &[]);
    if have() == "0" && std::env::var("IDEM_OPS_RECIPE_FROM_SOURCE").as_deref() == Ok("1") {
        checks.note("     the installed extension has no idem_maintain: creating it from sql/operations.sql");
        let src = std::fs::read_to_string("sql/operations.sql").expect("read sql/operations.sql");
        let body: Vec<&str> = src
            .lines()
            .skip_while(|l| !l.starts_with("CREATE PROCEDURE @extschema@.idem_maintain"))
            .scan(false, |done, l| if *done { None } else { *done = l.starts_with("$fn$;"); Some(l) })
            .collect();
        p.run(&body.join("\n").replace("@extschema@", "public"));
    }
    checks.check("the extension has the procedure idem_maintain", eq(have(), "1"));
    sql.run(&p, "stuck_reserve", &[("key", "stuck")]);
    sql.run(&p, "fill_expired", &[("rows", &rows.to_string())]);
    let xid_before = num(&sql.run(&p, "txid", &[]));
    // The recipe, as docs/operations.md gives it.
    sql.run(&pg, "cron_extension", &[]);
    sql.run(&pg, "cron_schedule", &[]);
    let drained = watch_drain(sql, &p, rows, 200);
    checks.check("the pg_cron job sweeps them all", drained.as_ref().map(drop).map_err(Clone::clone));
    let xid_after = num(&sql.run(&p, "txid", &[]));
    let (intermediate, secs) = drained.unwrap_or((0, 0));
    checks.check("in many transactions: another session saw a partial count", ge(intermediate.into(), 1));
    checks.check("at least one transaction per batch of 10000 (xids used)", ge(xid_after - xid_before, rows / 10000));
    checks.check("and recovers the stuck reservation", p.until_script_equal(30, sql.get("status_of"), &[("key", "stuck")], "FAILED"));
    checks.check("the job run succeeded", pg.until_script_equal(30, sql.get("cron_run_status"), &[], "succeeded"));
    let log = server.log();
    let line = log.lines().find(|l| l.contains("idempotency maintenance in database \"idem_cron\"")).unwrap_or_default().to_owned();
    checks.note(&format!("     drained in ~{secs} s after scheduling (the job starts on the next minute); {} xids", xid_after - xid_before));
    checks.note(&format!("     log: {}", line.split_once(": ").map_or("", |(_, r)| r)));
    checks.check("the procedure logs its summary with the batch transactions", ge(transactions_in(&line), rows / 10000));
    super::finish(server, checks);
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every statement the layer runs by name is in tests/ops, and every one there is run.
    #[test]
    fn every_named_statement_exists_and_is_used() {
        let named = crate::psql::Named::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ops"));
        let used = crate::psql::named_in(include_str!("ops.rs"));
        let missing: Vec<&String> = used.iter().filter(|n| !named.names().any(|m| m == n.as_str())).collect();
        assert!(missing.is_empty(), "named in ops.rs, not in tests/ops: {missing:?}");
        let unused: Vec<&str> = named.names().filter(|m| !used.iter().any(|n| n == m)).collect();
        assert!(unused.is_empty(), "in tests/ops, never run: {unused:?}");
    }
}
