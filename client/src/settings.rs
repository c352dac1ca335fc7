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
/// [`Settings::default`] and use the same methods).
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
    /// Wait for another transaction's uncommitted reservation of the key (then replay) instead
    /// of answering `InProgress` at once.
    pub wait: bool,
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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            schema: None,
            ttl: None,
            lease: None,
            max_retries: None,
            wait: false,
            retry_after: Duration::from_secs(1),
            serialization_retries: 5,
            isolation: None,
            replay_cache: None,
        }
    }
}

impl Settings {
    /// The defaults, to change with the methods below.
    pub fn builder() -> Self {
        Settings::default()
    }

    /// See [`Settings::schema`].
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// See [`Settings::ttl`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// See [`Settings::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// See [`Settings::max_retries`].
    pub fn max_retries(mut self, max_retries: i32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    /// See [`Settings::wait`].
    pub fn wait(mut self, wait: bool) -> Self {
        self.wait = wait;
        self
    }

    /// See [`Settings::retry_after`].
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// See [`Settings::serialization_retries`].
    pub fn serialization_retries(mut self, retries: u32) -> Self {
        self.serialization_retries = retries;
        self
    }

    /// See [`Settings::isolation`].
    pub fn isolation(mut self, level: Isolation) -> Self {
        self.isolation = Some(level);
        self
    }

    /// See [`Settings::replay_cache`]: replays answered from `cache` (shared by every clone of
    /// it) with no round trip.
    ///
    /// ```
    /// use idempotency_client::{ReplayCache, Settings};
    /// use std::time::Duration;
    /// // At most 10,000 answers, each kept at most a minute (and never past its record's expiry).
    /// let settings = Settings::builder().replay_cache(ReplayCache::new(10_000, Duration::from_secs(60)));
    /// ```
    pub fn replay_cache(mut self, cache: ReplayCache) -> Self {
        self.replay_cache = Some(cache);
        self
    }
}

/// The lease `run_external` sends when [`Settings::lease`] is not set.
pub(crate) const DEFAULT_EXTERNAL_LEASE: Duration = Duration::from_secs(60);

/// The bound of every wait of a pool made by the convenience constructors
/// ([`crate::Idempotency::connect`], `connect_sqlx`): for a free connection, to connect, to
/// recycle.
#[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
pub(crate) const POOL_TIMEOUT: Duration = Duration::from_secs(5);

impl Settings {
    /// What a constructor checks before it builds a pool: a configured schema name is valid.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlx")), allow(dead_code))]
    pub(crate) fn check(&self) -> Result<(), crate::error::Error> {
        match &self.schema {
            Some(name) => crate::sql::Schema::named(name.as_str()).map(drop),
            None => Ok(()),
        }
    }
}
