//! The batch form of the in-transaction flow (`Idempotency::run_batch`): its items and
//! outcomes. The flow itself is `flow::batch`, written once over the driver interface.

use crate::error::Error;
use crate::flow::{self, TxFuture};
use crate::handler_error::HandlerError;
use crate::response::Replayable;
use crate::{Driver, Idempotency};
use idempotency_core::{Fingerprint, Key};
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

impl<D: Driver> Idempotency<D> {
    /// Runs a batch: reserves every key of `items` for `operation` and `user_id` in one
    /// statement, calls `work` once with the transaction's connection (`&mut D::Conn`, as
    /// [`Idempotency::run`]'s closure gets it) and the keys that were created (in input order),
    /// records the results it returns (one per created key, in the same order) and commits, all
    /// in one transaction. Returns every key's outcome, in input order. A batch in which no key
    /// was created does not call `work`.
    ///
    /// A result's [`Replayable::verdict`] decides how its key is recorded: `Success` and
    /// `Failure` as `run` does; `Transient` is refused (a batch takes no savepoint, so it cannot
    /// undo one key's writes alone): return an error to roll the whole batch back instead.
    /// An error of `work`, a refused result or a key whose lease was lost
    /// ([`Error::LeaseLost`]) roll the whole batch back, reservations included, and count no
    /// failure (the queue redelivers the batch); 40001 / 40P01 retry the whole batch, up to
    /// [`crate::Settings::serialization_retries`] times.
    ///
    /// Round trips, for a closure of one statement: three per batch on either driver (`BEGIN`
    /// with the reservations, the closure's statement, the completions with `COMMIT`; over sqlx
    /// each request is one simple query), whatever the number of keys. A batch that created no
    /// key costs one, its `ROLLBACK` queued without waiting. (sqlx also checks a connection
    /// given back to its pool: one round trip more, which the call does not wait for.)
    pub async fn run_batch<T, E, F>(
        &self,
        operation: &str,
        user_id: &str,
        items: &[BatchItem],
        work: F,
    ) -> Result<Vec<(String, BatchOutcome<T>)>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t mut D::Conn, &'t [String]) -> TxFuture<'t, Vec<T>, E> + Send,
    {
        for item in items {
            Key::new(operation, user_id, item.key.as_str())?;
        }
        let schema = self.schema().await.map_err(Error::widen)?;
        let out = flow::batch::run(&self.context(&schema), operation, user_id, items, work).await;
        // The batch functions came with 0.4.0: against an older extension (which the other
        // flows speak) say so, naming the installed version, not "not installed".
        if let Err(Error::IncompatibleExtension { source, .. }) = out {
            let reason = match self.check_extension().await {
                Ok(version) => format!("run_batch needs idempotency 0.4.0 or later (idem_reserve_many); the extension is at version {version}"),
                Err(e) => e.to_string(),
            };
            return Err(Error::IncompatibleExtension { reason, source });
        }
        out
    }
}
