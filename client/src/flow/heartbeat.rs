//! The background heartbeat of the two-phase flow; stops when dropped.
//!
//! A beat the server refuses is never swallowed: it is traced at error level (feature
//! `tracing`; the key itself is never recorded) and ends the task, since every later beat would
//! be refused alike (a lease past the record's ceiling, a role that may not act on the key, an
//! install without the function). The lease then lapses while the outside call runs on (it cannot
//! be stopped): if recovery or another attempt takes the key meanwhile, the flow's final
//! completion is fenced and `run_external` answers [`crate::Error::LeaseLost`]; if nobody did,
//! the completion still holds the token and records the call's result. A beat that could not
//! reach the store (or met a serialization failure or deadlock) is traced at warn level and tried
//! again a third of a lease later, before the lease ends.

use super::{calls, conflict};
use crate::driver::Driver;
use crate::error::Error;
use crate::sql::Schema;
use crate::types::Token;
use idempotency_core::Key;
use std::time::Duration;

/// Extends the lease a third of it apart until dropped, the key is lost or a beat is refused.
pub(crate) struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    pub(crate) fn start<D: Driver>(driver: D, schema: Schema, key: Key, token: Token, lease: Duration) -> Self {
        let every = (lease / 3).max(Duration::from_millis(10));
        Heartbeat(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match calls::heartbeat(&driver, &schema, &key, token, lease).await {
                    Ok(true) => {}
                    // The key is lost (recovered or taken over): stop; the final completion is
                    // fenced and says so.
                    Ok(false) => {
                        lost(&key);
                        return;
                    }
                    Err(error) if matches!(error, Error::StoreUnavailable(_)) || conflict(&error) => unreachable_store(&key, &error),
                    Err(error) => {
                        refused(&key, &error);
                        return;
                    }
                }
            }
        }))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(feature = "tracing")]
fn lost(key: &Key) {
    tracing::warn!(operation = key.operation(), "the two-phase attempt lost its key (recovered or taken over); heartbeats stop");
}

#[cfg(feature = "tracing")]
fn unreachable_store(key: &Key, error: &Error) {
    tracing::warn!(operation = key.operation(), error = %error, "a two-phase heartbeat failed; tried again a third of a lease later");
}

#[cfg(feature = "tracing")]
fn refused(key: &Key, error: &Error) {
    let cause = std::error::Error::source(error).map(ToString::to_string).unwrap_or_default();
    tracing::error!(
        operation = key.operation(),
        sqlstate = error.sqlstate().unwrap_or_default(),
        error = %error,
        cause = cause.as_str(),
        "a two-phase heartbeat was refused; heartbeats stop and the lease will lapse while the outside call runs"
    );
}

#[cfg(not(feature = "tracing"))]
fn lost(_key: &Key) {}

#[cfg(not(feature = "tracing"))]
fn unreachable_store(_key: &Key, _error: &Error) {}

#[cfg(not(feature = "tracing"))]
fn refused(_key: &Key, _error: &Error) {}
