//! The one error type of the client, with its HTTP mapping.

use crate::key::KeyError;
use std::convert::Infallible;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// A boxed error source: a `tokio_postgres::Error`, a `deadpool_postgres::PoolError` or a
/// `deadpool_postgres::CreatePoolError`, kept as it came.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything a call can end with other than its result. `E` is the error type of your closure
/// (for [`crate::Idempotency::run`] and [`crate::Idempotency::run_external`]); calls that run
/// no closure use `Error<Infallible>`, the default.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// Another attempt holds the key (a live `PROCESSING` record, or an uncommitted reservation).
    #[error("another attempt holds this idempotency key; retry after {retry_after:?}")]
    InProgress {
        /// The `Retry-After` hint ([`crate::Settings::retry_after`]).
        retry_after: Duration,
    },
    /// The key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// The key's attempt failed for good: a stored failure response (replay it), or none when
    /// the key was poisoned by retries or recovered after a crash.
    #[error("the request failed permanently{}", if response.is_some() { " (stored response)" } else { "" })]
    Failed {
        /// The stored failure response, if one was stored.
        response: Option<serde_json::Value>,
    },
    /// This attempt lost its lease (recovered or taken over); its work was rolled back.
    #[error("the attempt lost its lease on the idempotency key; its work was rolled back")]
    LeaseLost,
    /// The key breaks the input rules; nothing was sent to the database.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The pool or the connection failed or timed out: the store could not be reached. The
    /// source is the `deadpool_postgres::PoolError` or `tokio_postgres::Error`.
    #[error("idempotency store unavailable")]
    StoreUnavailable(#[source] Source),
    /// One of this crate's own statements found no API function or type: the extension is not
    /// installed in the configured schema, or not at a version this client speaks. (An undefined
    /// function in your own SQL is a [`Error::Database`] error.)
    #[error("{reason}")]
    ExtensionMissing {
        /// What is missing, in words.
        reason: String,
        /// The database error, when a statement failed.
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// The client was configured wrongly: a malformed connection URL, an invalid schema name.
    #[error("configuration: {reason}")]
    Configuration {
        /// What is wrong, in words.
        reason: String,
        /// The underlying error, if any (for example a `deadpool_postgres::CreatePoolError`).
        #[source]
        source: Option<Source>,
    },
    /// Your closure (or the outside call of `run_external`) failed. What happened to the key
    /// follows its [`crate::HandlerError::disposition`]: transient errors released it (or, when
    /// `poisoned`, the failure reached `max_retries` and the key is now `FAILED`); permanent ones
    /// stored it as `FAILED` with their response.
    #[error("handler failed: {error}")]
    Handler {
        /// Your error.
        error: E,
        /// This transient failure was the key's last allowed one: it is now `FAILED` and a retry
        /// gets [`Error::Failed`] instead of running again.
        poisoned: bool,
    },
    /// `run_external`: the outside call succeeded but its local transaction (your `record`
    /// closure and the completion) failed for good, after retries of transient database errors.
    /// The key is never released in this case, so the outside call is never made again: when
    /// `key_completed`, the key holds the outside result (a retry replays it) although your local
    /// write is missing; otherwise the key stays `PROCESSING` until `idem_recover_stuck`. In both
    /// cases reconcile your local state from `response`.
    #[error("the outside call succeeded but its result could not be recorded locally (key completed: {key_completed})")]
    RecordFailed {
        /// The outside call's result, as stored in the key.
        response: serde_json::Value,
        /// Whether the key now holds `response`.
        key_completed: bool,
        /// The last error of the local transaction.
        error: Box<Error<E>>,
    },
    /// A stored response does not deserialise as the caller's type (or a result does not
    /// serialise to JSON).
    #[error("stored response does not match the response type")]
    Decode(#[source] serde_json::Error),
    /// The server answered something this client does not expect (a missing column, an unknown
    /// outcome): a client and extension version skew, or a bug.
    #[error("unexpected answer from the idempotency extension: {reason}")]
    Protocol {
        /// What was unexpected.
        reason: String,
        /// The decoding error, if any.
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// Any other database error (see [`Error::sqlstate`]).
    #[error("database error")]
    Database(#[source] tokio_postgres::Error),
}

impl<E> Error<E> {
    /// The HTTP status a server should answer with: 409 in progress / lease lost (send
    /// `Retry-After`, see [`Error::retry_after`]), 422 mismatch, the stored status for a failure
    /// (409 when nothing was stored), 400 invalid key, 503 store unavailable, 500 otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::InProgress { .. } | Error::LeaseLost => 409,
            Error::Mismatch => 422,
            Error::Failed { response } => response
                .as_ref()
                .and_then(|r| r.get("status"))
                .and_then(serde_json::Value::as_u64)
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..=599).contains(s))
                .unwrap_or(409),
            Error::InvalidKey(_) => 400,
            Error::StoreUnavailable(_) => 503,
            Error::ExtensionMissing { .. }
            | Error::Configuration { .. }
            | Error::Handler { .. }
            | Error::RecordFailed { .. }
            | Error::Decode(_)
            | Error::Protocol { .. }
            | Error::Database(_) => 500,
        }
    }

    /// How long a client should wait before retrying, for `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InProgress { retry_after } => Some(*retry_after),
            Error::LeaseLost => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The SQLSTATE of a database error, if that is what this is.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        match self {
            Error::Database(e) => e.code(),
            _ => None,
        }
    }
}

impl Error<Infallible> {
    /// Changes the handler error type of an error that carries none.
    pub(crate) fn widen<F>(self) -> Error<F> {
        match self {
            Error::InProgress { retry_after } => Error::InProgress { retry_after },
            Error::Mismatch => Error::Mismatch,
            Error::Failed { response } => Error::Failed { response },
            Error::LeaseLost => Error::LeaseLost,
            Error::InvalidKey(k) => Error::InvalidKey(k),
            Error::StoreUnavailable(s) => Error::StoreUnavailable(s),
            Error::ExtensionMissing { reason, source } => Error::ExtensionMissing { reason, source },
            Error::Configuration { reason, source } => Error::Configuration { reason, source },
            Error::Handler { error, .. } => match error {},
            Error::RecordFailed { response, key_completed, error } => {
                Error::RecordFailed { response, key_completed, error: Box::new(error.widen()) }
            }
            Error::Decode(e) => Error::Decode(e),
            Error::Protocol { reason, source } => Error::Protocol { reason, source },
            Error::Database(e) => Error::Database(e),
        }
    }
}

impl<E> From<tokio_postgres::Error> for Error<E> {
    /// Connection-level failures (closed connection, I/O, class 08, shutdown, too many
    /// connections) become `StoreUnavailable`, anything else `Database`. This is the mapping for
    /// your own statements too, so `?` on them never claims the extension is missing.
    fn from(e: tokio_postgres::Error) -> Self {
        if is_unavailable(&e) {
            Error::StoreUnavailable(Box::new(e))
        } else {
            Error::Database(e)
        }
    }
}

impl<E> From<deadpool_postgres::PoolError> for Error<E> {
    /// A connection that could not be made is `StoreUnavailable` (or `Database` for, say, an
    /// authentication failure); a timeout waiting for a pooled connection or a closed pool is
    /// `StoreUnavailable`; a pool without a runtime is a `Configuration` error.
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::PoolError;
        match e {
            PoolError::Backend(e) => Error::from(e),
            PoolError::NoRuntimeSpecified => {
                Error::Configuration { reason: "the pool has no runtime for its timeouts".into(), source: Some(Box::new(e)) }
            }
            other => Error::StoreUnavailable(Box::new(other)),
        }
    }
}

/// Maps an error of one of this crate's own statements: a missing function, type or schema
/// means the extension is missing; anything else as [`From`] does.
pub(crate) fn ours(e: tokio_postgres::Error) -> Error {
    let missing = e.code().is_some_and(|c| {
        *c == SqlState::UNDEFINED_FUNCTION || *c == SqlState::UNDEFINED_OBJECT || *c == SqlState::INVALID_SCHEMA_NAME
    });
    if missing {
        Error::ExtensionMissing {
            reason: "the idempotency extension is not installed in the configured schema".into(),
            source: Some(e),
        }
    } else {
        Error::from(e)
    }
}

/// Whether a database error means the store cannot be reached.
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        Some(code) => {
            code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS
        }
        None => e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// 40001 (serialization failure) or 40P01 (deadlock): the whole transaction is worth retrying.
pub(crate) fn is_serialization_failure(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
}
