//! The layer's answer for the client's [`Error`], for a handler that calls `run` (or
//! `run_statement`, `run_external`) itself: its problem, or a stored failure replayed. Each stack
//! answers it in its own response type (axum's `IntoResponse` for [`crate::ErrorResponse`],
//! idempotency-actix's `ResponseError`).

use crate::problem::Problem;
use crate::record::HttpRecord;
use crate::reply::Reply;
use idempotency_client::Error;
use std::time::Duration;

/// The `Retry-After` of a 503 for a store that could not be used, where no handle's setting is
/// at hand: the default of `Settings::retry_after`.
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer for `error`: its problem, or, for [`Error::Failed`] holding a stored
/// `StoredResponse`, that response replayed (with `Idempotent-Replayed: true`). A 5xx never
/// carries the error's text.
pub fn error_reply<E: std::fmt::Display>(error: &Error<E>) -> Reply {
    if let Error::Failed { response: Some(stored) } = error {
        if let Ok(record) = serde_json::from_value::<HttpRecord>(stored.clone()) {
            return record.into_reply();
        }
    }
    Problem::of_error(error, UNAVAILABLE_RETRY_AFTER).into_reply()
}
