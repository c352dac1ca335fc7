//! The tower adapter of the layer's core: read the body, hand the core the route
//! (the inner service), answer with its response type.
//!
//! tower's readiness contract: a service is called only after its `poll_ready` said ready, and
//! the readiness belongs to the instance that was polled. The layer does not know, when it is
//! polled, whether a request will reach the inner service at all (a replay, a refusal, a
//! duplicate in progress never does), so it is always ready itself and drives a clone of the
//! inner service to readiness each time it calls it ([`ready_and_call`]): replays never wait for
//! the inner service, and middleware below the layer (`ConcurrencyLimit`, `Buffer`, `RateLimit`,
//! `LoadShed`) bounds exactly the calls that run the handler.

use crate::config::Config;
use crate::core::{self, Answer, Failure, Head, RouteFuture};
use crate::layer::IdempotencyLayer;
use crate::mode::Mode;
use crate::reply::Reply;
use crate::transaction::Transaction;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::sync::watch;
use idempotency_client::{postgres_by_default, Driver};
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The inner service of a route as every tower adapter (this crate's, idempotency-tonic's)
/// calls it: cloned per call, the clone and its future sent to the core's task. The bounds,
/// written once.
pub trait Inner<B>: Service<Request<B>, Future: Send + 'static, Error: Send + 'static> + Clone + Send + 'static {}

impl<S, B> Inner<B> for S where S: Service<Request<B>, Future: Send + 'static, Error: Send + 'static> + Clone + Send + 'static {}

/// A body the layer reads whole (a request's, a response's): its frames sent across tasks, its
/// error boxed.
pub trait Whole: Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

impl<T> Whole for T where T: Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

postgres_by_default! {
/// An idempotent route: the service [`IdempotencyLayer`] makes.
pub struct IdempotencyService<S, D: Driver = Postgres> {
    inner: S,
    config: Arc<Config<D>>,
}
}

impl<S, D: Driver> tower_layer::Layer<S> for IdempotencyLayer<D> {
    type Service = IdempotencyService<S, D>;

    fn layer(&self, inner: S) -> IdempotencyService<S, D> {
        IdempotencyService { inner, config: self.config().clone() }
    }
}

impl<S: Clone, D: Driver> Clone for IdempotencyService<S, D> {
    fn clone(&self) -> Self {
        IdempotencyService { inner: self.inner.clone(), config: self.config.clone() }
    }
}

impl<S, D: Driver> std::fmt::Debug for IdempotencyService<S, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService").field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl<S, B, R, D> Service<Request<B>> for IdempotencyService<S, D>
where
    D: Driver,
    S: Inner<B, Response = Response<R>>,
    B: Whole + From<Bytes>,
    R: Whole + From<Bytes>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    /// Always ready: each call that reaches the inner service drives a clone of it to
    /// readiness first (see the module's docs), and a readiness error is that call's error.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        #[cfg_attr(not(feature = "axum"), allow(unused_mut))]
        let (mut parts, body) = req.into_parts();
        #[cfg(feature = "axum")]
        crate::axum_adapter::match_route(&mut parts);
        let header_key = match core::head(&self.config, &parts) {
            Head::Uncovered | Head::PassThrough => return Box::pin(ready_then_call(inner, Request::from_parts(parts, body))),
            Head::Refuse(problem) => return Box::pin(std::future::ready(Ok(problem.into_response()))),
            Head::ReadBody(key) => key,
        };
        Box::pin(covered(self.config.clone(), inner, parts, body, header_key))
    }
}

/// A covered request: its body read, then the core.
async fn covered<S, B, R, D>(config: Arc<Config<D>>, inner: S, parts: Parts, body: B, header_key: Option<String>) -> Result<Response<R>, S::Error>
where
    D: Driver,
    S: Inner<B, Response = Response<R>>,
    B: Whole + From<Bytes>,
    R: Whole + From<Bytes>,
{
    let bytes = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Ok(core::unreadable(&config, &parts, e.is::<LengthLimitError>(), &e).into_response()),
    };
    // Held until the core answers: dropped with this future, it tells the route to stop waiting.
    let (_present, gone) = watch::channel(());
    let route = ServiceRoute::new(inner.clone(), config.mode, gone);
    let call = move |p, b, tx, limit| route.call(Request::from_parts(p, B::from(b)), tx, limit, |reply, _, _| Ok(reply));
    match core::serve(config, parts, bytes, header_key, call).await {
        Answer::Respond(reply) => Ok(reply.into_response()),
        Answer::Refuse(problem) => Ok(problem.into_response()),
        Answer::ServiceError(e) => Err(e),
        Answer::PassThrough(parts, bytes) => ready_then_call(inner, Request::from_parts(parts, B::from(bytes))).await,
    }
}

/// Drives `service` to readiness, then calls it: a request the layer passes through.
pub async fn ready_then_call<S: Service<Req>, Req>(mut service: S, req: Req) -> Result<S::Response, S::Error> {
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(req).await
}

/// Drives `service` (a clone of the inner service) to readiness, then calls it: every call of a
/// route. A readiness error is the route's service error (the key is released, the error
/// answered). While the service is not ready, a dropped request (`gone`: its sender dropped
/// with the adapter's future, a `Timeout` above the layer, a client gone) ends the wait with
/// [`Failure::Gone`]: the inner service is not called and the key is released. Once it is
/// ready, the call runs to its end in the core's task whatever happens to the request.
pub async fn ready_and_call<S: Service<Req>, Req>(mut service: S, req: Req, mut gone: watch::Receiver<()>) -> Result<S::Response, Failure<S::Error>> {
    tokio::select! {
        biased;
        ready = std::future::poll_fn(|cx| service.poll_ready(cx)) => ready.map_err(Failure::Service)?,
        // Nothing is ever sent: this ends only when the request's sender is dropped.
        _ = gone.changed() => return Err(Failure::Gone),
    }
    service.call(req).await.map_err(Failure::Service)
}

/// The inner service as the core's route, for every adapter over tower (this crate's, and
/// idempotency-tonic's): a clone of it is driven to readiness and called for each call of the
/// route, and its answer read.
pub struct ServiceRoute<S> {
    inner: Arc<Mutex<S>>,
    mode: Mode,
    /// Ends when the request's future is dropped ([`ready_and_call`]).
    gone: watch::Receiver<()>,
}

impl<S> Clone for ServiceRoute<S> {
    fn clone(&self) -> Self {
        ServiceRoute { inner: self.inner.clone(), mode: self.mode, gone: self.gone.clone() }
    }
}

/// What a route's answer goes through once read (`limit`, whether the effect stands): gRPC's
/// checks of a unary answer, nothing over HTTP.
pub type Finish<SE> = fn(Reply, usize, bool) -> Result<Reply, Failure<SE>>;

impl<S> ServiceRoute<S> {
    /// The route over `inner` in `mode`; `gone` ends when the request's future is dropped.
    pub fn new(inner: S, mode: Mode, gone: watch::Receiver<()>) -> Self {
        ServiceRoute { inner: Arc::new(Mutex::new(inner)), mode, gone }
    }

    /// Calls a clone of the inner service, driven to readiness, with `req` (the transaction put
    /// in its extensions), reads the response up to `limit` bytes, and passes it to `finish`.
    pub fn call<B, R, D>(&self, mut req: Request<B>, tx: Option<Transaction<D>>, limit: usize, finish: Finish<S::Error>) -> RouteFuture<S::Error>
    where
        D: Driver,
        S: Inner<B, Response = Response<R>>,
        B: Send + 'static,
        R: Whole,
    {
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
            finish(reply_of(response, limit, effect_stands).await?, limit, effect_stands)
        })
    }
}

/// Reads an HTTP response up to `limit` bytes, with its trailers.
pub async fn reply_of<R, SE>(response: Response<R>, limit: usize, effect_stands: bool) -> Result<Reply, Failure<SE>>
where
    R: Body,
    R::Error: Into<BoxError>,
{
    let (parts, body) = response.into_parts();
    let collected = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected,
        Err(e) if e.is::<LengthLimitError>() => return Err(Failure::TooLarge { limit, effect_stands }),
        Err(e) => return Err(Failure::Body(e)),
    };
    let trailers = collected.trailers().cloned();
    Ok(Reply { status: parts.status, headers: parts.headers, body: collected.to_bytes(), trailers })
}
