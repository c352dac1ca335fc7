//! Runs a pgbench custom script and measures it: throughput, latency percentiles (from the
//! per-transaction log), WAL bytes per transaction and the HOT ratio of the records table.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One measured run.
#[derive(Debug, Clone, Default)]
pub(crate) struct Measure {
    pub(crate) tps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) transactions: u64,
    pub(crate) wal_bytes: f64,
    /// Updates of idem_records during the run and how many of them were HOT.
    pub(crate) updates: i64,
    pub(crate) hot_updates: i64,
}

impl Measure {
    pub(crate) fn wal_per_op(&self) -> f64 {
        if self.transactions == 0 { 0.0 } else { self.wal_bytes / self.transactions as f64 }
    }

    pub(crate) fn hot_ratio(&self) -> Option<f64> {
        (self.updates > 0).then(|| self.hot_updates as f64 / self.updates as f64)
    }

    /// The mean of several runs of one case (interleaved with its baseline).
    pub(crate) fn mean(runs: &[Measure]) -> Measure {
        let n = runs.len().max(1) as f64;
        let sum = |f: fn(&Measure) -> f64| runs.iter().map(f).sum::<f64>() / n;
        Measure {
            tps: sum(|m| m.tps),
            p50_ms: sum(|m| m.p50_ms),
            p99_ms: sum(|m| m.p99_ms),
            transactions: runs.iter().map(|m| m.transactions).sum(),
            wal_bytes: runs.iter().map(|m| m.wal_bytes).sum(),
            updates: runs.iter().map(|m| m.updates).sum(),
            hot_updates: runs.iter().map(|m| m.hot_updates).sum(),
        }
    }
}

/// Counters read before and after a run.
pub(crate) struct Counters {
    wal_lsn: String,
    updates: i64,
    hot_updates: i64,
}

pub(crate) async fn counters(db: &tokio_postgres::Client) -> Counters {
    let row = db
        .query_one(
            "SELECT pg_current_wal_lsn()::text AS lsn,
                    coalesce((SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'idem_records'), 0) AS upd,
                    coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'idem_records'), 0) AS hot",
            &[],
        )
        .await
        .expect("read counters");
    Counters { wal_lsn: row.get("lsn"), updates: row.get("upd"), hot_updates: row.get("hot") }
}

pub(crate) async fn delta(db: &tokio_postgres::Client, before: &Counters, m: &mut Measure) {
    // Statistics of the exited pgbench backends reach the shared counters within a second.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let after = counters(db).await;
    let wal: f64 = db
        .query_one("SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8 AS d", &[&after.wal_lsn, &before.wal_lsn])
        .await
        .expect("wal diff")
        .get("d");
    m.wal_bytes = wal;
    m.updates = after.updates - before.updates;
    m.hot_updates = after.hot_updates - before.hot_updates;
}

/// `pgbench -n -M prepared` of one script for `run` (whole seconds, at least 1: pgbench's `-T`);
/// the log goes under `logs`.
pub(crate) fn run(pgbench: &Path, url: &str, script: &Path, clients: u32, run: std::time::Duration, logs: &Path) -> Measure {
    let _ = std::fs::remove_dir_all(logs);
    std::fs::create_dir_all(logs).expect("log dir");
    let prefix: PathBuf = logs.join("tx");
    let out = Command::new(pgbench)
        .args(["-n", "-M", "prepared", "--log"])
        .arg(format!("--log-prefix={}", prefix.display()))
        .arg(format!("-c{clients}"))
        .arg(format!("-j{}", clients.min(2)))
        .arg(format!("-T{}", run.as_secs().max(1)))
        .arg("-f")
        .arg(script)
        .arg(url)
        .output()
        .expect("run pgbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pgbench {}: {}{}", script.display(), stdout, String::from_utf8_lossy(&out.stderr));
    let field = |label: &str| -> Option<f64> {
        stdout.lines().find_map(|l| l.strip_prefix(label)).and_then(|rest| rest.split_whitespace().next()).and_then(|v| v.parse().ok())
    };
    let mut latencies: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(logs).expect("read logs").flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        latencies.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)).filter_map(|v| v.parse::<u64>().ok()));
    }
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 - 1.0) * p).round() as usize;
        latencies[i] as f64 / 1000.0
    };
    Measure {
        tps: field("tps = ").unwrap_or(0.0),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        transactions: field("number of transactions actually processed: ").unwrap_or(0.0) as u64,
        ..Measure::default()
    }
}

/// Statements the server executes per transaction of `script`, nested ones (inside functions)
/// included: a separate short run with pg_stat_statements tracking everything, so the timed runs
/// pay nothing for it. `None` when pg_stat_statements is not loaded.
pub(crate) async fn statements_per_op(pgbench: &Path, url: &str, db: &tokio_postgres::Client, script: &Path) -> Option<f64> {
    const TRANSACTIONS: u32 = 200;
    let count = || async {
        db.query_one("SELECT coalesce(sum(calls), 0)::float8 AS n FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())", &[])
            .await
            .ok()
            .and_then(|r| r.try_get::<_, Option<f64>>("n").ok().flatten())
    };
    db.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.ok()?;
    let before = count().await?;
    let out = Command::new(pgbench)
        .args(["-n", "-M", "prepared", "-c1", "-t"])
        .arg(TRANSACTIONS.to_string())
        .arg("-f")
        .arg(script)
        .arg(url)
        .env("PGOPTIONS", "-c pg_stat_statements.track=all")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let after = count().await?;
    // The two counting queries are the only other statements in this database meanwhile.
    Some((after - before - 1.0) / f64::from(TRANSACTIONS))
}
