//! The one error type of the client, with its HTTP mapping.

use crate::key::KeyError;
use std::convert::Infallible;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// Everything a call can end with other than its result. `E` is the error type of your closure
/// (for [`crate::Idempotency::run`]); calls that run no closure use `Error<Infallible>`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// Another attempt holds the key (a live `PROCESSING` record, or an uncommitted reservation).
    #[error("another attempt holds this idempotency key; retry after {retry_after:?}")]
    InProgress { retry_after: Duration },
    /// The key was used before with a different request.
    #[error("idempotency key reused with a different request")]
    Mismatch,
    /// The key's attempt failed for good: a stored failure response (replay it), or none when
    /// the key was poisoned by retries or recovered after a crash.
    #[error("the request failed permanently{}", if response.is_some() { " (stored response)" } else { "" })]
    Failed { response: Option<serde_json::Value> },
    /// This attempt lost its lease (recovered or taken over); its work was rolled back.
    #[error("the attempt lost its lease on the idempotency key; its work was rolled back")]
    LeaseLost,
    /// The key breaks the input rules; nothing was sent to the database.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The pool or the connection failed (or timed out): the store could not be reached.
    #[error("idempotency store unavailable: {0}")]
    StoreUnavailable(String),
    /// The extension is not installed in the database, or not at a version this client supports.
    #[error("{0}")]
    ExtensionMissing(String),
    /// Your closure failed.
    #[error("handler failed: {0}")]
    Handler(E),
    /// A stored response does not deserialise as the caller's type (or a result does not
    /// serialise to JSON).
    #[error("stored response does not match the response type: {0}")]
    Decode(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Db(#[source] tokio_postgres::Error),
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
            Error::ExtensionMissing(_) | Error::Decode(_) | Error::Handler(_) | Error::Db(_) => 500,
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
            Error::Db(e) => e.code(),
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
            Error::ExtensionMissing(s) => Error::ExtensionMissing(s),
            Error::Decode(s) => Error::Decode(s),
            Error::Handler(never) => match never {},
            Error::Db(e) => Error::Db(e),
        }
    }
}

impl<E> From<tokio_postgres::Error> for Error<E> {
    /// Connection-level failures become `StoreUnavailable`, a missing API function
    /// `ExtensionMissing`, anything else `Db`.
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(code) if *code == SqlState::UNDEFINED_FUNCTION || *code == SqlState::UNDEFINED_OBJECT => {
                Error::ExtensionMissing(format!(
                    "the idempotency extension is not installed or not on the search_path: {e}"
                ))
            }
            Some(code) if is_unavailable_code(code) => Error::StoreUnavailable(e.to_string()),
            Some(_) => Error::Db(e),
            None if e.is_closed() || io_source(&e) => Error::StoreUnavailable(e.to_string()),
            None => Error::Db(e),
        }
    }
}

impl<E> From<deadpool_postgres::PoolError> for Error<E> {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => Error::from(e),
            other => Error::StoreUnavailable(other.to_string()),
        }
    }
}

fn io_source(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

/// Class 08 (connection exception), 57P01-57P03 (shutdown, cannot connect now), 53300 (too many
/// connections).
fn is_unavailable_code(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
}

/// Whether a database error is worth retrying the whole transaction for (40001, 40P01).
pub(crate) fn is_retryable<E>(e: &Error<E>) -> bool {
    matches!(e.sqlstate(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
}
