//! Private servers of any major: [`idempotency_pgserver`], the one place that creates and drives
//! a cluster, re-exported here with [`eventually`] for the tests' awaited conditions.

pub use idempotency_pgserver::*;

use std::time::{Duration, Instant};

/// Waits until `check` answers `Ok`, trying every 200 ms for at most `deadline`; panics with
/// `what` and the last thing `check` saw (its `Err`) when the deadline passes.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) if start.elapsed() >= deadline => {
                panic!("{what}: not reached within {} s; last seen: {seen}", deadline.as_secs())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
