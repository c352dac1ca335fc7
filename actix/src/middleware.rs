//! The actix-web adapter of idempotency-tower's core: the middleware `.wrap(layer)` makes. It
//! reads the body, hands the core a route to call on the request's own thread, and answers with
//! an actix-web response.
//!
//! actix-web runs a request on one worker thread and its futures are not `Send`; the layer's
//! flow runs in a task of its own (as with tower), and calls the route back on the request's own
//! thread. The extractors see the request's method, URI (the match pattern, `/charges/{id}`, is
//! the operation), and headers. As with tower, a covered request runs to its end in a task of its
//! own (on its worker): a client that hangs up does not cancel the route, and its retry replays.

use crate::layer::IdempotencyLayer;
use crate::respond::response_of;
use actix_web::body::{to_bytes_limited, EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use bytes::{Bytes, BytesMut};
use futures_util::future::LocalBoxFuture;
use futures_util::{FutureExt, StreamExt};
use http::request::Parts;
use idempotency_client::{postgres_by_default, Driver};
use idempotency_tower::adapter::{self, panic_message, Answer, Config, Failure, Head, MatchedRoute, RouteFuture};
use idempotency_tower::{Mode, Reply, Transaction};
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

impl<S, B, D> Transform<S, ServiceRequest> for IdempotencyLayer<D>
where
    D: Driver,
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = IdempotencyMiddleware<S, D>;
    type InitError = ();
    type Future = std::future::Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        std::future::ready(Ok(IdempotencyMiddleware { inner: Rc::new(service), config: self.0.config().clone() }))
    }
}

postgres_by_default! {
/// An idempotent actix-web service: what `.wrap(layer)` makes of a resource or scope.
pub struct IdempotencyMiddleware<S, D: Driver = Postgres> {
    inner: Rc<S>,
    config: Arc<Config<D>>,
}
}

impl<S, B, D> Service<ServiceRequest> for IdempotencyMiddleware<S, D>
where
    D: Driver,
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(inner);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let inner = self.inner.clone();
        let Some(parts) = head_of(&req) else {
            return Box::pin(async move { Ok(inner.call(req).await?.map_into_left_body()) });
        };
        let header_key = match adapter::head(&self.config, &parts) {
            Head::Uncovered | Head::PassThrough => return Box::pin(async move { Ok(inner.call(req).await?.map_into_left_body()) }),
            Head::Refuse(problem) => {
                return Box::pin(std::future::ready(Ok(req.into_response(response_of(problem.into_reply())).map_into_right_body())));
            }
            Head::ReadBody(key) => key,
        };
        // The request runs to its end in a task of its own on this worker: when actix-web drops
        // this future (its client hung up), the route still finishes and the key is completed
        // (or released), so the client's retry replays.
        let (done, answer) = oneshot::channel();
        actix_web::rt::spawn(covered(self.config.clone(), inner, req, parts, header_key, done));
        Box::pin(async move {
            answer.await.unwrap_or_else(|_| Err(actix_web::error::ErrorInternalServerError("the idempotent request's task ended without an answer")))
        })
    }
}

/// One call of the route the flow asks for, sent to the request's thread.
struct Call<D: Driver> {
    body: Bytes,
    tx: Option<Transaction<D>>,
    limit: usize,
    answer: oneshot::Sender<Result<Reply, Failure<()>>>,
}

/// What a covered request ends with.
type Answered<B> = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

/// A covered request, in its own task: its answer sent to `done` (nobody may be waiting).
async fn covered<S, B, D>(config: Arc<Config<D>>, inner: Rc<S>, req: ServiceRequest, parts: Parts, header_key: Option<String>, done: oneshot::Sender<Answered<B>>)
where
    D: Driver,
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    let _ = done.send(answer(config, inner, req, parts, header_key).await);
}

/// A covered request: its body read, the flow run while this thread serves its calls of the
/// route.
async fn answer<S, B, D>(config: Arc<Config<D>>, inner: Rc<S>, mut req: ServiceRequest, parts: Parts, header_key: Option<String>) -> Answered<B>
where
    D: Driver,
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    let body = match read(req.take_payload(), config.body_limit).await {
        Ok(body) => body,
        Err(Unread::TooLarge) => {
            let problem = adapter::unreadable(&config, &parts, true, &"over the limit");
            return Ok(req.into_response(response_of(problem.into_reply())).map_into_right_body());
        }
        Err(Unread::Broken(e)) => {
            let problem = adapter::unreadable(&config, &parts, false, &e);
            return Ok(req.into_response(response_of(problem.into_reply())).map_into_right_body());
        }
    };
    let (request, _) = req.into_parts();
    let local = Local { inner, request: RefCell::new(Some(request)), error: RefCell::new(None), mode: config.mode };
    let (calls, mut asked) = mpsc::unbounded_channel::<Call<D>>();
    let route = move |_: Parts, body: Bytes, tx: Option<Transaction<D>>, limit: usize| -> RouteFuture<()> {
        let calls = calls.clone();
        Box::pin(async move {
            let (answer, answered) = oneshot::channel();
            calls.send(Call { body, tx, limit, answer }).map_err(|_| Failure::Gone)?;
            answered.await.map_err(|_| Failure::Gone)?
        })
    };
    let serve = adapter::serve(config, parts, body, header_key, route);
    tokio::pin!(serve);
    let answer = loop {
        tokio::select! {
            answer = &mut serve => break answer,
            Some(call) = asked.recv() => {
                let result = local.route(call.body, call.tx, call.limit).await;
                let _ = call.answer.send(result);
            }
        }
    };
    let request = local.request.borrow_mut().take();
    match answer {
        Answer::Respond(reply) => answered(request, response_of(reply)),
        Answer::Refuse(problem) => answered(request, response_of(problem.into_reply())),
        Answer::ServiceError(()) => {
            Err(local.error.borrow_mut().take().unwrap_or_else(|| actix_web::error::ErrorInternalServerError("the idempotent route failed")))
        }
        Answer::PassThrough(_, body) => match request {
            Some(request) => Ok(local.inner.call(ServiceRequest::from_parts(request, Payload::from(body))).await?.map_into_left_body()),
            None => Err(actix_web::error::ErrorInternalServerError("the idempotent route lost its request")),
        },
    }
}

/// The answer as the request's response. A route that panicked or failed kept the request (actix
/// gives it back only with a response): the answer then travels as an error whose response it is,
/// which actix-web sends as it is.
fn answered<B>(request: Option<HttpRequest>, response: HttpResponse) -> Result<ServiceResponse<EitherBody<B>>, actix_web::Error> {
    match request {
        Some(request) => Ok(ServiceResponse::new(request, response).map_into_right_body()),
        None => Err(actix_web::error::InternalError::from_response("idempotency layer answer", response).into()),
    }
}

/// The request's side of the flow: the inner service, the request (owned alone, as actix-web
/// requires, between the route's calls) and the route's own error, kept here (it is not `Send`).
struct Local<S> {
    inner: Rc<S>,
    request: RefCell<Option<HttpRequest>>,
    error: RefCell<Option<actix_web::Error>>,
    mode: Mode,
}

impl<S> Local<S> {
    /// Calls the inner service with the body (and the transaction in the request's extensions)
    /// and reads its response up to `limit` bytes, catching a panic.
    async fn route<B, D>(&self, body: Bytes, tx: Option<Transaction<D>>, limit: usize) -> Result<Reply, Failure<()>>
    where
        D: Driver,
        S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
        B: MessageBody + 'static,
    {
        let Some(request) = self.request.borrow_mut().take() else { return Err(Failure::Gone) };
        if let Some(tx) = tx {
            request.extensions_mut().insert(tx);
        }
        let called = AssertUnwindSafe(self.inner.call(ServiceRequest::from_parts(request, Payload::from(body)))).catch_unwind().await;
        let response = match called {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                *self.error.borrow_mut() = Some(e);
                return Err(Failure::Service(()));
            }
            Err(panic) => return Err(Failure::Panicked(panic_message(panic.as_ref()))),
        };
        let (request, response) = response.into_parts();
        request.extensions_mut().remove::<Transaction<D>>();
        *self.request.borrow_mut() = Some(request);
        let (head, body) = response.into_parts();
        let bytes = match to_bytes_limited(body, limit).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(e)) => return Err(Failure::Body(e.into().to_string().into())),
            Err(_) => return Err(Failure::TooLarge { limit, effect_stands: self.mode == Mode::TwoPhase }),
        };
        let status = http::StatusCode::from_u16(head.status().as_u16()).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut headers = http::HeaderMap::new();
        for (name, value) in head.headers() {
            if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name.as_str().as_bytes()), http::HeaderValue::from_bytes(value.as_bytes())) {
                headers.append(name, value);
            }
        }
        Ok(Reply { status, headers, body: bytes, trailers: None })
    }
}

/// The request's head as the core reads it (its match pattern as the matched route); `None`
/// for a method or URI the `http` crate does not take (passed through).
fn head_of(req: &ServiceRequest) -> Option<Parts> {
    let mut builder = http::Request::builder()
        .method(http::Method::from_bytes(req.method().as_str().as_bytes()).ok()?)
        .uri(req.uri().to_string());
    for (name, value) in req.headers() {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    let (mut parts, ()) = builder.body(()).ok()?.into_parts();
    if let Some(pattern) = req.match_pattern() {
        parts.extensions.insert(MatchedRoute(pattern));
    }
    Some(parts)
}

/// Why the request body was not read.
enum Unread {
    TooLarge,
    Broken(actix_web::error::PayloadError),
}

/// The request body, up to `limit` bytes.
async fn read(mut payload: Payload, limit: usize) -> Result<Bytes, Unread> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(Unread::Broken)?;
        if body.len() + chunk.len() > limit {
            return Err(Unread::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}
