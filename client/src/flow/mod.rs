//! The flows, written once over the [`Driver`] interface: [`in_transaction`] (`run`, and the
//! layer's in-transaction mode), its batch form [`batch`] (`run_batch`), its one-statement
//! form [`one_statement`] (`run_statement`) and [`two_phase`] (`run_external`, and the layer's
//! two-phase mode, whose lease the [`heartbeat`] keeps), the calls they make in a transaction
//! of their own ([`calls`]), the wait for a key's holder ([`wait`]), with the answers and rules
//! they share: each sequence, each retry and
//! each decoding is written here once, whatever the driver.

pub(crate) mod batch;
pub(crate) mod calls;
mod heartbeat;
pub(crate) mod in_transaction;
pub(crate) mod one_statement;
pub(crate) mod steps;
pub(crate) mod two_phase;
pub(crate) mod wait;

use crate::classify::retryable_sqlstate;
use crate::driver::{Driver, Step};
use crate::error::Error;
use crate::handler_error::HandlerError;
use crate::response::Replayable;
use crate::settings::Settings;
use crate::sql::Schema;
use crate::types::{ReleaseOutcome, ReserveOptions, ReserveOutcome};
use crate::Outcome;
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::time::Duration;

/// The future of a flow's closure: boxed, borrowing the transaction.
pub type TxFuture<'t, T, E> = BoxFuture<'t, Result<T, E>>;

/// What a flow runs with: the driver, the settings and the extension's schema.
pub(crate) struct Context<'a, D: Driver> {
    pub(crate) driver: &'a D,
    pub(crate) settings: &'a Settings,
    pub(crate) schema: &'a Schema,
}

impl<D: Driver> Context<'_, D> {
    /// The reservation's options: `wait` as the settings say (the in-transaction flows wait
    /// in the server for an uncommitted holder, within [`wait`]'s bound).
    fn options(&self, lease: Option<Duration>) -> ReserveOptions {
        ReserveOptions { ttl: self.settings.ttl, lease, wait: self.settings.wait }
    }

    fn lease_lost<E>(&self) -> Error<E> {
        Error::LeaseLost { retry_after: self.settings.retry_after }
    }

    /// An error of one of the flow's requests, with the settings' `Retry-After` on a lost
    /// lease.
    fn ours<E>(&self, e: Error) -> Error<E> {
        match e {
            Error::LeaseLost { .. } => self.lease_lost(),
            other => other.widen(),
        }
    }

    /// A reservation that did not create the key, as the caller's answer.
    fn answer<T: Replayable, E>(&self, outcome: ReserveOutcome) -> Result<Outcome<T>, Error<E>> {
        match outcome {
            ReserveOutcome::Replay(response) => {
                serde_json::from_value(response.unwrap_or(Value::Null)).map(Outcome::Replayed).map_err(Error::Decode)
            }
            ReserveOutcome::Failed(response) => Err(Error::Failed { response }),
            ReserveOutcome::InProgress => Err(Error::InProgress { retry_after: self.settings.retry_after }),
            ReserveOutcome::Mismatch => Err(Error::Mismatch),
            ReserveOutcome::Created(_) => Err(Error::protocol("a created reservation reached the answer path")),
            ReserveOutcome::Resume { .. } => Err(Error::protocol("a resumable key (it has a recovery point) reached a flow without steps: use run_steps")),
        }
    }

    /// The one mapping of a transient failure's release to the caller's answer: the result (or
    /// error) that was released, poisoned, or found the key lost. `None`: the key could not be
    /// taken again to count the failure (another attempt holds or finished it): released.
    fn released<T, E>(&self, answer: Option<ReleaseOutcome>, result: Result<T, E>) -> Result<Outcome<T>, Error<E>> {
        match (answer, result) {
            (Some(ReleaseOutcome::Stale), _) => Err(self.lease_lost()),
            (Some(ReleaseOutcome::Poisoned), Ok(value)) => Ok(Outcome::Poisoned(value)),
            (Some(ReleaseOutcome::Poisoned), Err(error)) => Err(Error::Poisoned { error }),
            (Some(ReleaseOutcome::Released) | None, Ok(value)) => Ok(Outcome::Released(value)),
            (Some(ReleaseOutcome::Released) | None, Err(error)) => Err(Error::Handler { error }),
        }
    }

    /// The one rule of retrying a whole transaction: after 40001 / 40P01 from our statements
    /// or from the closure, up to `serialization_retries` times, with backoff. The wait before
    /// try `attempt + 1`, or None when `result` is final.
    fn retry<T, E: HandlerError>(&self, result: &Result<T, Error<E>>, attempt: u32) -> Option<Duration> {
        match result {
            Err(e) if conflict(e) && attempt < self.settings.serialization_retries => Some(backoff(attempt)),
            _ => None,
        }
    }
}

/// The one loop of retrying a whole transaction: evaluates `$attempt` (an awaited try) until
/// [`Context::retry`] says its result is final, sleeping the backoff between tries.
macro_rules! retried {
    ($cx:expr, $attempt:expr) => {{
        let mut tries = 0;
        loop {
            let result = $attempt;
            match $cx.retry(&result, tries) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => break result,
            }
            tries += 1;
        }
    }};
}
pub(crate) use retried;

/// Whether the whole transaction is worth retrying: 40001 / 40P01 from our statements or from
/// the closure.
pub(crate) fn conflict<E: HandlerError>(e: &Error<E>) -> bool {
    match e {
        Error::Database(db) => retryable_sqlstate(db.sqlstate()),
        Error::Handler { error } | Error::Poisoned { error } => retryable_sqlstate(error.sqlstate()),
        _ => false,
    }
}

/// Ends an attempt's transaction after an error, waiting for the `ROLLBACK` (a connection that
/// cannot even do that is closed when its guard drops).
async fn rollback<D: Driver>(tx: &mut D::Tx) {
    if D::in_transaction(tx) {
        let _ = D::send(tx, &[Step::Rollback]).await;
    }
}

/// Exponential backoff with jitter between tries of a transaction: 10 ms, 20 ms, 40 ms ...
/// (+0-50%).
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(8);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = base * u64::from(nanos % 50) / 100;
    Duration::from_millis(base + jitter)
}
