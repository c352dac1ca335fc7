//! `idempotency-client`: run a request at most once per idempotency key, with the guarantees of
//! the `idempotency` PostgreSQL extension, in a few lines of Rust.
//!
//! # Quick start
//!
//! ```no_run
//! use idempotency_client::{Fingerprint, Idempotency, Key, Outcome, Settings, StoredResponse};
//! use serde_json::json;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let idem: Idempotency = Idempotency::from_url("postgresql://app@localhost/shop", 16, Settings::default())?;
//! idem.check_extension().await?; // fail fast: reachable, installed, a version this client speaks
//!
//! let key = Key::new("payments.create", "user-42", "k-1")?; // from the Idempotency-Key header
//! let request = json!({"amount": 100});
//! let fingerprint = Fingerprint::of_json(&request)?;
//!
//! let outcome = idem
//!     .run_async(&key, &fingerprint, async move |tx| {
//!         let insert = tx.prepare_cached("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id").await?;
//!         let id: i64 = tx.query_one(&insert, &[&"user-42", &100i32]).await?.try_get("id")?;
//!         Ok::<_, tokio_postgres::Error>(StoredResponse::json(201, json!({"id": id})))
//!     })
//!     .await;
//! match outcome {
//!     Ok(Outcome::Executed(resp)) => println!("charged: {}", resp.status),
//!     Ok(Outcome::Replayed(resp)) => println!("replay (Idempotent-Replayed: true): {}", resp.status),
//!     Ok(Outcome::Released(resp)) => println!("transient {}; the retry runs again", resp.status),
//!     Ok(Outcome::Poisoned(resp)) => println!("transient {}; retries exhausted, the key failed", resp.status),
//!     Err(e) => println!("not run now ({}): {e}", e.decision()),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! `run` is the in-transaction flow; `run_external` the two-phase flow (a side effect outside
//! the database). `run_async` is `run` with an async closure, cloned for each try and owning
//! what it captures; `run`'s boxed closure (`|tx| Box::pin(async move { .. })`) may borrow (see
//! [`Idempotency::run_async`] for why both exist). Either driver's handle is made the same way:
//! [`Idempotency::from_url`] or [`Idempotency::from_pool`], the driver named by the handle's
//! type (`let idem: Idempotency = ..` is tokio-postgres's; `Idempotency::<Sqlx>::from_url(..)`
//! sqlx's: a build with both drivers cannot infer which). `run` costs three round trips for a closure with one prepared statement and
//! takes no savepoint; a replay is answered after the first.
//!
//! The extension's schema comes from `pg_extension` (looked up once per handle), or from
//! [`Settings::schema`]: every call is qualified with it, so `CREATE EXTENSION idempotency
//! SCHEMA idem` needs no `search_path` change.
//!
//! ```no_run
//! use idempotency_client::{Idempotency, Settings};
//! # fn demo() -> Result<(), idempotency_client::Error> {
//! let settings = Settings::builder().schema("idem").max_retries(5);
//! let idem: Idempotency = Idempotency::from_url("postgresql://app@localhost/shop", 16, settings)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Inside your transaction
//!
//! The [`ops`] functions take any `deadpool_postgres::GenericClient` (over sqlx, `ops::sqlx`
//! takes any `sqlx::PgExecutor`, from the same statements), so they also run inside a
//! transaction you already hold: the reservation and your writes commit or roll back together.
//! `?` on your own statements gives [`Error::Database`] (or [`Error::StoreUnavailable`]), never
//! [`Error::IncompatibleExtension`], which only this crate's statements raise.
//!
//! ```no_run
//! use idempotency_client::ops::{self, ReserveOptions, ReserveOutcome, Status};
//! use idempotency_client::{Fingerprint, Idempotency, Key};
//!
//! # async fn demo(idem: Idempotency) -> Result<(), idempotency_client::Error> {
//! let schema = idem.schema().await?;
//! let key = Key::new("orders.create", "user-7", "k-9")?;
//! let fingerprint = Fingerprint::of_bytes(b"raw request body");
//! let mut client = idem.pool().get().await?;
//! let tx = client.transaction().await?;
//! match ops::reserve(&tx, &schema, &key, &fingerprint, &ReserveOptions::default()).await?.outcome {
//!     ReserveOutcome::Created(token) => {
//!         tx.execute("INSERT INTO orders (user_id) VALUES ($1)", &[&"user-7"]).await?;
//!         let body = serde_json::json!({"status": 201});
//!         if ops::complete(&tx, &schema, &key, token, Some(&body), Status::Success).await? {
//!             tx.commit().await?;
//!         } // else: the lease was lost; dropping tx rolls the order back
//!     }
//!     ReserveOutcome::Replay(stored) => println!("already done: {stored:?}"),
//!     other => println!("not now: {other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! The pure rules (keys, fingerprints, the vocabulary of statuses and outcomes) are the crate
//! `idempotency-core`, which the extension links too; this crate re-exports what a caller
//! needs. The flows are written once over the [`Driver`] interface; [`Postgres`]
//! (tokio-postgres with a deadpool pool) is its default implementation, and with the `sqlx`
//! feature `Sqlx` (a `sqlx::PgPool`) the other: `Idempotency::<Sqlx>::from_url(url, 16, settings)`, and your
//! closures get the transaction's `&mut sqlx::PgConnection`:
//!
//! ```ignore
//! let idem = Idempotency::<Sqlx>::from_url("postgresql://app@localhost/shop", 16, Settings::default())?;
//! let outcome = idem
//!     .run(&key, &fingerprint, |conn| {
//!         Box::pin(async move {
//!             let id: i64 = sqlx::query_scalar("INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id")
//!                 .bind("user-42").bind(100i64).fetch_one(&mut *conn).await?;
//!             Ok::<_, sqlx::Error>(StoredResponse::json(201, json!({"id": id})))
//!         })
//!     })
//!     .await;
//! ```
//!
//! A plain `Idempotency` is always `Idempotency<Postgres>`, whatever features the build turns on
//! (without the `postgres` feature it has no default): over sqlx, name the driver,
//! `Idempotency<Sqlx>`, `idempotency_tower::Connection<Sqlx>`.
//!
//! Outcomes and errors are the same types; a sqlx error is the source of [`Error::Database`] or
//! [`Error::StoreUnavailable`] as a tokio-postgres one is. sqlx does not pipeline, so the
//! statements of one round trip travel as one simple query: the same closure costs the same
//! three round trips (`BEGIN` with the reservation, your statement, the completion with
//! `COMMIT`), and a replay one.
//!
//! # Bounded waits and errors
//!
//! Every call ends within [`Settings::call_timeout`] (30 s by default): a call still waiting
//! then (a server that stopped answering) is dropped, its connection closed, and it answers
//! [`Error::StoreUnavailable`] whose source is an [`Elapsed`]. The pools the constructors make
//! also bound the wait for a connection, the connect, and (tokio-postgres) keep TCP keepalives;
//! see [`Settings`] and `docs/rust-client.md`. [`Error`] is a `std::error::Error` whose
//! `source()` chain holds the driver's error, or your closure's (see [`HandlerError::as_error`];
//! the `anyhow` and `eyre` features let a closure return `anyhow::Result` / `eyre::Result`).
//!
//! # Web services
//!
//! This crate has no web framework in it. The layer that makes a route idempotent in a few
//! lines (the `Idempotency-Key` header, problem+json answers, stored and replayed responses,
//! in-transaction or two-phase routes, `tracing` spans, `metrics` counters) is a crate per
//! service stack, each over this one: `idempotency-tower` (any tower HTTP service; axum with its
//! feature `axum`), `idempotency-actix` (actix-web) and `idempotency-tonic` (tonic gRPC). The
//! retry hints of an error are its own: [`Error::retry_after`] and [`Error::is_retryable`]. The
//! `tracing` feature puts a span around every call of [`Idempotency`].

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(hidden)]
pub mod adapter;
mod batch;
mod cache;
mod classify;
pub mod driver;
mod error;
mod flow;
mod handle;
mod handler_error;
pub mod ops;
mod one_statement;
mod outcome;
mod response;
mod row;
mod settings;
mod sql;
mod steps;
pub mod tls;
mod trace;
pub mod types;

pub use batch::{BatchItem, BatchOutcome};
pub use cache::{ReplayCache, ReplayCacheStats};
pub use driver::{Driver, Lent, TransactionEnded};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use driver::{Postgres, SharedClient, Tx};
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub use driver::{SharedConnection, Sqlx, SqlxTx};
pub use error::{DatabaseError, Error};
pub use flow::TxFuture;
pub use handle::{BatchFn, Connect, Idempotency, RecordFn, TxFn};
pub use handle::Plans;
pub use handler_error::{Disposition, HandlerError};
pub use idempotency_core::fingerprint::canonical_json;
pub use idempotency_core::{Decision, Fingerprint, FingerprintError, Key, KeyError};
pub use one_statement::OneStatement;
pub use outcome::{decision, Outcome};
pub use response::{Body, Json, Replayable, StoredResponse, Verdict};
pub use settings::{Elapsed, Isolation, Settings, SettingsBuilder};
pub use sql::Schema;
pub use steps::{DerivedKey, Plan, Resumed, StepFn};
