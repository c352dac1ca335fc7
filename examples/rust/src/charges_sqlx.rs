//! The twin of [`charges`](crate::charges) over sqlx: an axum service with an idempotent
//! `POST /charges`, on [`IdempotencyLayer`] in in-transaction mode over a `sqlx::PgPool`: the
//! charge row and the stored response commit together.
//!
//! Served by the binary `axum_charges_sqlx` (`src/bin/axum_charges_sqlx.rs`; this crate's
//! feature `sqlx`, a default):
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres BIND=127.0.0.1:3000 \
//!     cargo run -p idempotency-examples --bin axum_charges_sqlx
//! curl -i -X POST localhost:3000/charges -H 'Idempotency-Key: k-1' -H 'X-User: u-1' -d '{"amount": 100}'
//! ```
//!
//! The answers are those of [`charges`](crate::charges): 400 without an `Idempotency-Key` (bare or
//! quoted) or with a bad one, 401 without `X-User`, the stored response with
//! `Idempotent-Replayed: true` for a retry, 409 + `Retry-After` while another attempt holds the
//! key, 422 when the key was used for another request, 413 for a body over 1 MiB, 503 when the
//! store is down. The handler only charges. Set `IDEM_SCHEMA` to name the extension's schema.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idempotency_tower::{Connection, IdempotencyLayer};
use idempotency_client::{Idempotency, Sqlx};
use serde_json::{json, Value};

/// The routes, over a handle whose database has the [`SCHEMA`] table.
pub fn router(idem: Idempotency<Sqlx>) -> Router {
    let idempotent = IdempotencyLayer::in_transaction(idem.clone())
        .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
        .build()
        .expect("a complete layer configuration");
    Router::new()
        .route("/charges", post(create_charge))
        .route_layer(idempotent)
        .route("/charges/one", post(crate::charges::create_charge_one::<Sqlx>))
        .with_state(idem)
}

/// The SQL the routes need next to the extension.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)";

/// Charges `{"amount": N}` for the `X-User`, through the request's transaction, used as the
/// connection itself. A 4xx is stored and replayed like a 201; a 500 (a database error) releases
/// the key for the retry.
async fn create_charge(mut tx: Connection<Sqlx>, headers: HeaderMap, body: String) -> Response {
    let user = headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let amount = serde_json::from_str::<Value>(&body).ok().and_then(|v| v.get("amount").and_then(Value::as_i64));
    let Some(amount) = amount.filter(|a| *a > 0) else {
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": "amount must be positive"}))).into_response();
    };
    // A persistent query (sqlx's default): prepared once per connection and kept.
    let inserted = sqlx::query_scalar::<_, i64>("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id")
        .persistent(true)
        .bind(&user)
        .bind(amount)
        .fetch_one(&mut *tx)
        .await;
    match inserted {
        Ok(id) => {
            (StatusCode::CREATED, [(header::LOCATION, format!("/charges/{id}"))], Json(json!({"id": id, "amount": amount})))
                .into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))).into_response(),
    }
}
