//! `idem_complete`, `idem_release` and `idem_heartbeat`, native: the calls an attempt makes
//! with its token (sql/finish.sql). Each is one fenced statement on the record, by a kept SPI
//! plan; a stale token, or a record no longer PROCESSING, changes nothing and answers
//! false / 'stale'. A reservation of the same transaction not written yet ([`pending`]) is
//! inserted finished by `idem_complete`, and written as PROCESSING before the others run.

use super::call::{self, v1_function_info, Text};
use super::catalog;
use super::legacy;
use super::owner;
use super::pending;
use super::plans::{self, Stmt};
use super::probe::Scope;
use super::writable;
use crate::args::{self, raise};
use crate::guc;
use crate::metrics;
use idempotency_core::Status;
use pgrx::datum::Interval;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;

/// The scope and token arguments (0 to 3) every function here takes, checked: the rules of
/// `_idem_check_scope` and a non-NULL token.
///
/// # Safety
/// `fcinfo` is a valid call whose arguments 0-2 are text and 3 is bigint.
unsafe fn scope_and_token<'a>(fcinfo: pg_sys::FunctionCallInfo) -> ([Text<'a>; 3], i64) {
    // SAFETY: guaranteed by the caller.
    let (operation, user_id, key, token) = unsafe {
        (
            call::text(fcinfo, 0, "operation"),
            call::text(fcinfo, 1, "user_id"),
            call::text(fcinfo, 2, "key"),
            call::arg::<i64>(fcinfo, 3),
        )
    };
    args::_idem_check_scope(operation.map(|t| t.str), user_id.map(|t| t.str), key.map(|t| t.str));
    let token = args::required("token", token);
    // Present: _idem_check_scope raises 22004 for a NULL.
    let scope = [args::required("operation", operation), args::required("user_id", user_id), args::required("key", key)];
    (scope, token)
}

/// After a fenced statement changed nothing (before it on Citus: [`fenced`]): 42501 when the
/// record holds the caller's token (`scope_and_token`: scope, then token) and belongs to a role
/// the caller may not act on (guarantee 8: a token is a fence, not a password); else nothing (the
/// token is stale, a value, as for the owner's stale worker of a key another role has taken over
/// since). Must run inside [`plans::connected`]; nothing to check on a schema without owners.
fn refuse_stranger(catalog: &catalog::Catalog, scope_and_token: &[Option<Datum>], action: &str) {
    if catalog.rec.owner.is_none() {
        return;
    }
    if plans::execute(&catalog.plans, Stmt::ReadOwner, &scope_and_token[..4]) > 0 {
        owner::require(plans::first_row(1).map(owner::from_datum), action);
    }
}

/// Runs the fenced UPDATE `stmt` (Complete or Heartbeat) with `params` (scope, then token
/// first); answers whether it changed the record. 42501 for a record of a role the caller may
/// not act on: found by [`refuse_stranger`] after the statement changed nothing, or before it on
/// Citus, whose statement has no owner fence (plans.rs, `owns`). Must run inside
/// [`plans::connected`].
fn fenced(catalog: &catalog::Catalog, stmt: Stmt, params: &[Option<Datum>], action: &str) -> bool {
    if catalog.distributed {
        refuse_stranger(catalog, params, action);
    }
    let done = plans::execute(&catalog.plans, stmt, params) > 0;
    if !done && !catalog.distributed {
        refuse_stranger(catalog, params, action);
    }
    done
}

fn now() -> pg_sys::TimestampTz {
    // SAFETY: reads the clock.
    unsafe { pg_sys::GetCurrentTimestamp() }
}

v1_function_info!(pg_finfo_idem_complete_native);

/// `idem_complete(operation text, user_id text, key text, token bigint, response jsonb,
/// status text) RETURNS boolean`.
///
/// # Safety
/// Called by PostgreSQL's function manager with the 6 arguments declared in sql/native.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_complete_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: the declaration in sql/native.sql fixes the argument types read here.
    let ([operation, user_id, key], token) = unsafe { scope_and_token(fcinfo) };
    // SAFETY: as above.
    let (response, status, fn_oid) =
        unsafe { (call::datum(fcinfo, 4), call::text(fcinfo, 5, "status"), call::function_oid(fcinfo)) };
    let status = args::required("status", status);
    let Some(status) = Status::parse(status.str).ok().filter(|s| s.is_final()) else {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("status must be 'SUCCESS' or 'FAILED', got {}", call::echo(status.str)),
        );
    };
    if let Some(response) = response {
        let (limit, setting) = guc::max_response_bytes_named();
        let limit = i64::from(limit);
        // SAFETY: jsonb_out of a jsonb datum returns a palloc'd C string (its text form), in the
        // database's encoding: measured in UTF-8 bytes in every database (crate::encoding).
        let size = unsafe {
            let text = pg_sys::DirectFunctionCall1Coll(Some(call::builtins::jsonb_out), pg_sys::InvalidOid, response);
            let size = crate::encoding::utf8_len(std::ffi::CStr::from_ptr(text.cast_mut_ptr()).to_bytes());
            pg_sys::pfree(text.cast_mut_ptr());
            size as i64
        };
        if size > limit {
            // Never echo the value: it may be huge, and it may be private.
            raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("response must be at most {limit} bytes ({setting}), got {size}"),
            );
        }
    }
    let catalog = catalog::for_function(fn_oid);
    writable::require(&catalog, "complete a key");
    // After the update from 0.6.0: the key's record moved from idem_records_060 first.
    legacy::adopt(&catalog, operation, user_id, key, true);
    let now = now();
    // A reservation of this transaction not written yet: write it once, finished.
    let done = pending::complete(&catalog, &Scope { operation, user_id, key }, token, status, response, now) || {
        let params = [
            Some(operation.datum),
            Some(user_id.datum),
            Some(key.datum),
            Some(Datum::from(token)),
            Some(catalog.status_datum(status)),
            response,
            Some(Datum::from(now)),
            Some(Datum::from(owner::caller())),
        ];
        plans::connected(|| fenced(&catalog, Stmt::Complete, &params, "complete a key"))
    };
    let event = match (done, status) {
        (false, _) => "stale_tokens",
        (true, Status::Success) => "completions_success",
        (true, _) => "completions_failed",
    };
    metrics::add(event, 1);
    Datum::from(done)
}

v1_function_info!(pg_finfo_idem_release_native);

/// `idem_release(operation text, user_id text, key text, token bigint, max_retries integer)
/// RETURNS text`.
///
/// # Safety
/// Called by PostgreSQL's function manager with the 5 arguments declared in sql/native.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_release_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: the declaration in sql/native.sql fixes the argument types read here.
    let ([operation, user_id, key], token) = unsafe { scope_and_token(fcinfo) };
    // SAFETY: as above.
    let (max_retries, fn_oid) = unsafe { (call::arg::<i32>(fcinfo, 4), call::function_oid(fcinfo)) };
    let max_retries = args::_idem_max_retries(max_retries);
    let catalog = catalog::for_function(fn_oid);
    writable::require(&catalog, "release a key");
    // After the update from 0.6.0: the key's record moved from idem_records_060 first.
    legacy::adopt(&catalog, operation, user_id, key, true);
    let _ = pending::materialize(&catalog, &Scope { operation, user_id, key });
    let scope = [Some(operation.datum), Some(user_id.datum), Some(key.datum)];
    let outcome = plans::connected(|| {
        let lock = [scope[0], scope[1], scope[2], Some(Datum::from(token)), Some(Datum::from(owner::caller()))];
        if plans::execute(&catalog.plans, Stmt::LockForRelease, &lock) == 0 {
            refuse_stranger(&catalog, &lock, "release a key");
            metrics::add("stale_tokens", 1);
            return "stale".to_owned();
        }
        // The shared step (sql/internal.sql), also used by idem_recover_stuck: count the
        // failure, then poison or delete the record.
        let (created_at, expires_at) = (plans::first_row(1), plans::first_row(2));
        let step = [scope[0], scope[1], scope[2], created_at, expires_at, Some(Datum::from(max_retries))];
        plans::execute(&catalog.plans, Stmt::ReleaseLocked, &step);
        match plans::first_row(1) {
            // SAFETY: a text datum in SPI memory, copied out before SPI_finish frees it.
            Some(word) => unsafe { String::from_utf8_lossy(pgrx::varlena::varlena_to_byte_slice(
                pg_sys::pg_detoast_datum_packed(word.cast_mut_ptr()),
            )) }
            .into_owned(),
            None => raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, "_idem_release_locked answered NULL".into()),
        }
    });
    call::text_datum(outcome.as_bytes())
}

v1_function_info!(pg_finfo_idem_heartbeat_native);

/// `idem_heartbeat(operation text, user_id text, key text, token bigint, lease interval)
/// RETURNS boolean`.
///
/// # Safety
/// Called by PostgreSQL's function manager with the 5 arguments declared in sql/native.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_heartbeat_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    let now = now();
    // SAFETY: the declaration in sql/native.sql fixes the argument types read here.
    let ([operation, user_id, key], token) = unsafe { scope_and_token(fcinfo) };
    // SAFETY: as above.
    let (lease, fn_oid) = unsafe { (call::arg::<Interval>(fcinfo, 4), call::function_oid(fcinfo)) };
    // The lease's ceiling is the record's own: its expiry, or idempotency.ttl past now, whichever
    // is later (a record reserved with a ttl above the session's keeps a lease within that ttl,
    // as idem_reserve allowed it). The statement caps the default lease there and fences an
    // explicit one, which is 22023 past it (below). So a heartbeat cannot wedge a key for
    // longer than its reservation or one idempotency.ttl from now.
    let explicit = lease.is_some();
    let lease = args::_idem_lease(lease, None);
    let ttl = args::_idem_ttl(None);
    let until = call::plus(now, lease.into_datum().unwrap_or(Datum::from(0)));
    let ceiling = call::plus(now, ttl.into_datum().unwrap_or(Datum::from(0)));
    let catalog = catalog::for_function(fn_oid);
    writable::require(&catalog, "extend a lease");
    // After the update from 0.6.0: the key's record moved from idem_records_060 first.
    legacy::adopt(&catalog, operation, user_id, key, true);
    let _ = pending::materialize(&catalog, &Scope { operation, user_id, key });
    let params = [
        Some(operation.datum),
        Some(user_id.datum),
        Some(key.datum),
        Some(Datum::from(token)),
        Some(Datum::from(until)),
        Some(Datum::from(now)),
        Some(Datum::from(ceiling)),
        Some(Datum::from(explicit)),
        Some(Datum::from(owner::caller())),
    ];
    let done = plans::connected(|| {
        let done = fenced(&catalog, Stmt::Heartbeat, &params, "extend a lease");
        // Not extended, yet the caller's attempt holds the token: the explicit lease passed the
        // ceiling (else the token is stale, a value).
        if !done && explicit && plans::execute(&catalog.plans, Stmt::ReadProcessing, &params[..4]) > 0 {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("lease must not exceed the record's remaining ttl or idempotency.ttl ({ttl}), whichever is longer, got {lease}"),
            );
        }
        done
    });
    if !done {
        metrics::add("stale_tokens", 1);
    }
    Datum::from(done)
}
