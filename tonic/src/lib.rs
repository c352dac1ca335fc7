//! `idempotency-tonic`: the idempotency layer for tonic gRPC servers, over idempotency-tower's
//! core: the same configuration ([`Builder`]) and rules as the HTTP layer, for unary gRPC
//! methods. The client is re-exported as [`client`]; a method writes through the request's
//! [`Connection`], taken with [`Connection::take`]`(request.extensions_mut())`.
//!
//! ```no_run
//! # use idempotency_tonic::GrpcLayer;
//! # fn demo(idem: idempotency_tonic::client::Idempotency) -> Result<(), Box<dyn std::error::Error>> {
//! let layer = GrpcLayer::in_transaction(idem)
//!     .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
//!     .build()?;
//! // tonic::transport::Server::builder().add_service(layer.layer(ChargesServer::new(service)))
//! # Ok(())
//! # }
//! ```
//!
//! - The key is the `idempotency-key` metadata (a bare token or an sf-string), or what
//!   [`Builder::key_from`] finds in the request, for instance Google AIP-155's
//!   `request_id` field: decode [`message`] of the body with your message type.
//! - The user is what [`Builder::user`] / [`Builder::user_from`] find in the
//!   metadata or in the extensions an authentication layer outside this one set.
//! - The operation is the method's path (`/charges.v1.Charges/Create`, prefixed `POST `).
//! - The first call's answer is stored: its initial metadata (the allow-listed headers), its
//!   message bytes and its trailers (`grpc-status`, `grpc-message`, `grpc-status-details-bin`
//!   and any others; an error answered "trailers-only" is stored with everything it carries as
//!   trailers, the metadata of `Status::with_metadata` and its `-bin` keys included), and
//!   replayed byte for byte with `idempotent-replayed: true` in the initial metadata.
//! - The status policy gets the HTTP status that the answer's gRPC code maps to, one table for
//!   every code (`codes.rs`, shown in docs/rust-client.md): the default remembers OK and the
//!   deterministic client errors (INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED,
//!   FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED) and releases the key on the codes of a
//!   call that did not complete (CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE, ABORTED,
//!   RESOURCE_EXHAUSTED, ALREADY_EXISTS) and the server faults (UNKNOWN, INTERNAL,
//!   UNIMPLEMENTED, DATA_LOSS).
//! - Compression (`encoding.rs`): a covered call is handled uncompressed. A gzip or deflate
//!   request is decompressed before the fingerprint and the key extractor read it (a retry that
//!   differs only in compression is the same request); the service answers uncompressed (the
//!   request reaches it without `grpc-accept-encoding`), so a replay decodes in any client.
//! - Every answer is a gRPC answer, in both modes (`answer.rs`): a stored answer that is not
//!   one (the two-phase too-large marker) is replayed as the status its problem stands for.
//! - gRPC's health and reflection services are never covered: a layer on every route lets them
//!   through.
//! - The layer's own answers are gRPC statuses (their message is the problem's `detail`, a
//!   `retry-after` metadata where HTTP has `Retry-After`): no or a bad key INVALID_ARGUMENT, no
//!   user UNAUTHENTICATED, **in progress ABORTED** (and lease lost: retry later; ABORTED is the
//!   code gRPC clients retry), **mismatch INVALID_ARGUMENT** (the request is wrong for this key:
//!   retrying it never helps), failed for good FAILED_PRECONDITION, store unavailable
//!   UNAVAILABLE, a body or answer over its limit RESOURCE_EXHAUSTED, a streaming RPC
//!   FAILED_PRECONDITION, a compression it cannot read UNIMPLEMENTED, anything else INTERNAL.
//! - Streaming RPCs are refused: a request of more than one message before anything is
//!   reserved, an answer of more than one message after the fact (not stored; the key released,
//!   in-transaction its writes rolled back), both FAILED_PRECONDITION with a message that says
//!   to leave the method out of the layer ([`problem::types::STREAMING`]).

mod answer;
mod codes;
mod encoding;
mod frame;

pub use idempotency_client as client;
pub use idempotency_tower::{default_status_policy, problem, Builder, ConfigError, Connection, Mode, Reply, Transaction, TransactionRejection, ANONYMOUS_USER};

use answer::{response_of, status_of};
use frame::frames;
pub use frame::message;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use idempotency_client::{postgres_by_default, Driver};
use idempotency_tower::adapter::{self, ready_then_call, Answer, Config, Head, Inner, MatchedRoute, Problem, ServiceRoute, Whole};
use idempotency_tower::problem::types;
use idempotency_tower::IdempotencyLayer;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::watch;
use tonic::body::Body;
use tower_service::Service;

postgres_by_default! {
/// The idempotency layer for tonic servers: a tower layer over a tonic service (a generated
/// `...Server`, or `Routes`), for its unary methods, per service
/// (`Server::builder().add_service(layer.layer(ChargesServer::new(svc)))`, its service keeps its
/// name) or for every route (`Server::builder().layer(layer)`). Built by the same [`Builder`] as
/// idempotency-tower's [`IdempotencyLayer`] (and made from one with `From`).
pub struct GrpcLayer<D: Driver = Postgres> {
    config: Arc<Config<D>>,
}
}

idempotency_tower::layer_builders!(GrpcLayer);

impl<D: Driver> From<IdempotencyLayer<D>> for GrpcLayer<D> {
    fn from(layer: IdempotencyLayer<D>) -> Self {
        GrpcLayer { config: layer.config().clone() }
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

impl<S, R, D> Service<Request<Body>> for GrpcService<S, D>
where
    D: Driver,
    S: Inner<Body, Response = Response<R>>,
    R: Whole + http_body::Body<Data = Bytes>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    /// Always ready, as the HTTP layer is (see the tower adapter): each call that reaches the inner
    /// service drives a clone of it to readiness first.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert(MatchedRoute(parts.uri.path().to_owned()));
        let header_key = match head(&self.config, &parts) {
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

/// gRPC's own services, which the layer never covers: health checking and server reflection
/// change nothing, carry no key, and stream (reflection, health's `Watch`), so a layer installed
/// on every route (`Server::builder().layer(..)`) lets them through as if it were not there.
const INFRASTRUCTURE: [&str; 3] = ["/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"];

/// The core's look at the head, gRPC's own services left out ([`INFRASTRUCTURE`]).
fn head<D: Driver>(config: &Config<D>, parts: &Parts) -> Head {
    match INFRASTRUCTURE.iter().any(|service| parts.uri.path().starts_with(service)) {
        true => Head::Uncovered,
        false => adapter::head(config, parts),
    }
}

/// A covered call: its message read, then the core.
async fn covered<S, R, D>(config: Arc<Config<D>>, inner: S, parts: Parts, body: Body, header_key: Option<String>) -> Result<Response<Body>, S::Error>
where
    D: Driver,
    S: Inner<Body, Response = Response<R>>,
    R: Whole + http_body::Body<Data = Bytes>,
{
    let bytes = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(status_of(&adapter::unreadable(&config, &parts, e.is::<LengthLimitError>(), &e))),
    };
    let mut parts = parts;
    let bytes = match encoding::identity_request(&mut parts.headers, bytes, config.body_limit) {
        Ok(bytes) => bytes,
        Err(unreadable) => return Ok(status_of(&encoding::refused(&config, &parts, &unreadable))),
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
    // The request rebuilt (the transaction in its extensions, where `tonic::Request::extensions`
    // finds it); the answer read as gRPC's (its status for the policy is the HTTP status its
    // code maps to).
    let route = ServiceRoute::new(inner.clone(), config.mode, gone);
    let call = move |p: Parts, b: Bytes, tx: Option<Transaction<D>>, limit: usize| {
        route.call::<Body, R, D>(Request::from_parts(p, Body::new(Full::new(b))), tx, limit, answer::recorded)
    };
    match adapter::serve(config, parts, bytes, header_key, call).await {
        Answer::Respond(reply) => Ok(response_of(reply)),
        Answer::Refuse(problem) => Ok(status_of(&problem)),
        Answer::ServiceError(e) => Err(e),
        Answer::PassThrough(parts, bytes) => Ok(ready_then_call(inner, Request::from_parts(parts, Body::new(Full::new(bytes)))).await?.map(Body::new)),
    }
}
