//! The extension's settings. `sql/` reads them with `current_setting()`, falling back to
//! `_idem_setting()` (which loads this library, and with it these definitions) when a session
//! has not loaded the library yet.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;
use std::ffi::CString;

pub(crate) static TTL: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60);
pub(crate) static LEASE: GucSetting<i32> = GucSetting::<i32>::new(5 * 60);
pub(crate) static MAX_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(3);
pub(crate) static MAX_RESPONSE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

pub(crate) fn register() {
    GucRegistry::define_int_guc(
        c"idempotency.ttl",
        c"How long a record is kept, counted from its reservation, when idem_reserve gets ttl => NULL.",
        c"After it an idempotency key may be reused and the record swept.",
        &TTL,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.lease",
        c"How long an attempt holds a key before idem_recover_stuck may take it, when lease => NULL.",
        c"Defaulted leases are capped at the record's ttl; idem_heartbeat extends a lease.",
        &LEASE,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_retries",
        c"Transient failures after which a key is poisoned (FAILED), when max_retries => NULL.",
        c"",
        &MAX_RETRIES,
        1,
        i32::MAX,
        GucContext::Userset,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.max_response_bytes",
        c"The largest response idem_complete stores, as bytes of its jsonb text.",
        c"",
        &MAX_RESPONSE_BYTES,
        0,
        i32::MAX,
        GucContext::Userset,
        GucFlags::UNIT_BYTE,
    );
    unsafe { pg_sys::MarkGUCPrefixReserved(c"idempotency".as_ptr()) };
}

/// `_idem_setting(name text) RETURNS text`: the current value of a setting, as `current_setting`
/// shows it. Calling it loads this library, which defines the `idempotency.*` settings.
#[pg_extern(sql = false)]
fn _idem_setting(name: &str) -> Option<String> {
    let name = CString::new(name).ok()?;
    // SAFETY: a valid C string; with missing_ok the call returns NULL rather than raising.
    unsafe {
        let value = pg_sys::GetConfigOptionByName(name.as_ptr(), std::ptr::null_mut(), true);
        if value.is_null() {
            None
        } else {
            Some(std::ffi::CStr::from_ptr(value).to_string_lossy().into_owned())
        }
    }
}

/// `_idem_max_response_bytes() RETURNS integer`: `idempotency.max_response_bytes` in bytes
/// (`current_setting` shows it with a unit, such as `1MB`, that `pg_size_bytes` cannot read on 15).
#[pg_extern(sql = false)]
fn _idem_max_response_bytes() -> i32 {
    MAX_RESPONSE_BYTES.get()
}
