//! One function per SQL call, generic over the executor: a pooled client or the caller's
//! transaction (`deadpool_postgres::GenericClient`). Statements are prepared once per connection
//! and cached; arguments are named; columns are listed and read by name.
//!
//! The API functions are called unqualified: the extension's schema must be on the connection's
//! `search_path` (it is when installed in `public`; otherwise add it, for example with
//! `options=-csearch_path=idem,public` in the connection string).

use crate::error::Error;
use crate::key::Key;
use deadpool_postgres::GenericClient;
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::Row;

pub const RESERVE_SQL: &str = "SELECT outcome, token, response, attempts, expires_at \
     FROM idem_reserve(operation => $1, user_id => $2, key => $3, request_hash => $4, \
     ttl => make_interval(secs => $5::float8), lease => make_interval(secs => $6::float8), wait => $7)";
pub const COMPLETE_SQL: &str = "SELECT idem_complete(operation => $1, user_id => $2, key => $3, \
     token => $4, response => $5, status => $6) AS completed";
pub const RELEASE_SQL: &str = "SELECT idem_release(operation => $1, user_id => $2, key => $3, \
     token => $4, max_retries => $5) AS released";
pub const HEARTBEAT_SQL: &str = "SELECT idem_heartbeat(operation => $1, user_id => $2, key => $3, \
     token => $4, lease => make_interval(secs => $5::float8)) AS extended";
pub const RECOVER_STUCK_SQL: &str = "SELECT idem_recover_stuck(batch_size => $1, action => $2, \
     max_retries => $3) AS handled";
pub const SWEEP_SQL: &str = "SELECT idem_sweep(batch_size => $1) AS deleted";
pub const LOOKUP_SQL: &str = "SELECT operation, user_id, key, request_hash, status, token, response, \
     lease_expires_at, expires_at, created_at, updated_at \
     FROM idem_lookup(operation => $1, user_id => $2, key => $3)";
pub const STATS_SQL: &str = "SELECT processing, success, failed, stuck, expired, \
     extract(epoch FROM oldest_processing_age)::float8 AS oldest_processing_secs FROM idem_stats()";
/// The version of the install whose `idem_reserve` the search_path finds: the extension's, or a
/// portable install's (`_idem_portable_version()` in that schema); else any extension's; else NULL.
pub const EXTENSION_VERSION_SQL: &str = "
    WITH api AS (SELECT p.pronamespace AS ns FROM pg_catalog.pg_proc AS p
                  WHERE p.oid = pg_catalog.to_regproc('idem_reserve'))
    SELECT coalesce(
        (SELECT e.extversion FROM pg_catalog.pg_extension AS e, api
          WHERE e.extname = 'idempotency' AND e.extnamespace = api.ns),
        (SELECT pg_catalog.substring(p.prosrc, '''([0-9][^'']*)''') FROM pg_catalog.pg_proc AS p, api
          WHERE p.pronamespace = api.ns AND p.proname = '_idem_portable_version'),
        (SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname = 'idempotency')) AS extversion";

/// The fencing token of a `created` reservation: pass it to every later call for the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub i64);

/// What `idem_reserve` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum ReserveOutcome {
    /// This attempt owns the key.
    Created(Token),
    /// A `SUCCESS` record with the same request: its stored response.
    Replay(Option<Value>),
    /// A `FAILED` record with the same request: its stored response, if any.
    Failed(Option<Value>),
    /// Another attempt holds the key.
    InProgress,
    /// The key is live with a different request.
    Mismatch,
}

/// The full answer of `idem_reserve`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub outcome: ReserveOutcome,
    /// Transient failures counted for this key so far.
    pub attempts: i32,
    /// When the record expires (None when another transaction's uncommitted reservation answered).
    pub expires_at: Option<SystemTime>,
}

/// Options of `idem_reserve`; `None` durations mean the server's `idempotency.*` defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReserveOptions {
    pub ttl: Option<Duration>,
    pub lease: Option<Duration>,
    /// Block on another transaction's uncommitted reservation instead of answering in progress.
    pub wait: bool,
}

/// The final state `idem_complete` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Success,
    /// A permanent failure, replayed as failed.
    Failed,
}

impl Status {
    fn as_sql(self) -> &'static str {
        match self {
            Status::Success => "SUCCESS",
            Status::Failed => "FAILED",
        }
    }
}

/// What `idem_release` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The record was deleted: a retry runs again.
    Released,
    /// `max_retries` transient failures: the record is now `FAILED`.
    Poisoned,
    /// The token no longer holds the key.
    Stale,
}

/// What `idem_recover_stuck` does with a stuck attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoverAction {
    /// Mark it `FAILED` (at most once: the dead worker may have done the work).
    Fail,
    /// Count a transient failure and let a retry run.
    Release,
}

/// A record, as `idem_lookup` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub operation: String,
    pub user_id: String,
    pub key: String,
    pub request_hash: String,
    pub status: String,
    pub token: Token,
    pub response: Option<Value>,
    pub lease_expires_at: SystemTime,
    pub expires_at: SystemTime,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

/// What `idem_stats` counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub processing: i64,
    pub success: i64,
    pub failed: i64,
    pub stuck: i64,
    pub expired: i64,
    pub oldest_processing_age: Option<Duration>,
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, Error> {
    row.try_get(name).map_err(Error::Db)
}

/// `idem_reserve`.
pub async fn reserve<C: GenericClient>(
    client: &C,
    key: &Key,
    request_hash: &str,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    crate::key::check_request_hash(request_hash)?;
    let stmt = client.prepare_cached(RESERVE_SQL).await?;
    let row = client
        .query_one(
            &stmt,
            &[
                &key.operation(),
                &key.user_id(),
                &key.key(),
                &request_hash,
                &secs(options.ttl),
                &secs(options.lease),
                &options.wait,
            ],
        )
        .await?;
    let outcome: String = col(&row, "outcome")?;
    let outcome = match outcome.as_str() {
        "created" => {
            let token: Option<i64> = col(&row, "token")?;
            let token = token.ok_or_else(|| Error::ExtensionMissing("idem_reserve answered created without a token".into()))?;
            ReserveOutcome::Created(Token(token))
        }
        "replay" => ReserveOutcome::Replay(col(&row, "response")?),
        "failed" => ReserveOutcome::Failed(col(&row, "response")?),
        "in_progress" => ReserveOutcome::InProgress,
        "mismatch" => ReserveOutcome::Mismatch,
        other => {
            return Err(Error::ExtensionMissing(format!(
                "idem_reserve answered an outcome this client does not know: {other:?}"
            )))
        }
    };
    Ok(Reservation { outcome, attempts: col(&row, "attempts")?, expires_at: col(&row, "expires_at")? })
}

/// `idem_complete`: true when this token held the key and the record is now `status`.
pub async fn complete<C: GenericClient>(
    client: &C,
    key: &Key,
    token: Token,
    response: Option<&Value>,
    status: Status,
) -> Result<bool, Error> {
    let stmt = client.prepare_cached(COMPLETE_SQL).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &response, &status.as_sql()])
        .await?;
    col(&row, "completed")
}

/// `idem_release`: a transient failure of the attempt holding `token`.
pub async fn release<C: GenericClient>(
    client: &C,
    key: &Key,
    token: Token,
    max_retries: Option<i32>,
) -> Result<ReleaseOutcome, Error> {
    let stmt = client.prepare_cached(RELEASE_SQL).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &max_retries])
        .await?;
    let answer: String = col(&row, "released")?;
    match answer.as_str() {
        "released" => Ok(ReleaseOutcome::Released),
        "poisoned" => Ok(ReleaseOutcome::Poisoned),
        "stale" => Ok(ReleaseOutcome::Stale),
        other => Err(Error::ExtensionMissing(format!("idem_release answered {other:?}"))),
    }
}

/// `idem_heartbeat`: false when the token no longer holds the key.
pub async fn heartbeat<C: GenericClient>(
    client: &C,
    key: &Key,
    token: Token,
    lease: Option<Duration>,
) -> Result<bool, Error> {
    let stmt = client.prepare_cached(HEARTBEAT_SQL).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &secs(lease)])
        .await?;
    col(&row, "extended")
}

/// `idem_recover_stuck`: how many stuck attempts were handled.
pub async fn recover_stuck<C: GenericClient>(
    client: &C,
    batch_size: i32,
    action: RecoverAction,
    max_retries: Option<i32>,
) -> Result<i64, Error> {
    let action = match action {
        RecoverAction::Fail => "fail",
        RecoverAction::Release => "release",
    };
    let stmt = client.prepare_cached(RECOVER_STUCK_SQL).await?;
    let row = client.query_one(&stmt, &[&batch_size, &action, &max_retries]).await?;
    col(&row, "handled")
}

/// `idem_sweep`: how many expired rows were deleted.
pub async fn sweep<C: GenericClient>(client: &C, batch_size: i32) -> Result<i64, Error> {
    let stmt = client.prepare_cached(SWEEP_SQL).await?;
    let row = client.query_one(&stmt, &[&batch_size]).await?;
    col(&row, "deleted")
}

/// `idem_lookup` (operators only).
pub async fn lookup<C: GenericClient>(client: &C, key: &Key) -> Result<Option<Record>, Error> {
    let stmt = client.prepare_cached(LOOKUP_SQL).await?;
    let Some(row) = client.query_opt(&stmt, &[&key.operation(), &key.user_id(), &key.key()]).await? else {
        return Ok(None);
    };
    Ok(Some(Record {
        operation: col(&row, "operation")?,
        user_id: col(&row, "user_id")?,
        key: col(&row, "key")?,
        request_hash: col(&row, "request_hash")?,
        status: col(&row, "status")?,
        token: Token(col(&row, "token")?),
        response: col(&row, "response")?,
        lease_expires_at: col(&row, "lease_expires_at")?,
        expires_at: col(&row, "expires_at")?,
        created_at: col(&row, "created_at")?,
        updated_at: col(&row, "updated_at")?,
    }))
}

/// `idem_stats` (operators only).
pub async fn stats<C: GenericClient>(client: &C) -> Result<Stats, Error> {
    let stmt = client.prepare_cached(STATS_SQL).await?;
    let row = client.query_one(&stmt, &[]).await?;
    let oldest: Option<f64> = col(&row, "oldest_processing_secs")?;
    Ok(Stats {
        processing: col(&row, "processing")?,
        success: col(&row, "success")?,
        failed: col(&row, "failed")?,
        stuck: col(&row, "stuck")?,
        expired: col(&row, "expired")?,
        oldest_processing_age: oldest.and_then(|s| Duration::try_from_secs_f64(s).ok()),
    })
}

/// The installed version (extension or portable), or None when neither is installed here.
pub async fn extension_version<C: GenericClient>(client: &C) -> Result<Option<String>, Error> {
    let stmt = client.prepare_cached(EXTENSION_VERSION_SQL).await?;
    let row = client.query_one(&stmt, &[]).await?;
    col(&row, "extversion")
}
