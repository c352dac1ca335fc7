//! The layer's builder: every setting, checked once by [`Builder::build`], frozen into the
//! [`Config`] every request reads.

use crate::config::Config;
use crate::extract::{self, KeySource, PolicyFn, ReplayHook, Scope};
use crate::layer::IdempotencyLayer;
use crate::limits::ResponseLimit;
use crate::mode::Mode;
use crate::names;
use crate::pointer::Pointer;
use crate::reply::Reply;
use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION, CONTENT_TYPE, LOCATION, SET_COOKIE};
use http::request::Parts;
use http::Method;
use idempotency_client::{postgres_by_default, Driver, Idempotency, Key, Replayable, StoredResponse, Verdict};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

/// A layer configuration that is not safe or not complete; the message names the setting.
#[derive(Debug, thiserror::Error)]
#[error("idempotency layer: {0}")]
pub struct ConfigError(String);

postgres_by_default! {
/// Builds an [`IdempotencyLayer`]; start from [`IdempotencyLayer::builder`]. `L` is the layer
/// it builds: this crate's [`IdempotencyLayer`] by default, an adapter crate's own layer type
/// (idempotency-actix's, idempotency-tonic's: anything made from an [`IdempotencyLayer`]) from
/// that type's `builder`, so one configuration serves every stack.
///
/// | setting | default |
/// | --- | --- |
/// | [`mode`](Builder::mode) | [`Mode::InTransaction`] |
/// | [`namespace`](Builder::namespace) | none: the operation alone scopes keys |
/// | [`header`](Builder::header) / [`key_from`](Builder::key_from) | the `Idempotency-Key` header |
/// | [`methods`](Builder::methods) | `POST`, `PATCH` (other methods pass through untouched) |
/// | [`require_key`](Builder::require_key) | `true`: a covered request without a key is a 400 |
/// | [`user`](Builder::user) / [`user_from`](Builder::user_from) / [`anonymous`](Builder::anonymous) | none: one of them is required |
/// | [`operation`](Builder::operation) | method and matched route (`POST /charges`), else method and path |
/// | [`ttl`](Builder::ttl), [`max_retries`](Builder::max_retries) | the handle's, else the server's `idempotency.*` |
/// | [`lease`](Builder::lease) | the handle's, else the server's (in-transaction) or 60 s (two-phase) |
/// | [`wait`](Builder::wait) | the handle's (`false`): a concurrent duplicate gets 409 + `Retry-After` |
/// | [`wait_timeout`](Builder::wait_timeout) | the handle's (5 s) |
/// | [`retry_after`](Builder::retry_after) | the handle's (1 s) |
/// | [`body_limit`](Builder::body_limit) | 1 MiB (413 above it) |
/// | [`response_limit`](Builder::response_limit) | the server's `idempotency.max_response_bytes`, read once (1MB if unreadable) |
/// | [`fingerprint_paths`](Builder::fingerprint_paths) / [`fingerprint_fields`](Builder::fingerprint_fields) | the whole body |
/// | [`fingerprint_query`](Builder::fingerprint_query) | `false`: the query string is not fingerprinted |
/// | [`stored_headers`](Builder::stored_headers) | `Content-Type`, `Location` |
/// | [`status_policy`](Builder::status_policy) | 2xx–4xx stored except 408, 409, 425, 429 |
/// | [`on_replay`](Builder::on_replay) | none: a replay is the stored answer and `Idempotent-Replayed: true` |
/// | [`log_keys`](Builder::log_keys) | `false`: spans carry a hash of the key |
#[must_use]
pub struct Builder<D: Driver = Postgres, L = IdempotencyLayer<D>> {
    idem: Idempotency<D>,
    mode: Mode,
    key: KeySource,
    methods: Vec<Method>,
    require_key: bool,
    scope: Option<Scope>,
    namespace: Option<String>,
    operation: Option<String>,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    max_retries: Option<i32>,
    wait: Option<bool>,
    wait_timeout: Option<Duration>,
    retry_after: Option<Duration>,
    body_limit: usize,
    response_limit: Option<usize>,
    subset: Option<Vec<String>>,
    fields: Option<Vec<String>>,
    query_in_fingerprint: bool,
    stored_headers: Vec<HeaderName>,
    policy: PolicyFn,
    on_replay: Option<ReplayHook>,
    log_keys: bool,
    layer: PhantomData<fn() -> L>,
}
}

/// The three entry points of a layer type that a [`Builder`] builds (`builder`,
/// `in_transaction`, `two_phase`), written once for this crate's [`IdempotencyLayer`] and the
/// adapter crates' layers (idempotency-actix's `IdempotencyLayer`, idempotency-tonic's
/// `GrpcLayer`: any type made `From` an [`IdempotencyLayer`]). Hidden: those crates' seam.
#[doc(hidden)]
#[macro_export]
macro_rules! layer_builders {
    ($layer:ident) => {
        impl<D: $crate::client::Driver> $layer<D> {
            /// A builder over the handle `idem` (its pool, schema and settings are the defaults),
            /// in-transaction unless `Builder::mode` says otherwise.
            pub fn builder(idem: $crate::client::Idempotency<D>) -> $crate::Builder<D, Self> {
                $crate::Builder::new(idem)
            }

            /// A builder for an in-transaction route: its handler writes through the request's
            /// `Connection`.
            pub fn in_transaction(idem: $crate::client::Idempotency<D>) -> $crate::Builder<D, Self> {
                $crate::Builder::new(idem).mode($crate::Mode::InTransaction)
            }

            /// A builder for a two-phase route: its handler's effects leave the database.
            pub fn two_phase(idem: $crate::client::Idempotency<D>) -> $crate::Builder<D, Self> {
                $crate::Builder::new(idem).mode($crate::Mode::TwoPhase)
            }
        }
    };
}

crate::layer_builders!(IdempotencyLayer);

/// The default status policy: the contract's, as [`StoredResponse`] applies it.
pub fn default_status_policy(status: u16) -> Verdict {
    StoredResponse::json(status, serde_json::Value::Null).verdict()
}

impl<D: Driver, L> Builder<D, L> {
    /// A builder over the handle `idem` (its pool, schema and settings are the defaults), in
    /// [`Mode::InTransaction`] unless [`Builder::mode`] says otherwise: what
    /// [`IdempotencyLayer::builder`] (and an adapter crate's layer's `builder`) returns.
    pub fn new(idem: Idempotency<D>) -> Self {
        Builder {
            idem,
            mode: Mode::InTransaction,
            key: KeySource::Header(HeaderName::from_static("idempotency-key")),
            methods: vec![Method::POST, Method::PATCH],
            require_key: true,
            scope: None,
            namespace: None,
            operation: None,
            ttl: None,
            lease: None,
            max_retries: None,
            wait: None,
            wait_timeout: None,
            retry_after: None,
            body_limit: 1 << 20,
            response_limit: None,
            subset: None,
            fields: None,
            query_in_fingerprint: false,
            stored_headers: vec![CONTENT_TYPE, LOCATION],
            policy: Arc::new(default_status_policy),
            on_replay: None,
            log_keys: false,
            layer: PhantomData,
        }
    }

    /// In-transaction (the handler writes through the [`Connection`](crate::Connection) it is given) or
    /// two-phase (lease, heartbeat, complete after the handler).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The request header holding the key (an sf-string or a bare token), read before the body.
    /// Replaces a [`key_from`](Builder::key_from) extractor.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.key = KeySource::Header(name);
        self
    }

    /// The key from a closure over the request's head and its whole body (read up to
    /// [`body_limit`](Builder::body_limit)), instead of a header: a field of the body (Google
    /// AIP-155's `request_id`), a header of another name or syntax, a value your own state
    /// derives. It may be async and hold state; it returns a `'static` future, so clone what the
    /// future needs first. `None` is a request without a key ([`require_key`](Builder::require_key)).
    ///
    /// ```no_run
    /// # use idempotency_tower::IdempotencyLayer;
    /// # fn demo(idem: idempotency_client::Idempotency) {
    /// let layer = IdempotencyLayer::builder(idem)
    ///     .anonymous()
    ///     .key_from(|_parts, body| {
    ///         let request: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    ///         async move { Some(request?.get("request_id")?.as_str()?.to_owned()) }
    ///     });
    /// # }
    /// ```
    pub fn key_from<F, Fut>(mut self, extractor: F) -> Self
    where
        F: Fn(&Parts, &Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        self.key = KeySource::Extractor(extract::key_fn(extractor));
        self
    }

    /// The methods the layer covers; requests with other methods pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.methods = methods.into_iter().collect();
        self
    }

    /// Whether a covered request without a key is answered 400 (`true`) or passed through to the
    /// handler without idempotency (`false`).
    pub fn require_key(mut self, required: bool) -> Self {
        self.require_key = required;
        self
    }

    /// The user a request acts for, usually the authenticated principal your auth layer put in
    /// the request's extensions: keys are scoped to it, so one user's key never reaches another
    /// user's record. `None` is answered 401.
    pub fn user(mut self, user: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        let user = Arc::new(user);
        self.scope = Some(Scope::User(extract::user_fn(move |parts: &Parts| std::future::ready(user(parts)))));
        self
    }

    /// [`user`](Builder::user) as an async closure that may hold state: a token verified against a
    /// key set, a session looked up in a store. It returns a `'static` future, so clone what the
    /// future needs out of the request first. `None` is answered 401 (gRPC: `UNAUTHENTICATED`).
    ///
    /// ```no_run
    /// # use idempotency_tower::IdempotencyLayer;
    /// # use std::{collections::HashMap, sync::Arc};
    /// # fn demo(idem: idempotency_client::Idempotency) {
    /// let sessions: Arc<HashMap<String, String>> = Arc::default();
    /// let layer = IdempotencyLayer::builder(idem).user_from(move |parts| {
    ///     let (sessions, token) = (sessions.clone(), parts.headers.get("x-session").cloned());
    ///     async move { sessions.get(token?.to_str().ok()?).cloned() }
    /// });
    /// # }
    /// ```
    pub fn user_from<F, Fut>(mut self, extractor: F) -> Self
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<String>> + Send + 'static,
    {
        self.scope = Some(Scope::User(extract::user_fn(extractor)));
        self
    }

    /// A prefix of every operation this layer scopes keys to (`billing` makes `POST /charges`
    /// the operation `billing:POST /charges`), so two services or environments sharing one
    /// database never reach each other's records with the same key and route. Not part of the
    /// `operation` label of spans and metrics. A `:` or `\` in the namespace or the operation
    /// name is escaped (`\:`, `\\`), so no two (namespace, name) pairs share an operation.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Declares the route unauthenticated: every caller's keys share one scope
    /// ([`ANONYMOUS_USER`](crate::ANONYMOUS_USER)), so callers must use unguessable keys.
    pub fn anonymous(mut self) -> Self {
        self.scope = Some(Scope::Anonymous);
        self
    }

    /// The operation name keys are scoped to, and the `operation` label of spans and metrics.
    /// By default the method and the matched route (`POST /charges/{id}`: axum's `MatchedPath`
    /// when the layer is added with `route_layer`, actix-web's match pattern, the gRPC method);
    /// otherwise the method and the request's path, which has one value per path
    /// (`/charges/7`): keys are then scoped per URL, and the metrics label is the method and
    /// `(unmatched)`, never the path. Name the operation then.
    pub fn operation(mut self, name: impl Into<String>) -> Self {
        self.operation = Some(name.into());
        self
    }

    /// How long a record is kept.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long an attempt holds the key without a heartbeat (two-phase heartbeats at a third).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Transient failures (5xx, panics) of one key before it is failed for good.
    pub fn max_retries(mut self, retries: i32) -> Self {
        self.max_retries = Some(retries);
        self
    }

    /// Wait for the key's holder, in either mode (an in-transaction holder that has not
    /// committed, a two-phase holder whose handler runs), then answer its stored response,
    /// instead of answering 409 at once; 409 + `Retry-After` at
    /// [`wait_timeout`](Builder::wait_timeout), 422 at once for a mismatch. The request polls the key (see
    /// [`Settings::wait`](idempotency_client::Settings::wait)), holding no pooled connection between polls.
    pub fn wait(mut self, wait: bool) -> Self {
        self.wait = Some(wait);
        self
    }

    /// How long a request waits for the key's holder with [`wait`](Builder::wait) before it
    /// answers 409 (shorter than the handle's `call_timeout`: `build` checks).
    pub fn wait_timeout(mut self, bound: Duration) -> Self {
        self.wait_timeout = Some(bound);
        self
    }

    /// The `Retry-After` of a 409 for a key in progress.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The largest request body read (and fingerprinted); larger ones are answered 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// The largest response body read from the route, in bytes; by default the server's
    /// `idempotency.max_response_bytes`, read once when the layer first needs it (its documented
    /// default, 1MB, where it cannot be read), so no response is read that the store would
    /// refuse. A larger body is not stored, and it is not sent: in-transaction the request is
    /// rolled back and counted like a transient failure (a 502 `response-too-large` problem;
    /// the retries end in a poisoned key); two-phase the effect stands and the key is completed
    /// with the marker [`StoredResponse::too_large`], replayed to every retry. A stored
    /// form still over the server's limit (headers, escapes, a binary body's hex) gets the
    /// same answers from the server's refusal. A limit above the server's only moves the
    /// refusal to the server, after the whole body was read.
    pub fn response_limit(mut self, bytes: usize) -> Self {
        self.response_limit = Some(bytes);
        self
    }

    /// Fingerprint only these top-level fields of a JSON body (method and path always count):
    /// [`fingerprint_paths`](Builder::fingerprint_paths) of `/field` each.
    pub fn fingerprint_fields(mut self, fields: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.fields = Some(fields.into_iter().map(Into::into).collect());
        self
    }

    /// Fingerprint only the values at these JSON Pointers (RFC 6901: `/amount`,
    /// `/customer/id`, `/items/0/sku`) of a JSON body; the method and path always count. A
    /// retry that changes anything else (a trace id, a timestamp) replays; one that changes a
    /// selected value is a 422 mismatch. A pointer that finds nothing counts as absent (not as
    /// `null`). Numbers keep every digit. With [`fingerprint_fields`](Builder::fingerprint_fields)
    /// the two lists add up. A pointer that does not parse is refused by [`Builder::build`].
    pub fn fingerprint_paths(mut self, pointers: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.subset.get_or_insert_with(Vec::new).extend(pointers.into_iter().map(Into::into));
        self
    }

    /// Whether the query string is part of the fingerprint (`false` by default: a retry whose
    /// tracking parameters come in another order replays). The path always is.
    pub fn fingerprint_query(mut self, include: bool) -> Self {
        self.query_in_fingerprint = include;
        self
    }

    /// More response headers stored and replayed, besides `Content-Type` and `Location`.
    /// `Set-Cookie` and `Authorization` are refused by [`Builder::build`].
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.stored_headers.extend(names);
        self
    }

    /// Which response statuses are stored ([`Verdict::Success`], [`Verdict::Failure`]) and which
    /// release the key for a retry ([`Verdict::Transient`]): a function, or a closure that holds
    /// state (a set of statuses read from your configuration). Over gRPC the status is the
    /// HTTP one the gRPC code maps to (see the tonic section of the docs).
    pub fn status_policy(mut self, policy: impl Fn(u16) -> Verdict + Send + Sync + 'static) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// A hook every replayed answer passes through before it is sent (the stored answer, with
    /// `Idempotent-Replayed: true` already set): add a header, count it, log it. Never called
    /// for the attempt that ran the route.
    pub fn on_replay(mut self, hook: impl Fn(&mut Reply) + Send + Sync + 'static) -> Self {
        self.on_replay = Some(Arc::new(hook));
        self
    }

    /// Put the key itself in spans instead of a hash of it.
    pub fn log_keys(mut self, log: bool) -> Self {
        self.log_keys = log;
        self
    }

    /// The layer, or the first setting that is missing or unsafe.
    pub fn build(self) -> Result<L, ConfigError>
    where
        L: From<IdempotencyLayer<D>>,
    {
        let Some(scope) = self.scope else {
            return Err(ConfigError(
                "no scope: call .user(..) with the authenticated principal, or .anonymous() for a route without one".into(),
            ));
        };
        if self.methods.is_empty() {
            return Err(ConfigError("methods: the layer must cover at least one method".into()));
        }
        if let Some(name) = self.stored_headers.iter().find(|n| **n == SET_COOKIE || **n == AUTHORIZATION) {
            return Err(ConfigError(format!("stored_headers: {name} is never stored (it carries credentials)")));
        }
        if self.body_limit == 0 {
            return Err(ConfigError("body_limit must be at least 1 byte".into()));
        }
        if self.response_limit == Some(0) {
            return Err(ConfigError("response_limit must be at least 1 byte".into()));
        }
        if matches!(&self.fields, Some(f) if f.is_empty()) {
            return Err(ConfigError("fingerprint_fields: name at least one field, or leave it unset for the whole body".into()));
        }
        if matches!(&self.subset, Some(p) if p.is_empty()) {
            return Err(ConfigError("fingerprint_paths: name at least one JSON Pointer, or leave it unset for the whole body".into()));
        }
        let subset = match (self.fields, self.subset) {
            (None, None) => None,
            (fields, paths) => {
                let mut pointers: Vec<Pointer> = fields.unwrap_or_default().iter().map(|f| Pointer::member(f)).collect();
                for text in paths.unwrap_or_default() {
                    pointers.push(Pointer::parse(&text).map_err(|e| ConfigError(format!("fingerprint_paths: {e}")))?);
                }
                Some(pointers)
            }
        };
        if let Some(namespace) = &self.namespace {
            if namespace.is_empty() {
                return Err(ConfigError("namespace: leave it unset, or give at least one character".into()));
            }
            Key::new(namespace.as_str(), "u", "k").map_err(|e| ConfigError(format!("namespace: {e}")))?;
        }
        if let Some(name) = &self.operation {
            // The operation as it is sent: escaped and after the namespace (its length counts).
            let scoped = names::scoped(self.namespace.as_deref(), name);
            Key::new(scoped.as_str(), "u", "k").map_err(|e| ConfigError(format!("operation: {e}")))?;
        }
        let mut settings = self.idem.settings().clone();
        settings.ttl = self.ttl.or(settings.ttl);
        settings.lease = self.lease.or(settings.lease);
        settings.max_retries = self.max_retries.or(settings.max_retries);
        settings.wait = self.wait.unwrap_or(settings.wait);
        settings.wait_timeout = self.wait_timeout.unwrap_or(settings.wait_timeout);
        if settings.wait_timeout.is_zero() {
            return Err(ConfigError("wait_timeout must be longer than zero".into()));
        }
        if let Some(reason) = settings.wait_beyond_call() {
            return Err(ConfigError(format!("wait_timeout: {reason}")));
        }
        settings.retry_after = self.retry_after.unwrap_or(settings.retry_after);
        let mut stored_headers = self.stored_headers;
        stored_headers.dedup();
        Ok(L::from(IdempotencyLayer::new(Config {
            idem: self.idem.with_settings(settings),
            mode: self.mode,
            key: self.key,
            methods: self.methods,
            require_key: self.require_key,
            scope,
            namespace: self.namespace,
            operation: self.operation,
            body_limit: self.body_limit,
            response_limit: ResponseLimit::new(self.response_limit),
            subset,
            query_in_fingerprint: self.query_in_fingerprint,
            stored_headers,
            policy: self.policy,
            on_replay: self.on_replay,
            log_keys: self.log_keys,
        })))
    }
}
