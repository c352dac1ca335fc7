//! The stack rows: the actix-web and tonic examples, each route behind its layer against the same
//! route without it, as [`http`](crate::http)'s rows do for the axum routers.
//!
//! Each stack is a child process of this binary (`bench --serve-stack actix|grpc DATABASE_URL
//! BIND PLAIN_BIND`), so the server's CPU is its own, over one tokio-postgres pool of the
//! examples' size:
//!
//! - actix-web: the example's `POST /charges` (`idempotency_examples::actix_charges::routes`,
//!   the in-transaction layer) and `POST /plain/charges`, the same insert in a plain transaction
//!   on the same pool, on one actix-web server of the example's two workers (an actix system on
//!   a thread of its own). Driven by [`http::load`], the axum rows' HTTP/1.1 load generator.
//! - gRPC: the example's `charges.v1.Charges` behind its layer
//!   (`idempotency_examples::grpc_charges::service`, in-transaction, the key from the
//!   `idempotency-key` metadata) on `BIND`, and [`PlainCharges`], the same `Create` inserting in a
//!   plain transaction on the same pool, on `PLAIN_BIND` (a tonic server routes one service per
//!   method path); both with `TCP_NODELAY`. Driven by [`load`]: tonic clients, one HTTP/2
//!   connection per concurrent worker, each sending its next call when the previous answer has
//!   been read.

use crate::client;
use crate::http::{self, fresh_key, Service, Side};
use crate::pgbench::Measure;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use deadpool_postgres::{GenericClient, Pool};
use idempotency_tower::Mode;
use crate::client::pool_size;
use idempotency_client::{Idempotency, Postgres, Settings};
use idempotency_examples::grpc_charges::proto::charges_client::ChargesClient;
use idempotency_examples::grpc_charges::proto::charges_server::{Charges as ChargesRpc, ChargesServer};
use idempotency_examples::grpc_charges::proto::{Charge, CreateCharge};
use idempotency_examples::grpc_charges::{ChargeService, KeyFrom};
use idempotency_examples::{actix_charges, charges, grpc_charges};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};

/// One of the other stacks' examples.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stack {
    /// `actix_charges`: `POST /charges` on actix-web.
    Actix,
    /// `grpc_charges`: `charges.v1.Charges/Create` on tonic.
    Grpc,
}

impl Stack {
    fn name(self) -> &'static str {
        match self {
            Stack::Actix => "actix",
            Stack::Grpc => "grpc",
        }
    }

    /// The stack `--serve-stack` names.
    pub(crate) fn parse(name: &str) -> Option<Stack> {
        [Stack::Actix, Stack::Grpc].into_iter().find(|s| s.name() == name)
    }
}

/// The example's insert (`idempotency_examples::store`), in a plain transaction of its own.
async fn insert_plain(pool: &Pool, user: &str, amount: i64) -> Result<i64, String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let mut conn = pool.get().await.map_err(|e| fail(&e))?;
    let tx = conn.transaction().await.map_err(|e| fail(&e))?;
    // Prepared once per connection, as the example's store does.
    let insert = tx.prepare_cached("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id").await.map_err(|e| fail(&e))?;
    let id = tx.query_one(&insert, &[&user, &amount]).await.and_then(|row| row.try_get("id")).map_err(|e| fail(&e))?;
    tx.commit().await.map_err(|e| fail(&e))?;
    Ok(id)
}

/// The handle of a stack's service: the examples' pool size, the example's table in place.
async fn handle(database_url: &str) -> Idempotency {
    let idem = Idempotency::<Postgres>::from_url(database_url, pool_size(charges::POOL_SIZE), Settings::default()).expect("pool");
    idem.check_extension().await.expect("the extension in the service's database");
    idem.pool().get().await.expect("connection").batch_execute(charges::SCHEMA).await.expect("the example's table");
    idem
}

/// The service process of a stack (this binary run with `--serve-stack`): prints `listening on
/// ADDR [PLAIN_ADDR]` once it accepts connections, then serves until killed.
pub(crate) async fn serve(stack: Stack, database_url: &str, bind: &str, plain_bind: &str) {
    match stack {
        Stack::Actix => {
            // actix-web runs its own system: on a thread of its own, outside this tokio runtime.
            let (url, bind) = (database_url.to_owned(), bind.to_owned());
            let server = std::thread::spawn(move || actix_web::rt::System::new().block_on(serve_actix(&url, &bind)));
            tokio::task::spawn_blocking(move || server.join()).await.expect("join").expect("the actix-web system");
        }
        Stack::Grpc => serve_grpc(database_url, bind, plain_bind).await,
    }
}

async fn serve_actix(database_url: &str, bind: &str) {
    let idem = handle(database_url).await;
    let layer = actix_charges::layer(idem.clone());
    let pool = web::Data::new(idem.pool().clone());
    let listener = std::net::TcpListener::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
    println!("listening on {}", listener.local_addr().expect("local address"));
    HttpServer::new(move || App::new().configure(actix_charges::routes(layer.clone())).app_data(pool.clone()).route("/plain/charges", web::post().to(plain_charge)))
        .listen(listener)
        .expect("listen")
        .workers(2)
        .run()
        .await
        .expect("serve");
}

/// `POST /plain/charges`: the actix example's handler without the layer, the same insert in a
/// plain transaction on the same pool.
async fn plain_charge(pool: web::Data<Pool>, req: HttpRequest, body: web::Bytes) -> HttpResponse {
    let user = req.headers().get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let amount = serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("amount").and_then(Value::as_i64));
    let Some(amount) = amount.filter(|a| *a > 0) else {
        return HttpResponse::UnprocessableEntity().json(json!({"error": "amount must be positive"}));
    };
    match insert_plain(&pool, &user, amount).await {
        Ok(id) => HttpResponse::Created()
            .insert_header((actix_web::http::header::LOCATION, format!("/charges/{id}")))
            .json(json!({"id": id, "amount": amount})),
        Err(e) => HttpResponse::InternalServerError().json(json!({"error": e})),
    }
}

/// The gRPC example's `Create` without the layer: the same insert in a plain transaction on the
/// same pool.
struct PlainCharges {
    pool: Pool,
}

#[tonic::async_trait]
impl ChargesRpc for PlainCharges {
    async fn create(&self, request: tonic::Request<CreateCharge>) -> Result<tonic::Response<Charge>, tonic::Status> {
        let user = request.metadata().get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let amount = request.into_inner().amount;
        if amount <= 0 {
            return Err(tonic::Status::invalid_argument("amount must be positive"));
        }
        let id = insert_plain(&self.pool, &user, amount).await.map_err(tonic::Status::unavailable)?;
        Ok(tonic::Response::new(Charge { id, amount }))
    }

    type WatchStream = <ChargeService<Postgres> as ChargesRpc>::WatchStream;

    async fn watch(&self, _: tonic::Request<CreateCharge>) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("not measured"))
    }
}

async fn serve_grpc(database_url: &str, bind: &str, plain_bind: &str) {
    let idem = handle(database_url).await;
    let listen = |bind: &str| {
        let bind = bind.to_owned();
        async move { tokio::net::TcpListener::bind(&bind).await.unwrap_or_else(|e| panic!("bind {bind}: {e}")) }
    };
    let (layered, plain) = (listen(bind).await, listen(plain_bind).await);
    println!("listening on {} {}", layered.local_addr().expect("local address"), plain.local_addr().expect("local address"));
    let incoming = |listener| TcpIncoming::from(listener).with_nodelay(Some(true));
    let with_layer = tonic::transport::Server::builder()
        .add_service(grpc_charges::service(idem.clone(), Mode::InTransaction, KeyFrom::Metadata, None))
        .serve_with_incoming(incoming(layered));
    let without = tonic::transport::Server::builder().add_service(ChargesServer::new(PlainCharges { pool: idem.pool().clone() })).serve_with_incoming(incoming(plain));
    tokio::try_join!(with_layer, without).expect("serve");
}

/// Starts `stack`'s service process on `database_url` (ephemeral ports).
pub(crate) async fn start(stack: Stack, database_url: &str) -> Service {
    Service::process(&["--serve-stack", stack.name(), database_url, "127.0.0.1:0", "127.0.0.1:0"]).await
}

/// `connections` workers sending `side`'s requests to `stack`'s service for `run`, as
/// [`http::load`] does: requests per second, p50/p99 latency as the client saw it, WAL written
/// (read on `db`). Every answer is checked: a 201 or OK, replayed exactly when `side` is a replay.
pub(crate) async fn load(stack: Stack, service: &Service, db: &tokio_postgres::Client, side: Side, connections: usize, run: Duration) -> Measure {
    match stack {
        Stack::Actix => http::load(service, db, http::Route::Charges, side, connections, run).await,
        Stack::Grpc => load_grpc(service, db, side, connections, run).await,
    }
}

/// One call of `Create` (amount 100): whether its answer was a replay.
async fn create(client: &mut ChargesClient<Channel>, side: Side, user: &str, key: &str) -> bool {
    let mut request = tonic::Request::new(CreateCharge { amount: 100, ..CreateCharge::default() });
    request.metadata_mut().insert("idempotency-key", key.parse().expect("an ASCII key"));
    request.metadata_mut().insert("x-user", user.parse().expect("an ASCII user"));
    let response = client.create(request).await.unwrap_or_else(|status| panic!("gRPC {side:?}: {status}"));
    assert_eq!(response.get_ref().amount, 100, "gRPC {side:?}: the charge's amount");
    response.metadata().get("idempotent-replayed").is_some_and(|v| v == "true")
}

async fn load_grpc(service: &Service, db: &tokio_postgres::Client, side: Side, connections: usize, run: Duration) -> Measure {
    let addr = if side == Side::Plain { service.plain.expect("the plain service's address") } else { service.addr };
    // Connect and warm up before the clock: one call per connection (a replay's key executes
    // here, once).
    let mut clients = Vec::new();
    for w in 0..connections {
        let channel = Endpoint::from_shared(format!("http://{addr}")).expect("endpoint").tcp_nodelay(true).connect().await.expect("connect to the gRPC service");
        let mut c = ChargesClient::new(channel);
        let user = format!("grpc-{w}");
        let key = if side == Side::Replay { format!("replayed-{w}") } else { fresh_key(w) };
        create(&mut c, side, &user, &key).await;
        clients.push((c, user, key));
    }
    let before = client::wal_lsn(db).await;
    let started = Instant::now();
    let stop = started + run;
    let mut handles = Vec::new();
    for (w, (mut c, user, key)) in clients.into_iter().enumerate() {
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let key = if side == Side::Replay { key.clone() } else { fresh_key(w) };
                let t0 = Instant::now();
                let replayed = create(&mut c, side, &user, &key).await;
                latencies.push(t0.elapsed());
                assert_eq!(replayed, side == Side::Replay, "gRPC {side:?}: idempotent-replayed");
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("load worker"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let wal = client::wal_since(db, &before).await;
    client::measure(latencies, elapsed, wal)
}
