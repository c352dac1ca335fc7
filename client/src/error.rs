//! The one error type of the client, with its retry hints ([`Error::retry_after`] here,
//! [`Error::is_retryable`] with the dispositions in `handler_error.rs`) for any caller, a queue
//! consumer included. (Its HTTP mapping lives with the layer, in the crate idempotency-tower:
//! `http_status` and `retry_after`, which calls [`Error::retry_after`].)

use idempotency_core::KeyError;
use std::convert::Infallible;
use std::time::Duration;

/// A boxed error source, kept as it came (a driver's error, a pool's error).
pub(crate) type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A database error: its SQLSTATE (when the server sent one) and the driver's error.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct DatabaseError {
    code: Option<String>,
    #[source]
    source: Source,
}

impl DatabaseError {
    pub(crate) fn new(code: Option<&str>, source: impl Into<Source>) -> Self {
        DatabaseError { code: code.map(str::to_owned), source: source.into() }
    }

    /// The SQLSTATE, when the server sent one (`"40001"`, `"23505"`, ...).
    pub fn sqlstate(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// The driver's error (a `tokio_postgres::Error`, or a `sqlx::Error` over the sqlx driver), to
    /// downcast.
    pub fn driver_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self.source.as_ref()
    }
}

/// Everything a call can end with other than its result. `E` is the error type of your closure
/// (for [`crate::Idempotency::run`] and [`crate::Idempotency::run_external`]); calls that run
/// no closure use `Error<Infallible>`, the default.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// Another attempt holds the key (a live `PROCESSING` record, or an uncommitted reservation).
    InProgress {
        /// The `Retry-After` hint ([`crate::Settings::retry_after`]).
        retry_after: Duration,
    },
    /// The key was used before with a different request.
    Mismatch,
    /// The key's attempt failed for good: a stored failure response (replay it), or none when
    /// the key was poisoned by retries or recovered after a crash.
    Failed {
        /// The stored failure response, if one was stored.
        response: Option<serde_json::Value>,
    },
    /// This attempt lost its lease (recovered or taken over); its work was rolled back.
    LeaseLost {
        /// The `Retry-After` hint ([`crate::Settings::retry_after`]).
        retry_after: Duration,
    },
    /// The key breaks the input rules; nothing was sent to the database.
    InvalidKey(KeyError),
    /// The pool or the connection failed or timed out, or the server cannot take writes (a
    /// standby after a failover): the store could not be used. Retrying is safe; the source is
    /// the pool's or the driver's error.
    StoreUnavailable(Source),
    /// No usable install of the extension: not installed in the configured schema, or at a
    /// version this client does not speak (only this crate's own statements report it; an
    /// undefined function in your own SQL is a [`Error::Database`] error).
    IncompatibleExtension {
        /// What is missing or skewed, in words.
        reason: String,
        /// The database error, when a statement failed.
        source: Option<Source>,
    },
    /// The client was configured wrongly: a malformed connection URL, an invalid schema name.
    Configuration {
        /// What is wrong, in words.
        reason: String,
        /// The underlying error, if any.
        source: Option<Source>,
    },
    /// Your closure (or the outside call of `run_external`) failed, and what happened to the
    /// key follows its [`crate::HandlerError::disposition`]: a transient error released it (a
    /// retry runs again); a permanent one stored it as `FAILED` with its response.
    Handler {
        /// Your error; also the `source()` (see [`crate::HandlerError::as_error`]).
        error: E,
    },
    /// Your closure failed transiently and that was the key's `max_retries`-th transient
    /// failure: its writes were undone and the key is now `FAILED`, so a retry gets
    /// [`Error::Failed`] instead of running again (the error twin of
    /// [`crate::Outcome::Poisoned`]).
    Poisoned {
        /// Your error; also the `source()` (see [`crate::HandlerError::as_error`]).
        error: E,
    },
    /// `run_external`: the outside call succeeded but its local transaction (your `record`
    /// closure and the completion) failed for good, after retries of transient database errors.
    /// The key is never released in this case, so the outside call is never made again: when
    /// `key_completed`, the key holds the outside result (a retry replays it) although your local
    /// write is missing; otherwise the key stays `PROCESSING` until `idem_recover_stuck`. In both
    /// cases reconcile your local state from `response`.
    RecordFailed {
        /// The outside call's result, as stored in the key.
        response: serde_json::Value,
        /// Whether the key now holds `response`.
        key_completed: bool,
        /// The last error of the local transaction; also the `source()` (and when `record`
        /// failed, an [`Error::Handler`] whose source is its error).
        error: Box<Error<E>>,
    },
    /// The result's stored form is larger than the server's `idempotency.max_response_bytes`
    /// (`idem_complete` answered SQLSTATE 54000; the layer refuses a response body above its
    /// `response_limit` before sending it), so it was not stored, and no retry loops for ever.
    /// In-transaction (`run`, the layer's default mode) the work was rolled back and the key
    /// released like a transient failure, counting towards `max_retries` (`key_failed` when that
    /// was the last one: retries get [`Error::Failed`]). Two-phase (`run_external`) the outside
    /// effect happened (`effect_stands`), so the key was completed `FAILED` with the marker
    /// [`crate::StoredResponse::too_large`] (your `record` closure ran again, in the transaction
    /// that stored the marker) and every retry gets [`Error::Failed`] with the marker.
    ResponseTooLarge {
        /// Two-phase: the outside effect happened and the key holds the marker. In-transaction:
        /// false, the work was rolled back.
        effect_stands: bool,
        /// The key is now `FAILED` and retries get [`Error::Failed`]: always two-phase;
        /// in-transaction when this was the key's `max_retries`-th failure.
        key_failed: bool,
    },
    /// A stored response does not deserialise as the caller's type (or a result does not
    /// serialise to JSON).
    Decode(serde_json::Error),
    /// The server answered something this client does not expect (a missing column, an unknown
    /// outcome): a client and extension version skew, or a bug.
    Protocol {
        /// What was unexpected.
        reason: String,
        /// The decoding error, if any.
        source: Option<Source>,
    },
    /// Any other database error (see [`Error::sqlstate`]).
    Database(DatabaseError),
}

impl<E: std::fmt::Display> std::fmt::Display for Error<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::InProgress { retry_after } => write!(f, "another attempt holds this idempotency key; retry after {retry_after:?}"),
            Error::Mismatch => f.write_str("idempotency key reused with a different request"),
            Error::Failed { response } => {
                write!(f, "the request failed permanently{}", if response.is_some() { " (stored response)" } else { "" })
            }
            Error::LeaseLost { .. } => f.write_str("the attempt lost its lease on the idempotency key; its work was rolled back"),
            Error::InvalidKey(e) => write!(f, "invalid idempotency key: {e}"),
            Error::StoreUnavailable(_) => f.write_str("idempotency store unavailable"),
            Error::IncompatibleExtension { reason, .. } => f.write_str(reason),
            Error::Configuration { reason, .. } => write!(f, "configuration: {reason}"),
            Error::Handler { error } => write!(f, "handler failed: {error}"),
            Error::Poisoned { error } => write!(f, "handler failed, and the key is poisoned: {error}"),
            Error::RecordFailed { key_completed, .. } => {
                write!(f, "the outside call succeeded but its result could not be recorded locally (key completed: {key_completed})")
            }
            Error::ResponseTooLarge { effect_stands, key_failed } => write!(
                f,
                "the result is larger than idempotency.max_response_bytes and was not stored ({})",
                too_large_fate(*effect_stands, *key_failed)
            ),
            Error::Decode(_) => f.write_str("stored response does not match the response type"),
            Error::Protocol { reason, .. } => write!(f, "unexpected answer from the idempotency extension: {reason}"),
            Error::Database(_) => f.write_str("database error"),
        }
    }
}

impl<E> From<KeyError> for Error<E> {
    fn from(e: KeyError) -> Self {
        Error::InvalidKey(e)
    }
}

/// The words of [`Error::ResponseTooLarge`] for what happened to the work and the key.
fn too_large_fate(effect_stands: bool, key_failed: bool) -> &'static str {
    match (effect_stands, key_failed) {
        (true, _) => "the effect stands; the key holds the too-large marker",
        (false, true) => "rolled back; the key is poisoned",
        (false, false) => "rolled back; the key was released",
    }
}

impl<E> Error<E> {
    /// The SQLSTATE of a database error, if that is what this is.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Database(e) => e.sqlstate(),
            _ => None,
        }
    }

    /// The wait this error asks for before the same key is tried again: the hint an
    /// [`Error::InProgress`] or [`Error::LeaseLost`] carries ([`crate::Settings::retry_after`]);
    /// `None` for every other error (for [`Error::StoreUnavailable`] the wait is the caller's
    /// to choose: the layer sends its `unavailable_retry_after`).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::InProgress { retry_after } | Error::LeaseLost { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    pub(crate) fn protocol(reason: impl Into<String>) -> Self {
        Error::Protocol { reason: reason.into(), source: None }
    }
}

impl Error<Infallible> {
    /// Changes the handler error type of an error that carries none.
    pub(crate) fn widen<F>(self) -> Error<F> {
        match self {
            Error::InProgress { retry_after } => Error::InProgress { retry_after },
            Error::Mismatch => Error::Mismatch,
            Error::Failed { response } => Error::Failed { response },
            Error::LeaseLost { retry_after } => Error::LeaseLost { retry_after },
            Error::InvalidKey(k) => Error::InvalidKey(k),
            Error::StoreUnavailable(s) => Error::StoreUnavailable(s),
            Error::IncompatibleExtension { reason, source } => Error::IncompatibleExtension { reason, source },
            Error::Configuration { reason, source } => Error::Configuration { reason, source },
            Error::Handler { error } | Error::Poisoned { error } => match error {},
            Error::RecordFailed { response, key_completed, error } => {
                Error::RecordFailed { response, key_completed, error: Box::new(error.widen()) }
            }
            Error::ResponseTooLarge { effect_stands, key_failed } => Error::ResponseTooLarge { effect_stands, key_failed },
            Error::Decode(e) => Error::Decode(e),
            Error::Protocol { reason, source } => Error::Protocol { reason, source },
            Error::Database(e) => Error::Database(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[derive(Debug)]
    struct Declined(std::io::Error);

    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("card declined")
        }
    }

    impl std::error::Error for Declined {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    impl crate::HandlerError for Declined {
        fn as_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(self)
        }
    }

    /// The messages of `e`'s source chain, `e` excluded.
    fn chain(e: &dyn std::error::Error) -> Vec<String> {
        let mut out = Vec::new();
        let mut next = e.source();
        while let Some(e) = next {
            out.push(e.to_string());
            next = e.source();
        }
        out
    }

    fn declined() -> Declined {
        Declined(std::io::Error::other("gateway said 402"))
    }

    /// A handler error of either disposition.
    #[derive(Debug)]
    struct Gave(crate::Disposition);

    impl crate::HandlerError for Gave {
        fn disposition(&self) -> crate::Disposition {
            self.0.clone()
        }
    }

    #[test]
    fn the_retry_hints_are_on_the_error_itself() {
        let wait = Duration::from_secs(3);
        let hinted: [Error<Gave>; 2] = [Error::InProgress { retry_after: wait }, Error::LeaseLost { retry_after: wait }];
        for e in &hinted {
            assert_eq!((e.retry_after(), e.is_retryable()), (Some(wait), true));
        }
        let down: Error<Gave> = Error::StoreUnavailable("down".into());
        assert_eq!((down.retry_after(), down.is_retryable()), (None, true));
        let transient: Error<Gave> = Error::Handler { error: Gave(crate::Disposition::Transient) };
        assert_eq!((transient.retry_after(), transient.is_retryable()), (None, true));
        let final_answers: [Error<Gave>; 6] = [
            Error::Mismatch,
            Error::Failed { response: None },
            Error::Handler { error: Gave(crate::Disposition::Permanent(None)) },
            Error::Poisoned { error: Gave(crate::Disposition::Transient) },
            Error::ResponseTooLarge { effect_stands: false, key_failed: false },
            Error::Configuration { reason: "bad url".into(), source: None },
        ];
        for e in &final_answers {
            assert_eq!((e.retry_after(), e.is_retryable()), (None, false), "{e:?}");
        }
    }

    #[test]
    fn the_handlers_error_is_the_source_of_handler_poisoned_and_record_failed() {
        let handler = Error::Handler { error: declined() };
        assert_eq!(chain(&handler), ["card declined", "gateway said 402"]);
        assert!(handler.source().and_then(|s| s.downcast_ref::<Declined>()).is_some());
        let poisoned = Error::Poisoned { error: declined() };
        assert_eq!(chain(&poisoned), ["card declined", "gateway said 402"]);
        let failed = Error::RecordFailed { response: serde_json::json!({}), key_completed: true, error: Box::new(Error::Handler { error: declined() }) };
        assert_eq!(chain(&failed), ["handler failed: card declined", "card declined", "gateway said 402"]);
        // A boxed error, an io::Error: their own chains follow.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(declined());
        assert_eq!(chain(&Error::Handler { error: boxed }), ["card declined", "gateway said 402"]);
        assert_eq!(chain(&Error::Handler { error: std::io::Error::other("disk") }), ["disk"]);
        // A message has no source: its text is the error's own.
        let message = Error::Handler { error: String::from("no stock") };
        assert_eq!((message.to_string(), chain(&message).len()), ("handler failed: no stock".to_owned(), 0));
    }

    #[test]
    fn the_other_variants_keep_their_sources() {
        let unavailable: Error = Error::StoreUnavailable(Box::new(std::io::Error::other("reset")));
        assert_eq!(chain(&unavailable), ["reset"]);
        let config: Error = Error::Configuration { reason: "r".into(), source: Some(Box::new(std::io::Error::other("parse"))) };
        assert_eq!(chain(&config), ["parse"]);
        let key: Error = idempotency_core::Key::new("", "u", "k").map(drop).map_err(Error::from).unwrap_err();
        assert!(matches!(key, Error::InvalidKey(_)) && chain(&key).len() == 1, "{key:?}");
        assert!(Error::<Declined>::Mismatch.source().is_none());
    }

    #[cfg(feature = "anyhow")]
    #[test]
    fn an_anyhow_error_is_a_handler_error_and_the_source() {
        use crate::{Disposition, HandlerError};
        let error = anyhow::Error::new(declined()).context("charging order 7");
        assert_eq!((error.disposition(), error.sqlstate(), error.store_unavailable()), (Disposition::Transient, None, false));
        let e = Error::Poisoned { error };
        assert_eq!(chain(&e), ["charging order 7", "card declined", "gateway said 402"]);
    }

    #[cfg(all(feature = "anyhow", feature = "sqlx"))]
    #[test]
    fn a_lost_connection_in_an_anyhow_chain_is_read_as_one() {
        use crate::HandlerError;
        let lost = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(anyhow::Error::new(lost).context("recording the charge").store_unavailable());
        assert!(!anyhow::anyhow!("recording the charge").store_unavailable());
    }

    #[cfg(feature = "eyre")]
    #[test]
    fn an_eyre_report_is_a_handler_error_and_the_source() {
        use crate::{Disposition, HandlerError};
        let error = eyre::Report::new(declined()).wrap_err("charging order 7");
        assert_eq!((error.disposition(), error.sqlstate(), error.store_unavailable()), (Disposition::Transient, None, false));
        let e = Error::Handler { error };
        assert_eq!(chain(&e), ["charging order 7", "card declined", "gateway said 402"]);
    }
}
