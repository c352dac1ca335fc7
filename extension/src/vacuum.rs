//! The maintenance worker's VACUUM after a large sweep.
//!
//! Deleted rows leave dead tuples whose space only VACUUM makes reusable, and autovacuum visits a
//! database at most once per `autovacuum_naptime` (1 min by default). Under churn (records that
//! expire minutes after they are written), the worker sweeps every few seconds and the tables
//! would grow by a minute of traffic between two autovacuums. So, after a pass whose sweep
//! deleted at least 50 rows + 2% of the records table (as `pg_class.reltuples` last counted
//! them; 2%, not autovacuum's 20%: the soak measured both), the worker vacuums both tables
//! itself, `SKIP_LOCKED` (an autovacuum already at work is left to it). A large table swept a
//! little at a time is left to autovacuum. Measured by the benchmark's soak
//! (docs/performance.md, "Churn without bloat").

use pgrx::prelude::*;
use std::ffi::CString;
use std::time::Instant;

/// The rows a sweep must delete before the worker vacuums.
fn threshold(schema: &str) -> f64 {
    let table = format!("{schema}.idem_records");
    pgrx::bgworkers::BackgroundWorker::transaction(|| {
        Spi::get_one_with_args::<f64>(
            "SELECT 50 + 0.02 * GREATEST(c.reltuples, 0)::pg_catalog.float8
               FROM pg_catalog.pg_class AS c WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1)",
            &[table.as_str().into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(f64::MAX)
}

/// After a pass in database `db` (extension schema `schema`, quoted) whose sweep deleted `swept`
/// rows: VACUUM the two tables when that is enough rows, and log it.
pub(crate) fn after_sweep(db: &str, schema: &str, swept: i64) {
    if swept <= 0 || (swept as f64) < threshold(schema) {
        return;
    }
    let started = Instant::now();
    let Ok(sql) = CString::new(format!("VACUUM (SKIP_LOCKED) {schema}.idem_records, {schema}.idem_retries")) else {
        return;
    };
    // SAFETY: VACUUM runs as a top-level statement does in a backend: from a started transaction
    // that is no transaction block, which vacuum() commits and restarts itself (one transaction
    // per table). The parse tree of this fixed text is one VacuumStmt.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        let raw = pg_sys::raw_parser(sql.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_DEFAULT);
        let stmt = pgrx::PgList::<pg_sys::RawStmt>::from_pg(raw).get_ptr(0);
        if let Some(stmt) = stmt {
            let pstate = pg_sys::make_parsestate(std::ptr::null_mut());
            (*pstate).p_sourcetext = sql.as_ptr();
            pg_sys::ExecVacuum(pstate, (*stmt).stmt.cast::<pg_sys::VacuumStmt>(), true);
        }
        pg_sys::CommitTransactionCommand();
    }
    log!(
        "idempotency maintenance in database \"{db}\": vacuumed idem_records and idem_retries after sweeping {swept} rows, {:.3} s",
        started.elapsed().as_secs_f64()
    );
}
