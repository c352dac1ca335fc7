//! The text of every statement this crate sends, for one schema, written once for every driver.
//! Arguments are named; columns are listed; every call is qualified with the extension's schema,
//! never by changing the `search_path`.

use crate::error::Error;
use crate::types::{secs, ReserveOptions, Status, Token};
use idempotency_core::{Fingerprint, Key};
use std::fmt;
use std::sync::Arc;

/// The extension versions this client speaks (major.minor): 0.2 to 0.7 changed no signature or
/// outcome of the functions it calls (0.6 refuses another role's key with 42501).
pub(crate) const SUPPORTED_EXTENSIONS: &[&str] = &["0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7"];

/// Where the extension lives and its version: the extension's schema, else the schema of a
/// portable install (which records its version in `_idem_portable_version()`), so the client
/// cannot tell the two apart.
pub(crate) const EXTENSION_SQL: &str = "SELECT schema, version FROM ( \
       SELECT 0 AS rank, n.nspname AS schema, e.extversion AS version \
         FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace \
        WHERE e.extname = 'idempotency' \
       UNION ALL \
       SELECT 1, n.nspname, pg_catalog.substring(p.prosrc, '''([0-9][^'']*)''') \
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
        WHERE p.proname = '_idem_portable_version') AS installs \
     ORDER BY rank, schema LIMIT 1";

/// The server's `idempotency.max_response_bytes` as `current_setting` shows it (`1MB`), or NULL
/// where it is not defined (a portable install whose setting was never set: its default).
pub(crate) const MAX_RESPONSE_BYTES_SQL: &str =
    "SELECT pg_catalog.current_setting('idempotency.max_response_bytes', true) AS max_response_bytes";

/// The text of the abort in `complete_or_abort`: invalid input for `boolean` (SQLSTATE 22P02).
pub(crate) const LEASE_LOST_MARK: &str = "idempotency: lease lost";

/// Whether an installed version is one this client speaks; the error says which it speaks.
pub(crate) fn check_version<E>(version: &str) -> Result<(), Error<E>> {
    if SUPPORTED_EXTENSIONS.iter().any(|s| version == *s || version.starts_with(&format!("{s}."))) {
        return Ok(());
    }
    let speaks: Vec<String> = SUPPORTED_EXTENSIONS.iter().map(|s| format!("{s}.x")).collect();
    Err(Error::IncompatibleExtension {
        reason: format!("the idempotency extension is at version {version}; this client speaks {}", speaks.join(", ")),
        source: None,
    })
}

/// The schema the extension's functions are called in (`CREATE EXTENSION idempotency SCHEMA
/// s`), with this crate's statements qualified with it. Cheap to clone.
#[derive(Clone)]
pub struct Schema(Arc<Statements>);

/// Every statement of the crate, for one schema. Built once per [`Schema`]. (The operator
/// statements are `ops`'s, feature `postgres`.)
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) struct Statements {
    pub(crate) name: String,
    /// `idem_reserve`: $1-$3 the key, $4 request_hash, $5 ttl and $6 lease in seconds, $7 wait.
    pub(crate) reserve: String,
    /// `idem_complete`: $4 token, $5 response, $6 status.
    pub(crate) complete: String,
    /// `idem_complete` that aborts the transaction when it answers false, so that a `COMMIT`
    /// pipelined behind it commits only a completed key.
    pub(crate) complete_or_abort: String,
    /// `idem_release`: $4 token, $5 max_retries.
    pub(crate) release: String,
    /// The transient-failure path without a savepoint, in a fresh transaction after the
    /// attempt's was rolled back: reserve the key again (same request, never waiting) and, when
    /// that created it, release it at once: $1-$7 as `reserve` (wait is false), $8 max_retries.
    pub(crate) reserve_and_release: String,
    /// The permanent-failure path, as `reserve_and_release` but completing `FAILED` with the
    /// response $8.
    pub(crate) reserve_and_fail: String,
    /// `idem_heartbeat`: $4 token, $5 lease in seconds.
    pub(crate) heartbeat: String,
    pub(crate) recover_stuck: String,
    pub(crate) sweep: String,
    pub(crate) lookup: String,
    pub(crate) stats: String,
    /// `idem_reserve_many` (0.4): $1 operation, $2 user_id, $3 keys, $4 request_hashes, $5 ttl
    /// and $6 lease in seconds, $7 wait; one row per key, in input order.
    pub(crate) reserve_many: String,
    /// `idem_complete_many` (0.4) aborting the transaction unless every key completed: $3 keys,
    /// $4 tokens, $5 responses, $6 status.
    pub(crate) complete_many_or_abort: String,
    /// `run_steps`'s reservation (0.7), one statement in autocommit: `reserve`'s $1-$7 and
    /// columns with `step` and `state`, and, when it created the key, recovery point 0 with the
    /// input $8 as its state (`checkpointed`).
    pub(crate) reserve_steps: String,
    /// `reserve` with the `step` and `state` of a `resume` answer, for the two-phase layer
    /// whose handler may take `Steps`: read from the row as a whole, so the statement runs
    /// against every version (before 0.7 they are NULL, and `resume` is never answered).
    pub(crate) reserve_resumable: String,
    /// `idem_checkpoint` (0.7): $4 token, $5 step, $6 state, $7 lease in seconds.
    pub(crate) checkpoint: String,
    /// `idem_checkpoint` that aborts the transaction when it answers false, so that a `COMMIT`
    /// pipelined behind it commits a step's writes only with its recovery point.
    pub(crate) checkpoint_or_abort: String,
    /// `idem_resumable` (0.7): $1 operation, $2 batch_size.
    pub(crate) resumable: String,
    /// `idem_replay` (0.7), in autocommit: $1-$3 the key, $4 request_hash; `reserve`'s columns,
    /// `outcome` NULL when the record is not final (the caller reserves).
    pub(crate) replay: String,
}

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
        let reserve_call = format!(
            "{s}.idem_reserve({key}, request_hash => $4, ttl => make_interval(secs => $5::float8), \
             lease => make_interval(secs => $6::float8), wait => $7)"
        );
        let complete = format!("{s}.idem_complete({key}, token => $4, response => $5, status => $6)");
        let checkpoint = format!("{s}.idem_checkpoint({key}, token => $4, step => $5, state => $6, lease => make_interval(secs => $7::float8))");
        let again = |then: &str| {
            format!(
                "SELECT r.outcome, CASE WHEN r.outcome = 'created' THEN {then} END AS answer \
                 FROM {s}.idem_reserve({key}, request_hash => $4, ttl => make_interval(secs => $5::float8), \
                 lease => make_interval(secs => $6::float8), wait => $7) AS r"
            )
        };
        Ok(Schema(Arc::new(Statements {
            reserve: format!(
                "SELECT outcome, token, response, attempts, extract(epoch FROM expires_at)::float8 AS expires_at FROM {reserve_call}"
            ),
            complete_or_abort: format!(
                "SELECT (CASE WHEN {complete} THEN 'true' ELSE '{LEASE_LOST_MARK}' END)::pg_catalog.bool AS completed"
            ),
            complete: format!("SELECT {complete} AS completed"),
            release: format!("SELECT {s}.idem_release({key}, token => $4, max_retries => $5) AS released"),
            reserve_and_release: again(&format!("{s}.idem_release({key}, token => r.token, max_retries => $8)")),
            reserve_and_fail: again(&format!(
                "{s}.idem_complete({key}, token => r.token, response => $8, status => 'FAILED')::pg_catalog.text"
            )),
            heartbeat: format!(
                "SELECT {s}.idem_heartbeat({key}, token => $4, lease => make_interval(secs => $5::float8)) AS extended"
            ),
            recover_stuck: format!(
                "SELECT {s}.idem_recover_stuck(batch_size => $1, action => $2, max_retries => $3) AS handled"
            ),
            sweep: format!("SELECT {s}.idem_sweep(batch_size => $1) AS deleted"),
            lookup: format!(
                "SELECT operation, user_id, key, request_hash, status, token, response, \
                 extract(epoch FROM lease_expires_at)::float8 AS lease_expires_at, extract(epoch FROM expires_at)::float8 AS expires_at, \
                 extract(epoch FROM created_at)::float8 AS created_at, extract(epoch FROM updated_at)::float8 AS updated_at \
                 FROM {s}.idem_lookup({key})"
            ),
            stats: format!(
                "SELECT processing, success, failed, stuck, expired, \
                 extract(epoch FROM oldest_processing_age)::float8 AS oldest_processing_secs FROM {s}.idem_stats()"
            ),
            reserve_many: format!(
                "SELECT key, outcome, token, response, attempts, extract(epoch FROM expires_at)::float8 AS expires_at \
                 FROM {s}.idem_reserve_many(operation => $1, user_id => $2, keys => $3, request_hashes => $4, \
                 ttl => make_interval(secs => $5::float8), lease => make_interval(secs => $6::float8), wait => $7)"
            ),
            complete_many_or_abort: format!(
                "SELECT (CASE WHEN pg_catalog.bool_and(completed) IS NOT FALSE THEN 'true' ELSE '{LEASE_LOST_MARK}' END)::pg_catalog.bool \
                 AS completed FROM {s}.idem_complete_many(operation => $1, user_id => $2, keys => $3, tokens => $4, \
                 responses => $5, status => $6)"
            ),
            reserve_steps: format!(
                "SELECT r.outcome, r.token, r.response, r.attempts, extract(epoch FROM r.expires_at)::float8 AS expires_at, r.step, r.state, \
                 CASE WHEN r.outcome = 'created' THEN {s}.idem_checkpoint({key}, token => r.token, step => 0, state => $8, \
                 lease => make_interval(secs => $6::float8)) END AS checkpointed FROM {reserve_call} AS r"
            ),
            reserve_resumable: format!(
                "SELECT r.outcome, r.token, r.response, r.attempts, extract(epoch FROM r.expires_at)::float8 AS expires_at, \
                 (pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.->>) 'step')::pg_catalog.int4 AS step, \
                 pg_catalog.to_jsonb(r) OPERATOR(pg_catalog.->) 'state' AS state FROM {reserve_call} AS r"
            ),
            checkpoint: format!("SELECT {checkpoint} AS checkpointed"),
            checkpoint_or_abort: format!(
                "SELECT (CASE WHEN {checkpoint} THEN 'true' ELSE '{LEASE_LOST_MARK}' END)::pg_catalog.bool AS checkpointed"
            ),
            resumable: format!(
                "SELECT user_id, key, request_hash, step, state, attempts FROM {s}.idem_resumable(operation => $1, batch_size => $2)"
            ),
            replay: format!(
                "SELECT outcome, token, response, attempts, extract(epoch FROM expires_at)::float8 AS expires_at \
                 FROM {s}.idem_replay({key}, request_hash => $4)"
            ),
            name,
        })))
    }

    /// The in-transaction flow in one statement around `write`, a data-modifying statement of
    /// yours whose `$1`..`$n` are its `n` values and which reads the relation `created` (one row
    /// when this call created the key, none otherwise): the reservation's values follow as
    /// `$n+1`..`$n+7` (as [`reserve_params`]). It answers the reservation's columns, `response`
    /// being the written row (`to_jsonb`) when the key was created, and `completed`.
    pub(crate) fn one_statement(&self, write: &str, n: usize) -> String {
        let s = quote_ident(&self.0.name);
        let p = |i: usize| format!("${}", n + i);
        let key = format!("operation => {}, user_id => {}, key => {}", p(1), p(2), p(3));
        format!(
            "WITH r AS (SELECT * FROM {s}.idem_reserve({key}, request_hash => {}, ttl => make_interval(secs => {}::float8), \
             lease => make_interval(secs => {}::float8), wait => {})), \
             created AS (SELECT r.token FROM r WHERE r.outcome = 'created'), \
             w AS ({write}), \
             written AS (SELECT pg_catalog.to_jsonb(w) AS row FROM w) \
             SELECT r.outcome, r.token, CASE WHEN r.outcome = 'created' THEN (SELECT row FROM written) ELSE r.response END AS response, \
             r.attempts, extract(epoch FROM r.expires_at)::float8 AS expires_at, \
             CASE WHEN r.outcome = 'created' THEN {s}.idem_complete({key}, token => r.token, response => (SELECT row FROM written)) END AS completed \
             FROM r",
            p(4),
            p(5),
            p(6),
            p(7)
        )
    }

    /// The schema's name, unquoted.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub(crate) fn sql(&self) -> &Statements {
        &self.0
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

/// A value of a statement's `$n`: sent as a parameter by a driver that prepares its statements,
/// or bound into the text (as a literal, by [`bind`]) by one that sends several statements as one
/// simple query.
#[derive(Debug, Clone)]
pub enum Param<'a> {
    Text(&'a str),
    Int4(i32),
    Int8(i64),
    Float(Option<f64>),
    Bool(bool),
    Json(Option<&'a serde_json::Value>),
    Null4,
    /// A `text[]`.
    TextArray(Vec<&'a str>),
    /// A `bigint[]`.
    IntArray(Vec<i64>),
    /// A `jsonb[]`.
    JsonArray(Vec<Option<serde_json::Value>>),
}

#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
impl Param<'_> {
    fn render(&self) -> String {
        match self {
            Param::Text(t) => quote_literal(t),
            Param::Int4(i) => format!("{i}::pg_catalog.int4"),
            Param::Int8(i) => format!("{i}::pg_catalog.int8"),
            Param::Float(Some(f)) if f.is_finite() => format!("{f:?}::pg_catalog.float8"),
            Param::Float(_) => "NULL::pg_catalog.float8".to_owned(),
            Param::Bool(b) => format!("{b}"),
            Param::Json(Some(v)) => format!("{}::pg_catalog.jsonb", quote_literal(&v.to_string())),
            Param::Json(None) => "NULL::pg_catalog.jsonb".to_owned(),
            Param::Null4 => "NULL::pg_catalog.int4".to_owned(),
            Param::TextArray(items) => array(items.iter().map(|t| quote_literal(t)), "text"),
            Param::IntArray(items) => array(items.iter().map(|i| i.to_string()), "int8"),
            Param::JsonArray(items) => {
                array(items.iter().map(|v| v.as_ref().map_or("NULL".to_owned(), |v| quote_literal(&v.to_string()))), "jsonb")
            }
        }
    }
}

impl<'a> Param<'a> {
    /// An `int`, or `NULL` (the server's default).
    pub(crate) fn int4_or_null(n: Option<i32>) -> Param<'a> {
        n.map_or(Param::Null4, Param::Int4)
    }
}

/// `$1`-`$3` of every keyed statement: the key.
pub(crate) fn key_params(key: &Key) -> Vec<Param<'_>> {
    vec![Param::Text(key.operation()), Param::Text(key.user_id()), Param::Text(key.key())]
}

/// `$1`-`$7` of `reserve` (and of `reserve_and_release` / `reserve_and_fail`, whose `$8`
/// follows): the key, the request's fingerprint, ttl and lease in seconds, wait.
pub(crate) fn reserve_params<'a>(key: &'a Key, fingerprint: &'a Fingerprint, options: &ReserveOptions) -> Vec<Param<'a>> {
    reserve_params_of(key, fingerprint.as_str(), options)
}

/// `$1`-`$4` of `replay`.
pub(crate) fn replay_params<'a>(key: &'a Key, fingerprint: &'a Fingerprint) -> Vec<Param<'a>> {
    let mut params = key_params(key);
    params.push(Param::Text(fingerprint.as_str()));
    params
}

/// [`reserve_params`] with the request's hash as text (a completer's, read from the record).
pub(crate) fn reserve_params_of<'a>(key: &'a Key, hash: &'a str, options: &ReserveOptions) -> Vec<Param<'a>> {
    let mut params = key_params(key);
    params.extend([
        Param::Text(hash),
        Param::Float(secs(options.ttl)),
        Param::Float(secs(options.lease)),
        Param::Bool(options.wait),
    ]);
    params
}

/// `$1`-`$5` of `release`.
pub(crate) fn release_params(key: &Key, token: Token, max_retries: Option<i32>) -> Vec<Param<'_>> {
    let mut params = key_params(key);
    params.extend([Param::Int8(token.0), Param::int4_or_null(max_retries)]);
    params
}

/// `$1`-`$5` of `heartbeat`.
pub(crate) fn heartbeat_params(key: &Key, token: Token, lease: Option<std::time::Duration>) -> Vec<Param<'_>> {
    let mut params = key_params(key);
    params.extend([Param::Int8(token.0), Param::Float(secs(lease))]);
    params
}

/// `$1`-`$6` of `complete` and `complete_or_abort`.
pub(crate) fn complete_params<'a>(key: &'a Key, token: Token, response: Option<&'a serde_json::Value>, status: Status) -> Vec<Param<'a>> {
    let mut params = key_params(key);
    params.extend([Param::Int8(token.0), Param::Json(response), Param::Text(status.as_str())]);
    params
}

/// `$1`-`$7` of `checkpoint` and `checkpoint_or_abort`.
pub(crate) fn checkpoint_params<'a>(key: &'a Key, token: Token, step: i32, state: Option<&'a serde_json::Value>, lease: Option<std::time::Duration>) -> Vec<Param<'a>> {
    let mut params = key_params(key);
    params.extend([Param::Int8(token.0), Param::Int4(step), Param::Json(state), Param::Float(secs(lease))]);
    params
}

/// A statement's text with `$1`..`$n` replaced by `values`, in one pass over the template (the
/// same text the prepared form sends, so no statement is written twice; a bound value is never
/// scanned again, whatever it holds).
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
pub(crate) fn bind(sql: &str, values: &[Param<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 64);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        let n: usize = rest[at + 1..at + 1 + digits].parse().unwrap_or(0);
        match n.checked_sub(1).and_then(|i| values.get(i)) {
            Some(value) => out.push_str(&value.render()),
            None => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

/// `ARRAY[..]::pg_catalog.TYPE[]`.
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
fn array(items: impl Iterator<Item = String>, ty: &str) -> String {
    format!("ARRAY[{}]::pg_catalog.{ty}[]", items.collect::<Vec<_>>().join(", "))
}

/// An escape-string literal (`E'...'`): backslashes and quotes doubled, so its meaning does not
/// depend on `standard_conforming_strings`. The texts bound here never hold NUL (keys refuse
/// control characters; JSON text escapes them).
#[cfg_attr(not(feature = "sqlx"), allow(dead_code))]
fn quote_literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// `"name"`, with embedded quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_quoted_and_checked() {
        let s = Schema::named("my \"idem\"").unwrap();
        assert!(s.sql().reserve.contains("FROM \"my \"\"idem\"\"\".idem_reserve("), "{}", s.sql().reserve);
        assert_eq!(s.name(), "my \"idem\"");
        for bad in ["", "a\0b", &"x".repeat(64)] {
            assert!(matches!(Schema::named(bad), Err(Error::Configuration { .. })), "{bad:?}");
        }
    }

    #[test]
    fn literals_are_bound_safely() {
        let sql = bind(
            "SELECT f($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                Param::Text("o'k\\"),
                Param::Float(Some(1.5)),
                Param::Float(None),
                Param::Bool(true),
                Param::Json(Some(&serde_json::json!({"a": "it's"}))),
                Param::Json(None),
                Param::Text("$1"),
                Param::Text("x"),
                Param::Text("ten"),
            ],
        );
        assert_eq!(
            sql,
            "SELECT f(E'o''k\\\\', 1.5::pg_catalog.float8, NULL::pg_catalog.float8, true, \
             E'{\"a\":\"it''s\"}'::pg_catalog.jsonb, NULL::pg_catalog.jsonb, E'$1', E'x', E'ten')"
        );
    }

    #[test]
    fn versions_this_client_speaks() {
        for ok in ["0.1.0", "0.3.0", "0.4", "0.4.1"] {
            assert!(check_version::<std::convert::Infallible>(ok).is_ok(), "{ok}");
        }
        let err = check_version::<std::convert::Infallible>("0.10.0").unwrap_err();
        assert!(err.to_string().contains("this client speaks 0.1.x"), "{err}");
    }
}
