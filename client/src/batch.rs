//! The batch form of the in-transaction flow, for queue consumers (a batch of messages of one
//! operation and user per transaction): `idem_reserve_many` reserves every key in one statement,
//! the closure handles the keys that were created, `idem_complete_many` records their results,
//! and everything commits together. Three round trips for the whole batch (with extension 0.4).
//!
//! There is no savepoint here either, so a batch commits or rolls back as a whole: a closure
//! error (or a key whose lease was lost) rolls the whole batch back and reserves nothing (the
//! queue redelivers it; no failure is counted), and 40001 / 40P01 retry the whole batch.

use crate::driver::{Postgres, Tx};
use crate::error::Error;
use crate::flow::{backoff, TxFuture};
use crate::handler::HandlerError;
use crate::ops::{self, ReserveOptions, ReserveOutcome, Reservation};
use crate::response::{Replayable, Verdict};
use crate::sql::{bind, Literal, LEASE_LOST_MARK};
use crate::{Driver, Idempotency};
use idempotency_core::{Fingerprint, Key, Status};
use serde_json::Value;

/// One message of a batch: its idempotency key (scoped by the batch's operation and user) and
/// the fingerprint of its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchItem {
    /// The message's idempotency key.
    pub key: String,
    /// Its request's fingerprint.
    pub fingerprint: Fingerprint,
}

/// What one key of a batch ended with.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOutcome<T> {
    /// The closure handled it in this batch; its result committed with the key (`SUCCESS`, or
    /// `FAILED` for a result whose verdict is a permanent failure).
    Executed(T),
    /// An earlier attempt's committed result; the closure did not see the key.
    Replayed(T),
    /// A stored permanent failure (or a poisoned key): the closure did not see it.
    Failed(Option<Value>),
    /// Another attempt holds the key (or the key appears earlier in this batch).
    InProgress,
    /// The key was used with a different request.
    Mismatch,
}

impl Idempotency<Postgres> {
    /// Runs a batch: reserves every key of `items` for `operation` and `user_id` in one
    /// statement, calls `work` once with the keys that were created (in input order), records
    /// the results it returns (one per created key, in the same order) and commits, all in one
    /// transaction. Returns every key's outcome, in input order.
    ///
    /// A result's [`Replayable::verdict`] decides how its key is recorded: `Success` and
    /// `Failure` as `run` does; `Transient` is refused (a batch takes no savepoint, so it cannot
    /// undo one key's writes alone): return an error to roll the whole batch back instead.
    pub async fn run_batch<T, E, F>(
        &self,
        operation: &str,
        user_id: &str,
        items: &[BatchItem],
        mut work: F,
    ) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Tx, &'t [String]) -> TxFuture<'t, Vec<T>, E> + Send,
    {
        for item in items {
            Key::new(operation, user_id, item.key.as_str())?;
        }
        let schema = self.schema().await.map_err(Error::widen)?;
        let mut attempt = 0;
        loop {
            match self.batch_once(&schema, operation, user_id, items, &mut work).await {
                Err(e) if e.is_retryable_conflict() && attempt < self.settings().serialization_retries => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn batch_once<T, E, F>(
        &self,
        schema: &crate::Schema,
        operation: &str,
        user_id: &str,
        items: &[BatchItem],
        work: &mut F,
    ) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Tx, &'t [String]) -> TxFuture<'t, Vec<T>, E> + Send,
    {
        let settings = self.settings();
        let options = ReserveOptions { ttl: settings.ttl, lease: settings.lease, wait: settings.wait };
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        let hashes: Vec<&str> = items.iter().map(|i| i.fingerprint.as_str()).collect();
        let reserve = bind(
            &schema.sql().reserve_many,
            &[
                Literal::Text(operation),
                Literal::Text(user_id),
                Literal::TextArray(keys),
                Literal::TextArray(hashes),
                Literal::Float(ops::secs(options.ttl)),
                Literal::Float(ops::secs(options.lease)),
                Literal::Bool(options.wait),
            ],
        );
        let mut tx = self.driver().open().await.map_err(Error::widen)?;
        // BEGIN and the reservations: one request, one round trip.
        let begin = crate::settings::Isolation::begin_sql(settings.isolation);
        let rows = match tx.simple_query(&format!("{begin}; {reserve}")).await {
            Ok(messages) => messages,
            Err(e) => {
                Postgres::rollback(&mut tx).await;
                return Err(crate::driver::postgres::ours(e).widen());
            }
        };
        let mut answers = Vec::with_capacity(items.len());
        for message in &rows {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = message {
                let key = row.get("key").unwrap_or_default().to_owned();
                answers.push((key, Reservation::from_text(row).map_err(Error::widen)?.outcome));
            }
        }
        if answers.len() != items.len() {
            Postgres::rollback(&mut tx).await;
            return Err(Error::protocol(format!("idem_reserve_many answered {} rows for {} keys", answers.len(), items.len())));
        }
        let created: Vec<(String, i64)> = answers
            .iter()
            .filter_map(|(key, outcome)| match outcome {
                ReserveOutcome::Created(token) => Some((key.clone(), token.0)),
                _ => None,
            })
            .collect();
        if created.is_empty() {
            Postgres::abandon(tx);
            return answers.into_iter().map(|(key, outcome)| Ok((key, answered(outcome)?))).collect();
        }
        let created_keys: Vec<String> = created.iter().map(|(k, _)| k.clone()).collect();
        let results = match work(&tx, &created_keys).await {
            Ok(results) => results,
            Err(error) => {
                Postgres::rollback(&mut tx).await;
                return Err(Error::Handler { error });
            }
        };
        if results.len() != created.len() || results.iter().any(|r| r.verdict() == Verdict::Transient) {
            Postgres::rollback(&mut tx).await;
            return Err(Error::Configuration {
                reason: format!(
                    "run_batch: the closure must return one success or permanent-failure result per created key \
                     ({} keys), got {} results{}",
                    created.len(),
                    results.len(),
                    if results.iter().any(|r| r.verdict() == Verdict::Transient) { " with a transient one" } else { "" }
                ),
                source: None,
            });
        }
        let stored: Vec<Value> = results.iter().map(serde_json::to_value).collect::<Result<_, _>>().map_err(Error::Decode)?;
        let mut statements = Vec::new();
        for status in [Status::Success, Status::Failed] {
            let picked: Vec<usize> = (0..results.len())
                .filter(|&i| (results[i].verdict() == Verdict::Success) == (status == Status::Success))
                .collect();
            if picked.is_empty() {
                continue;
            }
            statements.push(bind(
                &schema.sql().complete_many_or_abort,
                &[
                    Literal::Text(operation),
                    Literal::Text(user_id),
                    Literal::TextArray(picked.iter().map(|&i| created[i].0.as_str()).collect()),
                    Literal::IntArray(picked.iter().map(|&i| created[i].1).collect()),
                    Literal::JsonArray(picked.iter().map(|&i| Some(stored[i].clone())).collect()),
                    Literal::Text(status.as_str()),
                ],
            ));
        }
        // The completions and COMMIT: one request; a lost key aborts it, and the COMMIT with it.
        statements.push("COMMIT".to_owned());
        if let Err(e) = tx.simple_query(&statements.join("; ")).await {
            Postgres::rollback(&mut tx).await;
            let lost = e.as_db_error().is_some_and(|d| d.message().contains(LEASE_LOST_MARK));
            return Err(if lost { Error::LeaseLost { retry_after: settings.retry_after } } else { crate::driver::postgres::ours(e).widen() });
        }
        crate::driver::postgres::ended(&tx);
        let mut results = results.into_iter();
        answers
            .into_iter()
            .map(|(key, outcome)| match outcome {
                ReserveOutcome::Created(_) => match results.next() {
                    Some(value) => Ok((key, BatchOutcome::Executed(value))),
                    None => Err(Error::protocol("a created key without its result")),
                },
                other => Ok((key, answered(other)?)),
            })
            .collect()
    }
}

/// A key the batch did not create, as its outcome.
fn answered<T: Replayable, E>(outcome: ReserveOutcome) -> Result<BatchOutcome<T>, Error<E>> {
    Ok(match outcome {
        ReserveOutcome::Replay(response) => {
            BatchOutcome::Replayed(serde_json::from_value(response.unwrap_or(Value::Null)).map_err(Error::Decode)?)
        }
        ReserveOutcome::Failed(response) => BatchOutcome::Failed(response),
        ReserveOutcome::InProgress => BatchOutcome::InProgress,
        ReserveOutcome::Mismatch => BatchOutcome::Mismatch,
        ReserveOutcome::Created(_) => return Err(Error::protocol("a created key reached the answer path")),
    })
}
