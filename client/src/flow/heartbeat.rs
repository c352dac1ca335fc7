//! The background heartbeat of the two-phase flow; stops when dropped.

use super::calls;
use crate::driver::Driver;
use crate::types::Token;
use crate::sql::Schema;
use idempotency_core::Key;
use std::time::Duration;

/// Extends the lease a third of it apart until dropped or the key is lost.
pub(crate) struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    pub(crate) fn start<D: Driver>(driver: D, schema: Schema, key: Key, token: Token, lease: Duration) -> Self {
        let every = (lease / 3).max(Duration::from_millis(10));
        Heartbeat(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                // The key is lost: stop; the final complete is fenced and will say so. A failed
                // beat (an error) is retried a third of a lease later, before the lease ends.
                if let Ok(false) = calls::heartbeat(&driver, &schema, &key, token, lease).await {
                    return;
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
