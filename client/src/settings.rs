//! The defaults of every call of a handle.

use crate::cache::ReplayCache;
use std::time::Duration;

/// The isolation level of `run`'s transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Isolation {
    /// `READ COMMITTED`, the supported level.
    ReadCommitted,
    /// `REPEATABLE READ`: a duplicate that committed after the snapshot surfaces as 40001 and
    /// the whole transaction is retried.
    RepeatableRead,
    /// `SERIALIZABLE`: as `REPEATABLE READ`.
    Serializable,
}

impl Isolation {
    /// The `BEGIN` statement of this level (`None`: the server's default).
    pub(crate) fn begin_sql(level: Option<Isolation>) -> &'static str {
        match level {
            None => "BEGIN",
            Some(Isolation::ReadCommitted) => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Some(Isolation::RepeatableRead) => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Some(Isolation::Serializable) => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// The defaults of every call of a handle. `None` durations and retries mean the server's
/// `idempotency.*` settings. Build with [`Settings::builder`] (or start from
/// [`Settings::default`] and set the public fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// The schema the extension is installed in. `None`: looked up once in `pg_extension` on
    /// first use. Every call is qualified with it; the `search_path` is never changed.
    pub schema: Option<String>,
    /// How long a record is kept (`idempotency.ttl` when None).
    pub ttl: Option<Duration>,
    /// The lease of `run`. `run_external` always sends an explicit lease (this, or 60 s) because
    /// it heartbeats at a third of it.
    pub lease: Option<Duration>,
    /// Transient failures before a key is poisoned (`idempotency.max_retries` when None).
    pub max_retries: Option<i32>,
    /// Wait for the key's holder instead of answering `InProgress` at once, in `run`,
    /// `run_statement` and `run_external` (and the layer's both modes), until the holder
    /// completes (replayed), fails (`Failed`) or gives the key up (the call takes it and runs),
    /// or until [`Settings::wait_timeout`] (then `InProgress`); a mismatch is answered at once.
    /// A committed holder (a two-phase attempt while its outside call runs) is polled: the call
    /// reserves again after a pause (20 ms, doubling up to 250 ms, half of each random), each
    /// poll one round trip on a pooled connection, and between polls it holds nothing (no
    /// connection, no transaction, no lock). An uncommitted holder (another transaction's
    /// reservation) is waited for in the server, holding a pooled connection blocked on the
    /// key's lock, as before 0.7.0 (`run_statement` and `run_batch`, whose statements also run
    /// your writes, only within `call_timeout`). Default `false`.
    pub wait: bool,
    /// The bound of [`Settings::wait`]: how long a call waits for the key's holder before it
    /// answers `InProgress`, counted from its first reservation (its wait for a pooled
    /// connection does not count). Default 5 s; shorter than [`Settings::call_timeout`]
    /// (checked).
    pub wait_timeout: Duration,
    /// The `Retry-After` hint of `InProgress` and `LeaseLost`.
    pub retry_after: Duration,
    /// How many times a whole transaction is retried after 40001 / 40P01 (wherever they arise,
    /// the closure included), and how many times `run_external` retries its local transaction
    /// after a transient database error.
    pub serialization_retries: u32,
    /// The isolation level of `run`'s transaction (None: the server default, normally READ
    /// COMMITTED).
    pub isolation: Option<Isolation>,
    /// An in-process cache of completed answers, consulted before the database by `run`,
    /// `run_external` and the layer (None, the default: every call goes to the database). See
    /// [`ReplayCache`] for what it trades.
    pub replay_cache: Option<ReplayCache>,
    /// Replay first: `run` (and the layer's in-transaction mode) first asks the extension's
    /// read-only `idem_replay` on a pooled connection outside any transaction, and returns its
    /// answer when the key's record is final (replayed, `Failed`, `Mismatch`); only otherwise
    /// does it open the transaction and reserve. A replay then costs one round trip with nothing
    /// queued behind it (no `BEGIN`, no `ROLLBACK`), and a fresh request one round trip more. On
    /// for retry-heavy traffic, where most calls are replays; off (the default) where most
    /// requests are fresh. `run_statement`, `run_external`, `run_steps` and the layer's
    /// two-phase mode reserve in autocommit already (a replay is one round trip) and
    /// `run_batch` reserves its keys in one statement: this setting does not change them. Needs
    /// the extension at 0.7.0 or later (`idem_replay`); the repository's docs/performance.md,
    /// "Replay first", has the figures.
    pub replay_first: bool,
    /// The deadline of every call of the handle (`run`, `run_batch`, `run_statement`,
    /// `check_extension`, `schema`, and the layer's calls): when it passes, the call ends in
    /// [`crate::Error::StoreUnavailable`] whose source is an [`crate::Elapsed`] naming this
    /// setting, and its future is dropped (a connection dropped mid-request is closed, so the
    /// server rolls its transaction back and the key is free again). For `run` it covers your
    /// closure too. `run_external` (and the layer's two-phase mode) does not cut the outside call
    /// once it started: the bound applies to the database steps before it, and afresh to those
    /// after it ended. Default 30 s: longer than any call on a healthy store with the other
    /// defaults (a pool wait and a connect of 5 s each, a few round trips), shorter than an
    /// HTTP client's usual patience; `None` waits as long as the server and the network let it
    /// (see [`Settings::keepalives_idle`]).
    pub call_timeout: Option<Duration>,
    /// For a pool made by a constructor (`Idempotency::from_url`, either driver):
    /// how long a call waits for a free connection when every one is busy, then
    /// [`crate::Error::StoreUnavailable`]. Default 5 s.
    pub pool_timeout: Duration,
    /// For a pool made by a constructor: how long opening a connection may take (the URL's
    /// `connect_timeout`, in seconds, when it names one), then
    /// [`crate::Error::StoreUnavailable`]. Default 5 s. The sqlx driver bounds the wait for a
    /// connection and the opening of one together: its pool's acquire timeout is the sum of this
    /// and [`Settings::pool_timeout`].
    pub connect_timeout: Duration,
    /// For a pool made by the tokio-postgres constructor: TCP keepalives on its connections,
    /// the first probe after this much silence, then every 10 s, and 3 unanswered probes close
    /// the connection (so a server that stopped answering at the TCP level is noticed 90 s
    /// after the silence began, even in the middle of a call). The URL's `keepalives` (0 or 1),
    /// `keepalives_idle`, `keepalives_interval` and `keepalives_retries` (seconds, counts), when
    /// it names them, win. `None`: no keepalives. Default 60 s. The sqlx driver opens its
    /// sockets itself and has no keepalive option: this setting does not apply to it, and a URL
    /// naming keepalives is refused with [`crate::Error::Configuration`] (its calls are bounded
    /// by [`Settings::call_timeout`]).
    pub keepalives_idle: Option<Duration>,
    /// For a pool made by a constructor (either driver): the server's `statement_timeout` on
    /// its connections, sent when connecting (`-c statement_timeout=..`), which bounds every
    /// statement (yours in a closure included): the server cancels one that runs longer, and
    /// the call fails with its error (SQLSTATE 57014). A URL whose `options` set
    /// `statement_timeout` wins. Default `None`: the server's own setting (0, no bound, unless
    /// configured there).
    pub statement_timeout: Option<Duration>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            schema: None,
            ttl: None,
            lease: None,
            max_retries: None,
            wait: false,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            retry_after: Duration::from_secs(1),
            serialization_retries: 5,
            isolation: None,
            replay_cache: None,
            replay_first: false,
            call_timeout: Some(DEFAULT_CALL_TIMEOUT),
            pool_timeout: DEFAULT_POOL_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            keepalives_idle: Some(DEFAULT_KEEPALIVES_IDLE),
            statement_timeout: None,
        }
    }
}

impl Settings {
    /// A [`SettingsBuilder`] from the defaults. Every constructor (and the layer's) takes
    /// `impl Into<Settings>`, so a builder is passed as it is, without [`SettingsBuilder::build`]:
    /// `Idempotency::from_url(url, 16, Settings::builder().ttl(day))`.
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder::default()
    }
}

/// [`Settings`] being built: one method per setting, then [`SettingsBuilder::build`] (or pass
/// the builder where `impl Into<Settings>` is taken). Start from other settings with
/// `SettingsBuilder::from(settings)`.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct SettingsBuilder {
    settings: Settings,
}

impl SettingsBuilder {
    /// The settings.
    pub fn build(self) -> Settings {
        self.settings
    }
}

impl From<SettingsBuilder> for Settings {
    fn from(builder: SettingsBuilder) -> Settings {
        builder.build()
    }
}

impl From<Settings> for SettingsBuilder {
    fn from(settings: Settings) -> SettingsBuilder {
        SettingsBuilder { settings }
    }
}

/// The setters of [`SettingsBuilder`], written once, and their deprecated twins on [`Settings`]
/// (up to 0.6.0 `Settings::builder()` returned a `Settings`, and these methods were on it).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;)*) => {
        impl SettingsBuilder {
            $(
                $(#[$doc])*
                pub fn $name(mut self, $arg: $ty) -> Self {
                    self.settings.$field = $value;
                    self
                }
            )*
        }

        impl Settings {
            $(
                #[doc = concat!("Deprecated: [`SettingsBuilder::", stringify!($name), "`].")]
                #[deprecated(since = "0.7.0", note = "Settings::builder() returns a SettingsBuilder: call this on it, or set the public field")]
                pub fn $name(self, $arg: $ty) -> Self {
                    SettingsBuilder::from(self).$name($arg).build()
                }
            )*
        }
    };
}

setters! {
    /// See [`Settings::schema`].
    schema(schema: impl Into<String>) => schema = Some(schema.into());
    /// See [`Settings::ttl`].
    ttl(ttl: Duration) => ttl = Some(ttl);
    /// See [`Settings::lease`].
    lease(lease: Duration) => lease = Some(lease);
    /// See [`Settings::max_retries`].
    max_retries(max_retries: i32) => max_retries = Some(max_retries);
    /// See [`Settings::wait`].
    wait(wait: bool) => wait = wait;
    /// See [`Settings::wait_timeout`].
    wait_timeout(bound: Duration) => wait_timeout = bound;
    /// See [`Settings::retry_after`].
    retry_after(retry_after: Duration) => retry_after = retry_after;
    /// See [`Settings::serialization_retries`].
    serialization_retries(retries: u32) => serialization_retries = retries;
    /// See [`Settings::isolation`].
    isolation(level: Isolation) => isolation = Some(level);
    /// See [`Settings::replay_cache`]: replays answered from `cache` (shared by every clone of
    /// it) with no round trip.
    ///
    /// ```
    /// use idempotency_client::{ReplayCache, Settings};
    /// use std::time::Duration;
    /// // At most 10,000 answers, each kept at most a minute (and never past its record's expiry).
    /// let settings = Settings::builder().replay_cache(ReplayCache::new(10_000, Duration::from_secs(60))).build();
    /// assert!(settings.replay_cache.is_some());
    /// ```
    replay_cache(cache: ReplayCache) => replay_cache = Some(cache);
    /// See [`Settings::replay_first`]: a replay in one round trip, a fresh request in one more.
    ///
    /// ```
    /// use idempotency_client::Settings;
    /// let settings = Settings::builder().replay_first(true).build();
    /// assert!(settings.replay_first);
    /// ```
    replay_first(on: bool) => replay_first = on;
    /// See [`Settings::call_timeout`] (`None`: no deadline).
    call_timeout(deadline: Option<Duration>) => call_timeout = deadline;
    /// See [`Settings::pool_timeout`].
    pool_timeout(wait: Duration) => pool_timeout = wait;
    /// See [`Settings::connect_timeout`].
    connect_timeout(bound: Duration) => connect_timeout = bound;
    /// See [`Settings::keepalives_idle`] (`None`: no keepalives).
    keepalives_idle(idle: Option<Duration>) => keepalives_idle = idle;
    /// See [`Settings::statement_timeout`] (`None`: the server's setting).
    statement_timeout(bound: Option<Duration>) => statement_timeout = bound;
}

/// The lease `run_external` sends when [`Settings::lease`] is not set.
pub(crate) const DEFAULT_EXTERNAL_LEASE: Duration = Duration::from_secs(60);

/// [`Settings::wait_timeout`]'s default.
pub(crate) const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(5);
/// [`Settings::call_timeout`]'s default.
pub(crate) const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// [`Settings::pool_timeout`]'s default.
pub(crate) const DEFAULT_POOL_TIMEOUT: Duration = Duration::from_secs(5);
/// [`Settings::connect_timeout`]'s default.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// [`Settings::keepalives_idle`]'s default.
pub(crate) const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(60);
/// The keepalive probes after the idle time, unless the URL says otherwise: one every
/// `KEEPALIVES_INTERVAL`, the connection closed after `KEEPALIVES_RETRIES` unanswered ones.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) const KEEPALIVES_RETRIES: u32 = 3;

impl Settings {
    /// What a constructor checks before it builds a pool: a configured schema name is valid,
    /// no bound is zero (a zero wait would fail every call), and the wait for a holder ends
    /// before the call's deadline.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    pub(crate) fn check(&self) -> Result<(), crate::error::Error> {
        let bounds = [
            ("call_timeout", self.call_timeout),
            ("pool_timeout", Some(self.pool_timeout)),
            ("connect_timeout", Some(self.connect_timeout)),
            ("keepalives_idle", self.keepalives_idle),
            ("statement_timeout", self.statement_timeout),
            ("wait_timeout", Some(self.wait_timeout)),
        ];
        for (name, bound) in bounds {
            if bound.is_some_and(|d| d.is_zero()) {
                return Err(crate::error::Error::Configuration {
                    reason: format!("Settings::{name} must be longer than zero (None, where it is an Option, turns it off)"),
                    source: None,
                });
            }
        }
        if let Some(reason) = self.wait_beyond_call() {
            return Err(crate::error::Error::Configuration { reason, source: None });
        }
        match &self.schema {
            Some(name) => crate::sql::Schema::named(name.as_str()).map(drop),
            None => Ok(()),
        }
    }
}

impl Settings {
    /// Why the wait for a holder could outlast the call's deadline (which would answer
    /// `StoreUnavailable` where the wait's bound answers `InProgress`), if it could. Hidden: the
    /// layer's builder checks it too.
    #[doc(hidden)]
    pub fn wait_beyond_call(&self) -> Option<String> {
        match self.call_timeout {
            Some(call) if self.wait && self.wait_timeout >= call => Some(format!(
                "Settings::wait_timeout ({:?}) must be shorter than Settings::call_timeout ({call:?}), which bounds the whole call, its wait included",
                self.wait_timeout
            )),
            _ => None,
        }
    }
}

/// Which bound of the [`Settings`] fired: the source of the [`crate::Error::StoreUnavailable`]
/// a call ends with when its [`Settings::call_timeout`] passes (downcast it from the error's
/// `source()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elapsed {
    setting: &'static str,
    limit: Duration,
    call: &'static str,
}

impl Elapsed {
    pub(crate) fn call_timeout(call: &'static str, limit: Duration) -> Self {
        Elapsed { setting: "call_timeout", limit, call }
    }

    /// The setting whose bound fired (`"call_timeout"`).
    pub fn setting(&self) -> &'static str {
        self.setting
    }

    /// The bound.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// The call it cut (`"run"`, `"run_batch"`, `"run_statement"`, `"run_external"`,
    /// `"check_extension"`, `"schema"`).
    pub fn call(&self) -> &'static str {
        self.call
    }
}

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} did not end within Settings::{} ({:?}); it was abandoned", self.call, self.setting, self.limit)
    }
}

impl std::error::Error for Elapsed {}

#[cfg(test)]
mod tests {
    use super::{Settings, SettingsBuilder};
    use std::time::Duration;

    #[test]
    fn the_builder_builds_converts_and_starts_from_settings() {
        let built = Settings::builder().schema("idem").ttl(Duration::from_secs(9)).wait(true).build();
        assert_eq!((built.schema.as_deref(), built.ttl, built.wait), (Some("idem"), Some(Duration::from_secs(9)), true));
        let converted: Settings = Settings::builder().max_retries(2).into();
        assert_eq!((converted.max_retries, converted.call_timeout), (Some(2), Settings::default().call_timeout));
        let again = SettingsBuilder::from(built).lease(Duration::from_secs(3)).build();
        assert_eq!((again.schema.as_deref(), again.lease), (Some("idem"), Some(Duration::from_secs(3))));
        // 0.6.0's setters on Settings, deprecated, still set the same field.
        #[allow(deprecated)]
        let old = Settings::default().ttl(Duration::from_secs(9));
        assert_eq!(old.ttl, Some(Duration::from_secs(9)));
    }
}
