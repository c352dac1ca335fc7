//! The Rust client's `run` against a raw tokio-postgres transaction doing the same insert, and
//! the round trips each makes per call (counted as client→server write bursts by a proxy).

use idempotency_client::{Fingerprint, Idempotency, Key, StoredResponse};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const INSERT: &str = "INSERT INTO bench_charges (user_id, amount) VALUES ($1, 100)";

/// Calls per second of `tasks` concurrent loops of one call kind, for `seconds`.
pub async fn throughput(url: &str, tasks: usize, seconds: u64, with_idempotency: bool) -> f64 {
    let idem = Idempotency::connect(url, tasks).expect("pool");
    let fp = Fingerprint::of_bytes(b"bench");
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(seconds);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (idem, fp, done) = (idem.clone(), fp.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let user = format!("rust-{t}");
            // The raw loop holds its connection; `run` takes one from the pool per call.
            let mut client = if with_idempotency { None } else { Some(idem.pool().get().await.expect("connection")) };
            while Instant::now() < stop {
                if let Some(client) = client.as_mut() {
                    let tx = client.transaction().await.expect("begin");
                    let stmt = tx.prepare_cached(INSERT).await.expect("prepare");
                    tx.execute(&stmt, &[&user]).await.expect("insert");
                    tx.commit().await.expect("commit");
                } else {
                    let key = Key::new("bench.rust", user.as_str(), format!("k{}", NEXT.fetch_add(1, Ordering::Relaxed))).unwrap();
                    let user = user.clone();
                    idem.run(&key, &fp, move |tx| {
                        let user = user.clone();
                        Box::pin(async move {
                            let stmt = tx.prepare_cached(INSERT).await?;
                            tx.execute(&stmt, &[&user]).await?;
                            Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({})))
                        })
                    })
                    .await
                    .expect("run");
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    for h in handles {
        h.await.expect("task");
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Round trips per call, over `calls` sequential calls on one warmed-up connection, counted by a
/// proxy as client writes that follow an answer from the server: messages pipelined together
/// count once however the socket splits them (on a multi-threaded runtime the connection task
/// may flush the first of them alone).
pub async fn round_trips(upstream: SocketAddr, db: &str, calls: u64, with_idempotency: bool, empty: bool) -> f64 {
    let bursts = Arc::new(AtomicU64::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    {
        let bursts = bursts.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else { return };
                let bursts = bursts.clone();
                let answered = Arc::new(AtomicBool::new(true));
                let heard = answered.clone();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = sr.read(&mut buf).await {
                        heard.store(true, Ordering::SeqCst);
                        if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if answered.swap(false, Ordering::SeqCst) {
                            bursts.fetch_add(1, Ordering::SeqCst);
                        }
                        if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }
    let idem = Idempotency::connect(&format!("postgresql://postgres@{addr}/{db}"), 1).expect("pool");
    let fp = Fingerprint::of_bytes(b"bench");
    let mut client = idem.pool().get().await.expect("connection");
    let mut count_from = 0;
    for i in 0..=calls {
        if i == 1 {
            count_from = bursts.load(Ordering::SeqCst); // after connecting and preparing
        }
        if with_idempotency {
            let key = Key::new("bench.rt", if empty { "empty" } else { "insert" }, format!("k{i}-{}", std::process::id())).unwrap();
            drop(client);
            idem.run(&key, &fp, move |tx| {
                Box::pin(async move {
                    if !empty {
                        let stmt = tx.prepare_cached(INSERT).await?;
                        tx.execute(&stmt, &[&"rt"]).await?;
                    }
                    Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({})))
                })
            })
            .await
            .expect("run");
            client = idem.pool().get().await.expect("connection");
        } else {
            let tx = client.transaction().await.expect("begin");
            let stmt = tx.prepare_cached(INSERT).await.expect("prepare");
            tx.execute(&stmt, &[&"rt"]).await.expect("insert");
            tx.commit().await.expect("commit");
        }
    }
    (bursts.load(Ordering::SeqCst) - count_from) as f64 / calls as f64
}
