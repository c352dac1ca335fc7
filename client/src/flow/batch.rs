//! The batch form of the in-transaction flow (`Idempotency::run_batch`), for queue consumers (a
//! batch of messages of one operation and user per transaction): `idem_reserve_many` reserves
//! every key in one statement, the closure handles the keys that were created,
//! `idem_complete_many` records their results, and everything commits together.
//!
//! Round trips, for a closure of one statement: over tokio-postgres three for the whole batch
//! ((1) `BEGIN` and the reservations, one simple query; (2) the closure's statement; (3) the
//! completions and `COMMIT`, one simple query, a lost key aborting it); over sqlx five (`BEGIN`,
//! the reservations, the statement, the completions, `COMMIT`: sqlx waits for each). A batch
//! that created no key ends after the reservations, its `ROLLBACK` queued without waiting.
//!
//! There is no savepoint here either, so a batch commits or rolls back as a whole: a closure
//! error (or a key whose lease was lost) rolls the whole batch back and reserves nothing (the
//! queue redelivers it; no failure is counted), and 40001 / 40P01 retry the whole batch.

use super::{backoff, Context, TxFuture};
use crate::batch::{BatchItem, BatchOutcome};
use crate::driver::Driver;
use crate::error::Error;
use crate::handler::HandlerError;
use crate::ops::{self, ReserveOutcome};
use crate::response::{Replayable, Verdict};
use crate::sql::{bind, Literal};
use idempotency_core::Status;
use serde_json::Value;

/// The flow, retried whole after 40001 / 40P01 wherever they arise (the closure included).
pub(crate) async fn run<D, T, E, F>(
    cx: &Context<'_, D>,
    operation: &str,
    user_id: &str,
    items: &[BatchItem],
    mut work: F,
) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Conn, &'t [String]) -> TxFuture<'t, Vec<T>, E> + Send,
{
    let mut attempt = 0;
    loop {
        match once(cx, operation, user_id, items, &mut work).await {
            Err(e) if e.is_retryable_conflict() && attempt < cx.settings.serialization_retries => {
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

async fn once<D, T, E, F>(
    cx: &Context<'_, D>,
    operation: &str,
    user_id: &str,
    items: &[BatchItem],
    work: &mut F,
) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
where
    D: Driver,
    T: Replayable + Send,
    E: HandlerError + Send,
    F: for<'t> FnMut(&'t mut D::Conn, &'t [String]) -> TxFuture<'t, Vec<T>, E> + Send,
{
    let options = cx.options(cx.settings.lease);
    let reserve = bind(
        &cx.schema.sql().reserve_many,
        &[
            Literal::Text(operation),
            Literal::Text(user_id),
            Literal::TextArray(items.iter().map(|i| i.key.as_str()).collect()),
            Literal::TextArray(items.iter().map(|i| i.fingerprint.as_str()).collect()),
            Literal::Float(ops::secs(options.ttl)),
            Literal::Float(ops::secs(options.lease)),
            Literal::Bool(options.wait),
        ],
    );
    let (mut tx, answers) = cx.driver.begin_and_reserve_many(cx.settings.isolation, &reserve).await.map_err(Error::widen)?;
    let answers: Vec<(String, ReserveOutcome)> = answers.into_iter().map(|(key, r)| (key, r.outcome)).collect();
    if answers.len() != items.len() {
        D::rollback(&mut tx).await;
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
        D::abandon(tx);
        return answers.into_iter().map(|(key, outcome)| Ok((key, answered(outcome)?))).collect();
    }
    let created_keys: Vec<String> = created.iter().map(|(k, _)| k.clone()).collect();
    let results = match work(D::conn(&mut tx), &created_keys).await {
        Ok(results) => results,
        Err(error) => {
            D::rollback(&mut tx).await;
            return Err(Error::Handler { error });
        }
    };
    let transient = results.iter().any(|r| r.verdict() == Verdict::Transient);
    if results.len() != created.len() || transient {
        D::rollback(&mut tx).await;
        return Err(Error::Configuration {
            reason: format!(
                "run_batch: the closure must return one success or permanent-failure result per created key \
                 ({} keys), got {} results{}",
                created.len(),
                results.len(),
                if transient { " with a transient one" } else { "" }
            ),
            source: None,
        });
    }
    let stored: Vec<Value> = match results.iter().map(serde_json::to_value).collect() {
        Ok(stored) => stored,
        Err(e) => {
            D::rollback(&mut tx).await;
            return Err(Error::Decode(e));
        }
    };
    let mut statements = Vec::new();
    for status in [Status::Success, Status::Failed] {
        let picked: Vec<usize> = (0..results.len())
            .filter(|&i| (results[i].verdict() == Verdict::Success) == (status == Status::Success))
            .collect();
        if picked.is_empty() {
            continue;
        }
        statements.push(bind(
            &cx.schema.sql().complete_many_or_abort,
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
    if !D::complete_many_and_commit(&mut tx, &statements.join("; ")).await.map_err(Error::widen)? {
        return Err(cx.lease_lost());
    }
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
