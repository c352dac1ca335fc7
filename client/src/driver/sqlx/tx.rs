//! The connection guard of the sqlx driver: [`SqlxTx`], a pooled connection that knows whether
//! a transaction is open on it, and its shareable form for the layer, [`SharedConnection`].

use sqlx::pool::PoolConnection;
use sqlx::PgConnection;
use std::sync::Arc;

/// A pooled connection of the sqlx driver, inside the transaction that holds the reservation
/// while a flow runs your closure, which gets its `&mut sqlx::PgConnection`. The transaction is
/// begun by a statement of this crate that sqlx's own transaction manager did not send, so
/// inside your closure sqlx counts no transaction: do not `begin()`, `COMMIT` or `ROLLBACK`
/// there (use `SAVEPOINT` statements if you need one). Unless the transaction is seen to end (a
/// `COMMIT` or `ROLLBACK` answered or queued), dropping it closes the connection instead of
/// returning it to the pool.
pub struct SqlxTx {
    pub(super) conn: Option<PoolConnection<sqlx::Postgres>>,
    pub(super) open: bool,
}

impl SqlxTx {
    pub(super) fn new(conn: PoolConnection<sqlx::Postgres>) -> Self {
        SqlxTx { conn: Some(conn), open: false }
    }

    /// A guard that holds nothing (what a lent transaction leaves behind).
    pub(super) fn empty() -> Self {
        SqlxTx { conn: None, open: false }
    }
}

impl std::fmt::Debug for SqlxTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SqlxTx")
    }
}

impl Drop for SqlxTx {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            if self.open {
                // The server rolls the transaction back when the connection closes.
                conn.close_on_drop();
            }
        }
    }
}

/// The request's transaction as an in-transaction route's handler gets it over [`super::Sqlx`]
/// (the layer's `Transaction` dereferences to it): lock it for the `sqlx::PgConnection` to run
/// your queries on, and drop the guard before the handler returns.
///
/// ```no_run
/// # async fn demo(tx: idempotency_client::SharedConnection) -> Result<(), sqlx::Error> {
/// let mut conn = tx.lock().await?;
/// sqlx::query("INSERT INTO charges (user_id, amount) VALUES ($1, $2)").bind("u").bind(1i64).execute(&mut *conn).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SharedConnection(pub(super) Arc<tokio::sync::Mutex<SqlxTx>>);

impl SharedConnection {
    /// The connection, inside the request's transaction; an error once the request is over.
    pub async fn lock(&self) -> Result<tokio::sync::MappedMutexGuard<'_, PgConnection>, sqlx::Error> {
        let guard = self.0.lock().await;
        tokio::sync::MutexGuard::try_map(guard, |tx| tx.conn.as_deref_mut())
            .map_err(|_| sqlx::Error::Protocol("the idempotency transaction of this request has ended".into()))
    }
}

impl std::fmt::Debug for SharedConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedConnection")
    }
}
