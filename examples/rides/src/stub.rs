//! An outside service that deduplicates by idempotency key, as a card network or a mailer does:
//! `POST /` with an `Idempotency-Key` header; the first call per key is the effective one (its
//! answer, `{"id": "<name>:<key>"}`, is kept and returned to every repeat); every call is
//! counted, per key.

use crate::RideError;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a stub saw, per idempotency key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Every call.
    pub calls: usize,
    /// Effective calls (at most one: the first).
    pub effective: usize,
}

/// A running stub.
#[derive(Debug, Clone)]
pub struct Stub {
    /// Its base URL.
    pub url: String,
    seen: Arc<Mutex<HashMap<String, Seen>>>,
}

impl Stub {
    /// Serves the stub `name` on `127.0.0.1:0` in the current runtime.
    pub async fn serve(name: &'static str) -> std::io::Result<Stub> {
        let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
        let state = seen.clone();
        let app = Router::new().route(
            "/",
            post(move |headers: HeaderMap| {
                let seen = state.clone();
                async move {
                    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
                        return (StatusCode::BAD_REQUEST, Json(json!({"error": "Idempotency-Key is required"})));
                    };
                    let mut seen = seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    let entry = seen.entry(key.to_owned()).or_default();
                    entry.calls += 1;
                    if entry.effective == 0 {
                        entry.effective = 1;
                    }
                    (StatusCode::OK, Json(json!({"id": format!("{name}:{key}")})))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(Stub { url, seen })
    }

    /// What it saw for `key` (nothing: the default).
    pub fn seen(&self, key: &str) -> Seen {
        self.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(key).cloned().unwrap_or_default()
    }
}

/// Calls the stub at `url` with `key` as its `Idempotency-Key`; the id it answered.
pub async fn call(http: &reqwest::Client, url: &str, key: &str, body: Value) -> Result<String, RideError> {
    let answer: Value = http
        .post(url)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| RideError(format!("{url}: {e}")))?
        .json()
        .await
        .map_err(|e| RideError(format!("{url}: {e}")))?;
    answer["id"].as_str().map(str::to_owned).ok_or_else(|| RideError(format!("{url} answered no id: {answer}")))
}
