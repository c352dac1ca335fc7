//! The argument rules of the SQL API, checked natively: the key rules are the client crate's
//! `key` module (one source for the client and the server), the durations and retry limits
//! are settled here from the GUCs. The PL/pgSQL API calls these once per call, as cheap
//! expressions; each raises the documented SQLSTATE with a message naming the argument and the
//! rule, and returns its (settled) value otherwise.

use crate::encoding;
use crate::guc;
use crate::native::call::{self, v1_function_info};
use idempotency_core::key::{self, KeyError};
use pgrx::datum::Interval;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;

/// ttl and lease are at most this long: far beyond any real use, and short of timestamptz
/// overflow (which would be 22008 instead of a message naming the argument).
const MAX_YEARS: i32 = 1000;
const USECS_PER_DAY: i128 = 86_400_000_000;

/// Raises `message` (UTF-8, made readable in the database's encoding: [`encoding::message`])
/// with SQLSTATE `code`.
#[allow(unreachable_code)] // ereport!(ERROR) diverges, but is typed `()`
pub(crate) fn raise(code: PgSqlErrorCode, message: String) -> ! {
    ereport!(ERROR, code, encoding::message(message));
    unreachable!("ereport(ERROR) returned")
}

pub(crate) fn required<T>(name: &str, value: Option<T>) -> T {
    value.unwrap_or_else(|| raise(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("{name} must not be NULL")))
}

fn refuse(e: KeyError) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.to_string())
}

/// The key rules of `operation`, `user_id` and `key` (as UTF-8: [`encoding::utf8`]): true, or
/// the error of the first argument that breaks them. The native functions call it with their
/// arguments; SQL calls it through [`_idem_check_scope_wrapper`].
pub(crate) fn _idem_check_scope(operation: Option<&str>, user_id: Option<&str>, key: Option<&str>) -> bool {
    for (name, value) in [("operation", operation), ("user_id", user_id), ("key", key)] {
        key::check_part(name, required(name, value)).unwrap_or_else(|e| refuse(e));
    }
    true
}

/// The rule of `request_hash` (as UTF-8): true, or 22004/22023. SQL calls it through
/// [`_idem_check_request_hash_wrapper`].
pub(crate) fn _idem_check_request_hash(request_hash: Option<&str>) -> bool {
    key::check_request_hash(required("request_hash", request_hash)).unwrap_or_else(|e| refuse(e));
    true
}

v1_function_info!(pg_finfo__idem_check_scope_wrapper);

/// `_idem_check_scope(operation text, user_id text, key text) RETURNS boolean` (the symbol
/// every released install script names): each argument read as UTF-8 naming itself
/// ([`call::text`]), then [`_idem_check_scope`].
///
/// # Safety
/// Called by PostgreSQL's function manager with the 3 text arguments declared in sql/internal.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn _idem_check_scope_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the declaration fixes the argument types.
    let (operation, user_id, key) =
        unsafe { (call::text(fcinfo, 0, "operation"), call::text(fcinfo, 1, "user_id"), call::text(fcinfo, 2, "key")) };
    pg_sys::Datum::from(_idem_check_scope(operation.map(|t| t.str), user_id.map(|t| t.str), key.map(|t| t.str)))
}

v1_function_info!(pg_finfo__idem_check_request_hash_wrapper);

/// `_idem_check_request_hash(request_hash text) RETURNS boolean`: the argument read as UTF-8,
/// then [`_idem_check_request_hash`].
///
/// # Safety
/// Called by PostgreSQL's function manager with the text argument declared in sql/internal.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn _idem_check_request_hash_wrapper(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
    // SAFETY: the declaration fixes the argument type.
    let request_hash = unsafe { call::text(fcinfo, 0, "request_hash") };
    pg_sys::Datum::from(_idem_check_request_hash(request_hash.map(|t| t.str)))
}

/// `_idem_check_step(step integer) RETURNS boolean`: the step of a recovery point
/// (`idem_checkpoint`), on the core crate's rule: true, or 22004 for NULL, 22023 below 0.
#[pg_extern(sql = false, immutable, parallel_safe)]
pub(crate) fn _idem_check_step(step: Option<i32>) -> bool {
    key::check_recovery_step(required("step", step)).unwrap_or_else(|e| refuse(e));
    true
}

/// `_idem_require(name text, is_null boolean) RETURNS boolean`: true, or 22004 naming `name`
/// (read as the database's bytes, converted: [`encoding::utf8`]; a NULL name shows as `<NULL>`,
/// as PL/pgSQL's RAISE shows it in the portable twin). Not STRICT, so every argument may be
/// NULL: a non-`Option` one would be pgrx's panic (XX000) instead.
#[pg_extern(sql = false, immutable, parallel_safe)]
pub(crate) fn _idem_require(name: Option<&[u8]>, is_null: Option<bool>) -> bool {
    if is_null != Some(false) {
        let name = name.map_or("<NULL>", |name| encoding::utf8("name", name));
        raise(PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, format!("{name} must not be NULL"));
    }
    true
}

/// An interval's length as PostgreSQL compares intervals (a month is 30 days).
fn span(i: &Interval) -> i128 {
    i128::from(i.micros()) + (i128::from(i.days()) + i128::from(i.months()) * 30) * USECS_PER_DAY
}

/// A number of seconds as the interval `current_setting()` shows it: whole days as days (`1d`
/// is `1 day`, which keeps its calendar meaning across a DST change), anything else as time.
fn interval_of(s: i32) -> Interval {
    let (days, secs) = if s % 86_400 == 0 { (s / 86_400, 0) } else { (0, s) };
    Interval::new(0, days, i64::from(secs) * 1_000_000).unwrap_or_else(|e| raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, e.to_string()))
}

/// A setting in seconds, as an interval ([`interval_of`]), capped at its ceiling (`limit`, a
/// superuser's `idempotency.*_limit`; 0: none): a role may lower its setting, never raise it
/// past what a superuser set (guarantee 8).
fn seconds(setting: &guc::Setting, limit: &pgrx::guc::GucSetting<i32>) -> Interval {
    let s = setting.get().unwrap_or_else(|message| raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message));
    match limit.get() {
        l if l > 0 && l < s => interval_of(l),
        _ => interval_of(s),
    }
}

/// An explicit ttl or lease within its ceiling (`limit`, named `limit_name`; 0: none), or 22023.
fn within(name: &str, value: Interval, limit: &pgrx::guc::GucSetting<i32>, limit_name: &str) -> Interval {
    let l = limit.get();
    if l > 0 && span(&value) > i128::from(l) * 1_000_000 {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{name} must be at most {} ({limit_name}), got {value}", interval_of(l)),
        );
    }
    value
}

/// An explicit duration, checked: positive and at most 1000 years.
fn checked(name: &str, value: Interval) -> Interval {
    if span(&value) <= 0 {
        raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("{name} must be a positive interval, got {value}"));
    }
    // 1000 years compare as 12,000 months of 30 days, as PostgreSQL compares them.
    if span(&value) > i128::from(MAX_YEARS) * 12 * 30 * USECS_PER_DAY {
        raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("{name} must be at most {MAX_YEARS} years, got {value}"));
    }
    value
}

/// `_idem_ttl(ttl interval) RETURNS interval`: an explicit ttl, checked (and at most
/// `idempotency.ttl_limit`, when set), or `idempotency.ttl` (capped at that ceiling).
#[pg_extern(sql = false, stable, parallel_safe)]
pub(crate) fn _idem_ttl(ttl: Option<Interval>) -> Interval {
    match ttl {
        Some(ttl) => within("ttl", checked("ttl", ttl), &guc::TTL_LIMIT, "idempotency.ttl_limit"),
        None => seconds(&guc::TTL, &guc::TTL_LIMIT),
    }
}

/// `_idem_lease(lease interval, ttl interval) RETURNS interval`: an explicit lease, checked and
/// at most the (settled) ttl; or `idempotency.lease` capped at the ttl. With a NULL ttl the
/// lease is settled on its own. Both within `idempotency.lease_limit`, when set, as `_idem_ttl`.
#[pg_extern(sql = false, stable, parallel_safe)]
pub(crate) fn _idem_lease(lease: Option<Interval>, ttl: Option<Interval>) -> Interval {
    let default = || seconds(&guc::LEASE, &guc::LEASE_LIMIT);
    let explicit = |lease| within("lease", checked("lease", lease), &guc::LEASE_LIMIT, "idempotency.lease_limit");
    match (lease, ttl) {
        (Some(lease), Some(ttl)) => {
            let lease = explicit(lease);
            if span(&lease) > span(&ttl) {
                raise(
                    PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                    format!("lease must not exceed ttl, got lease {lease} and ttl {ttl}"),
                );
            }
            lease
        }
        (Some(lease), None) => explicit(lease),
        (None, Some(ttl)) => {
            let lease = default();
            if span(&lease) > span(&ttl) { ttl } else { lease }
        }
        (None, None) => default(),
    }
}

/// `_idem_max_retries(max_retries integer) RETURNS integer`: an explicit value, at least 1, or
/// `idempotency.max_retries`.
#[pg_extern(sql = false, stable, parallel_safe)]
pub(crate) fn _idem_max_retries(max_retries: Option<i32>) -> i32 {
    match max_retries {
        Some(n) if n < 1 => raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, format!("max_retries must be at least 1, got {n}")),
        Some(n) => n,
        None => guc::MAX_RETRIES.get().unwrap_or_else(|message| raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, message)),
    }
}
