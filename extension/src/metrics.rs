//! Counters of what the extension decided, since the server started: atomics in shared memory,
//! so counting never writes a table. They exist only when the library is in
//! `shared_preload_libraries` (shared memory is reserved at server start); otherwise counting is a
//! no-op and `idem_metrics()` raises rather than show zeros that look real.

use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::panic::ErrorReport;
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Every counter, in the order `idem_metrics()` returns them. The SQL functions name them in
/// `_idem_count(event)`; docs/operations.md explains each.
pub(crate) const EVENTS: [&str; 14] = [
    "reservations_created",
    "reservations_replay",
    "reservations_in_progress",
    "reservations_mismatch",
    "reservations_failed",
    "reservations_resume",
    "completions_success",
    "completions_failed",
    "releases",
    "poisonings",
    "stale_tokens",
    "recovered",
    "swept",
    "worker_passes",
];

#[derive(Default)]
pub(crate) struct Shared {
    counters: [AtomicU64; EVENTS.len()],
}

// SAFETY: atomics only; no pointers into process-local memory.
unsafe impl PGRXSharedMemory for Shared {}

static SHARED: PgAtomic<Shared> = unsafe { PgAtomic::new(c"idempotency shared state") };

/// Set in the postmaster's `_PG_init` when preloading (inherited by every forked process), so a
/// session that loaded the library later knows there is no shared memory behind `SHARED`.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Reserves the shared memory. Call from `_PG_init` while preloading only.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests majors this crate does not list
pub(crate) fn init() {
    pg_shmem_init!(SHARED);
    PRELOADED.store(true, Ordering::Relaxed);
}

fn shared() -> Option<&'static Shared> {
    PRELOADED.load(Ordering::Relaxed).then(|| SHARED.get())
}

fn index_of(event: &str) -> usize {
    match EVENTS.iter().position(|e| *e == event) {
        Some(i) => i,
        None => crate::args::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("event must be one of {}, got {event:?}", EVENTS.join(", ")),
        ),
    }
}

/// Adds `n` to a counter; a no-op (but the name is still checked) without shared memory.
pub(crate) fn add(event: &str, n: u64) -> Option<u64> {
    let i = index_of(event);
    shared().map(|s| s.counters[i].fetch_add(n, Ordering::Relaxed) + n)
}

/// `_idem_count(event text, n bigint) RETURNS boolean`: adds `n` to the counter `event`; true
/// when counted, false (nothing counted) when the library is not preloaded. Declared STABLE: it
/// changes no database state and answers the same for the same arguments, so PL/pgSQL evaluates
/// the assignment that calls it as a simple expression without taking a new snapshot.
#[pg_extern(sql = false)]
fn _idem_count(event: Option<&[u8]>, n: Option<i64>) -> Option<bool> {
    // STRICT, but total: a NULL argument is a NULL answer, as STRICT makes it.
    let (event, n) = (event?, n?);
    Some(add(crate::encoding::utf8("event", event), u64::try_from(n).unwrap_or(0)).is_some())
}

/// `idem_metrics() RETURNS TABLE (name text, value bigint)`: every counter since the server
/// started (or last restarted after a crash).
#[pg_extern(sql = false)]
fn idem_metrics() -> TableIterator<'static, (name!(name, String), name!(value, i64))> {
    let Some(s) = shared() else {
        ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "idem_metrics() needs the idempotency library preloaded: its counters live in shared memory reserved at server start",
            "idem_metrics",
        )
        .set_hint("Add idempotency to shared_preload_libraries in postgresql.conf and restart the server.")
        .report(PgLogLevel::ERROR);
        unreachable!("an ERROR does not return");
    };
    let rows: Vec<(String, i64)> = EVENTS
        .iter()
        .zip(s.counters.iter())
        .map(|(name, c)| (name.to_string(), i64::try_from(c.load(Ordering::Relaxed)).unwrap_or(i64::MAX)))
        .collect();
    TableIterator::new(rows)
}
