//! The handle: a pool plus defaults, and the two flows (`run`, `run_external`).

use crate::error::{is_retryable, Error};
use crate::fingerprint::Fingerprint;
use crate::key::Key;
use crate::ops::{self, ReleaseOutcome, ReserveOptions, ReserveOutcome, Status, Token};
use crate::response::{to_stored, Class, Response};
use deadpool_postgres::{Pool, Transaction};
use futures_util::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The extension versions this client speaks (major.minor): 0.2 changed no signature or outcome.
pub const SUPPORTED_EXTENSIONS: &[&str] = &["0.1", "0.2"];

/// How a closure error is recorded.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// Roll the business writes back and release the key: the client's retry runs again.
    Transient,
    /// Record the key as `FAILED` with this response (replayed to every retry).
    Permanent(Option<Value>),
}

/// Classifies the errors of your closures. The default is transient: an error rolls back the
/// attempt's writes and releases the key (counting towards `max_retries`). Return
/// `Disposition::Permanent` for failures that must never run again (a declined card).
pub trait HandlerError {
    fn disposition(&self) -> Disposition {
        Disposition::Transient
    }
}

impl HandlerError for tokio_postgres::Error {}
impl HandlerError for std::io::Error {}
impl HandlerError for String {}
impl HandlerError for &'static str {}
impl HandlerError for Box<dyn std::error::Error + Send + Sync> {}

/// The result of a flow that ran or replayed.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome<T> {
    /// The closure ran now and its result was committed with the key (`SUCCESS`, or `FAILED` for
    /// a result classified as a permanent failure).
    Executed(T),
    /// An earlier attempt's committed result; the closure did not run. Send
    /// `Idempotent-Replayed: true`.
    Replayed(T),
    /// The closure ran but its result was transient (say a 5xx): its writes were rolled back and
    /// the key released, so the client's retry runs again.
    Released(T),
}

impl<T> Outcome<T> {
    pub fn replayed(&self) -> bool {
        matches!(self, Outcome::Replayed(_))
    }

    pub fn value(&self) -> &T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) => v,
        }
    }

    pub fn into_inner(self) -> T {
        match self {
            Outcome::Executed(v) | Outcome::Replayed(v) | Outcome::Released(v) => v,
        }
    }
}

/// Defaults for every call of a handle. `None` durations and retries mean the server's
/// `idempotency.*` settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub ttl: Option<Duration>,
    /// The lease of `run`. `run_external` always sends an explicit lease (this, or 60 s) because it
    /// heartbeats at a third of it.
    pub lease: Option<Duration>,
    pub max_retries: Option<i32>,
    /// Wait for another transaction's uncommitted reservation of the key (then replay) instead of
    /// answering `InProgress` at once.
    pub wait: bool,
    /// The `Retry-After` hint of `InProgress`.
    pub retry_after: Duration,
    /// How many times a whole transaction is retried after 40001 / 40P01.
    pub serialization_retries: u32,
    /// The isolation level of `run`'s transaction (None: the server default, normally READ
    /// COMMITTED). Under REPEATABLE READ or SERIALIZABLE, a duplicate that committed after the
    /// snapshot surfaces as 40001 and the whole transaction is retried.
    pub isolation: Option<tokio_postgres::IsolationLevel>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
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

/// A cloneable handle: a `deadpool_postgres::Pool` and the defaults of every call.
#[derive(Clone)]
pub struct Idempotency {
    pool: Pool,
    config: Arc<Config>,
}

/// The closure of [`Idempotency::run`]: gets the transaction, returns a boxed future.
pub type Work<'t, T, E> = BoxFuture<'t, Result<T, E>>;

impl Idempotency {
    pub fn new(pool: Pool) -> Self {
        Self::with_config(pool, Config::default())
    }

    pub fn with_config(pool: Pool, config: Config) -> Self {
        Idempotency { pool, config: Arc::new(config) }
    }

    /// A pool for `url` whose waits are bounded (5 s to get a connection, to connect, to recycle),
    /// so an unreachable store is a `StoreUnavailable` error, never a hang.
    pub fn connect(url: &str, max_size: usize) -> Result<Self, Error> {
        use deadpool_postgres::{Config as PoolCfg, PoolConfig, Runtime, Timeouts};
        let mut cfg = PoolCfg::new();
        cfg.url = Some(url.to_owned());
        cfg.connect_timeout = Some(Duration::from_secs(5));
        let timeout = Some(Duration::from_secs(5));
        cfg.pool = Some(PoolConfig {
            max_size,
            timeouts: Timeouts { wait: timeout, create: timeout, recycle: timeout },
            ..PoolConfig::default()
        });
        let pool = cfg
            .create_pool(Some(Runtime::Tokio1), tokio_postgres::NoTls)
            .map_err(|e| Error::StoreUnavailable(e.to_string()))?;
        Ok(Self::new(pool))
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Checks that the extension is installed at a version this client speaks; returns it.
    pub async fn check_extension(&self) -> Result<String, Error> {
        let client = self.pool.get().await?;
        match ops::extension_version(&client).await? {
            None => Err(Error::ExtensionMissing(
                "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into(),
            )),
            Some(v) if SUPPORTED_EXTENSIONS.iter().any(|s| v == *s || v.starts_with(&format!("{s}."))) => Ok(v),
            Some(v) => Err(Error::ExtensionMissing(format!(
                "the idempotency extension is at version {v}; this client speaks {}",
                SUPPORTED_EXTENSIONS.iter().map(|s| format!("{s}.x")).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    fn reserve_options(&self, lease: Option<Duration>) -> ReserveOptions {
        ReserveOptions { ttl: self.config.ttl, lease, wait: self.config.wait }
    }

    /// The in-transaction flow: reserve the key, run `work` in the same transaction (behind a
    /// savepoint), record its result with `idem_complete`, commit. The closure runs at most
    /// once per key across every caller; duplicates get the stored result.
    ///
    /// - a result classified [`Class::Success`] / [`Class::Failure`] commits with the key as
    ///   `SUCCESS` / `FAILED` and is returned as `Outcome::Executed`;
    /// - a [`Class::Transient`] result, or an error whose [`HandlerError::disposition`] is
    ///   transient, rolls back to the savepoint and releases the key (`Outcome::Released` /
    ///   `Error::Handler`);
    /// - a permanent error rolls back to the savepoint and records `FAILED` with its response;
    /// - 40001 / 40P01 retry the whole transaction with backoff (the closure may run again,
    ///   but only one of its runs can ever commit).
    pub async fn run<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, mut work: F) -> Result<Outcome<T>, Error<E>>
    where
        T: Response + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Transaction<'_>) -> Work<'t, T, E> + Send,
    {
        let mut attempt = 0;
        loop {
            match self.run_once(key, fingerprint, &mut work).await {
                Err(e) if is_retryable(&e) && attempt < self.config.serialization_retries => {
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn run_once<T, E, F>(&self, key: &Key, fingerprint: &Fingerprint, work: &mut F) -> Result<Outcome<T>, Error<E>>
    where
        T: Response + Send,
        E: HandlerError + Send,
        F: for<'t> FnMut(&'t Transaction<'_>) -> Work<'t, T, E> + Send,
    {
        let mut client = self.pool.get().await?;
        let tx = match self.config.isolation {
            Some(level) => client.build_transaction().isolation_level(level).start().await?,
            None => client.transaction().await?,
        };
        let reservation =
            ops::reserve(&tx, key, fingerprint.as_str(), &self.reserve_options(self.config.lease)).await.map_err(Error::widen)?;
        let token = match reservation.outcome {
            ReserveOutcome::Created(token) => token,
            other => {
                tx.rollback().await?;
                return self.answer(other);
            }
        };
        tx.batch_execute("SAVEPOINT idem_work").await?;
        let (response, error) = match work(&tx).await {
            Ok(value) => match value.class() {
                Class::Transient => {
                    self.give_back(&tx, key, token).await?;
                    tx.commit().await?;
                    return Ok(Outcome::Released(value));
                }
                class => {
                    let stored = to_stored(&value).map_err(|e| Error::Decode(e.to_string()))?;
                    finish(tx, key, token, Some(&stored), status_of(class)).await?;
                    return Ok(Outcome::Executed(value));
                }
            },
            Err(e) => match e.disposition() {
                Disposition::Transient => {
                    self.give_back(&tx, key, token).await?;
                    tx.commit().await?;
                    return Err(Error::Handler(e));
                }
                Disposition::Permanent(response) => (response, e),
            },
        };
        // A permanent failure: undo its writes, remember the failure.
        tx.batch_execute("ROLLBACK TO SAVEPOINT idem_work").await?;
        finish(tx, key, token, response.as_ref(), Status::Failed).await?;
        Err(Error::Handler(error))
    }

    /// A transient failure inside `run`: undo the attempt's writes, count it, free the key.
    async fn give_back<E>(&self, tx: &Transaction<'_>, key: &Key, token: Token) -> Result<(), Error<E>> {
        tx.batch_execute("ROLLBACK TO SAVEPOINT idem_work").await?;
        released(ops::release(tx, key, token, self.config.max_retries).await.map_err(Error::widen)?)
    }

    /// Maps a non-`created` reservation to the caller's answer.
    fn answer<T: Response, E>(&self, outcome: ReserveOutcome) -> Result<Outcome<T>, Error<E>> {
        match outcome {
            ReserveOutcome::Replay(response) => serde_json::from_value(response.unwrap_or(Value::Null))
                .map(Outcome::Replayed)
                .map_err(|e| Error::Decode(e.to_string())),
            ReserveOutcome::Failed(response) => Err(Error::Failed { response }),
            ReserveOutcome::InProgress => Err(Error::InProgress { retry_after: self.config.retry_after }),
            ReserveOutcome::Mismatch => Err(Error::Mismatch),
            ReserveOutcome::Created(_) => unreachable!("answer() is only called for non-created outcomes"),
        }
    }

    /// The two-phase flow, for a side effect outside the database: reserve the key and commit;
    /// run `call` while a background task heartbeats the lease (a third of it apart); then, in
    /// one transaction, let `record` write the local result and complete the key. If the lease
    /// was lost meanwhile (recovered or taken over), `record`'s writes are rolled back and
    /// `LeaseLost` is returned. The heartbeat stops on every exit path.
    pub async fn run_external<T, E, C, R>(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        call: C,
        record: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Response + Send + Sync,
        E: HandlerError + Send,
        C: std::future::Future<Output = Result<T, E>> + Send,
        R: for<'t> FnOnce(&'t Transaction<'_>, &'t T) -> BoxFuture<'t, Result<(), E>> + Send,
    {
        let lease = self.config.lease.unwrap_or(DEFAULT_EXTERNAL_LEASE);
        let token = {
            let client = self.pool.get().await?;
            let reservation = ops::reserve(&client, key, fingerprint.as_str(), &self.reserve_options(Some(lease)))
                .await
                .map_err(Error::widen)?;
            match reservation.outcome {
                ReserveOutcome::Created(token) => token,
                other => return self.answer(other),
            }
        };

        let beat = Heartbeat::start(self.pool.clone(), key.clone(), token, lease);
        let result = call.await;
        drop(beat);

        let mut client = self.pool.get().await?;
        match result {
            Ok(value) => match value.class() {
                Class::Transient => {
                    self.release_external(&client, key, token).await?;
                    Ok(Outcome::Released(value))
                }
                class => {
                    let stored = to_stored(&value).map_err(|e| Error::Decode(e.to_string()))?;
                    let tx = client.transaction().await?;
                    record(&tx, &value).await.map_err(Error::Handler)?;
                    finish(tx, key, token, Some(&stored), status_of(class)).await?;
                    Ok(Outcome::Executed(value))
                }
            },
            Err(e) => {
                match e.disposition() {
                    Disposition::Transient => self.release_external(&client, key, token).await?,
                    Disposition::Permanent(response) => {
                        if !ops::complete(&client, key, token, response.as_ref(), Status::Failed)
                            .await
                            .map_err(Error::widen)?
                        {
                            return Err(Error::LeaseLost);
                        }
                    }
                }
                Err(Error::Handler(e))
            }
        }
    }

    async fn release_external<E>(&self, client: &deadpool_postgres::Client, key: &Key, token: Token) -> Result<(), Error<E>> {
        released(ops::release(client, key, token, self.config.max_retries).await.map_err(Error::widen)?)
    }
}

/// A release by the attempt itself: a stale answer means the key was taken from it.
fn released<E>(outcome: ReleaseOutcome) -> Result<(), Error<E>> {
    match outcome {
        ReleaseOutcome::Released | ReleaseOutcome::Poisoned => Ok(()),
        ReleaseOutcome::Stale => Err(Error::LeaseLost),
    }
}

fn status_of(class: Class) -> Status {
    if class == Class::Success {
        Status::Success
    } else {
        Status::Failed
    }
}

/// Completes the key in `tx` and commits, or rolls back and reports the lost lease.
async fn finish<E>(
    tx: Transaction<'_>,
    key: &Key,
    token: Token,
    response: Option<&Value>,
    status: Status,
) -> Result<(), Error<E>> {
    if !ops::complete(&tx, key, token, response, status).await.map_err(Error::widen)? {
        tx.rollback().await?;
        return Err(Error::LeaseLost);
    }
    tx.commit().await?;
    Ok(())
}

/// Exponential backoff with jitter for serialization retries: 10 ms, 20 ms, 40 ms ... (+0-50%).
fn backoff(attempt: u32) -> Duration {
    let base = 10u64 << attempt.min(8);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = base * u64::from(nanos % 50) / 100;
    Duration::from_millis(base + jitter)
}

/// The background heartbeat of `run_external`; stops when dropped.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start(pool: Pool, key: Key, token: Token, lease: Duration) -> Self {
        let every = (lease / 3).max(Duration::from_millis(10));
        Heartbeat(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Ok(client) = pool.get().await else { continue };
                // The key is lost: stop; the final complete is fenced and will say so. A failed
                // beat (an error) is retried a third of a lease later, before the lease ends.
                if let Ok(false) = ops::heartbeat(&client, &key, token, Some(lease)).await {
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
