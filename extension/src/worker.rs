//! Scheduled maintenance: `idem_recover_stuck` and `idem_sweep` in every database listed in
//! `idempotency.maintenance_databases`, every `idempotency.maintenance_interval` (and first,
//! after the update from 0.6.0 and until it is over, `idem_move_records`).
//!
//! A PostgreSQL process connects to one database for its whole life, so one process cannot visit
//! a list of them. As pg_partman's worker does, a static *launcher* (registered when the library
//! is preloaded, connected to no database) wakes every interval and, for each listed database in
//! turn, starts a short-lived dynamic *worker* connected to it, then waits for it to finish. The
//! worker runs both functions batch after batch, each batch its own transaction, until a batch
//! comes back less than full or [`PASS_BATCHES`] batches of either have run, logs a one-line
//! summary when it did work, and exits. A pass stopped at that bound is unfinished: once every
//! listed database has had its pass, the launcher starts another round at once for the
//! unfinished ones, so a backlog in one database never holds back the others' maintenance.
//!
//! Chosen over one long-lived worker per database because a settings reload then needs no
//! bookkeeping of running workers (the next pass reads the new list), the databases are served one
//! at a time (one worker slot, never a burst of processes), and a worker's error ends only its pass.
//!
//! The launcher rereads the settings on SIGHUP; on SIGTERM it stops its running worker and exits
//! with code 1, so the postmaster restarts it after `RESTART` unless the server is shutting down
//! (`pg_terminate_backend` on the launcher is a restart, not a way to disable it: use
//! `idempotency.maintenance_interval = 0`).
//!
//! On a standby the launcher does not run: it is registered to start once recovery has finished
//! (`BgWorkerStart_RecoveryFinished`), so the postmaster starts it at promotion, and its first pass
//! runs on the new primary at once. A worker also checks for recovery itself before writing
//! ([`handshake::Pass::InRecovery`]). After a promotion, `idem_recover_stuck` waits one lease
//! (`idempotency.lease`, the server's setting) from the launcher's start: two-phase attempts
//! whose heartbeats could not reach any primary during the failover get one lease to heartbeat
//! on the new one before their records are recovered (the sweep runs at once).
//!
//! [`handshake`] is how a worker tells the launcher how its pass ended.

pub(crate) mod handshake;

use crate::guc::Maintenance;
use crate::metrics;
use handshake::Pass;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BackgroundWorkerStatus, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

/// How long the postmaster waits before restarting a launcher that exited.
const RESTART: Duration = Duration::from_secs(5);
const WORKER_TYPE: &str = "idempotency maintenance";
/// The most transactions of each function (recovery, sweep) one pass runs in one database.
const PASS_BATCHES: i64 = 100;

/// Reserves the handshake's shared memory and registers the launcher. Call from `_PG_init` while
/// preloading only.
pub(crate) fn register() {
    handshake::init();
    BackgroundWorkerBuilder::new("idempotency maintenance launcher")
        .set_type("idempotency maintenance launcher")
        .set_library("idempotency")
        .set_function("_idem_launcher_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(RESTART))
        .load();
}

fn shutdown_requested() -> bool {
    // Set by pgrx's SIGTERM handler; never reset.
    unsafe { pg_sys::ShutdownRequestPending != 0 }
}

/// Waits on the process latch (signals and worker notifications set it) for at most `timeout`.
fn wait(timeout: Option<Duration>) {
    let mut events = pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH;
    let mut ms: std::ffi::c_long = -1;
    if let Some(t) = timeout {
        events |= pg_sys::WL_TIMEOUT;
        ms = t.as_millis().try_into().unwrap_or(std::ffi::c_long::MAX);
    }
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events as i32, ms, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}

/// Rereads postgresql.conf if a SIGHUP arrived.
fn reload_if_requested() -> bool {
    unsafe {
        if pg_sys::ConfigReloadPending == 0 {
            return false;
        }
        pg_sys::ConfigReloadPending = 0;
        pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
    }
    true
}

fn describe(s: &Maintenance) -> String {
    match (s.interval, s.databases.is_empty()) {
        (None, _) => "disabled (idempotency.maintenance_interval = 0)".to_string(),
        (Some(_), true) => "no database configured (idempotency.maintenance_databases is empty); idle".to_string(),
        (Some(i), false) => format!(
            "databases {}, every {} s, batch size {}, recover action {}",
            s.databases.join(", "),
            i.as_secs(),
            s.batch_size,
            s.action.as_str()
        ),
    }
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn _idem_launcher_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // No database: the launcher only reads the shared catalog pg_database.
    BackgroundWorker::connect_worker_to_spi(None, None);

    let mut settings = Maintenance::current();
    log!("idempotency maintenance launcher started: {}", describe(&settings));
    begin_grace_if_promoted();
    // What the last VACUUM of each database left (vacuum.rs), handed to its next worker.
    let mut vacuumed: HashMap<String, handshake::Vacuumed> = HashMap::new();
    // Conditions already logged, so each is logged once, not every interval.
    let mut logged: HashSet<String> = HashSet::new();
    // When the last pass started: the next is due one interval later. Signals and worker
    // notifications wake the latch early; only a due pass runs.
    let mut last_start: Option<Instant> = None;
    loop {
        if shutdown_requested() {
            log!("idempotency maintenance launcher shutting down");
            // Exit code 1: the postmaster restarts us after RESTART, unless the server is stopping.
            unsafe { pg_sys::proc_exit(1) };
        }
        if reload_if_requested() {
            let new = Maintenance::current();
            if new != settings {
                log!("idempotency maintenance settings reloaded: {}", describe(&new));
                settings = new;
            }
        }
        let due = match (settings.interval, settings.databases.is_empty()) {
            (Some(interval), false) => Some(last_start.map_or_else(Instant::now, |s| s + interval)),
            _ => None, // disabled or nothing to do: sleep until a signal
        };
        match due {
            Some(due) if Instant::now() >= due => {
                last_start = Some(Instant::now());
                // Rounds: every database once, then again at once those whose pass stopped at
                // its bound, until none is left (or a signal asks for attention).
                let mut round = settings.databases.clone();
                while !round.is_empty() {
                    let mut unfinished = Vec::new();
                    for db in &round {
                        if shutdown_requested() {
                            break;
                        }
                        if run_pass(db, &mut logged, &mut vacuumed) {
                            unfinished.push(db.clone());
                        }
                    }
                    // SAFETY: reads a flag set by the SIGHUP handler.
                    if shutdown_requested() || unsafe { pg_sys::ConfigReloadPending != 0 } {
                        break;
                    }
                    round = unfinished;
                }
            }
            _ => wait(due.map(|d| d.saturating_duration_since(Instant::now()))),
        }
    }
}

/// After a promotion (this server was a standby), starts the recovery grace of one lease: the
/// launcher starts as soon as recovery has finished, so now is when the promotion took effect.
fn begin_grace_if_promoted() {
    // SAFETY: reads the shared recovery state (a flag set when promotion was triggered, kept
    // for the life of the server).
    if !unsafe { pg_sys::PromoteIsTriggered() } {
        return;
    }
    let lease = crate::guc::LEASE.value.get().max(0);
    // SAFETY: reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    if handshake::begin_grace(now + i64::from(lease) * 1_000_000) {
        log!(
            "idempotency maintenance: the server was promoted; idem_recover_stuck waits one lease ({lease} s, idempotency.lease) so that two-phase attempts cut off by the failover can heartbeat on this server first"
        );
    }
}

/// The OID of database `db` and whether it allows connections, read with a heap scan of
/// pg_database as the autovacuum launcher does: a process connected to no database may not have
/// the relcache entries of pg_database's indexes (they come from a cache file that does not exist
/// yet right after initdb).
fn database_oid(db: &str) -> Option<(pg_sys::Oid, bool)> {
    BackgroundWorker::transaction(|| unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let rel = pg_sys::table_open(pg_sys::DatabaseRelationId, lock);
        let scan = pg_sys::table_beginscan_catalog(rel, 0, std::ptr::null_mut());
        let mut found = None;
        loop {
            let tuple = pg_sys::heap_getnext(scan, pg_sys::ScanDirection::ForwardScanDirection);
            if tuple.is_null() {
                break;
            }
            let header = (*tuple).t_data;
            let form = header.cast::<u8>().add(usize::from((*header).t_hoff)).cast::<pg_sys::FormData_pg_database>();
            if CStr::from_ptr((*form).datname.data.as_ptr()).to_bytes() == db.as_bytes() {
                // datconnlimit -2: a database left invalid by an interrupted DROP DATABASE.
                found = Some(((*form).oid, (*form).datallowconn && (*form).datconnlimit != -2));
                break;
            }
        }
        pg_sys::table_endscan(scan);
        pg_sys::table_close(rel, lock);
        found
    })
}

/// One pass over one database: start its worker and wait for it to finish. True when the pass
/// stopped at its bound with work left.
fn run_pass(db: &str, logged: &mut HashSet<String>, vacuumed: &mut HashMap<String, handshake::Vacuumed>) -> bool {
    let oid = match database_oid(db) {
        Some((oid, true)) => oid,
        Some((_, false)) => {
            if logged.insert(format!("no connections {db}")) {
                warning!("idempotency maintenance: database \"{db}\" does not allow connections; skipping it");
            }
            return false;
        }
        None => {
            if logged.insert(format!("no database {db}")) {
                warning!("idempotency maintenance: database \"{db}\" does not exist; skipping it");
            }
            return false;
        }
    };
    logged.remove(&format!("no database {db}"));
    logged.remove(&format!("no connections {db}"));

    handshake::set(Pass::Started);
    handshake::set_vacuumed(vacuumed.get(db).copied());
    let worker = BackgroundWorkerBuilder::new(&format!("{WORKER_TYPE} {db}"))
        .set_type(WORKER_TYPE)
        .set_library("idempotency")
        .set_function("_idem_maintenance_main")
        .enable_spi_access()
        .set_argument(oid.into_datum())
        .set_extra(db)
        .set_notify_pid(unsafe { pg_sys::MyProcPid })
        .load_dynamic();
    let Ok(worker) = worker else {
        if logged.insert(format!("no slot {db}")) {
            warning!(
                "idempotency maintenance: could not start a worker for database \"{db}\" (max_worker_processes reached?); will retry every interval"
            );
        }
        return false;
    };
    logged.remove(&format!("no slot {db}"));

    // The postmaster sets our latch when the worker starts and when it exits.
    loop {
        match worker.pid() {
            Err(BackgroundWorkerStatus::Stopped) | Err(BackgroundWorkerStatus::PostmasterDied) => break,
            _ => {}
        }
        if shutdown_requested() {
            let _ = worker.terminate().wait_for_shutdown();
            return false;
        }
        wait(Some(Duration::from_secs(1)));
    }

    let missing = format!("no extension {db}");
    let pass = handshake::get();
    match pass {
        Pass::Done | Pass::Unfinished => {
            if logged.remove(&missing) {
                log!("idempotency maintenance: database \"{db}\" now has the idempotency extension");
            }
            match handshake::vacuumed() {
                Some(v) => vacuumed.insert(db.to_owned(), v),
                None => vacuumed.remove(db),
            };
        }
        Pass::NoExtension => {
            if logged.insert(missing) {
                log!(
                    "idempotency maintenance: database \"{db}\" does not have the idempotency extension; skipping it until it does"
                );
            }
        }
        Pass::InRecovery => {
            if logged.insert(format!("in recovery {db}")) {
                log!("idempotency maintenance: the server is in recovery; database \"{db}\" is skipped until it is promoted");
            }
        }
        Pass::Started => {
            warning!("idempotency maintenance: the worker for database \"{db}\" stopped before finishing its pass")
        }
    }
    pass == Pass::Unfinished
}

/// Runs `sql` (one batch, `$1` = batch size) in its own transaction until a batch is less than
/// full (with `until_zero`, until a batch handles nothing), at most [`PASS_BATCHES`] times.
/// Returns the rows handled, the number of transactions, and whether it finished (false: it
/// stopped at the bound).
fn drain(sql: &str, batch_size: i32, action: Option<&str>, until_zero: bool) -> (i64, i64, bool) {
    let (mut total, mut transactions) = (0i64, 0i64);
    let activity = CString::new(sql).unwrap_or_default();
    while !shutdown_requested() {
        if transactions >= PASS_BATCHES {
            return (total, transactions, false);
        }
        let n = BackgroundWorker::transaction(|| {
            unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_RUNNING, activity.as_ptr()) };
            let result = match action {
                Some(a) => Spi::get_one_with_args::<i64>(sql, &[batch_size.into(), a.into()]),
                None => Spi::get_one_with_args::<i64>(sql, &[batch_size.into()]),
            };
            match result {
                Ok(n) => n.unwrap_or(0),
                Err(e) => error!("idempotency maintenance: {sql}: {e}"),
            }
        });
        unsafe { pg_sys::pgstat_report_activity(pg_sys::BackendState::STATE_IDLE, std::ptr::null()) };
        total += n;
        transactions += 1;
        if n < i64::from(batch_size) && !(until_zero && n > 0) {
            break;
        }
    }
    (total, transactions, true)
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn _idem_maintenance_main(arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let oid = unsafe { pg_sys::Oid::from_datum(arg, false) }.unwrap_or(pg_sys::InvalidOid);
    BackgroundWorker::connect_worker_to_spi_by_oid(Some(oid), None);
    let db = BackgroundWorker::get_extra();
    let settings = Maintenance::current();
    // SAFETY: reads shared state; callable from any backend.
    if unsafe { pg_sys::RecoveryInProgress() } {
        handshake::set(Pass::InRecovery);
        return;
    }

    let schema = BackgroundWorker::transaction(|| {
        // One row whatever happens: NULL when the extension is not installed here.
        Spi::get_one::<String>(
            "SELECT (SELECT pg_catalog.quote_ident(n.nspname)
                       FROM pg_catalog.pg_extension AS e
                       JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                      WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')",
        )
    });
    let schema = match schema {
        Ok(Some(s)) => s,
        Ok(None) => {
            handshake::set(Pass::NoExtension);
            return;
        }
        Err(e) => error!("idempotency maintenance: looking up the extension in database \"{db}\": {e}"),
    };

    let started = Instant::now();
    let action = settings.action.as_str();
    // Within the grace after a promotion (begin_grace_if_promoted) recovery waits.
    // SAFETY: reads the clock.
    let in_grace = handshake::grace_until() > unsafe { pg_sys::GetCurrentTimestamp() };
    // After the update from 0.6.0 (docs/record-layout.md): the records kept in idem_records_060
    // move into idem_records first, PROCESSING ones first, so recovery below meets them; the
    // old table is dropped by the call that finds it empty. Looked up each pass (one catalog
    // lookup): the table exists only until the move ends.
    let kept = BackgroundWorker::transaction(|| {
        Spi::get_one_with_args::<bool>("SELECT pg_catalog.to_regclass($1) IS NOT NULL", &[format!("{schema}.idem_records_060").into()])
    });
    let (moved, move_xacts, move_done) = match kept {
        Ok(Some(true)) => drain(&format!("SELECT {schema}.idem_move_records(batch_size => $1)"), settings.batch_size, None, true),
        Ok(_) => (0, 0, true),
        Err(e) => error!("idempotency maintenance: looking up idem_records_060 in database \"{db}\": {e}"),
    };
    let (recovered, recover_xacts, recover_done) = if in_grace {
        (0, 0, true)
    } else {
        drain(&format!("SELECT {schema}.idem_recover_stuck(batch_size => $1, action => $2)"), settings.batch_size, Some(action), false)
    };
    let (swept, sweep_xacts, sweep_done) =
        drain(&format!("SELECT {schema}.idem_sweep(batch_size => $1)"), settings.batch_size, None, false);
    crate::vacuum::after_sweep(db, &schema, swept);
    metrics::add("worker_passes", 1);
    if moved + recovered + swept > 0 {
        log!(
            "idempotency maintenance in database \"{db}\": {}recovered {recovered} (action {action}), swept {swept}, in {} transactions of at most {} rows, {:.3} s{}",
            if move_xacts > 0 { format!("moved {moved} (kept from 0.6.0), ") } else { String::new() },
            move_xacts + recover_xacts + sweep_xacts,
            settings.batch_size,
            started.elapsed().as_secs_f64(),
            if move_done && recover_done && sweep_done { "" } else { "; stopped at the pass's bound, the next round continues" }
        );
    }
    handshake::set(if move_done && recover_done && sweep_done { Pass::Done } else { Pass::Unfinished });
}
