//! The connection guard of the tokio-postgres driver: [`Tx`], a pooled connection that knows
//! whether a transaction may be open on it and whether a request of ours is still unanswered.

use super::cancel::CancelTls;
use crate::driver::lent::{Lendable, Lent};
use deadpool_postgres::Client;
use std::ops::Deref;

/// The transaction of [`crate::Idempotency::run`] as your closure sees it: a pooled connection
/// inside the transaction that holds the reservation, lent to the closure as `&mut Tx` for the
/// length of its future (it is not `Clone`, so the closure cannot keep it). It dereferences to
/// `deadpool_postgres::Client` (`query`, `execute`, `prepare_cached`, and
/// `deadpool_postgres::GenericClient` for helpers generic over the executor). The client begins,
/// completes and commits it: do not `COMMIT` or `ROLLBACK` yourself.
///
/// A transaction counts as open from the moment its `BEGIN` is sent until its end is answered
/// (or queued), and a request as in flight until its last answer arrived. Dropped in either state
/// (a dropped future, a timeout, a panic), the guard does not give the connection back to the
/// pool: it asks the server to cancel what the connection is running and closes it, so the
/// server rolls the transaction back and nobody ever gets a connection in the middle of someone
/// else's transaction. The cancel request travels on a connection of its own, opened through the
/// pool's TLS connector under the connection's `sslmode` (see [`crate::Postgres::cancel_tls`]): a
/// statement waiting on a lock ends at once, over TLS as in plain text, and with it the
/// transaction, the reservation and the key's lock.
///
/// A closure cannot keep it past its future: it is lent as `&mut Tx` and cannot be cloned.
///
/// ```compile_fail
/// fn keep(tx: &mut idempotency_client::Tx) -> idempotency_client::Tx {
///     tx.clone()
/// }
/// ```
pub struct Tx {
    pub(super) client: Option<Client>,
    /// A transaction may be open: its BEGIN was sent and its end not yet seen.
    pub(super) open: bool,
    /// A request was sent whose answers have not all arrived.
    pub(super) busy: bool,
    /// How a cancel request reaches the server (None for a guard lent out).
    cancel: Option<CancelTls>,
}

impl Tx {
    pub(super) fn new(client: Client, cancel: CancelTls) -> Self {
        Tx { client: Some(client), open: false, busy: false, cancel: Some(cancel) }
    }

    /// The connection, or None for a guard lent out (see [`Lent`]).
    pub(super) fn client(&self) -> Option<&Client> {
        self.client.as_ref()
    }
}

impl Deref for Tx {
    type Target = Client;

    fn deref(&self) -> &Client {
        match &self.client {
            Some(client) => client,
            None => unreachable!("a closure is only given a guard that holds its connection"),
        }
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").field("open", &self.open).field("busy", &self.busy).finish_non_exhaustive()
    }
}

impl crate::driver::Sealed for Tx {}

impl Lendable for Tx {
    type Conn = Client;

    fn held(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    fn empty() -> Self {
        Tx { client: None, open: false, busy: false, cancel: None }
    }
}

/// The request's transaction of an in-transaction route over [`super::Postgres`] (the layer's
/// `Transaction<Postgres>` dereferences to it): `lock().await` is the pooled
/// `deadpool_postgres::Client` inside the transaction.
pub type SharedClient = Lent<Tx>;

impl Drop for Tx {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        if !(self.open || self.busy) {
            return; // back to the pool
        }
        // A statement may be running (a lock wait, a stalled server): ask the server to cancel
        // it, so the backend ends its transaction now rather than when the statement ends. The
        // request is made through the pool's connector: one without TLS never reaches a server
        // the connection's sslmode says to reach over TLS.
        if let (Ok(runtime), Some(cancel)) = (tokio::runtime::Handle::try_current(), &self.cancel) {
            runtime.spawn(cancel.send(client.cancel_token()));
        }
        // Detached from the pool and closed: the server rolls the transaction back.
        drop(deadpool_postgres::Object::take(client));
    }
}
