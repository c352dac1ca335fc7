//! The tonic adapter of the layer's core (feature `tonic`): the same
//! configuration ([`super::Builder`]) and rules as the HTTP layer, for unary gRPC methods.
//!
//! ```no_run
//! # use idempotency_client::layer::IdempotencyLayer;
//! # fn demo(idem: idempotency_client::Idempotency) -> Result<(), Box<dyn std::error::Error>> {
//! let layer = IdempotencyLayer::in_transaction(idem)
//!     .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
//!     .build()?
//!     .grpc();
//! // tonic::transport::Server::builder().add_service(layer.layer(ChargesServer::new(service)))
//! # Ok(())
//! # }
//! ```
//!
//! - The key is the `idempotency-key` metadata (a bare token or an sf-string), or what
//!   [`super::Builder::key_from`] finds in the request, for instance Google AIP-155's
//!   `request_id` field: decode [`message`] of the body with your message type.
//! - The user is what [`super::Builder::user`] / [`super::Builder::user_from`] find in the
//!   metadata or in the extensions an authentication layer outside this one set.
//! - The operation is the method's path (`/charges.v1.Charges/Create`, prefixed `POST `).
//! - The first call's answer is stored: its initial metadata (the allow-listed headers), its
//!   message bytes and its trailers (`grpc-status`, `grpc-message`, `grpc-status-details-bin`
//!   and any others; an error answered "trailers-only" is stored with its status as trailers),
//!   and replayed byte for byte with `idempotent-replayed: true` in the initial metadata.
//! - The status policy gets the HTTP status that the answer's gRPC code maps to (OK 200,
//!   INVALID_ARGUMENT 400, NOT_FOUND 404, ALREADY_EXISTS and ABORTED 409, RESOURCE_EXHAUSTED 429,
//!   UNAVAILABLE 503, INTERNAL 500, ...), so the default stores successes and permanent errors
//!   and releases the key on UNAVAILABLE, INTERNAL, ABORTED, ALREADY_EXISTS, RESOURCE_EXHAUSTED,
//!   DEADLINE_EXCEEDED and the other 5xx-like codes.
//! - The layer's own answers are gRPC statuses (their message is the problem's `detail`, a
//!   `retry-after` metadata where HTTP has `Retry-After`): no or a bad key INVALID_ARGUMENT, no
//!   user UNAUTHENTICATED, **in progress ABORTED** (and lease lost: retry later; ABORTED is the
//!   code gRPC clients retry), **mismatch INVALID_ARGUMENT** (the request is wrong for this key:
//!   retrying it never helps), failed for good FAILED_PRECONDITION, store unavailable
//!   UNAVAILABLE, a body or answer over its limit RESOURCE_EXHAUSTED, a streaming RPC
//!   FAILED_PRECONDITION, anything else INTERNAL.
//! - Streaming RPCs are refused: a request of more than one message before anything is
//!   reserved, an answer of more than one message after the fact (not stored; the key released,
//!   in-transaction its writes rolled back), both FAILED_PRECONDITION with a message that says
//!   to leave the method out of the layer ([`problem::types::STREAMING`](super::problem::types::STREAMING)).

use super::config::Config;
use super::core::{self, Answer, Failure, Head, Reply, RouteFuture};
use super::problem::{types, Problem};
use super::request::MatchedRoute;
use super::service::{ready_and_call, ready_then_call};
use super::transaction::Transaction;
use super::{IdempotencyLayer, Mode};
use crate::driver::{postgres_by_default, Driver};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited, StreamBody};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The message of a unary gRPC request or answer body: the bytes after its 5-byte frame header
/// (an uncompressed frame holding the whole body), for a [`super::Builder::key_from`] extractor
/// to decode (`CreateCharge::decode(message(body)?)`). `None` for a compressed frame or a body
/// that is not exactly one frame.
pub fn message(body: &[u8]) -> Option<&[u8]> {
    let (&[flag, a, b, c, d], rest) = body.split_first_chunk::<5>()?;
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    (flag == 0 && rest.len() == len).then_some(rest)
}

/// How many whole frames `body` holds; `None` when it is not a sequence of whole frames.
fn frames(mut body: &[u8]) -> Option<usize> {
    let mut count = 0;
    while !body.is_empty() {
        let (&[_, a, b, c, d], rest) = body.split_first_chunk::<5>()?;
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        body = rest.get(len..)?;
        count += 1;
    }
    Some(count)
}

impl<D: Driver> IdempotencyLayer<D> {
    /// The same layer for tonic: a tower layer over a tonic service (a generated `...Server`,
    /// or `Routes`), for its unary methods. See [`GrpcLayer`].
    pub fn grpc(self) -> GrpcLayer<D> {
        GrpcLayer { config: self.config }
    }
}

postgres_by_default! {
/// An [`IdempotencyLayer`] for tonic servers (feature `tonic`), from [`IdempotencyLayer::grpc`]:
/// per service (`Server::builder().add_service(layer.layer(ChargesServer::new(svc)))`, its
/// service keeps its name) or for every route (`Server::builder().layer(layer)`).
pub struct GrpcLayer<D: Driver = Postgres> {
    config: Arc<Config<D>>,
}
}

impl<D: Driver> Clone for GrpcLayer<D> {
    fn clone(&self) -> Self {
        GrpcLayer { config: self.config.clone() }
    }
}

impl<D: Driver> std::fmt::Debug for GrpcLayer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcLayer").field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl<S, D: Driver> tower_layer::Layer<S> for GrpcLayer<D> {
    type Service = GrpcService<S, D>;

    fn layer(&self, inner: S) -> GrpcService<S, D> {
        GrpcService { inner, config: self.config.clone() }
    }
}

postgres_by_default! {
/// An idempotent tonic service: what a [`GrpcLayer`] makes.
pub struct GrpcService<S, D: Driver = Postgres> {
    inner: S,
    config: Arc<Config<D>>,
}
}

impl<S: Clone, D: Driver> Clone for GrpcService<S, D> {
    fn clone(&self) -> Self {
        GrpcService { inner: self.inner.clone(), config: self.config.clone() }
    }
}

impl<S, D: Driver> std::fmt::Debug for GrpcService<S, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcService").field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl<S: tonic::server::NamedService, D: Driver> tonic::server::NamedService for GrpcService<S, D> {
    const NAME: &'static str = S::NAME;
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, R, D> Service<Request<Body>> for GrpcService<S, D>
where
    D: Driver,
    S: Service<Request<Body>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    /// Always ready, as the HTTP layer is ([`super::service`]): each call that reaches the inner
    /// service drives a clone of it to readiness first.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(MatchedRoute(parts.uri.path().to_owned()));
        let header_key = match core::head(&self.config, &parts) {
            Head::Uncovered | Head::PassThrough => {
                let called = ready_then_call(inner, Request::from_parts(parts, body));
                return Box::pin(async move { Ok(called.await?.map(Body::new)) });
            }
            Head::Refuse(problem) => return Box::pin(std::future::ready(Ok(status_of(&problem)))),
            Head::ReadBody(key) => key,
        };
        Box::pin(covered(self.config.clone(), inner, parts, body, header_key))
    }
}

/// A covered call: its message read, then the core.
async fn covered<S, R, D>(config: Arc<Config<D>>, inner: S, parts: Parts, body: Body, header_key: Option<String>) -> Result<Response<Body>, S::Error>
where
    D: Driver,
    S: Service<Request<Body>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let bytes = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(status_of(&core::unreadable(&config, &parts, e.is::<LengthLimitError>(), &e))),
    };
    if frames(&bytes).is_some_and(|n| n > 1) {
        let detail = format!(
            "idempotency layer: {} sent more than one message; the layer covers unary RPCs only, so leave streaming RPCs out of it (nothing was reserved)",
            parts.uri.path()
        );
        return Ok(status_of(&Problem::new(400, types::STREAMING, "Streaming RPC", detail)));
    }
    // Held until the core answers: dropped with this future, it tells the route to stop waiting.
    let (_present, gone) = watch::channel(());
    let route = GrpcRoute { inner: Arc::new(Mutex::new(inner.clone())), mode: config.mode, gone };
    let call = move |p: Parts, b: Bytes, tx: Option<Transaction<D>>, limit: usize| route.call::<R, D>(p, b, tx, limit);
    match core::serve(config, parts, bytes, header_key, call).await {
        Answer::Respond(reply) => Ok(response_of(reply)),
        Answer::Refuse(problem) => Ok(status_of(&problem)),
        Answer::ServiceError(e) => Err(e),
        Answer::PassThrough(parts, bytes) => Ok(ready_then_call(inner, Request::from_parts(parts, Body::new(Full::new(bytes)))).await?.map(Body::new)),
    }
}

/// The inner service as the core's route.
struct GrpcRoute<S> {
    inner: Arc<Mutex<S>>,
    mode: Mode,
    /// Ends when the request's future is dropped ([`ready_and_call`]).
    gone: watch::Receiver<()>,
}

impl<S> Clone for GrpcRoute<S> {
    fn clone(&self) -> Self {
        GrpcRoute { inner: self.inner.clone(), mode: self.mode, gone: self.gone.clone() }
    }
}

impl<S> GrpcRoute<S> {
    /// Calls a clone of the inner service, driven to readiness, with the request rebuilt (the transaction in its
    /// extensions, where `tonic::Request::extensions` finds it) and reads the answer: its status
    /// for the policy is the HTTP status its gRPC code maps to.
    fn call<R, D>(&self, parts: Parts, body: Bytes, tx: Option<Transaction<D>>, limit: usize) -> RouteFuture<S::Error>
    where
        D: Driver,
        S: Service<Request<Body>, Response = Response<R>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        R: http_body::Body<Data = Bytes> + Send + 'static,
        R::Error: Into<BoxError>,
    {
        let mut req = Request::from_parts(parts, Body::new(Full::new(body)));
        if let Some(tx) = tx {
            req.extensions_mut().insert(tx);
        }
        let service = match self.inner.lock() {
            Ok(inner) => inner.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let (effect_stands, gone) = (self.mode == Mode::TwoPhase, self.gone.clone());
        Box::pin(async move {
            let response = ready_and_call(service, req, gone).await?;
            let mut reply = super::service::reply_of(response, limit, effect_stands).await?;
            if frames(&reply.body).is_some_and(|n| n > 1) {
                return Err(Failure::Streaming);
            }
            // A trailers-only answer (an error) carries its status in the headers: store it as
            // trailers, which every client reads the same way.
            if reply.headers.contains_key(GRPC_STATUS) {
                let trailers = reply.trailers.get_or_insert_with(HeaderMap::new);
                for name in [GRPC_STATUS, GRPC_MESSAGE, GRPC_STATUS_DETAILS] {
                    if let Some(value) = reply.headers.remove(&name) {
                        trailers.insert(name, value);
                    }
                }
            }
            let code = reply.trailers.as_ref().and_then(|t| t.get(GRPC_STATUS)).and_then(|v| v.to_str().ok()?.parse::<i32>().ok());
            reply.status = http_equivalent(Code::from_i32(code.unwrap_or(Code::Unknown as i32)));
            Ok(reply)
        })
    }
}

/// The HTTP status a gRPC code maps to (Google's mapping), for the status policy and the
/// stored form.
pub(crate) fn http_equivalent(code: Code) -> StatusCode {
    let status = match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::Unauthenticated => 401,
        Code::PermissionDenied => 403,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::DeadlineExceeded => 504,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    };
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The gRPC answer of a stored or live reply: HTTP 200, its initial metadata, its message, its
/// trailers.
fn response_of(reply: Reply) -> Response<Body> {
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

/// The layer's own answer as a gRPC status.
fn status_of(problem: &Problem) -> Response<Body> {
    let code = match problem.kind() {
        types::USER_MISSING => Code::Unauthenticated,
        types::IN_PROGRESS | types::LEASE_LOST => Code::Aborted,
        types::KEY_MISSING | types::KEY_INVALID | types::BODY_UNREADABLE | types::FINGERPRINT_LIMIT | types::MISMATCH => Code::InvalidArgument,
        types::FAILED | types::STREAMING => Code::FailedPrecondition,
        types::STORE_UNAVAILABLE => Code::Unavailable,
        types::BODY_TOO_LARGE | types::RESPONSE_TOO_LARGE => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    let mut response: Response<Body> = Status::new(code, problem.message()).into_http();
    let headers = response.headers_mut();
    if let Ok(kind) = HeaderValue::from_str(problem.kind()) {
        headers.insert("idempotency-problem", kind);
    }
    if let Some(after) = problem.retry_after_hint() {
        headers.insert("retry-after", HeaderValue::from(after.as_secs().max(1)));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_messages() {
        let one = [&[0u8, 0, 0, 0, 2][..], b"hi"].concat();
        assert_eq!(message(&one), Some(&b"hi"[..]));
        assert_eq!(frames(&one), Some(1));
        let two = [one.clone(), one.clone()].concat();
        assert_eq!((message(&two), frames(&two)), (None, Some(2)));
        assert_eq!(frames(&one[..4]), None);
        assert_eq!(message(&[1, 0, 0, 0, 0]), None, "a compressed frame");
        assert_eq!(frames(b""), Some(0));
    }

    #[test]
    fn codes_map_to_the_statuses_the_policy_reads() {
        let policy = crate::layer::default_status_policy;
        use crate::Verdict::{Failure, Success, Transient};
        for (code, verdict) in [
            (Code::Ok, Success),
            (Code::InvalidArgument, Failure),
            (Code::NotFound, Failure),
            (Code::FailedPrecondition, Failure),
            (Code::Aborted, Transient),
            (Code::Unavailable, Transient),
            (Code::Internal, Transient),
            (Code::ResourceExhausted, Transient),
        ] {
            assert_eq!(policy(http_equivalent(code).as_u16()), verdict, "{code:?}");
        }
    }
}
