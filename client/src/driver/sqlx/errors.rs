//! What a sqlx error carries, for the one classification table (`classify.rs`), and the
//! conversions built on it.

use crate::classify::{self, DriverError, Origin, Transport};
use crate::error::Error;
use crate::handler_error::HandlerError;
use sqlx::postgres::PgDatabaseError;

impl DriverError for sqlx::Error {
    fn sqlstate(&self) -> Option<&str> {
        self.as_pg().map(PgDatabaseError::code)
    }

    fn message(&self) -> Option<&str> {
        self.as_pg().map(PgDatabaseError::message)
    }

    fn transport(&self) -> Transport {
        match self {
            sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                Transport::Lost
            }
            // A connection closed before the answer to sqlx's SSLRequest (a proxy whose server
            // is down) is read by sqlx as the byte 0x00: a failure to connect, not of the protocol.
            sqlx::Error::Protocol(m) if m.starts_with("unexpected response from SSLRequest: 0x00") => Transport::Lost,
            sqlx::Error::Configuration(_) => Transport::Misconfigured,
            _ => Transport::Answered,
        }
    }
}

/// The server's error inside a sqlx error.
trait AsPg {
    fn as_pg(&self) -> Option<&PgDatabaseError>;
}

impl AsPg for sqlx::Error {
    fn as_pg(&self) -> Option<&PgDatabaseError> {
        match self {
            sqlx::Error::Database(db) => db.try_downcast_ref::<PgDatabaseError>(),
            _ => None,
        }
    }
}

impl<E> From<sqlx::Error> for Error<E> {
    /// Connection-level failures (I/O, TLS, a pool timeout or a closed pool, class 08, shutdown,
    /// too many connections) and a server that cannot take writes (25006) become
    /// `StoreUnavailable`, a configuration error `Configuration`, anything else `Database`. This
    /// is the mapping for your own statements too.
    fn from(e: sqlx::Error) -> Self {
        classify::classify(e, Origin::Theirs)
    }
}

impl HandlerError for sqlx::Error {
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
