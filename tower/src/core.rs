//! The layer's core, shared by every stack: a request's head and whole body in, an answer out.
//! It identifies the request (key, user, operation, fingerprint), runs the route in one of the
//! two modes in a task of its own, stores the answer and replays it. Each stack (tower, actix-web,
//! tonic) is an adapter: it reads the body, hands the core a route to call, and turns the answer
//! into its own response type.

use crate::config::Config;
use crate::extract::KeySource;
use crate::key_header::{self, KeyHeader};
use crate::mode::Mode;
use crate::observe::Observed;
use crate::problem::{details, types, Problem};
use crate::record::HttpRecord;
use crate::reply::Reply;
use crate::steps::StepsSlot;
use crate::request::{self, Operation};
use crate::transaction::Transaction;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use http::request::Parts;
use idempotency_client::{Decision, Disposition, Driver, Error, Fingerprint, HandlerError, Key, Outcome, StoredResponse, TxFuture};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tracing::Instrument;

/// Why the route produced no answer to record. The adapters make `Service`, `Body` and
/// `TooLarge`; the core adds `Panicked`.
pub enum Failure<SE> {
    /// The stack's service returned its own error (the key is released; the error goes on).
    Service(SE),
    /// The route panicked (its message).
    Panicked(String),
    /// The response body failed while it was read.
    Body(Box<dyn std::error::Error + Send + Sync>),
    /// The body is longer than the response limit (`limit` bytes); `effect_stands` in two-phase.
    TooLarge {
        /// The response limit, in bytes.
        limit: usize,
        /// Whether the route's effect stands (two-phase).
        effect_stands: bool,
    },
    /// The stack dropped the request before the route answered (actix-web, when its client went
    /// away; tower and tonic, when the request's future was dropped while the inner service was
    /// not ready, so it was never called).
    Gone,
    /// A gRPC answer of more than one message (a server-streaming RPC).
    Streaming,
}

impl<SE> std::fmt::Display for Failure<SE> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Service(_) => f.write_str("the route's service failed"),
            Failure::Panicked(message) => write!(f, "the handler panicked: {message}"),
            Failure::Body(e) => write!(f, "the response body failed: {e}"),
            Failure::TooLarge { limit, .. } => write!(f, "the response body is larger than the response limit ({limit} bytes)"),
            Failure::Gone => f.write_str("the server dropped the request before the route answered"),
            Failure::Streaming => f.write_str("the RPC answered more than one message"),
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

/// The detail of [`types::STREAMING`] for an answer that streamed.
pub const STREAMING_ANSWER: &str = "idempotency layer: this RPC answered more than one message; the layer covers unary RPCs only, so leave streaming RPCs out of it (its answer was not stored and the key was released)";

/// What a route call gives back.
pub type RouteFuture<SE> = BoxFuture<'static, Result<Reply, Failure<SE>>>;

/// The route as the core calls it: the request's head and body, the transaction in-transaction
/// (to put where the handler finds it), and the response limit in bytes. It may be called again
/// (a retry of the whole transaction after 40001 / 40P01).
pub trait Route<D: Driver, SE>: Clone + Send + Sync + 'static {
    /// Calls the route once.
    fn call(&self, parts: Parts, body: Bytes, tx: Option<Transaction<D>>, limit: usize) -> RouteFuture<SE>;
}

impl<D: Driver, SE, F> Route<D, SE> for F
where
    F: Fn(Parts, Bytes, Option<Transaction<D>>, usize) -> RouteFuture<SE> + Clone + Send + Sync + 'static,
{
    fn call(&self, parts: Parts, body: Bytes, tx: Option<Transaction<D>>, limit: usize) -> RouteFuture<SE> {
        self(parts, body, tx, limit)
    }
}

/// How a covered request ends.
pub enum Answer<SE> {
    /// The route's answer, a replay, or a stored failure.
    Respond(Reply),
    /// The layer's own answer (a problem).
    Refuse(Problem),
    /// The route's own service error (the key was released).
    ServiceError(SE),
    /// No key and none required: the adapter calls the route as if there were no layer.
    PassThrough(Parts, Bytes),
}

/// What the core decides from the head alone, before the body is read.
pub enum Head {
    /// Not a covered method: the adapter calls the route as if there were no layer.
    Uncovered,
    /// A header key and none sent, none required: the adapter passes the request through
    /// without reading its body.
    PassThrough,
    /// Answered already (no key, a malformed one).
    Refuse(Problem),
    /// Read the body (up to the configuration's `body_limit`), then call [`serve`]; the header's
    /// key when the key comes from a header.
    ReadBody(Option<String>),
}

/// Looks at a request's head: is it covered, does its key header hold a key?
pub fn head<D: Driver>(config: &Config<D>, parts: &Parts) -> Head {
    if !config.methods.contains(&parts.method) {
        return Head::Uncovered;
    }
    let KeySource::Header(name) = &config.key else { return Head::ReadBody(None) };
    match key_header::parse(parts.headers.get_all(name)) {
        KeyHeader::Key(key) => Head::ReadBody(Some(key)),
        KeyHeader::Missing if !config.require_key => {
            tracing::debug!(header = name.as_str(), "no idempotency key: passed through");
            Head::PassThrough
        }
        KeyHeader::Missing => Head::Refuse(refused(config, parts, missing(name.as_str()))),
        KeyHeader::Malformed(rule) => Head::Refuse(refused(config, parts, Problem::new(400, types::KEY_INVALID, "Invalid idempotency key", rule))),
    }
}

fn missing(source: &str) -> Problem {
    Problem::new(400, types::KEY_MISSING, "Idempotency key missing", format!("this request needs an {source} header"))
}

/// The answer to a body the adapter could not read: over the limit (413) or broken (400).
pub fn unreadable<D: Driver>(config: &Config<D>, parts: &Parts, too_large: bool, error: &dyn std::fmt::Display) -> Problem {
    let problem = match too_large {
        true => Problem::new(413, types::BODY_TOO_LARGE, "Request body too large", format!("the body is larger than {} bytes", config.body_limit)),
        false => Problem::new(400, types::BODY_UNREADABLE, "Request body unreadable", error.to_string()),
    };
    refused(config, parts, problem)
}

/// Observes a request answered before it was identified, and gives its problem back.
pub fn refused<D: Driver>(config: &Config<D>, parts: &Parts, problem: Problem) -> Problem {
    let Operation { label, .. } = request::operation(config, parts);
    Observed::start(&label, config.mode.label()).refused(&problem);
    problem
}

/// A covered request whose body was read: identify it, run the route in its mode in a task of
/// its own (a client that disconnects does not cancel it half-way: the key is completed or
/// released, and the client's retry replays), and answer.
pub async fn serve<D, SE, R>(config: Arc<Config<D>>, parts: Parts, body: Bytes, header_key: Option<String>, route: R) -> Answer<SE>
where
    D: Driver,
    SE: Send + 'static,
    R: Route<D, SE>,
{
    let raw_key = match (&config.key, header_key) {
        (_, Some(key)) => key,
        (KeySource::Extractor(extract), None) => match extract(&parts, &body).await {
            Some(key) => key,
            None if !config.require_key => return Answer::PassThrough(parts, body),
            None => return Answer::Refuse(refused(&config, &parts, missing("idempotency key (from the configured extractor)"))),
        },
        (KeySource::Header(name), None) => return Answer::Refuse(refused(&config, &parts, missing(name.as_str()))),
    };
    let Operation { scoped, label } = request::operation(&config, &parts);
    let observed = Observed::start(&label, config.mode.label());
    observed.key(&raw_key, config.log_keys);
    let Some(user) = request::user(&config, &parts).await else {
        let detail = "the idempotency scope found no user for this request";
        return Answer::Refuse(observed.reject(Problem::new(401, types::USER_MISSING, "No user", detail)));
    };
    let key = match Key::new(scoped, user, raw_key) {
        Ok(key) => key,
        Err(e) => return Answer::Refuse(observed.reject(Problem::new(400, types::KEY_INVALID, "Invalid idempotency key", e.to_string()))),
    };
    let fingerprint = match request::fingerprint(&config, &parts, &body) {
        Ok(fingerprint) => fingerprint,
        Err(problem) => return Answer::Refuse(observed.reject(problem)),
    };
    let run = {
        let config = config.clone();
        async move {
            match config.mode {
                Mode::InTransaction => in_transaction(&config, route, key, fingerprint, parts, body).await,
                Mode::TwoPhase => two_phase(&config, route, key, fingerprint, parts, body).await,
            }
        }
        .instrument(observed.span().clone())
    };
    let (answer, outcome) = match tokio::spawn(run).await {
        Ok(ended) => ended,
        Err(e) => {
            let cause = format_args!("the idempotency task failed: {e}");
            (Answer::Refuse(Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &cause)), Decision::Error)
        }
    };
    let status = match &answer {
        Answer::Respond(reply) => reply.status.as_u16(),
        Answer::Refuse(problem) => problem.status(),
        Answer::ServiceError(_) | Answer::PassThrough(..) => 500,
    };
    observed.finish(outcome, status);
    answer
}

/// Calls the route, catching a panic, and applies the status policy.
async fn produce<D: Driver, SE, R: Route<D, SE>>(
    config: &Config<D>,
    route: &R,
    parts: Parts,
    body: Bytes,
    tx: Option<Transaction<D>>,
    limit: usize,
) -> Result<HttpRecord, Failure<SE>> {
    match AssertUnwindSafe(route.call(parts, body, tx, limit)).catch_unwind().await {
        Ok(Ok(reply)) => {
            let verdict = (config.policy)(reply.status.as_u16());
            Ok(HttpRecord::new(reply, &config.stored_headers, verdict))
        }
        Ok(Err(failure)) => Err(failure),
        Err(panic) => {
            let message = panic_message(panic.as_ref());
            tracing::error!(panic = message.as_str(), "the idempotent handler panicked; the key is released");
            Err(Failure::Panicked(message))
        }
    }
}

/// A caught panic's message (`&str` or `String` payloads), else "a panic": the text of
/// [`Failure::Panicked`], whichever stack caught it.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_owned())
}

/// In-transaction: `run`, with the route as its work: the route gets the transaction, and its
/// answer is stored with its writes.
async fn in_transaction<D: Driver, SE: Send + 'static, R: Route<D, SE>>(
    config: &Arc<Config<D>>,
    route: R,
    key: Key,
    fingerprint: Fingerprint,
    parts: Parts,
    body: Bytes,
) -> (Answer<SE>, Decision) {
    let shared_config = config.clone();
    let work = work_fn::<D, _, _, _>(move |tx: &mut D::Tx| {
        let (config, route, parts, body) = (shared_config.clone(), route.clone(), parts.clone(), body.clone());
        Box::pin(async move {
            let limit = config.response_limit.on::<D>(tx).await;
            let shared = D::share(tx);
            let produced = produce(&config, &route, parts, body, Some(Transaction::<D>(shared.clone())), limit).await;
            D::unshare(tx, shared);
            produced
        }) as TxFuture<'_, HttpRecord, Failure<SE>>
    });
    answer_of(config, config.idem.run_tx(&key, &fingerprint, work).await)
}

/// Gives a closure the higher-ranked signature of a flow's work.
fn work_fn<D: Driver, T, E, F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E>>(f: F) -> F {
    f
}

/// Two-phase: reserve with a lease, run the route while the lease is heartbeaten, then complete.
async fn two_phase<D: Driver, SE: Send + 'static, R: Route<D, SE>>(
    config: &Config<D>,
    route: R,
    key: Key,
    fingerprint: Fingerprint,
    parts: Parts,
    body: Bytes,
) -> (Answer<SE>, Decision) {
    // A key with a recovery point (written by the handler's `Steps`) answers `resume`: the
    // handler's `Steps` continue after it; a key without one never does.
    let start = |token, resumed| {
        let mut parts = parts;
        parts.extensions.insert(StepsSlot::new(config.idem.clone(), key.clone(), token, resumed));
        async {
            let limit = config.response_limit.pooled(config.idem.driver()).await;
            produce(config, &route, parts, body, None, limit).await
        }
    };
    let result = config.idem.run_external_resumable(&key, &fingerprint, start, nothing_local).await;
    answer_of(config, result)
}

/// The two-phase layer records nothing locally but the key.
fn nothing_local<'t, C: ?Sized, E: Send + 'static>(_: &'t mut C, _: &'t HttpRecord) -> TxFuture<'t, (), E> {
    Box::pin(std::future::ready(Ok(())))
}

/// A record's answer; a replay passes through the configured hook.
fn replied<D: Driver>(config: &Config<D>, record: HttpRecord) -> Reply {
    let replay = record.is_replay();
    let mut reply = record.into_reply();
    if let (true, Some(hook)) = (replay, &config.on_replay) {
        hook(&mut reply);
    }
    reply
}

/// Maps a flow's result to the answer and its label.
fn answer_of<D: Driver, SE>(config: &Config<D>, result: Result<Outcome<HttpRecord>, Error<Failure<SE>>>) -> (Answer<SE>, Decision) {
    match result {
        Ok(outcome) => {
            let decision = outcome.decision();
            (Answer::Respond(replied(config, outcome.into_inner())), decision)
        }
        Err(e) => error_answer(config, e),
    }
}

fn error_answer<D: Driver, SE>(config: &Config<D>, e: Error<Failure<SE>>) -> (Answer<SE>, Decision) {
    let outcome = e.decision();
    let problem = match e {
        Error::Failed { response: Some(stored) } => match serde_json::from_value::<HttpRecord>(stored) {
            Ok(record) => return (Answer::Respond(replied(config, record)), outcome),
            Err(e) => {
                let cause = format_args!("the stored response does not decode: {e}");
                let problem = Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &cause);
                return (Answer::Refuse(problem), Decision::Error);
            }
        },
        Error::Handler { error } | Error::Poisoned { error } => match error {
            Failure::Service(e) => return (Answer::ServiceError(e), outcome),
            Failure::TooLarge { effect_stands, .. } => return too_large(effect_stands, outcome, &error),
            Failure::Streaming => Problem::new(400, types::STREAMING, "Streaming RPC", STREAMING_ANSWER),
            failure => Problem::failure(500, types::HANDLER_FAILED, "Handler failed", details::HANDLER_FAILED, &failure),
        },
        Error::ResponseTooLarge { effect_stands, .. } => return too_large(effect_stands, outcome, &e),
        Error::RecordFailed { response, key_completed, error } => {
            // The route ran and its effect happened; its answer stands (and is replayed when the
            // key holds it).
            tracing::error!(key_completed, error = %error, "the two-phase response could not be recorded with the local transaction");
            match serde_json::from_value::<HttpRecord>(response) {
                Ok(record) => {
                    let mut reply = record.into_reply();
                    reply.headers.remove("idempotent-replayed"); // this attempt ran it
                    return (Answer::Respond(reply), Decision::Error);
                }
                Err(e) => Problem::failure(500, types::INTERNAL, "Internal error", details::INTERNAL, &e),
            }
        }
        // The one mapping of every other error, shared with the handlers that call `run`
        // themselves (`IntoResponse`, `ResponseError`).
        other => Problem::of_error(&other, config.idem.settings().retry_after),
    };
    if problem.status() < 500 {
        tracing::warn!(status = problem.status(), "idempotency answered with a problem");
    }
    (Answer::Refuse(problem), outcome)
}

/// The answer to a response over the limit: in-transaction (rolled back, counted) a 502 that
/// says so; two-phase (the effect stands, the key holds the marker) the marker's problem, with
/// this attempt's correlation id.
fn too_large<SE>(effect_stands: bool, outcome: Decision, cause: &dyn std::fmt::Display) -> (Answer<SE>, Decision) {
    let (detail, outcome) = match effect_stands {
        true => (StoredResponse::TOO_LARGE_DETAIL, Decision::Error),
        false => (details::TOO_LARGE_ROLLED_BACK, outcome),
    };
    let status = StoredResponse::TOO_LARGE_STATUS;
    let problem = Problem::failure(status, types::RESPONSE_TOO_LARGE, StoredResponse::TOO_LARGE_TITLE, detail, cause);
    (Answer::Refuse(problem), outcome)
}
