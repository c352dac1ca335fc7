//! The extension's settings. The argument rules (`args.rs`) read them natively; `sql/` reads
//! `max_response_bytes` through `_idem_max_response_bytes()`, and `_idem_setting()` shows any of
//! them (calling either loads this library, and with it these definitions).

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::prelude::*;
use std::cell::Cell;
use std::ffi::{c_int, c_void, CStr, CString};
use std::time::Duration;

pub(crate) static MAX_RESPONSE_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
/// `idempotency.max_response_bytes_limit` (PGC_SUSET): the ceiling of `max_response_bytes`,
/// which any role may set (lower, or up to this): only a superuser (or a role granted SET on
/// it) sets the ceiling.
static MAX_RESPONSE_BYTES_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024 * 1024);
/// `idempotency.ttl_limit` and `idempotency.lease_limit` (PGC_SUSET, seconds; 0, the default:
/// none): the longest ttl and lease any call gets, a setting's or an argument's.
pub(crate) static TTL_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(0);
pub(crate) static LEASE_LIMIT: GucSetting<i32> = GucSetting::<i32>::new(0);

/// The largest response `idem_complete` stores: `idempotency.max_response_bytes`, capped at
/// `idempotency.max_response_bytes_limit` (guarantee 8: a role may lower it, never raise it past
/// what a superuser set).
pub(crate) fn max_response_bytes() -> i32 {
    max_response_bytes_named().0
}

/// [`max_response_bytes`] with the setting that decided it, for messages.
pub(crate) fn max_response_bytes_named() -> (i32, &'static str) {
    let (setting, limit) = (MAX_RESPONSE_BYTES.get(), MAX_RESPONSE_BYTES_LIMIT.get());
    if setting > limit {
        (limit, "idempotency.max_response_bytes, capped by idempotency.max_response_bytes_limit")
    } else {
        (setting, "idempotency.max_response_bytes")
    }
}

// The maintenance worker's settings (PGC_SIGHUP: postgresql.conf or ALTER SYSTEM, then a reload).
static MAINTENANCE_DATABASES: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static MAINTENANCE_INTERVAL: GucSetting<i32> = GucSetting::<i32>::new(60);
static MAINTENANCE_BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static RECOVER_ACTION: GucSetting<RecoverAction> = GucSetting::<RecoverAction>::new(RecoverAction::Fail);

/// `idempotency.recover_action`: what the worker's `idem_recover_stuck` does with a stuck record.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RecoverAction {
    #[name = c"fail"]
    Fail,
    #[name = c"release"]
    Release,
}

impl RecoverAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RecoverAction::Fail => "fail",
            RecoverAction::Release => "release",
        }
    }
}

/// The maintenance settings as one value, so the launcher can tell when a reload changed them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Maintenance {
    /// `idempotency.maintenance_databases`: comma-separated, blanks around names ignored.
    pub(crate) databases: Vec<String>,
    /// `idempotency.maintenance_interval`; `None` when 0 (disabled).
    pub(crate) interval: Option<Duration>,
    pub(crate) batch_size: i32,
    pub(crate) action: RecoverAction,
}

impl Maintenance {
    pub(crate) fn current() -> Self {
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


/// A setting the API reads with `NULL` arguments, and the value a session gave it before this
/// library loaded when PostgreSQL could not take that value (it then warns and keeps the default;
/// the API instead raises 22023 naming the setting, as the portable install does, until the
/// session sets or resets it).
pub(crate) struct Setting {
    name: &'static CStr,
    pub(crate) value: &'static GucSetting<i32>,
    unit: GucFlags,
    refused: Cell<Option<String>>,
}

// SAFETY: a backend runs one thread; the `Cell` is only touched from it (register, the assign
// hooks and the API functions all run on the backend's main thread).
unsafe impl Sync for Setting {}

pub(crate) static TTL: Setting = Setting::new(c"idempotency.ttl", &TTL_VALUE, GucFlags::UNIT_S);
pub(crate) static LEASE: Setting = Setting::new(c"idempotency.lease", &LEASE_VALUE, GucFlags::UNIT_S);
pub(crate) static MAX_RETRIES: Setting = Setting::new(c"idempotency.max_retries", &MAX_RETRIES_VALUE, GucFlags::empty());

impl Setting {
    const fn new(name: &'static CStr, value: &'static GucSetting<i32>, unit: GucFlags) -> Self {
        Setting { name, value, unit, refused: Cell::new(None) }
    }

    /// The setting's value, or 22023 naming it when the session set it, before the library
    /// loaded, to a value it cannot take.
    pub(crate) fn get(&self) -> Result<i32, String> {
        match self.refused.take() {
            None => Ok(self.value.get()),
            Some(v) => {
                let message = format!("invalid value for parameter \"{}\": {}", self.name.to_string_lossy(), echo(&v));
                self.refused.set(Some(v));
                Err(message)
            }
        }
    }

    /// The placeholder a session set before the library loaded, if PostgreSQL will refuse it.
    /// An empty one (left by RESET) means the default, as PostgreSQL treats it.
    fn refused_placeholder(&self) -> Option<String> {
        // SAFETY: a valid C string; with missing_ok the call returns NULL when nothing is set.
        let raw = unsafe { pg_sys::GetConfigOption(self.name.as_ptr(), true, false) };
        if raw.is_null() {
            return None;
        }
        // SAFETY: GetConfigOption returns a NUL-terminated string that lives until the next
        // change of the setting; it is copied at once.
        let text = unsafe { CStr::from_ptr(raw) };
        let shown = text.to_string_lossy().into_owned();
        if shown.trim().is_empty() {
            return None;
        }
        let mut parsed: c_int = 0;
        // SAFETY: valid pointers; parse_int reads the string and writes the result.
        let ok = unsafe { pg_sys::parse_int(text.as_ptr(), &mut parsed, self.unit.bits(), std::ptr::null_mut()) };
        (!ok || parsed < 1).then_some(shown)
    }
}

/// A rejected value as error messages show it: quoted if at most 32 bytes, else its size.
fn echo(value: &str) -> String {
    if value.len() <= 32 { format!("'{}'", value.replace('\'', "''")) } else { format!("a {}-byte value", value.len()) }
}

static TTL_VALUE: GucSetting<i32> = GucSetting::<i32>::new(24 * 60 * 60);
static LEASE_VALUE: GucSetting<i32> = GucSetting::<i32>::new(5 * 60);
static MAX_RETRIES_VALUE: GucSetting<i32> = GucSetting::<i32>::new(3);

// Any assignment after the definition (SET, RESET, a rollback restoring a value) replaces a
// refused placeholder.
#[pg_guard]
unsafe extern "C-unwind" fn ttl_assigned(_value: c_int, _extra: *mut c_void) {
    TTL.refused.set(None);
}
#[pg_guard]
unsafe extern "C-unwind" fn lease_assigned(_value: c_int, _extra: *mut c_void) {
    LEASE.refused.set(None);
}
#[pg_guard]
unsafe extern "C-unwind" fn max_retries_assigned(_value: c_int, _extra: *mut c_void) {
    MAX_RETRIES.refused.set(None);
}

pub(crate) fn register() {
    let definitions: [(&Setting, &'static CStr, &'static CStr, pg_sys::GucIntAssignHook); 3] = [
        (
            &TTL,
            c"How long a record is kept, counted from its reservation, when idem_reserve gets ttl => NULL.",
            c"After it an idempotency key may be reused and the record swept.",
            Some(ttl_assigned),
        ),
        (
            &LEASE,
            c"How long an attempt holds a key before idem_recover_stuck may take it, when lease => NULL.",
            c"Defaulted leases are capped at the record's ttl; idem_heartbeat extends a lease.",
            Some(lease_assigned),
        ),
        (
            &MAX_RETRIES,
            c"Transient failures after which a key is poisoned (FAILED), when max_retries => NULL.",
            c"",
            Some(max_retries_assigned),
        ),
    ];
    for (setting, short, long, assigned) in definitions {
        // Read before the definition replaces the placeholder; remembered after it, because the
        // definition itself assigns the default (and so runs the hook).
        let refused = setting.refused_placeholder();
        // SAFETY: the hooks are #[pg_guard] and only reset a Cell.
        unsafe {
            GucRegistry::define_int_guc_with_hooks(
                setting.name,
                short,
                long,
                setting.value,
                1,
                i32::MAX,
                GucContext::Userset,
                setting.unit,
                None,
                assigned,
                None,
            );
        }
        setting.refused.set(refused);
    }
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
    GucRegistry::define_int_guc(
        c"idempotency.max_response_bytes_limit",
        c"The ceiling of idempotency.max_response_bytes: a larger setting counts as this.",
        c"Any role may lower idempotency.max_response_bytes; only a superuser sets this ceiling.",
        &MAX_RESPONSE_BYTES_LIMIT,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"idempotency.ttl_limit",
        c"The longest ttl a call gets: a longer idempotency.ttl counts as this, a longer ttl argument is refused; 0: none.",
        c"Any role may lower idempotency.ttl; only a superuser sets this ceiling.",
        &TTL_LIMIT,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"idempotency.lease_limit",
        c"The longest lease a call gets: a longer idempotency.lease counts as this, a longer lease argument is refused; 0: none.",
        c"Any role may lower idempotency.lease; only a superuser sets this ceiling.",
        &LEASE_LIMIT,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_S,
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
    // From 15 the prefix is reserved: a misspelt `idempotency.*` name is an error. 14 has only
    // the older call, which warns about placeholders that exist now and reserves nothing, so a
    // misspelt name set later is accepted as a placeholder (CONTRIBUTING.md, "Supported PostgreSQL majors").
    // SAFETY: a valid, static C string; called once, from _PG_init.
    #[cfg(not(feature = "pg14"))]
    unsafe {
        pg_sys::MarkGUCPrefixReserved(c"idempotency".as_ptr())
    };
    #[cfg(feature = "pg14")]
    unsafe {
        pg_sys::EmitWarningsOnPlaceholders(c"idempotency".as_ptr())
    };
}

/// `_idem_setting(name text) RETURNS text`: the current value of a setting, as `current_setting`
/// shows it. Calling it loads this library, which defines the `idempotency.*` settings. Name and
/// value stay the database's bytes (a text datum is laid out as a bytea one), never read as a
/// Rust string: a name or a value need not be UTF-8 ([`crate::encoding`]).
#[pg_extern(sql = false)]
fn _idem_setting(name: Option<&[u8]>) -> Option<Vec<u8>> {
    // STRICT, but total: a NULL name is a NULL value.
    let name = CString::new(name?).ok()?;
    // SAFETY: a valid C string; with missing_ok the call returns NULL rather than raising.
    unsafe {
        let value = pg_sys::GetConfigOptionByName(name.as_ptr(), std::ptr::null_mut(), true);
        if value.is_null() {
            None
        } else {
            Some(CStr::from_ptr(value).to_bytes().to_vec())
        }
    }
}

/// `_idem_max_response_bytes() RETURNS integer`: `idempotency.max_response_bytes` in bytes,
/// capped at `idempotency.max_response_bytes_limit`
/// (`current_setting` shows it with a unit, such as `1MB`, that `pg_size_bytes` cannot read on 15).
#[pg_extern(sql = false)]
fn _idem_max_response_bytes() -> i32 {
    max_response_bytes()
}
