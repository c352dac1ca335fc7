//! The waiters' row (issue 44): 50 duplicates of a key held by a two-phase attempt whose outside
//! call takes 2 s (200 ms in smoke mode), waiting for it with `Settings::wait` (each polls, holding
//! no connection between polls) against the same 50 answered `InProgress` (409) at once, over the
//! Rust client with a pool of 8. The figure is answers per second of server CPU (the time on CPU
//! of every server process, /proc/PID/task/*/schedstat, from before the holder reserves until it
//! and every duplicate answered), so the ratio is the 409 case's server CPU over the waiting
//! case's; the row's notes give both in milliseconds and the connections each used.

use crate::pgbench::Measure;
use crate::Row;
use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, Postgres, StoredResponse, TxFuture};
use std::time::Duration;

/// The duplicates of each case.
const DUPLICATES: usize = 50;
/// The pool of the handle the duplicates and the holder share.
const POOL: u32 = 8;

/// What one case cost.
struct Cost {
    server_cpu: Duration,
    answered: usize,
    replays: usize,
    backends: i64,
}

/// The row: `reps` interleaved pairs of the two cases.
pub(crate) async fn row(url: &str, db: &tokio_postgres::Client, smoke: bool, reps: usize) -> Row {
    let outside = if smoke { Duration::from_millis(200) } else { Duration::from_secs(2) };
    let (mut at_once, mut waited) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        for wait in [rep % 2 != 0, rep % 2 == 0] {
            let cost = case(url, db, wait, outside).await;
            if wait { waited.push(cost) } else { at_once.push(cost) }
        }
    }
    let mean_ms = |c: &[Cost]| c.iter().map(|c| c.server_cpu.as_secs_f64() * 1000.0).sum::<f64>() / c.len().max(1) as f64;
    let (base_ms, ours_ms) = (mean_ms(&at_once), mean_ms(&waited));
    let per_cpu_second = |c: &[Cost], ms: f64| Measure {
        tps: if ms > 0.0 { c.iter().map(|c| c.answered).sum::<usize>() as f64 / c.len().max(1) as f64 / (ms / 1000.0) } else { 0.0 },
        transactions: c.iter().map(|c| c.answered as u64).sum(),
        ..Measure::default()
    };
    let replays: usize = waited.iter().map(|c| c.replays).sum();
    let backends = |c: &[Cost]| c.iter().map(|c| c.backends).max().unwrap_or(0);
    Row {
        figure: "50 waiting duplicates vs 50 answered 409 at once (answers per server CPU second)".into(),
        clients: format!("{DUPLICATES} duplicates"),
        baseline: format!("Settings::wait off: InProgress at once, while the holder's {outside:?} outside call runs"),
        base: per_cpu_second(&at_once, base_ms),
        ours: per_cpu_second(&waited, ours_ms),
        goal: None,
        work: Some(format!(
            "server CPU {ours_ms:.0} ms waiting vs {base_ms:.0} ms at once; {replays} of {} waiters replayed; connections: a pool of {POOL}, at most {} / {} backends of the database (waiting / at once)",
            waited.len() * DUPLICATES,
            backends(&waited),
            backends(&at_once)
        )),
    }
}

/// One case: a two-phase holder calls out for `outside`; [`DUPLICATES`] duplicates arrive once it
/// has reserved, waiting for it or not.
async fn case(url: &str, db: &tokio_postgres::Client, wait: bool, outside: Duration) -> Cost {
    let settings = idempotency_client::Settings::builder().wait(wait).wait_timeout(outside * 5);
    let idem = Idempotency::<Postgres>::from_url(url, POOL, settings).expect("pool");
    // Every connection open before the window, so that the window counts no connection set-up.
    let mut warm = Vec::new();
    for _ in 0..POOL {
        warm.push(idem.pool().get().await.expect("a connection"));
    }
    drop(warm);
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let key = Key::new("bench.waiters", "u", format!("w-{}-{n}", std::process::id())).expect("key");
    let fingerprint = Fingerprint::of_json(&serde_json::json!({"amount": 1})).expect("fingerprint");
    let server = server_pids(db).await;
    let cpu0 = server_cpu(&server);
    let (started, reserved) = tokio::sync::oneshot::channel();
    let holder = {
        let (idem, key, fingerprint) = (idem.clone(), key.clone(), fingerprint.clone());
        let call = async move {
            let _ = started.send(());
            tokio::time::sleep(outside).await;
            Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, serde_json::json!({"by": "holder"})))
        };
        tokio::spawn(async move { Box::pin(idem.run_external(&key, &fingerprint, call, nothing)).await })
    };
    reserved.await.expect("the holder reserved");
    let duplicates: Vec<_> = (0..DUPLICATES)
        .map(|_| {
            let (idem, key, fingerprint) = (idem.clone(), key.clone(), fingerprint.clone());
            let call = async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(500, serde_json::Value::Null)) };
            tokio::spawn(async move { Box::pin(idem.run_external(&key, &fingerprint, call, nothing)).await })
        })
        .collect();
    // The database's connections, sampled every 50 ms until the holder and every duplicate
    // answered.
    let peak = std::cell::Cell::new(0);
    let answered = async {
        let mut answers = Vec::new();
        for duplicate in duplicates {
            answers.push(duplicate.await.expect("task"));
        }
        assert!(matches!(holder.await.expect("task"), Ok(Outcome::Executed(_))), "the holder executes");
        answers
    };
    let sampled = async {
        loop {
            peak.set(peak.get().max(database_backends(db).await));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let answers = tokio::select! {
        answers = answered => answers,
        () = sampled => unreachable!("the sampler never ends"),
    };
    let backends = peak.get();
    let server_cpu = Duration::from_nanos(server_cpu(&server).saturating_sub(cpu0));
    let replays = answers.iter().filter(|a| matches!(a, Ok(Outcome::Replayed(_)))).count();
    let answered = answers.iter().filter(|a| matches!(a, Ok(Outcome::Replayed(_)) | Err(Error::InProgress { .. }))).count();
    Cost { server_cpu, answered, replays, backends }
}

/// The two-phase flow's local write: nothing.
fn nothing<'t, C: ?Sized>(_: &'t mut C, _: &'t StoredResponse) -> TxFuture<'t, (), tokio_postgres::Error> {
    Box::pin(std::future::ready(Ok(())))
}

/// Every server process (backends, background workers and processes) but this connection's.
async fn server_pids(db: &tokio_postgres::Client) -> Vec<i32> {
    db.query("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()", &[]).await.expect("pg_stat_activity").iter().map(|r| r.get(0)).collect()
}

/// The connections to this database but this one.
async fn database_backends(db: &tokio_postgres::Client) -> i64 {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    db.query_one(sql, &[]).await.expect("pg_stat_activity").get(0)
}

/// Nanoseconds on CPU of `pids` (their /proc/PID/task/*/schedstat).
fn server_cpu(pids: &[i32]) -> u64 {
    pids.iter().map(|&pid| crate::client::cpu_ns(pid)).sum()
}
