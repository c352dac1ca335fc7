//! An idempotency [`tower_layer::Layer`] for HTTP services (feature `tower`; the axum extractor
//! with feature `axum`; metrics with feature `metrics`).
//!
//! It follows the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's conventions:
//!
//! - the key is the `Idempotency-Key` header, an sf-string (`"k-1"`) or a bare token (`k-1`),
//!   scoped to the operation (method and matched route, or a name you give) and to the user your
//!   [`Builder::user`] extractor finds, so one user's key never reaches another's record;
//! - the fingerprint covers the method, the path (not the query string, unless
//!   [`Builder::fingerprint_query`]) and the body (canonical JSON for a JSON body, exact bytes
//!   otherwise, or only the JSON Pointers you select with [`Builder::fingerprint_paths`]), so a
//!   key reused for another request is a 422;
//! - [`Builder::namespace`] prefixes every operation, so services sharing a database never
//!   share a key; [`Builder::key_from`] and [`Builder::user_from`] take async extractors with
//!   state, [`Builder::status_policy`] any closure, [`Builder::on_replay`] a hook on replays;
//! - the first request runs the route; its response is stored (status, body, the allow-listed
//!   headers) when the status policy says so and replayed to every retry with
//!   `Idempotent-Replayed: true`; a transient answer (5xx, 408, 409, 425, 429, a panic) releases
//!   the key for the retry;
//! - the layer's own answers are problem details ([`problem::types`]): 400 no or bad key,
//!   401 no user, 409 + `Retry-After` in progress or lease lost, 413 body over the limit,
//!   422 mismatch, 502 a response over the response limit ([`Builder::response_limit`]),
//!   503 store unavailable; a 5xx never carries an error's text: its `detail` is fixed and its
//!   `correlation_id` names the `tracing` error event that holds the error.
//!
//! One configuration ([`Builder`]) and one core of rules serve every stack: tower and axum (this
//! layer), actix-web (feature `actix`: [`IdempotencyLayer`] is an actix `Transform`, see
//! `IdempotencyMiddleware`) and tonic (feature `tonic`: [`IdempotencyLayer::grpc`] gives a
//! `GrpcLayer`; see the `grpc` module).
//!
//! Routes run in one of two [`Mode`]s, chosen per route (one layer per route, added with axum's
//! `route_layer` so the matched route names the operation):
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use idempotency_client::layer::{Connection, IdempotencyLayer, Mode};
//! use idempotency_client::Idempotency;
//!
//! async fn create(tx: Connection, body: String) -> (axum::http::StatusCode, String) {
//!     // `tx` is the request's transaction, used as the connection: business writes through it
//!     // commit with the stored response, or not at all.
//!     tx.execute("INSERT INTO charges (user_id, amount) VALUES ('u', 1)", &[]).await.unwrap();
//!     (axum::http::StatusCode::CREATED, body)
//! }
//!
//! # fn demo(idem: Idempotency) -> Result<(), Box<dyn std::error::Error>> {
//! let layer = IdempotencyLayer::builder(idem)
//!     .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
//!     .build()?;
//! let app: Router = Router::new().route("/charges", post(create)).route_layer(layer);
//! # Ok(())
//! # }
//! ```
//!
//! # What each mode guarantees
//!
//! **In-transaction** ([`Mode::InTransaction`], the default). The layer begins a transaction
//! and reserves the key in it; the handler gets that transaction ([`Connection`]) and does its
//! business writes in it; the layer stores the response and commits, so the record and the
//! business rows commit together or not at all. The reservation is invisible until the commit,
//! so a duplicate waits on it (or gets 409). If the process crashes, the connection drops or the
//! handler panics before the commit, PostgreSQL rolls everything back, the reservation included:
//! the key is free at once and the retry runs the handler again, with nothing half-done. Only
//! effects inside that transaction are covered: a handler that calls a payment API or writes to
//! another store is the two-phase case.
//!
//! **Two-phase** ([`Mode::TwoPhase`]). The layer reserves the key with a lease in a transaction
//! of its own and commits it (a duplicate now gets 409), runs the handler while a background task
//! renews the lease, then stores the response. The handler's effects are its own: nothing is
//! rolled back. A panic or a transient answer releases the key at once. If the process crashes
//! while the handler runs, the key stays `PROCESSING` (duplicates get 409 `in-progress`) until
//! its lease ends (default 60 s) and your recovery job's `idem_recover_stuck` handles it: with
//! `action => 'fail'` (the default) the key is failed and retries get 409 `failed`, never a
//! second run; with `'release'` the next retry runs the handler again. Without a recovery job
//! the key is taken over once its ttl has passed. Whenever a second run is possible, the outside
//! call should carry the same idempotency key downstream (Stripe's `Idempotency-Key`), as
//! `examples/rust/src/payouts.rs` does.
//!
//! In both modes the route runs to its end in a task of its own: a client that disconnects
//! mid-request does not cancel it, and its retry replays the stored response. The one exception
//! is a request dropped while the inner service is not ready yet (tower's readiness: the layer
//! drives a clone of the inner service to readiness before each call, see
//! `docs/rust-client.md`, "Stacking with tower middleware"): its key is released and the inner
//! service is never called.

#[cfg(feature = "actix")]
mod actix;
mod config;
mod core;
mod extract;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod grpc;
pub mod http;
mod key_header;
mod names;
mod observe;
mod pointer;
pub mod problem;
mod record;
mod request;
#[cfg(any(feature = "axum", feature = "actix"))]
mod respond;
mod service;
mod transaction;

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub use actix::IdempotencyMiddleware;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use grpc::{GrpcLayer, GrpcService};
pub use self::core::Reply;
pub use config::{default_status_policy, Builder, ConfigError, ANONYMOUS_USER, DEFAULT_RESPONSE_LIMIT};
pub use extract::UserFn;
pub use http::{http_status, retry_after};
pub use service::IdempotencyService;
pub use transaction::{Connection, Transaction, TransactionRejection};

use crate::driver::{postgres_by_default, Driver};
use crate::Idempotency;
use std::sync::Arc;

/// How a route's handler relates to the key's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The handler writes through the request's [`Connection`]; its writes and the stored
    /// response commit together.
    InTransaction,
    /// The handler's effects leave the database: lease, heartbeat, complete after the handler.
    TwoPhase,
}

impl Mode {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Mode::InTransaction => "in_transaction",
            Mode::TwoPhase => "two_phase",
        }
    }
}

postgres_by_default! {
/// Makes a tower HTTP service idempotent; see the [module documentation](self).
pub struct IdempotencyLayer<D: Driver = Postgres> {
    pub(crate) config: Arc<config::Config<D>>,
}
}

impl<D: Driver> Clone for IdempotencyLayer<D> {
    fn clone(&self) -> Self {
        IdempotencyLayer { config: self.config.clone() }
    }
}

impl<D: Driver> std::fmt::Debug for IdempotencyLayer<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer").field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl<D: Driver> IdempotencyLayer<D> {
    /// A builder over the handle `idem` (its pool, schema and settings are the defaults), in
    /// [`Mode::InTransaction`] unless [`Builder::mode`] says otherwise.
    pub fn builder(idem: Idempotency<D>) -> Builder<D> {
        Builder::new(idem)
    }

    /// A builder for an in-transaction route: its handler writes through the [`Connection`].
    pub fn in_transaction(idem: Idempotency<D>) -> Builder<D> {
        Builder::new(idem).mode(Mode::InTransaction)
    }

    /// A builder for a two-phase route: its handler's effects leave the database.
    pub fn two_phase(idem: Idempotency<D>) -> Builder<D> {
        Builder::new(idem).mode(Mode::TwoPhase)
    }
}

impl<S, D: Driver> tower_layer::Layer<S> for IdempotencyLayer<D> {
    type Service = IdempotencyService<S, D>;

    fn layer(&self, inner: S) -> IdempotencyService<S, D> {
        IdempotencyService { inner, config: self.config.clone() }
    }
}
