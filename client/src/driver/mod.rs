//! The driver interface: the statements a flow sends and how they are pipelined. The flows
//! (`flow::in_transaction`, `flow::two_phase`) are written once against it; a Postgres stack is
//! one implementation ([`Postgres`]: tokio-postgres with a deadpool pool), and with the `sqlx`
//! feature [`Sqlx`] (a `sqlx::PgPool`) another. The statement texts come from one place
//! (`sql.rs`), whatever the driver.
//!
//! No method takes a savepoint: the failure paths of the in-transaction flow roll the whole
//! transaction back and record the failure in a fresh one.

pub(crate) mod postgres;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx_hosts;

pub use postgres::{Postgres, Tx};
#[cfg(feature = "sqlx")]
pub use self::sqlx::{SharedConnection, Sqlx, SqlxTx};

use crate::error::Error;
use crate::ops::{ReleaseOutcome, ReserveOptions, Reservation, Status, Token};
use crate::sql::Schema;
use crate::settings::Isolation;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;

/// The rows of `idem_reserve_many`: each key with its reservation, in the statement's order.
pub(crate) type Reservations = Vec<(String, Reservation)>;

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;

/// A Postgres stack the flows run on. Implemented by this crate only.
pub trait Driver: Sealed + Clone + Send + Sync + 'static {
    /// An open transaction as a flow holds it. Dropping it before the transaction was seen to
    /// end closes the connection (the server rolls back) instead of returning it to the pool.
    type Tx: Send + 'static;

    /// What your closures receive, as `&mut Self::Conn`: for [`Postgres`] its [`Tx`] (which
    /// dereferences to the pooled client), for `Sqlx` a `sqlx::PgConnection`.
    type Conn: Send + ?Sized;

    /// The form of the open transaction an HTTP handler is given (the layer's `Transaction`):
    /// cloneable and `'static`, so it can travel in the request.
    type Shared: Clone + Send + Sync + 'static;

    /// The connection inside `tx`, for a closure.
    fn conn(tx: &mut Self::Tx) -> &mut Self::Conn;

    /// Lends `tx` out in its shareable form (for the layer, for the length of a request).
    fn share(tx: &mut Self::Tx) -> Self::Shared;

    /// Takes back what [`Driver::share`] lent; a copy kept by the handler after that is empty.
    fn unshare(tx: &mut Self::Tx, shared: Self::Shared);

    /// The installed extension's schema and version (not yet checked).
    fn installed(&self) -> impl Future<Output = Result<(String, String), Error>> + Send;

    /// Round trip 1 of the in-transaction flow: a connection, `BEGIN` and `idem_reserve`,
    /// pipelined. On any answer but `created` the caller ends it with [`Driver::abandon`].
    fn begin_and_reserve(
        &self,
        schema: &Schema,
        isolation: Option<Isolation>,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
    ) -> impl Future<Output = Result<(Self::Tx, Reservation), Error>> + Send;

    /// Ends a transaction that wrote nothing, without waiting for the server's answer.
    fn abandon(tx: Self::Tx);

    /// The last round trip: `idem_complete` and `COMMIT`, pipelined. False when the key was
    /// lost: the completion then aborts the transaction, so the `COMMIT` behind it rolls back.
    fn complete_and_commit(
        tx: &mut Self::Tx,
        schema: &Schema,
        key: &Key,
        token: Token,
        response: Option<&Value>,
        status: Status,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// The transient-failure path: `ROLLBACK` (the attempt's writes and its reservation), then
    /// in a fresh transaction reserve the key again and release it (counting the failure), and
    /// `COMMIT`; one round trip. `None` when the key could not be taken again (another attempt
    /// holds it or finished it meanwhile): nothing was counted.
    fn rollback_and_release(
        tx: &mut Self::Tx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        max_retries: Option<i32>,
    ) -> impl Future<Output = Result<Option<ReleaseOutcome>, Error>> + Send;

    /// The permanent-failure path: as [`Driver::rollback_and_release`], but the key is completed
    /// `FAILED` with `response`. False when the key could not be taken again.
    fn rollback_and_fail(
        tx: &mut Self::Tx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        response: Option<&Value>,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Round trip 1 of the batch flow: a connection, `BEGIN` and `reserve_many` (one
    /// `idem_reserve_many` statement with its values bound in the text, from `sql.rs`); its rows
    /// as (`key`, reservation), in the statement's order. Pipelined where the driver can (one
    /// simple query over tokio-postgres; sqlx waits for the `BEGIN`, so two round trips there).
    /// On an error the transaction is rolled back. The caller ends the transaction with
    /// [`Driver::abandon`] when no key was created.
    fn begin_and_reserve_many(
        &self,
        isolation: Option<Isolation>,
        reserve_many: &str,
    ) -> impl Future<Output = Result<(Self::Tx, Reservations), Error>> + Send;

    /// The batch flow's last round trip: `complete_many` (one or more `idem_complete_many`
    /// statements, values bound in the text, each aborting the transaction unless every key of
    /// it completed) and `COMMIT`, pipelined where the driver can (one simple query over
    /// tokio-postgres; two round trips over sqlx). False when a key was lost: the transaction
    /// was rolled back.
    fn complete_many_and_commit(tx: &mut Self::Tx, complete_many: &str) -> impl Future<Output = Result<bool, Error>> + Send;

    /// `ROLLBACK`, waited for.
    fn rollback(tx: &mut Self::Tx) -> impl Future<Output = ()> + Send;

    /// A connection for a transaction whose `BEGIN` is sent by [`Driver::begin`].
    fn open(&self) -> impl Future<Output = Result<Self::Tx, Error>> + Send;

    /// `BEGIN` on `tx`. A driver that pipelines only queues it, so it leaves with the next
    /// statement (a closure's first); `BEGIN` on a fresh connection can only fail with the
    /// connection, and that statement then fails too.
    fn begin(tx: &mut Self::Tx) -> impl Future<Output = Result<(), Error>> + Send;

    /// `idem_reserve` in a transaction of its own.
    fn reserve(
        &self,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
    ) -> impl Future<Output = Result<Reservation, Error>> + Send;

    /// `idem_release` in a transaction of its own.
    fn release(
        &self,
        schema: &Schema,
        key: &Key,
        token: Token,
        max_retries: Option<i32>,
    ) -> impl Future<Output = Result<ReleaseOutcome, Error>> + Send;

    /// `idem_complete` in a transaction of its own.
    fn complete(
        &self,
        schema: &Schema,
        key: &Key,
        token: Token,
        response: Option<&Value>,
        status: Status,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// `idem_heartbeat` in a transaction of its own.
    fn heartbeat(
        &self,
        schema: &Schema,
        key: &Key,
        token: Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
}
