//! A two-phase route: `POST /payouts` sends money through an outside service (here a local stub
//! of a payment provider started in the same process), so its effect cannot roll back with a
//! database transaction. The layer reserves the key with a lease, heartbeats it while the handler
//! calls out, and stores the response after; a retry replays it and never calls out again.
//!
//! Served by the binary `two_phase_stub` (`src/bin/two_phase_stub.rs`):
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3001 \
//!     cargo run -p idempotency-examples --bin two_phase_stub
//! curl -i -X POST localhost:3001/payouts -H 'Idempotency-Key: p-1' -H 'X-User: u-1' -d '{"amount": 5}'
//! ```
//!
//! The handler forwards the key downstream (as Stripe's API accepts it): if this process crashes
//! after the call but before the response is stored, the key is recovered once its lease ends,
//! the retry calls out again, and the provider's own idempotency answers it without a second
//! transfer.
//!
//! [`plain_router`] is the same route without the layer, the baseline of the benchmark
//! (`bash scripts/bench.sh`); `PLAIN=1` serves it instead.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_tower::IdempotencyLayer;
use idempotency_client::Idempotency;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The connections of the handle's pool.
pub const POOL_SIZE: usize = 16;

/// The stub provider on `bind`: one transfer per idempotency key, answered again for a repeated
/// key. Returns its URL.
pub async fn provider(bind: &str) -> std::io::Result<String> {
    let transfers: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let route = post(|State(seen): State<Arc<Mutex<HashMap<String, Value>>>>, headers: HeaderMap, body: String| async move {
        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        let next = seen.len() + 1;
        let transfer = seen.entry(key).or_insert_with(|| json!({"transfer": next, "request": body})).clone();
        Json(transfer)
    });
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let url = format!("http://{}/transfers", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, Router::new().route("/transfers", route).with_state(transfers)).await });
    Ok(url)
}

/// The app's routes: `POST /payouts` in two-phase mode, calling `provider_url`.
pub fn router(idem: Idempotency, provider_url: String) -> Router {
    let idempotent = IdempotencyLayer::two_phase(idem)
        .lease(Duration::from_secs(30))
        .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
        .build()
        .expect("a complete layer configuration");
    routes().route_layer(idempotent).with_state(Provider::new(provider_url))
}

/// The same route without the layer: the benchmark's baseline (`bash scripts/bench.sh`).
pub fn plain_router(provider_url: String) -> Router {
    routes().with_state(Provider::new(provider_url))
}

fn routes() -> Router<Provider> {
    Router::new().route("/payouts", post(payout))
}

/// The provider's URL and one HTTP client for every call (it keeps its connections alive).
#[derive(Clone)]
pub struct Provider {
    http: reqwest::Client,
    url: String,
}

impl Provider {
    /// A provider at `url` (what [`provider`] returns), with a client of its own.
    pub fn new(url: String) -> Provider {
        Provider { http: reqwest::Client::new(), url }
    }
}

/// Calls the provider with the request's key; a provider failure is a 502, which releases the
/// key so the client's retry calls out again.
pub async fn payout(State(provider): State<Provider>, headers: HeaderMap, body: String) -> Response {
    let key = headers.get("idempotency-key").cloned();
    let mut call = provider.http.post(&provider.url).body(body);
    if let Some(key) = key {
        call = call.header("idempotency-key", key);
    }
    match call.send().await {
        Ok(answer) => match answer.json::<Value>().await {
            Ok(transfer) => (StatusCode::CREATED, Json(transfer)).into_response(),
            Err(e) => (StatusCode::BAD_GATEWAY, Json(json!({"error": e.to_string()}))).into_response(),
        },
        Err(e) => (StatusCode::BAD_GATEWAY, Json(json!({"error": e.to_string()}))).into_response(),
    }
}
