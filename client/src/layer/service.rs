//! The service the layer wraps around a route: read the key and the body, then run the route in
//! one of the two modes and answer.

use super::config::Config;
use super::key_header::{self, KeyHeader};
use super::observe::Observed;
use crate::Decision as Seen;
use super::problem::{types, Problem};
use super::record::HttpRecord;
use super::transaction::Transaction;
use super::Mode;
use crate::driver::{DefaultDriver, Driver};
use crate::{Error, Fingerprint, HandlerError, Key, Outcome, TxFuture};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower_service::Service;
use tracing::Instrument;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An idempotent route: the service [`super::IdempotencyLayer`] makes.
pub struct IdempotencyService<S, D: Driver = DefaultDriver> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config<D>>,
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
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    R: Body + From<Bytes> + Send + 'static,
    R::Data: Send,
    R::Error: Into<BoxError>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if !self.config.methods.contains(req.method()) {
            return Box::pin(inner.call(req));
        }
        Box::pin(covered(self.config.clone(), inner, req))
    }
}

/// A request of a covered method.
async fn covered<S, B, R, D>(config: Arc<Config<D>>, mut inner: S, req: Request<B>) -> Result<Response<R>, S::Error>
where
    D: Driver,
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    R: Body + From<Bytes> + Send + 'static,
    R::Data: Send,
    R::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let raw_key = match key_header::parse(parts.headers.get_all(&config.header)) {
        KeyHeader::Key(key) => key,
        KeyHeader::Missing if !config.require_key => {
            tracing::debug!(header = config.header.as_str(), "no idempotency key: passed through");
            return inner.call(Request::from_parts(parts, body)).await;
        }
        KeyHeader::Missing => {
            let detail = format!("this request needs an {} header", config.header);
            return reject(&config, &parts, Problem::new(400, types::KEY_MISSING, "Idempotency key missing", detail));
        }
        KeyHeader::Malformed(rule) => {
            return reject(&config, &parts, Problem::new(400, types::KEY_INVALID, "Invalid idempotency key", rule));
        }
    };
    let operation = super::request::operation(&config, &parts);
    let observed = Observed::start(&operation, config.mode.label());
    observed.key(&raw_key, config.log_keys);
    let Some(user) = super::request::user(&config, &parts) else {
        let detail = "the idempotency scope found no user for this request";
        return Ok(observed.reject(Problem::new(401, types::USER_MISSING, "No user", detail)));
    };
    let key = match Key::new(operation, user, raw_key) {
        Ok(key) => key,
        Err(e) => return Ok(observed.reject(Problem::new(400, types::KEY_INVALID, "Invalid idempotency key", e.to_string()))),
    };
    let bytes = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            let detail = format!("the body is larger than {} bytes", config.body_limit);
            return Ok(observed.reject(Problem::new(413, types::BODY_TOO_LARGE, "Request body too large", detail)));
        }
        Err(e) => return Ok(observed.reject(Problem::new(400, types::BODY_UNREADABLE, "Request body unreadable", e.to_string()))),
    };
    let fingerprint = super::request::fingerprint(&config, &parts, &bytes);

    // The route runs to its end in a task of its own, so a client that disconnects does not
    // cancel it half-way: the key is completed (or released) and the client's retry replays.
    let run = {
        let config = config.clone();
        async move {
            match config.mode {
                Mode::InTransaction => in_transaction(&config, inner, key, fingerprint, parts, bytes).await,
                Mode::TwoPhase => {
                    let req = Request::from_parts(parts, B::from(bytes));
                    two_phase(&config, inner, key, fingerprint, req).await
                }
            }
        }
        .instrument(observed.span().clone())
    };
    let answer = match tokio::spawn(run).await {
        Ok(answer) => answer,
        Err(e) => {
            let problem = Problem::new(500, types::INTERNAL, "Internal error", format!("the idempotency task failed: {e}"));
            Answer::Respond(problem.into_response(), Seen::Error)
        }
    };
    match answer {
        Answer::Respond(response, outcome) => {
            observed.finish(outcome, response.status().as_u16());
            Ok(response)
        }
        Answer::ServiceError(e, outcome) => {
            observed.finish(outcome, 500);
            Err(e)
        }
    }
}

/// Answers a request refused before it was identified (no key, a malformed one).
fn reject<R: From<Bytes>, SE, D: Driver>(config: &Config<D>, parts: &http::request::Parts, problem: Problem) -> Result<Response<R>, SE> {
    let operation = super::request::operation(config, parts);
    Ok(Observed::start(&operation, config.mode.label()).reject(problem))
}

/// How a covered request ends.
enum Answer<R, SE> {
    Respond(Response<R>, Seen),
    /// The route's own service error (the key was released).
    ServiceError(SE, Seen),
}

/// Why the route produced no response to record.
enum Failure<SE> {
    Service(SE),
    Panicked(String),
    Body(BoxError),
}

impl<SE> std::fmt::Display for Failure<SE> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Service(_) => f.write_str("the route's service failed"),
            Failure::Panicked(message) => write!(f, "the handler panicked: {message}"),
            Failure::Body(e) => write!(f, "the response body failed: {e}"),
        }
    }
}

/// Every route failure is transient: the key is released and the client's retry runs again.
impl<SE> HandlerError for Failure<SE> {}

/// Calls the route and reads its whole response, catching a panic.
async fn produce<S, B, R, D: Driver>(config: &Config<D>, mut inner: S, req: Request<B>) -> Result<HttpRecord, Failure<S::Error>>
where
    S: Service<Request<B>, Response = Response<R>>,
    R: Body,
    R::Error: Into<BoxError>,
{
    let run = async {
        let response = inner.call(req).await.map_err(Failure::Service)?;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.map_err(|e| Failure::Body(e.into()))?.to_bytes();
        let verdict = (config.policy)(parts.status.as_u16());
        Ok(HttpRecord::new(parts.status, parts.headers, bytes, &config.stored_headers, verdict))
    };
    match AssertUnwindSafe(run).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            tracing::error!(panic = message.as_str(), "the idempotent handler panicked; the key is released");
            Err(Failure::Panicked(message))
        }
    }
}

/// In-transaction: `run`, with the route as its work: the route gets the transaction in its
/// request's extensions, and its response is stored with its writes. (A retry of the whole
/// transaction after 40001 / 40P01 calls the route again with the same request.)
async fn in_transaction<S, B, R, D: Driver>(
    config: &Arc<Config<D>>,
    inner: S,
    key: Key,
    fingerprint: Fingerprint,
    parts: http::request::Parts,
    bytes: Bytes,
) -> Answer<R, S::Error>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    R: Body + From<Bytes> + Send + 'static,
    R::Data: Send,
    R::Error: Into<BoxError>,
{
    let route = config.clone();
    let work = work_fn::<D, _, _, _>(move |tx: &mut D::Tx| {
        let shared = D::share(tx);
        let mut req = Request::from_parts(parts.clone(), B::from(bytes.clone()));
        req.extensions_mut().insert(Transaction::<D>(shared.clone()));
        let (config, inner) = (route.clone(), inner.clone());
        Box::pin(async move {
            let produced = produce(&config, inner, req).await;
            D::unshare(tx, shared);
            produced
        }) as TxFuture<'_, HttpRecord, Failure<S::Error>>
    });
    answer_of(config, config.idem.run_tx(&key, &fingerprint, work).await)
}

/// Gives a closure the higher-ranked signature of a flow's work.
fn work_fn<D: Driver, T, E, F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E>>(f: F) -> F {
    f
}

/// Two-phase: reserve with a lease, run the route while the lease is heartbeaten, then complete.
async fn two_phase<S, B, R, D: Driver>(config: &Config<D>, inner: S, key: Key, fingerprint: Fingerprint, req: Request<B>) -> Answer<R, S::Error>
where
    S: Service<Request<B>, Response = Response<R>> + Send,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Send,
    R: Body + From<Bytes> + Send,
    R::Data: Send,
    R::Error: Into<BoxError>,
{
    let result = config.idem.run_external(&key, &fingerprint, produce(config, inner, req), nothing_local).await;
    answer_of(config, result)
}

/// The two-phase layer records nothing locally but the key.
fn nothing_local<'t, C: ?Sized, E: Send + 'static>(_: &'t mut C, _: &'t HttpRecord) -> TxFuture<'t, (), E> {
    Box::pin(std::future::ready(Ok(())))
}

/// Maps a flow's result to the answer.
fn answer_of<R: From<Bytes>, SE, D: Driver>(config: &Config<D>, result: Result<Outcome<HttpRecord>, Error<Failure<SE>>>) -> Answer<R, SE> {
    match result {
        Ok(outcome) => {
            let decision = outcome.decision();
            Answer::Respond(outcome.into_inner().into_response(), decision)
        }
        Err(e) => error_answer(config, e),
    }
}

fn error_answer<R: From<Bytes>, SE, D: Driver>(config: &Config<D>, e: Error<Failure<SE>>) -> Answer<R, SE> {
    let status = super::http::http_status(&e);
    let after = super::http::retry_after(&e, config.idem.settings().retry_after);
    let outcome = e.decision();
    let (kind, title, detail) = match e {
        Error::Failed { response: Some(stored) } => match serde_json::from_value::<HttpRecord>(stored) {
            Ok(record) => return Answer::Respond(record.into_response(), outcome),
            Err(e) => {
                let problem = Problem::new(500, types::INTERNAL, "Internal error", format!("the stored response does not decode: {e}"));
                return Answer::Respond(problem.into_response(), Seen::Error);
            }
        },
        Error::Failed { response: None } => (types::FAILED, "Request failed", "an earlier attempt with this key failed for good".to_owned()),
        Error::InProgress { .. } => (types::IN_PROGRESS, "Request in progress", "another request with this key is being processed".to_owned()),
        Error::Mismatch => (types::MISMATCH, "Idempotency key reused", "this key was used with a different request".to_owned()),
        Error::LeaseLost { .. } => (types::LEASE_LOST, "Lease lost", "this attempt lost its hold on the key; retry".to_owned()),
        Error::StoreUnavailable(source) => (types::STORE_UNAVAILABLE, "Idempotency store unavailable", source.to_string()),
        Error::Handler { error } | Error::Poisoned { error } => {
            let detail = match error {
                Failure::Service(e) => return Answer::ServiceError(e, outcome),
                Failure::Panicked(message) => format!("the handler panicked: {message}"),
                Failure::Body(e) => format!("the response body failed: {e}"),
            };
            (types::HANDLER_FAILED, "Handler failed", detail)
        }
        Error::RecordFailed { response, key_completed, .. } => {
            // The route ran and its effect happened; its response stands (and is replayed when
            // the key holds it).
            tracing::error!(key_completed, "the two-phase response could not be recorded with the local transaction");
            match serde_json::from_value::<HttpRecord>(response) {
                Ok(record) => {
                    let mut response: Response<R> = record.into_response();
                    response.headers_mut().remove("idempotent-replayed"); // this attempt ran it
                    return Answer::Respond(response, Seen::Error);
                }
                Err(e) => (types::INTERNAL, "Internal error", e.to_string()),
            }
        }
        other => (types::INTERNAL, "Internal error", other.to_string()),
    };
    let mut problem = Problem::new(status, kind, title, detail);
    if let Some(after) = after {
        problem = problem.retry_after(after);
    }
    tracing::warn!(status = problem.status(), "idempotency answered with a problem");
    Answer::Respond(problem.into_response(), outcome)
}
