//! What the tokio-postgres and deadpool errors carry, for the one classification table
//! (`classify.rs`), and the conversions built on it.

use crate::classify::{self, DriverError, Origin, Transport};
use crate::error::Error;
use crate::handler_error::HandlerError;

impl DriverError for tokio_postgres::Error {
    fn sqlstate(&self) -> Option<&str> {
        self.code().map(|c| c.code())
    }

    fn message(&self) -> Option<&str> {
        self.as_db_error().map(|d| d.message())
    }

    fn transport(&self) -> Transport {
        let lost = self.code().is_none() && (self.is_closed() || std::error::Error::source(self).is_some_and(|s| s.is::<std::io::Error>()));
        if lost {
            Transport::Lost
        } else {
            Transport::Answered
        }
    }
}

impl DriverError for deadpool_postgres::PoolError {
    fn sqlstate(&self) -> Option<&str> {
        match self {
            deadpool_postgres::PoolError::Backend(e) => DriverError::sqlstate(e),
            _ => None,
        }
    }

    fn message(&self) -> Option<&str> {
        match self {
            deadpool_postgres::PoolError::Backend(e) => DriverError::message(e),
            _ => None,
        }
    }

    /// A connection that could not be made is the driver's error; a timeout waiting for a
    /// pooled connection or a closed pool is lost; a pool without a runtime is misconfigured.
    fn transport(&self) -> Transport {
        use deadpool_postgres::PoolError;
        match self {
            PoolError::Backend(e) => e.transport(),
            PoolError::NoRuntimeSpecified => Transport::Misconfigured,
            _ => Transport::Lost,
        }
    }
}

impl<E> From<tokio_postgres::Error> for Error<E> {
    /// Connection-level failures (closed connection, I/O, class 08, shutdown, too many
    /// connections) and a server that cannot take writes (25006 on a standby, after a failover)
    /// become `StoreUnavailable`, anything else `Database`. This is the mapping for your own
    /// statements too, so `?` on them never claims the extension is missing.
    fn from(e: tokio_postgres::Error) -> Self {
        classify::classify(e, Origin::Theirs)
    }
}

impl<E> From<deadpool_postgres::PoolError> for Error<E> {
    /// A connection that could not be made is `StoreUnavailable` (or `Database` for, say, an
    /// authentication failure); a timeout waiting for a pooled connection or a closed pool is
    /// `StoreUnavailable`; a pool without a runtime is a `Configuration` error.
    fn from(e: deadpool_postgres::PoolError) -> Self {
        classify::classify(e, Origin::Theirs)
    }
}

impl HandlerError for tokio_postgres::Error {
    fn sqlstate(&self) -> Option<&str> {
        DriverError::sqlstate(self)
    }

    fn store_unavailable(&self) -> bool {
        classify::unavailable(self)
    }

    fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self)
    }
}
