//! [`Lent`]: a flow's connection guard lent to an in-transaction route's handler for the length
//! of one request (the layer's `Transaction`), on either driver. The handler locks it for the
//! connection; when the request is over the flow takes the guard back, and a copy the handler
//! kept reaches nothing: its `lock` is [`TransactionEnded`].

use std::sync::Arc;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard, OwnedMappedMutexGuard, OwnedMutexGuard};

/// A connection guard that can be lent: what it holds, and the empty guard a lent one leaves.
pub trait Lendable: super::Sealed + Send + 'static {
    /// What a handler locks: the pooled connection inside the transaction.
    type Conn: ?Sized;

    /// The connection, or None for a guard that holds nothing.
    fn held(&mut self) -> Option<&mut Self::Conn>;

    /// A guard that holds nothing.
    fn empty() -> Self;
}

/// The request's transaction as an in-transaction route's handler gets it (the layer's
/// `Transaction` dereferences to it): lock it for the connection to run your queries on, and
/// drop the guard before the handler returns. Over [`super::Postgres`] the connection is the
/// pooled `deadpool_postgres::Client`; over `Sqlx` a `sqlx::PgConnection`.
///
/// ```no_run
/// # async fn demo(tx: idempotency_client::SharedClient) -> Result<(), Box<dyn std::error::Error>> {
/// let conn = tx.lock().await?;
/// conn.execute("INSERT INTO charges (user_id, amount) VALUES ($1, $2)", &[&"u", &1i64]).await?;
/// # Ok(())
/// # }
/// ```
pub struct Lent<G>(Arc<Mutex<G>>);

impl<G> Clone for Lent<G> {
    fn clone(&self) -> Self {
        Lent(self.0.clone())
    }
}

impl<G> std::fmt::Debug for Lent<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lent")
    }
}

impl<G: Lendable> Lent<G> {
    /// The connection, inside the request's transaction; [`TransactionEnded`] once the request
    /// is over.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, G::Conn>, TransactionEnded> {
        MutexGuard::try_map(self.0.lock().await, |guard| guard.held()).map_err(|_| TransactionEnded)
    }

    /// The connection, held until the returned guard is dropped (the layer's `Connection`, for
    /// the length of a handler); [`TransactionEnded`] once the request is over.
    pub(crate) async fn hold(&self) -> Result<OwnedMappedMutexGuard<G, G::Conn>, TransactionEnded> {
        OwnedMutexGuard::try_map(self.0.clone().lock_owned().await, |guard| guard.held()).map_err(|_| TransactionEnded)
    }

    /// Lends `guard` out, leaving an empty one in its place.
    pub(crate) fn lend(guard: &mut G) -> Self {
        Lent(Arc::new(Mutex::new(std::mem::replace(guard, G::empty()))))
    }

    /// Takes the guard back into `guard`; every copy is empty afterwards. A handler still
    /// holding the lock keeps the connection: the flow then finds `guard` empty and reports it,
    /// and the connection is closed (not pooled) when that handler lets go of it.
    pub(crate) fn take_back(self, guard: &mut G) {
        if let Ok(mut lent) = self.0.try_lock() {
            *guard = std::mem::replace(&mut *lent, G::empty());
        }
    }
}

/// What a driver's shared transaction lends the layer's `Connection`: the connection, held for
/// the length of a handler. The drivers' machinery, hidden from these docs.
#[doc(hidden)]
pub trait Lease: super::Sealed + Send + Sync + 'static {
    /// The connection inside the transaction.
    type Conn: ?Sized + Send + Sync;

    /// The connection held: the lock on it, given back when dropped.
    type Held: std::ops::DerefMut<Target = Self::Conn> + Send + Sync;

    /// The connection, held until the returned guard is dropped.
    fn hold(&self) -> impl std::future::Future<Output = Result<Self::Held, TransactionEnded>> + Send;
}

impl<G> super::Sealed for Lent<G> {}

impl<G: Lendable + Sync> Lease for Lent<G>
where
    G::Conn: Send + Sync,
{
    type Conn = G::Conn;
    type Held = OwnedMappedMutexGuard<G, G::Conn>;

    fn hold(&self) -> impl std::future::Future<Output = Result<Self::Held, TransactionEnded>> + Send {
        Lent::hold(self)
    }
}

/// The request's transaction has ended: a handler used its `Transaction` after the request
/// was answered (or from a task it spawned that outlived it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency transaction of this request has ended: use the Transaction only inside the handler")]
pub struct TransactionEnded;

#[cfg(feature = "sqlx")]
impl From<TransactionEnded> for sqlx::Error {
    fn from(e: TransactionEnded) -> Self {
        sqlx::Error::Protocol(e.to_string())
    }
}
