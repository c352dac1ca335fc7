//! The items and outcomes of a batch (`Idempotency::run_batch`, in `handle/batch.rs`; the
//! flow itself is `flow::batch`).

use idempotency_core::Fingerprint;
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
