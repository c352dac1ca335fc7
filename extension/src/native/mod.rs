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
//! - [`plans`]: the writes, as SPI plans prepared once per backend and kept.
//! - [`call`]: reading the arguments of a V1 call and building the answers.
//! - [`reserve`], [`finish`]: the functions.

pub(crate) mod call;
pub(crate) mod catalog;
pub(crate) mod finish;
pub(crate) mod pending;
pub(crate) mod plans;
pub(crate) mod probe;
pub(crate) mod reserve;
