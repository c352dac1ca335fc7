//! A TCP proxy in front of the private cluster. It counts round trips (client writes that follow
//! an answer from the server: messages pipelined together count once, however the socket splits
//! them) and the serialization failures (SQLSTATE 40001)
//! the server reports, and can cut the first connection that sends `COMMIT`, to make a commit's
//! outcome unknown to the client.
//!
//! [`Proxy::stall`] makes it a server that stopped answering: from then until [`Proxy::resume`],
//! every chunk a client sends is held (read, so a client that closes its connection is still
//! seen, and the server's side closed with it; never forwarded), on every connection, new ones
//! included. A stall begun by a call's own closure stalls that call mid-transaction.
//!
//! [`Proxy::delayed`] also holds back every chunk, in each direction, for half a set round trip,
//! so that one round trip through it costs that much more than over loopback: a database in the
//! same zone (0.2 ms) or another one (1 ms), for the benchmark's latency rows. tokio's timer has
//! millisecond granularity, so a delayed connection is relayed by plain threads instead: per
//! direction one reads and stamps each chunk with its due instant, one releases it then (a
//! thread sleep to 30 µs before the instant, then a spin), both at a real-time priority so that
//! the load they delay cannot delay them. Relaying costs some time of its own, so a caller that
//! measures the delay achieved (the benchmark: a `SELECT 1` through the proxy against the same
//! directly, p50) can shorten the hold by that much ([`Proxy::set_hold`]).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The client sends `COMMIT` as the last statement of a simple query (alone, or behind the
/// completion: `...; COMMIT`), so a query text ending in it: "COMMIT\0".
const COMMIT: &[u8] = b"COMMIT\0";
/// The SQLSTATE field of an ErrorResponse reporting a serialization failure.
const SERIALIZATION_FAILURE: &[u8] = b"C40001\0";
/// How long before a chunk's due instant its release thread stops sleeping and spins: more than
/// a woken thread's usual lateness, little enough not to burn a core.
const SPIN: Duration = Duration::from_micros(30);

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
    /// The added cost of one round trip asked for; zero relays at once.
    delay: Duration,
    /// How long each chunk is held, in ns (half the delay, less what [`Proxy::set_hold`] takes
    /// off for the proxy's own cost).
    hold: Arc<AtomicU64>,
    /// Whether client chunks are held ([`Proxy::stall`]).
    stalled: Arc<tokio::sync::watch::Sender<bool>>,
    /// Client chunks held by a stall so far.
    held: Arc<AtomicU64>,
}

impl Proxy {
    /// Starts a proxy to `upstream` that cuts a connection at COMMIT once if `cut` is given.
    pub async fn start(upstream: SocketAddr, cut: Option<Cut>) -> Proxy {
        Proxy::listen(upstream, cut, Duration::ZERO).await
    }

    /// Starts a proxy to `upstream` that adds `round_trip` to every round trip (half of it to
    /// each direction's every chunk), counting as [`Proxy::start`]'s does; it cuts nothing.
    pub async fn delayed(upstream: SocketAddr, round_trip: Duration) -> Proxy {
        Proxy::listen(upstream, None, round_trip).await
    }

    async fn listen(upstream: SocketAddr, cut: Option<Cut>, delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let hold = Arc::new(AtomicU64::new(u64::try_from(delay.as_nanos() / 2).unwrap_or(u64::MAX)));
        let proxy = Proxy {
            addr,
            round_trips: Arc::default(),
            cuts: Arc::default(),
            serialization_failures: Arc::default(),
            delay,
            hold,
            stalled: Arc::new(tokio::sync::watch::Sender::new(false)),
            held: Arc::default(),
        };
        let armed = Arc::new(AtomicBool::new(cut.is_some()));
        let shared = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (proxy, armed) = (shared.clone(), armed.clone());
                if delay.is_zero() {
                    tokio::spawn(async move { proxy.relay(client, upstream, cut, &armed).await });
                } else if let Ok(client) = client.into_std() {
                    let _ = std::thread::Builder::new().name("proxy-connect".into()).spawn(move || proxy.relay_delayed(client, upstream));
                }
            }
        });
        proxy
    }

    /// The URL of database `db` through the proxy.
    pub fn url(&self, db: &str) -> String {
        format!("postgresql://postgres@{}/{db}?connect_timeout=5", self.addr)
    }

    /// The time this proxy was asked to add to a round trip (zero for [`Proxy::start`]'s).
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// How long a round trip is held in the proxy (both directions together): the delay at
    /// first. Relaying costs time of its own (a thread woken per chunk and direction), so a
    /// caller that measures the delay achieved can shorten the hold by that much
    /// ([`Proxy::set_hold`]).
    pub fn hold(&self) -> Duration {
        Duration::from_nanos(self.hold.load(Ordering::Relaxed) * 2)
    }

    /// Sets [`Proxy::hold`] for every chunk read from now on, on every connection.
    pub fn set_hold(&self, round_trip: Duration) {
        self.hold.store(u64::try_from(round_trip.as_nanos() / 2).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// From now on, every chunk a client sends is held, on every connection, until
    /// [`Proxy::resume`]: the server sees nothing more and so answers nothing (a server that
    /// stopped answering, its TCP connections still up). A client that closes its connection
    /// meanwhile closes the proxy's connection to the server too. Not for [`Proxy::delayed`]'s
    /// proxies.
    pub fn stall(&self) {
        assert!(self.delay.is_zero(), "a delayed proxy does not stall");
        self.stalled.send_replace(true);
    }

    /// Ends [`Proxy::stall`]: the held chunks are forwarded, in order, and what follows too.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// Client chunks held by stalls so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
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
        let tally = Tally::new(self);
        let heard = tally.clone();
        // Set at an AfterCommit cut: the server's answers are still read (so closing the socket
        // later discards nothing unread, which would reset the connection under the commit) but
        // never relayed.
        let muted = Arc::new(AtomicBool::new(false));
        let mute = muted.clone();
        let back = tokio::spawn(async move {
            let mut heard = heard;
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = sr.read(&mut buf).await {
                heard.answer(&buf[..n]);
                if mute.load(Ordering::SeqCst) {
                    continue;
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let mut buf = vec![0u8; 64 * 1024];
        let mut stall = self.stalled.subscribe();
        // What a stall held, forwarded when it ends.
        let mut held: Vec<u8> = Vec::new();
        loop {
            let read = tokio::select! {
                read = cr.read(&mut buf) => read,
                changed = stall.changed(), if !held.is_empty() => {
                    if changed.is_err() || (!*stall.borrow_and_update() && sw.write_all(&std::mem::take(&mut held)).await.is_err()) {
                        break;
                    }
                    continue;
                }
            };
            let n = match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            if *stall.borrow_and_update() {
                self.held.fetch_add(1, Ordering::SeqCst);
                held.extend_from_slice(chunk);
                continue;
            }
            if !held.is_empty() && sw.write_all(&std::mem::take(&mut held)).await.is_err() {
                break;
            }
            tally.request();
            if let Some(cut) = cut {
                if chunk.windows(COMMIT.len()).any(|w| w == COMMIT) && armed.swap(false, Ordering::SeqCst) {
                    self.cuts.fetch_add(1, Ordering::SeqCst);
                    if cut == Cut::AfterCommit {
                        // Mute the relay before COMMIT leaves (it runs on another worker: an
                        // abort after the write could lose the race to a fast server's answer,
                        // and the client would see its commit), then let the server commit.
                        muted.store(true, Ordering::SeqCst);
                        let _ = sw.write_all(chunk).await;
                        let _ = sw.flush().await;
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

    /// [`Proxy::relay`] with every chunk held for half the delay, on blocking sockets: a reading
    /// and a releasing thread per direction. The connection closes when either side closes.
    fn relay_delayed(self, client: std::net::TcpStream, upstream: SocketAddr) {
        let Ok(server) = std::net::TcpStream::connect(upstream) else { return };
        for socket in [&client, &server] {
            let _ = socket.set_nonblocking(false);
            let _ = socket.set_nodelay(true);
        }
        let requests = Tally::new(&self);
        let mut answers = requests.clone();
        let threads = [
            relay_direction("proxy-up", &client, &server, self.hold.clone(), move |_| requests.request(), |_| {}),
            relay_direction("proxy-down", &server, &client, self.hold.clone(), |_| {}, move |chunk| answers.answer(chunk)),
        ];
        for thread in threads.into_iter().flatten().flatten() {
            let _ = thread.join();
        }
    }
}

/// One direction of a delayed connection: a thread reads `from` and stamps each chunk with its
/// due instant (`hold` ns later), another writes it to `to` then. `on_read` sees each chunk as it is
/// read, `on_release` just before it is written. When either end fails or closes, both sockets
/// are shut, so the other direction ends too.
fn relay_direction(
    name: &str,
    from: &std::net::TcpStream,
    to: &std::net::TcpStream,
    hold: Arc<AtomicU64>,
    mut on_read: impl FnMut(&[u8]) + Send + 'static,
    mut on_release: impl FnMut(&[u8]) + Send + 'static,
) -> Option<[std::thread::JoinHandle<()>; 2]> {
    let (mut from, mut to, closing) = (from.try_clone().ok()?, to.try_clone().ok()?, [from.try_clone().ok()?, to.try_clone().ok()?]);
    let (send, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            prioritize();
            let mut buf = vec![0u8; 64 * 1024];
            // Ends on EOF or an error; the releaser drains what was read, then ends.
            while let Ok(n @ 1..) = from.read(&mut buf) {
                on_read(&buf[..n]);
                let due = Instant::now() + Duration::from_nanos(hold.load(Ordering::Relaxed));
                if send.send((due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        })
        .ok()?;
    let releaser = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            prioritize();
            while let Ok((at, chunk)) = due.recv() {
                wait_until(at);
                on_release(&chunk);
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            for socket in closing {
                let _ = socket.shutdown(std::net::Shutdown::Both);
            }
        })
        .ok()?;
    Some([reader, releaser])
}

/// Makes the calling thread a network, not a process competing for the CPU: a real-time
/// priority (SCHED_FIFO; its wake-ups preempt the client and the server, so a loaded machine
/// does not stretch the delay), or where that is refused (not root) a timer slack of 1 µs for
/// its sleeps (the default is 50 µs). Best effort either way.
fn prioritize() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) with a valid parameter; it only
    // reads `param`.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        let _ = std::fs::write("/proc/thread-self/timerslack_ns", "1000");
    }
}

/// Blocks the thread until `at`: a sleep to [`SPIN`] before it, then a yielding spin.
fn wait_until(at: Instant) {
    let now = Instant::now();
    if at > now + SPIN {
        std::thread::sleep(at - now - SPIN);
    }
    while Instant::now() < at {
        std::thread::yield_now();
    }
}

/// What one connection counts: a round trip for each client write that follows a server answer,
/// the serialization failures in the answers (the tail of each chunk is kept, so a field split
/// across two chunks still counts once).
#[derive(Clone)]
struct Tally {
    round_trips: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    /// Set by every server answer, taken by the next client write: one round trip.
    answered: Arc<AtomicBool>,
    tail: Vec<u8>,
}

impl Tally {
    fn new(proxy: &Proxy) -> Tally {
        Tally { round_trips: proxy.round_trips.clone(), failures: proxy.serialization_failures.clone(), answered: Arc::new(AtomicBool::new(true)), tail: Vec::new() }
    }

    /// A chunk from the client.
    fn request(&self) {
        if self.answered.swap(false, Ordering::SeqCst) {
            self.round_trips.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A chunk from the server, as it goes to the client.
    fn answer(&mut self, chunk: &[u8]) {
        self.answered.store(true, Ordering::SeqCst);
        self.tail.extend_from_slice(chunk);
        let found = self.tail.windows(SERIALIZATION_FAILURE.len()).filter(|w| *w == SERIALIZATION_FAILURE).count();
        self.failures.fetch_add(found as u64, Ordering::SeqCst);
        let keep = self.tail.len().saturating_sub(SERIALIZATION_FAILURE.len() - 1);
        if found > 0 {
            self.tail.clear();
        } else {
            self.tail.drain(..keep);
        }
    }
}
