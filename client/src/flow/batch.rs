//! The batch form of the in-transaction flow (`Idempotency::run_batch`), for queue consumers (a
//! batch of messages of one operation and user per transaction): `idem_reserve_many` reserves
//! every key in one statement, the closure handles the keys that were created,
//! `idem_complete_many` records their results, and everything commits together.
//!
//! Round trips, for a closure of one statement: three for the whole batch, on either driver
//! ((1) `BEGIN` and the reservations; (2) the closure's statement; (3) the completions and
//! `COMMIT`, a lost key aborting them). A batch
//! that created no key ends after the reservations, its `ROLLBACK` queued without waiting.
//!
//! There is no savepoint here either, so a batch commits or rolls back as a whole: 40001 / 40P01
//! retry the whole batch; a key whose lease was lost rolls it back and counts nothing; a closure
//! error rolls it back and then, as `run` does, counts a failure for every key the batch had
//! created in one more request (each reserved again and released towards `max_retries`, or
//! completed `FAILED` with a permanent error's response), so a batch that can never succeed (a
//! poison-pill message) ends with its keys `FAILED` instead of being redelivered for ever.

use super::{rollback, Context, TxFuture};
use crate::batch::{BatchItem, BatchOutcome};
use crate::classify::retryable_sqlstate;
use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::handler_error::{Disposition, HandlerError};
use crate::response::{Replayable, Verdict};
use crate::row::{required, Row};
use crate::sql::{reserve_params, Param};
use crate::types::{release_answer, secs, ReleaseOutcome, ReserveOptions, ReserveOutcome, Reservation};
use idempotency_core::{Key, Status};
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
    super::retried!(cx, once(cx, operation, user_id, items, &mut work).await)
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
    let params = vec![
        Param::Text(operation),
        Param::Text(user_id),
        Param::TextArray(items.iter().map(|i| i.key.as_str()).collect()),
        Param::TextArray(items.iter().map(|i| i.fingerprint.as_str()).collect()),
        Param::Float(secs(options.ttl)),
        Param::Float(secs(options.lease)),
        Param::Bool(options.wait),
    ];
    let mut tx = cx.driver.connection().await.map_err(Error::widen)?;
    let steps = [Step::Begin(cx.settings.isolation), Step::Query(&cx.schema.sql().reserve_many, params)];
    let answers = match D::send(&mut tx, &steps).await.and_then(|rows| rows.iter().map(reserved).collect::<Result<Vec<_>, Error>>()) {
        Ok(answers) => answers,
        Err(e) => {
            rollback::<D>(&mut tx).await;
            return Err(cx.ours(e));
        }
    };
    if answers.len() != items.len() {
        rollback::<D>(&mut tx).await;
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
        D::queue(&mut tx, &Step::Rollback);
        return answers.into_iter().map(|(key, outcome)| Ok((key, answered(outcome)?))).collect();
    }
    let created_keys: Vec<String> = created.iter().map(|(k, _)| k.clone()).collect();
    let results = match work(D::conn(&mut tx), &created_keys).await {
        Ok(results) => results,
        Err(error) if retryable_sqlstate(error.sqlstate()) => {
            // Not a failure of the keys: the whole batch is retried by `run`.
            rollback::<D>(&mut tx).await;
            return Err(Error::Handler { error });
        }
        Err(error) => {
            // The created keys, with their requests' fingerprints (the answers follow the items).
            let created_items = items.iter().zip(&answers).filter(|(_, (_, outcome))| matches!(outcome, ReserveOutcome::Created(_))).map(|(item, _)| item);
            return Err(count(cx, &mut tx, operation, user_id, created_items, &options, error).await);
        }
    };
    let transient = results.iter().any(|r| r.verdict() == Verdict::Transient);
    if results.len() != created.len() || transient {
        rollback::<D>(&mut tx).await;
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
            rollback::<D>(&mut tx).await;
            return Err(Error::Decode(e));
        }
    };
    let mut steps = Vec::new();
    for status in [Status::Success, Status::Failed] {
        let picked: Vec<usize> = (0..results.len())
            .filter(|&i| (results[i].verdict() == Verdict::Success) == (status == Status::Success))
            .collect();
        if picked.is_empty() {
            continue;
        }
        steps.push(Step::Query(
            &cx.schema.sql().complete_many_or_abort,
            vec![
                Param::Text(operation),
                Param::Text(user_id),
                Param::TextArray(picked.iter().map(|&i| created[i].0.as_str()).collect()),
                Param::IntArray(picked.iter().map(|&i| created[i].1).collect()),
                Param::JsonArray(picked.iter().map(|&i| Some(stored[i].clone())).collect()),
                Param::Text(status.as_str()),
            ],
        ));
    }
    steps.push(Step::Commit);
    if let Err(e) = D::send(&mut tx, &steps).await {
        // A lost key aborted the completions, so the COMMIT behind them rolled back.
        rollback::<D>(&mut tx).await;
        return Err(cx.ours(e));
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

/// A closure error: rolls the batch back, then in a fresh transaction (the same request) takes
/// every key the batch had created again and releases it, counting a failure towards
/// `max_retries` (a transient error), or completes it `FAILED` with the error's response (a
/// permanent one), as `run` does for its one key. A key another attempt took in between is not
/// counted. The answer: [`Error::Poisoned`] when that failure was the `max_retries`-th of at
/// least one key (it is `FAILED` now; a redelivered batch answers [`BatchOutcome::Failed`] for
/// it without calling the closure), else [`Error::Handler`].
async fn count<'a, D, E>(
    cx: &Context<'_, D>,
    tx: &mut D::Tx,
    operation: &str,
    user_id: &str,
    created: impl Iterator<Item = &'a BatchItem>,
    options: &ReserveOptions,
    error: E,
) -> Error<E>
where
    D: Driver,
    E: HandlerError,
{
    let disposition = error.disposition();
    let options = ReserveOptions { wait: false, ..options.clone() };
    let (sql, last) = match &disposition {
        Disposition::Transient => (&cx.schema.sql().reserve_and_release, Param::int4_or_null(cx.settings.max_retries)),
        Disposition::Permanent(response) => (&cx.schema.sql().reserve_and_fail, Param::Json(response.as_ref())),
    };
    let mut keys = Vec::new();
    for item in created {
        match Key::new(operation, user_id, item.key.as_str()) {
            Ok(key) => keys.push((key, &item.fingerprint)),
            Err(e) => {
                rollback::<D>(tx).await;
                return e.into();
            }
        }
    }
    let mut steps = vec![Step::Rollback, Step::Begin(None)];
    for (key, fingerprint) in &keys {
        let mut params = reserve_params(key, fingerprint, &options);
        params.push(last.clone());
        steps.push(Step::Query(sql, params));
    }
    steps.push(Step::Commit);
    let rows = match D::send(tx, &steps).await {
        Ok(rows) => rows,
        Err(e) => {
            rollback::<D>(tx).await;
            return cx.ours(e);
        }
    };
    if matches!(disposition, Disposition::Permanent(_)) {
        return Error::Handler { error };
    }
    let mut poisoned = false;
    for row in &rows {
        match release_answer(row, "answer") {
            Ok(answer) => poisoned |= answer == Some(ReleaseOutcome::Poisoned),
            Err(e) => return e.widen(),
        }
    }
    if poisoned {
        Error::Poisoned { error }
    } else {
        Error::Handler { error }
    }
}

/// A row of `reserve_many`: the key and what its reservation answered.
fn reserved(row: &impl Row) -> Result<(String, ReserveOutcome), Error> {
    Ok((required("key", row.text("key"))?, Reservation::read(row)?.outcome))
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
        ReserveOutcome::Resume { .. } => return Err(Error::protocol("a resumable key (it has a recovery point) reached run_batch: use run_steps")),
    })
}
