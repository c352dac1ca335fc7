//! How the client treats the errors of your closures: [`HandlerError`] and its
//! [`Disposition`] (the impls for each driver's error type are in the driver's `errors.rs`).

use crate::error::Error;
use serde_json::Value;

/// How a closure error is recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Roll the business writes back and release the key: the client's retry runs again.
    Transient,
    /// Record the key as `FAILED` with this response (replayed to every retry).
    Permanent(Option<Value>),
}

/// What the client needs to know about the errors of your closures.
///
/// The default is transient: an error rolls back the attempt's writes and releases the key
/// (counting towards `max_retries`). Return [`Disposition::Permanent`] from
/// [`HandlerError::disposition`] for failures that must never run again (a declined card).
///
/// A serialization failure (40001) or deadlock (40P01) inside the closure is neither: the whole
/// transaction is retried and nothing is counted. The client recognises it through
/// [`HandlerError::sqlstate`]; implement it when your error type wraps a database error
/// (it is implemented for `tokio_postgres::Error`, for `sqlx::Error` with the `sqlx` feature,
/// and for boxed errors, `anyhow::Error` (feature `anyhow`) and `eyre::Report` (feature
/// `eyre`) whose source chain holds one).
///
/// Your error is the `source()` of [`crate::Error::Handler`] and [`crate::Error::Poisoned`]
/// (and, through the local transaction's error, of [`crate::Error::RecordFailed`]) when
/// [`HandlerError::as_error`] gives it as a `std::error::Error`: implement that as `Some(self)`
/// for an error type of your own.
///
/// ```
/// use idempotency_client::{Disposition, HandlerError};
///
/// #[derive(Debug)]
/// enum ChargeError { Declined, Gateway(std::io::Error) }
///
/// impl std::fmt::Display for ChargeError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str(match self { ChargeError::Declined => "card declined", ChargeError::Gateway(_) => "gateway failed" })
///     }
/// }
///
/// impl std::error::Error for ChargeError {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         match self { ChargeError::Gateway(e) => Some(e), ChargeError::Declined => None }
///     }
/// }
///
/// impl HandlerError for ChargeError {
///     fn disposition(&self) -> Disposition {
///         match self {
///             ChargeError::Declined => Disposition::Permanent(Some(serde_json::json!({"error": "declined"}))),
///             ChargeError::Gateway(_) => Disposition::Transient,
///         }
///     }
///
///     fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(self)
///     }
/// }
/// ```
pub trait HandlerError {
    /// How this error is recorded.
    fn disposition(&self) -> Disposition {
        Disposition::Transient
    }

    /// The SQLSTATE of the database error this error carries, if any.
    fn sqlstate(&self) -> Option<&str> {
        None
    }

    /// Whether this error is a lost or unusable connection (the two-phase flow then retries its
    /// local transaction).
    fn store_unavailable(&self) -> bool {
        false
    }

    /// This error as a `std::error::Error`, to be the `source()` of [`crate::Error::Handler`]
    /// and [`crate::Error::Poisoned`]; `None` (the default, and for `String` and `&str`, whose
    /// text is in the error's message): no source.
    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        None
    }
}

impl<E: HandlerError> Error<E> {
    /// Whether the same call, with the same key, may succeed if made again later (a queue
    /// consumer redelivers the message; an HTTP client retries): another attempt holds the key
    /// ([`Error::InProgress`], wait [`Error::retry_after`]), the lease was lost
    /// ([`Error::LeaseLost`]), the store could not be used ([`Error::StoreUnavailable`]:
    /// nothing was kept), or your closure failed transiently and the key was released
    /// ([`Error::Handler`] whose [`crate::HandlerError::disposition`] is transient). False for
    /// every answer a retry would only repeat: a mismatch, a stored or poisoned failure, an
    /// invalid key, a configuration or protocol error, a result too large to store, a
    /// `run_external` whose record failed (reconcile instead), and any other database error.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InProgress { .. } | Error::LeaseLost { .. } | Error::StoreUnavailable(_) => true,
            Error::Handler { error } => error.disposition() == Disposition::Transient,
            _ => false,
        }
    }
}

impl HandlerError for Box<dyn std::error::Error + Send + Sync> {
    /// The SQLSTATE of the first database error (of either driver) in the source chain.
    fn sqlstate(&self) -> Option<&str> {
        first_database_error(self.as_ref()).and_then(|db| db.sqlstate())
    }

    fn store_unavailable(&self) -> bool {
        first_database_error(self.as_ref()).is_some_and(|db| db.store_unavailable())
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.as_ref())
    }
}

/// Transient, as every error by default; the SQLSTATE (40001 / 40P01 retry the transaction) and
/// a lost connection are read from the first database error of either driver in its chain
/// (`anyhow::Error::chain`), as for a boxed error.
#[cfg(feature = "anyhow")]
#[cfg_attr(docsrs, doc(cfg(feature = "anyhow")))]
impl HandlerError for anyhow::Error {
    fn sqlstate(&self) -> Option<&str> {
        first_database_error(AsRef::<dyn std::error::Error + Send + Sync>::as_ref(self)).and_then(|db| db.sqlstate())
    }

    fn store_unavailable(&self) -> bool {
        first_database_error(AsRef::<dyn std::error::Error + Send + Sync>::as_ref(self)).is_some_and(|db| db.store_unavailable())
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(AsRef::<dyn std::error::Error>::as_ref(self))
    }
}

/// As for `anyhow::Error`: transient, the SQLSTATE and a lost connection read from the first
/// database error in its chain.
#[cfg(feature = "eyre")]
#[cfg_attr(docsrs, doc(cfg(feature = "eyre")))]
impl HandlerError for eyre::Report {
    fn sqlstate(&self) -> Option<&str> {
        first_database_error(AsRef::<dyn std::error::Error + Send + Sync>::as_ref(self)).and_then(|db| db.sqlstate())
    }

    fn store_unavailable(&self) -> bool {
        first_database_error(AsRef::<dyn std::error::Error + Send + Sync>::as_ref(self)).is_some_and(|db| db.store_unavailable())
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(AsRef::<dyn std::error::Error>::as_ref(self))
    }
}

/// The sources: the driver's or the pool's error, the key's rule, the JSON error, and your
/// closure's error for [`Error::Handler`] and [`Error::Poisoned`] (when its
/// [`HandlerError::as_error`] gives it: every error type but `String` and `&str`), the
/// local transaction's error for [`Error::RecordFailed`] (whose own source is your `record`
/// closure's error when that is what failed).
impl<E> std::error::Error for Error<E>
where
    E: HandlerError + std::fmt::Debug + std::fmt::Display + 'static,
{
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidKey(e) => Some(e),
            Error::StoreUnavailable(source) => Some(source.as_ref()),
            Error::IncompatibleExtension { source, .. } | Error::Configuration { source, .. } | Error::Protocol { source, .. } => {
                source.as_ref().map(|s| s.as_ref() as _)
            }
            Error::Handler { error } | Error::Poisoned { error } => error.as_error(),
            Error::RecordFailed { error, .. } => Some(error.as_ref()),
            Error::Decode(e) => Some(e),
            Error::Database(e) => Some(e),
            Error::InProgress { .. } | Error::Mismatch | Error::Failed { .. } | Error::LeaseLost { .. } | Error::ResponseTooLarge { .. } => None,
        }
    }
}

/// The first error of a driver in a source chain.
fn first_database_error<'a>(e: &'a (dyn std::error::Error + Send + Sync + 'static)) -> Option<&'a dyn HandlerError> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = next {
        #[cfg(feature = "postgres")]
        if let Some(db) = e.downcast_ref::<tokio_postgres::Error>() {
            return Some(db);
        }
        #[cfg(feature = "sqlx")]
        if let Some(db) = e.downcast_ref::<sqlx::Error>() {
            return Some(db);
        }
        next = e.source();
    }
    None
}

impl HandlerError for crate::error::DatabaseError {
    fn sqlstate(&self) -> Option<&str> {
        crate::error::DatabaseError::sqlstate(self)
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self)
    }
}

impl HandlerError for std::io::Error {
    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self)
    }
}
impl HandlerError for String {}
impl HandlerError for &'static str {}
/// The error of calls that run no closure (`Error<Infallible>`, the default): never made.
impl HandlerError for std::convert::Infallible {}
