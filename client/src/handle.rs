//! The handle: a pool, the settings, the extension's schema (resolved once), and the two flows
//! (`run`, `run_external`), pipelined.
//!
//! Round trips of `run` (tokio-postgres pipelines the statements of one connection that are
//! issued together, so each group below is one round trip):
//!
//! 1. `BEGIN` and `idem_reserve` — a replay, failure, mismatch or in-progress answer is returned
//!    after this one; the `ROLLBACK` that ends its transaction is queued on the connection
//!    without waiting for it, and the connection goes straight back to the pool;
//! 2. `SAVEPOINT` and the closure's first statement, then its other statements;
//! 3. `idem_complete` and `COMMIT` (or, for a transient result, `ROLLBACK TO SAVEPOINT`,
//!    `idem_release`, `COMMIT`; for a permanent error, `ROLLBACK TO SAVEPOINT`, `idem_complete`
//!    with `FAILED`, `COMMIT`).
//!
//! The savepoint travels with the closure rather than with the reservation so that the answer
//! path of a replay costs the server two statements and a `ROLLBACK`, not three.
//!
//! A `COMMIT` sent right behind `idem_complete` must not commit when the key was lost, so the
//! completion statement aborts the transaction when `idem_complete` answers false (a cast of
//! [`crate::ops::LEASE_LOST_MARK`] to boolean, SQLSTATE 22P02): PostgreSQL then answers the
//! `COMMIT` with a rollback, and the client reports `LeaseLost`.

use crate::error::{is_serialization_failure, is_unavailable, Error};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::ops::{self, ReleaseOutcome, ReserveOptions, ReserveOutcome, Schema, Status, Token, LEASE_LOST_MARK};
use crate::response::{to_stored, Replayable, Verdict};
use deadpool_postgres::{Client, Pool};
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio_postgres::error::SqlState;

/// How a closure error is recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Roll the business writes back and release the key: the client's retry runs again.
    Transient,
    /// Record the key as `FAILED` with this response (replayed to every retry).
    Permanent(Option<Value>),
}

/// What the client needs to know about the errors of your closures.
///
/// The default is transient: an error rolls back the attempt's writes and releases the key
/// (counting towards `max_retries`). Return [`Disposition::Permanent`] from
/// [`HandlerError::disposition`] for failures that must never run again (a declined card).
///
/// A serialization failure (40001) or deadlock (40P01) inside the closure is neither: the whole
/// transaction is retried and nothing is counted. The client recognises it through
/// [`HandlerError::database_error`]; implement it when your error type wraps a
/// `tokio_postgres::Error`.
pub trait HandlerError {
    /// How this error is recorded.
    fn disposition(&self) -> Disposition {
        Disposition::Transient
    }

    /// The database error this error carries, if any.
    fn database_error(&self) -> Option<&tokio_postgres::Error> {
        None
    }
}

impl HandlerError for tokio_postgres::Error {
    fn database_error(&self) -> Option<&tokio_postgres::Error> {
        Some(self)
    }
}

impl HandlerError for Box<dyn std::error::Error + Send + Sync> {
    /// The first `tokio_postgres::Error` in the source chain.
    fn database_error(&self) -> Option<&tokio_postgres::Error> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(self.as_ref() as &(dyn std::error::Error + 'static));
        while let Some(e) = next {
            if let Some(db) = e.downcast_ref::<tokio_postgres::Error>() {
                return Some(db);
            }
            next = e.source();
        }
        None
    }
}

impl HandlerError for std::io::Error {}
impl HandlerError for String {}
impl HandlerError for &'static str {}

/// The result of a flow that ran or replayed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    /// The closure ran now and its result was committed with the key (`SUCCESS`, or `FAILED` for
    /// a result whose verdict is a permanent failure).
    Executed(T),
    /// An earlier attempt's committed result; the closure did not run. Send
    /// `Idempotent-Replayed: true`.
    Replayed(T),
    /// The closure ran but its result was transient (say a 5xx): its writes were rolled back and
    /// the key released, so the client's retry runs again.
    Released(T),
    /// The closure ran, its result was transient, and this was the key's `max_retries`-th
    /// transient failure: its writes were rolled back and the key is now `FAILED`, so a retry
    /// gets [`Error::Failed`] and never runs again.
    Poisoned(T),
}

impl<T> Outcome<T> {
    /// Whether this is an earlier attempt's result (`Idempotent-Replayed: true`).
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }

    /// Whether the closure ran now and its result was committed with the key.
    pub fn is_executed(&self) -> bool {
        matches!(self, Outcome::Executed(_))
    }

    /// The result.
    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) | Outcome::Poisoned(v) => v,
        }
    }

    /// The result, by value.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) | Outcome::Poisoned(v) => v,
        }
    }
}

/// The defaults of every call of a handle. `None` durations and retries mean the server's
/// `idempotency.*` settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The schema the extension is installed in. `None`: looked up once in `pg_extension` on
    /// first use. Every call is qualified with it; the `search_path` is never changed.
    pub schema: Option<String>,
    /// How long a record is kept (`idempotency.ttl` when None).
    pub ttl: Option<Duration>,
    /// The lease of `run`. `run_external` always sends an explicit lease (this, or 60 s) because it
    /// heartbeats at a third of it.
    pub lease: Option<Duration>,
    /// Transient failures before a key is poisoned (`idempotency.max_retries` when None).
    pub max_retries: Option<i32>,
    /// Wait for another transaction's uncommitted reservation of the key (then replay) instead of
    /// answering `InProgress` at once.
    pub wait: bool,
    /// The `Retry-After` hint of `InProgress`.
    pub retry_after: Duration,
    /// How many times a whole transaction is retried after 40001 / 40P01 (wherever they arise,
    /// the closure included), and how many times `run_external` retries its local transaction
    /// after a transient database error.
    pub serialization_retries: u32,
    /// The isolation level of `run`'s transaction (None: the server default, normally READ
    /// COMMITTED). Under REPEATABLE READ or SERIALIZABLE, a duplicate that committed after the
    /// snapshot surfaces as 40001 and the whole transaction is retried.
    pub isolation: Option<tokio_postgres::IsolationLevel>,
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
        }
    }
}

const DEFAULT_EXTERNAL_LEASE: Duration = Duration::from_secs(60);

/// The bound of every wait of a pool made by [`Idempotency::connect`]: for a free connection,
/// to connect, to recycle.
const POOL_TIMEOUT: Duration = Duration::from_secs(5);

/// A cloneable handle: a `deadpool_postgres::Pool`, the [`Settings`] of every call and the
/// extension's [`Schema`].
///
/// **The pool.** `run` holds one pooled connection for the length of its transaction (your
/// closure included) and gives it back on every exit, even when its future is dropped (then the
/// connection is closed rather than returned mid-transaction, and the server rolls back).
/// `run_external` holds none while the outside call runs: one for the reservation, one per
/// heartbeat, one for the final transaction. When every connection is busy, a call waits for one
/// at most the pool's wait timeout (5 s for a pool made by [`Idempotency::connect`]) and then
/// fails with [`Error::StoreUnavailable`], whose source is the pool's timeout error; nothing was
/// reserved, so the client's retry is safe.
#[derive(Clone)]
pub struct Idempotency {
    pool: Pool,
    settings: Arc<Settings>,
    schema: Arc<OnceCell<Schema>>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").field("pool", &self.pool.status()).field("settings", &self.settings).finish()
    }
}

/// The future of a [`Idempotency::run`] closure: boxed, borrowing the transaction.
pub type TxFuture<'t, T, E> = BoxFuture<'t, Result<T, E>>;

/// The transaction of [`Idempotency::run`] as your closure sees it: a pooled connection inside
/// the transaction that holds the reservation. It dereferences to `deadpool_postgres::Client`
/// (`query`, `execute`, `prepare_cached`, and `deadpool_postgres::GenericClient` for helpers
/// generic over the executor). The client begins, completes and commits it: do not `COMMIT` or
/// `ROLLBACK` yourself.
pub struct Tx<'c>(&'c Client);

impl Deref for Tx<'_> {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.0
    }
}

impl Idempotency {
    /// A handle over `pool` with `settings`.
    pub fn new(pool: Pool, settings: Settings) -> Self {
        Idempotency { pool, settings: Arc::new(settings), schema: Arc::new(OnceCell::new()) }
    }

    /// A pool of `pool_size` connections to `url` with default [`Settings`]; see
    /// [`Idempotency::connect_with`].
    pub fn connect(url: &str, pool_size: usize) -> Result<Self, Error> {
        Self::connect_with(url, pool_size, Settings::default())
    }

    /// A pool of `pool_size` connections to `url` whose waits are bounded (5 s to get a
    /// connection, to connect, to recycle), so an unreachable or exhausted store is a
    /// [`Error::StoreUnavailable`] error, never a hang. Nothing is connected yet (call
    /// [`Idempotency::check_extension`] to fail fast); a malformed URL or schema name is a
    /// [`Error::Configuration`] error.
    pub fn connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Self, Error> {
        use deadpool_postgres::{Config, PoolConfig, Runtime, Timeouts};
        if let Some(name) = &settings.schema {
            Schema::named(name.as_str())?;
        }
        let timeout = Some(POOL_TIMEOUT);
        let mut config = Config::new();
        config.url = Some(url.to_owned());
        config.connect_timeout = timeout;
        config.pool = Some(PoolConfig {
            max_size: pool_size,
            timeouts: Timeouts { wait: timeout, create: timeout, recycle: timeout },
            ..PoolConfig::default()
        });
        let pool = config.create_pool(Some(Runtime::Tokio1), tokio_postgres::NoTls).map_err(|e| Error::Configuration {
            reason: format!("cannot build a connection pool for the given URL: {e}"),
            source: Some(Box::new(e)),
        })?;
        Ok(Self::new(pool, settings))
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The same pool and schema with other settings (the layer's per-route ttl, lease, wait).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn with_settings(&self, settings: Settings) -> Self {
        Idempotency { pool: self.pool.clone(), settings: Arc::new(settings), schema: self.schema.clone() }
    }

    /// The extension's schema: [`Settings::schema`], or looked up once in `pg_extension` (and
    /// its version checked) on first use.
    pub async fn schema(&self) -> Result<Schema, Error> {
        self.schema
            .get_or_try_init(|| async {
                match &self.settings.schema {
                    Some(name) => Schema::named(name.as_str()),
                    None => Schema::of_extension(&self.pool.get().await?).await,
                }
            })
            .await
            .cloned()
    }

    /// Checks that the extension is installed, in the configured schema, at a version this
    /// client speaks (0.1.x, 0.2.x or 0.3.x); returns the version.
    pub async fn check_extension(&self) -> Result<String, Error> {
        let client = self.pool.get().await?;
        let (installed_in, version) = ops::installed(&client).await?;
        let schema = self.schema().await?;
        if installed_in != schema.name() {
            return Err(Error::ExtensionMissing {
                reason: format!(
                    "the idempotency extension is installed in schema {installed_in:?}, not in the configured {:?}",
                    schema.name()
                ),
                source: None,
            });
        }
        Ok(version)
    }

    fn reserve_options(&self, lease: Option<Duration>) -> ReserveOptions {
        ReserveOptions { ttl: self.settings.ttl, lease, wait: self.settings.wait }
    }

    fn begin_sql(&self) -> &'static str {
        use tokio_postgres::IsolationLevel::*;
        match self.settings.isolation {
            None => "BEGIN",
            Some(ReadUncommitted) => "BEGIN ISOLATION LEVEL READ UNCOMMITTED",
            Some(ReadCommitted) => "BEGIN ISOLATION LEVEL READ COMMITTED",
            Some(RepeatableRead) => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            Some(Serializable) => "BEGIN ISOLATION LEVEL SERIALIZABLE",
            Some(_) => "BEGIN",
        }
    }

    /// The in-transaction flow: reserve the key, run `work` in the same transaction (behind a
    /// savepoint), record its result with `idem_complete`, commit. The closure runs at most
    /// once per key across every caller whose run commits; duplicates get the stored result.
    ///
    /// - a result whose [`Replayable::verdict`] is [`Verdict::Success`] / [`Verdict::Failure`]
    ///   commits with the key as `SUCCESS` / `FAILED` and is returned as `Outcome::Executed`;
    /// - a [`Verdict::Transient`] result rolls back to the savepoint and releases the key
    ///   (`Outcome::Released`, or `Outcome::Poisoned` when that reached `max_retries`);
    /// - an error whose [`HandlerError::disposition`] is transient does the same and returns
    ///   [`Error::Handler`] (its `poisoned` flag says which); a permanent one rolls back to the
    ///   savepoint and records `FAILED` with its response;
    /// - 40001 / 40P01, wherever they arise (the closure included, recognised through
    ///   [`HandlerError::database_error`]), roll the whole transaction back and retry it with
    ///   backoff, up to [`Settings::serialization_retries`] times, without counting a failure:
    ///   the closure may run again, but only one of its runs can ever commit.
    ///
    /// Round trips: `BEGIN` and the reservation leave together (a replay or any other answer is
    /// returned after this one; the `ROLLBACK` that ends its transaction is queued without
    /// waiting and the connection returns to the pool at once); then a savepoint with your
    /// first statement, and your other statements; then `idem_complete` and `COMMIT` together
    /// (the completion aborts the transaction if the key was lost, so the `COMMIT` behind it can
    /// only commit a completed key). A closure with one statement costs three round trips.
    /// Prepare your statements with `tx.prepare_cached(..)`: a query given as a string costs an
    /// extra round trip to parse it.
    pub async fn run<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Tx<'_>) -> TxFuture<'t, T, E> + Send,
    {
        crate::trace::call("run", key, self.run_traced(key, fingerprint, work)).await
    }

    async fn run_traced<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, mut work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Tx<'_>) -> TxFuture<'t, T, E> + Send,
    {
        let schema = self.schema().await.map_err(Error::widen)?;
        let mut attempt = 0;
        loop {
            match self.run_once(&schema, key, fingerprint, &mut work).await {
                Err(e) if retry_transaction(&e) && attempt < self.settings.serialization_retries => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn run_once<T, E, F>(
        &self,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
        work: &mut F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Tx<'_>) -> TxFuture<'t, T, E> + Send,
    {
        let attempt = match self.begin(schema, key, fingerprint).await? {
            Begun::Created(attempt) => attempt,
            Begun::Answered(answer) => return answer,
        };
        let result = {
            let view = Tx(attempt.tx.client());
            attempt.work(work(&view)).await?
        };
        attempt.finish(result).await
    }

    /// Round trip 1 of `run`: `BEGIN` and the reservation. A created reservation is an
    /// [`Attempt`] holding the open transaction; any other answer is final.
    pub(crate) async fn begin<T: Replayable, E>(
        &self,
        schema: &Schema,
        key: &Key,
        fingerprint: &Fingerprint,
    ) -> Result<Begun<T, E>, Error<E>> {
        let client = self.pool.get().await?;
        let (reserve, complete, release) = prepare3(&client, schema).await.map_err(Error::widen)?;
        let tx = Open::new(client);

        // BEGIN can only fail with the connection, on which nothing after it runs either.
        let options = self.reserve_options(self.settings.lease);
        let (begun, reservation) = futures_util::join!(
            tx.batch_execute(self.begin_sql()),
            ops::reserve_prepared(tx.client(), &reserve, key, fingerprint.as_str(), &options),
        );
        let first = begun.map_err(Error::from).and_then(|()| reservation.map_err(Error::widen));
        match first {
            Ok(r) => match r.outcome {
                ReserveOutcome::Created(token) => Ok(Begun::Created(Attempt {
                    tx: Arc::new(tx),
                    complete,
                    release,
                    key: key.clone(),
                    token,
                    max_retries: self.settings.max_retries,
                })),
                other => {
                    tx.rollback_without_waiting();
                    Ok(Begun::Answered(self.answer(other)))
                }
            },
            Err(e) => {
                tx.rollback().await;
                Err(e)
            }
        }
    }

    /// Maps a non-`created` reservation to the caller's answer.
    fn answer<T: Replayable, E>(&self, outcome: ReserveOutcome) -> Result<Outcome<T>, Error<E>> {
        match outcome {
            ReserveOutcome::Replay(response) => {
                serde_json::from_value(response.unwrap_or(Value::Null)).map(Outcome::Replayed).map_err(Error::Decode)
            }
            ReserveOutcome::Failed(response) => Err(Error::Failed { response }),
            ReserveOutcome::InProgress => Err(Error::InProgress { retry_after: self.settings.retry_after }),
            ReserveOutcome::Mismatch => Err(Error::Mismatch),
            ReserveOutcome::Created(_) => {
                Err(Error::Protocol { reason: "a created reservation reached the answer path".into(), source: None })
            }
        }
    }

    /// The two-phase flow, for a side effect outside the database:
    ///
    /// 1. reserve the key in its own transaction (one round trip; a replay or another answer ends
    ///    here, without calling out);
    /// 2. run `call` while a background task heartbeats the lease (a third of it apart, one round
    ///    trip per beat); no pooled connection is held meanwhile;
    /// 3. in one transaction, let `record` write the local result, complete the key and commit
    ///    (`BEGIN` is pipelined with `record`'s first statement, `idem_complete` with `COMMIT`).
    ///
    /// A transient result or error from `call` releases the key (one round trip); a permanent
    /// error stores it as `FAILED`. If the lease was lost meanwhile (recovered or taken over),
    /// `record`'s writes are rolled back and [`Error::LeaseLost`] is returned.
    ///
    /// Once `call` has succeeded the outside effect has happened, so the key is never released
    /// again: the local transaction is retried (with the heartbeat still running) on 40001,
    /// 40P01 and lost connections, up to [`Settings::serialization_retries`] times; `record` is
    /// therefore `FnMut` and may run more than once, but only one of its runs commits. If it
    /// still fails, the key is completed with `call`'s result on its own, so a retry replays it
    /// and never calls out again, and [`Error::RecordFailed`] hands you the result to reconcile
    /// your local state. The heartbeat stops on every exit path.
    pub async fn run_external<T, E, C, R>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        call: C,
        record: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        C: std::future::Future<Output = Result<T, E>> + Send,
        R: for<'t> FnMut(&'t Tx<'_>, &'t T) -> TxFuture<'t, (), E> + Send,
    {
        crate::trace::call("run_external", key, self.run_external_traced(key, fingerprint, call, record)).await
    }

    async fn run_external_traced<T, E, C, R>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        call: C,
        mut record: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        C: std::future::Future<Output = Result<T, E>> + Send,
        R: for<'t> FnMut(&'t Tx<'_>, &'t T) -> TxFuture<'t, (), E> + Send,
    {
        let schema = self.schema().await.map_err(Error::widen)?;
        let lease = self.settings.lease.unwrap_or(DEFAULT_EXTERNAL_LEASE);
        let token = {
            let client = self.pool.get().await?;
            let options = self.reserve_options(Some(lease));
            let reservation =
                ops::reserve(&client, &schema, key, fingerprint.as_str(), &options).await.map_err(Error::widen)?;
            match reservation.outcome {
                ReserveOutcome::Created(token) => token,
                other => return self.answer(other),
            }
        }; // the connection goes back to the pool before the outside call

        let _beat = Heartbeat::start(self.pool.clone(), schema.clone(), key.clone(), token, lease);
        let value = match call.await {
            Ok(value) => value,
            Err(error) => {
                let client = self.pool.get().await?;
                return match error.disposition() {
                    Disposition::Transient => {
                        match ops::release(&client, &schema, key, token, self.settings.max_retries).await.map_err(Error::widen)? {
                            ReleaseOutcome::Released => Err(Error::Handler { error, poisoned: false }),
                            ReleaseOutcome::Poisoned => Err(Error::Handler { error, poisoned: true }),
                            ReleaseOutcome::Stale => Err(Error::LeaseLost),
                        }
                    }
                    Disposition::Permanent(response) => {
                        if ops::complete(&client, &schema, key, token, response.as_ref(), Status::Failed)
                            .await
                            .map_err(Error::widen)?
                        {
                            Err(Error::Handler { error, poisoned: false })
                        } else {
                            Err(Error::LeaseLost)
                        }
                    }
                };
            }
        };
        let status = match value.verdict() {
            Verdict::Transient => {
                let client = self.pool.get().await?;
                return match ops::release(&client, &schema, key, token, self.settings.max_retries).await.map_err(Error::widen)? {
                    ReleaseOutcome::Released => Ok(Outcome::Released(value)),
                    ReleaseOutcome::Poisoned => Ok(Outcome::Poisoned(value)),
                    ReleaseOutcome::Stale => Err(Error::LeaseLost),
                };
            }
            Verdict::Success => Status::Success,
            Verdict::Failure => Status::Failed,
        };
        let stored = to_stored(&value).map_err(Error::Decode)?;

        let mut attempt = 0;
        let last = loop {
            match self.record_once(&schema, key, token, &value, &stored, status, &mut record).await {
                Ok(()) => return Ok(Outcome::Executed(value)),
                Err(Error::LeaseLost) => return Err(Error::LeaseLost),
                Err(e) if transient_for_record(&e) && attempt < self.settings.serialization_retries => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                Err(e) => break e,
            }
        };
        // The outside effect happened and cannot be recorded with the local write: keep its
        // result in the key (never release it), and hand it back.
        let key_completed = match self.pool.get().await {
            Ok(client) => matches!(ops::complete(&client, &schema, key, token, Some(&stored), status).await, Ok(true)),
            Err(_) => false,
        };
        Err(Error::RecordFailed { response: stored, key_completed, error: Box::new(last) })
    }

    /// One try of `run_external`'s local transaction: `BEGIN` with `record`, then complete and
    /// `COMMIT` together.
    #[allow(clippy::too_many_arguments)]
    async fn record_once<T, E, R>(
        &self,
        schema: &Schema,
        key: &Key,
        token: Token,
        value: &T,
        stored: &Value,
        status: Status,
        record: &mut R,
    ) -> Result<(), Error<E>>
    where
        T: Replayable + Send + Sync,
        E: HandlerError + Send,
        R: for<'t> FnMut(&'t Tx<'_>, &'t T) -> TxFuture<'t, (), E> + Send,
    {
        let client = self.pool.get().await?;
        let complete = client.prepare_cached(schema.complete_or_abort_sql()).await.map_err(|e| Error::widen(crate::error::ours(e)))?;
        let tx = Open::new(client);
        let view = Tx(tx.client());
        // BEGIN is queued before record's first statement (join polls in order), so both leave
        // in one round trip; BEGIN can only fail with the connection, which then runs nothing.
        let (begun, recorded) = futures_util::join!(tx.batch_execute("BEGIN"), record(&view, value));
        if let Err(e) = begun {
            tx.rollback().await;
            return Err(e.into());
        }
        if let Err(error) = recorded {
            tx.rollback().await;
            return Err(Error::Handler { error, poisoned: false });
        }
        let done = complete_and_commit(tx.client(), &complete, key, token, Some(stored.clone()), status).await;
        tx.finished_with(&done);
        done
    }
}

/// Prepares (or finds cached) the statements of `run`, before anything is pipelined: a statement
/// being prepared would let the statements after it overtake it.
async fn prepare3(
    client: &Client,
    schema: &Schema,
) -> Result<(tokio_postgres::Statement, tokio_postgres::Statement, tokio_postgres::Statement), Error> {
    let map = crate::error::ours;
    let (reserve, complete, release) = futures_util::join!(
        client.prepare_cached(schema.reserve_sql()),
        client.prepare_cached(schema.complete_or_abort_sql()),
        client.prepare_cached(schema.release_sql()),
    );
    Ok((reserve.map_err(map)?, complete.map_err(map)?, release.map_err(map)?))
}

/// `idem_complete` (aborting the transaction when it answers false) and `COMMIT`, pipelined.
async fn complete_and_commit<E>(
    client: &Client,
    complete: &tokio_postgres::Statement,
    key: &Key,
    token: Token,
    response: Option<Value>,
    status: Status,
) -> Result<(), Error<E>> {
    let (operation, user_id, key, status) = (key.operation(), key.user_id(), key.key(), status.as_sql());
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [&operation, &user_id, &key, &token.0, &response, &status];
    let (completed, committed) = futures_util::join!(client.query_one(complete, &params), client.batch_execute("COMMIT"));
    match completed {
        Err(e)
            if e.as_db_error().is_some_and(|d| {
                *d.code() == SqlState::INVALID_TEXT_REPRESENTATION && d.message().contains(LEASE_LOST_MARK)
            }) =>
        {
            // The COMMIT behind it rolled back.
            Err(Error::LeaseLost)
        }
        Err(e) => Err(crate::error::ours(e).widen()),
        Ok(_) => committed.map_err(Error::from),
    }
}

/// Whether `run` retries the whole transaction for this error: 40001 / 40P01 from our
/// statements or from the closure.
fn retry_transaction<E: HandlerError>(e: &Error<E>) -> bool {
    match e {
        Error::Database(db) => is_serialization_failure(db),
        Error::Handler { error, .. } => error.database_error().is_some_and(is_serialization_failure),
        _ => false,
    }
}

/// Whether `run_external` retries its local transaction for this error: 40001 / 40P01 or a lost
/// connection, from our statements or from `record`.
fn transient_for_record<E: HandlerError>(e: &Error<E>) -> bool {
    match e {
        Error::Database(db) => is_serialization_failure(db),
        Error::StoreUnavailable(_) => true,
        Error::Handler { error, .. } => error.database_error().is_some_and(|db| is_serialization_failure(db) || is_unavailable(db)),
        _ => false,
    }
}

/// Exponential backoff with jitter for transaction retries: 10 ms, 20 ms, 40 ms ... (+0-50%).
fn backoff(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(8);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = base * u64::from(nanos % 50) / 100;
    Duration::from_millis(base + jitter)
}

/// What [`Idempotency::begin`] found: a reservation to work under, or the final answer.
pub(crate) enum Begun<T, E> {
    /// The key is ours: its transaction is open.
    Created(Attempt),
    /// A replay, a stored failure, a mismatch or an attempt in progress.
    Answered(Result<Outcome<T>, Error<E>>),
}

/// A reservation of `run` taken inside its open transaction: the work runs on
/// [`Attempt::tx`] behind a savepoint ([`Attempt::work`]), then [`Attempt::finish`] records its
/// result and commits. `run` and the in-transaction layer both go through it.
pub(crate) struct Attempt {
    tx: Arc<Open>,
    complete: tokio_postgres::Statement,
    release: tokio_postgres::Statement,
    key: Key,
    token: Token,
    max_retries: Option<i32>,
}

impl Attempt {
    /// The open transaction, shared (the layer hands it to the handler).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn shared(&self) -> SharedTx {
        SharedTx(self.tx.clone())
    }

    /// Round trip 2: the savepoint leaves with the work's first statement (join polls in order,
    /// and tokio-postgres sends a request when its future is first polled).
    pub(crate) async fn work<W: std::future::Future, E>(&self, work: W) -> Result<W::Output, Error<E>> {
        let (saved, result) = futures_util::join!(self.tx.batch_execute("SAVEPOINT idem_work"), work);
        if let Err(e) = saved {
            self.tx.rollback().await;
            return Err(e.into());
        }
        Ok(result)
    }

    /// Last round trip: record the work's result (or release the key) and commit, in one.
    pub(crate) async fn finish<T, E>(self, result: Result<T, E>) -> Result<Outcome<T>, Error<E>>
    where
        T: Replayable,
        E: HandlerError,
    {
        let Attempt { tx, complete, release, key, token, max_retries } = self;
        let key = &key;
        let fenced = |response: Option<Value>, status: Status| complete_and_commit(tx.client(), &complete, key, token, response, status);
        let release_and_commit = || async {
            let (undone, released, committed) = futures_util::join!(
                tx.batch_execute("ROLLBACK TO SAVEPOINT idem_work"),
                ops::release_prepared(tx.client(), &release, key, token, max_retries),
                tx.batch_execute("COMMIT"),
            );
            tx.finished(&committed);
            undone?;
            let released = released.map_err(Error::widen)?;
            committed?;
            Ok::<_, Error<E>>(released)
        };
        match result {
            Ok(value) => match value.verdict() {
                Verdict::Transient => match release_and_commit().await? {
                    ReleaseOutcome::Released => Ok(Outcome::Released(value)),
                    ReleaseOutcome::Poisoned => Ok(Outcome::Poisoned(value)),
                    ReleaseOutcome::Stale => Err(Error::LeaseLost),
                },
                verdict => {
                    let stored = match to_stored(&value) {
                        Ok(stored) => stored,
                        Err(e) => {
                            tx.rollback().await;
                            return Err(Error::Decode(e));
                        }
                    };
                    let status = if verdict == Verdict::Success { Status::Success } else { Status::Failed };
                    let done = fenced(Some(stored), status).await;
                    tx.finished_with(&done);
                    done.map(|()| Outcome::Executed(value))
                }
            },
            Err(error) if error.database_error().is_some_and(is_serialization_failure) => {
                // Not a failure of the key: the whole transaction is retried by `run`.
                tx.rollback().await;
                Err(Error::Handler { error, poisoned: false })
            }
            Err(error) => match error.disposition() {
                Disposition::Transient => match release_and_commit().await? {
                    ReleaseOutcome::Released => Err(Error::Handler { error, poisoned: false }),
                    ReleaseOutcome::Poisoned => Err(Error::Handler { error, poisoned: true }),
                    ReleaseOutcome::Stale => Err(Error::LeaseLost),
                },
                Disposition::Permanent(response) => {
                    // Undo its writes, remember the failure: one round trip.
                    let (undone, done) =
                        futures_util::join!(tx.batch_execute("ROLLBACK TO SAVEPOINT idem_work"), fenced(response, Status::Failed));
                    tx.finished_with(&done);
                    undone?;
                    done?;
                    Err(Error::Handler { error, poisoned: false })
                }
            },
        }
    }
}

/// The open transaction of an [`Attempt`], shared with the work that runs in it: it
/// dereferences to the pooled connection. When the last clone goes, the connection goes back to
/// the pool if the transaction was seen to end, and is closed otherwise (the server rolls back).
#[derive(Clone)]
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) struct SharedTx(Arc<Open>);

impl Deref for SharedTx {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.0.client()
    }
}

/// A pooled connection inside a transaction this crate began. Unless the transaction is seen to
/// end (a `COMMIT` or `ROLLBACK` answered by the server), dropping it closes the connection
/// instead of returning it to the pool, so no caller ever gets a connection in the middle of
/// someone else's transaction (a dropped `run` future, an error between statements, a handler
/// that panicked).
struct Open {
    client: Option<Client>,
    ended: AtomicBool,
}

impl Open {
    fn new(client: Client) -> Self {
        Open { client: Some(client), ended: AtomicBool::new(false) }
    }

    fn client(&self) -> &Client {
        match &self.client {
            Some(client) => client,
            None => unreachable!("the connection is only taken out on drop"),
        }
    }

    /// The transaction is over: when dropped, the connection goes back to the pool.
    fn end(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// After a `COMMIT` (or `ROLLBACK`): when the server answered it (success, or a database
    /// error after which it has rolled back), the connection may go back to the pool; otherwise
    /// it is closed.
    fn finished(&self, ended: &Result<(), tokio_postgres::Error>) {
        if ended.as_ref().err().is_none_or(|e| e.as_db_error().is_some()) {
            self.end();
        }
    }

    /// As [`Open::finished`], from the result of a pipelined completion and `COMMIT`.
    fn finished_with<E>(&self, done: &Result<(), Error<E>>) {
        if matches!(done, Ok(()) | Err(Error::LeaseLost | Error::Database(_) | Error::ExtensionMissing { .. })) {
            self.end();
        }
    }

    async fn rollback(&self) {
        if self.client().batch_execute("ROLLBACK").await.is_ok() {
            self.end();
        }
    }

    /// Ends a transaction that wrote nothing without making anyone wait: the `ROLLBACK` is
    /// queued on the connection (tokio-postgres sends a request when its future is first polled,
    /// and ignores the answer of one whose future is gone) and the connection goes back to the
    /// pool at once; whoever uses it next is queued behind the `ROLLBACK`.
    fn rollback_without_waiting(self) {
        use futures_util::FutureExt;
        match self.client().batch_execute("ROLLBACK").now_or_never() {
            None | Some(Ok(())) => self.end(),
            Some(Err(_)) => {} // the connection is broken: dropping the guard closes it
        }
    }
}

impl Deref for Open {
    type Target = Client;

    fn deref(&self) -> &Client {
        self.client()
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if !self.ended.load(Ordering::Acquire) {
                // Detach it from the pool and close it: the server rolls the transaction back.
                drop(deadpool_postgres::Object::take(client));
            }
        }
    }
}

/// The background heartbeat of `run_external`; stops when dropped.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start(pool: Pool, schema: Schema, key: Key, token: Token, lease: Duration) -> Self {
        let every = (lease / 3).max(Duration::from_millis(10));
        Heartbeat(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Ok(client) = pool.get().await else { continue };
                // The key is lost: stop; the final complete is fenced and will say so. A failed
                // beat (an error) is retried a third of a lease later, before the lease ends.
                if let Ok(false) = ops::heartbeat(&client, &schema, &key, token, Some(lease)).await {
                    return;
                }
            }
        }))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}
