//! The driver-neutral types of the client's calls (also re-exported by `ops`): what `idem_reserve` answers, its options, a
//! record and the counters, and how each is read from a row (through `row::Row`, the
//! one column-access trait every driver implements).

use crate::error::Error;
use crate::row::{required, Row};
use idempotency_core::ReserveWord;
pub use idempotency_core::{ReleaseOutcome, Status};
use serde_json::Value;
use std::time::{Duration, SystemTime};

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
    /// The key has a recovery point and no live holder (`RESUMABLE`, or `PROCESSING` with its
    /// lease run out): this attempt now owns it and continues after the recorded step
    /// (`Idempotency::run_steps`; the repository's docs/recovery-points.md).
    Resume {
        /// The attempt's fencing token.
        token: Token,
        /// The last recovery point committed (0: the request's input saved).
        step: i32,
        /// That recovery point's state.
        state: Option<Value>,
    },
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
    /// The answer from a row of `reserve` or `reserve_many`.
    pub(crate) fn read(row: &impl Row) -> Result<Self, Error> {
        let outcome = required("outcome", row.text("outcome"))?;
        let word = ReserveWord::parse(&outcome).map_err(|e| Error::protocol(e.to_string()))?;
        let outcome = match word {
            ReserveWord::Created => match row.int8("token")? {
                Some(token) => ReserveOutcome::Created(Token(token)),
                None => return Err(Error::protocol("idem_reserve answered created without a token")),
            },
            ReserveWord::Replay => ReserveOutcome::Replay(row.json("response")?),
            ReserveWord::Failed => ReserveOutcome::Failed(row.json("response")?),
            ReserveWord::InProgress => ReserveOutcome::InProgress,
            ReserveWord::Mismatch => ReserveOutcome::Mismatch,
            // Only `run_steps`'s statement selects `step` and `state`: another statement's row
            // fails here, naming the column (docs/recovery-points.md, a 0.6 client's answer).
            ReserveWord::Resume => match row.int8("token")? {
                Some(token) => ReserveOutcome::Resume { token: Token(token), step: required("step", row.int4("step"))?, state: row.json("state")? },
                None => return Err(Error::protocol("idem_reserve answered resume without a token")),
            },
        };
        Ok(Reservation { outcome, attempts: row.int4("attempts")?.unwrap_or(0), expires_at: instant(row.float8("expires_at")?) })
    }
}

/// An instant read as seconds since the epoch (the statements answer `extract(epoch ..)`).
fn instant(secs: Option<f64>) -> Option<SystemTime> {
    secs.and_then(|secs| SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?))
}

/// An instant that must be there.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn required_instant(row: &impl Row, name: &str) -> Result<SystemTime, Error> {
    instant(Some(required(name, row.float8(name))?)).ok_or_else(|| Error::protocol(format!("column {name:?} is out of range")))
}

/// The answer of `release` (column `released`) or of the failure path's `reserve_and_release`
/// (column `answer`, NULL when the key was not created again).
pub(crate) fn release_answer(row: &impl Row, column: &str) -> Result<Option<ReleaseOutcome>, Error> {
    row.text(column)?.map(|a| ReleaseOutcome::parse(&a).map_err(|e| Error::protocol(e.to_string()))).transpose()
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

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl Record {
    /// The record from a row of `lookup`.
    pub(crate) fn read(row: &impl Row) -> Result<Self, Error> {
        Ok(Record {
            operation: required("operation", row.text("operation"))?,
            user_id: required("user_id", row.text("user_id"))?,
            key: required("key", row.text("key"))?,
            request_hash: required("request_hash", row.text("request_hash"))?,
            status: Status::parse(&required("status", row.text("status"))?).map_err(|e| Error::protocol(e.to_string()))?,
            token: Token(required("token", row.int8("token"))?),
            response: row.json("response")?,
            lease_expires_at: required_instant(row, "lease_expires_at")?,
            expires_at: required_instant(row, "expires_at")?,
            created_at: required_instant(row, "created_at")?,
            updated_at: required_instant(row, "updated_at")?,
        })
    }
}

/// What `idem_stats` counts: the records in flight, stuck and expired exactly, the finished ones
/// estimated from the planner's statistics of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Records in flight.
    pub processing: i64,
    /// Completed records, estimated; `None` until the table's first `ANALYZE` (autovacuum's or
    /// yours), when there is no estimate to give.
    pub success: Option<i64>,
    /// Failed or poisoned records, estimated; `None` as [`Stats::success`].
    pub failed: Option<i64>,
    /// `PROCESSING` records whose lease has expired.
    pub stuck: i64,
    /// Records past their expiry, awaiting a sweep.
    pub expired: i64,
    /// The age of the oldest `PROCESSING` record.
    pub oldest_processing_age: Option<Duration>,
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl Stats {
    /// The counters from the row of `stats`.
    pub(crate) fn read(row: &impl Row) -> Result<Self, Error> {
        Ok(Stats {
            processing: required("processing", row.int8("processing"))?,
            success: row.int8("success")?,
            failed: row.int8("failed")?,
            stuck: required("stuck", row.int8("stuck"))?,
            expired: required("expired", row.int8("expired"))?,
            oldest_processing_age: row.float8("oldest_processing_secs")?.and_then(|s| Duration::try_from_secs_f64(s).ok()),
        })
    }
}

/// Seconds, as the statements take durations (`make_interval(secs => ..)`).
pub(crate) fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}
