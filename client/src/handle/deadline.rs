//! [`Settings::call_timeout`](crate::Settings::call_timeout) around the entry points: a call
//! that has not ended when it passes is dropped and answered [`Error::StoreUnavailable`] with an
//! [`Elapsed`] source. Dropping is the cancellation: a flow's pooled connection dropped
//! mid-request is closed, never given back mid-transaction, so the server rolls back and the
//! key is free again.
//!
//! `run_external`'s outside call is not cut once it started ([`Outside`]): the bound covers the
//! database steps before it, and afresh those after it ended.

use crate::error::Error;
use crate::settings::Elapsed;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// The answer of a call cut by its deadline.
fn elapsed<E>(call: &'static str, limit: Duration) -> Error<E> {
    Error::StoreUnavailable(Box::new(Elapsed::call_timeout(call, limit)))
}

/// `call` within `limit` (none: unbounded).
pub(super) async fn bounded<T, E>(call_name: &'static str, limit: Option<Duration>, call: impl Future<Output = Result<T, Error<E>>>) -> Result<T, Error<E>> {
    match limit {
        None => call.await,
        Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| Err(elapsed(call_name, limit))),
    }
}

/// Where a two-phase call is: before its outside call, inside it, after it.
const BEFORE: u8 = 0;
const INSIDE: u8 = 1;
const AFTER: u8 = 2;

/// Marks the outside call of a two-phase flow, so that [`around_outside`] stops its clock
/// while it runs.
#[derive(Clone, Default)]
pub(super) struct Outside(Arc<AtomicU8>);

impl Outside {
    /// `call`, recording when it starts and ends.
    pub(super) fn wrap<F: Future>(&self, call: F) -> impl Future<Output = F::Output> {
        let phase = self.0.clone();
        async move {
            phase.store(INSIDE, Ordering::SeqCst);
            let out = call.await;
            phase.store(AFTER, Ordering::SeqCst);
            out
        }
    }
}

/// `flow` bounded by `limit` from its start until its outside call starts, unbounded while
/// that runs, and bounded by `limit` again from when it ended.
pub(super) async fn around_outside<T, E, F>(call_name: &'static str, limit: Option<Duration>, outside: Outside, flow: F) -> Result<T, Error<E>>
where
    F: Future<Output = Result<T, Error<E>>>,
{
    let Some(limit) = limit else { return flow.await };
    Phased { call_name, limit, phase: outside.0, seen: BEFORE, flow: Box::pin(flow), clock: Box::pin(tokio::time::sleep(limit)) }.await
}

struct Phased<F> {
    call_name: &'static str,
    limit: Duration,
    phase: Arc<AtomicU8>,
    /// The phase seen after the last poll of `flow`.
    seen: u8,
    flow: Pin<Box<F>>,
    clock: Pin<Box<Sleep>>,
}

impl<T, E, F: Future<Output = Result<T, Error<E>>>> Future for Phased<F> {
    type Output = Result<T, Error<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = this.flow.as_mut().poll(cx) {
            return Poll::Ready(out);
        }
        let now = this.phase.load(Ordering::SeqCst);
        if now != this.seen {
            this.seen = now;
            if now == AFTER {
                this.clock.as_mut().reset(Instant::now() + this.limit);
            }
        }
        if this.seen == INSIDE {
            // The outside call runs: no deadline (the flow wakes this task when it ends).
            return Poll::Pending;
        }
        match this.clock.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(elapsed(this.call_name, this.limit))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flow of `before`, an outside call of `inside`, then `after` (paused time: no real wait).
    async fn two_phase(limit: Duration, before: u64, inside: u64, after: u64) -> Result<(), Error> {
        let outside = Outside::default();
        let call = outside.wrap(tokio::time::sleep(Duration::from_secs(inside)));
        around_outside("run_external", Some(limit), outside, async move {
            tokio::time::sleep(Duration::from_secs(before)).await;
            call.await;
            tokio::time::sleep(Duration::from_secs(after)).await;
            Ok(())
        })
        .await
    }

    fn cut(result: Result<(), Error>) -> Option<Elapsed> {
        match result {
            Err(Error::StoreUnavailable(source)) => source.downcast_ref::<Elapsed>().cloned(),
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_outside_call_is_never_cut_and_each_database_phase_has_the_whole_bound() {
        let limit = Duration::from_secs(10);
        // 9 s before, 100 s outside, 9 s after: within the bound on each side.
        assert!(two_phase(limit, 9, 100, 9).await.is_ok());
        // 11 s before the call, or 11 s after it: cut, naming the setting and the call.
        for (before, after) in [(11, 0), (0, 11)] {
            let e = cut(two_phase(limit, before, 1, after).await).expect("cut by the deadline");
            assert_eq!((e.setting(), e.call(), e.limit()), ("call_timeout", "run_external", limit));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_cuts_at_the_limit_and_not_before() {
        let limit = Duration::from_secs(10);
        let slow = |secs| async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            Ok::<_, Error>(())
        };
        assert!(bounded("run", Some(limit), slow(9)).await.is_ok());
        assert!(bounded("run", None, slow(1000)).await.is_ok());
        let e = cut(bounded("run", Some(limit), slow(11)).await).expect("cut by the deadline");
        assert_eq!(e.to_string(), "run did not end within Settings::call_timeout (10s); it was abandoned");
    }
}
