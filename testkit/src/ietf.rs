//! The IETF Idempotency-Key checks of an example service's `POST /charges`, over real HTTP
//! against a base URL, so every stack's example (axum, actix-web) passes the same ones: every
//! outcome mapped to HTTP (400 without or with a bad key, 201, the replay with
//! `Idempotent-Replayed: true` for a bare or quoted key, 422 for another request under the key, a
//! 4xx stored and replayed), concurrent duplicates charging once (409 + `Retry-After` for the one
//! that finds the key held), and 503 when the store is down.
//!
//! The service charges `{"amount": N}` for the `X-User` into the `charges` table of `database`
//! (a URL the checks count rows through).

use reqwest::StatusCode;
use serde_json::{json, Value};

/// An answer: status, headers, JSON body (`null` when it is not JSON).
pub type Answer = (StatusCode, reqwest::header::HeaderMap, Value);

/// Posts `body` to `url` as `user`, with the key when given.
pub async fn post(url: &str, key: Option<&str>, user: &str, body: Value) -> Answer {
    let mut req = reqwest::Client::new().post(url).header("x-user", user).header("content-type", "application/json").body(body.to_string());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let resp = req.send().await.expect("request");
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

/// The charges of `user` in `database`.
pub async fn charges_of(database: &str, user: &str) -> i64 {
    crate::admin_at(database).await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n")
}

fn replayed(headers: &reqwest::header::HeaderMap) -> bool {
    headers.get("idempotent-replayed").is_some_and(|v| v == "true")
}

fn problem_type(headers: &reqwest::header::HeaderMap, body: &Value) -> String {
    assert_eq!(headers.get("content-type").map(|v| v.to_str().unwrap()), Some("application/problem+json"), "{body}");
    body["type"].as_str().unwrap_or_default().to_owned()
}

/// Every outcome of `POST {url}` as HTTP, for the user `user` (one of its own per call).
pub async fn every_outcome(url: &str, database: &str, user: &str) {
    let (status, headers, body) = post(url, None, user, json!({"amount": 100})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(problem_type(&headers, &body), "urn:idempotency:problem:key-missing");

    let (status, first_headers, first) = post(url, Some("k-1"), user, json!({"amount": 100})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(!replayed(&first_headers));
    assert!(first_headers.get("location").is_some());

    // The retry (quoted key, same request) replays the stored response.
    let (status, headers, again) = post(url, Some("\"k-1\""), user, json!({"amount": 100})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(replayed(&headers));
    assert_eq!(again, first);
    assert_eq!(headers.get("location"), first_headers.get("location"), "the stored Location is replayed");
    assert_eq!(charges_of(database, user).await, 1);

    // Same key, another request: 422.
    let (status, headers, body) = post(url, Some("k-1"), user, json!({"amount": 999})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem_type(&headers, &body), "urn:idempotency:problem:mismatch");

    // A 4xx answer is remembered and replayed as such.
    let (status, headers, _) = post(url, Some("k-2"), user, json!({"amount": -5})).await;
    assert_eq!((status, replayed(&headers)), (StatusCode::UNPROCESSABLE_ENTITY, false));
    let (status, headers, body) = post(url, Some("k-2"), user, json!({"amount": -5})).await;
    assert_eq!((status, replayed(&headers)), (StatusCode::UNPROCESSABLE_ENTITY, true));
    assert_eq!(body["error"], "amount must be positive");

    // A bad key: 400 before any database work.
    let (status, headers, body) = post(url, Some(&"k".repeat(300)), user, json!({"amount": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem_type(&headers, &body), "urn:idempotency:problem:key-invalid");
    // No user: 401.
    let resp = reqwest::Client::new().post(url).header("idempotency-key", "k-3").body("{\"amount\": 1}").send().await.expect("request");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(charges_of(database, user).await, 1);
}

/// Pairs of concurrent requests with one key: exactly one charges, the other replays or gets
/// 409 with `Retry-After`.
pub async fn concurrent_duplicates_charge_once(url: &str, database: &str, user: &str) {
    for round in 0..10 {
        let key = format!("race-{round}");
        let (a, b) = tokio::join!(post(url, Some(&key), user, json!({"amount": 7})), post(url, Some(&key), user, json!({"amount": 7})));
        for (status, headers, body) in [&a, &b] {
            match *status {
                StatusCode::CONFLICT => {
                    assert!(headers.get("retry-after").is_some(), "409 carries Retry-After");
                    assert_eq!(problem_type(headers, body), "urn:idempotency:problem:in-progress");
                }
                StatusCode::CREATED => {}
                other => panic!("round {round}: {other} {body}"),
            }
        }
        let created = [&a, &b].iter().filter(|r| r.0 == StatusCode::CREATED && !replayed(&r.1)).count();
        assert_eq!(created, 1, "round {round}: exactly one request charged: {:?}", [a.0, b.0]);
    }
    assert_eq!(charges_of(database, user).await, 10, "one charge per key");
}

/// A service whose store cannot be reached answers 503 with `Retry-After`.
pub async fn store_down_answers_503(url: &str) {
    let (status, headers, body) = post(url, Some("k"), "u", json!({"amount": 1})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(headers.get("retry-after").is_some());
    assert_eq!(problem_type(&headers, &body), "urn:idempotency:problem:store-unavailable");
}
