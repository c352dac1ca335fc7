//! The one table from a driver's error to the client's [`Error`]: (SQLSTATE, message, what
//! happened below SQL) in, a variant out. Each driver only says what its error type carries
//! ([`DriverError`]); every decision about it is made here.

use crate::error::{DatabaseError, Error};
use crate::sql::LEASE_LOST_MARK;

/// What happened below SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Nothing: the server answered (with an error, if there is a SQLSTATE).
    Answered,
    /// The connection was lost or could not be had: closed, I/O, TLS, a pool timeout.
    Lost,
    /// The driver or pool was set up wrongly.
    Misconfigured,
}

/// What a driver's error carries, as the table reads it. Implemented in each driver's
/// `errors.rs` over its own error types.
pub(crate) trait DriverError: std::error::Error + Send + Sync + Sized + 'static {
    /// The SQLSTATE the server sent, if it sent one.
    fn sqlstate(&self) -> Option<&str>;
    /// The server's message, if it sent one.
    fn message(&self) -> Option<&str>;
    /// What happened below SQL.
    fn transport(&self) -> Transport;
}

/// Whose statement failed: for this crate's own statements an undefined function, type or
/// schema means the extension is missing; in yours it is just a database error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A statement of `sql.rs`.
    Ours,
    /// Your statement (the `From` impls, for `?` in your closures).
    Theirs,
}

/// SQLSTATEs after which the store cannot be used now, and a retry (perhaps on another node)
/// may succeed: class 08 (connection), shutdowns and too many connections, and a server that
/// cannot take writes (25006: a standby, after a failover).
fn unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "25006")
}

/// Whether the error means the store cannot be used now.
pub(crate) fn unavailable(e: &impl DriverError) -> bool {
    e.transport() == Transport::Lost || e.sqlstate().is_some_and(unavailable_sqlstate)
}

/// 40001 (serialization failure) or 40P01 (deadlock): the whole transaction is worth retrying.
pub(crate) fn retryable_sqlstate(code: Option<&str>) -> bool {
    matches!(code, Some("40001" | "40P01"))
}

/// Whether a completion aborted its transaction because the key was lost (`complete_or_abort`,
/// `complete_many_or_abort`: invalid input for boolean carrying the mark).
pub(crate) fn lease_lost(e: &impl DriverError) -> bool {
    e.sqlstate() == Some("22P02") && e.message().is_some_and(|m| m.contains(LEASE_LOST_MARK))
}

/// The table.
pub(crate) fn classify<D: DriverError, E>(e: D, origin: Origin) -> Error<E> {
    if e.transport() == Transport::Misconfigured {
        return Error::Configuration { reason: e.to_string(), source: Some(Box::new(e)) };
    }
    if unavailable(&e) {
        return Error::StoreUnavailable(Box::new(e));
    }
    if origin == Origin::Ours && lease_lost(&e) {
        // The flow answers it with its own Retry-After.
        return Error::LeaseLost { retry_after: std::time::Duration::ZERO };
    }
    let missing = matches!(e.sqlstate(), Some("42883" | "42704" | "3F000"));
    if missing && origin == Origin::Ours {
        return Error::IncompatibleExtension {
            reason: "the idempotency extension is not installed in the configured schema".into(),
            source: Some(Box::new(e)),
        };
    }
    let code = e.sqlstate().map(str::to_owned);
    Error::Database(DatabaseError::new(code.as_deref(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Fake(Option<&'static str>, Option<&'static str>, Transport);

    impl std::fmt::Display for Fake {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{:?}", self)
        }
    }
    impl std::error::Error for Fake {}
    impl DriverError for Fake {
        fn sqlstate(&self) -> Option<&str> {
            self.0
        }
        fn message(&self) -> Option<&str> {
            self.1
        }
        fn transport(&self) -> Transport {
            self.2
        }
    }

    fn kind(code: Option<&'static str>, transport: Transport, origin: Origin) -> String {
        let e: Error = classify(Fake(code, None, transport), origin);
        format!("{e:?}").split([' ', '(', '{']).next().unwrap_or_default().to_owned()
    }

    #[test]
    fn the_table() {
        use Transport::*;
        for (code, transport, origin, want) in [
            (None, Lost, Origin::Ours, "StoreUnavailable"),
            (Some("08006"), Answered, Origin::Theirs, "StoreUnavailable"),
            (Some("25006"), Answered, Origin::Ours, "StoreUnavailable"),
            (Some("57P01"), Answered, Origin::Ours, "StoreUnavailable"),
            (Some("53300"), Answered, Origin::Ours, "StoreUnavailable"),
            (Some("42883"), Answered, Origin::Ours, "IncompatibleExtension"),
            (Some("3F000"), Answered, Origin::Ours, "IncompatibleExtension"),
            (Some("42883"), Answered, Origin::Theirs, "Database"),
            (Some("23505"), Answered, Origin::Ours, "Database"),
            (None, Misconfigured, Origin::Ours, "Configuration"),
            (Some("22P02"), Answered, Origin::Theirs, "Database"),
        ] {
            assert_eq!(kind(code, transport, origin), want, "{code:?} {transport:?} {origin:?}");
        }
        let lost: Error = classify(Fake(Some("22P02"), Some("idempotency: lease lost"), Answered), Origin::Ours);
        assert!(matches!(lost, Error::LeaseLost { .. }), "{lost:?}");
        assert!(lease_lost(&Fake(Some("22P02"), Some("invalid input syntax for type boolean: \"idempotency: lease lost\""), Answered)));
        assert!(!lease_lost(&Fake(Some("22P02"), Some("invalid input syntax for type boolean: \"x\""), Answered)));
        assert!(retryable_sqlstate(Some("40P01")) && !retryable_sqlstate(Some("23505")) && !retryable_sqlstate(None));
    }
}
