//! The launcher/worker handshake: how a maintenance worker tells the launcher how its pass ended.
//!
//! The launcher starts one worker at a time and waits for it to exit, so one state word in shared
//! memory is enough: the launcher sets [`Pass::Started`] before it starts a worker, the worker sets
//! the outcome before it exits, and the launcher reads it once the worker has stopped (a worker
//! that died before setting an outcome leaves [`Pass::Started`]). The word exists only when the
//! library is preloaded, as the launcher and its workers do.

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PgAtomic};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

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
}

static STATE: PgAtomic<AtomicU32> = unsafe { PgAtomic::new(c"idempotency maintenance handshake") };

/// Set by [`init`] in the postmaster (inherited by every forked process).
static READY: AtomicBool = AtomicBool::new(false);

/// Reserves the state word. Call from `_PG_init` while preloading only.
#[allow(unexpected_cfgs)] // pg_shmem_init! tests majors this crate does not list
pub(crate) fn init() {
    pg_shmem_init!(STATE);
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
        _ => Pass::Started,
    }
}
