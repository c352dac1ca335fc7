//! One function per SQL call, generic over the executor: a pooled client or a transaction you
//! hold (`deadpool_postgres::GenericClient`). Statements are prepared once per connection and
//! cached; arguments are named; columns are listed and read by name; every call is qualified
//! with the extension's [`Schema`], never by changing the `search_path`.

use crate::error::{ours, Error};
use crate::key::{check_request_hash, Key};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_postgres::{Row, Statement};

/// The extension versions this client speaks (major.minor): 0.2, 0.3 and 0.4 changed no signature
/// or outcome of the functions it calls.
const SUPPORTED_EXTENSIONS: &[&str] = &["0.1", "0.2", "0.3", "0.4"];

/// Where the extension lives and its version: the extension's schema, else the schema of a
/// portable install (which records its version in `_idem_portable_version()`), so the client
/// cannot tell the two apart.
const EXTENSION_SQL: &str = "SELECT schema, version FROM ( \
       SELECT 0 AS rank, n.nspname AS schema, e.extversion AS version \
         FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
        WHERE e.extname = 'idempotency' \
       UNION ALL \
       SELECT 1, n.nspname, pg_catalog.substring(p.prosrc, '''([0-9][^'']*)''') \
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
        WHERE p.proname = '_idem_portable_version') AS installs \
     ORDER BY rank, schema LIMIT 1";

/// The schema the extension's functions are called in (`CREATE EXTENSION idempotency SCHEMA
/// s`), with this crate's statements qualified with it. Cheap to clone.
#[derive(Clone)]
pub struct Schema(Arc<Statements>);

/// Every statement of the crate, for one schema. Built once per [`Schema`].
struct Statements {
    name: String,
    reserve: String,
    complete: String,
    /// `idem_complete` that aborts the transaction when it answers false, so that a `COMMIT`
    /// pipelined behind it commits only a completed key (see `handle.rs`).
    complete_or_abort: String,
    release: String,
    heartbeat: String,
    recover_stuck: String,
    sweep: String,
    lookup: String,
    stats: String,
}

/// The text of the abort in `complete_or_abort`: invalid input for `boolean` (SQLSTATE 22P02).
pub(crate) const LEASE_LOST_MARK: &str = "idempotency: lease lost";

impl Schema {
    /// The extension is installed in schema `name` (no quoting needed: it is quoted here).
    /// A [`Error::Configuration`] error if `name` is empty, longer than 63 bytes or contains NUL.
    pub fn named(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        if name.is_empty() || name.len() > 63 || name.contains('\0') {
            return Err(Error::Configuration {
                reason: format!("schema must be 1 to 63 bytes without NUL, got {name:?}"),
                source: None,
            });
        }
        let s = quote_ident(&name);
        let key = "operation => $1, user_id => $2, key => $3";
        let complete = format!("{s}.idem_complete({key}, token => $4, response => $5, status => $6)");
        Ok(Schema(Arc::new(Statements {
            reserve: format!(
                "SELECT outcome, token, response, attempts, expires_at FROM {s}.idem_reserve({key}, request_hash => $4, \
                 ttl => make_interval(secs => $5::float8), lease => make_interval(secs => $6::float8), wait => $7)"
            ),
            complete_or_abort: format!(
                "SELECT (CASE WHEN {complete} THEN 'true' ELSE '{LEASE_LOST_MARK}' END)::pg_catalog.bool AS completed"
            ),
            complete: format!("SELECT {complete} AS completed"),
            release: format!("SELECT {s}.idem_release({key}, token => $4, max_retries => $5) AS released"),
            heartbeat: format!(
                "SELECT {s}.idem_heartbeat({key}, token => $4, lease => make_interval(secs => $5::float8)) AS extended"
            ),
            recover_stuck: format!(
                "SELECT {s}.idem_recover_stuck(batch_size => $1, action => $2, max_retries => $3) AS handled"
            ),
            sweep: format!("SELECT {s}.idem_sweep(batch_size => $1) AS deleted"),
            lookup: format!(
                "SELECT operation, user_id, key, request_hash, status, token, response, lease_expires_at, expires_at, \
                 created_at, updated_at FROM {s}.idem_lookup({key})"
            ),
            stats: format!(
                "SELECT processing, success, failed, stuck, expired, \
                 extract(epoch FROM oldest_processing_age)::float8 AS oldest_processing_secs FROM {s}.idem_stats()"
            ),
            name,
        })))
    }

    /// The schema the extension is installed in, from `pg_extension`, after checking that it is
    /// at a version this client speaks (0.1.x, 0.2.x or 0.3.x). [`Error::ExtensionMissing`] otherwise.
    pub async fn of_extension<C: GenericClient>(client: &C) -> Result<Self, Error> {
        let (schema, _) = installed(client).await?;
        Schema::named(schema)
    }

    /// The schema's name, unquoted.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub(crate) fn reserve_sql(&self) -> &str {
        &self.0.reserve
    }

    pub(crate) fn complete_or_abort_sql(&self) -> &str {
        &self.0.complete_or_abort
    }

    pub(crate) fn release_sql(&self) -> &str {
        &self.0.release
    }
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schema").field(&self.0.name).finish()
    }
}

impl PartialEq for Schema {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

/// `"name"`, with embedded quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The installed extension's schema and version, checked against the versions this client
/// speaks.
pub(crate) async fn installed<C: GenericClient>(client: &C) -> Result<(String, String), Error> {
    let stmt = client.prepare_cached(EXTENSION_SQL).await?;
    let Some(row) = client.query_opt(&stmt, &[]).await? else {
        return Err(Error::ExtensionMissing {
            reason: "the idempotency extension is not installed in this database (CREATE EXTENSION idempotency)".into(),
            source: None,
        });
    };
    let (schema, version): (String, String) = (col(&row, "schema")?, col(&row, "version")?);
    if SUPPORTED_EXTENSIONS.iter().any(|s| version == *s || version.starts_with(&format!("{s}."))) {
        Ok((schema, version))
    } else {
        let speaks: Vec<String> = SUPPORTED_EXTENSIONS.iter().map(|s| format!("{s}.x")).collect();
        Err(Error::ExtensionMissing {
            reason: format!("the idempotency extension is at version {version}; this client speaks {}", speaks.join(", ")),
            source: None,
        })
    }
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

/// The final state `idem_complete` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Done: replayed to every retry.
    Success,
    /// A permanent failure, replayed as failed.
    Failed,
}

impl Status {
    pub(crate) fn as_sql(self) -> &'static str {
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
    /// The operation of the key's scope.
    pub operation: String,
    /// The user of the key's scope.
    pub user_id: String,
    /// The idempotency key.
    pub key: String,
    /// The fingerprint of the request that reserved the key.
    pub request_hash: String,
    /// `PROCESSING`, `SUCCESS` or `FAILED`.
    pub status: String,
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

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// A column by name; a missing or mistyped column is a protocol error.
fn col<'a, T: tokio_postgres::types::FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, Error> {
    row.try_get(name)
        .map_err(|e| Error::Protocol { reason: format!("cannot read column {name:?}"), source: Some(e) })
}

async fn prepare<C: GenericClient>(client: &C, sql: &str) -> Result<Statement, Error> {
    client.prepare_cached(sql).await.map_err(ours)
}

/// `idem_reserve`.
pub async fn reserve<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    request_hash: &str,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    check_request_hash(request_hash)?;
    let stmt = prepare(client, schema.reserve_sql()).await?;
    reserve_prepared(client, &stmt, key, request_hash, options).await
}

/// `idem_reserve` with its statement prepared: sends at once when first polled, so it can be
/// pipelined between other statements. `request_hash` must have been checked.
pub(crate) async fn reserve_prepared<C: GenericClient>(
    client: &C,
    stmt: &Statement,
    key: &Key,
    request_hash: &str,
    options: &ReserveOptions,
) -> Result<Reservation, Error> {
    let row = client
        .query_one(
            stmt,
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
        .await
        .map_err(ours)?;
    let outcome: String = col(&row, "outcome")?;
    let outcome = match outcome.as_str() {
        "created" => match col::<Option<i64>>(&row, "token")? {
            Some(token) => ReserveOutcome::Created(Token(token)),
            None => return Err(Error::Protocol { reason: "idem_reserve answered created without a token".into(), source: None }),
        },
        "replay" => ReserveOutcome::Replay(col(&row, "response")?),
        "failed" => ReserveOutcome::Failed(col(&row, "response")?),
        "in_progress" => ReserveOutcome::InProgress,
        "mismatch" => ReserveOutcome::Mismatch,
        other => {
            return Err(Error::Protocol { reason: format!("idem_reserve answered the unknown outcome {other:?}"), source: None })
        }
    };
    Ok(Reservation { outcome, attempts: col(&row, "attempts")?, expires_at: col(&row, "expires_at")? })
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
    let stmt = prepare(client, &schema.0.complete).await?;
    let row = client
        .query_one(&stmt, &[&key.operation(), &key.user_id(), &key.key(), &token.0, &response, &status.as_sql()])
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
    let stmt = prepare(client, schema.release_sql()).await?;
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
    match answer.as_str() {
        "released" => Ok(ReleaseOutcome::Released),
        "poisoned" => Ok(ReleaseOutcome::Poisoned),
        "stale" => Ok(ReleaseOutcome::Stale),
        other => Err(Error::Protocol { reason: format!("idem_release answered the unknown word {other:?}"), source: None }),
    }
}

/// `idem_heartbeat`: false when the token no longer holds the key.
pub async fn heartbeat<C: GenericClient>(
    client: &C,
    schema: &Schema,
    key: &Key,
    token: Token,
    lease: Option<Duration>,
) -> Result<bool, Error> {
    let stmt = prepare(client, &schema.0.heartbeat).await?;
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
    let stmt = prepare(client, &schema.0.recover_stuck).await?;
    let row = client.query_one(&stmt, &[&batch_size, &action, &max_retries]).await.map_err(ours)?;
    col(&row, "handled")
}

/// `idem_sweep`: how many expired rows were deleted.
pub async fn sweep<C: GenericClient>(client: &C, schema: &Schema, batch_size: i32) -> Result<i64, Error> {
    let stmt = prepare(client, &schema.0.sweep).await?;
    let row = client.query_one(&stmt, &[&batch_size]).await.map_err(ours)?;
    col(&row, "deleted")
}

/// `idem_lookup` (operators only).
pub async fn lookup<C: GenericClient>(client: &C, schema: &Schema, key: &Key) -> Result<Option<Record>, Error> {
    let stmt = prepare(client, &schema.0.lookup).await?;
    let Some(row) = client.query_opt(&stmt, &[&key.operation(), &key.user_id(), &key.key()]).await.map_err(ours)? else {
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
pub async fn stats<C: GenericClient>(client: &C, schema: &Schema) -> Result<Stats, Error> {
    let stmt = prepare(client, &schema.0.stats).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_quoted_and_checked() {
        let s = Schema::named("my \"idem\"").unwrap();
        assert!(s.reserve_sql().contains("FROM \"my \"\"idem\"\"\".idem_reserve("), "{}", s.reserve_sql());
        assert_eq!(s.name(), "my \"idem\"");
        for bad in ["", "a\0b", &"x".repeat(64)] {
            assert!(matches!(Schema::named(bad), Err(Error::Configuration { .. })), "{bad:?}");
        }
    }
}
