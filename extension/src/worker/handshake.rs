//! The launcher/worker handshake: how a maintenance worker tells the launcher how its pass ended.
//!
//! The launcher starts one worker at a time and waits for it to exit, so one state word in shared
//! memory is enough: the launcher sets [`Pass::Started`] before it starts a worker, the worker sets
//! the outcome before it exits, and the launcher reads it once the worker has stopped (a worker
//! that died before setting an outcome leaves [`Pass::Started`]). The word exists only when the
//! library is preloaded, as the launcher and its workers do.
//!
//! Two more things cross between them the same way: the end of the recovery grace after a
//! promotion ([`begin_grace`], [`grace_until`]: set once by the launcher, read by every worker),
//! and what the last VACUUM of the worker's database left ([`Vacuumed`]: the launcher keeps it
//! per database in its own memory and hands it to the database's next worker).

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

/// How a worker's pass ended, as the launcher reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Set by the launcher before starting a worker; still there if the worker died early.
    Started = 0,
    /// The worker ran recovery and sweep in its database.
    Done = 1,
    /// The database has no idempotency extension.
    NoExtension = 2,
    /// The server is in recovery (a standby): nothing may be written, the worker did nothing.
    InRecovery = 3,
    /// As `Done`, but the pass stopped at its bound with work left: the launcher comes back to
    /// the database once it has visited the others, without waiting for the interval.
    Unfinished = 4,
}

static STATE: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"idempotency maintenance handshake") };
/// When the recovery grace after a promotion ends (a TimestampTz; 0: no grace).
static GRACE: PgAtomic<AtomicI64> = unsafe { PgAtomic::new(c"idempotency maintenance grace") };
/// [`Vacuumed`] of the database of the running worker: the xmin horizon (low 32 bits) and the
/// dead rows left (high 32 bits, saturated), or [`NOTHING_LEFT`].
static VACUUMED: PgAtomic<AtomicU64> = unsafe { PgAtomic::new(c"idempotency maintenance vacuumed") };
const NOTHING_LEFT: u64 = 0;

/// Set by [`init`] in the postmaster (inherited by every forked process).
static READY: AtomicBool = AtomicBool::new(false);

/// Reserves the state word. Call from `_PG_init` while preloading only.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests majors this crate does not list
pub(crate) fn init() {
    pg_shmem_init!(STATE);
    pg_shmem_init!(GRACE);
    pg_shmem_init!(VACUUMED);
    READY.store(true, Ordering::Relaxed);
}

/// Records `pass` (a no-op without the shared word).
pub(crate) fn set(pass: Pass) {
    if READY.load(Ordering::Relaxed) {
        STATE.get().store(pass as u32, Ordering::SeqCst);
    }
}

/// The last recorded state ([`Pass::Done`] without the shared word).
pub(crate) fn get() -> Pass {
    if !READY.load(Ordering::Relaxed) {
        return Pass::Done;
    }
    match STATE.get().load(Ordering::SeqCst) {
        1 => Pass::Done,
        2 => Pass::NoExtension,
        3 => Pass::InRecovery,
        4 => Pass::Unfinished,
        _ => Pass::Started,
    }
}

/// Starts the recovery grace, ending at `until`, unless one was started before (a launcher
/// restarted after the promotion keeps the first one); true if this call started it.
pub(crate) fn begin_grace(until: pg_sys::TimestampTz) -> bool {
    READY.load(Ordering::Relaxed) && GRACE.get().compare_exchange(0, until.max(1), Ordering::SeqCst, Ordering::SeqCst).is_ok()
}

/// When the recovery grace ends (0: none was started).
pub(crate) fn grace_until() -> pg_sys::TimestampTz {
    if READY.load(Ordering::Relaxed) {
        GRACE.get().load(Ordering::SeqCst)
    } else {
        0
    }
}

/// A VACUUM of the worker's tables that left dead rows it could not remove: the xmin horizon it
/// ran under and the dead rows it left. Until the horizon moves, no later VACUUM can remove
/// those rows, nor any row deleted since (deleted by newer transactions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Vacuumed {
    pub(crate) horizon: u32,
    pub(crate) left: u32,
}

/// Hands the database's last [`Vacuumed`] to its next worker (the launcher, before starting it).
pub(crate) fn set_vacuumed(v: Option<Vacuumed>) {
    if READY.load(Ordering::Relaxed) {
        let word = v.map_or(NOTHING_LEFT, |v| (u64::from(v.left.max(1)) << 32) | u64::from(v.horizon));
        VACUUMED.get().store(word, Ordering::SeqCst);
    }
}

/// The database's last [`Vacuumed`] (the worker, and the launcher once the worker has exited).
pub(crate) fn vacuumed() -> Option<Vacuumed> {
    if !READY.load(Ordering::Relaxed) {
        return None;
    }
    let word = VACUUMED.get().load(Ordering::SeqCst);
    (word != NOTHING_LEFT).then_some(Vacuumed { horizon: word as u32, left: (word >> 32) as u32 })
}
