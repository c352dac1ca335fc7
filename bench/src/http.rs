//! The HTTP rows: the example services over keep-alive HTTP/1.1, each route behind its layer
//! against the same route without it, what a user would measure before adopting the layer.
//!
//! The service is a child process of this binary (`bench --serve-http DATABASE_URL BIND
//! PROVIDER_BIND`) serving, on one listener and one tokio runtime, the routers the examples build
//! themselves (`idempotency_examples::charges` and `payouts`, examples/rust/src):
//! `POST /charges` behind the in-transaction layer, `POST /charges/one`, the same charge as one
//! statement (`run_statement`), and `/plain/charges`, the same insert in a plain transaction on
//! the same pool; `POST /payouts` behind the two-phase layer and
//! `/plain/payouts`, the same handler without it, and `/seed/payouts`, the same handler behind the
//! seed libraries' store flow (`seed_twin.rs`, the fair twin). The load generator is hyper's HTTP/1.1 client,
//! one keep-alive connection per concurrent worker, each sending its next request when the
//! previous answer has been read.

use crate::pgbench::Measure;
use crate::{client, seed_twin};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use crate::client::pool_size;
use idempotency_client::{Idempotency, Postgres, Settings};
use idempotency_examples::{charges, payouts};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// What one side of a comparison sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Side {
    /// The route without the layer (the baseline).
    Plain,
    /// The route behind the layer, a new key on every request.
    Fresh,
    /// The route behind the layer, a key that already executed: the stored response replays.
    Replay,
    /// The two-phase route's fair twin: the same call behind the seed libraries' store flow
    /// (`seed_twin.rs`), a new key on every request.
    Seed,
}

/// One of the example routes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Route {
    /// `POST /charges`, the in-transaction layer (`idempotency_examples::charges`).
    Charges,
    /// `POST /charges/one`, the same charge through `run_statement` (one statement, no layer),
    /// against the same plain route.
    ChargesOne,
    /// `POST /payouts`, the two-phase layer (`idempotency_examples::payouts`).
    Payouts,
}

impl Route {
    fn path(self, side: Side) -> &'static str {
        match (self, side) {
            (Route::Charges | Route::ChargesOne, Side::Plain) => "/plain/charges",
            (Route::Charges, _) => "/charges",
            (Route::ChargesOne, _) => "/charges/one",
            (Route::Payouts, Side::Plain) => "/plain/payouts",
            (_, Side::Seed) => "/seed/payouts",
            (Route::Payouts, _) => "/payouts",
        }
    }

    fn body(self) -> &'static str {
        match self {
            Route::Charges | Route::ChargesOne => r#"{"amount": 100}"#,
            Route::Payouts => r#"{"amount": 5}"#,
        }
    }
}

/// The service process of the HTTP rows (this binary run with `--serve-http`): prints
/// `listening on ADDR` once it accepts connections, then serves until killed.
pub(crate) async fn serve(database_url: &str, bind: &str, provider_bind: &str) {
    // One handle for both examples' routes, of the examples' pool size; each plain twin uses the
    // pool of the layer it is compared with.
    assert_eq!(charges::POOL_SIZE, payouts::POOL_SIZE, "the examples' pool sizes differ");
    let idem = Idempotency::<Postgres>::from_url(database_url, pool_size(charges::POOL_SIZE), Settings::default()).expect("pool");
    idem.check_extension().await.expect("the extension in the service's database");
    let db = idem.pool().get().await.expect("connection");
    db.batch_execute(charges::SCHEMA).await.expect("the example's table");
    db.batch_execute(seed_twin::SCHEMA).await.expect("the seed store's table");
    drop(db);
    let provider = payouts::provider(provider_bind).await.expect("the provider stub");
    let app = axum::Router::new()
        .merge(charges::router(idem.clone()))
        .merge(payouts::router(idem.clone(), provider.clone()))
        .nest("/plain", charges::plain_router(idem.pool().clone()).merge(payouts::plain_router(provider.clone())))
        .nest("/seed", seed_twin::router(idem.pool().clone(), provider));
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap_or_else(|e| panic!("bind {bind}: {e}"));
    println!("listening on {}", listener.local_addr().expect("local address"));
    axum::serve(listener, app).await.expect("serve");
}

/// The running service process; killed when dropped.
pub(crate) struct Service {
    child: Child,
    pid: u32,
    pub(crate) addr: SocketAddr,
    /// A second address the process serves the baseline on, when it prints one (the gRPC
    /// service of stacks.rs: a tonic server serves one service per method path).
    pub(crate) plain: Option<SocketAddr>,
}

impl Service {
    /// Starts this binary with `--serve-http` on `database_url`. `IDEM_BENCH_HTTP_PORT` picks the
    /// service's port (the provider stub takes the next one); otherwise both are ephemeral.
    pub(crate) async fn start(database_url: &str) -> Service {
        Service::spawn(database_url.to_owned(), 0).await
    }

    /// The same service whose sessions count their statements in pg_stat_statements (on the two
    /// ports after [`Service::start`]'s), for [`statements_per_request`] only: tracking is off
    /// while the load runs.
    pub(crate) async fn counting(database_url: &str) -> Service {
        let sep = if database_url.contains('?') { '&' } else { '?' };
        Service::spawn(format!("{database_url}{sep}options=-c%20pg_stat_statements.track%3Dtop"), 2).await
    }

    async fn spawn(database_url: String, port_offset: u16) -> Service {
        let database_url = database_url.as_str();
        let (bind, provider_bind) = match std::env::var("IDEM_BENCH_HTTP_PORT") {
            Ok(p) => {
                let port: u16 = p.parse().unwrap_or_else(|_| panic!("IDEM_BENCH_HTTP_PORT={p} is not a port number"));
                let port = port + port_offset;
                (format!("127.0.0.1:{port}"), format!("127.0.0.1:{}", port + 1))
            }
            Err(_) => ("127.0.0.1:0".to_owned(), "127.0.0.1:0".to_owned()),
        };
        Service::process(&["--serve-http", database_url, &bind, &provider_bind]).await
    }

    /// Starts this binary with `args` and waits for its line `listening on ADDR [PLAIN_ADDR]`.
    pub(crate) async fn process(args: &[&str]) -> Service {
        let exe = std::env::current_exe().expect("the bench binary's path");
        let mut child = Command::new(exe)
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the HTTP service process");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the service did not print its address within 60 s")
            .expect("read the service's stdout");
        let addrs: Option<Vec<SocketAddr>> =
            line.as_deref().and_then(|l| l.strip_prefix("listening on ")).and_then(|a| a.split(' ').map(str::parse).collect::<Result<_, _>>().ok());
        let Some(&[addr, ref plain @ ..]) = addrs.as_deref() else {
            panic!("the service printed {line:?}, not `listening on ADDR [PLAIN_ADDR]`");
        };
        let plain = plain.first().copied();
        let pid = child.id().expect("the service's pid");
        let label = match args {
            ["--serve-stack", stack, ..] => stack,
            _ => "HTTP",
        };
        eprintln!("{label} service pid {pid} on {addr}");
        Service { child, pid, addr, plain }
    }

    /// Stops the service process.
    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A key no earlier request of this process used.
pub(crate) fn fresh_key(worker: usize) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("f{}-{worker}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// One keep-alive connection of the load generator.
pub(crate) struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Connection {
    pub(crate) async fn open(addr: SocketAddr) -> Connection {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the HTTP service");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.expect("HTTP/1.1 handshake");
        tokio::spawn(conn);
        Connection { sender, host: addr.to_string() }
    }

    /// Sends one request and reads its whole answer: the status and whether it was a replay.
    pub(crate) async fn post(&mut self, route: Route, side: Side, user: &str, key: &str) -> (StatusCode, bool) {
        self.sender.ready().await.expect("the connection stays open (keep-alive)");
        let req = Request::post(route.path(side))
            .header("host", &self.host)
            .header("content-type", "application/json")
            .header("x-user", user)
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from_static(route.body().as_bytes())))
            .expect("request");
        let resp = self.sender.send_request(req).await.expect("HTTP request");
        let status = resp.status();
        let replayed = resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let body = resp.into_body().collect().await.expect("response body").to_bytes();
        assert_eq!(status, StatusCode::CREATED, "{route:?} {side:?}: {}", String::from_utf8_lossy(&body));
        (status, replayed)
    }
}

/// `perf record` of the service process while one side runs, when `IDEM_BENCH_PERF_DIR` names a
/// directory (`bench/profile-http.sh` sets it): `DIR/NAME.data`, and `DIR/NAME.requests` the
/// number of requests the profile covers.
struct Profile {
    perf: std::process::Child,
    requests: std::path::PathBuf,
}

impl Profile {
    fn start(pid: u32, name: &str) -> Option<Profile> {
        let dir = std::path::PathBuf::from(std::env::var_os("IDEM_BENCH_PERF_DIR")?);
        std::fs::create_dir_all(&dir).expect("the profile directory");
        let freq = std::env::var("PROFILE_FREQ").unwrap_or_else(|_| "499".into());
        let stack = std::env::var("PROFILE_STACK").unwrap_or_else(|_| "16384".into());
        let perf = std::process::Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", &freq, "--call-graph", &format!("dwarf,{stack}"), "-p", &pid.to_string(), "-o"])
            .arg(dir.join(format!("{name}.data")))
            .stdout(Stdio::null())
            .spawn()
            .expect("perf record (is perf installed?)");
        std::thread::sleep(Duration::from_millis(500)); // perf attaches before the clock starts
        Some(Profile { perf, requests: dir.join(format!("{name}.requests")) })
    }

    fn stop(mut self, requests: usize) {
        // SIGINT: perf writes its file and exits.
        let _ = std::process::Command::new("kill").args(["-INT", &self.perf.id().to_string()]).status();
        let _ = self.perf.wait();
        std::fs::write(&self.requests, requests.to_string()).expect("the profile's request count");
    }
}

/// Top-level statements executed in `db`'s database so far (utility statements such as `BEGIN`,
/// `SAVEPOINT` and `COMMIT` included), when pg_stat_statements is loaded.
async fn statements(db: &tokio_postgres::Client) -> Option<f64> {
    db.query_one("SELECT coalesce(sum(calls), 0)::float8 AS n FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())", &[])
        .await
        .ok()?
        .try_get("n")
        .ok()
}

/// Top-level statements per request of `side` (utility statements such as `BEGIN`, `SAVEPOINT`
/// and `COMMIT` included), counted by pg_stat_statements over `requests` sequential requests on
/// one connection to `service`, which must track them (started with [`Service::counting`]).
pub(crate) async fn statements_per_request(service: &Service, db: &tokio_postgres::Client, route: Route, side: Side, requests: usize) -> Option<f64> {
    let mut c = Connection::open(service.addr).await;
    let key = format!("counted-{}", fresh_key(0));
    c.post(route, side, "http-count", &key).await; // warm-up; a replay's key executes here
    let before = statements(db).await?;
    for _ in 0..requests {
        let key = if side == Side::Replay { key.clone() } else { fresh_key(0) };
        c.post(route, side, "http-count", &key).await;
    }
    let after = statements(db).await?;
    // `db`'s own session does not track its statements (the cluster's default is none).
    Some((after - before) / requests as f64)
}

/// `connections` workers, each on its own keep-alive connection, sending `side`'s requests to
/// `route` for `run`: requests per second, p50/p99 latency as the client saw it, WAL written
/// (read on `db`). Every answer is checked: a 201, replayed exactly when `side` is a replay.
pub(crate) async fn load(service: &Service, db: &tokio_postgres::Client, route: Route, side: Side, connections: usize, run: Duration) -> Measure {
    let addr = service.addr;
    // Connect and warm up before the clock: one request per connection (a replay's key executes
    // here, once).
    let mut conns = Vec::new();
    for w in 0..connections {
        let mut c = Connection::open(addr).await;
        let user = format!("http-{w}");
        let key = if side == Side::Replay { format!("replayed-{w}") } else { fresh_key(w) };
        c.post(route, side, &user, &key).await;
        conns.push((c, user, key));
    }
    static RUN: AtomicU64 = AtomicU64::new(0);
    let nth = RUN.fetch_add(1, Ordering::Relaxed);
    let profile = Profile::start(service.pid, &format!("{route:?}-{side:?}-{connections}-{nth}").to_lowercase());
    let before = client::wal_lsn(db).await;
    let started = Instant::now();
    let stop = started + run;
    let mut handles = Vec::new();
    for (w, (mut c, user, key)) in conns.into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let key = if side == Side::Replay { key.clone() } else { fresh_key(w) };
                let t0 = Instant::now();
                let (_, replayed) = c.post(route, side, &user, &key).await;
                latencies.push(t0.elapsed());
                assert_eq!(replayed, side == Side::Replay, "{route:?} {side:?}: Idempotent-Replayed");
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("load worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(p) = profile {
        p.stop(latencies.len());
    }
    let wal = client::wal_since(db, &before).await;
    client::measure(latencies, elapsed, wal)
}
