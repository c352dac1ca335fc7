//! `Idempotency::run_statement`: the in-transaction flow in one statement
//! (`flow::one_statement`).

use super::Idempotency;
use crate::driver::Driver;
use crate::error::{DatabaseError, Error};
use crate::flow;
use crate::one_statement::OneStatement;
use crate::outcome::Outcome;
use crate::response::Replayable;
use idempotency_core::{Fingerprint, Key};

impl<D: Driver> Idempotency<D> {
    /// The in-transaction flow in one statement: reserves the key, runs `write` only when this
    /// call created it, and completes the key with the row `write` returned, all in ONE
    /// statement sent in autocommit (one round trip, one commit, no subtransaction); see
    /// [`OneStatement`] for the two rules `write` follows. `T` is read from the returned row (a
    /// JSON object of its columns) on the first call and from the stored response on a replay.
    ///
    /// Every answer of [`Idempotency::run`]: `Outcome::Executed` (the row was written and the
    /// key completed `SUCCESS` in the same commit), `Outcome::Replayed`, and the errors
    /// [`Error::Mismatch`], [`Error::InProgress`] (or, with [`crate::Settings::wait`], a wait for
    /// the holder and then its answer), [`Error::Failed`]. A failing `write` (a constraint, a
    /// trigger) fails the statement, so the reservation rolls back with it; the failure is then
    /// counted in a second request, as `run` counts a transient failure: [`Error::Handler`] with
    /// the database error, or [`Error::Poisoned`] when that was the key's `max_retries`-th.
    /// 40001 / 40P01 retry the statement without counting; a lost connection is
    /// [`Error::StoreUnavailable`] (the statement may have committed: a retry replays it then),
    /// and so is a call cut by [`crate::Settings::call_timeout`].
    ///
    /// # Errors
    ///
    /// As listed above; [`Error::Configuration`] for a `write` that breaks [`OneStatement`]'s
    /// rules (nothing sent). the repository's docs/rust-client.md, "Errors".
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one statement in autocommit, committed whole or not at all; a dropped call
    /// stops it (a cancel request over tokio-postgres, the connection check over sqlx): docs/rust-client.md, "When a call is dropped".
    pub async fn run_statement<T>(&self, key: &Key, fingerprint: &Fingerprint, write: &OneStatement<'_>) -> Result<Outcome<T>, Error<DatabaseError>>
    where
        T: Replayable + Send,
    {
        write.check()?;
        let call = async {
            let schema = self.resolve_schema().await.map_err(Error::widen)?;
            flow::one_statement::run(&self.context(&schema), key, fingerprint, write).await
        };
        crate::trace::call("run_statement", key, super::deadline::bounded("run_statement", self.settings().call_timeout, call)).await
    }
}
