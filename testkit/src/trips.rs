//! Round trips per call of the client's flows, as the [`Proxy`] counts them (client writes that
//! follow a server answer), measured the way a service makes its calls: from a task spawned on a
//! multi-threaded runtime. The benchmark reports these figures and the test command asserts them.
//!
//! Where the calls come from matters. From a runtime worker (every task a service spawns: hyper
//! and axum spawn one per connection) a request wakes the connection's task into that worker's
//! next slot, so it runs once the caller yields and requests issued together leave in one write.
//! From the thread inside `Runtime::block_on` (no worker), the wake goes through the shared queue
//! and an idle worker can flush `BEGIN` alone before the reservation is queued: the count then
//! read 3.4 to 3.75 for `run`, with nothing waited for in between.

use crate::proxy::Proxy;
use idempotency_client::{Fingerprint, Idempotency, Key, Postgres, Settings, StoredResponse, Tx, TxFuture};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Round trips per call, each kind over `calls` calls on one warmed-up pooled connection, and
/// `run` again from concurrent loops sharing a pool.
#[derive(Debug, Clone, Copy)]
pub struct Trips {
    /// The raw transaction: `BEGIN`, the insert, `COMMIT`, each waited for.
    pub raw: f64,
    /// `run` around the one-statement insert.
    pub run: f64,
    /// `run` around the insert from concurrent loops, per call.
    pub concurrent: f64,
    /// `run` with a closure that sends nothing.
    pub empty: f64,
    /// A replay until its answer is in the caller's hands (its `ROLLBACK` is queued, not waited).
    pub replay_answer: f64,
    /// A replay with its `ROLLBACK` (which often leaves with the next call's first request).
    pub replay_all: f64,
    /// `run_external` until the outside call starts: the reservation.
    pub reserve: f64,
    /// `run_external` from the outside call's end: the record.
    pub record: f64,
}

/// Counts [`Trips`] through a new proxy to `upstream`, database `db`: `insert` is a statement
/// with one text parameter that writes one business row; `tasks` loops for the concurrent
/// figure. The calls run in a task spawned on the current multi-threaded runtime.
pub async fn count(upstream: SocketAddr, db: &str, insert: &'static str, calls: u64, tasks: u32) -> Trips {
    let db = db.to_owned();
    tokio::spawn(async move { measure(upstream, &db, insert, calls, tasks).await }).await.expect("the round-trip task")
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// `run` around `insert` on a new key (or around nothing, when `empty`), or the same insert in a
/// raw transaction on `raw`: the calls of the benchmark's Rust rows.
pub async fn call(idem: &Idempotency, raw: Option<&mut deadpool_postgres::Client>, insert: &'static str, user: &str, empty: bool) {
    if let Some(client) = raw {
        let tx = client.transaction().await.expect("begin");
        let stmt = tx.prepare_cached(insert).await.expect("prepare");
        tx.execute(&stmt, &[&user]).await.expect("insert");
        tx.commit().await.expect("commit");
        return;
    }
    let key = Key::new("trips.run", user, format!("k{}-{}", NEXT.fetch_add(1, Ordering::Relaxed), std::process::id())).expect("valid key");
    let user = user.to_owned();
    let out = idem
        .run(&key, &fingerprint(), move |tx| {
            let user = user.clone();
            Box::pin(async move {
                if !empty {
                    let stmt = tx.prepare_cached(insert).await?;
                    tx.execute(&stmt, &[&user]).await?;
                }
                Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({})))
            })
        })
        .await
        .expect("run");
    assert!(out.is_executed(), "a new key executes");
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"trips")
}

fn respond(_tx: &mut Tx) -> TxFuture<'_, StoredResponse, tokio_postgres::Error> {
    Box::pin(async { Ok(StoredResponse::json(201, json!({}))) })
}

/// The proxy's count over `calls` awaits of `f()`, after one to warm up, per call.
async fn per_call<F: std::future::Future<Output = ()>>(proxy: &Proxy, calls: u64, mut f: impl FnMut() -> F) -> f64 {
    f().await;
    let before = proxy.round_trips();
    for _ in 0..calls {
        f().await;
    }
    (proxy.round_trips() - before) as f64 / calls as f64
}

async fn measure(upstream: SocketAddr, db: &str, insert: &'static str, calls: u64, tasks: u32) -> Trips {
    let proxy = Proxy::start(upstream, None).await;
    let one = Idempotency::<Postgres>::from_url(&proxy.url(db), 1, Settings::default()).expect("pool");
    let raw = per_call(&proxy, calls, || async {
        let mut client = one.pool().get().await.expect("connection");
        call(&one, Some(&mut client), insert, "trips", false).await;
    })
    .await;
    let run = per_call(&proxy, calls, || call(&one, None, insert, "trips", false)).await;
    let empty = per_call(&proxy, calls, || call(&one, None, insert, "trips", true)).await;

    let replayed = Key::new("trips.replay", "trips", format!("k-{}", NEXT.fetch_add(1, Ordering::Relaxed))).expect("valid key");
    one.run(&replayed, &fingerprint(), respond).await.expect("first run of the replayed key");
    let (mut answered, before_all) = (0, proxy.round_trips());
    for _ in 0..calls {
        let before = proxy.round_trips();
        let out = one.run(&replayed, &fingerprint(), respond).await.expect("replay");
        // Read before this task yields: the queued ROLLBACK cannot have left yet.
        answered += proxy.round_trips() - before;
        assert!(out.is_replayed(), "the key executed once already");
    }
    tokio::time::sleep(Duration::from_millis(20)).await; // the last ROLLBACK
    let replay_answer = answered as f64 / calls as f64;
    let replay_all = (proxy.round_trips() - before_all) as f64 / calls as f64;

    let (mut reserving, mut all) = (0, 0);
    for i in 0..=calls {
        let before = proxy.round_trips();
        let key = Key::new("trips.external", "trips", format!("k{}-{}", NEXT.fetch_add(1, Ordering::Relaxed), std::process::id()))
            .expect("valid key");
        let reserved = AtomicU64::new(0);
        let outside = async {
            reserved.store(proxy.round_trips() - before, Ordering::Relaxed);
            Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({})))
        };
        let out = one
            .run_external(&key, &fingerprint(), outside, |tx, _| {
                Box::pin(async move {
                    let stmt = tx.prepare_cached(insert).await?;
                    tx.execute(&stmt, &[&"trips-external"]).await?;
                    Ok(())
                })
            })
            .await
            .expect("run_external");
        assert!(out.is_executed(), "a new key executes");
        if i > 0 {
            reserving += reserved.load(Ordering::Relaxed);
            all += proxy.round_trips() - before;
        }
    }
    let reserve = reserving as f64 / calls as f64;
    let record = all as f64 / calls as f64 - reserve;

    let many = Idempotency::<Postgres>::from_url(&proxy.url(db), tasks, Settings::default()).expect("pool");
    let loops = |n: u64| {
        (0..tasks)
            .map(|t| {
                let many = many.clone();
                tokio::spawn(async move {
                    for _ in 0..n {
                        call(&many, None, insert, &format!("trips-{t}"), false).await;
                    }
                })
            })
            .collect::<Vec<_>>()
    };
    for l in loops(2) {
        l.await.expect("warm-up loop");
    }
    let before = proxy.round_trips();
    for l in loops(calls) {
        l.await.expect("loop");
    }
    let concurrent = (proxy.round_trips() - before) as f64 / (calls * u64::from(tasks)) as f64;
    Trips { raw, run, concurrent, empty, replay_answer, replay_all, reserve, record }
}
