//! The tokio-postgres driver (feature `postgres`, the default): a `deadpool_postgres::Pool`,
//! prepared (cached) statements, and pipelining by issuing requests together (tokio-postgres
//! sends a request when its future is first polled, and `join_all` polls in order).

mod cancel;
pub(crate) mod connect;
mod errors;
mod tx;
pub(crate) mod values;

pub use tx::{SharedClient, Tx};

use super::{Driver, Sealed, Step};
use crate::classify::{classify, Origin};
use crate::error::Error;
use deadpool_postgres::Pool;
use super::lent::Lent;
use futures_util::future::{join_all, maybe_done, BoxFuture, FutureExt, MaybeDone};
use std::pin::Pin;
use tokio_postgres::types::ToSql;

/// tokio-postgres over a `deadpool_postgres::Pool`.
#[derive(Clone)]
pub struct Postgres {
    pub(crate) pool: Pool,
    /// The connector of the cancel requests of dropped guards (tx.rs).
    cancel: cancel::CancelTls,
}

impl Postgres {
    /// A driver over `pool`. A call dropped mid-request sends a cancel request (see [`Tx`]) on a
    /// connection of its own, which must be made as the pool's are; the pool's TLS connector
    /// cannot be read from it, so this driver's are encrypted with rustls without checking the
    /// certificate whenever the connection's `sslmode` asks for TLS (with the `tls` feature;
    /// without it they are plain text, which a connection made with `sslmode=require` does not
    /// send). Give it your pool's own connector with [`Postgres::cancel_tls`] for its certificate
    /// rules; a handle made from a URL (`Idempotency::from_url`) uses the URL's.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is (an unreachable server is the first call's `Error::StoreUnavailable`).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn new(pool: Pool) -> Self {
        Postgres { pool, cancel: cancel::CancelTls::unknown() }
    }

    /// The same driver, its cancel requests made through `tls`: the connector your pool's
    /// `deadpool_postgres::Manager` was made with, so they reach the server under the same
    /// `sslmode` and certificate rules as its connections
    /// (`Idempotency::with_driver(Postgres::new(pool).cancel_tls(tls), settings)`).
    ///
    /// # Errors
    ///
    /// None: the connector is used when a cancel request is sent.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn cancel_tls<T>(mut self, tls: T) -> Self
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
    {
        self.cancel = cancel::CancelTls::new(tls);
        self
    }

    /// A driver over `pool`, made by `connect::pool` with `connector`.
    pub(crate) fn with_connector(pool: Pool, connector: crate::tls::Connector) -> Self {
        Postgres { pool, cancel: cancel::CancelTls::of(connector) }
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Sealed for Postgres {}

/// An error of one of this crate's statements.
fn ours(e: tokio_postgres::Error) -> Error {
    classify(e, Origin::Ours)
}

impl Driver for Postgres {
    type Tx = Tx;
    type Conn = Tx;
    type Shared = SharedClient;
    type Row = tokio_postgres::Row;

    fn conn(tx: &mut Tx) -> &mut Tx {
        tx
    }

    fn share(tx: &mut Tx) -> SharedClient {
        Lent::lend(tx)
    }

    fn unshare(tx: &mut Tx, shared: SharedClient) {
        shared.take_back(tx);
    }

    fn in_transaction(tx: &Tx) -> bool {
        tx.open
    }

    async fn connection(&self) -> Result<Tx, Error> {
        Ok(Tx::new(self.pool.get().await?, self.cancel.clone()))
    }

    async fn send<'a>(tx: &'a mut Tx, steps: &'a [Step<'a>]) -> Result<Vec<tokio_postgres::Row>, Error> {
        let Tx { client, open, busy, .. } = tx;
        let Some(client) = client.as_ref() else {
            return Err(super::not_given_back());
        };
        // Recorded before the first byte leaves: a future dropped at any await below leaves a
        // guard that cancels and closes the connection instead of pooling it (tx.rs).
        *open |= steps.iter().any(|s| matches!(s, Step::Begin(_)));
        *busy = true;
        type Answer<'c> = Pin<Box<MaybeDone<BoxFuture<'c, Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>>>>>;
        let control = |sql: &'static str| -> Answer<'_> { Box::pin(maybe_done(client.batch_execute(sql).map(|r| r.map(|()| Vec::new())).boxed())) };
        // The control steps that lead (a ROLLBACK ending a failed transaction) leave first: a
        // statement prepared in a failed transaction would fail.
        let lead = steps.iter().take_while(|s| s.control().is_some()).count();
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = steps[lead..]
            .iter()
            .filter_map(|step| match step {
                Step::Query(_, params) => Some(params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()),
                _ => None,
            })
            .collect();
        let mut statements = Vec::new();
        let mut answers: Vec<Answer<'_>> = Vec::with_capacity(steps.len());
        for sql in steps[..lead].iter().filter_map(Step::control) {
            let mut answer = control(sql);
            let _ = futures_util::poll!(answer.as_mut()); // sent when first polled
            answers.push(answer);
        }
        // Prepared (or found cached) before the rest is sent: a statement being prepared would
        // let the requests after it overtake it.
        for step in &steps[lead..] {
            if let Step::Query(sql, params) = step {
                match client.prepare_typed_cached(sql, &values::types(params)).await {
                    Ok(statement) => statements.push(statement),
                    Err(e) => {
                        // The leading steps were sent: their answers say whether a transaction
                        // is open now (a BEGIN answered, then aborted by the failed Parse).
                        join_all(answers.iter_mut().map(|a| a.as_mut())).await;
                        for (step, answer) in steps.iter().zip(answers.iter_mut()) {
                            if let (Some(opens), Some(Ok(_))) = (step.opens(), answer.as_mut().take_output()) {
                                *open = opens;
                            }
                        }
                        *busy = false;
                        return Err(ours(e));
                    }
                }
            }
        }
        let mut queries = statements.iter().zip(&params);
        for step in &steps[lead..] {
            answers.push(match step.control() {
                Some(sql) => control(sql),
                None => match queries.next() {
                    Some((statement, params)) => Box::pin(maybe_done(client.query(statement, params.as_slice()).boxed())),
                    None => unreachable!("one prepared statement per query step"),
                },
            });
        }
        join_all(answers.iter_mut().map(|a| a.as_mut())).await;
        *busy = false;
        let mut rows = Vec::new();
        let mut first_error = None;
        for (step, answer) in steps.iter().zip(answers.iter_mut()) {
            match answer.as_mut().take_output() {
                Some(Ok(answered)) => {
                    if let Some(opens) = step.opens() {
                        *open = opens;
                    }
                    rows.extend(answered);
                }
                Some(Err(e)) => {
                    // A COMMIT or ROLLBACK the server answered with an error ended the
                    // transaction too; a BEGIN that failed opened none.
                    if e.as_db_error().is_some() && step.opens().is_some() {
                        *open = false;
                    }
                    first_error.get_or_insert(e);
                }
                None => unreachable!("every answer was awaited"),
            }
        }
        match first_error {
            Some(e) => Err(ours(e)),
            None => Ok(rows),
        }
    }

    fn queue(tx: &mut Tx, step: &Step<'_>) {
        // Sent when first polled; tokio-postgres ignores the answer of a request whose future
        // is gone, and whoever uses the connection next is queued behind it.
        let (Some(control), Some(client)) = (step.control(), tx.client()) else { return };
        match client.batch_execute(control).now_or_never() {
            None | Some(Ok(())) => {
                if let Some(opens) = step.opens() {
                    tx.open = opens;
                }
            }
            Some(Err(_)) => {} // the connection is broken: dropping the guard closes it
        }
    }
}
