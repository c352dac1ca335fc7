//! `idem_replay`, native (sql/replay.sql): the first step of [`super::reserve`] alone. One
//! primary-key probe under the statement's snapshot ([`probe::key`]); a live record the caller
//! may act on answers as `idem_reserve` answers it ([`reserve::answer`], counted the same way)
//! when that answer is final (replay, failed, mismatch); anything else answers NULL, for the
//! caller to reserve. Nothing is written, locked or kept, so it runs in autocommit, in a
//! read-only transaction and on a standby.

use super::call::{self, v1_function_info};
use super::catalog;
use super::owner;
use super::probe::{self, Scope};
use super::reserve;
use crate::args;
use pgrx::pg_sys::{self, Datum};
use pgrx::prelude::*;

v1_function_info!(pg_finfo_idem_replay_native);

/// Called by PostgreSQL's function manager with the 4 arguments declared in sql/replay.sql.
#[pg_guard]
#[no_mangle]
pub unsafe extern "C-unwind" fn idem_replay_native(fcinfo: pg_sys::FunctionCallInfo) -> Datum {
    // SAFETY: the declaration in sql/replay.sql fixes the argument types read here.
    let (operation, user_id, key, request_hash, fn_oid) = unsafe {
        (
            call::text(fcinfo, 0, "operation"),
            call::text(fcinfo, 1, "user_id"),
            call::text(fcinfo, 2, "key"),
            call::text(fcinfo, 3, "request_hash"),
            call::function_oid(fcinfo),
        )
    };
    args::_idem_check_scope(operation.map(|t| t.str), user_id.map(|t| t.str), key.map(|t| t.str));
    args::_idem_check_request_hash(request_hash.map(|t| t.str));
    // Present: the checks above raise 22004 for a NULL.
    let scope = Scope {
        operation: args::required("operation", operation),
        user_id: args::required("user_id", user_id),
        key: args::required("key", key),
    };
    let request_hash = args::required("request_hash", request_hash);
    let catalog = catalog::for_function(fn_oid);
    let stored = catalog.stored_hash(request_hash.bytes);
    // SAFETY: reads the clock.
    let now = unsafe { pg_sys::GetCurrentTimestamp() };
    let found = probe::key(&catalog, &scope, &stored, false, now);
    if let Some(record) = found.record.as_ref().filter(|r| r.live(now)) {
        // As idem_reserve: another role learns nothing of a live record (guarantee 8).
        owner::require(record.owner, "replay a key");
        if !record.resumable(now) {
            let answer = reserve::answer(record, || found.attempts(record.created_at));
            // in_progress is not final: the holder may finish or fail; idem_reserve decides.
            if answer.outcome != "in_progress" {
                // SAFETY: the call's fcinfo.
                let expected = unsafe { reserve::expected_row(fcinfo) };
                return answer.into_datum(&catalog, expected);
            }
        }
    }
    // SAFETY: the call's fcinfo; a NULL result.
    unsafe { (*fcinfo).isnull = true };
    Datum::from(0)
}
