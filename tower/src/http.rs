//! The one HTTP mapping of the client's errors: the status a server answers with and its
//! `Retry-After`. The layer's problem answers use it; a service that calls `run` itself can too.

use idempotency_client::Error;
use std::time::Duration;

/// The HTTP status for an error: 409 in progress / lease lost (send `Retry-After`, see
/// [`retry_after`]), 422 mismatch, the stored status for a failure (409 when nothing was
/// stored), 400 invalid key, 503 store unavailable, 502 a result too large to store, 500
/// otherwise.
pub fn http_status<E>(error: &Error<E>) -> u16 {
    match error {
        Error::InProgress { .. } | Error::LeaseLost { .. } => 409,
        Error::Mismatch => 422,
        Error::Failed { response } => response
            .as_ref()
            .and_then(|r| r.get("status"))
            .and_then(serde_json::Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
            .filter(|s| (100..=599).contains(s))
            .unwrap_or(409),
        Error::InvalidKey(_) => 400,
        Error::StoreUnavailable(_) => 503,
        Error::ResponseTooLarge { .. } => idempotency_client::StoredResponse::TOO_LARGE_STATUS,
        _ => 500,
    }
}

/// How long a client should wait before retrying, for `Retry-After`: the hint an in-progress or
/// lost-lease error carries ((`Settings::retry_after`)), and `unavailable` for a store
/// that could not be used; none for any other error ([`Error::retry_after`], plus the
/// `unavailable` wait).
pub fn retry_after<E>(error: &Error<E>, unavailable: Duration) -> Option<Duration> {
    match error {
        Error::StoreUnavailable(_) => Some(unavailable),
        other => other.retry_after(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_and_hints() {
        let second = Duration::from_secs(1);
        let e: Error = Error::InProgress { retry_after: Duration::from_secs(3) };
        assert_eq!((http_status(&e), retry_after(&e, second)), (409, Some(Duration::from_secs(3))));
        let e: Error = Error::LeaseLost { retry_after: Duration::from_secs(2) };
        assert_eq!((http_status(&e), retry_after(&e, second)), (409, Some(Duration::from_secs(2))));
        let e: Error = Error::Mismatch;
        assert_eq!((http_status(&e), retry_after(&e, second)), (422, None));
        let e: Error = Error::Failed { response: Some(json!({"status": 402})) };
        assert_eq!(http_status(&e), 402);
        let e: Error = Error::Failed { response: Some(json!({"status": 1000})) };
        assert_eq!(http_status(&e), 409);
        let e: Error = Error::StoreUnavailable("down".into());
        assert_eq!((http_status(&e), retry_after(&e, second)), (503, Some(second)));
        let e: Error = Error::ResponseTooLarge { effect_stands: false, key_failed: false };
        assert_eq!((http_status(&e), retry_after(&e, second)), (502, None));
    }

    #[test]
    fn the_free_functions_agree_with_the_errors_own_hints() {
        let second = Duration::from_secs(1);
        let errors: [Error; 4] = [
            Error::InProgress { retry_after: Duration::from_secs(3) },
            Error::LeaseLost { retry_after: Duration::from_secs(2) },
            Error::Mismatch,
            Error::StoreUnavailable("down".into()),
        ];
        for e in &errors {
            let own = if matches!(e, Error::StoreUnavailable(_)) { Some(second) } else { e.retry_after() };
            assert_eq!(retry_after(e, second), own, "{e}");
        }
    }
}
