//! The transaction an in-transaction route's handler writes through: [`Connection`], the
//! connection itself for the handler's life (extracted once), and [`Transaction`], its shared
//! form that is locked per use; [`TransactionRejection`] when neither can be had.

use idempotency_client::driver::Lease;
use idempotency_client::{postgres_by_default, Driver, TransactionEnded};
use std::ops::{Deref, DerefMut};

postgres_by_default! {
/// The transaction that holds the request's reservation, for an in-transaction route's handler.
/// It dereferences to the driver's [`Lent`](idempotency_client::Lent) guard, whose `lock().await` is the connection
/// inside the transaction: over `Postgres` the pooled `deadpool_postgres::Client`
/// (`query`, `execute`, `prepare_cached`; `SharedClient`), over `Sqlx` (feature `sqlx`)
/// the `sqlx::PgConnection` (`.execute(&mut *conn)`; `SharedConnection`). Whatever the handler
/// writes through it commits together with the stored response, or not at all. The layer
/// begins, completes and commits it: do not `COMMIT` or `ROLLBACK` yourself. Once the handler
/// has returned, a copy it kept reaches no connection: its `lock` is
/// [`TransactionEnded`].
///
/// For the transaction used as the connection itself (`tx.execute(..)`, `&mut *tx`), extract
/// a [`Connection`] instead: it holds the connection for the handler's life, where this form is
/// locked per use and may be cloned.
///
/// With the `axum` feature it is an axum extractor (idempotency-actix has its actix-web twin);
/// any other tower service finds it in the request's extensions.
pub struct Transaction<D: Driver = Postgres>(pub(crate) D::Shared);
}

impl<D: Driver> Clone for Transaction<D> {
    fn clone(&self) -> Self {
        Transaction(self.0.clone())
    }
}

impl<D: Driver> Deref for Transaction<D> {
    type Target = D::Shared;

    fn deref(&self) -> &D::Shared {
        &self.0
    }
}

impl<D: Driver> std::fmt::Debug for Transaction<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Transaction")
    }
}

/// The shared transaction found in a request's extensions, unless its connection was taken
/// (`taken`: a [`Taken`] is there too): what every stack's extractor answers.
#[doc(hidden)]
pub fn shared_of<D: Driver>(taken: bool, found: Option<&Transaction<D>>) -> Result<Transaction<D>, TransactionRejection> {
    match (taken, found) {
        (true, _) => Err(TransactionRejection::Taken),
        (false, found) => found.cloned().ok_or(TransactionRejection::Missing),
    }
}

/// Marks a request whose [`Connection`] was taken (in its extensions).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Taken;

postgres_by_default! {
/// The request's transaction used as the connection itself, for an in-transaction route's
/// handler: `async fn create(mut tx: Connection, ..)`, then `tx.execute(..)` (over
/// `Postgres` it dereferences to the pooled `deadpool_postgres::Client`, a
/// `GenericClient`) or `sqlx::query(..).execute(&mut *tx)` (over `Sqlx`, feature `sqlx`, to the
/// `sqlx::PgConnection`, an `Executor` as `&mut *tx`). Whatever the handler writes through it
/// commits together with the stored response, or not at all; the layer begins, completes and
/// commits the transaction after the handler: do not `COMMIT` or `ROLLBACK` yourself.
///
/// The connection is lent from the request for the handler's life and given back when the
/// `Connection` is dropped (when the handler returns), as axum-sqlx-tx's `Tx` is. It is taken
/// once per request: a second extraction, or a [`Transaction`] extracted after it, is
/// [`TransactionRejection::Taken`] (a [`Transaction`] extracted before it must not be locked
/// while it is held: the lock would wait for the handler itself). It is not `Clone`: a copy
/// could outlive the request.
///
/// Why a type beside [`Transaction`] and not `Transaction` itself: `Transaction::lock(&self)`
/// hands out the connection mutably from a shared reference, which a value that dereferences to
/// the connection cannot also do without `unsafe`; changing it would break every handler and
/// helper written against it. `Transaction` keeps working as before; `Connection` is the form to
/// write new handlers with.
///
/// With the `axum` feature it is an axum extractor (idempotency-actix has its actix-web twin); a
/// tonic method or any other tower service takes it from the request's extensions with
/// [`Connection::take`].
pub struct Connection<D: Driver = Postgres> {
    held: <D::Shared as Lease>::Held,
}
}

impl<D: Driver> Connection<D> {
    /// Takes the request's connection from `extensions` (a tonic method's
    /// `request.extensions_mut()`, or a tower service's request's), held until the returned
    /// `Connection` is dropped.
    ///
    /// # Errors
    ///
    /// [`TransactionRejection::Missing`] without an in-transaction layer in front,
    /// [`TransactionRejection::Taken`] when it was already taken for this request,
    /// [`TransactionRejection::Ended`] once the request was answered.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it completes, it holds nothing, but the request's connection
    /// counts as taken.
    pub async fn take(extensions: &mut http::Extensions) -> Result<Self, TransactionRejection> {
        let shared = shared_of(extensions.get::<Taken>().is_some(), extensions.get::<Transaction<D>>())?;
        extensions.insert(Taken);
        Self::hold(shared).await
    }

    /// The connection of `shared`, held (an adapter's extractor, once it marked the request
    /// [`Taken`]).
    #[doc(hidden)]
    pub async fn hold(shared: Transaction<D>) -> Result<Self, TransactionRejection> {
        let held = shared.0.hold().await.map_err(|TransactionEnded| TransactionRejection::Ended)?;
        Ok(Connection { held })
    }
}

impl<D: Driver> Deref for Connection<D> {
    type Target = <D::Shared as Lease>::Conn;

    fn deref(&self) -> &Self::Target {
        &self.held
    }
}

impl<D: Driver> DerefMut for Connection<D> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.held
    }
}

impl<D: Driver> std::fmt::Debug for Connection<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// Why a handler got no [`Connection`] or [`Transaction`]: answered as a 500 problem
/// (`urn:idempotency:problem:no-transaction`), whose detail is this error's text (with the
/// `axum` feature it is an `IntoResponse`; idempotency-actix answers it the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionRejection {
    /// The route is not behind an `IdempotencyLayer` in in-transaction mode.
    #[error("this route is not behind an IdempotencyLayer in in-transaction mode")]
    Missing,
    /// The request's [`Connection`] was already taken: extract it once per handler, and not
    /// beside a [`Transaction`] extracted after it.
    #[error("the request's Connection was already taken: extract it once per handler")]
    Taken,
    /// The request was already answered.
    #[error("the idempotency transaction of this request has ended")]
    Ended,
}
