//! The maintenance worker's VACUUM after a sweep.
//!
//! Deleted rows leave dead tuples whose space only VACUUM makes reusable, and autovacuum visits a
//! database at most once per `autovacuum_naptime` (1 min by default). Under churn (records that
//! expire minutes after they are written), the worker sweeps every few seconds and the tables
//! would grow by a minute of traffic between two autovacuums. So at the end of every pass, when
//! the statistics count at least 50 dead rows + 2% of the records table (as `pg_class.reltuples`
//! last counted them; 2%, not autovacuum's 20%: the soak measured both) in the two tables, the
//! worker vacuums both itself: autovacuum's rule with a lower fraction, checked every interval.
//!
//! Counted dead rows, not the rows this pass swept (0.4.0): a VACUUM right after a sweep under
//! traffic cannot remove the rows that transactions running across the sweep's commit may still
//! see (the soak logged VACUUMs during its load that removed none of the rows just swept), and
//! they stay dead until the next VACUUM. With 0.4.0's rule that came only after the next sweep
//! large enough, so the next rows extended the table; the statistics keep counting the rows a
//! VACUUM left (it reports them), so the next pass vacuums again. The pass first reports its own
//! deletes to the statistics, so they are counted (and so that its VACUUM's report, which comes
//! after them, is the count that stays).
//!
//! The VACUUM is `SKIP_LOCKED`: a table an autovacuum is already working on is skipped, and its
//! dead rows, still counted, bring the next pass's VACUUM.
//!
//! Backing off (0.6.0): a VACUUM removes only rows deleted before the xmin horizon (the oldest
//! snapshot any session, replication slot or prepared transaction still holds). When a
//! long transaction pins that horizon, the rows a VACUUM leaves stay counted, and 0.5.0
//! vacuumed both tables again on every pass, scanning them for nothing. Now a VACUUM that leaves
//! dead rows is remembered with the horizon it ran under ([`Vacuumed`], kept per database by the
//! launcher), and the next passes vacuum only once the horizon has moved: until then neither the
//! rows left nor any row deleted since (by newer transactions) can be removed ([`due`]).

use crate::worker::handshake::{self, Vacuumed};
use pgrx::prelude::*;
use std::ffi::CString;
use std::time::Instant;

/// The dead rows at which the worker vacuums.
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

/// The dead rows of both tables as the statistics count them (right after a VACUUM: the rows it
/// found dead but could not remove because a snapshot may still see them).
fn dead(schema: &str) -> i64 {
    let (records, retries) = (format!("{schema}.idem_records"), format!("{schema}.idem_retries"));
    pgrx::bgworkers::BackgroundWorker::transaction(|| {
        Spi::get_one_with_args::<i64>(
            "SELECT pg_catalog.pg_stat_get_dead_tuples(pg_catalog.to_regclass($1))
                    OPERATOR(pg_catalog.+) pg_catalog.pg_stat_get_dead_tuples(pg_catalog.to_regclass($2))",
            &[records.as_str().into(), retries.as_str().into()],
        )
    })
    .ok()
    .flatten()
    .unwrap_or(-1)
}

/// The xmin horizon of the records table: rows deleted by transactions at or after it cannot
/// be removed yet. `None` if the table cannot be found.
fn horizon(schema: &str) -> Option<u32> {
    let table = format!("{schema}.idem_records");
    pgrx::bgworkers::BackgroundWorker::transaction(|| {
        let oid = Spi::get_one_with_args::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
            &[table.as_str().into()],
        )
        .ok()
        .flatten()?;
        // SAFETY: opens an existing table (found just now, in this transaction) to compute the
        // horizon that applies to it, and closes it.
        unsafe {
            let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
            let rel = pg_sys::try_table_open(oid, lock);
            if rel.is_null() {
                return None;
            }
            let horizon = pg_sys::GetOldestNonRemovableTransactionId(rel);
            pg_sys::table_close(rel, lock);
            Some(horizon.into_inner())
        }
    })
}

/// Whether a VACUUM is due, with `dead` rows counted against `threshold` and `last` the VACUUM
/// before it, when that one left rows: not while the xmin horizon stays where that VACUUM ran
/// (nothing it left, nor anything deleted since, could be removed).
pub(crate) fn due(dead: i64, threshold: f64, last: Option<Vacuumed>, horizon: Option<u32>) -> bool {
    if dead <= 0 || (dead as f64) < threshold {
        return false;
    }
    !matches!((last, horizon), (Some(last), Some(now)) if last.horizon == now)
}

/// At the end of a pass in database `db` (extension schema `schema`, quoted) whose sweep deleted
/// `swept` rows: VACUUM the two tables when they hold enough dead rows, and log it.
pub(crate) fn after_sweep(db: &str, schema: &str, swept: i64) {
    // SAFETY: between transactions, as a backend reports when it goes idle.
    let _ = unsafe { pg_sys::pgstat_report_stat(true) };
    let before = dead(schema);
    // The horizon before the VACUUM: the one it runs under, or an older one.
    let horizon = horizon(schema);
    if !due(before, threshold(schema), handshake::vacuumed(), horizon) {
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
    let left = dead(schema);
    // Rows left: the next VACUUM waits for the horizon to move.
    handshake::set_vacuumed(match horizon {
        Some(horizon) if left > 0 => Some(Vacuumed { horizon, left: u32::try_from(left).unwrap_or(u32::MAX) }),
        _ => None,
    });
    log!(
        "idempotency maintenance in database \"{db}\": vacuumed idem_records and idem_retries after sweeping {swept} rows ({before} dead rows counted, {left} left not yet removable{}), {:.3} s",
        if left > 0 { ": the next VACUUM waits for the xmin horizon to move" } else { "" },
        started.elapsed().as_secs_f64()
    );
}
