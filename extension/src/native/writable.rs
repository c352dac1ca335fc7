//! Where a native function refuses to write: a server in recovery (a hot standby) or a read-only
//! transaction. The check is one flag ([`pg_sys::XactReadOnly`]: PostgreSQL sets it for every
//! transaction of a standby, and for `READ ONLY` transactions on a primary); only when it is set
//! does the call go to `_idem_require_writable` (sql/internal.sql), which raises 25006 with the
//! message and hint of the PL/pgSQL functions, so the text has one source.

use super::catalog::Catalog;
use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys;
use pgrx::spi::Spi;

/// Returns when the calling transaction may write; raises 25006 naming `action` (as
/// "cannot `action` on a server in recovery") otherwise.
pub(crate) fn require(catalog: &Catalog, action: &str) {
    // SAFETY: a plain read of a flag of the current transaction.
    if !unsafe { pg_sys::XactReadOnly } {
        return;
    }
    let sql = format!("SELECT {}._idem_require_writable($1)", catalog.plans.schema_sql());
    // A read-only SPI call (select): pgrx's other calls (Spi::run, Spi::get_one, ...) assign a
    // transaction ID first, which a standby refuses before the helper could explain.
    let checked = Spi::connect(|client| client.select(sql.as_str(), Some(1), &[action.into()])?.first().get_one::<bool>());
    if let Err(e) = checked {
        raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("checking whether the transaction may write failed: {e}"));
    }
    // Read-only by a rule the helper does not know: refuse anyway, with PostgreSQL's own wording.
    raise(PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION, format!("idempotency: cannot {action} in a read-only transaction"));
}
