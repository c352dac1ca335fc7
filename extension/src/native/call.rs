//! Reading the arguments of a V1 call and building its answer.

use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;

/// Declares the `pg_finfo_*` record PostgreSQL looks up to learn that a C function uses the
/// version-1 calling convention (what `PG_FUNCTION_INFO_V1` does in C).
macro_rules! v1_function_info {
    ($finfo:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        #[allow(unreachable_pub)] // exported to PostgreSQL by its symbol name
        pub extern "C" fn $finfo() -> &'static pgrx::pg_sys::Pg_finfo_record {
            const V1: pgrx::pg_sys::Pg_finfo_record = pgrx::pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}
pub(crate) use v1_function_info;

/// SQL-callable builtins of the server, called through `DirectFunctionCall*Coll` (which needs
/// their C entry points; pgrx's `pg_sys` exposes them only as guarded Rust wrappers).
pub(crate) mod builtins {
    use pgrx::pg_sys::{Datum, FunctionCallInfo};
    extern "C-unwind" {
        pub(crate) fn timestamptz_pl_interval(fcinfo: FunctionCallInfo) -> Datum;
        pub(crate) fn jsonb_out(fcinfo: FunctionCallInfo) -> Datum;
        pub(crate) fn hashtextextended(fcinfo: FunctionCallInfo) -> Datum;
        pub(crate) fn pg_advisory_xact_lock_int8(fcinfo: FunctionCallInfo) -> Datum;
        pub(crate) fn pg_try_advisory_xact_lock_int8(fcinfo: FunctionCallInfo) -> Datum;
        pub(crate) fn nextval_oid(fcinfo: FunctionCallInfo) -> Datum;
    }
}

/// A text argument, detoasted: its datum (for scan keys and SPI parameters), its bytes in the
/// database's encoding (what is compared with and written to the tables) and its text as UTF-8
/// (what the rules check and messages show; the same bytes in a UTF-8 database:
/// [`crate::encoding`]).
#[derive(Clone, Copy)]
pub(crate) struct Text<'a> {
    pub(crate) datum: Datum,
    pub(crate) bytes: &'a [u8],
    pub(crate) str: &'a str,
}

/// The text argument `n` named `name`, or `None` when it is NULL.
///
/// # Safety
/// `fcinfo` is the call's valid `FunctionCallInfo` and argument `n` is declared `text`.
pub(crate) unsafe fn text<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize, name: &str) -> Option<Text<'a>> {
    // SAFETY: the caller guarantees a valid fcinfo with a text argument n.
    let raw = unsafe { pgrx::fcinfo::pg_getarg_datum(fcinfo, n) }?;
    // SAFETY: a non-NULL text datum is a varlena; detoasting it gives a varlena in the current
    // memory context (or the argument itself), alive for the rest of the call.
    let (varlena, bytes) = unsafe {
        let varlena = pg_sys::pg_detoast_datum_packed(raw.cast_mut_ptr());
        (varlena, pgrx::varlena::varlena_to_byte_slice(varlena))
    };
    Some(Text { datum: Datum::from(varlena), bytes, str: crate::encoding::utf8(name, bytes) })
}

/// Argument `n` converted by pgrx, or `None` when it is NULL.
///
/// # Safety
/// `fcinfo` is the call's valid `FunctionCallInfo` and argument `n` has the SQL type of `T`.
pub(crate) unsafe fn arg<T: FromDatum>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<T> {
    // SAFETY: the caller guarantees the argument's type.
    unsafe { pgrx::fcinfo::pg_getarg::<T>(fcinfo, n) }
}

/// The raw datum of argument `n`, or `None` when it is NULL.
///
/// # Safety
/// `fcinfo` is the call's valid `FunctionCallInfo` with at least `n + 1` arguments.
pub(crate) unsafe fn datum(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<Datum> {
    // SAFETY: guaranteed by the caller.
    unsafe { pgrx::fcinfo::pg_getarg_datum(fcinfo, n) }
}

/// The OID of the function being called.
///
/// # Safety
/// `fcinfo` is a valid `FunctionCallInfo` whose `flinfo` is set (always, for SQL calls).
pub(crate) unsafe fn function_oid(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Oid {
    // SAFETY: guaranteed by the caller.
    unsafe { (*(*fcinfo).flinfo).fn_oid }
}

/// A new `text` datum in the current memory context.
pub(crate) fn text_datum(s: &[u8]) -> Datum {
    let len = i32::try_from(s.len())
        .unwrap_or_else(|_| raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, "text too long".into()));
    // SAFETY: s is len readable bytes; the function copies them into a palloc'd text.
    Datum::from(unsafe { pg_sys::cstring_to_text_with_len(s.as_ptr().cast(), len) })
}

/// A timestamptz plus an interval, exactly as the SQL `+` computes it (calendar months and
/// days in the session's time zone).
pub(crate) fn plus(ts: pg_sys::TimestampTz, interval: Datum) -> pg_sys::TimestampTz {
    // SAFETY: timestamptz_pl_interval takes a by-value timestamptz and an Interval pointer
    // (`interval` is one, built by the caller) and needs no flinfo or collation.
    let sum = unsafe {
        pg_sys::DirectFunctionCall2Coll(Some(builtins::timestamptz_pl_interval), pg_sys::InvalidOid, Datum::from(ts), interval)
    };
    sum.value() as pg_sys::TimestampTz
}

/// How an error message shows a rejected word (the rule of `_idem_echo`): quoted if at most 32
/// bytes (of UTF-8), otherwise only its size, so a huge argument is never echoed; by its size
/// too when it is not ASCII in a database that is not UTF-8 ([`crate::encoding`]).
pub(crate) fn echo(value: &str) -> String {
    if value.len() > 32 || !(value.is_ascii() || crate::encoding::utf8_database()) {
        return format!("a {}-byte value", value.len());
    }
    let Ok(c) = std::ffi::CString::new(value) else {
        return format!("a {}-byte value", value.len());
    };
    // SAFETY: a valid C string; quote_literal_cstr returns a palloc'd C string.
    unsafe { std::ffi::CStr::from_ptr(pg_sys::quote_literal_cstr(c.as_ptr())) }.to_string_lossy().into_owned()
}
