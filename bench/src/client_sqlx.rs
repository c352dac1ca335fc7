//! The Rust client's `run` over the sqlx driver against a raw sqlx transaction doing the same
//! insert (the rows beside `client.rs`'s tokio-postgres ones): throughput and client-side
//! latencies of concurrent loops, and the round trips each makes per call (counted by the test
//! kit's proxy).

use crate::pgbench::Measure;
use idempotency_client::{Fingerprint, Idempotency, Key, Settings, Sqlx, StoredResponse};
use idempotency_testkit::proxy::Proxy;
use serde_json::json;
use sqlx::pool::PoolConnection;
use sqlx::Connection;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::client::{pool_size, Call};

use crate::client::INSERT;
const SELECT: &str = "SELECT response FROM idem_records WHERE id = _idem_id($1, $2, $3) AND operation = $1 AND user_id = $2 AND key = $3";

pub(crate) fn connect(url: &str, size: u32) -> Idempotency<Sqlx> {
    connect_with(url, size, Settings::default())
}

fn connect_with(url: &str, size: u32, settings: impl Into<Settings>) -> Idempotency<Sqlx> {
    Idempotency::from_url(url, size, settings).expect("pool")
}

/// One call: `run` around the INSERT (or nothing, when `empty`), or the raw sqlx transaction
/// (`begin`, the INSERT, `commit`, as sqlx users write it).
pub(crate) async fn call(idem: &Idempotency<Sqlx>, raw: Option<&mut PoolConnection<sqlx::Postgres>>, user: &str, empty: bool) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if let Some(conn) = raw {
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query(INSERT).bind(user).execute(&mut *tx).await.expect("insert");
        tx.commit().await.expect("commit");
        return;
    }
    let key = Key::new("bench.sqlx", user, format!("k{}-{}", NEXT.fetch_add(1, Ordering::Relaxed), std::process::id()))
        .expect("valid key");
    let fp = Fingerprint::of_bytes(b"bench");
    let user = user.to_owned();
    idem.run(&key, &fp, move |conn| {
        let user = user.clone();
        Box::pin(async move {
            if !empty {
                sqlx::query(INSERT).bind(&user).execute(&mut *conn).await?;
            }
            Ok::<_, sqlx::Error>(StoredResponse::json(201, json!({})))
        })
    })
    .await
    .expect("run");
}

/// One replay (`run` on an executed key) or the raw SELECT of the same record.
pub(crate) async fn replay(idem: &Idempotency<Sqlx>, raw: Option<&mut PoolConnection<sqlx::Postgres>>, key: &Key) {
    if let Some(conn) = raw {
        sqlx::query(SELECT).bind(key.operation()).bind(key.user_id()).bind(key.key()).fetch_optional(&mut **conn).await.expect("select");
        return;
    }
    let fp = Fingerprint::of_bytes(b"bench");
    let out = idem
        .run(key, &fp, |_conn| Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::json(201, json!({}))) }))
        .await
        .expect("run");
    assert!(out.is_replayed(), "the benchmark key must replay");
}

/// The key the replay rows read.
fn replay_key() -> Key {
    Key::new("bench.replay", "sqlx", "k").expect("valid key")
}

/// The replay rows' key, executed once (if it was not already) after one `run` that warms the
/// connection's statements.
pub(crate) async fn replayed_key(idem: &Idempotency<Sqlx>) -> Key {
    let key = replay_key();
    call(idem, None, "sqlx", false).await;
    let fp = Fingerprint::of_bytes(b"bench");
    idem.run(&key, &fp, |_conn| Box::pin(async { Ok::<_, sqlx::Error>(StoredResponse::json(201, json!({}))) }))
        .await
        .expect("first run of the replayed key");
    key
}

/// `tasks` concurrent loops of one call kind for `run` over sqlx: calls per second and
/// client-side p50/p99 latency.
pub(crate) async fn throughput(url: &str, tasks: usize, run: Duration, kind: Call) -> Measure {
    let idem = connect_with(url, pool_size(tasks), kind.settings());
    throughput_on(idem, tasks, run, kind).await
}

/// [`throughput`] of replays over a pool of the caller's own (`Idempotency::from_pool`) made by
/// sqlx's `PgPoolOptions` with `test_before_acquire` as given (sqlx's default: on, a ping per
/// acquire; `from_url`'s pool: off). The rest as `from_url` makes it: the same size, statements.
pub(crate) async fn replay_over_pool(url: &str, tasks: usize, run: Duration, test_before_acquire: bool) -> Measure {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(pool_size(tasks))
        .test_before_acquire(test_before_acquire)
        .connect_lazy(url)
        .expect("pool");
    throughput_on(Idempotency::from_pool(pool, Settings::default()), tasks, run, Call::Replay).await
}

/// [`throughput`] over the handle `idem`.
async fn throughput_on(idem: Idempotency<Sqlx>, tasks: usize, run: Duration, kind: Call) -> Measure {
    let replayed = if kind.reads_the_replayed_key() { replayed_key(&idem).await } else { replay_key() };
    let stop = Instant::now() + run;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (idem, replayed) = (idem.clone(), replayed.clone());
        handles.push(tokio::spawn(async move {
            let user = format!("sqlx-{t}");
            // The raw loops hold their connection; `run` takes one from the pool per call.
            let raw_kind = matches!(kind, Call::RawInsert | Call::RawSelect);
            let mut raw = if raw_kind { Some(idem.pool().acquire().await.expect("connection")) } else { None };
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let t0 = Instant::now();
                match kind {
                    Call::Run | Call::RawInsert | Call::FirstRun => call(&idem, raw.as_mut(), &user, false).await,
                    Call::RunStatement => crate::client::run_statement(&idem, &user).await,
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
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        latencies.get(((latencies.len().max(1) - 1) as f64 * p).round() as usize).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    Measure { tps: latencies.len() as f64 / elapsed, p50_ms: pct(0.50), p99_ms: pct(0.99), transactions: latencies.len() as u64, ..Measure::default() }
}

/// Round trips per call over sqlx, counted by the test kit's proxy, over `calls` sequential
/// calls on one warmed-up connection. sqlx checks every connection given back to its pool
/// (a Sync message, one round trip, off the caller's path): `run` gives its connection back
/// once per call, so the count includes it; the raw loop holds its connection and does not.
pub(crate) async fn round_trips(upstream: SocketAddr, db: &str, calls: u64, with_idempotency: bool, empty: bool) -> f64 {
    let proxy = Proxy::start(upstream, None).await;
    let idem = connect(&proxy.url(db), 1);
    let mut held = if with_idempotency { None } else { Some(idem.pool().acquire().await.expect("connection")) };
    let mut count_from = 0;
    for i in 0..=calls {
        if i == 1 {
            // After connecting and preparing; let the pool's check of a returned connection land.
            tokio::time::sleep(Duration::from_millis(20)).await;
            count_from = proxy.round_trips();
        }
        call(&idem, held.as_mut(), if empty { "rt-empty" } else { "rt" }, empty).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    (proxy.round_trips() - count_from) as f64 / calls as f64
}
