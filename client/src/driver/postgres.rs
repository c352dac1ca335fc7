//! The tokio-postgres driver: a `deadpool_postgres::Pool`, prepared (cached) statements, and
//! pipelining by issuing requests together (tokio-postgres sends a request when its future is
//! first polled, and `join!` polls in order).

use super::{Driver, Reservations, Sealed};
use crate::error::{DatabaseError, Error};
use crate::ops::{self, ReleaseOutcome, ReserveOptions, Reservation, Status, Token};
use crate::settings::Isolation;
use crate::sql::{bind, Literal, Schema, LEASE_LOST_MARK};
use deadpool_postgres::{Client, Pool};
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// tokio-postgres over a `deadpool_postgres::Pool`.
#[derive(Clone)]
pub struct Postgres {
    pub(crate) pool: Pool,
}

impl Postgres {
    /// A driver over `pool`.
    pub fn new(pool: Pool) -> Self {
        Postgres { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    async fn get(&self) -> Result<Client, Error> {
        Ok(self.pool.get().await?)
    }
}

impl Sealed for Postgres {}

/// The transaction of [`crate::Idempotency::run`] as your closure sees it: a pooled connection
/// inside the transaction that holds the reservation. It dereferences to
/// `deadpool_postgres::Client` (`query`, `execute`, `prepare_cached`, and
/// `deadpool_postgres::GenericClient` for helpers generic over the executor). The client begins,
/// completes and commits it: do not `COMMIT` or `ROLLBACK` yourself, and do not keep it after
/// your closure returns.
#[derive(Clone)]
pub struct Tx(Arc<Open>);

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

/// A pooled connection inside a transaction this crate began. Unless the transaction is seen to
/// end (a `COMMIT` or `ROLLBACK` answered by the server), dropping it closes the connection
/// instead of returning it to the pool, so no caller ever gets a connection in the middle of
/// someone else's transaction (a dropped `run` future, an error between statements, a handler
/// that panicked).
struct Open {
    client: Option<Client>,
    ended: AtomicBool,
}

impl Open {
    fn client(&self) -> &Client {
        match &self.client {
            Some(client) => client,
            None => unreachable!("the connection is only taken out on drop"),
        }
    }

    /// The transaction is over: when dropped, the connection goes back to the pool.
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !self.ended.load(Ordering::Acquire) {
                // Detach it from the pool and close it: the server rolls the transaction back.
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

/// One request of a failure path: `ROLLBACK`, then in a fresh transaction reserve again and
/// release or fail (the `answer` column: NULL when the key was not created again), `COMMIT`.
async fn again(tx: &mut Tx, sql: &str, key: &Key, fingerprint: &Fingerprint, options: &ReserveOptions, last: Literal<'_>) -> Result<Option<String>, Error> {
    let mut values = Vec::from(reserve_values(key, fingerprint, &ReserveOptions { wait: false, ..options.clone() }));
    values.push(last);
    let statement = bind(sql, &values);
    match tx.0.client().simple_query(&format!("ROLLBACK; BEGIN; {statement}; COMMIT")).await {
        Ok(messages) => {
            tx.0.end();
            let row = first_row(&messages)?;
            row.try_get("answer").map(|a| a.map(str::to_owned)).map_err(|e| Error::Protocol {
                reason: "cannot read column \"answer\"".into(),
                source: Some(Box::new(e)),
            })
        }
        Err(e) => {
            Postgres::rollback(tx).await;
            Err(ours(e))
        }
    }
}

/// The values of the reservation statement's `$1`..`$7`.
fn reserve_values<'a>(key: &'a Key, fingerprint: &'a Fingerprint, options: &ReserveOptions) -> [Literal<'a>; 7] {
    [
        Literal::Text(key.operation()),
        Literal::Text(key.user_id()),
        Literal::Text(key.key()),
        Literal::Text(fingerprint.as_str()),
        Literal::Float(ops::secs(options.ttl)),
        Literal::Float(ops::secs(options.lease)),
        Literal::Bool(options.wait),
    ]
}

/// The first row of a simple query's answer.
fn first_row(messages: &[tokio_postgres::SimpleQueryMessage]) -> Result<&tokio_postgres::SimpleQueryRow, Error> {
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .ok_or_else(|| Error::protocol("the statement answered no row"))
}

fn max_retries_literal(max_retries: Option<i32>) -> Literal<'static> {
    match max_retries {
        Some(n) => Literal::Int4(n),
        None => Literal::Null4,
    }
}

impl Driver for Postgres {
    type Tx = Tx;
    type Conn = Tx;
    type Shared = Tx;

    fn conn(tx: &mut Tx) -> &mut Tx {
        tx
    }

    fn share(tx: &mut Tx) -> Tx {
        tx.clone()
    }

    fn unshare(_: &mut Tx, _: Tx) {}

    async fn installed(&self) -> Result<(String, String), Error> {
        ops::installed(&self.get().await?).await
    }

    async fn begin_and_reserve(
        &self,
        schema: &Schema,
        isolation: Option<Isolation>,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
    ) -> Result<(Tx, Reservation), Error> {
        let client = self.get().await?;
        // Prepared (or found cached) before anything is pipelined: a statement being prepared
        // would let the statements after it overtake it.
        // The completion is prepared now too, so the last round trip never waits for a Parse.
        let reserve = ops::prepare(&client, &schema.sql().reserve).await?;
        ops::prepare(&client, &schema.sql().complete_or_abort).await?;
        let mut tx = Tx(Arc::new(Open { client: Some(client), ended: AtomicBool::new(false) }));
        // BEGIN and the reservation leave together: the connection comes idle from the pool, so
        // its task is parked and both requests are queued before it runs. BEGIN can only fail
        // with the connection, on which nothing after it runs either.
        let (begun, reservation) = futures_util::join!(
            tx.0.client().batch_execute(Isolation::begin_sql(isolation)),
            ops::reserve_prepared(tx.0.client(), &reserve, key, fingerprint, options),
        );
        match begun.map_err(Error::from).and(reservation) {
            Ok(reservation) => Ok((tx, reservation)),
            Err(e) => {
                Self::rollback(&mut tx).await;
                Err(e)
            }
        }
    }

    fn abandon(tx: Tx) {
        // The ROLLBACK is queued on the connection (tokio-postgres sends a request when its
        // future is first polled, and ignores the answer of one whose future is gone) and the
        // connection goes back to the pool at once; whoever uses it next is queued behind it.
        use futures_util::FutureExt;
        match tx.0.client().batch_execute("ROLLBACK").now_or_never() {
            None | Some(Ok(())) => tx.0.end(),
            Some(Err(_)) => {} // the connection is broken: dropping the guard closes it
        }
    }

    async fn complete_and_commit(
        tx: &mut Tx,
        schema: &Schema,
        key: &Key,
        token: Token,
        response: Option<&Value>,
        status: Status,
    ) -> Result<bool, Error> {
        let client = tx.0.client();
        let complete = ops::prepare(client, &schema.sql().complete_or_abort).await?;
        let (operation, user_id, k, status) = (key.operation(), key.user_id(), key.key(), status.as_str());
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [&operation, &user_id, &k, &token.0, &response, &status];
        let (completed, committed) = futures_util::join!(client.query_one(&complete, &params), client.batch_execute("COMMIT"));
        // The server answered the COMMIT (a success, or an error after which it rolled back).
        if committed.as_ref().err().is_none_or(|e| e.as_db_error().is_some()) {
            tx.0.end();
        }
        match completed {
            Err(e)
                if e.as_db_error().is_some_and(|d| {
                    *d.code() == SqlState::INVALID_TEXT_REPRESENTATION && d.message().contains(LEASE_LOST_MARK)
                }) =>
            {
                Ok(false) // the COMMIT behind it rolled back
            }
            Err(e) => Err(ours(e)),
            Ok(_) => committed.map(|()| true).map_err(Error::from),
        }
    }

    async fn rollback_and_release(
        tx: &mut Tx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        max_retries: Option<i32>,
    ) -> Result<Option<ReleaseOutcome>, Error> {
        let answer = again(tx, &schema.sql().reserve_and_release, key, fingerprint, options, max_retries_literal(max_retries)).await?;
        answer.map(|a| ReleaseOutcome::parse(&a).map_err(|e| Error::protocol(e.to_string()))).transpose()
    }

    async fn rollback_and_fail(
        tx: &mut Tx,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        options: &ReserveOptions,
        response: Option<&Value>,
    ) -> Result<bool, Error> {
        let answer = again(tx, &schema.sql().reserve_and_fail, key, fingerprint, options, Literal::Json(response)).await?;
        Ok(answer.as_deref() == Some("true"))
    }

    async fn begin_and_reserve_many(&self, isolation: Option<Isolation>, reserve_many: &str) -> Result<(Tx, Reservations), Error> {
        let mut tx = self.open().await?;
        // BEGIN and the reservations: one simple query, one round trip.
        let answered = tx.0.client().simple_query(&format!("{}; {reserve_many}", Isolation::begin_sql(isolation))).await;
        let rows = answered.map_err(ours).and_then(|messages| {
            messages
                .iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
                    _ => None,
                })
                .map(|row| match row.try_get("key") {
                    Ok(Some(key)) => Ok((key.to_owned(), Reservation::from_text(row)?)),
                    Ok(None) => Err(Error::protocol("idem_reserve_many answered a row without its key")),
                    Err(e) => Err(Error::Protocol { reason: "cannot read column \"key\"".into(), source: Some(Box::new(e)) }),
                })
                .collect::<Result<Vec<_>, Error>>()
        });
        match rows {
            Ok(rows) => Ok((tx, rows)),
            Err(e) => {
                Self::rollback(&mut tx).await;
                Err(e)
            }
        }
    }

    async fn complete_many_and_commit(tx: &mut Tx, complete_many: &str) -> Result<bool, Error> {
        // The completions and COMMIT: one simple query; a lost key aborts the transaction, so
        // the COMMIT behind it is skipped.
        match tx.0.client().simple_query(&format!("{complete_many}; COMMIT")).await {
            Ok(_) => {
                tx.0.end();
                Ok(true)
            }
            Err(e) => {
                let lost = e.as_db_error().is_some_and(|d| {
                    *d.code() == SqlState::INVALID_TEXT_REPRESENTATION && d.message().contains(LEASE_LOST_MARK)
                });
                Self::rollback(tx).await;
                if lost {
                    Ok(false)
                } else {
                    Err(ours(e))
                }
            }
        }
    }

    async fn rollback(tx: &mut Tx) {
        if tx.0.client().batch_execute("ROLLBACK").await.is_ok() {
            tx.0.end();
        }
    }

    async fn open(&self) -> Result<Tx, Error> {
        let client = self.get().await?;
        Ok(Tx(Arc::new(Open { client: Some(client), ended: AtomicBool::new(false) })))
    }

    async fn begin(tx: &mut Tx) -> Result<(), Error> {
        // Queued, not waited for (tokio-postgres sends a request when its future is first
        // polled, and ignores the answer of one whose future is gone): BEGIN leaves with the
        // closure's first statement, in one round trip.
        use futures_util::FutureExt;
        match tx.0.client().batch_execute("BEGIN").now_or_never() {
            Some(Err(e)) => Err(e.into()),
            None | Some(Ok(())) => Ok(()),
        }
    }

    async fn reserve(&self, schema: &Schema, key: &Key, fingerprint: &Fingerprint, options: &ReserveOptions) -> Result<Reservation, Error> {
        ops::reserve(&self.get().await?, schema, key, fingerprint, options).await
    }

    async fn release(&self, schema: &Schema, key: &Key, token: Token, max_retries: Option<i32>) -> Result<ReleaseOutcome, Error> {
        ops::release(&self.get().await?, schema, key, token, max_retries).await
    }

    async fn complete(&self, schema: &Schema, key: &Key, token: Token, response: Option<&Value>, status: Status) -> Result<bool, Error> {
        ops::complete(&self.get().await?, schema, key, token, response, status).await
    }

    async fn heartbeat(&self, schema: &Schema, key: &Key, token: Token, lease: Duration) -> Result<bool, Error> {
        ops::heartbeat(&self.get().await?, schema, key, token, Some(lease)).await
    }
}

impl<E> From<tokio_postgres::Error> for Error<E> {
    /// Connection-level failures (closed connection, I/O, class 08, shutdown, too many
    /// connections) and a server that cannot take writes (25006 on a standby, after a failover)
    /// become `StoreUnavailable`, anything else `Database`. This is the mapping for your own
    /// statements too, so `?` on them never claims the extension is missing.
    fn from(e: tokio_postgres::Error) -> Self {
        if is_unavailable(&e) {
            Error::StoreUnavailable(Box::new(e))
        } else {
            let code = e.code().map(|c| c.code().to_owned());
            Error::Database(DatabaseError::new(code.as_deref(), e))
        }
    }
}

impl<E> From<deadpool_postgres::PoolError> for Error<E> {
    /// A connection that could not be made is `StoreUnavailable` (or `Database` for, say, an
    /// authentication failure); a timeout waiting for a pooled connection or a closed pool is
    /// `StoreUnavailable`; a pool without a runtime is a `Configuration` error.
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::PoolError;
        match e {
            PoolError::Backend(e) => Error::from(e),
            PoolError::NoRuntimeSpecified => {
                Error::Configuration { reason: "the pool has no runtime for its timeouts".into(), source: Some(Box::new(e)) }
            }
            other => Error::StoreUnavailable(Box::new(other)),
        }
    }
}

/// Maps an error of one of this crate's own statements: a missing function, type or schema
/// means the extension is missing; anything else as [`From`] does.
pub(crate) fn ours(e: tokio_postgres::Error) -> Error {
    let missing = e.code().is_some_and(|c| {
        *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::UNDEFINED_OBJECT || *c == SqlState::INVALID_SCHEMA_NAME
    });
    if missing {
        Error::IncompatibleExtension {
            reason: "the idempotency extension is not installed in the configured schema".into(),
            source: Some(Box::new(e)),
        }
    } else {
        Error::from(e)
    }
}

/// Whether a database error means the store cannot be used now (and a retry, perhaps on another
/// node, may succeed).
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        }
        None => e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}
