//! The latency rows (`bench --latency`; every full and smoke run has them too): what one call
//! costs its caller when a round trip to the database costs what it does across a network.
//! Every connection, ours and the baseline's, goes through one test-kit proxy that adds a set
//! time to each round trip ([`DELAYS`]: a database in another zone, in the same zone); each row
//! is one flow against its own raw baseline through that proxy, at 1 and 8 concurrent callers,
//! interleaved A B B A. Beside each row: the delay the proxy actually achieved (a `SELECT 1`
//! through it against the same directly, p50) and the round trips per call it counted for each
//! side.
//!
//! The calls are the throughput rows' own: `client.rs` and `client_sqlx.rs` for `run` and a
//! replay, `http.rs` for the example service (here with its database connections through the
//! proxy); `run_external`, `run_batch` and the one-statement flow are written here once.

use crate::client::{self, INSERT};
use crate::client_sqlx;
use crate::http::{self, Route, Side};
use crate::pgbench::Measure;
use idempotency_client::{BatchItem, Fingerprint, Idempotency, Key, ReplayCache, Settings, Sqlx, StoredResponse};
use idempotency_testkit::proxy::Proxy;
use serde_json::json;
use sqlx::Connection as _;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

/// The round trips the rows are measured at: a database in another zone, in the same zone.
pub(crate) const DELAYS: [Duration; 2] = [Duration::from_millis(1), Duration::from_micros(200)];
/// Concurrent callers of each row.
const CALLERS: [usize; 2] = [1, 8];
/// Keys of a `run_batch` call, rows of its raw baseline.
const BATCH: usize = 100;
/// The batch rows' statement: one business row per key, for both sides.
const BATCH_INSERT: &str = "INSERT INTO bench_charges (user_id, amount) SELECT $1, 100 FROM unnest($2::text[])";

/// One call kind: a flow of ours or a raw baseline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Case {
    /// tokio-postgres: `run` around the one-row INSERT (client.rs).
    Run,
    /// The same INSERT in a raw transaction: BEGIN, INSERT, COMMIT, each awaited (client.rs).
    RawTx,
    /// A replay of an executed key (client.rs).
    Replay,
    /// The raw primary-key SELECT of its record (client.rs).
    RawSelect,
    /// `run_external` with an outside call that returns at once, recording the INSERT.
    External,
    /// `run_batch` of [`BATCH`] new keys, one INSERT of a row per key.
    Batch,
    /// That INSERT of [`BATCH`] rows in a raw transaction.
    RawBatch,
    /// The in-transaction flow in one statement (bench/pgbench/fresh_one.sql), prepared.
    OneStatement,
    /// `run_statement` around the same INSERT (tokio-postgres).
    RunStatement,
    /// A replay answered by the handle's replay cache.
    CachedReplay,
    /// The same over sqlx (client_sqlx.rs and here), against raw sqlx.
    SqlxRun,
    SqlxRawTx,
    SqlxReplay,
    SqlxRawSelect,
    SqlxExternal,
    SqlxBatch,
    SqlxRawBatch,
    SqlxRunStatement,
    /// The raw sqlx transaction and SELECT on a connection taken from the pool for the call and
    /// given back after it, as a handler does (sqlx checks a connection given back: a round trip
    /// the next call on it waits for, as it waits for ours).
    SqlxPooledTx,
    SqlxPooledSelect,
    /// A request to the example service (http.rs).
    Http(Route, Side),
}

/// A row: figure, baseline (its description and case), our case, goal at 1 ms (a ceiling on
/// the p50 ratio).
struct Spec {
    figure: &'static str,
    baseline: &'static str,
    base: Case,
    ours: Case,
    goal: Option<f64>,
}

const SPECS: &[Spec] = &[
    Spec { figure: "run vs raw transaction (tokio-postgres)", baseline: "BEGIN; INSERT; COMMIT, each awaited", base: Case::RawTx, ours: Case::Run, goal: Some(1.05) },
    Spec { figure: "replay vs raw PK SELECT (tokio-postgres)", baseline: "prepared SELECT of the record", base: Case::RawSelect, ours: Case::Replay, goal: Some(1.05) },
    Spec { figure: "run_external vs raw record transaction (tokio-postgres)", baseline: "the record's BEGIN; INSERT; COMMIT alone (the outside call returns at once on both)", base: Case::RawTx, ours: Case::External, goal: None },
    Spec { figure: "run_batch of 100 vs raw 100-row transaction (tokio-postgres)", baseline: "BEGIN; INSERT of 100 rows; COMMIT", base: Case::RawBatch, ours: Case::Batch, goal: None },
    Spec { figure: "one statement vs raw transaction", baseline: "BEGIN; INSERT; COMMIT, each awaited", base: Case::RawTx, ours: Case::OneStatement, goal: Some(0.45) },
    Spec { figure: "run_statement vs raw transaction (tokio-postgres)", baseline: "BEGIN; INSERT; COMMIT, each awaited", base: Case::RawTx, ours: Case::RunStatement, goal: Some(0.45) },
    Spec { figure: "replay from the cache vs raw PK SELECT (tokio-postgres)", baseline: "prepared SELECT of the record", base: Case::RawSelect, ours: Case::CachedReplay, goal: Some(0.1) },
    Spec { figure: "run vs raw transaction (sqlx)", baseline: "begin; INSERT; commit (sqlx)", base: Case::SqlxRawTx, ours: Case::SqlxRun, goal: Some(1.05) },
    Spec { figure: "replay vs raw PK SELECT (sqlx)", baseline: "SELECT of the record (sqlx)", base: Case::SqlxRawSelect, ours: Case::SqlxReplay, goal: Some(1.05) },
    Spec { figure: "run_external vs raw record transaction (sqlx)", baseline: "the record's begin; INSERT; commit alone (sqlx)", base: Case::SqlxRawTx, ours: Case::SqlxExternal, goal: None },
    Spec { figure: "run_batch of 100 vs raw 100-row transaction (sqlx)", baseline: "begin; INSERT of 100 rows; commit (sqlx)", base: Case::SqlxRawBatch, ours: Case::SqlxBatch, goal: None },
    Spec { figure: "run vs raw transaction through the pool (sqlx)", baseline: "begin; INSERT; commit on a connection taken from the pool per call (sqlx)", base: Case::SqlxPooledTx, ours: Case::SqlxRun, goal: None },
    Spec { figure: "replay vs raw PK SELECT through the pool (sqlx)", baseline: "SELECT of the record on a connection taken from the pool per call (sqlx)", base: Case::SqlxPooledSelect, ours: Case::SqlxReplay, goal: None },
    Spec { figure: "run_statement vs raw transaction (sqlx)", baseline: "begin; INSERT; commit (sqlx)", base: Case::SqlxRawTx, ours: Case::SqlxRunStatement, goal: Some(0.45) },
    Spec { figure: "HTTP /charges fresh vs plain route", baseline: "the same prepared insert in a plain transaction, same pool", base: Case::Http(Route::Charges, Side::Plain), ours: Case::Http(Route::Charges, Side::Fresh), goal: Some(1.1) },
    Spec { figure: "HTTP /charges replay vs plain route", baseline: "the same prepared insert in a plain transaction, same pool", base: Case::Http(Route::Charges, Side::Plain), ours: Case::Http(Route::Charges, Side::Replay), goal: None },
    Spec { figure: "HTTP /payouts (two-phase) vs seed-store twin", baseline: "the same call behind reserve+commit, call, complete+commit", base: Case::Http(Route::Payouts, Side::Seed), ours: Case::Http(Route::Payouts, Side::Fresh), goal: None },
];

/// A measured latency row.
pub(crate) struct LatencyRow {
    figure: String,
    callers: usize,
    baseline: &'static str,
    base: Measure,
    ours: Measure,
    goal: Option<f64>,
    /// The delay the proxy added to a round trip, measured (ms).
    achieved_ms: f64,
    /// Round trips per call the proxy counted (ours, baseline).
    trips: (f64, f64),
}

impl LatencyRow {
    /// Our p50 over the baseline's: lower is better.
    fn ratio(&self) -> f64 {
        if self.base.p50_ms > 0.0 { self.ours.p50_ms / self.base.p50_ms } else { 0.0 }
    }

    fn p99_ratio(&self) -> f64 {
        if self.base.p99_ms > 0.0 { self.ours.p99_ms / self.base.p99_ms } else { 0.0 }
    }

    fn met(&self) -> Option<bool> {
        self.goal.map(|g| self.ratio() <= g)
    }

    /// Whether both sides produced numbers.
    pub(crate) fn measured(&self) -> bool {
        self.base.p50_ms > 0.0 && self.ours.p50_ms > 0.0 && self.achieved_ms > 0.0
    }

    pub(crate) fn figure(&self) -> &str {
        &self.figure
    }

    fn detail(&self) -> String {
        format!("achieved delay {:.3} ms; p99 ratio {:.2}; round trips per call {:.2} / {:.2}", self.achieved_ms, self.p99_ratio(), self.trips.0, self.trips.1)
    }
}

/// What a caller holds across its calls: the raw baselines' connection, or its HTTP connection.
#[derive(Default)]
struct Caller {
    pg: Option<deadpool_postgres::Client>,
    sqlx: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    http: Option<http::Connection>,
    /// The HTTP replay's key (executed by the caller's first request).
    key: String,
}

/// The handles of one delay and caller count, every connection through the proxy.
struct Handles {
    pg: Idempotency,
    /// `pg` with a replay cache, holding `pg_replayed`.
    cached: Idempotency,
    sqlx: Idempotency<Sqlx>,
    pg_replayed: Key,
    sqlx_replayed: Key,
    service: SocketAddr,
    one: String,
}

static NEXT: AtomicU64 = AtomicU64::new(0);

fn next_key(prefix: &str) -> String {
    format!("{prefix}{}-{}", NEXT.fetch_add(1, Ordering::Relaxed), std::process::id())
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"bench")
}

fn created() -> StoredResponse {
    StoredResponse::json(201, json!({}))
}

/// The one-statement flow of bench/pgbench/fresh_one.sql (its one source) as a prepared
/// statement: the user and key become `$1` and `$2`.
fn one_statement() -> String {
    let script = include_str!("../pgbench/fresh_one.sql");
    let sql: Vec<&str> = script.lines().filter(|l| !l.starts_with("--") && !l.starts_with('\\')).collect();
    let sql = sql.join("\n").replace("'u' || :u", "$1").replace("'k' || :k", "$2");
    assert!(!sql.contains(":u") && !sql.contains(":k"), "fresh_one.sql names its user and key other than 'u' || :u and 'k' || :k");
    sql.trim_end().trim_end_matches(';').to_owned()
}

impl Caller {
    /// The state case `case`'s loop `worker` needs, and one warm-up call.
    async fn open(h: &Handles, case: Case, worker: usize) -> Caller {
        let mut c = Caller::default();
        match case {
            Case::RawTx | Case::RawSelect | Case::RawBatch | Case::OneStatement => c.pg = Some(h.pg.pool().get().await.expect("connection")),
            Case::SqlxRawTx | Case::SqlxRawSelect | Case::SqlxRawBatch => c.sqlx = Some(h.sqlx.pool().acquire().await.expect("connection")),
            Case::Http(..) => {
                c.http = Some(http::Connection::open(h.service).await);
                c.key = format!("lat-replayed-{}", next_key(""));
            }
            _ => {}
        }
        once(h, &mut c, case, worker).await;
        c
    }
}

/// One call of `case` by loop `worker`.
async fn once(h: &Handles, c: &mut Caller, case: Case, worker: usize) {
    let user = format!("lat-{worker}");
    match case {
        Case::Run => client::call(&h.pg, None, &user, false).await,
        Case::RawTx => client::call(&h.pg, c.pg.as_mut(), &user, false).await,
        Case::Replay => client::replay(&h.pg, None, &h.pg_replayed).await,
        Case::RawSelect => client::replay(&h.pg, c.pg.as_mut(), &h.pg_replayed).await,
        Case::External => external(&h.pg, user).await,
        Case::Batch => batch(&h.pg, user).await,
        Case::RawBatch => {
            let tx = c.pg.as_mut().expect("held connection").transaction().await.expect("begin");
            let insert = tx.prepare_cached(BATCH_INSERT).await.expect("prepare");
            let keys: Vec<String> = (0..BATCH).map(|_| next_key("raw")).collect();
            tx.execute(&insert, &[&user, &keys]).await.expect("insert");
            tx.commit().await.expect("commit");
        }
        Case::OneStatement => {
            let db = c.pg.as_mut().expect("held connection");
            let one = db.prepare_cached(&h.one).await.expect("prepare the one-statement flow");
            let row = db.query_one(&one, &[&user, &next_key("one")]).await.expect("the one-statement flow");
            assert_eq!(row.get::<_, String>("outcome"), "created", "a new key is created");
        }
        Case::RunStatement => client::run_statement(&h.pg, &user).await,
        Case::SqlxRunStatement => client::run_statement(&h.sqlx, &user).await,
        Case::CachedReplay => client::replay(&h.cached, None, &h.pg_replayed).await,
        Case::SqlxRun => client_sqlx::call(&h.sqlx, None, &user, false).await,
        Case::SqlxRawTx => client_sqlx::call(&h.sqlx, c.sqlx.as_mut(), &user, false).await,
        Case::SqlxReplay => client_sqlx::replay(&h.sqlx, None, &h.sqlx_replayed).await,
        Case::SqlxRawSelect => client_sqlx::replay(&h.sqlx, c.sqlx.as_mut(), &h.sqlx_replayed).await,
        Case::SqlxPooledTx => client_sqlx::call(&h.sqlx, Some(&mut h.sqlx.pool().acquire().await.expect("connection")), &user, false).await,
        Case::SqlxPooledSelect => client_sqlx::replay(&h.sqlx, Some(&mut h.sqlx.pool().acquire().await.expect("connection")), &h.sqlx_replayed).await,
        Case::SqlxExternal => sqlx_external(&h.sqlx, user).await,
        Case::SqlxBatch => sqlx_batch(&h.sqlx, user).await,
        Case::SqlxRawBatch => {
            let mut tx = c.sqlx.as_mut().expect("held connection").begin().await.expect("begin");
            let keys: Vec<String> = (0..BATCH).map(|_| next_key("raw")).collect();
            sqlx::query(BATCH_INSERT).bind(&user).bind(&keys).execute(&mut *tx).await.expect("insert");
            tx.commit().await.expect("commit");
        }
        Case::Http(route, side) => {
            let key = if side == Side::Replay { c.key.clone() } else { http::fresh_key(worker) };
            let conn = c.http.as_mut().expect("HTTP connection");
            conn.post(route, side, &user, &key).await;
        }
    }
}

/// `run_external` on a new key: an outside call that returns at once, then the record's insert.
async fn external(idem: &Idempotency, user: String) {
    let key = Key::new("bench.external", &user, next_key("e")).expect("valid key");
    let out = idem
        .run_external(&key, &fingerprint(), async { Ok::<_, tokio_postgres::Error>(created()) }, move |tx, _| {
            let user = user.clone();
            Box::pin(async move {
                let insert = tx.prepare_cached(INSERT).await?;
                tx.execute(&insert, &[&user]).await?;
                Ok(())
            })
        })
        .await
        .expect("run_external");
    assert!(out.is_executed(), "a new key executes");
}

/// The same over sqlx.
async fn sqlx_external(idem: &Idempotency<Sqlx>, user: String) {
    let key = Key::new("bench.external", &user, next_key("e")).expect("valid key");
    let out = idem
        .run_external(&key, &fingerprint(), async { Ok::<_, sqlx::Error>(created()) }, move |conn, _| {
            let user = user.clone();
            Box::pin(async move {
                sqlx::query(INSERT).bind(&user).execute(&mut *conn).await?;
                Ok(())
            })
        })
        .await
        .expect("run_external");
    assert!(out.is_executed(), "a new key executes");
}

fn batch_items() -> Vec<BatchItem> {
    (0..BATCH).map(|_| BatchItem { key: next_key("b"), fingerprint: fingerprint() }).collect()
}

/// `run_batch` of [`BATCH`] new keys, whose closure inserts a row per created key.
async fn batch(idem: &Idempotency, user: String) {
    let items = batch_items();
    let out = idem
        .run_batch("bench.batch", &user.clone(), &items, move |tx, keys| {
            let user = user.clone();
            Box::pin(async move {
                let insert = tx.prepare_cached(BATCH_INSERT).await?;
                tx.execute(&insert, &[&user, &keys]).await?;
                Ok::<_, tokio_postgres::Error>(keys.iter().map(|_| created()).collect())
            })
        })
        .await
        .expect("run_batch");
    assert_eq!(out.len(), BATCH, "every key has an outcome");
}

/// The same over sqlx.
async fn sqlx_batch(idem: &Idempotency<Sqlx>, user: String) {
    let items = batch_items();
    let out = idem
        .run_batch("bench.batch", &user.clone(), &items, move |conn, keys| {
            let user = user.clone();
            Box::pin(async move {
                sqlx::query(BATCH_INSERT).bind(&user).bind(keys).execute(&mut *conn).await?;
                Ok::<_, sqlx::Error>(keys.iter().map(|_| created()).collect())
            })
        })
        .await
        .expect("run_batch");
    assert_eq!(out.len(), BATCH, "every key has an outcome");
}

/// `callers` loops of `case` for `time` each (after one warm-up call each, off the clock): the
/// latencies, and the round trips per call `proxy` counted.
async fn side(h: &Arc<Handles>, proxy: &Proxy, case: Case, callers: usize, time: Duration) -> (Measure, f64) {
    let ready = Arc::new(tokio::sync::Barrier::new(callers + 1));
    let mut loops = Vec::new();
    for w in 0..callers {
        let (h, ready) = (h.clone(), ready.clone());
        loops.push(tokio::spawn(async move {
            let mut c = Caller::open(&h, case, w).await;
            ready.wait().await; // every caller opened: the clock starts
            let stop = Instant::now() + time;
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let t0 = Instant::now();
                once(&h, &mut c, case, w).await;
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    ready.wait().await;
    let (before, started) = (proxy.round_trips(), Instant::now());
    let mut latencies = Vec::new();
    for l in loops {
        latencies.extend(l.await.expect("latency loop"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let trips = (proxy.round_trips() - before) as f64 / latencies.len().max(1) as f64;
    (client::measure(latencies, elapsed, 0.0), trips)
}

/// The delay `proxy` adds to a round trip, measured: the p50 (and p99) of `n` `SELECT 1`
/// through it minus those of the same directly (`direct`), in ms, interleaved in halves so drift
/// cancels.
async fn achieved(direct: &str, proxy: &Proxy, db: &str, n: usize) -> (f64, f64) {
    async fn select_1(url: &str, n: usize) -> Vec<Duration> {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
        tokio::spawn(conn);
        let one = client.prepare("SELECT 1").await.expect("prepare");
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            client.query_one(&one, &[]).await.expect("SELECT 1");
            t.push(t0.elapsed());
        }
        t
    }
    let url = proxy.url(db);
    let (mut direct_t, mut proxied) = (select_1(direct, n / 2).await, select_1(&url, n / 2).await);
    proxied.extend(select_1(&url, n / 2).await);
    direct_t.extend(select_1(direct, n / 2).await);
    let pct = |t: &mut Vec<Duration>, p: f64| {
        t.sort_unstable();
        t[((t.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0
    };
    (pct(&mut proxied, 0.5) - pct(&mut direct_t, 0.5), pct(&mut proxied, 0.99) - pct(&mut direct_t, 0.99))
}

/// Every latency row, on database `db` (the benchmark's, set up) at `direct_url` on the cluster
/// at `upstream`: `time` per side and repetition, `reps` interleaved repetitions.
pub(crate) async fn rows(upstream: SocketAddr, db: &str, direct_url: &str, smoke: bool) -> Vec<LatencyRow> {
    let (time, reps, probes) = if smoke { (Duration::from_millis(300), 1, 40) } else { (Duration::from_millis(1500), 2, 400) };
    let mut out = Vec::new();
    for delay in DELAYS {
        let proxy = Proxy::delayed(upstream, delay).await;
        let url = format!("{}&options=-c%20synchronous_commit%3D{}", proxy.url(db), synchronous_commit());
        // The proxy's own cost comes off its hold, measured: two rounds of correction.
        let mut achieved_ms = 0.0;
        for round in 0..3 {
            let (p50, p99) = achieved(direct_url, &proxy, db, probes).await;
            eprintln!("latency rows at {delay:?}: held {:?}, the proxy adds {p50:.3} ms to a round trip (p50; p99 {p99:.3} ms)", proxy.hold());
            achieved_ms = p50;
            let target = delay.as_secs_f64() * 1000.0;
            if round < 2 && (p50 - target).abs() > 0.01 {
                let hold = (proxy.hold().as_secs_f64() * 1000.0 - (p50 - target)).clamp(target / 2.0, target);
                proxy.set_hold(Duration::from_secs_f64(hold / 1000.0));
            }
        }
        let service = http::Service::start(&url).await;
        for callers in CALLERS {
            let pg = Idempotency::from_url(&url, client::pool_size(callers), Settings::default()).expect("pool");
            let sqlx = client_sqlx::connect(&url, client::pool_size(callers));
            let (pg_replayed, sqlx_replayed) = (client::replayed_key(&pg).await, client_sqlx::replayed_key(&sqlx).await);
            let cached = Idempotency::from_url(&url, client::pool_size(callers), Settings::builder().replay_cache(ReplayCache::new(1_000, Duration::from_secs(600)))).expect("pool");
            client::replay(&cached, None, &pg_replayed).await; // fills the cache
            let h = Arc::new(Handles { pg, cached, sqlx, pg_replayed, sqlx_replayed, service: service.addr, one: one_statement() });
            for spec in SPECS {
                let (mut base, mut ours) = (Vec::new(), Vec::new());
                let (mut base_trips, mut our_trips) = (0.0, 0.0);
                for rep in 0..reps {
                    for first in [rep % 2 == 0, rep % 2 != 0] {
                        let (m, t) = side(&h, &proxy, if first { spec.base } else { spec.ours }, callers, time).await;
                        if first {
                            base.push(m);
                            base_trips += t / reps as f64;
                        } else {
                            ours.push(m);
                            our_trips += t / reps as f64;
                        }
                    }
                }
                out.push(LatencyRow {
                    figure: format!("latency {}: {}", ms(delay), spec.figure),
                    callers,
                    baseline: spec.baseline,
                    base: pooled(&base),
                    ours: pooled(&ours),
                    goal: if delay == DELAYS[0] { spec.goal } else { None },
                    achieved_ms,
                    trips: (our_trips, base_trips),
                });
            }
        }
        service.stop().await;
    }
    out
}

/// `synchronous_commit` of the rows' sessions: `off` unless `IDEM_BENCH_SYNCHRONOUS_COMMIT`
/// says otherwise. Both sides of every row commit as often (once per call, the batch rows once
/// per batch), and a flush on this machine's shared disk varied from 1 to 500 ms while other
/// work ran: with it on, the rows measure the disk's queue instead of the round trips.
fn synchronous_commit() -> String {
    std::env::var("IDEM_BENCH_SYNCHRONOUS_COMMIT").unwrap_or_else(|_| "off".into())
}

/// The repetitions of one side as one: mean rate and mean percentiles.
fn pooled(runs: &[Measure]) -> Measure {
    let n = runs.len().max(1) as f64;
    Measure {
        tps: runs.iter().map(|m| m.tps).sum::<f64>() / n,
        p50_ms: runs.iter().map(|m| m.p50_ms).sum::<f64>() / n,
        p99_ms: runs.iter().map(|m| m.p99_ms).sum::<f64>() / n,
        transactions: runs.iter().map(|m| m.transactions).sum(),
        ..Measure::default()
    }
}

fn ms(delay: Duration) -> String {
    format!("{} ms", delay.as_secs_f64() * 1000.0)
}

fn callers(n: usize) -> String {
    format!("{n} caller{}", if n == 1 { "" } else { "s" })
}

/// The rows as a Markdown table.
pub(crate) fn render(rows: &[LatencyRow]) -> String {
    let mut t = String::from("\n| latency figure | callers | p50 ms ours / base | p99 ms ours / base | p50 ratio | p99 ratio | goal (p50) | achieved delay ms | round trips ours / base |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let goal = match (r.goal, r.met()) {
            (Some(g), Some(met)) => format!("≤ {g:.2} {}", if met { "met" } else { "not met" }),
            _ => "—".into(),
        };
        let _ = writeln!(
            t,
            "| {} | {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.2} | {:.2} | {} | {:.3} | {:.2} / {:.2} |",
            r.figure, r.callers, r.ours.p50_ms, r.base.p50_ms, r.ours.p99_ms, r.base.p99_ms, r.ratio(), r.p99_ratio(), goal, r.achieved_ms, r.trips.0, r.trips.1
        );
    }
    t
}

/// The rows as lines of the results CSV (its columns; the ratio is the p50 ratio, a ceiling).
pub(crate) fn csv(rows: &[LatencyRow]) -> String {
    let mut c = String::new();
    for r in rows {
        let _ = writeln!(
            c,
            "\"{}\",{},\"{}\",{:.1},{:.1},{:.3},{},{:.3},{:.3},{:.3},{:.3},,,,\"{}\"",
            r.figure, callers(r.callers), r.baseline, r.base.tps, r.ours.tps, r.ratio(), r.goal.map(|g| g.to_string()).unwrap_or_default(),
            r.ours.p50_ms, r.ours.p99_ms, r.base.p50_ms, r.base.p99_ms, r.detail()
        );
    }
    c
}
