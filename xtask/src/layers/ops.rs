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

use crate::ctx::Ctx;
use crate::psql::Psql;
use crate::report::{eq, ge, Checks};
use idempotency_pgserver::{pg_config_value, Server, Stop};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn sleep(secs: f64) {
    std::thread::sleep(Duration::from_secs_f64(secs));
}

/// A fresh server `name` of `pg_config` on `port` with `settings`, started.
fn start(name: &str, pg_config: &Path, port: u16, settings: &str) -> Server {
    let server = Server::new(name, pg_config, port);
    server.initdb(&[]);
    server.configure(settings);
    server.start();
    server
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

/// N finished records whose ttl has passed, in one transaction.
fn fill_expired(p: &Psql, rows: i64) {
    p.run(&format!(
        "INSERT INTO idem_records (operation, user_id, key, request_hash, status, token, response,
                                   lease_expires_at, expires_at, created_at, updated_at)
           SELECT 'bulk', 'u', 'k' || i, 'h', CASE WHEN i % 10 = 0 THEN 'FAILED' ELSE 'SUCCESS' END,
                  nextval('idem_token_seq'), '{{\"status\": 201}}',
                  now() - interval '2 days', now() - interval '1 day', now() - interval '2 days', now()
             FROM generate_series(1, {rows}) AS i"
    ));
}

/// Polls the bulk rows until none is left: how many polls saw 0 < remaining < rows (batches
/// committed one by one) and the seconds it took, or what was left at the deadline.
fn watch_drain(p: &Psql, rows: i64, secs: u64) -> Result<(u32, u64), String> {
    let start = Instant::now();
    let mut intermediate = 0;
    loop {
        let left = num(&p.run("SELECT count(*) FROM idem_records WHERE operation = 'bulk'"));
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
    if parts.split_whitespace().any(|p| p == "worker") {
        worker(ctx, checks, rows);
    }
    let mut cron = std::env::var("IDEM_CRON_PG_CONFIG").ok().map(PathBuf::from);
    if cron.is_none() {
        cron = [ctx.config.clone(), PathBuf::from("/usr/lib/postgresql/15/bin/pg_config")]
            .into_iter()
            .find(|c| c.is_file() && PathBuf::from(pg_config_value(c, "--pkglibdir")).join("pg_cron.so").is_file());
    }
    if !parts.split_whitespace().any(|p| p == "cron") {
        return;
    }
    // scripts/setup.sh installs postgresql-15-cron: a machine without it cannot run the recipe's
    // test, which fails; only IDEM_CRON_PG_CONFIG=none leaves the part out, by choice.
    match cron {
        Some(c) if c == Path::new("none") => checks.note("== pg_cron recipe: left out (IDEM_CRON_PG_CONFIG=none)"),
        Some(c) => pg_cron(ctx, checks, &c, rows),
        None => checks.fail(
            "the pg_cron recipe has a PostgreSQL with pg_cron to run on",
            "no pg_cron.so in this major's or Debian's 15 pkglibdir: run bash scripts/setup.sh (apt-get install postgresql-15-cron), or set IDEM_CRON_PG_CONFIG",
        ),
    }
}

fn worker(ctx: &Ctx, checks: &mut Checks, rows: i64) {
    let port = ctx.port + 20;
    checks.note(&format!("== maintenance worker and counters ({}, port {port})", ctx.value("--version")));
    let server = start(
        &format!("ops-worker-{}", ctx.major),
        &ctx.config,
        port,
        "shared_preload_libraries = 'idempotency'
idempotency.maintenance_databases = 'idem_ops, idem_noext, idem_noconn, idem_nosuchdb'
idempotency.maintenance_interval = 1
max_worker_processes = 16",
    );
    let pg = ctx.psql(port);
    let p = pg.db("idem_ops");
    let metric = |name: &str| num(&p.run(&format!("SELECT value FROM idem_metrics() WHERE name = '{name}'")));

    checks.check(
        "the launcher runs when preloaded",
        pg.until_equal(30, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher'", "1"),
    );
    checks.check(
        "the launcher logs its settings at start",
        until_logged(&server, 10, "idempotency maintenance launcher started: databases idem_ops, idem_noext, idem_noconn, idem_nosuchdb, every 1 s, batch size 10000, recover action fail", 0),
    );
    pg.run("CREATE DATABASE idem_ops");
    pg.run("CREATE DATABASE idem_noext");
    pg.run("CREATE DATABASE idem_noconn ALLOW_CONNECTIONS false");
    p.run("CREATE EXTENSION idempotency");
    p.run("CREATE ROLE idem_watcher LOGIN; GRANT pg_monitor TO idem_watcher; CREATE ROLE idem_plain LOGIN");

    // No call from the test: only the worker can change these records.
    p.run("SELECT (idem_reserve('ops', 'u', 'stuck', 'h', lease => '1 second')).outcome");
    p.run("SELECT idem_complete('ops', 'u', 'done', (idem_reserve('ops', 'u', 'done', 'h', ttl => '1 second')).token, '{}')");
    checks.check("a stuck reservation is recovered by the worker (FAILED)", p.until_equal(30, "SELECT status FROM idem_records WHERE key = 'stuck'", "FAILED"));
    checks.check("an expired record is swept by the worker", p.until_equal(30, "SELECT count(*) FROM idem_records WHERE key = 'done'", "0"));
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
    let api_metrics = || p.run("SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics() WHERE name NOT IN ('recovered', 'swept', 'worker_passes')");
    let before = api_metrics();
    p.run(
        "SELECT idem_complete('m', 'u', 'k1', (idem_reserve('m', 'u', 'k1', 'h')).token, '{}');
SELECT idem_reserve('m', 'u', 'k1', 'h');
SELECT idem_reserve('m', 'u', 'k1', 'other');
SELECT idem_reserve('m', 'u', 'k2', 'h');
SELECT idem_reserve('m', 'u', 'k2', 'h');
SELECT idem_complete('m', 'u', 'k2', 0, '{}');
SELECT idem_heartbeat('m', 'u', 'k2', 0);
SELECT idem_release('m', 'u', 'k2', 0);
SELECT idem_release('m', 'u', 'k2', (SELECT token FROM idem_records WHERE key = 'k2'));
SELECT idem_release('m', 'u', 'k2', (idem_reserve('m', 'u', 'k2', 'h')).token, max_retries => 2);
SELECT idem_reserve('m', 'u', 'k2', 'h');
SELECT idem_complete('m', 'u', 'k3', (idem_reserve('m', 'u', 'k3', 'h')).token, '{}', 'FAILED');",
    );
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
            "completions_failed=1 completions_success=1 poisonings=1 releases=1 reservations_created=4 reservations_failed=1 reservations_in_progress=1 reservations_mismatch=1 reservations_replay=1 stale_tokens=3",
        ),
    );
    checks.check(
        "recovered and swept count the worker's work",
        eq(p.run("SELECT count(*) FROM idem_metrics() WHERE name IN ('recovered', 'swept', 'worker_passes') AND value >= 1"), "3"),
    );
    let as_role = |role: &str, extra: &[&str]| {
        let out = std::process::Command::new(ctx.bin("psql"))
            .args(["-X", "-At", "-h", "127.0.0.1", "-p", &port.to_string(), "-U", role, "-d", "idem_ops"])
            .args(extra)
            .args(["-c", "SELECT count(*) FROM idem_metrics()"])
            .output()
            .expect("run psql");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)).trim().to_owned()
    };
    checks.check("pg_monitor may read the counters", eq(as_role("idem_watcher", &[]), "13"));
    checks.check("PUBLIC may not (42501)", eq(as_role("idem_plain", &["-v", "VERBOSITY=sqlstate"]), "ERROR:  42501"));

    checks.note("-- settings reload (SIGHUP) and interval 0");
    let set_interval = |n: u32| {
        pg.run(&format!("ALTER SYSTEM SET idempotency.maintenance_interval = {n}"));
        pg.run("SELECT pg_reload_conf()");
    };
    set_interval(0);
    checks.check(
        "a reload is logged with the new settings",
        until_logged(&server, 10, "idempotency maintenance settings reloaded: disabled (idempotency.maintenance_interval = 0)", 0),
    );
    let passes = metric("worker_passes");
    p.run("SELECT (idem_reserve('ops', 'u', 'stuck2', 'h', lease => '1 second')).outcome");
    sleep(4.0);
    checks.check("interval 0: no pass runs", eq(metric("worker_passes").to_string(), passes.to_string()));
    checks.check("interval 0: a stuck reservation stays stuck", eq(p.run("SELECT status FROM idem_records WHERE key = 'stuck2'"), "PROCESSING"));
    set_interval(1);
    checks.check("back to 1 s: it is recovered", p.until_equal(30, "SELECT status FROM idem_records WHERE key = 'stuck2'", "FAILED"));

    checks.note("-- restart after the launcher is killed");
    let old_pid = pg.run("SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher'");
    pg.run(&format!("SELECT pg_terminate_backend({old_pid})"));
    checks.check(
        "the launcher comes back after pg_terminate_backend",
        pg.until_equal(60, &format!("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency maintenance launcher' AND pid <> {old_pid}"), "1"),
    );
    p.run("SELECT (idem_reserve('ops', 'u', 'stuck3', 'h', lease => '1 second')).outcome");
    checks.check("and keeps maintaining", p.until_equal(30, "SELECT status FROM idem_records WHERE key = 'stuck3'", "FAILED"));

    checks.note(&format!("-- idem_stats on {rows} rows without a full scan"));
    let reloads = log_count(&server, "settings reloaded: disabled");
    set_interval(0);
    let _ = until_logged(&server, 10, "settings reloaded: disabled", reloads);
    p.run("DELETE FROM idem_records");
    fill_expired(&p, rows);
    p.run("SELECT idem_complete('live', 'u', 'k' || i, (idem_reserve('live', 'u', 'k' || i, 'h')).token, '{}') FROM generate_series(1, 500) AS i");
    p.run("SELECT idem_reserve('live', 'u', 'p' || i, 'h', lease => '1 second') FROM generate_series(1, 7) AS i");
    p.run("SELECT idem_reserve('live', 'u', 'q' || i, 'h') FROM generate_series(1, 5) AS i");
    p.run("ANALYZE idem_records");
    sleep(1.1); // the seven 1 s leases run out
    // A session's table statistics reach pg_stat_user_tables when it exits.
    let seq_scans = || {
        sleep(0.5);
        p.run("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'idem_records'")
    };
    let scans_before = seq_scans();
    let stats = p.run("SELECT processing, stuck, expired, success, failed FROM idem_stats()");
    let scans_after = seq_scans();
    let (success, failed) = (rows * 9 / 10 + 500, rows / 10);
    checks.note(&format!("     idem_stats: processing|stuck|expired|success|failed = {stats} (true: 12|7|{rows}|{success}|{failed})"));
    checks.check("idem_stats does not scan the table", eq(&scans_after, &scans_before));
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
    let xid_before = num(&p.run("SELECT txid_current()"));
    set_interval(1);
    let drained = watch_drain(&p, rows, 300);
    checks.check("the worker sweeps them all", drained.as_ref().map(drop).map_err(Clone::clone));
    let xid_after = num(&p.run("SELECT txid_current()"));
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
    for m in p.run("SELECT string_agg(name || '=' || value, ' ' ORDER BY name) FROM idem_metrics()").split(' ') {
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
}

fn pg_cron(ctx: &Ctx, checks: &mut Checks, config: &Path, rows: i64) {
    let port = ctx.port + 21;
    checks.note(&format!("== pg_cron recipe ({}, port {port})", pg_config_value(config, "--version")));
    let name = format!("ops-cron-{}", ctx.major);
    let dir = idempotency_pgserver::root().join("target/servers").join(&name);
    let server = start(&name, config, port, &format!("shared_preload_libraries = 'pg_cron'\ncron.database_name = 'postgres'\ncron.host = '{}'", dir.display()));
    let pg = Psql::new(&PathBuf::from(pg_config_value(config, "--bindir")), port);
    let p = pg.db("idem_cron");
    pg.run("CREATE DATABASE idem_cron");
    p.run("CREATE EXTENSION idempotency");
    let have = || p.run("SELECT count(*) FROM pg_proc WHERE proname = 'idem_maintain'");
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
    p.run("SELECT (idem_reserve('ops', 'u', 'stuck', 'h', lease => '1 second')).outcome");
    fill_expired(&p, rows);
    let xid_before = num(&p.run("SELECT txid_current()"));
    // The recipe, as docs/operations.md gives it.
    pg.run("CREATE EXTENSION pg_cron");
    pg.run("SELECT cron.schedule_in_database('idem-maintenance', '* * * * *', 'CALL public.idem_maintain()', 'idem_cron')");
    let drained = watch_drain(&p, rows, 200);
    checks.check("the pg_cron job sweeps them all", drained.as_ref().map(drop).map_err(Clone::clone));
    let xid_after = num(&p.run("SELECT txid_current()"));
    let (intermediate, secs) = drained.unwrap_or((0, 0));
    checks.check("in many transactions: another session saw a partial count", ge(intermediate.into(), 1));
    checks.check("at least one transaction per batch of 10000 (xids used)", ge(xid_after - xid_before, rows / 10000));
    checks.check("and recovers the stuck reservation", p.until_equal(30, "SELECT status FROM idem_records WHERE key = 'stuck'", "FAILED"));
    checks.check("the job run succeeded", pg.until_equal(30, "SELECT status FROM cron.job_run_details ORDER BY runid LIMIT 1", "succeeded"));
    let log = server.log();
    let line = log.lines().find(|l| l.contains("idempotency maintenance in database \"idem_cron\"")).unwrap_or_default().to_owned();
    checks.note(&format!("     drained in ~{secs} s after scheduling (the job starts on the next minute); {} xids", xid_after - xid_before));
    checks.note(&format!("     log: {}", line.split_once(": ").map_or("", |(_, r)| r)));
    checks.check("the procedure logs its summary with the batch transactions", ge(transactions_in(&line), rows / 10000));
    server.stop(Stop::Fast);
}
