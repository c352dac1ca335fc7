//! The connection guard of the sqlx driver: [`SqlxTx`], a pooled connection that knows whether
//! a transaction is open on it, and its shareable form for the layer, [`SharedConnection`].

use crate::driver::lent::{Lendable, Lent};
use sqlx::pool::PoolConnection;
use sqlx::PgConnection;

/// A pooled connection of the sqlx driver, inside the transaction that holds the reservation
/// while a flow runs your closure, which gets its `&mut sqlx::PgConnection` for the length of its
/// future. The transaction is begun by a statement of this crate that sqlx's own transaction
/// manager did not send, so inside your closure sqlx counts no transaction: do not `begin()`,
/// `COMMIT` or `ROLLBACK` there (use `SAVEPOINT` statements if you need one). A transaction
/// counts as open from the moment its `BEGIN` is sent until its end is answered (or queued), and
/// a request as in flight until its answer arrived; dropped in either state, the guard closes
/// the connection instead of returning it to the pool. sqlx sends no cancel request: the server
/// rolls back when it sees the close, at once when idle, and while a statement runs (a lock wait)
/// within `client_connection_check_interval`, which a handle made from a URL
/// (`Idempotency::<Sqlx>::from_url`) sets to 1 s on each connection, TLS or not: the same end as
/// the tokio-postgres driver's cancel request, one check later. Over a pool of your own
/// (`Idempotency::<Sqlx>::from_pool`), set it yourself (`PgPoolOptions::after_connect`), or the backend
/// runs on until its statement ends.
pub struct SqlxTx {
    pub(super) conn: Option<PoolConnection<sqlx::Postgres>>,
    pub(super) open: bool,
    pub(super) busy: bool,
}

impl SqlxTx {
    pub(super) fn new(conn: PoolConnection<sqlx::Postgres>) -> Self {
        SqlxTx { conn: Some(conn), open: false, busy: false }
    }
}

impl std::fmt::Debug for SqlxTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxTx").field("open", &self.open).field("busy", &self.busy).finish_non_exhaustive()
    }
}

impl crate::driver::Sealed for SqlxTx {}

impl Lendable for SqlxTx {
    type Conn = PgConnection;

    fn held(&mut self) -> Option<&mut PgConnection> {
        self.conn.as_deref_mut()
    }

    fn empty() -> Self {
        SqlxTx { conn: None, open: false, busy: false }
    }
}

impl Drop for SqlxTx {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            if self.open || self.busy {
                // The server rolls the transaction back when it sees the close (a running
                // statement: at its next client_connection_check_interval, see connect.rs).
                conn.close_on_drop();
            }
        }
    }
}

/// The request's transaction of an in-transaction route over [`super::Sqlx`] (the layer's
/// `Transaction<Sqlx>` dereferences to it): `lock().await` is the `sqlx::PgConnection` inside
/// the transaction (its error converts into `sqlx::Error`).
///
/// ```no_run
/// # async fn demo(tx: idempotency_client::SharedConnection) -> Result<(), sqlx::Error> {
/// let mut conn = tx.lock().await?;
/// sqlx::query("INSERT INTO charges (user_id, amount) VALUES ($1, $2)").bind("u").bind(1i64).execute(&mut *conn).await?;
/// # Ok(())
/// # }
/// ```
pub type SharedConnection = Lent<SqlxTx>;
