//! Every answer of the gRPC adapter is a gRPC answer: HTTP 200, `content-type: application/grpc`,
//! the status in `grpc-status` / `grpc-message` (trailers, or the headers of a trailers-only
//! answer). How a route's answer is recorded ([`recorded`]), how a stored or live answer is sent
//! ([`response_of`]), and the layer's own answers ([`status_of`]).

use crate::codes::http_equivalent;
use crate::encoding;
use crate::frame::frames;
use idempotency_tower::adapter::{Failure, Problem};
use idempotency_tower::problem::types;
use idempotency_tower::Reply;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use std::convert::Infallible;
use tonic::body::Body;
use tonic::{Code, Status};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// A route's answer as the layer records it: one message at most (else [`Failure::Streaming`]),
/// uncompressed ([`encoding`]), its status and every metadata of a trailers-only answer (an
/// error: `grpc-status`, `grpc-message`, `grpc-status-details-bin` and what the handler attached
/// with `Status::with_metadata`, `-bin` keys included) moved to the trailers, where they are
/// stored and replayed (the initial headers keep only `content-type`); its status for the
/// policy is the HTTP status its code maps to ([`crate::codes::CODES`]).
pub(crate) fn recorded<SE>(mut reply: Reply, limit: usize, effect_stands: bool) -> Result<Reply, Failure<SE>> {
    if frames(&reply.body).is_some_and(|n| n > 1) {
        return Err(Failure::Streaming);
    }
    reply.body = encoding::identity_answer(&mut reply.headers, reply.body, limit, effect_stands)?;
    if reply.headers.contains_key(GRPC_STATUS) {
        let content_type = reply.headers.remove(CONTENT_TYPE);
        let trailers = reply.trailers.get_or_insert_with(HeaderMap::new);
        let mut name = None;
        for (key, value) in std::mem::take(&mut reply.headers) {
            name = key.or(name);
            if let Some(name) = &name {
                trailers.append(name.clone(), value);
            }
        }
        if let Some(content_type) = content_type {
            reply.headers.insert(CONTENT_TYPE, content_type);
        }
    }
    let code = reply.trailers.as_ref().and_then(|t| t.get(GRPC_STATUS)).and_then(|v| v.to_str().ok()?.parse::<i32>().ok());
    reply.status = http_equivalent(Code::from_i32(code.unwrap_or(Code::Unknown as i32)));
    Ok(reply)
}

/// The gRPC answer of a stored or live reply: HTTP 200, its initial metadata, its message, its
/// trailers. A stored answer that is not a gRPC one (no `grpc-status` trailer: the two-phase
/// too-large marker, which the key holds once an answer over the limit ran) is sent as the
/// status its problem stands for.
pub(crate) fn response_of(reply: Reply) -> Response<Body> {
    if !reply.trailers.as_ref().is_some_and(|t| t.contains_key(GRPC_STATUS)) {
        return status_of_stored(reply);
    }
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::with_capacity(2);
    if !reply.body.is_empty() {
        frames.push(Ok(Frame::data(reply.body)));
    }
    if let Some(trailers) = reply.trailers {
        frames.push(Ok(Frame::trailers(trailers)));
    }
    let mut response = Response::new(Body::new(StreamBody::new(futures_util::stream::iter(frames))));
    *response.headers_mut() = reply.headers;
    response
}

/// A stored answer without a gRPC status, as a gRPC status: its problem's code and detail (the
/// too-large marker RESOURCE_EXHAUSTED), else the code gRPC's HTTP mapping gives its status;
/// `idempotent-replayed` kept.
fn status_of_stored(reply: Reply) -> Response<Body> {
    let problem: serde_json::Value = serde_json::from_slice(&reply.body).unwrap_or_default();
    let kind = problem.get("type").and_then(serde_json::Value::as_str);
    let detail = problem.get("detail").and_then(serde_json::Value::as_str).unwrap_or("a stored answer");
    let code = match kind {
        Some(types::RESPONSE_TOO_LARGE) => Code::ResourceExhausted,
        _ => code_of_http(reply.status),
    };
    let mut response = Status::new(code, detail).into_http::<Body>();
    let headers = response.headers_mut();
    if let Some(kind) = kind.and_then(|k| HeaderValue::from_str(k).ok()) {
        headers.insert("idempotency-problem", kind);
    }
    if let Some(replayed) = reply.headers.get("idempotent-replayed") {
        headers.insert("idempotent-replayed", replayed.clone());
    }
    response
}

/// gRPC's mapping of an HTTP status it did not expect (doc/http-grpc-status-mapping.md).
fn code_of_http(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The layer's own answer as a gRPC status (trailers-only): the code each problem maps to, the
/// problem's `detail` as the message, its type as the `idempotency-problem` metadata, and where
/// HTTP sends `Retry-After` (in progress, lease lost: ABORTED; store unavailable: UNAVAILABLE)
/// `retry-after` in whole seconds and gRPC's own `grpc-retry-pushback-ms` (gRFC A6: a client
/// whose retry policy lists the code waits that long before its retry).
pub(crate) fn status_of(problem: &Problem) -> Response<Body> {
    let code = match problem.kind() {
        types::USER_MISSING => Code::Unauthenticated,
        types::IN_PROGRESS | types::LEASE_LOST => Code::Aborted,
        types::KEY_MISSING | types::KEY_INVALID | types::BODY_UNREADABLE | types::FINGERPRINT_LIMIT | types::MISMATCH => Code::InvalidArgument,
        types::FAILED | types::STREAMING => Code::FailedPrecondition,
        types::STORE_UNAVAILABLE => Code::Unavailable,
        types::BODY_TOO_LARGE | types::RESPONSE_TOO_LARGE => Code::ResourceExhausted,
        types::ENCODING_UNSUPPORTED => Code::Unimplemented,
        _ => Code::Internal,
    };
    let mut response: Response<Body> = Status::new(code, problem.message()).into_http();
    let headers = response.headers_mut();
    if let Ok(kind) = HeaderValue::from_str(problem.kind()) {
        headers.insert("idempotency-problem", kind);
    }
    if let Some(after) = problem.retry_after_hint() {
        headers.insert("retry-after", HeaderValue::from(after.as_secs().max(1)));
        headers.insert("grpc-retry-pushback-ms", HeaderValue::from(u64::try_from(after.as_millis()).unwrap_or(u64::MAX)));
    }
    if problem.kind() == types::ENCODING_UNSUPPORTED {
        headers.insert("grpc-accept-encoding", HeaderValue::from_static(encoding::READABLE));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn collected(response: Response<Body>) -> (HeaderMap, Bytes, Option<HeaderMap>) {
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned();
        (parts.headers, collected.to_bytes(), trailers)
    }

    #[test]
    fn a_trailers_only_error_keeps_its_metadata_in_the_trailers() {
        let status = Status::with_details_and_metadata(Code::NotFound, "no such card", Bytes::from_static(b"\x08\x05"), {
            let mut m = tonic::metadata::MetadataMap::new();
            m.insert("x-reason", "card-declined".parse().unwrap());
            m.insert_bin("x-trace-bin", tonic::metadata::MetadataValue::from_bytes(&[0, 159, 255]));
            m
        });
        let (parts, _) = status.into_http::<Body>().into_parts();
        let reply = Reply { status: StatusCode::OK, headers: parts.headers, body: Bytes::new(), trailers: None };
        let Ok(reply) = recorded::<()>(reply, 1024, false) else { panic!("recorded") };
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        let names: Vec<_> = reply.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type"]);
        let trailers = reply.trailers.expect("trailers");
        for name in ["grpc-status", "grpc-message", "grpc-status-details-bin", "x-reason", "x-trace-bin"] {
            assert!(trailers.contains_key(name), "{name} in {trailers:?}");
        }
    }

    #[test]
    fn a_refusal_to_retry_later_carries_the_pushback() {
        let problem = Problem::new(409, types::IN_PROGRESS, "In progress", "busy").retry_after(std::time::Duration::from_millis(1500));
        let response = status_of(&problem);
        let headers = response.headers();
        assert_eq!(headers.get("grpc-status").unwrap(), &(Code::Aborted as i32).to_string());
        assert_eq!((headers.get("retry-after").unwrap(), headers.get("grpc-retry-pushback-ms").unwrap()), (&HeaderValue::from(1u64), &HeaderValue::from(1500u64)));
        let refused = status_of(&Problem::new(415, types::ENCODING_UNSUPPORTED, "Unsupported grpc-encoding", "zstd"));
        assert_eq!(refused.headers().get("grpc-status").unwrap(), &(Code::Unimplemented as i32).to_string());
        assert_eq!(refused.headers().get("grpc-accept-encoding").unwrap(), encoding::READABLE);
        assert!(refused.headers().get("grpc-retry-pushback-ms").is_none());
    }

    #[tokio::test]
    async fn the_stored_too_large_marker_is_a_grpc_status() {
        let marker = idempotency_client::StoredResponse::too_large();
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
        let body = Bytes::from(marker.body.to_bytes());
        let reply = Reply { status: StatusCode::from_u16(marker.status).unwrap(), headers, body, trailers: None };
        let response = response_of(reply);
        assert_eq!(response.status(), StatusCode::OK);
        let (headers, body, _) = collected(response).await;
        assert_eq!(headers.get(CONTENT_TYPE).unwrap(), "application/grpc");
        assert_eq!(headers.get("grpc-status").unwrap(), &(Code::ResourceExhausted as i32).to_string());
        assert_eq!(headers.get("idempotency-problem").unwrap(), types::RESPONSE_TOO_LARGE);
        assert_eq!(headers.get("idempotent-replayed").unwrap(), "true");
        assert!(body.is_empty());
    }
}
