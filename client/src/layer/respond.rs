//! The layer's problem+json answer for the client's [`Error`], for a handler that calls `run`
//! (or `run_statement`, `run_external`) itself: axum's `IntoResponse` (feature `axum`) and
//! actix-web's `ResponseError` (feature `actix`: return `Result<_, Error>` from a handler).

use super::problem::Problem;
use super::record::HttpRecord;
use crate::Error;
use std::time::Duration;

/// The `Retry-After` of a 503 for a store that could not be used, where no handle's setting is
/// at hand: the default of [`crate::Settings::retry_after`].
const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The answer for `error`: its problem, or, for [`Error::Failed`] holding a stored
/// [`crate::StoredResponse`], that response replayed.
fn reply_of<E: std::fmt::Display>(error: &Error<E>) -> super::Reply {
    if let Error::Failed { response: Some(stored) } = error {
        if let Ok(record) = serde_json::from_value::<HttpRecord>(stored.clone()) {
            return record.into_reply();
        }
    }
    Problem::of_error(error, UNAVAILABLE_RETRY_AFTER).into_reply()
}

/// The answer for a handler that calls the client itself: the layer's problem for the error, or, for
/// [`Error::Failed`] holding a stored [`crate::StoredResponse`], that response replayed (with
/// `Idempotent-Replayed: true`). A 5xx never carries the error's text.
#[cfg(feature = "axum")]
impl<E: std::fmt::Display> axum::response::IntoResponse for Error<E> {
    fn into_response(self) -> axum::response::Response {
        reply_of(&self).into_response()
    }
}

/// The same answer for actix-web: a handler returning `Result<HttpResponse, Error>` answers an
/// error with the layer's problem+json (or the stored failure, replayed).
#[cfg(feature = "actix")]
impl<E: std::fmt::Debug + std::fmt::Display> actix_web::ResponseError for Error<E> {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::from_u16(super::http::http_status(self)).unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> actix_web::HttpResponse {
        super::actix::response_of(reply_of(self))
    }
}

#[cfg(all(test, feature = "axum"))]
mod tests {
    use crate::Error;
    use axum::response::IntoResponse;
    use serde_json::json;

    async fn answer(error: Error) -> (u16, Option<String>, Option<String>, serde_json::Value) {
        let response = error.into_response();
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
        let (kind, after) = (header("content-type"), header("retry-after"));
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, kind, after, serde_json::from_slice(&bytes).unwrap_or(json!(null)))
    }

    #[tokio::test]
    async fn errors_answer_problem_json() {
        let problem = Some("application/problem+json".to_owned());
        let (status, kind, after, body) = answer(Error::InProgress { retry_after: std::time::Duration::from_secs(3) }).await;
        assert_eq!((status, &kind, after.as_deref()), (409, &problem, Some("3")));
        assert_eq!(body["type"], crate::layer::problem::types::IN_PROGRESS);
        let (status, kind, _, body) = answer(Error::Mismatch).await;
        assert_eq!((status, &kind, body["type"].as_str()), (422, &problem, Some(crate::layer::problem::types::MISMATCH)));
        let (status, _, after, body) = answer(Error::StoreUnavailable("10.0.0.7 refused".into())).await;
        assert_eq!((status, after.as_deref()), (503, Some("1")));
        assert!(!body.to_string().contains("10.0.0.7"), "a 5xx never carries the error's text: {body}");
        assert!(body["correlation_id"].is_string());
        let (status, _, _, body) = answer(Error::Failed { response: None }).await;
        assert_eq!((status, body["type"].as_str()), (409, Some(crate::layer::problem::types::FAILED)));
    }

    #[tokio::test]
    async fn a_stored_failure_is_replayed() {
        let stored = crate::StoredResponse::json(402, json!({"error": "card declined"}));
        let error: Error = Error::Failed { response: Some(serde_json::to_value(stored).unwrap()) };
        let response = error.into_response();
        assert_eq!(response.status().as_u16(), 402);
        assert_eq!(response.headers()["idempotent-replayed"], "true");
    }
}

#[cfg(all(test, feature = "actix"))]
mod actix_tests {
    use crate::Error;
    use actix_web::ResponseError;

    #[test]
    fn errors_answer_problem_json_on_actix_too() {
        let error: Error = Error::InProgress { retry_after: std::time::Duration::from_secs(2) };
        let response = error.error_response();
        assert_eq!(response.status().as_u16(), 409);
        assert_eq!(response.headers().get("content-type").unwrap(), "application/problem+json");
        assert_eq!(response.headers().get("retry-after").unwrap(), "2");
        let stored = crate::StoredResponse::json(402, serde_json::json!({"error": "card declined"}));
        let error: Error = Error::Failed { response: Some(serde_json::to_value(stored).unwrap()) };
        assert_eq!(error.status_code().as_u16(), 402);
        let response = error.error_response();
        assert_eq!((response.status().as_u16(), response.headers().get("idempotent-replayed").unwrap().to_str().unwrap()), (402, "true"));
    }
}
