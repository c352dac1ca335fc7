//! `Idempotency::run_batch`: the batch form of the in-transaction flow (`flow::batch`).

use super::Idempotency;
use crate::batch::{BatchItem, BatchOutcome};
use crate::driver::Driver;
use crate::error::Error;
use crate::flow::{self, TxFuture};
use crate::handler_error::HandlerError;
use crate::response::Replayable;
use idempotency_core::Key;

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
    /// A refused result or a key whose lease was lost ([`Error::LeaseLost`]) roll the whole
    /// batch back, reservations included, and count no failure; 40001 / 40P01 (from our
    /// statements or from `work`) retry the whole batch, up to
    /// [`crate::Settings::serialization_retries`] times. Any other error of `work` rolls the
    /// batch back and, as `run` does for its key, counts a failure for every key the batch had
    /// created (one more round trip): a transient error releases each towards
    /// [`crate::Settings::max_retries`] and answers [`Error::Handler`], or [`Error::Poisoned`]
    /// when that was the last failure allowed for at least one of them (it is `FAILED` now, and
    /// a redelivered batch answers [`BatchOutcome::Failed`] for it without calling `work`); a
    /// permanent error completes each `FAILED` with its response. So a batch that can never
    /// succeed (a poison-pill message) is not redelivered for ever. The batch cannot tell
    /// which message failed: every key it created is counted, so to keep a poison pill from
    /// failing the messages that came with it, retry a failed batch's messages one at a time.
    ///
    /// Round trips, for a closure of one statement: three per batch on either driver (`BEGIN`
    /// with the reservations, the closure's statement, the completions with `COMMIT`; over sqlx
    /// each request is one simple query), whatever the number of keys. A batch that created no
    /// key costs one, its `ROLLBACK` queued without waiting. (sqlx also checks a connection
    /// given back to its pool: one round trip more, which the call does not wait for.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for any item's key (nothing sent), [`Error::Handler`] /
    /// [`Error::Poisoned`] (your closure's error, as above), [`Error::LeaseLost`],
    /// [`Error::StoreUnavailable`], [`Error::IncompatibleExtension`] (an extension older than
    /// 0.4.0, named), [`Error::Database`], [`Error::Protocol`]; a `Transient` result, or not one
    /// result per created key, is an [`Error::Configuration`] naming the rule (the batch rolled
    /// back). Per-key answers (replayed, failed, in progress,
    /// mismatch) are [`BatchOutcome`]s, not errors. the repository's docs/rust-client.md, "Errors".
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped at any await, the connection is closed and the server rolls the
    /// whole batch back, reservations included, or the batch commits whole when its `COMMIT`
    /// had already left (docs/rust-client.md, "When a call is dropped").
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
        let call = async {
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::batch::run(&self.context(&schema), operation, user_id, items, work).await
        };
        let out = super::deadline::bounded("run_batch", self.settings().call_timeout, call).await;
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
