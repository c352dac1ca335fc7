//! The wait for a key's holder ([`Settings::wait`](crate::Settings::wait)), shared by the
//! flows, bounded by [`Settings::wait_timeout`](crate::Settings::wait_timeout):
//!
//! - **A committed holder** (a two-phase attempt's `PROCESSING` record while its outside call
//!   runs, answered `in_progress`) is polled: the call reserves again after a pause, until
//!   another answer or the bound. Each poll is the flow's own reservation, one round trip on a
//!   connection taken from the pool and given back; between polls the call holds nothing (no
//!   connection, no transaction, no snapshot, no lock), and the holder pays nothing: a poll
//!   reads its committed record and locks nothing. The pauses: [`FIRST`], doubling up to
//!   [`CAP`], half of each random (so duplicates that arrived together spread out), the last
//!   one cut to end at the bound, where one last poll answers. Polling, not `LISTEN`/`NOTIFY`
//!   nor a wait inside the server, by measurement: docs/performance.md, "Waiting for a holder".
//! - **An uncommitted holder** (another transaction's reservation) is waited for in the server,
//!   as before 0.7.0 (`idem_reserve(wait => true)`: a connection and, in `run`, its transaction
//!   held, blocked on the key's lock, woken the moment the holder ends), within the same bound
//!   ([`Waiting::within`]): at the bound `run` gives its reservation up as a dropped call does
//!   (its connection closed, not pooled), and `run_external` stops waiting for its
//!   reservation's task, which goes on until the holder ends and releases a key it then creates
//!   (one transient failure counted, never poisoned), as for a dropped call; both answer
//!   `InProgress`. `run_statement`, whose one statement also runs the write, which the bound
//!   must not cut, and `run_batch` are bounded there by `call_timeout` only.

use crate::error::Error;
use crate::settings::Settings;
use std::time::Duration;
use tokio::time::Instant;

/// The pause before the first poll.
pub(crate) const FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two polls: a replay reaches a waiter at most this long after its
/// holder completed (plus a round trip).
pub(crate) const CAP: Duration = Duration::from_millis(250);

/// One call's wait: its bound, and the next pause.
pub(crate) struct Waiting {
    /// How long the call may wait; `None`: it does not wait (`Settings::wait` is off).
    bound: Option<Duration>,
    /// When the call stops waiting: set by its first reservation that may wait (so the time
    /// it took to get a connection does not count).
    deadline: Option<Instant>,
    next: Duration,
}

impl Waiting {
    /// The wait of a call.
    pub(crate) fn start(settings: &Settings) -> Self {
        Waiting { bound: settings.wait.then_some(settings.wait_timeout), deadline: None, next: FIRST }
    }

    /// When the call stops waiting (from the first time it is asked), or `None`: it does not
    /// wait.
    fn deadline(&mut self) -> Option<Instant> {
        let bound = self.bound?;
        Some(*self.deadline.get_or_insert_with(|| Instant::now() + bound))
    }

    /// The pause before the next poll, or `None` when the call answers now: it does not wait,
    /// or its bound has passed.
    pub(crate) fn pause(&mut self) -> Option<Duration> {
        let left = self.deadline()?.checked_duration_since(Instant::now()).filter(|left| !left.is_zero())?;
        let pause = jittered(self.next.min(CAP));
        self.next = (self.next * 2).min(CAP);
        Some(pause.min(left))
    }

    /// `request` (a reservation that may wait in the server), given up at the wait's bound:
    /// `None` then, the request dropped (its connection guard closes the connection). Without a
    /// wait, `request` unbounded.
    pub(crate) async fn within<F: std::future::Future>(&mut self, request: F) -> Option<F::Output> {
        match self.deadline() {
            Some(deadline) => tokio::time::timeout_at(deadline, request).await.ok(),
            None => Some(request.await),
        }
    }

    /// The pause before the next poll after `result`, when it is the key in progress and the
    /// call still waits; `None`: `result` is the answer.
    pub(crate) fn after<T, E>(&mut self, result: &Result<T, Error<E>>) -> Option<Duration> {
        match result {
            Err(Error::InProgress { .. }) => self.pause(),
            _ => None,
        }
    }
}

/// Half of `pause`, plus a random part of the other half.
fn jittered(pause: Duration) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let half = pause / 2;
    half + half.mul_f64(f64::from(nanos % 1000) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::{Waiting, CAP, FIRST};
    use crate::Settings;
    use std::time::Duration;

    #[test]
    fn a_call_that_does_not_wait_never_pauses() {
        let mut waiting = Waiting::start(&Settings::default());
        assert_eq!(waiting.pause(), None);
    }

    #[test]
    fn pauses_double_up_to_the_cap_half_of_each_random() {
        let mut waiting = Waiting::start(&Settings::builder().wait(true).wait_timeout(Duration::from_secs(3600)).build());
        let mut bound = FIRST;
        for _ in 0..10 {
            let pause = waiting.pause().expect("the bound is an hour away");
            assert!(pause >= bound / 2 && pause <= bound, "{pause:?} outside [{:?}, {bound:?}]", bound / 2);
            bound = (bound * 2).min(CAP);
        }
        assert_eq!(bound, CAP);
    }
}
