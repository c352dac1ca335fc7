//! The connection guard of the tokio-postgres driver: [`Tx`], a pooled connection that knows
//! whether a transaction is open on it.

use deadpool_postgres::Client;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The transaction of [`crate::Idempotency::run`] as your closure sees it: a pooled connection
/// inside the transaction that holds the reservation. It dereferences to
/// `deadpool_postgres::Client` (`query`, `execute`, `prepare_cached`, and
/// `deadpool_postgres::GenericClient` for helpers generic over the executor). The client begins,
/// completes and commits it: do not `COMMIT` or `ROLLBACK` yourself, and do not keep it after
/// your closure returns.
#[derive(Clone)]
pub struct Tx(pub(super) Arc<Open>);

impl Deref for Tx {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.0.client()
    }
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tx")
    }
}

/// A pooled connection and whether a transaction this crate began is open on it. Dropped while
/// one is open (not seen to end: a `COMMIT` or `ROLLBACK` answered by the server, or queued),
/// it closes the connection instead of returning it to the pool, so no caller ever gets a
/// connection in the middle of someone else's transaction (a dropped `run` future, an error
/// between statements, a handler that panicked).
pub(super) struct Open {
    client: Option<Client>,
    open: AtomicBool,
}

impl Open {
    pub(super) fn new(client: Client) -> Self {
        Open { client: Some(client), open: AtomicBool::new(false) }
    }

    pub(super) fn client(&self) -> &Client {
        match &self.client {
            Some(client) => client,
            None => unreachable!("the connection is only taken out on drop"),
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A transaction was seen to begin (true) or end (false).
    pub(super) fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::Release);
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if self.open.load(Ordering::Acquire) {
                // Detach it from the pool and close it: the server rolls the transaction back.
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}
