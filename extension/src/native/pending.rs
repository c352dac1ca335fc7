//! The write-once flow: a fresh reservation that is completed in its own transaction writes its
//! record once, finished, instead of INSERT (PROCESSING) then UPDATE (SUCCESS).
//!
//! `idem_reserve` for a key with no record, holding the key's advisory lock, does not insert:
//! it keeps the reservation here (backend memory) and answers `created`. Then either
//! - `idem_complete` with its token inserts the finished record ([`complete`]), or
//! - the transaction commits (or prepares) without completing it: the pre-commit callback
//!   inserts the PROCESSING record, so the key stays reserved exactly as if `idem_reserve` had
//!   inserted it (the two-phase flow: reserve, commit, outside call, complete later), or
//! - any other call on the key in this transaction (`idem_reserve` again, `idem_release`,
//!   `idem_heartbeat`, `idem_complete` with another token) first inserts the PROCESSING record
//!   ([`materialize`]) and then runs as before, so it answers what it always answered.
//!
//! Until one of those happens no other transaction can write the key: every writer of a new
//! record holds the key's advisory lock, which this transaction holds until it ends. A
//! transaction that rolls back, or a backend that dies, leaves nothing behind and frees the key.
//!
//! The locks live in the server's shared lock table, which is sized for about
//! `max_locks_per_transaction` locks per session: a transaction keeps at most half of that many
//! ([`may_keep_lock`]; the pending reservations and the ones written at once under a kept lock).
//! Past it, `idem_reserve` writes the PROCESSING record at once and gives the key's lock back:
//! the uncommitted row then holds the key, and other transactions find it with a dirty read
//! (`probe::latest`).
//!
//! Savepoints: a reservation made in a subtransaction that rolls back is forgotten (its
//! advisory lock is released with it); an insert made for a reservation (by complete or
//! materialize) in a subtransaction that rolls back is undone by PostgreSQL, so the reservation
//! becomes pending again and the pre-commit callback still writes it. Hence each entry records
//! the subtransaction that made it and the one that wrote it, re-parented when a
//! subtransaction commits.
//!
//! What a caller can observe: idem_lookup writes the key's pending reservation first
//! ([`idem_write_pending_native`]), so it answers as before; a direct `SELECT` on idem_records
//! and idem_stats in the reserving transaction do not show a pending reservation until
//! something writes it. Other transactions never saw an uncommitted record, so for them nothing
//! changes.

use super::call::{self, v1_function_info};
use super::catalog::{self, Catalog};
use super::plans::{self, Stmt};
use super::probe::Scope;
use crate::args::raise;
use idempotency_core::Status;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum, SubTransactionId};
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A reservation not written yet.
#[derive(Clone)]
pub(crate) struct Reservation {
    pub(crate) catalog: Rc<Catalog>,
    /// The key, as the database's bytes, and the request's hash as the record stores it
    /// ([`Catalog::stored_hash`]).
    pub(crate) operation: Vec<u8>,
    pub(crate) user_id: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) request_hash: Vec<u8>,
    pub(crate) token: i64,
    pub(crate) lease_end: pg_sys::TimestampTz,
    pub(crate) expires_at: pg_sys::TimestampTz,
    pub(crate) created_at: pg_sys::TimestampTz,
    /// The session's role that reserved it, whom its record belongs to (guarantee 8).
    pub(crate) role: pg_sys::Oid,
    /// The transient failures counted for the key (its live retry counter's), which the record
    /// carries on the compact layout.
    pub(crate) attempts: i32,
}

struct Entry {
    reservation: Reservation,
    /// Who made it: the owner of `idem_reserve` (SECURITY DEFINER), who writes its record.
    owner: pg_sys::Oid,
    /// The subtransaction that made the reservation.
    made_in: SubTransactionId,
    /// The subtransaction that wrote its record, if one did.
    written_in: Option<SubTransactionId>,
}

impl Entry {
    fn is(&self, catalog: &Catalog, scope: &Scope<'_>) -> bool {
        let r = &self.reservation;
        self.written_in.is_none()
            && r.catalog.records == catalog.records
            && r.key == scope.key.bytes
            && r.user_id == scope.user_id.bytes
            && r.operation == scope.operation.bytes
    }
}

thread_local! {
    static PENDING: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    /// Key locks this transaction keeps for reservations written at once (takeovers, and
    /// inserts after a lost race): counted up, never down (a subtransaction that rolls back
    /// frees its locks early; counting them still keeps the transaction under its budget).
    static KEPT: Cell<usize> = const { Cell::new(0) };
}

/// Whether this transaction may keep the lock of one more key until it ends: while it keeps
/// fewer than half of `max_locks_per_transaction` (32 by default), its fair share of the
/// server's shared lock table (max_locks_per_transaction x max_connections slots for every
/// session together). Past that, `idem_reserve` writes the PROCESSING record at once and
/// gives the lock back, so the number of reservations in one transaction has no limit.
pub(crate) fn may_keep_lock() -> bool {
    // SAFETY: reads a setting fixed at server start.
    let budget = usize::try_from(unsafe { pg_sys::max_locks_per_xact } / 2).unwrap_or(0).max(1);
    PENDING.with(|p| p.borrow().len()) + KEPT.with(Cell::get) < budget
}

/// Counts a key lock kept for a reservation written at once.
pub(crate) fn kept_lock() {
    KEPT.with(|k| k.set(k.get() + 1));
    ACTIVE.store(true, Relaxed);
}

/// Whether this transaction made a reservation kept here: the transaction callbacks run on
/// every commit and savepoint of every backend that loaded the library, and return at once
/// unless it is set (a backend is one process: Relaxed is enough).
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn current_subxact() -> SubTransactionId {
    // SAFETY: reads the transaction state of a backend inside a transaction.
    unsafe { pg_sys::GetCurrentSubTransactionId() }
}

/// Keeps `reservation`, made just now by `idem_reserve` under the key's advisory lock.
pub(crate) fn add(reservation: Reservation) {
    let made_in = current_subxact();
    // SAFETY: reads the current user of a backend inside a transaction.
    let owner = unsafe { pg_sys::GetUserId() };
    PENDING.with(|p| p.borrow_mut().push(Entry { reservation, owner, made_in, written_in: None }));
    ACTIVE.store(true, Relaxed);
}

/// Marks the pending reservation of `scope` as written in the current subtransaction and
/// answers it with its owner; `None` when the key has no pending reservation (or its token is
/// not `token`, when given).
fn take(catalog: &Catalog, scope: &Scope<'_>, token: Option<i64>) -> Option<(Reservation, pg_sys::Oid)> {
    take_first(|e| e.is(catalog, scope) && token.is_none_or(|t| t == e.reservation.token))
}

fn take_first(matches: impl Fn(&Entry) -> bool) -> Option<(Reservation, pg_sys::Oid)> {
    PENDING.with(|p| {
        let mut pending = p.borrow_mut();
        let entry = pending.iter_mut().find(|e| matches(e))?;
        entry.written_in = Some(current_subxact());
        Some((entry.reservation.clone(), entry.owner))
    })
}

impl Reservation {
    /// Inserts the record: `status` with `response`, last updated at `updated_at`.
    fn write(&self, owner: pg_sys::Oid, status: Status, response: Option<Datum>, updated_at: pg_sys::TimestampTz) {
        let params = [
            Some(call::text_datum(&self.operation)),
            Some(call::text_datum(&self.user_id)),
            Some(call::text_datum(&self.key)),
            Some(call::text_datum(&self.request_hash)),
            Some(Datum::from(self.token)),
            Some(Datum::from(self.lease_end)),
            Some(Datum::from(self.expires_at)),
            Some(Datum::from(self.created_at)),
            Some(self.catalog.status_datum(status)),
            response,
            Some(Datum::from(updated_at)),
            // The owner (a schema from before 0.6.0 has no such column: its Insert takes 11).
            Some(Datum::from(self.role)),
            // The attempts (the compact layout's Insert only: the others take 12 at most).
            Some(Datum::from(self.attempts)),
        ];
        // As the reservation's owner: the pre-commit callback runs as the session's user, who
        // may not write the table. An error unwinds into the (sub)transaction abort, which
        // restores the user.
        let (mut user, mut context) = (pg_sys::InvalidOid, 0);
        // SAFETY: plain reads and writes of the backend's current user, restored below.
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            pg_sys::SetUserIdAndSecContext(owner, context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32);
        }
        // A plain INSERT: every writer of a new record holds the key's advisory lock, which this
        // transaction has held since the reservation, so no row of the key can have appeared;
        // if something bypassed the lock, the primary key refuses this one (23505).
        let written = plans::connected(|| plans::execute(&self.catalog.plans, Stmt::InsertNew, &params));
        // SAFETY: as above.
        unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
        if written != 1 {
            // Not reachable (the INSERT either writes its row or raises); kept as the last
            // word: never lose this transaction's record silently.
            raise(
                PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                "could not serialize access: the idempotency record of this reservation was written concurrently".into(),
            );
        }
    }
}

/// `idem_complete` of a pending reservation: inserts the finished record. False when the key
/// has no pending reservation with `token` (the caller then runs the fenced UPDATE).
pub(crate) fn complete(
    catalog: &Catalog,
    scope: &Scope<'_>,
    token: i64,
    status: Status,
    response: Option<Datum>,
    now: pg_sys::TimestampTz,
) -> bool {
    match take(catalog, scope, Some(token)) {
        Some((reservation, owner)) => {
            // The same transaction, under another role since (SET ROLE): refused as a
            // written record would be.
            if catalog.rec.owner.is_some() {
                super::owner::require(Some(reservation.role), "complete a key");
            }
            reservation.write(owner, status, response, now);
            true
        }
        None => false,
    }
}

/// Writes the pending reservation of `scope` (if any) as the PROCESSING record it stands for,
/// so the statements that follow see it; true if it wrote one.
pub(crate) fn materialize(catalog: &Catalog, scope: &Scope<'_>) -> bool {
    if !ACTIVE.load(Relaxed) {
        return false;
    }
    let Some((reservation, owner)) = take(catalog, scope, None) else { return false };
    reservation.write(owner, Status::Processing, None, reservation.created_at);
    true
}

v1_function_info!(pg_finfo_idem_write_pending_native);

/// `_idem_write_pending(operation text, user_id text, key text) RETURNS void` (STRICT): writes
/// the key's pending reservation, so what follows in this transaction reads its record
/// (idem_lookup calls it).
///
/// # Safety
/// Called by PostgreSQL's function manager with the 3 text arguments declared in
/// sql/helpers.sql, none NULL (STRICT).
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_write_pending_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    if !ACTIVE.load(Relaxed) {
        return Datum::from(0);
    }
    // SAFETY: the declaration fixes the argument types; STRICT keeps NULLs out.
    let (operation, user_id, key, fn_oid) = unsafe {
        (
            call::text(fcinfo, 0, "operation"),
            call::text(fcinfo, 1, "user_id"),
            call::text(fcinfo, 2, "key"),
            call::function_oid(fcinfo),
        )
    };
    if let (Some(operation), Some(user_id), Some(key)) = (operation, user_id, key) {
        let _ = materialize(&catalog::for_function(fn_oid), &Scope { operation, user_id, key });
    }
    Datum::from(0)
}

/// Writes every pending reservation: the transaction is about to commit or prepare.
fn materialize_all() {
    while let Some((reservation, owner)) = take_first(|e| e.written_in.is_none()) {
        reservation.write(owner, Status::Processing, None, reservation.created_at);
    }
}

unsafe extern "C-unwind" fn on_xact(event: pg_sys::XactEvent::Type, arg: *mut std::ffi::c_void) {
    if ACTIVE.load(Relaxed) {
        // SAFETY: forwarded as PostgreSQL called us.
        unsafe { on_xact_active(event, arg) }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_xact_active(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE
            if PENDING.with(|p| p.borrow().iter().any(|e| e.written_in.is_none())) =>
        {
            // Portals are closed by now: the inserts need a snapshot of their own (an error
            // unwinds into the abort, which drops it).
            // SAFETY: inside the committing transaction, before its snapshots are released.
            unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot()) };
            materialize_all();
            // SAFETY: pushed above.
            unsafe { pg_sys::PopActiveSnapshot() };
        }
        XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE => {
            PENDING.with(|p| p.borrow_mut().clear());
            KEPT.with(|k| k.set(0));
            ACTIVE.store(false, Relaxed);
        }
        _ => {}
    }
}

unsafe extern "C-unwind" fn on_subxact(
    event: pg_sys::SubXactEvent::Type,
    sub: SubTransactionId,
    parent: SubTransactionId,
    arg: *mut std::ffi::c_void,
) {
    if ACTIVE.load(Relaxed) {
        // SAFETY: forwarded as PostgreSQL called us.
        unsafe { on_subxact_active(event, sub, parent, arg) }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn on_subxact_active(
    event: pg_sys::SubXactEvent::Type,
    sub: SubTransactionId,
    parent: SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::SubXactEvent::*;
    PENDING.with(|p| {
        let mut pending = p.borrow_mut();
        match event {
            SUBXACT_EVENT_COMMIT_SUB => {
                for e in pending.iter_mut() {
                    if e.made_in == sub {
                        e.made_in = parent;
                    }
                    if e.written_in == Some(sub) {
                        e.written_in = Some(parent);
                    }
                }
            }
            SUBXACT_EVENT_ABORT_SUB => {
                // Made here: gone with its lock. Written here: the insert is undone, pending again.
                pending.retain(|e| e.made_in != sub);
                for e in pending.iter_mut() {
                    if e.written_in == Some(sub) {
                        e.written_in = None;
                    }
                }
            }
            _ => {}
        }
    });
}

/// Registers the transaction callbacks; called once, from `_PG_init`.
pub(crate) fn register() {
    // SAFETY: static function pointers; PostgreSQL keeps them for the life of the backend.
    unsafe {
        pg_sys::RegisterXactCallback(Some(on_xact), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(on_subxact), std::ptr::null_mut());
    }
}
