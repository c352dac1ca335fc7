//! The sqlx driver (feature `sqlx`): a `sqlx::PgPool`. sqlx sends a request and waits for its
//! answer, pipelining nothing, so a request of several steps travels as ONE simple query, its
//! values bound into the text (`sql::bind`, escape-string literals); a request of one query
//! runs prepared (sqlx's persistent statements). So a flow costs the round trips it costs over
//! tokio-postgres: `run` three, a replay one.

pub(crate) mod connect;
mod errors;
mod hosts;
mod tx;
pub(crate) mod values;

pub use tx::{SharedConnection, SqlxTx};

use super::{Driver, Sealed, Step};
use crate::classify::{classify, Origin};
use crate::error::Error;
use super::lent::Lent;
use futures_util::FutureExt;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

/// sqlx over a `sqlx::PgPool`.
#[derive(Clone, Debug)]
pub struct Sqlx {
    pool: PgPool,
}

impl Sqlx {
    /// A driver over `pool`, used as you made it. sqlx's `PgPoolOptions` test each connection
    /// when it is taken (`test_before_acquire`, on by default: a ping every call waits for
    /// before its first statement); the pool `Idempotency::from_url` makes turns that off, as
    /// sqlx checks every connection given back anyway. Turn it off on yours too unless you
    /// want the check (docs/rust-client.md, "The pool's checks of a connection").
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is (an unreachable server is the first call's `Error::StoreUnavailable`).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn new(pool: PgPool) -> Self {
        Sqlx { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl Sealed for Sqlx {}

fn ours(e: sqlx::Error) -> Error {
    classify(e, Origin::Ours)
}

impl Driver for Sqlx {
    type Tx = SqlxTx;
    type Conn = PgConnection;
    type Shared = SharedConnection;
    type Row = PgRow;

    fn conn(tx: &mut SqlxTx) -> &mut PgConnection {
        match tx.conn.as_deref_mut() {
            Some(conn) => conn,
            None => unreachable!("a flow lends a transaction only while it holds its connection"),
        }
    }

    fn share(tx: &mut SqlxTx) -> SharedConnection {
        Lent::lend(tx)
    }

    fn unshare(tx: &mut SqlxTx, shared: SharedConnection) {
        shared.take_back(tx);
    }

    fn in_transaction(tx: &SqlxTx) -> bool {
        tx.open
    }

    async fn connection(&self) -> Result<SqlxTx, Error> {
        Ok(SqlxTx::new(self.pool.acquire().await?))
    }

    async fn send<'a>(tx: &'a mut SqlxTx, steps: &'a [Step<'a>]) -> Result<Vec<PgRow>, Error> {
        let begins = steps.iter().any(|s| matches!(s, Step::Begin(_)));
        let ends = steps.iter().rev().find_map(Step::opens);
        let SqlxTx { conn, open, busy } = tx;
        let Some(conn) = conn.as_deref_mut() else {
            return Err(super::not_given_back());
        };
        // Recorded before the request leaves: a future dropped while it is unanswered leaves a
        // guard that closes the connection instead of pooling it (tx.rs).
        *open |= begins;
        *busy = true;
        let answered = match steps {
            // One query: prepared, its values sent as parameters.
            [Step::Query(sql, params)] => {
                let query = params.iter().fold(sqlx::query(AssertSqlSafe(*sql)), values::bind);
                query.fetch_all(&mut *conn).await
            }
            // Several steps: one simple query.
            _ => {
                let text: Vec<_> = steps.iter().map(Step::text).collect();
                sqlx::raw_sql(AssertSqlSafe(text.join("; "))).fetch_all(&mut *conn).await
            }
        };
        match answered {
            Ok(rows) => {
                *busy = false;
                if let Some(ends) = ends {
                    *open = ends;
                }
                Ok(rows)
            }
            Err(e) => {
                // The server answered an error and skipped the rest of the request; a
                // transaction begun in it (or before) is open, aborted, until a ROLLBACK. Any
                // other error leaves the request unanswered: the connection is closed on drop.
                *busy = !matches!(e, sqlx::Error::Database(_));
                Err(ours(e))
            }
        }
    }

    fn queue(tx: &mut SqlxTx, step: &Step<'_>) {
        let (Some(control), Some(opens)) = (step.control(), step.opens()) else { return };
        let Some(conn) = tx.conn.as_deref_mut() else { return };
        // Polled once, the request is written and flushed; its future is dropped, and sqlx
        // reads the answer before the connection's next request (or when the pool takes it
        // back, which the caller does not wait for).
        match sqlx::raw_sql(AssertSqlSafe(control)).execute(conn).now_or_never() {
            None | Some(Ok(_)) => tx.open = opens,
            Some(Err(_)) => {} // broken: closed on drop
        }
    }
}
