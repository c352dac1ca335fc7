//! [`Reply`]: an answer as the layer reads, stores and replays it, whatever the stack. Plain data:
//! every other module of the layer may use it, it uses none of them.

use bytes::Bytes;
use http::header::HeaderMap;
use http::{Response, StatusCode};

/// An answer as the layer reads, stores and replays it, whatever the stack: the status, the
/// headers, the whole body and the trailers (a gRPC answer's `grpc-status` and `grpc-message`).
/// A [`Builder::on_replay`](crate::Builder::on_replay) hook gets the replayed one.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status (over gRPC, the HTTP status of the response: 200).
    pub status: StatusCode,
    /// The headers (over gRPC, the initial metadata). A replay carries the stored ones and
    /// `Idempotent-Replayed: true`.
    pub headers: HeaderMap,
    /// The body's bytes.
    pub body: Bytes,
    /// The trailers, when the answer had any.
    pub trailers: Option<HeaderMap>,
}

impl Reply {
    /// Whether this answer is a replay of a stored one.
    pub fn is_replayed(&self) -> bool {
        self.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
    }

    /// The HTTP response with any body built from bytes (the trailers are left out: such a body
    /// cannot carry them).
    pub fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}
