//! A TCP proxy in front of the private cluster. It counts round trips (client writes that follow
//! an answer from the server: messages pipelined together count once, however the socket splits
//! them) and the serialization failures (SQLSTATE 40001)
//! the server reports, and can cut the first connection that sends `COMMIT`, to make a commit's
//! outcome unknown to the client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The client sends `COMMIT` as the last statement of a simple query (alone, or behind the
/// completion: `...; COMMIT`), so a query text ending in it: "COMMIT\0".
const COMMIT: &[u8] = b"COMMIT\0";
/// The SQLSTATE field of an ErrorResponse reporting a serialization failure.
const SERIALIZATION_FAILURE: &[u8] = b"C40001\0";

/// Where the proxy cuts the first connection that sends `COMMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Forward COMMIT to the server, then cut the connection before its reply reaches the client.
    AfterCommit,
    /// Cut the connection instead of forwarding COMMIT.
    BeforeCommit,
}

/// A running proxy; it stops with the runtime.
#[derive(Debug, Clone)]
pub struct Proxy {
    addr: SocketAddr,
    round_trips: Arc<AtomicU64>,
    cuts: Arc<AtomicU64>,
    serialization_failures: Arc<AtomicU64>,
}

impl Proxy {
    /// Starts a proxy to `upstream` that cuts a connection at COMMIT once if `cut` is given.
    pub async fn start(upstream: SocketAddr, cut: Option<Cut>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let proxy = Proxy { addr, round_trips: Arc::default(), cuts: Arc::default(), serialization_failures: Arc::default() };
        let armed = Arc::new(AtomicBool::new(cut.is_some()));
        let shared = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (proxy, armed) = (shared.clone(), armed.clone());
                tokio::spawn(async move { proxy.relay(client, upstream, cut, &armed).await });
            }
        });
        proxy
    }

    /// The URL of database `db` through the proxy.
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@{}/{db}?connect_timeout=5", self.addr)
    }

    /// Round trips so far, over all connections: client writes that followed a server answer.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }

    /// Connections cut at COMMIT so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// Serialization failures (40001) the server sent to clients so far.
    pub fn serialization_failures(&self) -> u64 {
        self.serialization_failures.load(Ordering::SeqCst)
    }

    async fn relay(&self, client: TcpStream, upstream: SocketAddr, cut: Option<Cut>, armed: &AtomicBool) {
        let Ok(server) = TcpStream::connect(upstream).await else { return };
        // Without these, Nagle's algorithm holds a small write behind an unacknowledged one until
        // the peer's delayed ACK (40 ms on Linux loopback).
        for socket in [&client, &server] {
            let _ = socket.set_nodelay(true);
        }
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        let failures = self.serialization_failures.clone();
        // Set by every server answer, taken by the next client write: one round trip.
        let answered = Arc::new(AtomicBool::new(true));
        let heard = answered.clone();
        let back = tokio::spawn(async move {
            // Server to client, counting 40001 error fields; the tail of each read is kept so a
            // field split across two reads still counts once.
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            while let Ok(n) = sr.read(&mut buf).await {
                heard.store(true, Ordering::SeqCst);
                if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                tail.extend_from_slice(&buf[..n]);
                let found = tail.windows(SERIALIZATION_FAILURE.len()).filter(|w| *w == SERIALIZATION_FAILURE).count();
                failures.fetch_add(found as u64, Ordering::SeqCst);
                let keep = tail.len().saturating_sub(SERIALIZATION_FAILURE.len() - 1);
                if found > 0 {
                    tail.clear();
                } else {
                    tail.drain(..keep);
                }
            }
        });
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if answered.swap(false, Ordering::SeqCst) {
                self.round_trips.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(cut) = cut {
                if chunk.windows(COMMIT.len()).any(|w| w == COMMIT) && armed.swap(false, Ordering::SeqCst) {
                    self.cuts.fetch_add(1, Ordering::SeqCst);
                    if cut == Cut::AfterCommit {
                        let _ = sw.write_all(chunk).await;
                        let _ = sw.flush().await;
                        // Let the server commit, but never relay its answer.
                        back.abort();
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    break; // dropping both halves closes both connections
                }
            }
            if sw.write_all(chunk).await.is_err() {
                break;
            }
        }
        back.abort();
    }
}
