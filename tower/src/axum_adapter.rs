//! The axum adapter (feature `axum`): the [`Connection`], [`Transaction`] and [`Steps`] extractors, the
//! answers of a [`TransactionRejection`] and of an [`ErrorResponse`], and axum's matched route
//! as the operation name. Only this module names axum; the layer itself is the tower one.

use crate::matched::MatchedRoute;
use crate::problem::Problem;
use crate::respond::error_reply;
use crate::steps::{Steps, StepsRejection};
use crate::transaction::{shared_of, Connection, Taken, Transaction, TransactionRejection};
use axum::extract::{FromRequestParts, MatchedPath};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use idempotency_client::{Driver, Error};

impl<S: Send + Sync, D: Driver> FromRequestParts<S> for Transaction<D> {
    type Rejection = TransactionRejection;

    /// The request's transaction; [`TransactionRejection`] on a route without an in-transaction
    /// layer, or once the handler has taken its [`Connection`].
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        shared_of(parts.extensions.get::<Taken>().is_some(), parts.extensions.get::<Transaction<D>>())
    }
}

impl<S: Send + Sync, D: Driver> FromRequestParts<S> for Connection<D> {
    type Rejection = TransactionRejection;

    /// The request's connection, held for the handler's life; see [`Connection::take`].
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Connection::take(&mut parts.extensions).await
    }
}

impl<S: Send + Sync, D: Driver> FromRequestParts<S> for Steps<D> {
    type Rejection = StepsRejection;

    /// The request's [`Steps`], taken once; see [`Steps::take`].
    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Steps::take(&parts.extensions)
    }
}

impl IntoResponse for StepsRejection {
    fn into_response(self) -> Response {
        Problem::of_steps_rejection(self).into_response()
    }
}

impl IntoResponse for TransactionRejection {
    fn into_response(self) -> Response {
        Problem::of_rejection(self).into_response()
    }
}

/// The client's [`Error`] as an axum answer, for a handler that calls `run` (or
/// `run_statement`, `run_external`) itself: return `Result<_, ErrorResponse>` and `?` the
/// client's calls. The answer is the layer's problem+json for the error (its status from
/// [`crate::http_status`], `Retry-After` where it has one), or, for [`Error::Failed`] holding a
/// stored response, that response replayed (with `Idempotent-Replayed: true`). A 5xx never
/// carries the error's text.
#[derive(Debug)]
pub struct ErrorResponse<E = std::convert::Infallible>(pub Error<E>);

impl<E> From<Error<E>> for ErrorResponse<E> {
    fn from(error: Error<E>) -> Self {
        ErrorResponse(error)
    }
}

impl<E: std::fmt::Display> IntoResponse for ErrorResponse<E> {
    fn into_response(self) -> Response {
        error_reply(&self.0).into_response()
    }
}

/// Puts axum's `MatchedPath` (the layer added with `route_layer`) in the request as the
/// [`MatchedRoute`] the core names the operation by.
pub(crate) fn match_route(parts: &mut Parts) {
    if let Some(path) = parts.extensions.get::<MatchedPath>() {
        let route = MatchedRoute(path.as_str().to_owned());
        parts.extensions.insert(route);
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorResponse;
    use axum::response::IntoResponse;
    use idempotency_client::Error;
    use serde_json::json;

    async fn answer(error: Error) -> (u16, Option<String>, Option<String>, serde_json::Value) {
        let response = ErrorResponse(error).into_response();
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
        assert_eq!(body["type"], crate::problem::types::IN_PROGRESS);
        let (status, kind, _, body) = answer(Error::Mismatch).await;
        assert_eq!((status, &kind, body["type"].as_str()), (422, &problem, Some(crate::problem::types::MISMATCH)));
        let (status, _, after, body) = answer(Error::StoreUnavailable("10.0.0.7 refused".into())).await;
        assert_eq!((status, after.as_deref()), (503, Some("1")));
        assert!(!body.to_string().contains("10.0.0.7"), "a 5xx never carries the error's text: {body}");
        assert!(body["correlation_id"].is_string());
        let (status, _, _, body) = answer(Error::Failed { response: None }).await;
        assert_eq!((status, body["type"].as_str()), (409, Some(crate::problem::types::FAILED)));
    }

    #[tokio::test]
    async fn a_stored_failure_is_replayed() {
        let stored = idempotency_client::StoredResponse::json(402, json!({"error": "card declined"}));
        let error: Error = Error::Failed { response: Some(serde_json::to_value(stored).unwrap()) };
        let response = ErrorResponse(error).into_response();
        assert_eq!(response.status().as_u16(), 402);
        assert_eq!(response.headers()["idempotent-replayed"], "true");
    }
}
