//! The layer's own answers: RFC 9457 problem details (`application/problem+json`) whose `type`
//! is stable, one per situation, so clients can branch on it.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde_json::json;
use std::time::Duration;

/// The `type` of every problem the layer answers with.
pub mod types {
    /// 400: the request has no idempotency key and the route requires one.
    pub const KEY_MISSING: &str = "urn:idempotency:problem:key-missing";
    /// 400: the idempotency key header is malformed or breaks the key rules.
    pub const KEY_INVALID: &str = "urn:idempotency:problem:key-invalid";
    /// 401: the scope extractor found no user for the request.
    pub const USER_MISSING: &str = "urn:idempotency:problem:user-missing";
    /// 413: the request body is larger than the layer's body limit.
    pub const BODY_TOO_LARGE: &str = "urn:idempotency:problem:body-too-large";
    /// 400: the request body could not be read.
    pub const BODY_UNREADABLE: &str = "urn:idempotency:problem:body-unreadable";
    /// 409 + `Retry-After`: another request with this key is being processed.
    pub const IN_PROGRESS: &str = "urn:idempotency:problem:in-progress";
    /// 409 + `Retry-After`: this request lost its hold on the key (it ran too long); its work
    /// was rolled back (in-transaction) or not recorded (two-phase).
    pub const LEASE_LOST: &str = "urn:idempotency:problem:lease-lost";
    /// 422: the key was used with a different request (method, path or body).
    pub const MISMATCH: &str = "urn:idempotency:problem:mismatch";
    /// The key failed for good and no response was stored (retries exhausted, or recovered
    /// after a crash); the status is 409.
    pub const FAILED: &str = "urn:idempotency:problem:failed";
    /// 503 + `Retry-After`: the idempotency store cannot be reached; nothing ran.
    pub const STORE_UNAVAILABLE: &str = "urn:idempotency:problem:store-unavailable";
    /// 500: the handler panicked or its response body failed; the key was released.
    pub const HANDLER_FAILED: &str = "urn:idempotency:problem:handler-failed";
    /// 500: the in-transaction `Transaction` extractor was used on a route without the layer
    /// in in-transaction mode.
    pub const NO_TRANSACTION: &str = "urn:idempotency:problem:no-transaction";
    /// 500: anything else (a database or protocol error).
    pub const INTERNAL: &str = "urn:idempotency:problem:internal";
}

/// A problem answer under construction.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
}

impl Problem {
    pub(crate) fn new(status: u16, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// Adds `Retry-After` (whole seconds, at least 1).
    pub(crate) fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn status(&self) -> u16 {
        self.status.as_u16()
    }

    /// The response, with any body type built from bytes.
    pub(crate) fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let body = json!({"type": self.kind, "title": self.title, "status": self.status.as_u16(), "detail": self.detail});
        let mut response = Response::new(B::from(Bytes::from(body.to_string())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(after.as_secs().max(1)));
        }
        response
    }
}
