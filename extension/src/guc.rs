//! The extension's settings. `sql/` reads them with `current_setting()`, falling back to
//! `_idem_setting()` (which loads this library, and with it these definitions) when a session
//! has not loaded the library yet.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::prelude::*;
use std::ffi::CString;
use std::time::Duration;

static TTL: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60);
static LEASE: GucSetting<i32> = GucSetting::<i32>::new(5 * 60);
static MAX_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(3);
static MAX_RESPONSE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);

// The maintenance worker's settings (PGC_SIGHUP: postgresql.conf or ALTER SYSTEM, then a reload).
static MAINTENANCE_DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static MAINTENANCE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
static MAINTENANCE_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static RECOVER_ACTION: GucSetting<RecoverAction> = GucSetting::<RecoverAction>::new(RecoverAction::Fail);

/// `idempotency.recover_action`: what the worker's `idem_recover_stuck` does with a stuck record.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum RecoverAction {
    #[name = c"fail"]
    Fail,
    #[name = c"release"]
    Release,
}

impl RecoverAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RecoverAction::Fail => "fail",
            RecoverAction::Release => "release",
        }
    }
}

/// The maintenance settings as one value, so the launcher can tell when a reload changed them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Maintenance {
    /// `idempotency.maintenance_databases`: comma-separated, blanks around names ignored.
    pub databases: Vec<String>,
    /// `idempotency.maintenance_interval`; `None` when 0 (disabled).
    pub interval: Option<Duration>,
    pub batch_size: i32,
    pub action: RecoverAction,
}

impl Maintenance {
    pub fn current() -> Self {
        let databases = MAINTENANCE_DATABASES
            .get()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let seconds = MAINTENANCE_INTERVAL.get();
        Maintenance {
            databases: databases.split(',').map(str::trim).filter(|d| !d.is_empty()).map(String::from).collect(),
            interval: (seconds > 0).then(|| Duration::from_secs(seconds.unsigned_abs().into())),
            batch_size: MAINTENANCE_BATCH_SIZE.get(),
            action: RECOVER_ACTION.get(),
        }
    }
}

pub fn register() {
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
    GucRegistry::define_string_guc(
        c"idempotency.maintenance_databases",
        c"Databases the maintenance worker recovers and sweeps, comma-separated.",
        c"Empty: the worker idles. Needs idempotency in shared_preload_libraries.",
        &MAINTENANCE_DATABASES,
        GucContext::Sighup,
        GucFlags::empty(),
    );
    GucRegistry::define_int_guc(
        c"idempotency.maintenance_interval",
        c"Time between the starts of two maintenance passes; 0 disables the worker.",
        c"",
        &MAINTENANCE_INTERVAL,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.maintenance_batch_size",
        c"Rows per maintenance transaction (the batch_size of idem_recover_stuck and idem_sweep).",
        c"",
        &MAINTENANCE_BATCH_SIZE,
        1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::empty(),
    );
    GucRegistry::define_enum_guc(
        c"idempotency.recover_action",
        c"The action of the maintenance worker's idem_recover_stuck: fail or release.",
        c"",
        &RECOVER_ACTION,
        GucContext::Sighup,
        GucFlags::empty(),
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
