//! `idempotency-tower`: an idempotency [`tower_layer::Layer`] for HTTP services, over
//! `idempotency-client` (re-exported as [`client`]): the axum extractors with the feature `axum`,
//! metrics with the feature `metrics`; the client's driver is the feature `postgres` (the
//! default) or `sqlx`.
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
//! One configuration ([`Builder`]) and one core of rules, this crate's, serve every stack: tower
//! and axum (this crate), actix-web (the crate `idempotency-actix`: its `IdempotencyLayer` is an
//! actix-web `Transform`) and tonic (the crate `idempotency-tonic`: its `GrpcLayer`). Each of
//! those holds its own framework's impls; this one names no web framework but with `axum`.
//!
//! Routes run in one of two [`Mode`]s, chosen per route (one layer per route, added with axum's
//! `route_layer` so the matched route names the operation):
//!
//! ```no_run
//! use axum::{routing::post, Router};
//! use idempotency_tower::client::Idempotency;
//! use idempotency_tower::{Connection, IdempotencyLayer, Mode};
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

mod builder;
mod config;
mod core;
mod extract;
pub mod http;
mod key_header;
mod layer;
mod limits;
mod matched;
mod mode;
mod names;
mod observe;
mod pointer;
pub mod problem;
mod record;
mod reply;
mod request;
mod respond;
mod service;
mod steps;
mod transaction;
#[cfg(feature = "axum")]
mod axum_adapter;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use axum_adapter::ErrorResponse;
pub use builder::{default_status_policy, Builder, ConfigError};
pub use config::ANONYMOUS_USER;
pub use extract::UserFn;
pub use http::{http_status, retry_after};
pub use idempotency_client as client;
pub use layer::IdempotencyLayer;
pub use limits::DEFAULT_RESPONSE_LIMIT;
pub use mode::Mode;
pub use reply::Reply;
pub use service::IdempotencyService;
pub use steps::{Steps, StepsRejection};
pub use transaction::{Connection, Transaction, TransactionRejection};

/// What an adapter crate (idempotency-actix, idempotency-tonic) builds its stack's service on:
/// the core's entry points and the plain types they speak. Hidden: those crates depend on this
/// one at exactly its own version, so it may change in any release.
#[doc(hidden)]
pub mod adapter {
    pub use crate::config::Config;
    pub use crate::core::{head, panic_message, refused, serve, unreadable, Answer, Failure, Head, Route, RouteFuture, STREAMING_ANSWER};
    pub use crate::matched::MatchedRoute;
    pub use crate::problem::Problem;
    pub use crate::respond::error_reply;
    pub use crate::service::{ready_and_call, ready_then_call, reply_of, Finish, Inner, ServiceRoute, Whole};
    pub use crate::steps::StepsSlot;
    pub use crate::transaction::{shared_of, Taken};
}
