//! The demo: N concurrent duplicates of one "charge" request against (a) a naive check-then-run
//! implementation and (b) an axum route behind `IdempotencyLayer`, over HTTP on loopback; then a
//! replay, a mismatch and a transient failure. Run it with `bash scripts/demo.sh`.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post as post_route;
use axum::{Json, Router};
use idempotency_tower::{IdempotencyLayer, Transaction};
use idempotency_client::{Idempotency, Postgres, Settings};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const DUPLICATES: u32 = 32;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = fresh_database().await?;
    let idem = Idempotency::<Postgres>::from_url(&url, DUPLICATES + 4, Settings::default())?;
    let version = idem.check_extension().await?;
    let db = idem.pool().get().await?;
    // The naive implementation's own key table, without a constraint: check, then run. Both
    // implementations charge the card by writing a `charges` row (user_id says which one).
    db.batch_execute("CREATE TABLE naive_keys (key text, response jsonb)").await?;

    println!("idempotency {version}: {DUPLICATES} concurrent retries of one POST /charges {{\"amount\": 100}}\n");

    // (a) naive: look the key up, charge if absent, then remember the key.
    let mut tasks = Vec::new();
    for _ in 0..DUPLICATES {
        let pool = idem.pool().clone();
        tasks.push(tokio::spawn(async move {
            let db = pool.get().await?;
            let seen = db.query_opt("SELECT response FROM naive_keys WHERE key = 'k-1' LIMIT 1", &[]).await?;
            if seen.is_none() {
                db.execute("INSERT INTO charges (user_id, amount, k) VALUES ('naive', 100, 'k-1')", &[]).await?;
                tokio::time::sleep(Duration::from_millis(50)).await; // the card network
                db.execute("INSERT INTO naive_keys VALUES ('k-1', '{\"status\": 201}')", &[]).await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for t in tasks {
        t.await?.map_err(|e| e.to_string())?;
    }
    let naive = count(&db, "naive").await?;
    println!("(a) naive check-then-run      card charged {naive:>2} times  {}", verdict(naive == 1));

    // (b) the extension, through the tower layer: POST /charges served on loopback, the
    // reservation and the charge committing together.
    let app = Arc::new(App { runs: AtomicUsize::new(0), network_down: AtomicBool::new(false) });
    let url = serve(idem.clone(), app.clone()).await?;
    let mut tasks = Vec::new();
    for _ in 0..DUPLICATES {
        let url = url.clone();
        tasks.push(tokio::spawn(async move { post(&url, "k-1", 100).await }));
    }
    let (mut executed, mut busy, mut replayed) = (0, 0, 0);
    for t in tasks {
        match t.await?? {
            (201, false, _) => executed += 1,
            (201, true, _) => replayed += 1,
            (409, _, _) => busy += 1,
            other => println!("    unexpected: {other:?}"),
        }
    }
    let ours = count(&db, "idempotency").await?;
    let ran = app.runs.load(Ordering::SeqCst);
    println!("(b) IdempotencyLayer          card charged {ours:>2} time   {}", verdict(ours == 1 && ran == 1));
    println!("    {executed} executed, {busy} answered 409 in-progress, {replayed} replayed the stored 201\n");

    // A later retry replays, a different payload is refused.
    match post(&url, "k-1", 100).await? {
        (status, true, body) => println!(
            "replay     same key, same body     → {status} {{\"charged\":{}}} (Idempotent-Replayed: true), card untouched",
            body["charged"]
        ),
        other => println!("replay     unexpected: {other:?}"),
    }
    match post(&url, "k-1", 200).await? {
        (422, _, body) => println!("mismatch   same key, amount 200    → 422 ({})", body["title"].as_str().unwrap_or_default()),
        other => println!("mismatch   unexpected: {other:?}"),
    }

    // A transient failure is released and retried; the charge happens once.
    app.network_down.store(true, Ordering::SeqCst);
    let first = post(&url, "k-2", 100).await?;
    let second = post(&url, "k-2", 100).await?;
    let charged = count_key(&db, "k-2").await?;
    match (first, second) {
        ((503, false, _), (201, false, _)) => println!(
            "transient  upstream 503, retried   → 503 released (writes rolled back), then 201 executed: charged {charged} time"
        ),
        other => println!("transient  unexpected: {other:?}"),
    }
    Ok(())
}

/// The state of the demo's route: how many times the handler ran, and whether the card network
/// fails the next charge.
struct App {
    runs: AtomicUsize,
    network_down: AtomicBool,
}

/// Serves `POST /charges` behind the layer (in-transaction, the user from `X-User`).
async fn serve(idem: Idempotency, app: Arc<App>) -> Result<String, Box<dyn std::error::Error>> {
    let layer = IdempotencyLayer::builder(idem)
        .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
        .build()?;
    let router = Router::new().route("/charges", post_route(charge)).route_layer(layer).with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/charges", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(url)
}

/// The handler: charges the card (a `charges` row tagged with the key, through the request's
/// transaction) while the card network takes 50 ms; a 503 when the network is down.
async fn charge(tx: Transaction, State(app): State<Arc<App>>, headers: HeaderMap, body: String) -> Response {
    app.runs.fetch_add(1, Ordering::SeqCst);
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let amount = serde_json::from_str::<Value>(&body).ok().and_then(|v| v["amount"].as_i64()).unwrap_or(0);
    let insert = "INSERT INTO charges (user_id, amount, k) VALUES ('idempotency', $1, $2)";
    let written = match tx.lock().await {
        Ok(conn) => conn.execute(insert, &[&amount, &key]).await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = written {
        return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response();
    }
    tokio::time::sleep(Duration::from_millis(50)).await; // the card network
    if app.network_down.swap(false, Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": "card network down"}))).into_response();
    }
    (StatusCode::CREATED, Json(json!({"charged": amount}))).into_response()
}

/// One request: status, whether it was a replay, the JSON body.
async fn post(url: &str, key: &str, amount: i64) -> Result<(u16, bool, Value), reqwest::Error> {
    let answer = reqwest::Client::new()
        .post(url)
        .header("idempotency-key", key)
        .header("x-user", "user-42")
        .header("content-type", "application/json")
        .body(json!({"amount": amount}).to_string())
        .send()
        .await?;
    let replayed = answer.headers().get("idempotent-replayed").is_some();
    Ok((answer.status().as_u16(), replayed, answer.json().await.unwrap_or(Value::Null)))
}

/// A database `idem_demo` made afresh on the private cluster (scripts/demo.sh starts it), with the
/// extension and the `charges` table both implementations write.
async fn fresh_database() -> Result<String, Box<dyn std::error::Error>> {
    let server = idempotency_pgserver::Server::private(&idempotency_pgserver::pg_config());
    server.ensure_started();
    let (admin, conn) = tokio_postgres::connect(&server.url("postgres"), tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    admin.batch_execute("DROP DATABASE IF EXISTS idem_demo WITH (FORCE)").await?;
    admin.batch_execute("CREATE DATABASE idem_demo").await?;
    let url = server.url("idem_demo");
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    db.batch_execute("CREATE EXTENSION idempotency; CREATE TABLE charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL, k text)").await?;
    Ok(url)
}

async fn count_key(db: &deadpool_postgres::Client, key: &str) -> Result<i64, tokio_postgres::Error> {
    db.query_one("SELECT count(*) AS n FROM charges WHERE user_id = 'idempotency' AND k = $1", &[&key]).await?.try_get("n")
}

async fn count(db: &deadpool_postgres::Client, via: &str) -> Result<i64, tokio_postgres::Error> {
    db.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&via]).await?.try_get("n")
}

fn verdict(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗ (double charge)" }
}
