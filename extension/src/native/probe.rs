//! One row through a primary-key index, without the executor: open the table and its primary
//! key, take a snapshot as a statement would (a new one per call under READ COMMITTED, the
//! transaction's under REPEATABLE READ and SERIALIZABLE), look the key up with
//! index_beginscan / index_getnext_slot, copy out what is needed, close.
//!
//! The index access method does what the executor's index scan does for visibility and for
//! SERIALIZABLE (predicate locks on the index page and the tuple, conflict-out checks); the
//! locks on the relations are kept until the end of the transaction, as the executor keeps them.
//!
//! On a Citus distributed table the rows live in shards (on this node or another) and the table
//! here is an empty shell: direct access would find nothing. There [`key`] reads the same two
//! rows through the planner instead, by kept SPI plans that Citus routes to the key's shard.

use super::call::{self, Text};
use super::catalog::Catalog;
use super::plans::{self, Stmt};
use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum, Oid};

/// The `status` of a record: the words of the core crate's vocabulary.
pub(crate) use idempotency_core::Status;

/// What `idem_reserve` needs from a record.
pub(crate) struct Record {
    pub(crate) same_hash: bool,
    pub(crate) status: Status,
    /// The stored response (a detoasted copy in the current memory context) of a finished record.
    pub(crate) response: Option<Datum>,
    pub(crate) lease_expires_at: pg_sys::TimestampTz,
    pub(crate) expires_at: pg_sys::TimestampTz,
    pub(crate) created_at: pg_sys::TimestampTz,
    /// The role the record belongs to (`None`: no owner, or a schema from before 0.6.0).
    pub(crate) owner: Option<Oid>,
    /// The step of its last recovery point (`None`: none, or a schema from before 0.7.0).
    pub(crate) step: Option<i32>,
}

impl Record {
    /// Whether the record still decides (not expired and free to take over) at `now`.
    pub(crate) fn live(&self, now: pg_sys::TimestampTz) -> bool {
        self.expires_at > now || (self.status == Status::Processing && self.lease_expires_at > now)
    }

    /// Whether the record is to be resumed at `now` (docs/recovery-points.md): live, for the same
    /// request, with a recovery point and no live holder (RESUMABLE, or PROCESSING with a step
    /// and its lease run out). As sql/reserve.sql's `v_resume`.
    pub(crate) fn resumable(&self, now: pg_sys::TimestampTz) -> bool {
        self.same_hash
            && self.expires_at > now
            && (self.status == Status::Resumable
                || (self.status == Status::Processing && self.step.is_some() && self.lease_expires_at <= now))
    }
}

/// The key columns of both tables, in their primary keys' order.
pub(crate) struct Scope<'a> {
    pub(crate) operation: Text<'a>,
    pub(crate) user_id: Text<'a>,
    pub(crate) key: Text<'a>,
}

/// A column of the row in `slot`, or `None` when it is NULL.
///
/// # Safety
/// `slot` holds a row of a relation that has column `attnum`.
unsafe fn column(slot: *mut pg_sys::TupleTableSlot, attnum: pg_sys::AttrNumber) -> Option<Datum> {
    let mut isnull = false;
    // SAFETY: guaranteed by the caller; slot_getattr deforms the row as far as attnum.
    let value = unsafe { pg_sys::slot_getattr(slot, i32::from(attnum), &mut isnull) };
    (!isnull).then_some(value)
}

/// A NOT NULL column, or an error naming it (a broken table, never expected).
///
/// # Safety
/// As [`column`].
unsafe fn required(slot: *mut pg_sys::TupleTableSlot, attnum: pg_sys::AttrNumber) -> Datum {
    // SAFETY: guaranteed by the caller.
    unsafe { column(slot, attnum) }
        .unwrap_or_else(|| raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, format!("NULL in NOT NULL column {attnum}")))
}

/// The bytes of a text datum.
///
/// # Safety
/// `value` is a text datum that stays valid while the slice is used.
unsafe fn bytes<'a>(value: Datum) -> &'a [u8] {
    // SAFETY: guaranteed by the caller; detoasting a short inline text is a no-op.
    unsafe { pgrx::varlena::varlena_to_byte_slice(pg_sys::pg_detoast_datum_packed(value.cast_mut_ptr())) }
}

/// A snapshot taken as a statement of a VOLATILE function takes it: after a command counter
/// increment (rows this transaction wrote earlier in the same statement are visible), new
/// under READ COMMITTED, the transaction's under REPEATABLE READ and SERIALIZABLE.
struct Snapshot(pg_sys::Snapshot);

impl Snapshot {
    fn take() -> Self {
        // SAFETY: inside a transaction; the registered copy is released in Drop, or by the
        // resource owner if an error unwinds first.
        unsafe {
            pg_sys::CommandCounterIncrement();
            Snapshot(pg_sys::RegisterSnapshot(pg_sys::GetTransactionSnapshot()))
        }
    }

    /// The calling statement's snapshot (what a SELECT in the same statement reads): no new
    /// snapshot to build. Rows this transaction wrote since the statement began are not in it;
    /// the callers take a [`Snapshot::take`] after a miss that matters.
    fn statement() -> Self {
        // SAFETY: as `take`; the active snapshot outlives the call.
        unsafe {
            if pg_sys::ActiveSnapshotSet() {
                Snapshot(pg_sys::RegisterSnapshot(pg_sys::GetActiveSnapshot()))
            } else {
                Self::take()
            }
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        // SAFETY: registered in `take`, unregistered once.
        unsafe { pg_sys::UnregisterSnapshot(self.0) };
    }
}

/// Looks `scope` up in `heap` through its primary key `index` and, if a row is visible, maps
/// it with `read` (which must copy out anything it keeps: the row lives in a shared buffer).
fn probe<T>(
    snapshot: pg_sys::Snapshot,
    heap: Oid,
    index: Oid,
    scope: &Scope<'_>,
    read: impl FnOnce(*mut pg_sys::TupleTableSlot) -> T,
) -> Option<T> {
    // SAFETY: plain calls into PostgreSQL inside a transaction, on relations of our catalog; every
    // resource is released below on success, and by the resource owner if an error unwinds.
    unsafe {
        let heap = pg_sys::table_open(heap, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let index = pg_sys::index_open(index, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let slot = pg_sys::table_slot_create(heap, std::ptr::null_mut());
        let mut keys: [pg_sys::ScanKeyData; 3] = std::mem::zeroed();
        for (i, (entry, part)) in keys.iter_mut().zip([scope.operation, scope.user_id, scope.key]).enumerate() {
            pg_sys::ScanKeyInit(
                entry,
                (i + 1) as pg_sys::AttrNumber,
                pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
                pg_sys::regproc::from(pg_sys::F_TEXTEQ),
                part.datum,
            );
            // Compare as the index is ordered: with its column's collation (ScanKeyInit assumes
            // C, right only for catalogs).
            entry.sk_collation = *(*index).rd_indcollation.add(i);
        }
        // 18 added an instrumentation argument (none here).
        #[cfg(feature = "pg18")]
        let scan = pg_sys::index_beginscan(heap, index, snapshot, std::ptr::null_mut(), 3, 0);
        #[cfg(not(feature = "pg18"))]
        let scan = pg_sys::index_beginscan(heap, index, snapshot, 3, 0);
        pg_sys::index_rescan(scan, keys.as_mut_ptr(), 3, std::ptr::null_mut(), 0);
        let found = pg_sys::index_getnext_slot(scan, pg_sys::ScanDirection::ForwardScanDirection, slot);
        let result = found.then(|| read(slot));
        pg_sys::index_endscan(scan);
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::index_close(index, pg_sys::NoLock as pg_sys::LOCKMODE);
        pg_sys::table_close(heap, pg_sys::NoLock as pg_sys::LOCKMODE);
        result
    }
}

/// A retry counter: the transient failures counted, until when the counter lives, and whose it
/// is (`None`: no owner, a counter from before 0.7.0, or a schema without counter owners).
#[derive(Clone, Copy)]
pub(crate) struct Counter {
    attempts: i32,
    expires_at: pg_sys::TimestampTz,
    owner: Option<Oid>,
}

/// What one read of a key finds: its record and its retry counter, both seen by one snapshot
/// (as the PL/pgSQL version reads both in one statement).
pub(crate) struct Key {
    pub(crate) record: Option<Record>,
    counter: Option<Counter>,
}

impl Key {
    /// The transient failures counted by a counter still live after `after` (0 without one).
    pub(crate) fn attempts(&self, after: pg_sys::TimestampTz) -> i32 {
        match self.counter {
            Some(c) if c.expires_at > after => c.attempts,
            _ => 0,
        }
    }

    /// The owner of a counter still live after `after`: a released key stays that role's while
    /// its count lives (`None`: no live counter, or one without an owner).
    pub(crate) fn counter_owner(&self, after: pg_sys::TimestampTz) -> Option<Oid> {
        self.counter.filter(|c| c.expires_at > after).and_then(|c| c.owner)
    }
}

/// Reads the record of `scope` (compared with `request_hash`) and its retry counter: under the
/// calling statement's snapshot, or, if `fresh`, one taken now as a statement of a VOLATILE
/// function would (after waiting for the key's lock or losing a race). On Citus, through the
/// planner.
pub(crate) fn key(catalog: &Catalog, scope: &Scope<'_>, request_hash: &[u8], fresh: bool) -> Key {
    if catalog.distributed {
        return planned(catalog, scope, request_hash);
    }
    let snapshot = if fresh { Snapshot::take() } else { Snapshot::statement() };
    let record = record(&snapshot, catalog, scope, request_hash);
    let counter = counter(&snapshot, catalog, scope);
    Key { record, counter }
}

/// What the key's record is right now, whatever the transaction's snapshot shows: read with a
/// dirty snapshot, as a unique index check reads, so a row another transaction is writing is
/// seen before it commits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Latest {
    /// No record, and none being written.
    Absent,
    /// A committed record, or one written by this transaction.
    Present,
    /// Another transaction wrote the record (inserted it, or took it over) and has not ended:
    /// the row is its lock on the key.
    Writing(pg_sys::TransactionId),
    /// Another transaction is deleting the record (idem_sweep, idem_release) and has not ended.
    Deleting(pg_sys::TransactionId),
}

/// Reads [`Latest`] for `scope`: the check after taking the key's lock, before creating or
/// taking over (a writer past its lock budget, [`super::pending::may_keep_lock`], holds the key
/// by its uncommitted row alone).
pub(crate) fn latest(catalog: &Catalog, scope: &Scope<'_>) -> Latest {
    let mut dirty = pg_sys::SnapshotData { snapshot_type: pg_sys::SnapshotType::SNAPSHOT_DIRTY, ..Default::default() };
    // The dirty snapshot is a local, never registered: the scan only reads it, and each
    // visibility check sets its xmin (an inserter in progress) and xmax (an updater or deleter
    // in progress) for the tuple it checked, the returned one last.
    let found = probe(&mut dirty, catalog.records, catalog.records_pkey, scope, |slot| {
        // Deleted rather than updated: the tuple's forward link points at itself.
        // SAFETY: slot holds a heap tuple of idem_records, pinned while the scan is open.
        unsafe {
            let tuple = pg_sys::ExecFetchSlotHeapTuple(slot, false, std::ptr::null_mut());
            pg_sys::ItemPointerEquals(&mut (*tuple).t_self, &mut (*(*tuple).t_data).t_ctid)
        }
    });
    let valid = |xid: pg_sys::TransactionId| xid != pg_sys::InvalidTransactionId;
    match (found, dirty.xmin, dirty.xmax) {
        (None, _, _) => Latest::Absent,
        (Some(_), xmin, _) if valid(xmin) => Latest::Writing(xmin),
        (Some(true), _, xmax) if valid(xmax) => Latest::Deleting(xmax),
        (Some(false), _, xmax) if valid(xmax) => Latest::Writing(xmax),
        (Some(_), _, _) => Latest::Present,
    }
}

fn record(snapshot: &Snapshot, catalog: &Catalog, scope: &Scope<'_>, request_hash: &[u8]) -> Option<Record> {
    let cols = &catalog.rec;
    probe(snapshot.0, catalog.records, catalog.records_pkey, scope, |slot| {
        // SAFETY: slot holds an idem_records row; the columns are the catalog's; text values
        // are read while the buffer is pinned, the response is copied out.
        unsafe {
            let status = status(bytes(required(slot, cols.status)));
            let same_hash = bytes(required(slot, cols.request_hash)) == request_hash;
            let response = match status {
                Status::Success | Status::Failed => {
                    column(slot, cols.response).map(|v| Datum::from(pg_sys::pg_detoast_datum_copy(v.cast_mut_ptr())))
                }
                Status::Processing | Status::Resumable => None,
            };
            Record {
                same_hash,
                status,
                response,
                lease_expires_at: required(slot, cols.lease_expires_at).value() as i64,
                expires_at: required(slot, cols.expires_at).value() as i64,
                created_at: required(slot, cols.created_at).value() as i64,
                owner: cols.owner.and_then(|attnum| column(slot, attnum)).map(super::owner::from_datum),
                step: cols.step.and_then(|attnum| column(slot, attnum)).map(|v| v.value() as i32),
            }
        }
    })
}

fn counter(snapshot: &Snapshot, catalog: &Catalog, scope: &Scope<'_>) -> Option<Counter> {
    let cols = &catalog.ret;
    probe(snapshot.0, catalog.retries, catalog.retries_pkey, scope, |slot| {
        // SAFETY: slot holds an idem_retries row; attempts and expires_at are by-value NOT
        // NULL, owner (a regrole, by value) may be NULL.
        unsafe {
            Counter {
                attempts: required(slot, cols.attempts).value() as i32,
                expires_at: required(slot, cols.expires_at).value() as i64,
                owner: cols.owner.and_then(|attnum| column(slot, attnum)).map(super::owner::from_datum),
            }
        }
    })
}

/// The status of a record, from its text.
fn status(text: &[u8]) -> Status {
    std::str::from_utf8(text)
        .ok()
        .and_then(|word| Status::parse(word).ok())
        .unwrap_or_else(|| raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, "idem_records holds an unknown status".into()))
}

/// [`key`] through the planner (a distributed table): two single-shard statements (one per table:
/// single-table statements are what Citus routes best), each with a snapshot of its own under
/// READ COMMITTED. What decides the outcome is the record, read first; a counter changed between
/// the two reads only moves the reported `attempts` to a later moment. As on the direct path,
/// the primary key and the re-checking takeover, not this read, keep a key at most once.
fn planned(catalog: &Catalog, scope: &Scope<'_>, request_hash: &[u8]) -> Key {
    let hash = call::text_datum(request_hash);
    let args = [Some(scope.operation.datum), Some(scope.user_id.datum), Some(scope.key.datum), Some(hash)];
    let not_null = |value: Option<Datum>, what: &str| {
        value.unwrap_or_else(|| raise(PgSqlErrorCode::ERRCODE_DATA_CORRUPTED, format!("NULL in NOT NULL column {what}")))
    };
    plans::connected(|| {
        let record = (plans::execute(&catalog.plans, Stmt::ReadRecord, &args) > 0).then(|| {
            // SAFETY: text values of the first row, read before SPI_finish frees them; the
            // response is copied into the caller's memory context (SPI_datumTransfer).
            unsafe {
                let status = status(bytes(not_null(plans::first_row(2), "status")));
                let same_hash = not_null(plans::first_row(1), "request_hash").value() != 0;
                let response = match status {
                    Status::Success | Status::Failed => plans::first_row(3).map(|v| pg_sys::SPI_datumTransfer(v, false, -1)),
                    Status::Processing | Status::Resumable => None,
                };
                Record {
                    same_hash,
                    status,
                    response,
                    lease_expires_at: not_null(plans::first_row(4), "lease_expires_at").value() as i64,
                    expires_at: not_null(plans::first_row(5), "expires_at").value() as i64,
                    created_at: not_null(plans::first_row(6), "created_at").value() as i64,
                    owner: if catalog.rec.owner.is_some() { plans::first_row(7).map(super::owner::from_datum) } else { None },
                    // Read last, after the owner (a schema with a step has owners).
                    step: if catalog.rec.step.is_some() { plans::first_row(8).map(|v| v.value() as i32) } else { None },
                }
            }
        });
        let counter = (plans::execute(&catalog.plans, Stmt::ReadRetries, &args[..3]) > 0).then(|| Counter {
            attempts: not_null(plans::first_row(1), "attempts").value() as i32,
            expires_at: not_null(plans::first_row(2), "expires_at").value() as i64,
            owner: if catalog.ret.owner.is_some() { plans::first_row(3).map(super::owner::from_datum) } else { None },
        });
        Key { record, counter }
    })
}
