//! The soak: many cycles of reserve/complete (and release) whose records expire a second later, swept by
//! the maintenance worker only, on a server of its own (idempotency preloaded, every other
//! setting PostgreSQL's default, autovacuum included). After each cycle it records the size of
//! idem_records + idem_retries with their indexes; the figure is the size after the last cycle
//! against the size after cycle 5.
//!
//! The server: a fresh cluster under target/servers/bench-soak on port `IDEM_SOAK_PORT` (default
//! 55915; another port gets its own directory, target/servers/bench-soak-PORT). `IDEM_SOAK_SQL`, when set, runs after CREATE EXTENSION (to measure an alternative,
//! e.g. other storage options), and `bench --soak` runs the soak alone.

use idempotency_testkit::server::Server;
use idempotency_testkit::{pg_bin, pg_config, root};
use std::process::Command;
use std::time::{Duration, Instant};
use crate::connect;

/// The cycle whose size is the baseline of the plateau figure (the table has warmed up by then).
pub(crate) const BASE_CYCLE: usize = 5;

/// What the soak measured: per cycle (1-based index = position + 1), the sizes in bytes.
pub(crate) struct Soak {
    pub(crate) cycles: Vec<Sizes>,
    pub(crate) transactions_per_cycle: u32,
    pub(crate) seconds: f64,
}

#[derive(Clone, Copy, Default)]
pub(crate) struct Sizes {
    pub(crate) records_heap: i64,
    pub(crate) records_indexes: i64,
    pub(crate) retries_heap: i64,
    pub(crate) retries_indexes: i64,
    /// Of records_indexes: the primary key's (random keys: the one that grows by page splits).
    pub(crate) records_pkey: i64,
    /// Autovacuum and manual vacuums of the two tables so far (pg_stat_user_tables).
    pub(crate) autovacuums: i64,
    pub(crate) vacuums: i64,
    /// Autoanalyzes of the two tables so far.
    pub(crate) autoanalyzes: i64,
    /// Dead rows of the two tables as the statistics count them at the measurement (what the
    /// last VACUUM left, plus deletes since).
    pub(crate) dead: i64,
}

impl Sizes {
    pub(crate) fn total(&self) -> i64 {
        self.records_heap + self.records_indexes + self.retries_heap + self.retries_indexes
    }
}

impl Soak {
    /// Size after the last cycle / size after cycle 5 (or the first, in a shorter soak).
    pub(crate) fn ratio(&self) -> f64 {
        let base = self.cycles.get(BASE_CYCLE - 1).or(self.cycles.first()).map(Sizes::total).unwrap_or(0);
        let last = self.cycles.last().map(Sizes::total).unwrap_or(0);
        last as f64 / base.max(1) as f64
    }

    pub(crate) fn csv(&self) -> String {
        // kb_of_csv reads it back: total_bytes is the second column.
        let mut c = String::from("cycle,total_bytes,records_heap_bytes,records_index_bytes,records_pkey_bytes,retries_heap_bytes,retries_index_bytes,autovacuums,vacuums,autoanalyzes,dead_rows\n");
        for (i, s) in self.cycles.iter().enumerate() {
            c.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{}\n",
                i + 1,
                s.total(),
                s.records_heap,
                s.records_indexes,
                s.records_pkey,
                s.retries_heap,
                s.retries_indexes,
                s.autovacuums,
                s.vacuums,
                s.autoanalyzes,
                s.dead
            ));
        }
        c
    }
}

/// The soak's own server (the test kit's [`Server`]: initdb, its settings, start with a bind
/// deadline), with only what the soak needs: idempotency preloaded and its worker on idem_soak
/// every second; autovacuum and everything else keep their defaults. Stopped when dropped.
fn start_server() -> Server {
    let port: u16 = std::env::var("IDEM_SOAK_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(55915);
    // Another port, another directory: soaks on two ports do not share a cluster.
    let name = if port == 55915 { "bench-soak".to_owned() } else { format!("bench-soak-{port}") };
    let server = Server::new(&name, &pg_config(), port);
    server.initdb(&[]);
    server.configure(
        "shared_preload_libraries = 'idempotency'\nidempotency.maintenance_databases = 'idem_soak'\n\
         idempotency.maintenance_interval = 1\nlog_min_messages = warning\nlog_autovacuum_min_duration = 0\n",
    );
    if let Ok(conf) = std::env::var("IDEM_SOAK_CONF") {
        server.configure(&conf.replace("; ", "\n"));
    }
    server.start();
    server
}

/// A counter of idem_metrics() (shared memory: reading it touches no table, so the wait itself
/// prunes no page).
pub(crate) async fn counter(db: &tokio_postgres::Client, name: &str) -> i64 {
    db.query_one("SELECT value FROM idem_metrics() WHERE name = $1", &[&name]).await.expect("idem_metrics").get("value")
}

/// Polls `counter` until it reaches `at_least` (a minute at most), then returns it.
async fn await_counter(db: &tokio_postgres::Client, name: &str, at_least: i64, cycle: usize) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = counter(db, name).await;
        if now >= at_least {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "soak cycle {cycle}: idem_metrics() {name} = {now} after 60 s, {at_least} awaited (is the maintenance worker running? see target/servers/bench-soak/server.log)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sizes(db: &tokio_postgres::Client) -> Sizes {
    let r = db
        .query_one(
            "SELECT pg_relation_size('idem_records') AS rh, pg_indexes_size('idem_records') AS ri, pg_relation_size('idem_records_pkey') AS rk,
                    pg_relation_size('idem_retries') AS th, pg_indexes_size('idem_retries') AS ti,
                    (SELECT sum(autovacuum_count) FROM pg_stat_user_tables WHERE relname IN ('idem_records', 'idem_retries'))::bigint AS av,
                    (SELECT sum(vacuum_count) FROM pg_stat_user_tables WHERE relname IN ('idem_records', 'idem_retries'))::bigint AS v,
                    (SELECT sum(autoanalyze_count) FROM pg_stat_user_tables WHERE relname IN ('idem_records', 'idem_retries'))::bigint AS aa,
                    (SELECT sum(n_dead_tup) FROM pg_stat_user_tables WHERE relname IN ('idem_records', 'idem_retries'))::bigint AS dead",
            &[],
        )
        .await
        .expect("sizes");
    Sizes {
        records_heap: r.get("rh"),
        records_indexes: r.get("ri"),
        records_pkey: r.get("rk"),
        retries_heap: r.get("th"),
        retries_indexes: r.get("ti"),
        autovacuums: r.get::<_, Option<i64>>("av").unwrap_or(0),
        vacuums: r.get::<_, Option<i64>>("v").unwrap_or(0),
        autoanalyzes: r.get::<_, Option<i64>>("aa").unwrap_or(0),
        dead: r.get::<_, Option<i64>>("dead").unwrap_or(0),
    }
}

/// `cycles` cycles of `clients` x `per_client` transactions of bench/pgbench/soak.sql, each
/// followed by the worker's sweep of everything it created, awaited through its counters.
pub(crate) async fn soak(cycles: usize, clients: u32, per_client: u32) -> Soak {
    let server = start_server();
    let admin = connect(&server.url("postgres")).await;
    admin.batch_execute("CREATE DATABASE idem_soak").await.expect("create idem_soak");
    let url = server.url("idem_soak");
    let db = connect(&url).await;
    db.batch_execute("CREATE EXTENSION idempotency").await.expect("create extension");
    if let Ok(sql) = std::env::var("IDEM_SOAK_SQL") {
        db.batch_execute(&sql).await.unwrap_or_else(|e| panic!("IDEM_SOAK_SQL {sql}: {e}"));
    }
    let script = root().join("bench/pgbench/soak.sql");
    let pgbench = pg_bin("pgbench");
    let per_cycle = clients * per_client;
    let started = Instant::now();
    let mut measured = Vec::with_capacity(cycles);
    let mut expected = counter(&db, "swept").await;
    for cycle in 1..=cycles {
        let out = Command::new(&pgbench)
            .args(["-n", "-M", "prepared"])
            .arg(format!("-c{clients}"))
            .arg(format!("-j{}", clients.min(2)))
            .arg(format!("-t{per_client}"))
            .arg("-f")
            .arg(&script)
            .arg(&url)
            .output()
            .expect("run pgbench");
        assert!(out.status.success(), "pgbench soak cycle {cycle}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // Each transaction leaves one expired row: a record, or a released key's retry counter.
        expected += i64::from(per_cycle);
        await_counter(&db, "swept", expected, cycle).await;
        // The pass that swept the last of them has ended (it counts itself at its very end, after
        // anything it does once swept), so every cycle is measured at the same point.
        let passes = counter(&db, "worker_passes").await;
        await_counter(&db, "worker_passes", passes + 1, cycle).await;
        measured.push(sizes(&db).await);
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(server);
    Soak { cycles: measured, transactions_per_cycle: per_cycle, seconds }
}

/// The benchmark's goal for the soak: the size after cycle 100 at most this many times the size
/// after cycle [`BASE_CYCLE`], in every run.
pub(crate) const GOAL: f64 = 1.15;

/// The plateau bound the test command asserts: the size after the last cycle at most this many
/// times the size after cycle [`BASE_CYCLE`].
pub(crate) const CHECK_BOUND: f64 = 1.3;

/// `bench --soak-check CYCLES`: the soak's shape (4 clients x 300 transactions a cycle) for
/// `cycles` cycles, asserting the plateau; the sizes per cycle go to target/bench/soak-check.csv.
/// Measures sizes, never a duration. Returns the exit code.
pub(crate) async fn check(cycles: usize) -> i32 {
    if cycles < 30 {
        eprintln!("bench --soak-check: CYCLES must be at least 30 (a plateau needs a run well past the warm-up of {BASE_CYCLE} cycles), got {cycles}");
        return 2;
    }
    let soaked = soak(cycles, 4, 300).await;
    let csv = root().join("target/bench/soak-check.csv");
    if let Err(e) = std::fs::create_dir_all(root().join("target/bench")).and_then(|()| std::fs::write(&csv, soaked.csv())) {
        eprintln!("{}: {e}", csv.display());
    }
    let size = |i: usize| soaked.cycles.get(i).map(|c| c.total() / 1024).unwrap_or(0);
    let peak = soaked.cycles.iter().map(Sizes::total).max().unwrap_or(0) / 1024;
    let last = soaked.cycles.last().copied().unwrap_or_default();
    let verdict = if soaked.ratio() <= CHECK_BOUND { "ok" } else { "FAILED" };
    println!(
        "soak check {verdict}: {cycles} cycles of {} transactions, {} kB after cycle {BASE_CYCLE}, {} kB after the last (peak {peak} kB): {:.3} (bound {CHECK_BOUND}); {} worker VACUUMs, {} autovacuums, {:.0} s",
        soaked.transactions_per_cycle,
        size(BASE_CYCLE - 1),
        size(cycles - 1),
        soaked.ratio(),
        last.vacuums,
        last.autovacuums,
        soaked.seconds
    );
    i32::from(soaked.ratio() > CHECK_BOUND)
}

/// The sizes in kB per cycle of a soak CSV (what [`Soak::csv`] wrote), to redraw its chart.
pub(crate) fn kb_of_csv(csv: &str) -> Vec<f64> {
    csv.lines().skip(1).filter_map(|l| l.split(',').nth(1)?.parse::<f64>().ok()).map(|b| b / 1024.0).collect()
}
