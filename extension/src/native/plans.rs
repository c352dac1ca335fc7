//! The writes of the native functions: SPI plans prepared on first use in a backend and kept
//! (SPI_keepplan), so each call runs a cached plan with no parsing or planning. The plan
//! cache re-plans them when their tables change.
//!
//! Every name is schema-qualified (a [`Plans`] belongs to one schema, the catalog's) and every
//! operator `OPERATOR(pg_catalog.…)`: the text never depends on the caller's search_path. Each statement is the one the PL/pgSQL implementation
//! runs (sql/reserve.sql, sql/finish.sql), with the clock passed in instead of read inside
//! the statement.

use crate::args::raise;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::pg_sys::{self, Datum, Oid};
use std::cell::Cell;
use std::ffi::CString;

/// The statements, in the order of [`Plans::kept`].
#[derive(Clone, Copy)]
pub(crate) enum Stmt {
    /// $1-$3 scope, $4 request_hash, $5 token, $6 lease end, $7 expiry, $8 created_at,
    /// $9 status, $10 response, $11 updated_at, $12 owner (on a schema with owners), $13
    /// attempts (the compact layout, whose $4 is the stored hash and $9 the status code): a new
    /// record (PROCESSING, or finished by the write-once flow of [`super::pending`]).
    Insert,
    /// As Insert, without ON CONFLICT: the record of a pending reservation ([`super::pending`]),
    /// whose key no other transaction can write (it holds the key's advisory lock), so a
    /// conflict is an error anyway. A plain insert skips the speculative insertion: no pre-check
    /// descent of the primary key, no speculative-token lock, no CONFIRM WAL record (48 bytes
    /// per fresh cycle).
    InsertNew,
    /// $1-$8 as Insert ($8 now), $9 owner (on a schema with owners), $10 attempts (the compact
    /// layout): take over an expired record, re-checking expiry on the newest version.
    TakeOver,
    /// $1-$3 scope, $4 the new record's expiry: a live retry counter lives as long.
    KeepRetries,
    /// $1-$3 scope, $4 token, $5 status, $6 response, $7 now, $8 the caller (on a schema with
    /// owners: only a record the caller may act on is completed).
    Complete,
    /// $1-$3 scope, $4 token, $5 the asked lease end, $6 now, $7 the session's ceiling (now +
    /// idempotency.ttl), $8 whether the lease was explicit, $9 the caller (as Complete). The
    /// lease ends at most at the record's expiry or $7, whichever is later: the default is
    /// capped there, an explicit lease past it changes nothing (sql/finish.sql).
    Heartbeat,
    /// $1-$3 scope, $4 token, $5 the caller (as Complete): lock the PROCESSING record, answer
    /// created_at, expires_at.
    LockForRelease,
    /// $1-$3 scope, $4 created_at, $5 expires_at, $6 max_retries: the shared release step.
    ReleaseLocked,
    /// $1-$3 scope, $4 request_hash: the record as the probe reads it, through the planner
    /// (a Citus distributed table; [`super::probe`]).
    ReadRecord,
    /// $1-$3 scope: the retry counter (attempts, expires_at, and owner on a schema whose
    /// counters have owners), through the planner (as `ReadRecord`).
    ReadRetries,
    /// $1-$3 scope, $4 token: the owner of the record holding that token (only on a schema with
    /// owners), after a fenced statement changed nothing: another role sending a key's token is
    /// refused; a token the record does not hold stays a stale token (a value).
    ReadOwner,
    /// $1-$3 scope, $4 token: whether the record holding that token is PROCESSING, after a
    /// heartbeat changed nothing and [`ReadOwner`](Stmt::ReadOwner) refused no one: its
    /// explicit lease passed the record's ceiling.
    ReadProcessing,
    /// $1-$3 scope, $4 request_hash, $5 the new token, $6 the lease: the resume of a key with a
    /// recovery point and no live holder, under the key's lock (sql/reserve.sql's
    /// `_idem_resume_locked`: its `idem_reservation`, or NULL when the record changed).
    Resume,
    /// $1-$3 scope, $4 wait: after the update from 0.6.0, the key's record moved from
    /// `idem_records_060` into `idem_records` (sql/internal.sql's `_idem_adopt`: NULL without
    /// the old table, false when `wait` is false and another transaction holds the old row).
    /// Prepared only while the old table exists ([`super::catalog::Catalog::legacy`]).
    Adopt,
}

const STATEMENTS: usize = 14;

/// The fence on a keyed statement: the record is still PROCESSING. Compared under the C
/// collation (the same answer: equality of a deterministic collation is bytewise) so that the
/// planner cannot match the predicate of the partial index idem_records_lease_idx: with stale
/// statistics (a transaction holding thousands of uncommitted PROCESSING rows) a generic plan
/// would otherwise scan that whole index instead of probing the primary key, once per key.
const PROCESSING: &str = "r.status OPERATOR(pg_catalog.=) ('PROCESSING' COLLATE pg_catalog.\"C\")";

/// The lease end a heartbeat writes (Heartbeat's $5 asked, $7 the session's ceiling): at most the
/// record's expiry or $7, whichever is later.
const LEASE_END: &str = "LEAST($5, GREATEST(r.expires_at, $7))";

const SCOPE: &str = "r.operation OPERATOR(pg_catalog.=) $1 AND r.user_id OPERATOR(pg_catalog.=) $2 \
                     AND r.key OPERATOR(pg_catalog.=) $3";

/// The fence of the compact layout (0.7.0): the status code compared as text, for the reason
/// [`PROCESSING`] gives.
const PROCESSING_CODE: &str = "r.status::pg_catalog.text OPERATOR(pg_catalog.=) 'p'";

/// The statements' shape for one schema: which columns its `idem_records` has.
#[derive(Clone, Copy)]
struct Shape {
    /// `owner` (0.6.0).
    owned: bool,
    /// `idem_retries.owner` (0.7.0).
    counters_owned: bool,
    /// `step` and `state` (0.7.0).
    stepped: bool,
    /// The compact layout (0.7.0, docs/record-layout.md): keyed by `id`, status a code,
    /// request_hash 32 bytes, `attempts` on the record.
    compact: bool,
    /// A Citus distributed table.
    distributed: bool,
}

impl Shape {
    /// The key condition on `idem_records AS r`: the id digest (the primary key) and the three
    /// texts re-checked, on the compact layout; the three texts (the primary key) before it.
    fn scope(&self, s: &str) -> String {
        if self.compact {
            format!("r.id OPERATOR(pg_catalog.=) {s}._idem_id($1, $2, $3) AND {SCOPE}")
        } else {
            SCOPE.to_owned()
        }
    }

    fn processing(&self) -> &'static str {
        if self.compact { PROCESSING_CODE } else { PROCESSING }
    }
}

/// The owner fence of Complete, Heartbeat and LockForRelease, with the caller's parameter `$n`:
/// a record without an owner (written before 0.6.0), or one whose owner the caller is or is a
/// member of (pg_has_role MEMBER, as sql/internal.sql's _idem_owns).
///
/// Not in Complete and Heartbeat on a Citus distributed table: Citus refuses a STABLE function
/// of a column in an UPDATE ("STABLE functions used in UPDATE queries cannot be called with
/// column references"), so there the caller checks the owner of the record holding the token
/// first ([`super::finish`]; a record never changes owner under one token: a takeover writes a
/// new token with its new owner). The parameter stays declared, unused.
fn owns(owned: bool, n: u8) -> String {
    if owned {
        format!(" AND (r.owner IS NULL OR pg_catalog.pg_has_role(${n}, r.owner::pg_catalog.oid, 'MEMBER'))")
    } else {
        String::new()
    }
}

fn text(stmt: Stmt, s: &str, shape: Shape) -> (String, &'static [Oid]) {
    use pg_sys::{
        BOOLOID as BOOL, BYTEAOID as BYTEA, CHAROID as CHAR, INT4OID as INT4, INT8OID as INT8, INTERVALOID as INTERVAL,
        JSONBOID as JSONB, OIDOID as OID, REGROLEOID as REGROLE, TEXTOID as TEXT, TIMESTAMPTZOID as TSTZ,
    };
    let Shape { owned, counters_owned, stepped, compact, distributed } = shape;
    let scope = shape.scope(s);
    let processing = shape.processing();
    // A schema with recovery points (0.7.0): a takeover forgets the expired record's, a
    // completion its state.
    let (forget_step, clear_state) = if stepped { (", step = NULL, state = NULL", ", state = NULL") } else { ("", "") };
    const RESERVE: &[Oid] = &[TEXT, TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ];
    const RESERVE_OWNED: &[Oid] = &[TEXT, TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ, REGROLE];
    let (owner_col, owner_val, owner_set) = if owned { (", owner", ", $12", ", owner = $9") } else { ("", "", "") };
    match stmt {
        // The compact layout: $4 the stored hash (bytea), $9 the status code, $13 attempts.
        Stmt::Insert | Stmt::InsertNew if compact => (
            format!(
                "INSERT INTO {s}.idem_records AS r (id, operation, user_id, key, request_hash, status, token, response, \
                 lease_expires_at, expires_at, created_at, updated_at, owner, attempts) \
                 VALUES ({s}._idem_id($1, $2, $3), $1, $2, $3, $4, $9, $5, $10, $6, $7, $8, $11, $12, $13){}",
                if matches!(stmt, Stmt::Insert) { " ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING" } else { "" }
            ),
            &[TEXT, TEXT, TEXT, BYTEA, INT8, TSTZ, TSTZ, TSTZ, CHAR, JSONB, TSTZ, REGROLE, INT4],
        ),
        Stmt::Insert | Stmt::InsertNew => (
            format!(
                "INSERT INTO {s}.idem_records AS r (operation, user_id, key, request_hash, status, token, response, \
                 lease_expires_at, expires_at, created_at, updated_at{owner_col}) \
                 VALUES ($1, $2, $3, $4, $9, $5, $10, $6, $7, $8, $11{owner_val}){}",
                if matches!(stmt, Stmt::Insert) { " ON CONFLICT ON CONSTRAINT idem_records_pkey DO NOTHING" } else { "" }
            ),
            if owned {
                &[TEXT, TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ, TEXT, JSONB, TSTZ, REGROLE]
            } else {
                &[TEXT, TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ, TEXT, JSONB, TSTZ]
            },
        ),
        // The compact layout: $4 the stored hash, $10 attempts.
        Stmt::TakeOver if compact => (
            format!(
                "UPDATE {s}.idem_records AS r SET request_hash = $4, status = 'p', token = $5, response = NULL, \
                 lease_expires_at = $6, expires_at = $7, created_at = $8, updated_at = $8, owner = $9, attempts = $10\
                 {forget_step} \
                 WHERE {scope} AND r.expires_at OPERATOR(pg_catalog.<=) $8 \
                 AND (r.status OPERATOR(pg_catalog.<>) 'p' OR r.lease_expires_at OPERATOR(pg_catalog.<=) $8)"
            ),
            &[TEXT, TEXT, TEXT, BYTEA, INT8, TSTZ, TSTZ, TSTZ, REGROLE, INT4],
        ),
        Stmt::TakeOver => (
            format!(
                "UPDATE {s}.idem_records AS r SET request_hash = $4, status = 'PROCESSING', token = $5, response = NULL, \
                 lease_expires_at = $6, expires_at = $7, created_at = $8, updated_at = $8{owner_set}{forget_step} \
                 WHERE {SCOPE} AND r.expires_at OPERATOR(pg_catalog.<=) $8 \
                 AND (r.status OPERATOR(pg_catalog.<>) 'PROCESSING' OR r.lease_expires_at OPERATOR(pg_catalog.<=) $8)"
            ),
            if owned { RESERVE_OWNED } else { RESERVE },
        ),
        Stmt::KeepRetries => (
            format!(
                "UPDATE {s}.idem_retries AS r SET expires_at = GREATEST(r.expires_at, $4) WHERE {SCOPE}"
            ),
            &[TEXT, TEXT, TEXT, TSTZ],
        ),
        // $5: the status code on the compact layout, the word before it.
        Stmt::Complete => (
            format!(
                "UPDATE {s}.idem_records AS r SET status = $5, response = $6{clear_state}, updated_at = $7 \
                 WHERE {scope} AND r.token OPERATOR(pg_catalog.=) $4 AND {processing}{}",
                owns(owned && !distributed, 8)
            ),
            match (compact, owned) {
                (true, _) => &[TEXT, TEXT, TEXT, INT8, CHAR, JSONB, TSTZ, OID],
                (false, true) => &[TEXT, TEXT, TEXT, INT8, TEXT, JSONB, TSTZ, OID],
                (false, false) => &[TEXT, TEXT, TEXT, INT8, TEXT, JSONB, TSTZ],
            },
        ),
        Stmt::Heartbeat => (
            format!(
                "UPDATE {s}.idem_records AS r SET lease_expires_at = {LEASE_END}, \
                 expires_at = GREATEST(r.expires_at, {LEASE_END}), updated_at = $6 \
                 WHERE {scope} AND r.token OPERATOR(pg_catalog.=) $4 AND {processing} \
                 AND (NOT $8 OR $5 OPERATOR(pg_catalog.<=) GREATEST(r.expires_at, $7)){}",
                owns(owned && !distributed, 9)
            ),
            if owned { &[TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ, BOOL, OID] } else { &[TEXT, TEXT, TEXT, INT8, TSTZ, TSTZ, TSTZ, BOOL] },
        ),
        Stmt::LockForRelease => (
            format!(
                "SELECT r.created_at, r.expires_at FROM {s}.idem_records AS r \
                 WHERE {scope} AND r.token OPERATOR(pg_catalog.=) $4 AND {processing}{} \
                 FOR UPDATE",
                owns(owned, 5)
            ),
            if owned { &[TEXT, TEXT, TEXT, INT8, OID] } else { &[TEXT, TEXT, TEXT, INT8] },
        ),
        Stmt::ReleaseLocked => (
            format!("SELECT {s}._idem_release_locked($1, $2, $3, $4, $5, $6)"),
            &[TEXT, TEXT, TEXT, TSTZ, TSTZ, INT4],
        ),
        // Single-table, equality on the full key, no volatile call: Citus routes both to the
        // key's shard. On the compact layout $4 is the stored hash and the record's attempts
        // are read last.
        Stmt::ReadRecord => (
            format!(
                "SELECT r.request_hash OPERATOR(pg_catalog.=) $4, r.status, r.response, r.lease_expires_at, \
                 r.expires_at, r.created_at{}{}{} FROM {s}.idem_records AS r WHERE {scope}",
                if owned { ", r.owner" } else { "" },
                if stepped { ", r.step" } else { "" },
                if compact { ", r.attempts" } else { "" }
            ),
            if compact { &[TEXT, TEXT, TEXT, BYTEA] } else { &[TEXT, TEXT, TEXT, TEXT] },
        ),
        Stmt::ReadRetries => (
            format!(
                "SELECT r.attempts, r.expires_at{} FROM {s}.idem_retries AS r WHERE {SCOPE}",
                if counters_owned { ", r.owner" } else { "" }
            ),
            &[TEXT, TEXT, TEXT],
        ),
        Stmt::ReadOwner => (
            format!("SELECT r.owner FROM {s}.idem_records AS r WHERE {scope} AND r.token OPERATOR(pg_catalog.=) $4"),
            &[TEXT, TEXT, TEXT, INT8],
        ),
        Stmt::ReadProcessing => (
            format!("SELECT FROM {s}.idem_records AS r WHERE {scope} AND r.token OPERATOR(pg_catalog.=) $4 AND {processing}"),
            &[TEXT, TEXT, TEXT, INT8],
        ),
        Stmt::Resume => (format!("SELECT {s}._idem_resume_locked($1, $2, $3, $4, $5, $6)"), &[TEXT, TEXT, TEXT, TEXT, INT8, INTERVAL]),
        Stmt::Adopt => (format!("SELECT {s}._idem_adopt($1, $2, $3, $4)"), &[TEXT, TEXT, TEXT, BOOL]),
    }
}

/// The kept plans of the extension's schema, prepared on first use, freed with it (the catalog
/// owns one).
pub(crate) struct Plans {
    /// The schema's name quoted for SQL text.
    schema_sql: String,
    /// Whether `idem_records` has the `owner` column (0.6.0): the statements then write and
    /// fence on it.
    owned: bool,
    /// Whether `idem_retries` has the `owner` column (0.7.0): `ReadRetries` then reads it.
    counters_owned: bool,
    /// Whether `idem_records` has the recovery point's columns (0.7.0): a takeover and a
    /// completion then clear them, and `ReadRecord` reads the step.
    stepped: bool,
    /// Whether `idem_records` is a Citus distributed table: its UPDATEs leave the owner fence
    /// to the caller ([`owns`]).
    distributed: bool,
    /// Whether `idem_records` has the compact layout (0.7.0, docs/record-layout.md).
    compact: bool,
    kept: [Cell<Option<std::ptr::NonNull<pg_sys::_SPI_plan>>>; STATEMENTS],
}

impl Plans {
    /// No plan yet for the schema named `schema_sql` (quoted for SQL text).
    pub(crate) fn new(schema_sql: String, owned: bool, counters_owned: bool, stepped: bool, compact: bool, distributed: bool) -> Self {
        Plans { schema_sql, owned, counters_owned, stepped, distributed, compact, kept: Default::default() }
    }

    /// The schema's name, quoted for SQL text.
    pub(crate) fn schema_sql(&self) -> &str {
        &self.schema_sql
    }
}

impl Drop for Plans {
    fn drop(&mut self) {
        if super::exiting() {
            return;
        }
        for plan in &self.kept {
            if let Some(plan) = plan.take() {
                // SAFETY: a plan kept by SPI_keepplan and used by nobody now (the catalog that
                // owns it is being dropped); SPI_freeplan needs no SPI connection.
                unsafe { pg_sys::SPI_freeplan(plan.as_ptr()) };
            }
        }
    }
}

fn spi_failed(what: &str, code: i32) -> ! {
    raise(PgSqlErrorCode::ERRCODE_INTERNAL_ERROR, format!("SPI {what} failed with code {code}"))
}

/// Runs `f` connected to SPI. An error inside `f` unwinds past SPI_finish; PostgreSQL's
/// (sub)transaction abort then cleans up the connection.
pub(crate) fn connected<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: called from a function executing inside a transaction.
    let code = unsafe { pg_sys::SPI_connect() };
    if code != pg_sys::SPI_OK_CONNECT as i32 {
        spi_failed("connect", code);
    }
    let result = f();
    // SAFETY: connected above, in this same call.
    unsafe { pg_sys::SPI_finish() };
    result
}

fn plan(plans: &Plans, stmt: Stmt) -> pg_sys::SPIPlanPtr {
    let slot = &plans.kept[stmt as usize];
    if let Some(plan) = slot.get() {
        return plan.as_ptr();
    }
    let shape = Shape {
        owned: plans.owned,
        counters_owned: plans.counters_owned,
        stepped: plans.stepped,
        compact: plans.compact,
        distributed: plans.distributed,
    };
    let (sql, types) = text(stmt, &plans.schema_sql, shape);
    let Ok(sql) = CString::new(sql) else { spi_failed("prepare", 0) };
    let mut types = types.to_vec();
    let nargs = types.len() as i32;
    // SAFETY: connected to SPI (every caller runs inside `connected`); a valid C string and
    // nargs argument types. SPI_keepplan moves the plan out of the SPI procedure's memory.
    let plan = unsafe {
        let plan = pg_sys::SPI_prepare(sql.as_ptr(), nargs, types.as_mut_ptr());
        if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
            spi_failed("prepare", pg_sys::SPI_result);
        }
        plan
    };
    slot.set(std::ptr::NonNull::new(plan));
    plan
}

/// Executes `stmt` with `args` (`None` is NULL); answers the number of rows it processed.
/// Must run inside [`connected`].
pub(crate) fn execute(plans: &Plans, stmt: Stmt, args: &[Option<Datum>]) -> u64 {
    let plan = plan(plans, stmt);
    let mut values: Vec<Datum> = args.iter().map(|a| a.unwrap_or(Datum::from(0))).collect();
    let nulls: Vec<std::ffi::c_char> = args.iter().map(|a| if a.is_some() { b' ' } else { b'n' } as std::ffi::c_char).collect();
    // SAFETY: a kept plan whose parameter count and types are those of `text(stmt)`, matched by
    // the callers; not read-only, so each statement sees the writes before it.
    unsafe {
        let code = pg_sys::SPI_execute_plan(plan, values.as_mut_ptr(), nulls.as_ptr(), false, 0);
        if code < 0 {
            spi_failed("execute", code);
        }
        pg_sys::SPI_processed
    }
}

/// Column `n` (from 1) of the first row the last statement returned, `None` for NULL.
/// Must run inside [`connected`], after [`execute`] answered at least one row.
pub(crate) fn first_row(n: i32) -> Option<Datum> {
    // SAFETY: the last SPI statement returned rows (checked by the caller), so SPI_tuptable and
    // its first row are valid; by-reference values live in the SPI procedure's memory.
    unsafe {
        let table = pg_sys::SPI_tuptable;
        if table.is_null() || pg_sys::SPI_processed == 0 {
            spi_failed("result", 0);
        }
        let mut isnull = false;
        let value = pg_sys::SPI_getbinval(*(*table).vals, (*table).tupdesc, n, &mut isnull);
        (!isnull).then_some(value)
    }
}
