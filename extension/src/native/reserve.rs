//! `idem_reserve`, native: the algorithm of sql/reserve.sql.
//!
//! 1. Read the committed record and its retry counter with primary-key probes under one
//!    snapshot ([`probe::key`]: the calling statement's, a new one after waiting or losing a
//!    race); a live record answers at once (replay, failed, in_progress, mismatch). No lock, no
//!    executor, no SPI.
//! 2. Absent or expired: a live retry counter of a role the caller may not act on refuses
//!    (42501: a released key stays its owner's while its count lives). Then take the key's
//!    transaction-scoped advisory lock, the same lock as the PL/pgSQL version
//!    (`pg_advisory_xact_lock(hashtextextended(operation || E'\x1f' || user_id || E'\x1f' ||
//!    key, 0))`), so both versions see each other's uncommitted reservations during an upgrade.
//! 3. Create, or take over with the re-checking UPDATE (kept SPI plans). A new key whose record
//!    is still absent under a fresh snapshot once the lock is held is kept pending (write-once,
//!    [`pending`]): `idem_complete` or the pre-commit callback inserts its record. Otherwise
//!    INSERT … ON CONFLICT DO NOTHING. The primary key and the re-check decide; a lost race
//!    reads again. Before writing, a dirty read of the key ([`probe::latest`]) finds a row
//!    another transaction wrote and has not committed: busy, or waited for with `wait`.
//! 4. A live record with a recovery point and no live holder ([`probe::Record::resumable`]) is
//!    resumed instead of answered: under the key's lock, as a takeover, by sql/reserve.sql's
//!    `_idem_resume_locked` (a kept SPI plan), whose `idem_reservation` is the answer (`resume`).
//! 5. Past its share of the lock table ([`pending::may_keep_lock`]), a transaction writes the
//!    PROCESSING record at once and gives the key's lock back ([`unlock`]): the uncommitted
//!    row holds the key, so any number of keys can be reserved in one transaction.

use super::call::{self, v1_function_info, Text};
use super::catalog::{self, Catalog};
use super::legacy;
use super::owner;
use super::pending;
use super::plans::{self, Stmt};
use super::probe::{self, Scope, Status};
use super::writable;
use crate::args;
use crate::metrics;
use pgrx::datum::Interval;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;
use std::rc::Rc;

/// How often a reservation reads the key again after losing a race before it answers
/// `in_progress` (as sql/reserve.sql).
const ATTEMPTS: usize = 8;

/// The answer, as the `idem_reservation` row.
pub(super) struct Answer {
    pub(super) outcome: &'static str,
    token: Option<i64>,
    response: Option<Datum>,
    attempts: i32,
    expires_at: Option<pg_sys::TimestampTz>,
}

impl Answer {
    fn busy(attempts: i32, expires_at: Option<pg_sys::TimestampTz>) -> Self {
        Answer { outcome: "in_progress", token: None, response: None, attempts, expires_at }
    }

    /// The `idem_reservation` row, of the type's attributes: 7 since 0.7.0 (step and state, NULL
    /// on every outcome built here), 5 on a schema of an older version still running this
    /// library. `expected` is the row the calling query was planned with, when it says
    /// ([`expected_row`]): a query planned before the update from 0.6.0 and run after it (it
    /// waited for the update's lock) expects the 5 attributes of then, and gets them, as an
    /// anonymous row of those 5, instead of the 7 of now, which the executor would refuse
    /// ("function return row and query-specified return row do not match").
    pub(super) fn into_datum(self, catalog: &Catalog, expected: Option<pg_sys::TupleDesc>) -> Datum {
        // SAFETY: the catalog's descriptor, valid while the catalog lives; the caller's, valid
        // during the call. A blessed copy is registered in the backend's record type cache.
        let desc = unsafe {
            match expected {
                // Not the catalog's attributes, or (a query and a catalog both from before the
                // update, fewer than this version's) not the type's of now, by the type's own
                // cache, which the executor checks the row against.
                Some(desc)
                    if (*desc).natts != (*catalog.reservation).natts
                        || ((*desc).natts < ATTRIBUTES && (*desc).natts != current_natts(catalog)) =>
                {
                    // An anonymous row (RECORD, blessed: registered for this backend) of those
                    // attributes: a row of the named type is checked against the type of now.
                    let row = pg_sys::CreateTupleDescCopy(desc);
                    (*row).tdtypeid = pg_sys::RECORDOID;
                    (*row).tdtypmod = -1;
                    pg_sys::BlessTupleDesc(row)
                }
                _ => catalog.reservation,
            }
        };
        // SAFETY: as above.
        let natts = usize::try_from(unsafe { (*desc).natts }).unwrap_or(0);
        if !(5..=7).contains(&natts) {
            args::raise(
                PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
                format!("idem_reservation has {natts} attributes, not 5 or 7: reinstall the extension"),
            );
        }
        // Every answer leaves through here: count it (a no-op unless preloaded).
        metrics::add(
            match self.outcome {
                "created" => "reservations_created",
                "replay" => "reservations_replay",
                "failed" => "reservations_failed",
                "mismatch" => "reservations_mismatch",
                _ => "reservations_in_progress",
            },
            1,
        );
        let mut values = [
            call::text_datum(self.outcome.as_bytes()),
            Datum::from(self.token.unwrap_or(0)),
            self.response.unwrap_or(Datum::from(0)),
            Datum::from(self.attempts),
            Datum::from(self.expires_at.unwrap_or(0)),
            Datum::from(0),
            Datum::from(0),
        ];
        let mut nulls = [false, self.token.is_none(), self.response.is_none(), false, self.expires_at.is_none(), true, true];
        // SAFETY: the descriptor is the idem_reservation type's (natts, checked above, of the
        // first columns of these types);
        // HeapTupleHeaderGetDatum flattens any toasted value, as a composite datum requires.
        unsafe {
            let tuple = pg_sys::heap_form_tuple(desc, values.as_mut_ptr(), nulls.as_mut_ptr());
            pg_sys::HeapTupleHeaderGetDatum((*tuple).t_data)
        }
    }
}

/// What a reservation answers: a row built here, or the row `_idem_resume_locked` answered.
enum Reply {
    Answer(Answer),
    /// The `idem_reservation` of a resume (or of the poisoning of an expired holder), copied out
    /// of SPI's memory; `_idem_resume_locked` has counted it.
    Resumed(Datum),
}

impl From<Answer> for Reply {
    fn from(answer: Answer) -> Self {
        Reply::Answer(answer)
    }
}

impl Reply {
    /// Whether the key's lock is kept: by a `created`, or a resume (which wrote the record).
    fn keeps_lock(&self) -> bool {
        match self {
            Reply::Answer(answer) => answer.outcome == "created",
            Reply::Resumed(_) => true,
        }
    }

    fn into_datum(self, catalog: &Catalog, expected: Option<pg_sys::TupleDesc>) -> Datum {
        match self {
            Reply::Answer(answer) => answer.into_datum(catalog, expected),
            Reply::Resumed(row) => row,
        }
    }
}

/// The attributes of `idem_reservation` in this version (0.7.0: step and state appended).
const ATTRIBUTES: i32 = 7;

/// The number of attributes `idem_reservation` has now, by the type cache (up to date with every
/// invalidation this backend has read).
fn current_natts(catalog: &Catalog) -> i32 {
    // SAFETY: the catalog's descriptor names the type; lookup_rowtype_tupdesc pins the cached
    // descriptor, released at once.
    unsafe {
        let desc = pg_sys::lookup_rowtype_tupdesc((*catalog.reservation).tdtypeid, -1);
        let natts = (*desc).natts;
        pg_sys::DecrTupleDescRefCount(desc);
        natts
    }
}

/// The row type the calling query expects of the function, when it says: a call in FROM passes
/// it (`ReturnSetInfo.expectedDesc`); a call in a target list does not, and reads the row by its
/// type, whatever its number of attributes.
///
/// # Safety
/// `fcinfo` is the call's.
pub(super) unsafe fn expected_row(fcinfo: pg_sys::FunctionCallInfo) -> Option<pg_sys::TupleDesc> {
    // SAFETY: guaranteed by the caller; resultinfo is a node (or NULL), read as ReturnSetInfo
    // only when its tag says so.
    unsafe {
        let info = (*fcinfo).resultinfo;
        if info.is_null() || (*info).type_ != pg_sys::NodeTag::T_ReturnSetInfo {
            return None;
        }
        let desc = (*info.cast::<pg_sys::ReturnSetInfo>()).expectedDesc;
        (!desc.is_null()).then_some(desc)
    }
}

/// The answer to a live record (also `idem_replay`'s, [`super::replay`]).
pub(super) fn answer(record: &probe::Record, attempts: impl FnOnce() -> i32) -> Answer {
    let outcome = match (record.same_hash, record.status) {
        (false, _) => "mismatch",
        (true, Status::Success) => "replay",
        (true, Status::Failed) => "failed",
        // A RESUMABLE record of the same request is resumed, never answered (the arm is for
        // completeness: another attempt holds it).
        (true, Status::Processing | Status::Resumable) => "in_progress",
    };
    let response = if record.same_hash { record.response } else { None };
    // The record's own count (the compact layout), else its retry counter's.
    let attempts = record.attempts.unwrap_or_else(attempts);
    Answer { outcome, token: None, response, attempts, expires_at: Some(record.expires_at) }
}

/// The key's advisory lock: its id, once taken (waiting if `wait`), or `None` when another
/// transaction holds it.
fn lock(scope: &Scope<'_>, wait: bool) -> Option<i64> {
    // The database's bytes, as the PL/pgSQL expression hashes them.
    let mut joined = Vec::with_capacity(scope.operation.bytes.len() + scope.user_id.bytes.len() + scope.key.bytes.len() + 2);
    joined.extend_from_slice(scope.operation.bytes);
    joined.push(0x1f);
    joined.extend_from_slice(scope.user_id.bytes);
    joined.push(0x1f);
    joined.extend_from_slice(scope.key.bytes);
    let joined = call::text_datum(&joined);
    // SAFETY: builtins called as SQL calls them: hashtextextended(text, bigint) under the
    // database's default collation (as the PL/pgSQL expression), then the bigint advisory lock
    // functions, which need no flinfo.
    unsafe {
        let hash = pg_sys::DirectFunctionCall2Coll(
            Some(call::builtins::hashtextextended),
            pg_sys::DEFAULT_COLLATION_OID,
            joined,
            Datum::from(0i64),
        );
        let taken = if wait {
            pg_sys::DirectFunctionCall1Coll(Some(call::builtins::pg_advisory_xact_lock_int8), pg_sys::InvalidOid, hash);
            true
        } else {
            pg_sys::DirectFunctionCall1Coll(Some(call::builtins::pg_try_advisory_xact_lock_int8), pg_sys::InvalidOid, hash).value() != 0
        };
        taken.then_some(hash.value() as i64)
    }
}

/// Gives back the key's advisory lock taken by [`lock`] in this same call (so under the same
/// resource owner) once the reservation's row is written: from then on the uncommitted row
/// holds the key, as a row of INSERT … ON CONFLICT does, and the lock no longer fills a slot of
/// the server's shared lock table. Other reservations of the key find the row by
/// [`probe::latest`].
fn unlock(id: i64) {
    // The tag pg_advisory_xact_lock(bigint) builds (SET_LOCKTAG_INT64).
    let tag = pg_sys::LOCKTAG {
        // SAFETY: reads the backend's database, set once at connection.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: ((id as u64) >> 32) as u32,
        locktag_field3: id as u32,
        locktag_field4: 1,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::USER_LOCKMETHOD as u8,
    };
    // SAFETY: releases one transaction-level hold of a lock this call acquired; if the
    // transaction held it before (the key reserved again), that earlier hold stays.
    unsafe { pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false) };
}

fn next_token(catalog: &Catalog) -> i64 {
    // SAFETY: nextval_oid(regclass) of the extension's sequence; needs no flinfo. Runs as the
    // function's owner (SECURITY DEFINER), who may use the sequence.
    unsafe {
        pg_sys::DirectFunctionCall1Coll(Some(call::builtins::nextval_oid), pg_sys::InvalidOid, Datum::from(catalog.token_seq)).value()
            as i64
            + catalog.token_base
    }
}

fn interval_datum(i: Interval) -> Datum {
    i.into_datum().unwrap_or(Datum::from(0))
}

v1_function_info!(pg_finfo_idem_reserve_native);

/// `idem_reserve(operation text, user_id text, key text, request_hash text, ttl interval,
/// lease interval, wait boolean) RETURNS idem_reservation`.
///
/// # Safety
/// Called by PostgreSQL's function manager with the 7 arguments declared in sql/native.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_reserve_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: the declaration in sql/native.sql fixes the argument types read here.
    let (operation, user_id, key, request_hash, ttl, lease, wait, fn_oid) = unsafe {
        (
            call::text(fcinfo, 0, "operation"),
            call::text(fcinfo, 1, "user_id"),
            call::text(fcinfo, 2, "key"),
            call::text(fcinfo, 3, "request_hash"),
            call::arg::<Interval>(fcinfo, 4),
            call::arg::<Interval>(fcinfo, 5),
            call::arg::<bool>(fcinfo, 6),
            call::function_oid(fcinfo),
        )
    };
    args::_idem_check_scope(operation.map(|t| t.str), user_id.map(|t| t.str), key.map(|t| t.str));
    args::_idem_check_request_hash(request_hash.map(|t| t.str));
    let wait = args::required("wait", wait);
    // Present: the checks above raise 22004 for a NULL.
    let (operation, user_id, key, request_hash) = (
        args::required("operation", operation),
        args::required("user_id", user_id),
        args::required("key", key),
        args::required("request_hash", request_hash),
    );
    let ttl = args::_idem_ttl(ttl);
    let lease = args::_idem_lease(lease, Some(ttl));
    let catalog = catalog::for_function(fn_oid);
    // SAFETY: the call's fcinfo.
    let expected = unsafe { expected_row(fcinfo) };
    reserve(&catalog, &Scope { operation, user_id, key }, request_hash, interval_datum(ttl), interval_datum(lease), wait)
        .into_datum(&catalog, expected)
}

fn reserve(catalog: &Rc<Catalog>, scope: &Scope<'_>, request_hash: Text<'_>, ttl: Datum, lease: Datum, wait: bool) -> Reply {
    // The key's lock, once this call has taken it and still holds it.
    let mut locked = None;
    let answer = reserve_locking(catalog, scope, request_hash, ttl, lease, wait, &mut locked);
    // Only a `created` or a resume keeps the key's lock (counted in the transaction's budget by
    // [`pending`]). Any other answer writes nothing, so the lock it took (waiting for a holder
    // that then committed, finding the key held by another transaction's row, losing a race)
    // guards nothing: give it back, or a batch of contended keys would keep one per key.
    if let Some(id) = locked {
        if !answer.keeps_lock() {
            unlock(id);
        }
    }
    answer
}

/// [`reserve`]'s loop; `locked` is the key's lock while this call holds it (left set for a
/// `created` that keeps it).
fn reserve_locking(
    catalog: &Rc<Catalog>,
    scope: &Scope<'_>,
    request_hash: Text<'_>,
    ttl: Datum,
    lease: Datum,
    wait: bool,
    locked: &mut Option<i64>,
) -> Reply {
    // A key reserved earlier in this transaction and not written yet: write it, so this call
    // answers from its record as it always did (in_progress, or replay once completed).
    let wrote = pending::materialize(catalog, scope);
    // The request's hash as the record stores it.
    let stored = catalog.stored_hash(request_hash.bytes);
    // Whether this call has moved the key's record kept from 0.6.0 ([`legacy`]), if any.
    let mut adopted = false;
    for attempt in 0..ATTEMPTS {
        // SAFETY: reads the clock.
        let now = unsafe { pg_sys::GetCurrentTimestamp() };
        // First under the statement's snapshot (a replay builds none); after writing this
        // transaction's pending reservation, waiting for the lock or losing a race, a new one.
        let found = probe::key(catalog, scope, &stored, wrote || attempt > 0, now);
        let mut resume = false;
        if let Some(record) = &found.record {
            if record.live(now) {
                // A live record decides, for its owner (and the owner's members) only: another
                // role learns nothing of it, its response least of all (guarantee 8).
                owner::require(record.owner, "reserve a key");
                // A recovery point and no live holder: resumed below, under the key's lock.
                resume = record.resumable(now);
                if !resume {
                    // The retry counter counts if it was live when the record was created.
                    return answer(record, || found.attempts(record.created_at)).into();
                }
            }
        }
        // Absent, expired and free to take over, or to resume. A live retry counter keeps a released key
        // its owner's (guarantee 8): another role may not start an attempt that would count
        // toward it, or reset it.
        owner::require(found.counter_owner(now), "reserve a key");
        // A new attempt would start now, and write.
        writable::require(catalog, "reserve a key");
        let Some(lock_id) = locked.or_else(|| lock(scope, wait)) else {
            // Another transaction is creating this key and has not committed.
            return Answer::busy(found.attempts(now), None).into();
        };
        if locked.replace(lock_id).is_none() && wait {
            continue; // the holder may have committed while we waited: read again
        }
        // After the update from 0.6.0 the key's record may still be in idem_records_060: moved
        // now, under the key's lock, then read again under a new snapshot (which sees it in
        // idem_records whoever moved it: this call, or a batch this call waited for).
        if !adopted {
            adopted = true;
            match legacy::adopt_scope(catalog, scope, wait) {
                legacy::Adopted::None => {}
                legacy::Adopted::Moved => continue,
                legacy::Adopted::Busy => return Answer::busy(found.attempts(now), None).into(),
            }
        }
        // The record as it is now, uncommitted rows included (not on Citus: there the table
        // here is a shell; a row written past a lock budget is met by the INSERT instead).
        let latest = if catalog.distributed { probe::Latest::Present } else { probe::latest(catalog, scope) };
        if let probe::Latest::Deleting(xid) = latest {
            // A sweep or a release deleting the record, briefly: wait for it whatever `wait`
            // (as the write would), then read again.
            // SAFETY: waits for a transaction id read from a tuple header just now.
            unsafe { pg_sys::XactLockTableWait(xid, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None) };
            continue;
        }
        if let probe::Latest::Writing(xid) = latest {
            // Another transaction holds the key by its uncommitted row (written past its lock
            // budget), or is deleting it: busy, or wait for it to end and read again.
            if !wait {
                return Answer::busy(found.attempts(now), None).into();
            }
            // SAFETY: waits for a transaction id read from a tuple header just now.
            unsafe { pg_sys::XactLockTableWait(xid, std::ptr::null_mut(), std::ptr::null_mut(), pg_sys::XLTW_Oper::XLTW_None) };
            continue;
        }
        // Keep the key's lock until the transaction ends (as every version did), unless this
        // transaction already keeps its share of the lock table: then write the row now and
        // give the lock back. On Citus too (0.5.0 kept every lock there, so a large batch
        // filled the lock table of the node running it): there no dirty read finds the row, so
        // a duplicate that takes the freed lock meets the row in the primary key, and its
        // INSERT … ON CONFLICT DO NOTHING waits for this transaction's end (then reads the
        // committed record, or creates after a rollback) instead of answering in_progress at
        // once. Never a second `created`: the primary key decides, as for every write here.
        let keep = pending::may_keep_lock();
        let token = next_token(catalog);
        if resume {
            let params = [
                Some(scope.operation.datum),
                Some(scope.user_id.datum),
                Some(scope.key.datum),
                Some(request_hash.datum),
                Some(Datum::from(token)),
                Some(lease),
            ];
            let row = plans::connected(|| {
                if plans::execute(&catalog.plans, Stmt::Resume, &params) == 0 {
                    return None;
                }
                // SAFETY: a composite (varlena) datum in SPI memory, copied into the caller's
                // memory context before SPI_finish frees it.
                plans::first_row(1).map(|row| unsafe { pg_sys::SPI_datumTransfer(row, false, -1) })
            });
            let Some(row) = row else {
                continue; // the record changed since it was read: read it again
            };
            if keep {
                pending::kept_lock();
            } else {
                unlock(lock_id);
                *locked = None;
            }
            return Reply::Resumed(row);
        }
        let lease_end = call::plus(now, lease);
        let expires_at = call::plus(now, ttl);
        // (Not on Citus: the record must be written through the planner, in the statement.)
        let created = if found.record.is_none() && keep && latest == probe::Latest::Absent {
            // No record, and none can appear while we hold the lock: write it once, later.
            pending::add(pending::Reservation {
                catalog: Rc::clone(catalog),
                operation: scope.operation.bytes.to_owned(),
                user_id: scope.user_id.bytes.to_owned(),
                key: scope.key.bytes.to_owned(),
                request_hash: stored.clone(),
                token,
                lease_end,
                expires_at,
                created_at: now,
                role: owner::caller(),
                attempts: found.attempts(now),
            });
            true
        } else {
            // Takeover, or a record committed since the probe (the INSERT then finds it: a lost
            // race under READ COMMITTED, a serialization failure under REPEATABLE READ).
            // The new record belongs to the caller (a schema without owners ignores the last
            // parameter: its statements have fewer).
            let role = Some(Datum::from(owner::caller()));
            // The record's attempts (the compact layout's statements only: the others have
            // fewer parameters).
            let attempts = Some(Datum::from(found.attempts(now)));
            let head = [
                Some(scope.operation.datum),
                Some(scope.user_id.datum),
                Some(scope.key.datum),
                Some(call::text_datum(&stored)),
                Some(Datum::from(token)),
                Some(Datum::from(lease_end)),
                Some(Datum::from(expires_at)),
                Some(Datum::from(now)),
            ];
            let written = if found.record.is_some() {
                let params: Vec<Option<Datum>> = head.iter().copied().chain([role, attempts]).collect();
                plans::connected(|| plans::execute(&catalog.plans, Stmt::TakeOver, &params))
            } else {
                let tail = [Some(catalog.status_datum(Status::Processing)), None, Some(Datum::from(now)), role, attempts];
                let params: Vec<Option<Datum>> = head.iter().copied().chain(tail).collect();
                plans::connected(|| plans::execute(&catalog.plans, Stmt::Insert, &params))
            } == 1;
            if written && keep {
                pending::kept_lock();
            }
            written
        };
        if created {
            // The retry counter, if one is live: this attempt continues its count (read with the
            // key; the advisory lock keeps other releases of this key out meanwhile).
            let attempts = found.attempts(now);
            if attempts > 0 {
                // A retry of a released key: keep its counter alive as long as this record.
                let params = [Some(scope.operation.datum), Some(scope.user_id.datum), Some(scope.key.datum), Some(Datum::from(expires_at))];
                plans::connected(|| plans::execute(&catalog.plans, Stmt::KeepRetries, &params));
            }
            if !keep {
                unlock(lock_id);
                *locked = None;
            }
            return Answer { outcome: "created", token: Some(token), response: None, attempts, expires_at: Some(expires_at) }.into();
        }
        // Lost a race with a commit, a takeover, a recovery or a sweep: read the key again.
    }
    // The key kept changing under us; answer as a busy key so the caller retries later, with
    // the transient failures counted for it so far (read again, as sql/reserve.sql does).
    // SAFETY: reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    Answer::busy(probe::key(catalog, scope, &stored, true, now).attempts(now), None).into()
}
