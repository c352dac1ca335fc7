//! An axum service with an idempotent `POST /charges`.
//!
//! ```sh
//! DATABASE_URL=postgresql://postgres@127.0.0.1:55415/postgres cargo run -p idempotency-client --example axum_charges
//! curl -i -X POST localhost:3000/charges -H 'Idempotency-Key: k-1' -H 'X-User: u-1' -d '{"amount": 100}'
//! ```
//!
//! The `Idempotency-Key` header (bare or quoted, as in the IETF draft) is required: 400 without
//! it. Outcomes map to HTTP: 201 for a new charge, the stored response with
//! `Idempotent-Replayed: true` for a replay, 409 + `Retry-After` while another attempt holds the
//! key, 422 when the key was used for another request, 503 when the store is down. Set
//! `IDEM_SCHEMA` when the extension is installed in a schema you want to name explicitly
//! (otherwise it is looked up in `pg_extension`).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, Settings, StoredResponse};
use serde_json::{json, Value};

/// The routes, over a handle whose database has a `charges (id bigserial, user_id text, amount bigint)` table.
pub(crate) fn router(idem: Idempotency) -> Router {
    Router::new().route("/charges", post(create_charge)).with_state(idem)
}

/// The SQL the routes need next to the extension.
pub(crate) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS charges (id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL)";

async fn create_charge(State(idem): State<Idempotency>, headers: HeaderMap, body: String) -> Response {
    let Some(raw_key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return problem(StatusCode::BAD_REQUEST, "the Idempotency-Key header is required");
    };
    let user = headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or("anonymous");
    let key = match Key::new("charges.create", user, unquote(raw_key)) {
        Ok(key) => key,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let request: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("body is not JSON: {e}")),
    };
    let Some(amount) = request.get("amount").and_then(Value::as_i64) else {
        return problem(StatusCode::UNPROCESSABLE_ENTITY, "amount must be an integer");
    };
    let fingerprint = match Fingerprint::of_json(&request) {
        Ok(f) => f,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let user = user.to_owned();
    let outcome = idem
        .run(&key, &fingerprint, move |tx| {
            let user = user.clone();
            Box::pin(async move {
                if amount <= 0 {
                    // A permanent, remembered failure: a 4xx is stored and replayed as such.
                    return Ok(StoredResponse::json(422, json!({"error": "amount must be positive"})));
                }
                let row = tx
                    .query_one("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id", &[&user, &amount])
                    .await?;
                let id: i64 = row.try_get("id")?;
                Ok::<_, tokio_postgres::Error>(
                    StoredResponse::json(201, json!({"id": id, "amount": amount})).with_header("Location", format!("/charges/{id}")),
                )
            })
        })
        .await;
    match outcome {
        Ok(Outcome::Replayed(stored)) => with_replay_header(to_http(stored)),
        // Executed, or a transient answer (released, or poisoned on the last retry): as it is.
        Ok(done) => to_http(done.into_inner()),
        Err(Error::Failed { response: Some(stored) }) => match serde_json::from_value::<StoredResponse>(stored) {
            Ok(stored) => with_replay_header(to_http(stored)),
            Err(_) => problem(StatusCode::CONFLICT, "the request failed permanently"),
        },
        Err(e) => error_response(&e),
    }
}

/// Accepts `k-1` and `"k-1"` (the header is a structured-field string in the IETF draft).
fn unquote(raw: &str) -> &str {
    let raw = raw.trim();
    raw.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(raw)
}

fn to_http(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(stored.body)).into_response();
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn with_replay_header(mut response: Response) -> Response {
    response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}

fn error_response<E: std::fmt::Display>(e: &Error<E>) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = problem(status, &e.to_string());
    if let Some(after) = e.retry_after() {
        let secs = after.as_secs().max(1).to_string();
        if let Ok(v) = HeaderValue::try_from(secs) {
            response.headers_mut().insert("retry-after", v);
        }
    }
    response
}

fn problem(status: StatusCode, detail: &str) -> Response {
    (status, axum::Json(json!({"error": detail}))).into_response()
}

#[allow(dead_code)] // the tests include this file as a module and serve `router` themselves
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:55415/postgres".into());
    let settings = Settings { schema: std::env::var("IDEM_SCHEMA").ok(), ..Settings::default() };
    let idem = Idempotency::connect_with(&url, 16, settings)?;
    idem.check_extension().await?;
    idem.pool().get().await?.batch_execute(SCHEMA).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000");
    axum::serve(listener, router(idem)).await?;
    Ok(())
}
