//! An axum service with an idempotent `POST /charges`, on [`IdempotencyLayer`] in
//! in-transaction mode: the charge row and the stored response commit together.
//!
//! Served by the binary `axum_charges` (`src/bin/axum_charges.rs`):
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3000 \
//!     cargo run -p idempotency-examples --bin axum_charges
//! curl -i -X POST localhost:3000/charges -H 'Idempotency-Key: k-1' -H 'X-User: u-1' -d '{"amount": 100}'
//! ```
//!
//! The layer answers everything about the key: 400 without an `Idempotency-Key` (bare or
//! quoted) or with a bad one, 401 without `X-User`, the stored response with
//! `Idempotent-Replayed: true` for a retry, 409 + `Retry-After` while another attempt holds the
//! key, 422 when the key was used for another request, 413 for a body over 1 MiB, 503 when the
//! store is down. The handler only charges. Set `IDEM_SCHEMA` to name the extension's schema
//! (otherwise it is looked up in `pg_extension`).
//!
//! `POST /charges/one` is the same charge through `Idempotency::run_statement`: the whole flow as
//! one statement (one round trip), its handler reading the key itself.
//!
//! [`plain_router`] is the same route without the layer (the same insert in a plain transaction
//! on the same pool): the baseline the benchmark (`bash scripts/bench.sh`) measures it against.
//! `PLAIN=1` serves it instead, to compare the two with your own load tool.

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use deadpool_postgres::{GenericClient, Pool};
use idempotency_tower::{Connection, ErrorResponse, IdempotencyLayer};
use idempotency_client::{Driver, Error, Fingerprint, Idempotency, Key, OneStatement, Outcome};
use serde_json::{json, Value};

/// The connections of the handle's pool.
pub const POOL_SIZE: usize = 16;

/// The routes, over a handle whose database has the [`SCHEMA`] table.
pub fn router(idem: Idempotency) -> Router {
    let idempotent = IdempotencyLayer::in_transaction(idem.clone())
        .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
        .build()
        .expect("a complete layer configuration");
    Router::new()
        .route("/charges", post(create_charge))
        .route_layer(idempotent)
        .route("/charges/one", post(create_charge_one))
        .with_state(idem)
}

/// The SQL the routes need next to the extension.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)";

/// The same route without the layer: the same insert in a plain transaction of `pool`, committed
/// unless the answer is a 5xx. No key, no replay.
pub fn plain_router(pool: Pool) -> Router {
    Router::new().route("/charges", post(create_charge_plain)).with_state(pool)
}

/// Charges `{"amount": N}` for the `X-User`, through the request's transaction, used as the
/// connection itself. A 4xx is stored and replayed like a 201; a 500 (a database error) releases
/// the key for the retry.
async fn create_charge(tx: Connection, headers: HeaderMap, body: String) -> Response {
    charge(&*tx, &headers, &body).await
}

async fn create_charge_plain(State(pool): State<Pool>, headers: HeaderMap, body: String) -> Response {
    let failed = |e: &dyn std::fmt::Display| (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))).into_response();
    let mut client = match pool.get().await {
        Ok(client) => client,
        Err(e) => return failed(&e),
    };
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return failed(&e),
    };
    let response = charge(&tx, &headers, &body).await;
    if response.status().is_server_error() {
        return response; // dropping `tx` rolls it back
    }
    match tx.commit().await {
        Ok(()) => response,
        Err(e) => failed(&e),
    }
}

/// The same charge as one statement (`Idempotency::run_statement`): the reservation, the insert
/// and the completion travel together, one round trip and one commit. The handler reads the key
/// itself (no layer on this route); the stored response is the inserted row, and an error is
/// answered with the layer's problem+json (the client's `Error` in an `ErrorResponse`, an axum `IntoResponse`). Over
/// either driver (the sqlx example's route is this handler too).
pub async fn create_charge_one<D: Driver>(State(idem): State<Idempotency<D>>, headers: HeaderMap, body: String) -> Response {
    const INSERT: &str = "INSERT INTO charges (user_id, amount) SELECT $1, $2 FROM created RETURNING id, amount";
    let problem = |status: StatusCode, detail: String| (status, Json(json!({"error": detail}))).into_response();
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim_matches('"').to_owned());
    let (Some(user), Some(k)) = (text("x-user"), text("idempotency-key")) else {
        return problem(StatusCode::BAD_REQUEST, "X-User and Idempotency-Key are required".into());
    };
    let amount = serde_json::from_str::<Value>(&body).ok().and_then(|v| v.get("amount").and_then(Value::as_i64));
    let Some(amount) = amount.filter(|a| *a > 0) else {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "amount must be positive".into());
    };
    let (key, fingerprint) = match (Key::new("charges.one", &user, &k), Fingerprint::of_bytes(body.as_bytes())) {
        (Ok(key), fingerprint) => (key, fingerprint),
        (Err(e), _) => {
            let e: Error = e.into();
            return ErrorResponse(e).into_response();
        }
    };
    let statement = OneStatement::new(INSERT).text(&user).int8(amount);
    match idem.run_statement::<Value>(&key, &fingerprint, &statement).await {
        Ok(Outcome::Executed(row)) => (StatusCode::CREATED, Json(row)).into_response(),
        Ok(outcome) => {
            let replayed = outcome.is_replayed();
            let mut response = (StatusCode::CREATED, Json(outcome.into_inner())).into_response();
            if replayed {
                response.headers_mut().insert("idempotent-replayed", header::HeaderValue::from_static("true"));
            }
            response
        }
        // The layer's problem+json answer for every error (409 + Retry-After, 422, 503, ...).
        Err(e) => ErrorResponse(e).into_response(),
    }
}

/// The handler's work, through `tx`: the charge row and a 201, or a 422 for a bad amount.
async fn charge(tx: &impl GenericClient, headers: &HeaderMap, body: &str) -> Response {
    let user = headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let amount = serde_json::from_str::<Value>(body).ok().and_then(|v| v.get("amount").and_then(Value::as_i64));
    let Some(amount) = amount.filter(|a| *a > 0) else {
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": "amount must be positive"}))).into_response();
    };
    // Prepared once per connection (a string given to `query_one` is parsed on every request).
    let inserted = async {
        let insert = tx.prepare_cached("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id").await?;
        tx.query_one(&insert, &[&user, &amount]).await?.try_get::<_, i64>("id")
    };
    match inserted.await {
        Ok(id) => {
            (StatusCode::CREATED, [(header::LOCATION, format!("/charges/{id}"))], Json(json!({"id": id, "amount": amount})))
                .into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))).into_response(),
    }
}
