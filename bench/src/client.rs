//! The Rust client's `run` against a raw tokio-postgres transaction doing the same insert:
//! throughput and client-side latencies of concurrent loops, and WAL per call (the round trips
//! per call come from the test kit's `trips`).

use crate::pgbench::Measure;
use idempotency_client::{OneStatement, Fingerprint, Idempotency, Key, ReplayCache, Settings, StoredResponse};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) const INSERT: &str = "INSERT INTO bench_charges (user_id, amount) VALUES ($1, 100)";

/// One call: `run` around the INSERT on a new key (or around nothing, when `empty`), or the
/// same INSERT in a raw transaction on `raw`; the one the round-trip count makes too.
pub(crate) async fn call(idem: &Idempotency, raw: Option<&mut deadpool_postgres::Client>, user: &str, empty: bool) {
    idempotency_testkit::trips::call(idem, raw, INSERT, user, empty).await;
}

/// What a loop of [`throughput`] calls.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    /// `run` around the one-row INSERT, a new key each time.
    Run,
    /// The same INSERT in a raw tokio-postgres transaction.
    RawInsert,
    /// `run` on a key that already succeeded: the stored response replays.
    Replay,
    /// A raw primary-key SELECT of that key's record (prepared, on a held connection).
    RawSelect,
    /// [`Call::Replay`] with a replay cache on the handle: answered from memory.
    CachedReplay,
    /// `run_statement` around the same INSERT: the flow in one statement.
    RunStatement,
    /// [`Call::Replay`] with `Settings::replay_first`: `idem_replay` in autocommit.
    FirstReplay,
    /// [`Call::Run`] with `Settings::replay_first`: a fresh key pays `idem_replay` first.
    FirstRun,
}

impl Call {
    /// Whether the call reads the replayed key (a replay, or the raw SELECT of its record).
    pub(crate) fn reads_the_replayed_key(self) -> bool {
        matches!(self, Call::Replay | Call::RawSelect | Call::CachedReplay | Call::FirstReplay)
    }

    /// The handle's settings for this call kind.
    pub(crate) fn settings(self) -> Settings {
        match self {
            Call::CachedReplay => Settings::builder().replay_cache(ReplayCache::new(10_000, Duration::from_secs(60))).build(),
            Call::FirstReplay | Call::FirstRun => Settings::builder().replay_first(true).build(),
            _ => Settings::default(),
        }
    }
}

/// The handle of `tasks` loops of `kind`, a connection each, with [`Call::settings`].
fn handle(url: &str, tasks: usize, kind: Call) -> Idempotency {
    Idempotency::from_url(url, pool_size(tasks), kind.settings()).expect("pool")
}

static NEXT_ONE: AtomicU64 = AtomicU64::new(0);

/// The one-statement flow's INSERT: the raw rows' own, reading `created`.
const ONE_INSERT: &str = "INSERT INTO bench_charges (user_id, amount) SELECT $1, 100 FROM created RETURNING id";

/// `run_statement` on a new key, over either driver.
pub(crate) async fn run_statement<D: idempotency_client::Driver>(idem: &Idempotency<D>, user: &str) {
    let key = Key::new("bench.lat.one", user, format!("rs-{}", NEXT_ONE.fetch_add(1, Ordering::Relaxed))).expect("valid key");
    let out = idem
        .run_statement::<serde_json::Value>(&key, &Fingerprint::of_bytes(b"bench"), &OneStatement::new(ONE_INSERT).text(user))
        .await
        .expect("run_statement");
    assert!(out.is_executed(), "a new key executes");
}

const SELECT: &str = "SELECT response FROM idem_records WHERE id = _idem_id($1, $2, $3) AND operation = $1 AND user_id = $2 AND key = $3";

/// One replay (`run` on an executed key) or the raw SELECT of the same record.
pub(crate) async fn replay(idem: &Idempotency, raw: Option<&mut deadpool_postgres::Client>, key: &Key) {
    if let Some(client) = raw {
        let stmt = client.prepare_cached(SELECT).await.expect("prepare");
        client.query_opt(&stmt, &[&key.operation(), &key.user_id(), &key.key()]).await.expect("select");
        return;
    }
    let fp = Fingerprint::of_bytes(b"bench");
    let out = idem
        .run(key, &fp, |_tx| Box::pin(async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({}))) }))
        .await
        .expect("run");
    assert!(out.is_replayed(), "the benchmark key must replay");
}

/// The key the replay rows read.
fn replay_key() -> Key {
    Key::new("bench.replay", "rust", "k").expect("valid key")
}

/// The replay rows' key, executed once (if it was not already) after one `run` that warms the
/// pool's statements.
pub(crate) async fn replayed_key(idem: &Idempotency) -> Key {
    let key = replay_key();
    call(idem, None, "rust", false).await;
    let fp = Fingerprint::of_bytes(b"bench");
    idem.run(&key, &fp, |_tx| Box::pin(async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({}))) }))
        .await
        .expect("first run of the replayed key");
    key
}

/// `tasks` concurrent loops of one call kind for `run`: calls per second, client-side
/// p50/p99 latency, and the WAL written (read on `db` before and after).
pub(crate) async fn throughput(url: &str, db: &tokio_postgres::Client, tasks: usize, run: Duration, kind: Call) -> Measure {
    let idem = handle(url, tasks, kind);
    // The replay rows read one key that executed once, before the clock starts.
    let replayed = if kind.reads_the_replayed_key() { replayed_key(&idem).await } else { replay_key() };
    let before = wal_lsn(db).await;
    let stop = Instant::now() + run;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (idem, replayed) = (idem.clone(), replayed.clone());
        handles.push(tokio::spawn(async move {
            let user = format!("rust-{t}");
            // The raw loops hold their connection; `run` takes one from the pool per call.
            let raw_kind = matches!(kind, Call::RawInsert | Call::RawSelect);
            let mut raw = if raw_kind { Some(idem.pool().get().await.expect("connection")) } else { None };
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let t0 = Instant::now();
                match kind {
                    Call::Run | Call::RawInsert | Call::FirstRun => call(&idem, raw.as_mut(), &user, false).await,
                    Call::RunStatement => run_statement(&idem, &user).await,
                    Call::Replay | Call::RawSelect | Call::CachedReplay | Call::FirstReplay => replay(&idem, raw.as_mut(), &replayed).await,
                }
                // A replay from memory never waits, so never yields on its own: give the
                // runtime its turn when the task's budget runs out, as a service's next read would.
                if kind == Call::CachedReplay {
                    tokio::task::consume_budget().await;
                }
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let wal = wal_since(db, &before).await;
    measure(latencies, elapsed, wal)
}

/// The measure of a run: one latency per call over `elapsed` seconds, `wal` bytes written.
pub(crate) fn measure(mut latencies: Vec<Duration>, elapsed: f64, wal: f64) -> Measure {
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        latencies.get(((latencies.len().max(1) - 1) as f64 * p).round() as usize).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Measure {
        tps: latencies.len() as f64 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        transactions: latencies.len() as u64,
        wal_bytes: wal,
        ..Measure::default()
    }
}

/// The server's current WAL position.
pub(crate) async fn wal_lsn(db: &tokio_postgres::Client) -> String {
    db.query_one("SELECT pg_current_wal_lsn()::text AS l", &[]).await.expect("lsn").get("l")
}

/// WAL bytes written since `before` (a [`wal_lsn`]).
pub(crate) async fn wal_since(db: &tokio_postgres::Client, before: &str) -> f64 {
    let after = wal_lsn(db).await;
    db.query_one("SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)::float8 AS d", &[&after, &before])
        .await
        .expect("wal diff")
        .get("d")
}

/// `bench --rust-case CASE TASKS SECONDS` (bench/profile-client.sh): one call kind of the Rust
/// rows, `tasks` loops as in [`throughput`] after one second of warm-up, measured for
/// `seconds`. When the window opens it prints `ready PID BACKENDS` (this process and the pids of
/// its pool's server backends, for perf), when it closes one `result` line: calls, seconds, and
/// the CPU (from /proc/PID/schedstat, ns on CPU of every thread) of this process, of the case's
/// backends and of every server process in pg_stat_activity.
pub(crate) async fn single_case(url: &str, db: &tokio_postgres::Client, kind: Call, tasks: usize, seconds: u64) {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let idem = handle(url, tasks, kind);
    let replayed = if kind.reads_the_replayed_key() { replayed_key(&idem).await } else { replay_key() };
    let (calls, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (idem, replayed, calls, stop) = (idem.clone(), replayed.clone(), calls.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let user = format!("rust-{t}");
            let raw_kind = matches!(kind, Call::RawInsert | Call::RawSelect);
            let mut raw = if raw_kind { Some(idem.pool().get().await.expect("connection")) } else { None };
            while !stop.load(Ordering::Relaxed) {
                match kind {
                    Call::Run | Call::RawInsert | Call::FirstRun => call(&idem, raw.as_mut(), &user, false).await,
                    Call::RunStatement => run_statement(&idem, &user).await,
                    Call::Replay | Call::RawSelect | Call::CachedReplay | Call::FirstReplay => replay(&idem, raw.as_mut(), &replayed).await,
                }
                // A replay from memory never waits, so never yields on its own: give the
                // runtime its turn when the task's budget runs out, as a service's next read would.
                if kind == Call::CachedReplay {
                    tokio::task::consume_budget().await;
                }
                calls.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // IDEM_BENCH_CALLS_FILE: the running count of calls, rewritten every 50 ms, for a tool that
    // counts something else over a window of its own (profile-client.sh's system calls).
    if let Ok(path) = std::env::var("IDEM_BENCH_CALLS_FILE") {
        let (calls, stop) = (calls.clone(), stop.clone());
        tokio::spawn(async move {
            let tmp = format!("{path}.tmp");
            while !stop.load(Ordering::Relaxed) {
                if std::fs::write(&tmp, calls.load(Ordering::Relaxed).to_string()).is_ok() {
                    let _ = std::fs::rename(&tmp, &path);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pids = |sql: &'static str| async move {
        db.query(sql, &[]).await.expect("pg_stat_activity").iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<i32>>()
    };
    let backends = pids("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()").await;
    let server = pids("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()").await;
    let me = std::process::id() as i32;
    let cpu = |pids: &[i32]| pids.iter().map(|&p| cpu_ns(p)).sum::<u64>();
    let (n0, c0, b0, s0, t0) = (calls.load(Ordering::Relaxed), cpu(&[me]), cpu(&backends), cpu(&server), Instant::now());
    let list = backends.iter().map(i32::to_string).collect::<Vec<_>>().join(",");
    println!("ready {me} {list}");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (n1, c1, b1, s1, secs) = (calls.load(Ordering::Relaxed), cpu(&[me]), cpu(&backends), cpu(&server), t0.elapsed().as_secs_f64());
    println!(
        "result calls={} seconds={secs:.3} client_cpu_ns={} backends_cpu_ns={} server_cpu_ns={} backends={}",
        n1 - n0,
        c1 - c0,
        b1 - b0,
        s1 - s0,
        backends.len()
    );
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("task");
    }
}

/// Nanoseconds on CPU of every thread of process `pid` (its /proc/PID/task/*/schedstat); 0 for
/// a process that is gone.
pub(crate) fn cpu_ns(pid: i32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// A pool of a connection for each of `tasks` loops (a pool's size is a `u32`).
pub(crate) fn pool_size(tasks: usize) -> u32 {
    u32::try_from(tasks).expect("a pool size of at most u32::MAX")
}
