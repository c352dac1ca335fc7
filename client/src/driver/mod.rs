//! The driver interface: what a Postgres stack does for the flows, and nothing about their
//! sequences. A driver hands out pooled connections ([`Driver::connection`]) and sends a
//! request: some [`Step`]s, in order, pipelined into one round trip where the driver can
//! ([`Driver::send`]), answering the rows of its queries through the one column-access trait
//! (`row::Row`). Its errors are read by the one classification table
//! (`classify.rs`). The flows (`flow/`) own every sequence, retry and decoding.
//!
//! Two drivers: `Postgres` (tokio-postgres over a deadpool pool, feature `postgres`, the
//! default: prepared statements, pipelined) and, with the `sqlx` feature, `Sqlx` (a
//! `sqlx::PgPool`: sqlx pipelines nothing, so a request of several steps travels as one simple
//! query with its values bound into the text by `sql::bind`).

pub(crate) mod lent;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlx")]
pub(crate) mod sqlx;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{Postgres, SharedClient, Tx};
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub use self::sqlx::{SharedConnection, Sqlx, SqlxTx};

#[cfg(not(any(feature = "postgres", feature = "sqlx")))]
compile_error!("idempotency-client needs a driver: its feature `postgres` (the default, tokio-postgres) or `sqlx`");

/// Declares a struct whose driver parameter, written `D: Driver = Postgres`, defaults to
/// [`Postgres`] with the `postgres` feature and has no default without it: a plain
/// `Idempotency` (a layer, a `Transaction`) is the tokio-postgres one whatever features the
/// other crates of a build turn on, and sqlx users name `Idempotency<Sqlx>`. (Features are
/// additive: a default that moved with them would change the type of code written for sqlx
/// when some other dependency turned `postgres` on.) Exported, hidden, for the adapter crates
/// (idempotency-tower, -actix, -tonic): which of its two forms exists is decided here, by this
/// crate's `postgres` feature, so their types default exactly as `Idempotency` does.
#[cfg(feature = "postgres")]
#[doc(hidden)]
#[macro_export]
macro_rules! postgres_by_default {
    (@scan [$($done:tt)*] = Postgres $($rest:tt)*) => {
        $($done)* = $crate::Postgres $($rest)*
    };
    (@scan [$($done:tt)*] $next:tt $($rest:tt)*) => {
        $crate::postgres_by_default!(@scan [$($done)* $next] $($rest)*);
    };
    ($(#[$meta:meta])* $vis:vis struct $name:ident < $($rest:tt)*) => {
        $crate::postgres_by_default!(@scan [$(#[$meta])* $vis struct $name <] $($rest)*);
    };
}

/// [`postgres_by_default!`] without the `postgres` feature: the parameter has no default.
#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! postgres_by_default {
    (@scan [$($done:tt)*] = Postgres $($rest:tt)*) => {
        $($done)* $($rest)*
    };
    (@scan [$($done:tt)*] $next:tt $($rest:tt)*) => {
        $crate::postgres_by_default!(@scan [$($done)* $next] $($rest)*);
    };
    ($(#[$meta:meta])* $vis:vis struct $name:ident < $($rest:tt)*) => {
        $crate::postgres_by_default!(@scan [$(#[$meta])* $vis struct $name <] $($rest)*);
    };
}
// The path the crate's own modules use (`crate::driver::postgres_by_default`).
pub(crate) use crate::postgres_by_default;

use crate::error::Error;
use crate::row::Row;
use crate::settings::Isolation;
use crate::sql::Param;
use std::future::Future;

mod sealed {
    pub trait Sealed {}
}
pub(crate) use sealed::Sealed;
pub use lent::{Lease, Lendable, Lent, TransactionEnded};

/// A flow's request on a guard whose connection is lent out: a handler kept the layer's
/// `Transaction` locked after it returned.
pub(crate) fn not_given_back() -> Error {
    Error::protocol("the request's transaction was not given back: a handler kept its Transaction locked after returning")
}

/// One step of a request. Public only because [`Driver::send`] names it; hidden from the
/// docs with the trait's other machinery.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// `BEGIN`, at an isolation level or the server's default.
    Begin(Option<Isolation>),
    /// A statement of `sql.rs` and the values of its `$1`..`$n`.
    Query(&'a str, Vec<Param<'a>>),
    /// `COMMIT`.
    Commit,
    /// `ROLLBACK`.
    Rollback,
}

impl Step<'_> {
    /// The text of a `BEGIN`, `COMMIT` or `ROLLBACK` (None for a query).
    pub(crate) fn control(&self) -> Option<&'static str> {
        match self {
            Step::Begin(isolation) => Some(Isolation::begin_sql(*isolation)),
            Step::Commit => Some("COMMIT"),
            Step::Rollback => Some("ROLLBACK"),
            Step::Query(..) => None,
        }
    }

    /// The step's text with its values bound, for a driver that sends simple queries.
    #[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
    pub(crate) fn text(&self) -> std::borrow::Cow<'_, str> {
        match (self, self.control()) {
            (Step::Query(sql, params), _) => crate::sql::bind(sql, params).into(),
            (_, Some(control)) => control.into(),
            (_, None) => unreachable!("every step but a query is a control statement"),
        }
    }

    /// Whether the transaction is open after this step ran (None: a query, which changes
    /// nothing).
    pub(crate) fn opens(&self) -> Option<bool> {
        match self {
            Step::Begin(_) => Some(true),
            Step::Commit | Step::Rollback => Some(false),
            Step::Query(..) => None,
        }
    }
}

/// A Postgres stack the flows run on: `Postgres` or `Sqlx`. Implemented by this crate only
/// (sealed); how a third one would be added: CONTRIBUTING.md, "A new driver". What a user of
/// the crate names is the driver type and [`Driver::Conn`], what a closure receives; the rest
/// (the pooled connection's guard, its shareable form, the rows, `send`, `queue`, `share`) is
/// the flows' machinery, hidden from these docs: it may change in any release.
pub trait Driver: Sealed + Clone + Send + Sync + 'static {
    /// A pooled connection as a flow holds it, whether a transaction may be open on it and
    /// whether a request of ours is unanswered, both recorded before the request is sent.
    /// Dropped in either state (a dropped future, a timeout, a panic), it closes the connection
    /// (the server rolls back) instead of returning it to the pool.
    #[doc(hidden)]
    type Tx: Send + 'static;

    /// What your closures receive, as `&mut Self::Conn`: for `Postgres` its `Tx` (which
    /// dereferences to the pooled client), for `Sqlx` a `sqlx::PgConnection`.
    type Conn: Send + ?Sized;

    /// The form of the open transaction an HTTP handler is given (the layer's `Transaction`):
    /// cloneable and `'static`, so it can travel in the request.
    #[doc(hidden)]
    type Shared: Clone + Lease;

    /// A row of an answer.
    #[doc(hidden)]
    type Row: Row;

    /// The connection inside `tx`, for a closure.
    #[doc(hidden)]
    fn conn(tx: &mut Self::Tx) -> &mut Self::Conn;

    /// Lends `tx` out in its shareable form (for the layer, for the length of a request).
    #[doc(hidden)]
    fn share(tx: &mut Self::Tx) -> Self::Shared;

    /// Takes back what [`Driver::share`] lent; a copy kept by the handler after that is empty.
    #[doc(hidden)]
    fn unshare(tx: &mut Self::Tx, shared: Self::Shared);

    /// Whether a transaction is open on `tx` (begun and not seen to end).
    #[doc(hidden)]
    fn in_transaction(tx: &Self::Tx) -> bool;

    /// A connection from the pool, outside any transaction.
    #[doc(hidden)]
    fn connection(&self) -> impl Future<Output = Result<Self::Tx, Error>> + Send;

    /// Sends `steps` in order, in one round trip where the driver can, and answers the rows of
    /// its queries, in order. The first error is returned, classified as an error of this
    /// crate's own statements (`classify::Origin::Ours`; a completion that aborted because the
    /// key was lost is [`Error::LeaseLost`]); the server skipped or aborted what followed it.
    #[doc(hidden)]
    fn send<'a>(tx: &'a mut Self::Tx, steps: &'a [Step<'a>]) -> impl Future<Output = Result<Vec<Self::Row>, Error>> + Send + 'a;

    /// Queues a `BEGIN` or `ROLLBACK` without waiting for its answer: it leaves with the next
    /// request on the connection (or, for a connection given back to the pool, before the pool
    /// hands it out again).
    #[doc(hidden)]
    fn queue(tx: &mut Self::Tx, step: &Step<'_>);
}
