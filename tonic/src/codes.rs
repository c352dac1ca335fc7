//! The one table of gRPC codes: the HTTP status each hands the status policy, and so whether the
//! default policy remembers an answer with it (stored, replayed to every retry) or releases the
//! key (a retry runs again). docs/rust-client.md shows the same table, rendered from this one
//! (a unit test compares them).
//!
//! The rule is the HTTP side's, read through the status: an answer that says what this request
//! is (a deterministic client error, a success) is remembered; one that says the call did not
//! complete for now (5xx, 408, 409, 429: a cancellation, a deadline, an overload, a conflict, a
//! server fault) releases the key. The statuses are Google's mapping (google.rpc.Code) but for
//! CANCELLED: Google says 499, a 4xx the HTTP policy remembers, so a handler that passes on a
//! downstream call's cancellation would poison the key for its whole TTL; the layer hands the
//! policy 408 (a request that did not complete in time), which it releases.

use http::StatusCode;
use tonic::Code;

/// One gRPC code's row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CodeRule {
    pub(crate) code: Code,
    /// The HTTP status the status policy gets for an answer with this code.
    pub(crate) http: u16,
    /// Whether the default policy remembers it (else the key is released).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) remembered: bool,
    /// Why.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) why: &'static str,
}

const fn row(code: Code, http: u16, remembered: bool, why: &'static str) -> CodeRule {
    CodeRule { code, http, remembered, why }
}

/// Every gRPC code, in the order of their numbers.
pub(crate) const CODES: [CodeRule; 17] = [
    row(Code::Ok, 200, true, "the answer"),
    row(Code::Cancelled, 408, false, "the call did not complete (a downstream call cancelled, the client gone): a retry runs again"),
    row(Code::Unknown, 500, false, "a server fault of unknown cause, like HTTP's 500"),
    row(Code::InvalidArgument, 400, true, "the request is wrong whatever the state: a retry gets the same answer"),
    row(Code::DeadlineExceeded, 504, false, "the call did not complete in time; it may succeed when retried"),
    row(Code::NotFound, 404, true, "a deterministic answer about this request, like HTTP's 404"),
    row(Code::AlreadyExists, 409, false, "a conflict with the current state, like HTTP's 409, which can change: a retry asks again"),
    row(Code::PermissionDenied, 403, true, "a deterministic client error, like HTTP's 403"),
    row(Code::ResourceExhausted, 429, false, "a quota or an overload, like HTTP's 429: a retry runs again"),
    row(Code::FailedPrecondition, 400, true, "gRPC says not to retry until the state is fixed: a new request (a new key) does that"),
    row(Code::Aborted, 409, false, "a concurrency conflict, the code gRPC clients retry"),
    row(Code::OutOfRange, 400, true, "the request is out of the valid range, like INVALID_ARGUMENT"),
    row(Code::Unimplemented, 501, false, "a server error, like HTTP's 501: a deployment may bring the method"),
    row(Code::Internal, 500, false, "a server fault, like HTTP's 500"),
    row(Code::Unavailable, 503, false, "transient by definition, like HTTP's 503"),
    row(Code::DataLoss, 500, false, "a server fault, like HTTP's 500"),
    row(Code::Unauthenticated, 401, true, "a deterministic client error, like HTTP's 401"),
];

/// The HTTP status an answer's gRPC code hands the status policy (see [`CODES`]).
pub(crate) fn http_equivalent(code: Code) -> StatusCode {
    let status = CODES.iter().find(|r| r.code == code).map_or(500, |r| r.http);
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The code's name as the gRPC spec spells it (`DEADLINE_EXCEEDED`).
#[cfg(test)]
fn spec_name(code: Code) -> String {
    let debug = format!("{code:?}");
    let mut name = String::new();
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The table as docs/rust-client.md shows it.
#[cfg(test)]
pub(crate) fn markdown() -> String {
    let mut text = String::from("| code | number | status for the policy | default rule | why |\n|---|---|---|---|---|\n");
    for r in CODES {
        let rule = if r.remembered { "remembered" } else { "released" };
        text.push_str(&format!("| {} | {} | {} | {rule} | {} |\n", spec_name(r.code), r.code as i32, r.http, r.why));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotency_client::Verdict;

    #[test]
    fn every_code_once_in_number_order() {
        for (i, r) in CODES.iter().enumerate() {
            assert_eq!(r.code as usize, i, "{:?}", r.code);
            assert_eq!(Code::from_i32(i as i32), r.code);
        }
        assert_eq!(http_equivalent(Code::from_i32(99)), StatusCode::INTERNAL_SERVER_ERROR, "an unknown code is UNKNOWN's");
    }

    #[test]
    fn the_default_policy_gives_each_code_its_rule() {
        for r in CODES {
            let verdict = idempotency_tower::default_status_policy(http_equivalent(r.code).as_u16());
            assert_eq!(verdict != Verdict::Transient, r.remembered, "{:?} -> {}: {verdict:?}", r.code, r.http);
        }
        // The transient codes are released, whatever else changes.
        for code in [Code::Cancelled, Code::DeadlineExceeded, Code::Unavailable, Code::Aborted, Code::ResourceExhausted, Code::Internal, Code::Unknown] {
            assert_eq!(idempotency_tower::default_status_policy(http_equivalent(code).as_u16()), Verdict::Transient, "{code:?}");
        }
    }

    #[test]
    fn the_docs_show_this_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/rust-client.md");
        let docs = std::fs::read_to_string(path).expect("docs/rust-client.md");
        let table = markdown();
        assert!(docs.contains(&table), "docs/rust-client.md must hold the gRPC code table as the code renders it:\n{table}");
    }
}
