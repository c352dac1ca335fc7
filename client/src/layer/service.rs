//! The service the layer wraps around a route: read the key and the body, then run the route in
//! one of the two modes and answer.

use super::config::Config;
use super::key_header::{self, KeyHeader};
use super::observe::Observed;
use crate::Decision as Seen;
use super::problem::{details, types, Problem};
use super::record::HttpRecord;
use super::transaction::Transaction;
use super::Mode;
use crate::driver::{postgres_by_default, Driver};
use crate::{Disposition, Error, Fingerprint, HandlerError, Key, Outcome, StoredResponse, TxFuture};
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

postgres_by_default! {
/// An idempotent route: the service [`super::IdempotencyLayer`] makes.
pub struct IdempotencyService<S, D: Driver = Postgres> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config<D>>,
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
    let fingerprint = match super::request::fingerprint(&config, &parts, &bytes) {
        Ok(fingerprint) => fingerprint,
        Err(problem) => return Ok(observed.reject(problem)),
    };

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
            let problem = Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &format_args!("the idempotency task failed: {e}"));
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
    /// The response body is longer than the response limit (`limit` bytes); `effect_stands`
    /// in two-phase.
    TooLarge { limit: usize, effect_stands: bool },
}

impl<SE> std::fmt::Display for Failure<SE> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Service(_) => f.write_str("the route's service failed"),
            Failure::Panicked(message) => write!(f, "the handler panicked: {message}"),
            Failure::Body(e) => write!(f, "the response body failed: {e}"),
            Failure::TooLarge { limit, .. } => write!(f, "the response body is larger than the response limit ({limit} bytes)"),
        }
    }
}

/// Every route failure is transient (the key is released and the client's retry runs again),
/// but a two-phase response over the limit: its effect happened, so the key is completed with
/// the too-large marker, replayed to every retry.
impl<SE> HandlerError for Failure<SE> {
    fn disposition(&self) -> Disposition {
        match self {
            Failure::TooLarge { effect_stands: true, .. } => Disposition::Permanent(serde_json::to_value(StoredResponse::too_large()).ok()),
            _ => Disposition::Transient,
        }
    }
}

/// Calls the route and reads its response up to `limit` bytes, catching a panic.
async fn produce<S, B, R, D: Driver>(config: &Config<D>, mut inner: S, req: Request<B>, limit: usize) -> Result<HttpRecord, Failure<S::Error>>
where
    S: Service<Request<B>, Response = Response<R>>,
    R: Body,
    R::Error: Into<BoxError>,
{
    let run = async {
        let response = inner.call(req).await.map_err(Failure::Service)?;
        let (parts, body) = response.into_parts();
        let bytes = match Limited::new(body, limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Err(Failure::TooLarge { limit, effect_stands: config.mode == Mode::TwoPhase });
            }
            Err(e) => return Err(Failure::Body(e)),
        };
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
        let (config, inner, parts, bytes) = (route.clone(), inner.clone(), parts.clone(), bytes.clone());
        Box::pin(async move {
            let limit = config.response_limit.on::<D>(tx).await;
            let shared = D::share(tx);
            let mut req = Request::from_parts(parts, B::from(bytes));
            req.extensions_mut().insert(Transaction::<D>(shared.clone()));
            let produced = produce(&config, inner, req, limit).await;
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
    let call = async {
        let limit = config.response_limit.pooled(config.idem.driver()).await;
        produce(config, inner, req, limit).await
    };
    let result = config.idem.run_external(&key, &fingerprint, call, nothing_local).await;
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
    let problem = match e {
        Error::Failed { response: Some(stored) } => match serde_json::from_value::<HttpRecord>(stored) {
            Ok(record) => return Answer::Respond(record.into_response(), outcome),
            Err(e) => {
                let cause = format_args!("the stored response does not decode: {e}");
                let problem = Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &cause);
                return Answer::Respond(problem.into_response(), Seen::Error);
            }
        },
        Error::Failed { response: None } => Problem::new(status, types::FAILED, "Request failed", "an earlier attempt with this key failed for good"),
        Error::InProgress { .. } => Problem::new(status, types::IN_PROGRESS, "Request in progress", "another request with this key is being processed"),
        Error::Mismatch => Problem::new(status, types::MISMATCH, "Idempotency key reused", "this key was used with a different request"),
        Error::LeaseLost { .. } => Problem::new(status, types::LEASE_LOST, "Lease lost", "this attempt lost its hold on the key; retry"),
        Error::StoreUnavailable(source) => {
            let cause = Chain(source.as_ref());
            Problem::failure(status, types::STORE_UNAVAILABLE, "Idempotency store unavailable", details::STORE_UNAVAILABLE, &cause)
        }
        Error::Handler { error } | Error::Poisoned { error } => match error {
            Failure::Service(e) => return Answer::ServiceError(e, outcome),
            Failure::TooLarge { effect_stands, .. } => return too_large(effect_stands, outcome, &error),
            failure => Problem::failure(500, types::HANDLER_FAILED, "Handler failed", details::HANDLER_FAILED, &failure),
        },
        Error::ResponseTooLarge { effect_stands, .. } => return too_large(effect_stands, outcome, &e),
        Error::RecordFailed { response, key_completed, error } => {
            // The route ran and its effect happened; its response stands (and is replayed when
            // the key holds it).
            tracing::error!(key_completed, error = %error, "the two-phase response could not be recorded with the local transaction");
            match serde_json::from_value::<HttpRecord>(response) {
                Ok(record) => {
                    let mut response: Response<R> = record.into_response();
                    response.headers_mut().remove("idempotent-replayed"); // this attempt ran it
                    return Answer::Respond(response, Seen::Error);
                }
                Err(e) => Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &e),
            }
        }
        other => {
            let cause = described(&other);
            Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &cause)
        }
    };
    let problem = match after {
        Some(after) => problem.retry_after(after),
        None => problem,
    };
    if problem.status() < 500 {
        tracing::warn!(status = problem.status(), "idempotency answered with a problem");
    }
    Answer::Respond(problem.into_response(), outcome)
}

/// The answer to a response over the limit: in-transaction (rolled back, counted) a 502 that
/// says so; two-phase (the effect stands, the key holds the marker) the marker's problem, with
/// this attempt's correlation id.
fn too_large<R: From<Bytes>, SE>(effect_stands: bool, outcome: Seen, cause: &dyn std::fmt::Display) -> Answer<R, SE> {
    let (detail, outcome) = match effect_stands {
        true => (StoredResponse::TOO_LARGE_DETAIL, Seen::Error),
        false => (details::TOO_LARGE_ROLLED_BACK, outcome),
    };
    let status = StoredResponse::TOO_LARGE_STATUS;
    let problem = Problem::failure(status, types::RESPONSE_TOO_LARGE, StoredResponse::TOO_LARGE_TITLE, detail, cause);
    Answer::Respond(problem.into_response(), outcome)
}

/// An error of the flow with its sources, for the log only.
fn described<SE>(e: &Error<Failure<SE>>) -> String {
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
