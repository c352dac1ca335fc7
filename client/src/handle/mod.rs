//! The handle: a driver (its pool), the settings, the extension's schema (resolved once), and
//! the entry point of every flow (`run`, `run_external` here; `run_batch` and `run_statement`
//! in their modules; their async-closure forms in `closures`; the constructors, one shape for
//! every driver in `connect`, each driver's own in `postgres` and `sqlx`).

mod batch;
mod closures;
mod connect;
mod deadline;
mod one_statement;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlx")]
mod sqlx;
mod steps;

use crate::driver::{postgres_by_default, Driver};
use crate::error::Error;
use crate::flow::{self, Context, TxFuture};
use crate::handler_error::HandlerError;
use crate::response::Replayable;
use crate::settings::Settings;
use crate::sql::Schema;
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};
use std::sync::Arc;
use tokio::sync::OnceCell;

pub use closures::{BatchFn, RecordFn, TxFn};
pub use connect::Connect;
pub use steps::Plans;

postgres_by_default! {
/// A cloneable handle: a driver (for `Postgres`, a `deadpool_postgres::Pool`), the
/// [`Settings`] of every call and the extension's [`Schema`].
///
/// **The driver.** `D` is `Postgres` when left out (with the `postgres` feature, the
/// default), whatever other features the build turns on: a plain `Idempotency` is always the
/// tokio-postgres handle. Over sqlx, name it: `Idempotency<Sqlx>` (without the `postgres`
/// feature `D` has no default).
///
/// **The pool.** `run` holds one pooled connection for the length of its transaction (your
/// closure included) and gives it back on every exit.
///
/// **Dropped futures.** Every entry point is cancellation safe: a future dropped at any await (a
/// timeout, a `select!`) never leaves a pooled connection inside a transaction, since the guard
/// records that a transaction may be open before its `BEGIN` leaves and closes a connection it
/// cannot vouch for (over tokio-postgres after a cancel request sent through the pool's TLS
/// connector; over sqlx the server's connection check ends a running statement within 1 s), so
/// the server rolls back, a statement waiting on a lock included, and no other call can commit
/// what the dropped one began. In the in-transaction flows the key is free
/// for the next attempt (or completed, when the dropped call's own `COMMIT` had already left);
/// `run_external` says what it keeps (the repository's docs/rust-client.md, "When a call is
/// dropped", has the table of every entry point).
/// `run_external` holds none while the outside call runs: one for the reservation, one per
/// heartbeat, one for the final transaction. When every connection is busy, a call waits for one
/// at most the pool's wait timeout ([`Settings::pool_timeout`], 5 s by default, for a pool made
/// by [`Idempotency::from_url`]) and then fails with [`Error::StoreUnavailable`], whose source is
/// the pool's timeout error; nothing was reserved, so the client's retry is safe.
///
/// **The deadline.** Every call ends within [`Settings::call_timeout`] (30 s by default): one
/// still running then is dropped and answers [`Error::StoreUnavailable`] whose source is an
/// [`crate::Elapsed`]; its connection is closed, so the server rolls back what it had begun and
/// the key is free for a retry. `run_external`'s outside call is not cut (see there).
#[derive(Clone)]
pub struct Idempotency<D: Driver = Postgres> {
    driver: D,
    settings: Arc<Settings>,
    schema: Arc<OnceCell<Schema>>,
}
}

impl<D: Driver> std::fmt::Debug for Idempotency<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl<D: Driver> Idempotency<D> {
    /// A handle over `driver` with `settings`.
    ///
    /// # Errors
    ///
    /// None: `settings` are used as they are (the URL constructors check them).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn with_driver(driver: D, settings: impl Into<Settings>) -> Self {
        Idempotency { driver, settings: Arc::new(settings.into()), schema: Arc::new(OnceCell::new()) }
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The same driver and schema with other settings (the layer's per-route ttl, lease, wait).
    /// Hidden: the adapter crates' seam (see [`crate::adapter`]).
    #[doc(hidden)]
    pub fn with_settings(&self, settings: impl Into<Settings>) -> Self {
        Idempotency { driver: self.driver.clone(), settings: Arc::new(settings.into()), schema: self.schema.clone() }
    }

    /// The extension's schema: [`Settings::schema`], or looked up once in `pg_extension` (and
    /// its version checked) on first use.
    ///
    /// # Errors
    ///
    /// [`Error::IncompatibleExtension`] when the extension is missing or at a version this client
    /// does not speak, [`Error::StoreUnavailable`] when the store cannot be reached (or within
    /// [`Settings::call_timeout`]), [`Error::Configuration`] for a schema name that is not one
    /// (the repository's docs/rust-client.md, "Errors").
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a read; dropped, nothing is kept, and the next call looks again.
    pub async fn schema(&self) -> Result<Schema, Error> {
        deadline::bounded("schema", self.settings.call_timeout, self.resolve_schema()).await
    }

    /// [`Idempotency::schema`] without a deadline of its own, for the calls that have one.
    async fn resolve_schema(&self) -> Result<Schema, Error> {
        self.schema
            .get_or_try_init(|| async {
                match &self.settings.schema {
                    Some(name) => Schema::named(name.as_str()),
                    None => {
                        let (schema, version) = flow::calls::installed(&self.driver).await?;
                        crate::sql::check_version(&version)?;
                        Schema::named(schema)
                    }
                }
            })
            .await
            .cloned()
    }

    /// Checks that the extension is installed, in the configured schema, at a version this
    /// client speaks (0.1 up to its own); returns the version. [`Error::IncompatibleExtension`]
    /// otherwise. One lookup: a handle whose schema was not yet resolved keeps the one found.
    ///
    /// # Errors
    ///
    /// As [`Idempotency::schema`], and [`Error::IncompatibleExtension`] naming both schemas when
    /// the extension is installed in another one than the configured (the repository's docs/rust-client.md, "Errors").
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a read (docs/rust-client.md, "When a call is dropped").
    pub async fn check_extension(&self) -> Result<String, Error> {
        deadline::bounded("check_extension", self.settings.call_timeout, self.check_extension_unbounded()).await
    }

    async fn check_extension_unbounded(&self) -> Result<String, Error> {
        let (installed_in, version) = flow::calls::installed(&self.driver).await?;
        crate::sql::check_version(&version)?;
        let schema = self
            .schema
            .get_or_try_init(|| async { Schema::named(self.settings.schema.as_deref().unwrap_or(&installed_in)) })
            .await?
            .clone();
        if installed_in != schema.name() {
            return Err(Error::IncompatibleExtension {
                reason: format!(
                    "the idempotency extension is installed in schema {installed_in:?}, not in the configured {:?}",
                    schema.name()
                ),
                source: None,
            });
        }
        Ok(version)
    }

    /// What the flows run with.
    pub(crate) fn context<'a>(&'a self, schema: &'a Schema) -> Context<'a, D> {
        Context { driver: &self.driver, settings: &self.settings, schema }
    }

    /// The in-transaction flow: reserve the key, run `work` in the same transaction, record its
    /// result with `idem_complete`, commit. The closure runs at most once per key across every
    /// caller whose run commits; duplicates get the stored result.
    ///
    /// - a result whose [`Replayable::verdict`] is [`crate::Verdict::Success`] /
    ///   [`crate::Verdict::Failure`] commits with the key as `SUCCESS` / `FAILED` and is
    ///   returned as `Outcome::Executed`;
    /// - a [`crate::Verdict::Transient`] result rolls the transaction back and releases the key
    ///   (`Outcome::Released`, or `Outcome::Poisoned` when that reached `max_retries`);
    /// - an error whose [`HandlerError::disposition`] is transient does the same and returns
    ///   [`Error::Handler`] (or [`Error::Poisoned`]); a permanent one rolls back and records
    ///   `FAILED` with its response;
    /// - 40001 / 40P01, wherever they arise (the closure included, recognised through
    ///   [`HandlerError::sqlstate`]), roll the whole transaction back and retry it with
    ///   backoff, up to [`Settings::serialization_retries`] times, without counting a failure:
    ///   the closure may run again, but only one of its runs can ever commit.
    ///
    /// No savepoint is taken on any path. Round trips: `BEGIN` and the reservation leave
    /// together (a replay or any other answer is returned after this one; the `ROLLBACK` that
    /// ends its transaction is queued without waiting and the connection returns to the pool at
    /// once); then your statements; then `idem_complete` and `COMMIT` together (the completion
    /// aborts the transaction if the key was lost, so the `COMMIT` behind it can only commit a
    /// completed key). A closure with one statement costs three round trips; a failure path one
    /// more. Prepare your statements with `tx.prepare_cached(..)`: a query given as a string
    /// costs an extra round trip to parse it. Over the sqlx driver (feature `sqlx`) the closure
    /// gets the transaction's `&mut sqlx::PgConnection`; sqlx pipelines nothing, so each request
    /// above travels as one simple query, and the counts are the same. That transaction was
    /// begun by a statement sqlx's transaction manager did not send: do not `begin()`, `commit()`
    /// or `rollback()` on the connection inside the closure (write `SAVEPOINT` statements if you
    /// need one).
    ///
    /// The closure is boxed (`|tx| Box::pin(async move { .. })`) so that it may borrow from its
    /// surroundings and keep state across tries; [`Idempotency::run_async`] takes an
    /// `async move |tx| { .. }` closure instead (and says why both exist).
    ///
    /// # Errors
    ///
    /// [`Error::InProgress`] (another attempt holds the key; [`Error::retry_after`]),
    /// [`Error::Mismatch`], [`Error::Failed`] (a stored failure: replay it), [`Error::Handler`] /
    /// [`Error::Poisoned`] (your closure's error, as above), [`Error::LeaseLost`],
    /// [`Error::ResponseTooLarge`], [`Error::StoreUnavailable`] (the pool, the connection or
    /// [`Settings::call_timeout`]: nothing was kept, a retry is safe), [`Error::Decode`] (a
    /// stored response that is not a `T`), [`Error::IncompatibleExtension`],
    /// [`Error::Database`], [`Error::Protocol`]. [`Error::is_retryable`] says which a retry may
    /// cure; the repository's docs/rust-client.md, "Errors", has the table.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped at any await, no pooled connection is left inside a transaction (the
    /// connection is closed and the server rolls back) and the key is free for the next attempt,
    /// or completed when the `COMMIT` had already left (docs/rust-client.md, "When a call is dropped").
    pub async fn run<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, mut work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t mut D::Conn) -> TxFuture<'t, T, E> + Send,
    {
        self.run_tx(key, fingerprint, lend::<D, _, _, _>(move |tx| work(D::conn(tx)))).await
    }

    /// [`Idempotency::run`] with the work given the driver's transaction itself (the layer lends
    /// it to the request in its shareable form). Hidden: the adapter crates' seam.
    #[doc(hidden)]
    pub async fn run_tx<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E> + Send,
    {
        let call = async {
            if let Some(hit) = crate::cache::hit(self.settings.replay_cache.as_ref(), key, fingerprint) {
                return hit;
            }
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::in_transaction::run(&self.context(&schema), key, fingerprint, work).await
        };
        crate::trace::call("run", key, deadline::bounded("run", self.settings.call_timeout, call)).await
    }

    /// The two-phase flow, for a side effect outside the database: reserve (its own
    /// transaction), run `call` while a background task heartbeats the lease, then in one
    /// transaction let `record` write the local result, complete the key and commit.
    ///
    /// A transient result or error from `call` releases the key (one round trip); a permanent
    /// error stores it as `FAILED`. If the lease was lost meanwhile (recovered or taken over),
    /// `record`'s writes are rolled back and [`Error::LeaseLost`] is returned.
    ///
    /// A heartbeat the server refuses (an error other than a lost connection, a serialization
    /// failure or a deadlock, which are tried again a third of a lease later) is traced at error
    /// level (feature `tracing`) and stops the heartbeats: the lease lapses while `call` runs
    /// on, and the completion's fence decides as above (`LeaseLost` if recovery or another
    /// attempt took the key meanwhile).
    ///
    /// Once `call` has succeeded the outside effect has happened, so the key is never released
    /// again: the local transaction is retried (with the heartbeat still running) on 40001,
    /// 40P01 and lost connections, up to [`Settings::serialization_retries`] times; `record` is
    /// therefore `FnMut` and may run more than once, but only one of its runs commits. If it
    /// still fails, the key is completed with `call`'s result on its own, so a retry replays it
    /// and never calls out again, and [`Error::RecordFailed`] hands you the result to reconcile
    /// your local state. The heartbeat stops on every exit path.
    ///
    /// Dropped before `call` started (while the reservation is in flight), it leaves nothing: the
    /// reservation runs in a task of its own, and a key it created after the caller was gone is
    /// released (`idem_release`: one transient failure counted, but never poisoned). Dropped once
    /// `call` may have started, it keeps the key: the heartbeat stops, the record stays
    /// `PROCESSING` until its lease ends, and then `idem_recover_stuck` handles it per its
    /// `action` (`fail` by default, since the outside effect may have happened). That holds too
    /// for a drop while a failed `call`'s release is in flight: the release may not have
    /// happened, and the key then waits for its lease like any other.
    ///
    /// [`Settings::call_timeout`] bounds the database steps before `call` (the schema lookup,
    /// the reservation), and afresh those after it ended (release or `record` and completion,
    /// with their retries); `call` itself, once started, is never cut (bound it yourself, e.g.
    /// with `tokio::time::timeout`, and return a transient error). When the bound fires after
    /// `call` succeeded, the key is left `PROCESSING` as a crash would leave it (never
    /// released, so `call` is not made again for it): the answer is
    /// [`Error::StoreUnavailable`], and the key is settled by `idem_recover_stuck` once its
    /// lease has expired. The same when it fires while a failed `call`'s release is in flight.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::run`], with [`Error::Handler`] / [`Error::Poisoned`] carrying
    /// `call`'s error (or `record`'s, inside [`Error::RecordFailed`]), and
    /// [`Error::RecordFailed`] when `call` succeeded but the local transaction failed for good
    /// (reconcile from its `response`); the repository's docs/rust-client.md, "Errors".
    ///
    /// # Cancel safety
    ///
    /// Dropped before `call` started, nothing is kept; dropped once `call` may have started,
    /// the key stays `PROCESSING` until its lease ends and `idem_recover_stuck` settles it, so
    /// `call` is never made twice (above, and docs/rust-client.md, "When a call is dropped").
    pub async fn run_external<T, E, C, R>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        call: C,
        record: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        C: std::future::Future<Output = Result<T, E>> + Send,
        R: for<'t> FnMut(&'t mut D::Conn, &'t T) -> TxFuture<'t, (), E> + Send,
    {
        let outside = deadline::Outside::default();
        let call = outside.wrap(call);
        let flow = async {
            if let Some(hit) = crate::cache::hit(self.settings.replay_cache.as_ref(), key, fingerprint) {
                return hit;
            }
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::two_phase::run(&self.context(&schema), key, fingerprint, false, |_, _| call, record).await
        };
        crate::trace::call("run_external", key, deadline::around_outside("run_external", self.settings.call_timeout, outside, flow)).await
    }
}

/// Gives a closure the higher-ranked signature of the flow's work.
fn lend<D: Driver, T, E, F: for<'t> FnMut(&'t mut D::Tx) -> TxFuture<'t, T, E>>(f: F) -> F {
    f
}
