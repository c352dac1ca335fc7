//! The hot path in native code: `idem_reserve`, `idem_complete`, `idem_release` and
//! `idem_heartbeat` as C-language functions (declared in `sql/native.sql`, which replaces the
//! PL/pgSQL versions of `sql/*.sql`; the portable install leaves that file out).
//!
//! - [`catalog`]: what the functions work on (relation OIDs, column numbers, the result type),
//!   resolved once per backend and dropped when PostgreSQL invalidates one of those relations.
//! - [`probe`]: reads one row through a primary-key index (index_beginscan / index_getnext_slot),
//!   no executor: the whole of a replay.
//! - [`pending`]: the write-once flow: a fresh reservation kept in memory until `idem_complete`
//!   inserts its finished record, or the pre-commit callback its PROCESSING record.
//! - [`plans`]: the writes, as SPI plans prepared once per backend and kept (the catalog owns
//!   them; plans know only the schema's name, so the two modules do not import each other).
//! - [`call`]: reading the arguments of a V1 call and building the answers.
//! - [`writable`]: the refusal to write on a standby or in a read-only transaction.
//! - [`legacy`]: after the update from 0.6.0, a key's record moved from the old table first.
//! - [`reserve`], [`finish`]: the functions; [`replay`]: `idem_replay`, the read-only first
//!   step of `idem_reserve` (sql/replay.sql).

use pgrx::pg_sys;

pub(crate) mod call;
pub(crate) mod catalog;
pub(crate) mod finish;
pub(crate) mod legacy;
pub(crate) mod owner;
pub(crate) mod pending;
pub(crate) mod plans;
pub(crate) mod probe;
pub(crate) mod replay;
pub(crate) mod reserve;
pub(crate) mod writable;

/// Whether the backend is exiting: the cached catalog and its plans are then dropped by the
/// thread-local destructors, and nothing is worth freeing.
pub(crate) fn exiting() -> bool {
    // SAFETY: a plain read of a flag PostgreSQL sets when proc_exit starts.
    unsafe { pg_sys::proc_exit_inprogress }
}
