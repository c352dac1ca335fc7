//! How the client treats the errors of your closures: [`HandlerError`] and its
//! [`Disposition`] (the impls for each driver's error type are in the driver's `errors.rs`).

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
/// and for boxed errors whose source chain holds one).
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
}

impl HandlerError for Box<dyn std::error::Error + Send + Sync> {
    /// The SQLSTATE of the first database error (of either driver) in the source chain.
    fn sqlstate(&self) -> Option<&str> {
        first_database_error(self.as_ref()).and_then(|db| db.sqlstate())
    }

    fn store_unavailable(&self) -> bool {
        first_database_error(self.as_ref()).is_some_and(|db| db.store_unavailable())
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
}

impl HandlerError for std::io::Error {}
impl HandlerError for String {}
impl HandlerError for &'static str {}
