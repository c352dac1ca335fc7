//! The records kept from 0.6.0 (docs/record-layout.md, "The update from 0.6.0"): the update
//! renames 0.6.0's table to `idem_records_060` and creates the new `idem_records` empty; each
//! key's old row moves when a call reaches the key, by sql/internal.sql's `_idem_adopt` (the one
//! conversion rule, in SQL), and the rest in batches (`idem_move_records`), until the old table
//! is dropped.
//!
//! The native functions call `_idem_adopt` only while the old table exists: a syscache lookup
//! of its name per call, never a flag kept by the backend (the table is dropped while backends
//! run). A lookup that still sees a table dropped meanwhile costs one SPI call, which answers as
//! if it were gone (`_idem_adopt` catches `undefined_table`).

use super::call::Text;
use super::catalog::Catalog;
use super::plans::{self, Stmt};
use super::probe::Scope;
use pgrx::pg_sys::{self, Datum};

/// Whether `idem_records_060` exists in the extension's schema (only on the compact layout: an
/// older schema running this library has no such table).
fn exists(catalog: &Catalog) -> bool {
    // SAFETY: a syscache lookup of a constant name in a namespace; InvalidOid when absent.
    catalog.rec.compact.is_some() && unsafe { pg_sys::get_relname_relid(c"idem_records_060".as_ptr(), catalog.schema) } != pg_sys::InvalidOid
}

/// What [`adopt`] found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Adopted {
    /// No old table: nothing to do, nothing to read again.
    None,
    /// The key has nothing left in the old table (its row, if any, moved and committed, by this
    /// call or by the transaction it waited for): read the key again, under a new snapshot.
    Moved,
    /// `wait` was false and another transaction holds the key's old row: busy.
    Busy,
}

/// Moves the key's record from `idem_records_060` into `idem_records` (waiting for a transaction
/// that holds its old row if `wait`), before the caller reads or writes the key.
pub(crate) fn adopt(catalog: &Catalog, operation: Text<'_>, user_id: Text<'_>, key: Text<'_>, wait: bool) -> Adopted {
    if !exists(catalog) {
        return Adopted::None;
    }
    let params = [Some(operation.datum), Some(user_id.datum), Some(key.datum), Some(Datum::from(wait))];
    let answer = plans::connected(|| {
        plans::execute(&catalog.plans, Stmt::Adopt, &params);
        plans::first_row(1).map(|d| d.value() != 0)
    });
    match answer {
        None => Adopted::None,
        Some(true) => Adopted::Moved,
        Some(false) => Adopted::Busy,
    }
}

/// [`adopt`] for a key's scope.
pub(crate) fn adopt_scope(catalog: &Catalog, scope: &Scope<'_>, wait: bool) -> Adopted {
    adopt(catalog, scope.operation, scope.user_id, scope.key, wait)
}
