//! What a flow ended with, and the one mapping from a flow's result to its [`Decision`] label
//! (tracing spans, the layer's spans and metrics).

use crate::error::Error;
use idempotency_core::Decision;

/// The result of a flow that ran or replayed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    /// The closure ran now and its result was committed with the key (`SUCCESS`, or `FAILED` for
    /// a result whose verdict is a permanent failure).
    Executed(T),
    /// An earlier attempt's committed result; the closure did not run. Send
    /// `Idempotent-Replayed: true`.
    Replayed(T),
    /// The closure ran but its result was transient (say a 5xx): its writes were rolled back and
    /// the key released, so the client's retry runs again.
    Released(T),
    /// The closure ran, its result was transient, and this was the key's `max_retries`-th
    /// transient failure: its writes were rolled back and the key is now `FAILED`, so a retry
    /// gets [`Error::Failed`] and never runs again.
    Poisoned(T),
}

impl<T> Outcome<T> {
    /// Whether this is an earlier attempt's result (`Idempotent-Replayed: true`).
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }

    /// Whether the closure ran now and its result was committed with the key.
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// The result.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) | Outcome::Poisoned(v) => v,
        }
    }

    /// The result, by value.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) | Outcome::Poisoned(v) => v,
        }
    }

    /// Its label.
    pub fn decision(&self) -> Decision {
        match self {
            Outcome::Executed(_) => Decision::Executed,
            Outcome::Replayed(_) => Decision::Replayed,
            Outcome::Released(_) => Decision::Released,
            Outcome::Poisoned(_) => Decision::Poisoned,
        }
    }
}

/// The label of a flow's result: the one table from outcomes and errors to [`Decision`].
pub fn decision<T, E>(result: &Result<Outcome<T>, Error<E>>) -> Decision {
    match result {
        Ok(outcome) => outcome.decision(),
        Err(e) => e.decision(),
    }
}

impl<E> Error<E> {
    /// Its label.
    pub fn decision(&self) -> Decision {
        match self {
            Error::InProgress { .. } => Decision::InProgress,
            Error::Mismatch => Decision::Mismatch,
            Error::Failed { .. } => Decision::Failed,
            Error::LeaseLost { .. } => Decision::LeaseLost,
            Error::StoreUnavailable(_) => Decision::StoreUnavailable,
            Error::InvalidKey(_) => Decision::Rejected,
            Error::Poisoned { .. } => Decision::Poisoned,
            Error::Handler { .. } => Decision::Released,
            Error::ResponseTooLarge { effect_stands: false, key_failed: true } => Decision::Poisoned,
            Error::ResponseTooLarge { effect_stands: false, key_failed: false } => Decision::Released,
            _ => Decision::Error,
        }
    }
}
