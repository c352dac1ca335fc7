//! One function per SQL call, generic over the executor: a pooled client or a transaction you
//! hold (`deadpool_postgres::GenericClient`). Statements are prepared once per connection and
//! cached; columns are read by name; every call is qualified with the extension's [`Schema`]
//! (the statement texts live in one place, shared with every driver).

use crate::driver::postgres::ours;
use crate::error::Error;
pub use crate::sql::Schema;
use deadpool_postgres::GenericClient;
use idempotency_core::{Fingerprint, Key};
pub use idempotency_core::{ReleaseOutcome, Status};
use idempotency_core::ReserveWord;
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::{Row, Statement};

/// The installed extension's schema and version, checked against the versions this client
/// speaks.
pub(crate) async fn installed<C: GenericClient>(client: &C) -> Result<(String, String), Error> {
    let stmt = client.prepare_cached(crate::sql::EXTENSION_SQL).await?;
    let Some(row) = client.query_opt(&stmt, &[]).await? else {
        return Err(Error::IncompatibleExtension {
            reason: "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into(),
            source: None,
        });
    };
    let (schema, version): (String, String) = (col(&row, "schema")?, col(&row, "version")?);
    crate::sql::check_version(&version)?;
    Ok((schema, version))
}

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
    /// What the reservation answered.
    pub outcome: ReserveOutcome,
    /// Transient failures counted for this key so far.
    pub attempts: i32,
    /// When the record expires (None when another transaction's uncommitted reservation answered).
    pub expires_at: Option<SystemTime>,
}

impl Reservation {
    /// The answer from its columns, as every driver reads them.
    pub(crate) fn from_columns(
        outcome: &str,
        token: Option<i64>,
        response: Option<Value>,
        attempts: i32,
        expires_at: Option<f64>,
    ) -> Result<Self, Error> {
        let expires_at = expires_at.and_then(|secs| SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?));
        let word = ReserveWord::parse(outcome).map_err(|e| Error::protocol(e.to_string()))?;
        let outcome = match word {
            ReserveWord::Created => match token {
                Some(token) => ReserveOutcome::Created(Token(token)),
                None => return Err(Error::protocol("idem_reserve answered created without a token")),
            },
            ReserveWord::Replay => ReserveOutcome::Replay(response),
            ReserveWord::Failed => ReserveOutcome::Failed(response),
            ReserveWord::InProgress => ReserveOutcome::InProgress,
            ReserveWord::Mismatch => ReserveOutcome::Mismatch,
        };
        Ok(Reservation { outcome, attempts, expires_at })
    }

    /// The answer from a simple query's text row.
    pub(crate) fn from_text(row: &tokio_postgres::SimpleQueryRow) -> Result<Self, Error> {
        fn parse<T: std::str::FromStr>(row: &tokio_postgres::SimpleQueryRow, name: &str) -> Result<Option<T>, Error> {
            match row.try_get(name) {
                Ok(None) => Ok(None),
                Ok(Some(text)) => text.parse().map(Some).map_err(|_| Error::protocol(format!("cannot read column {name:?}: {text:?}"))),
                Err(e) => Err(Error::Protocol { reason: format!("cannot read column {name:?}"), source: Some(Box::new(e)) }),
            }
        }
        let outcome: Option<String> = parse(row, "outcome")?;
        let response = match parse::<String>(row, "response")? {
            Some(text) => Some(serde_json::from_str(&text).map_err(Error::Decode)?),
            None => None,
        };
        Reservation::from_columns(
            outcome.as_deref().unwrap_or(""),
            parse(row, "token")?,
            response,
            parse(row, "attempts")?.unwrap_or(0),
            parse(row, "expires_at")?,
        )
    }
}

/// Options of `idem_reserve`; `None` durations mean the server's `idempotency.*` defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReserveOptions {
    /// How long the record is kept (`idempotency.ttl` when None).
    pub ttl: Option<Duration>,
    /// How long the attempt may hold the key before it counts as stuck (`idempotency.lease`).
    pub lease: Option<Duration>,
    /// Block on another transaction's uncommitted reservation instead of answering in progress.
    pub wait: bool,
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
    /// The operation of the key's scope.
    pub operation: String,
    /// The user of the key's scope.
    pub user_id: String,
    /// The idempotency key.
    pub key: String,
    /// The fingerprint of the request that reserved the key.
    pub request_hash: String,
    /// The record's status.
    pub status: Status,
    /// The token of the attempt that holds or held the key.
    pub token: Token,
    /// The stored response, if any.
    pub response: Option<Value>,
    /// When the attempt's lease ends (or ended).
    pub lease_expires_at: SystemTime,
    /// When the record expires.
    pub expires_at: SystemTime,
    /// When the record was created.
    pub created_at: SystemTime,
    /// When the record last changed.
    pub updated_at: SystemTime,
}

/// What `idem_stats` counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Records in flight.
    pub processing: i64,
    /// Completed records.
    pub success: i64,
    /// Failed or poisoned records.
    pub failed: i64,
    /// `PROCESSING` records whose lease has expired.
    pub stuck: i64,
    /// Records past their expiry, awaiting a sweep.
    pub expired: i64,
    /// The age of the oldest `PROCESSING` record.
    pub oldest_processing_age: Option<Duration>,
}

pub(crate) fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// A column by name; a missing or mistyped column is a protocol error.
pub(crate) fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, Error> {
    row.try_get(name)
        .map_err(|e| Error::Protocol { reason: format!("cannot read column {name:?}"), source: Some(Box::new(e)) })
}

pub(crate) async fn prepare<C: GenericClient>(client: &C, sql: &str) -> Result<Statement, Error> {
    client.prepare_cached(sql).await.map_err(ours)
}

/// `idem_reserve`.
pub async fn reserve<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    let stmt = prepare(client, &schema.sql().reserve).await?;
    reserve_prepared(client, &stmt, key, fingerprint, options).await
}

/// `idem_reserve` with its statement prepared: sends at once when first polled, so it can be
/// pipelined between other statements.
pub(crate) async fn reserve_prepared<C: GenericClient>(
    client: &C,
    stmt: &Statement,
    key: &Key,
    fingerprint: &Fingerprint,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    let row = client
        .query_one(
            stmt,
            &[
                &key.operation(),
                &key.user_id(),
                &key.key(),
                &fingerprint.as_str(),
                &secs(options.ttl),
                &secs(options.lease),
                &options.wait,
            ],
        )
        .await
        .map_err(ours)?;
    Reservation::from_columns(
        &col::<String>(&row, "outcome")?,
        col(&row, "token")?,
        col(&row, "response")?,
        col(&row, "attempts")?,
        col(&row, "expires_at")?,
    )
}

/// `idem_complete`: true when this token held the key and the record is now `status`.
pub async fn complete<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    response: Option<&Value>,
    status: Status,
) -> Result<bool, Error> {
    let stmt = prepare(client, &schema.sql().complete).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &response, &status.as_str()])
        .await
        .map_err(ours)?;
    col(&row, "completed")
}

/// `idem_release`: a transient failure of the attempt holding `token`.
pub async fn release<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    max_retries: Option<i32>,
) -> Result<ReleaseOutcome, Error> {
    let stmt = prepare(client, &schema.sql().release).await?;
    release_prepared(client, &stmt, key, token, max_retries).await
}

/// `idem_release` with its statement prepared (see [`reserve_prepared`]).
pub(crate) async fn release_prepared<C: GenericClient>(
    client: &C,
    stmt: &Statement,
    key: &Key,
    token: Token,
    max_retries: Option<i32>,
) -> Result<ReleaseOutcome, Error> {
    let row = client
        .query_one(stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &max_retries])
        .await
        .map_err(ours)?;
    let answer: String = col(&row, "released")?;
    ReleaseOutcome::parse(&answer).map_err(|e| Error::protocol(e.to_string()))
}

/// `idem_heartbeat`: false when the token no longer holds the key.
pub async fn heartbeat<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    lease: Option<Duration>,
) -> Result<bool, Error> {
    let stmt = prepare(client, &schema.sql().heartbeat).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &secs(lease)])
        .await
        .map_err(ours)?;
    col(&row, "extended")
}

/// `idem_recover_stuck`: how many stuck attempts were handled.
pub async fn recover_stuck<C: GenericClient>(
    client: &C,
    schema: &Schema,
    batch_size: i32,
    action: RecoverAction,
    max_retries: Option<i32>,
) -> Result<i64, Error> {
    let action = match action {
        RecoverAction::Fail => "fail",
        RecoverAction::Release => "release",
    };
    let stmt = prepare(client, &schema.sql().recover_stuck).await?;
    let row = client.query_one(&stmt, &[&batch_size, &action, &max_retries]).await.map_err(ours)?;
    col(&row, "handled")
}

/// `idem_sweep`: how many expired rows were deleted.
pub async fn sweep<C: GenericClient>(client: &C, schema: &Schema, batch_size: i32) -> Result<i64, Error> {
    let stmt = prepare(client, &schema.sql().sweep).await?;
    let row = client.query_one(&stmt, &[&batch_size]).await.map_err(ours)?;
    col(&row, "deleted")
}

/// `idem_lookup` (operators only).
pub async fn lookup<C: GenericClient>(client: &C, schema: &Schema, key: &Key) -> Result<Option<Record>, Error> {
    let stmt = prepare(client, &schema.sql().lookup).await?;
    let Some(row) = client.query_opt(&stmt, &[&key.operation(), &key.user_id(), &key.key()]).await.map_err(ours)? else {
        return Ok(None);
    };
    Ok(Some(Record {
        operation: col(&row, "operation")?,
        user_id: col(&row, "user_id")?,
        key: col(&row, "key")?,
        request_hash: col(&row, "request_hash")?,
        status: Status::parse(&col::<String>(&row, "status")?).map_err(|e| Error::protocol(e.to_string()))?,
        token: Token(col(&row, "token")?),
        response: col(&row, "response")?,
        lease_expires_at: col(&row, "lease_expires_at")?,
        expires_at: col(&row, "expires_at")?,
        created_at: col(&row, "created_at")?,
        updated_at: col(&row, "updated_at")?,
    }))
}

/// `idem_stats` (operators only).
pub async fn stats<C: GenericClient>(client: &C, schema: &Schema) -> Result<Stats, Error> {
    let stmt = prepare(client, &schema.sql().stats).await?;
    let row = client.query_one(&stmt, &[]).await.map_err(ours)?;
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

