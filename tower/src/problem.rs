//! The layer's own answers: RFC 9457 problem details (`application/problem+json`) whose `type`
//! is stable, one per situation, so clients can branch on it.
//!
//! A 5xx answer never carries an error's text (a driver's message, a host, an OS error, a
//! panic's message): its `detail` is fixed, and its `correlation_id` member names the `tracing`
//! error event (field `correlation_id`) that holds the real error.

use crate::reply::Reply;
use crate::transaction::TransactionRejection;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// 422: the JSON body's canonical form would exceed its bound (16 bytes per byte of the body
    /// plus 8 KiB: numbers with huge exponents), so it has no fingerprint; nothing was reserved.
    pub const FINGERPRINT_LIMIT: &str = "urn:idempotency:problem:fingerprint-limit";
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
    /// 500: the two-phase `Steps` extractor was used on a route without the layer in
    /// two-phase mode, or twice in one handler.
    pub const NO_STEPS: &str = "urn:idempotency:problem:no-steps";
    /// 500: anything else (a database or protocol error).
    pub const INTERNAL: &str = "urn:idempotency:problem:internal";
    /// 502: the route's response is larger than the layer's response limit or the server's
    /// `idempotency.max_response_bytes`, so it was neither stored nor sent. In-transaction its
    /// writes were rolled back and the failure counted towards `max_retries`; two-phase its
    /// effect stands and this answer is stored for the key (the marker
    /// [`idempotency_client::StoredResponse::too_large`]) and replayed to every retry.
    pub const RESPONSE_TOO_LARGE: &str = idempotency_client::StoredResponse::TOO_LARGE_TYPE;
    /// gRPC only (`FAILED_PRECONDITION`): the RPC sent or answered more than one message; the
    /// layer covers unary RPCs only. A streaming request is refused before anything is reserved;
    /// a streaming answer is not stored (in-transaction its writes are rolled back) and the key
    /// is released. Leave streaming RPCs out of the layer (wrap only the unary service, or
    /// `require_key(false)` and send no key).
    pub const STREAMING: &str = "urn:idempotency:problem:streaming";
    /// gRPC only (`UNIMPLEMENTED`, with `grpc-accept-encoding: gzip,deflate,identity`): the
    /// request is compressed in an encoding the layer cannot read, so it has no fingerprint;
    /// nothing was reserved. Send it uncompressed, or gzip or deflate.
    pub const ENCODING_UNSUPPORTED: &str = "urn:idempotency:problem:encoding-unsupported";
}

/// The fixed `detail` of each 5xx answer (the real error is in the log, under the answer's
/// `correlation_id`).
pub(crate) mod details {
    /// 503 `store-unavailable`.
    pub(crate) const STORE_UNAVAILABLE: &str = "the idempotency store cannot be used right now; nothing ran; retry later";
    /// 500 `handler-failed`: a panic or a response body that failed.
    pub(crate) const HANDLER_FAILED: &str = "the handler failed and its response was not recorded; a retry runs it again unless the key's retries ran out";
    /// 500 `internal`.
    pub(crate) const INTERNAL: &str = "an internal error; the server's log has it under this correlation_id";
    /// 502 `response-too-large`, in-transaction (two-phase answers the marker's detail).
    pub(crate) const TOO_LARGE_ROLLED_BACK: &str =
        "the response is larger than the idempotency store's limit, so it was not stored and the request's writes were rolled back";
}

/// A problem answer under construction. Hidden: the adapters' (their stacks answer it).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    kind: &'static str,
    title: &'static str,
    detail: String,
    retry_after: Option<Duration>,
    correlation_id: Option<String>,
}

impl Problem {
    /// An answer whose detail is client-facing (a 4xx's rule). A 5xx made here gets a
    /// correlation id and an error event of its own (its detail must be fixed text: use
    /// [`Problem::failure`] for an error's).
    pub fn new(status: u16, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let detail = detail.into();
        let correlation_id = status.is_server_error().then(|| logged(status, kind, &detail));
        Problem { status, kind, title, detail, retry_after: None, correlation_id }
    }

    /// A 5xx answer for `error`: the fixed `detail` and a correlation id; `error` goes only to
    /// the `tracing` error event that carries the same id.
    pub fn failure(status: u16, kind: &'static str, title: &'static str, detail: &'static str, error: &dyn std::fmt::Display) -> Self {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let correlation_id = Some(logged(status, kind, error));
        Problem { status, kind, title, detail: detail.to_owned(), retry_after: None, correlation_id }
    }

    /// Adds `Retry-After` (whole seconds, at least 1).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn status(&self) -> u16 {
        self.status.as_u16()
    }

    /// The one mapping of the client's errors to the layer's answers (their statuses from
    /// [`crate::http::http_status`]): 409 in progress or lease lost and 503 store unavailable
    /// with `Retry-After` (`unavailable` for the store), 422 mismatch, 409 (or the stored
    /// status) failed, 400 invalid key, 502 too large, 500 a handler's error or anything else
    /// (the error and its sources only in the log, under the answer's correlation id).
    pub fn of_error<E: std::fmt::Display>(error: &idempotency_client::Error<E>, unavailable: Duration) -> Self {
        use idempotency_client::Error;
        let status = crate::http::http_status(error);
        let problem = match error {
            Error::InProgress { .. } => Problem::new(status, types::IN_PROGRESS, "Request in progress", "another request with this key is being processed"),
            Error::Mismatch => Problem::new(status, types::MISMATCH, "Idempotency key reused", "this key was used with a different request"),
            Error::LeaseLost { .. } => Problem::new(status, types::LEASE_LOST, "Lease lost", "this attempt lost its hold on the key; retry"),
            Error::Failed { .. } => Problem::new(status, types::FAILED, "Request failed", "an earlier attempt with this key failed for good"),
            Error::InvalidKey(e) => Problem::new(400, types::KEY_INVALID, "Invalid idempotency key", e.to_string()),
            Error::StoreUnavailable(source) => {
                let cause = Chain(source.as_ref());
                Problem::failure(status, types::STORE_UNAVAILABLE, "Idempotency store unavailable", details::STORE_UNAVAILABLE, &cause)
            }
            Error::ResponseTooLarge { .. } => Problem::failure(
                status,
                types::RESPONSE_TOO_LARGE,
                idempotency_client::StoredResponse::TOO_LARGE_TITLE,
                idempotency_client::StoredResponse::TOO_LARGE_DETAIL,
                error,
            ),
            Error::Handler { .. } | Error::Poisoned { .. } => {
                Problem::failure(500, types::HANDLER_FAILED, "Handler failed", details::HANDLER_FAILED, error)
            }
            other => Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &described(other)),
        };
        match crate::http::retry_after(error, unavailable) {
            Some(after) => problem.retry_after(after),
            None => problem,
        }
    }

    /// The answer to a handler that got no [`Connection`](crate::Connection) or
    /// [`Transaction`](crate::Transaction): a 500 `no-transaction` problem whose detail says why.
    pub fn of_rejection(rejection: TransactionRejection) -> Self {
        Problem::new(500, types::NO_TRANSACTION, "No idempotency transaction", rejection.to_string())
    }

    /// The answer to a handler that got no [`Steps`](crate::Steps): a 500 `no-steps` problem
    /// whose detail says why.
    pub fn of_steps_rejection(rejection: crate::StepsRejection) -> Self {
        Problem::new(500, types::NO_STEPS, "No idempotency steps", rejection.to_string())
    }

    /// The problem's `type`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The `detail`, with the correlation id of a 5xx appended.
    pub fn message(&self) -> String {
        match &self.correlation_id {
            Some(id) => format!("{} (correlation_id {id})", self.detail),
            None => self.detail.clone(),
        }
    }

    /// The `Retry-After` hint, if any.
    pub fn retry_after_hint(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The answer as a [`Reply`] (no trailers).
    pub fn into_reply(self) -> Reply {
        let (parts, body) = self.into_response::<Bytes>().into_parts();
        Reply { status: parts.status, headers: parts.headers, body, trailers: None }
    }

    /// The response, with any body type built from bytes.
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut body = idempotency_client::adapter::problem_body(self.kind, self.title, self.status.as_u16(), &self.detail);
        if let (Some(id), Some(members)) = (self.correlation_id, body.as_object_mut()) {
            members.insert("correlation_id".to_owned(), id.into());
        }
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

/// An error with its sources, for the log only.
fn described<E: std::fmt::Display>(e: &idempotency_client::Error<E>) -> String {
    use idempotency_client::Error;
    let source: Option<&(dyn std::error::Error + 'static)> = match e {
        Error::Database(db) => Some(db),
        Error::StoreUnavailable(s) => Some(s.as_ref()),
        Error::IncompatibleExtension { source: Some(s), .. } | Error::Configuration { source: Some(s), .. } | Error::Protocol { source: Some(s), .. } => {
            Some(s.as_ref())
        }
        Error::Decode(d) => Some(d),
        _ => None,
    };
    let mut text = e.to_string();
    if let Some(source) = source {
        text.push_str(": ");
        text.push_str(&Chain(source).to_string());
    }
    text
}

/// An error and its sources, `: `-separated (a source that repeats its error's text is skipped).
struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            if text != last {
                write!(f, ": {text}")?;
            }
            last = text;
            next = e.source();
        }
        Ok(())
    }
}

/// Logs the error behind a 5xx answer under a new correlation id, and returns the id.
fn logged(status: StatusCode, kind: &'static str, error: &dyn std::fmt::Display) -> String {
    let id = correlation_id();
    tracing::error!(correlation_id = id.as_str(), status = status.as_u16(), problem = kind, error = %error, "idempotency answered a server error");
    id
}

/// 16 hex digits, different for every answer: a process-wide counter hashed with a randomly
/// keyed hasher (so ids do not repeat across processes or restarts, and say nothing).
fn correlation_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", std::collections::hash_map::RandomState::new().hash_one(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(problem: Problem) -> serde_json::Value {
        let response: Response<Bytes> = problem.into_response();
        serde_json::from_slice(response.body()).unwrap()
    }

    #[test]
    fn server_errors_carry_a_fixed_detail_and_a_correlation_id() {
        let secret = "connection refused by 10.0.0.7:5432";
        let answer = body(Problem::failure(503, types::STORE_UNAVAILABLE, "Store unavailable", details::STORE_UNAVAILABLE, &secret));
        assert_eq!(answer["detail"], details::STORE_UNAVAILABLE);
        assert!(!answer.to_string().contains("10.0.0.7"), "{answer}");
        let id = answer["correlation_id"].as_str().unwrap().to_owned();
        assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        let again = body(Problem::failure(503, types::STORE_UNAVAILABLE, "Store unavailable", details::STORE_UNAVAILABLE, &secret));
        assert_ne!(again["correlation_id"].as_str(), Some(id.as_str()), "one id per answer");
        // A 5xx made with `new` gets one too; a 4xx none.
        assert!(body(Problem::new(500, types::NO_TRANSACTION, "No transaction", "fixed")).get("correlation_id").is_some());
        assert!(body(Problem::new(422, types::MISMATCH, "Mismatch", "rule")).get("correlation_id").is_none());
    }
}
