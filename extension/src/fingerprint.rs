//! `idem_fingerprint(jsonb)`, `idem_fingerprint(text)` and `idem_fingerprint(bytea)`: thin
//! wrappers over the client crate's fingerprint module, so the server and the client compute the
//! same string by construction: over the request's UTF-8 text in any database encoding
//! ([`crate::encoding`]), as the client sends it.

use crate::args::raise;
use crate::encoding;
use idempotency_core::fingerprint::{Fingerprint, FingerprintError};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::{direct_function_call, FromDatum};
use std::ffi::CStr;

/// A `jsonb` argument as its exact text (`jsonb_out`). pgrx's `JsonB` parses into a
/// `serde_json::Value`, which would round numbers beyond f64 and break the canonical form.
pub(crate) struct JsonbText(String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: the caller hands us a jsonb datum (the SQL signature says so); jsonb_out
        // detoasts it and returns a palloc'd, NUL-terminated string in the database's encoding.
        let text = unsafe { direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)]) }?;
        // As UTF-8, as the client reads it: never lossily, or two requests would be one.
        Some(JsonbText(encoding::utf8("request", text.to_bytes()).to_owned()))
    }
}

// SAFETY: unboxed with FromDatum above, from a jsonb argument (the SQL declaration says so).
unsafe impl<'fcx> ArgAbi<'fcx> for JsonbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        // The SQL function is STRICT, so PostgreSQL never passes NULL here; be total anyway.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or(JsonbText(String::from("null")))
    }
}

pgrx::impl_sql_translatable!(JsonbText, arg_only = "jsonb");

// Every SQL-callable function here takes its argument as an `Option`: declared STRICT, but a
// NULL reaching a non-`Option` argument (a declaration without STRICT) would be pgrx's panic.

/// `idem_fingerprint(request jsonb) RETURNS text`
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _idem_fingerprint_jsonb(request: Option<JsonbText>) -> Option<String> {
    request.map(|request| fingerprint_json(&request.0))
}

fn fingerprint_json(text: &str) -> String {
    match Fingerprint::of_json_text(text) {
        Ok(fingerprint) => fingerprint.to_string(),
        // The limits (depth, and the canonical form's length against the text's): 54000,
        // raised before the canonical form is written.
        Err(e @ (FingerprintError::TooDeep | FingerprintError::TooLarge { .. })) => {
            raise(PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED, e.to_string())
        }
        // Only the text form can get here: a jsonb value is always valid JSON.
        Err(e) => raise(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE, e.to_string()),
    }
}

/// `idem_fingerprint(request bytea) RETURNS text`
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _idem_fingerprint_bytea(request: Option<&[u8]>) -> Option<String> {
    request.map(|request| Fingerprint::of_bytes(request).to_string())
}

/// `idem_fingerprint(request text) RETURNS text`: the text read as JSON, so an untyped literal
/// (`idem_fingerprint('{"amount": 100}')`) resolves here and equals the jsonb form. Read as the
/// database's bytes and converted to UTF-8 ([`encoding::utf8`]), never by pgrx's `&str`, which
/// panics on bytes that are not UTF-8.
#[pg_extern(sql = false, immutable, strict, parallel_safe)]
fn _idem_fingerprint_text(request: Option<&[u8]>) -> Option<String> {
    request.map(|request| fingerprint_json(encoding::utf8("request", request)))
}
