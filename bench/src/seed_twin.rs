//! The fair twin of the two-phase route (`POST /payouts` of `idempotency_examples::payouts`):
//! the same outside call (the example's own handler, so the same provider and client), made
//! idempotent the way the seed libraries do it, with hand-written SQL on a table like theirs:
//! reserve the key and commit, call, then store the response and commit (two statements, two
//! commits, each prepared once per connection and sent on its own pooled connection). A key seen
//! before answers from the table: its stored response, or a 409 while it is being processed.
//! What it leaves out against the layer: leases that expire and are recovered, heartbeats,
//! fencing tokens, retry counting, request hashing beyond a fingerprint comparison.

use axum::body::to_bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use deadpool_postgres::Pool;
use idempotency_client::Fingerprint;
use idempotency_examples::payouts;
use serde_json::{json, Value};

/// The store's table: one row per user and key, as the seed libraries keep it.
pub(crate) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS seed_idempotency_keys (
    user_id text NOT NULL, key text NOT NULL, request_hash text NOT NULL, status text NOT NULL,
    response jsonb, locked_until timestamptz NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (user_id, key))";

/// Reserve: a new row in PROCESSING, or nothing when the key exists (autocommit).
const RESERVE: &str = "INSERT INTO seed_idempotency_keys (user_id, key, request_hash, status, locked_until)
     VALUES ($1, $2, $3, 'PROCESSING', now() + interval '30 seconds') ON CONFLICT DO NOTHING";
/// An existing key's record.
const LOOKUP: &str = "SELECT request_hash, status, response FROM seed_idempotency_keys WHERE user_id = $1 AND key = $2";
/// Complete: the response stored (autocommit).
const COMPLETE: &str = "UPDATE seed_idempotency_keys SET status = 'SUCCESS', response = $3, updated_at = now() WHERE user_id = $1 AND key = $2";

/// `POST /payouts` behind the hand-written store, on `pool`, calling `provider_url`.
pub(crate) fn router(pool: Pool, provider_url: String) -> Router {
    Router::new().route("/payouts", post(payout)).with_state((pool, payouts::Provider::new(provider_url)))
}

async fn payout(State((pool, provider)): State<(Pool, payouts::Provider)>, headers: HeaderMap, body: String) -> Response {
    let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let (Some(user), Some(key)) = (text("x-user"), text("idempotency-key")) else {
        return (StatusCode::BAD_REQUEST, Json(json!({"error": "X-User and Idempotency-Key are required"}))).into_response();
    };
    let hash = Fingerprint::of_bytes(body.as_bytes()).as_str().to_owned();
    let failed = |e: &dyn std::fmt::Display| (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": e.to_string()}))).into_response();
    let reserved = async {
        let db = pool.get().await.map_err(|e| e.to_string())?;
        let reserve = db.prepare_cached(RESERVE).await.map_err(|e| e.to_string())?;
        if db.execute(&reserve, &[&user, &key, &hash]).await.map_err(|e| e.to_string())? == 1 {
            return Ok(None);
        }
        let lookup = db.prepare_cached(LOOKUP).await.map_err(|e| e.to_string())?;
        let row = db.query_one(&lookup, &[&user, &key]).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(Some((row.get::<_, String>("request_hash"), row.get::<_, String>("status"), row.get::<_, Option<Value>>("response"))))
    };
    match reserved.await {
        Err(e) => return failed(&e),
        Ok(Some((stored_hash, _, _))) if stored_hash != hash => {
            return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": "key reused with another request"}))).into_response()
        }
        Ok(Some((_, status, Some(response)))) if status == "SUCCESS" => return (StatusCode::CREATED, Json(response)).into_response(),
        Ok(Some(_)) => return (StatusCode::CONFLICT, Json(json!({"error": "in progress"}))).into_response(),
        Ok(None) => {}
    }
    let answer = payouts::payout(State(provider), headers.clone(), body).await;
    let (parts, body) = answer.into_parts();
    let Ok(bytes) = to_bytes(body, 1 << 20).await else { return failed(&"the provider's answer") };
    let Ok(response) = serde_json::from_slice::<Value>(&bytes) else { return failed(&"the provider's answer is not JSON") };
    let completed = async {
        let db = pool.get().await.map_err(|e| e.to_string())?;
        let complete = db.prepare_cached(COMPLETE).await.map_err(|e| e.to_string())?;
        db.execute(&complete, &[&user, &key, &response]).await.map_err(|e| e.to_string())
    };
    if let Err(e) = completed.await {
        return failed(&e);
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}
