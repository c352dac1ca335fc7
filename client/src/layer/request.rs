//! What the layer reads from a request: its operation, its user and its fingerprint.

use super::config::{Config, Scope, ANONYMOUS_USER};
use crate::driver::Driver;
use idempotency_core::fingerprint::{canonical_json, Fingerprint};
use http::header::CONTENT_TYPE;
use http::request::Parts;

/// The configured operation name, else the method and the matched route (`POST /charges/{id}`,
/// when axum put a `MatchedPath` in the request: the layer was added with `route_layer`), else
/// the method and the path.
pub(crate) fn operation<D: Driver>(config: &Config<D>, parts: &Parts) -> String {
    if let Some(name) = &config.operation {
        return name.clone();
    }
    #[cfg(feature = "axum")]
    if let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return format!("{} {}", parts.method, path.as_str());
    }
    format!("{} {}", parts.method, parts.uri.path())
}

/// The user the request acts for, `None` when the scope extractor found none.
pub(crate) fn user<D: Driver>(config: &Config<D>, parts: &Parts) -> Option<String> {
    match &config.scope {
        Scope::User(user) => user(parts),
        Scope::Anonymous => Some(ANONYMOUS_USER.to_owned()),
    }
}

/// Whether the request says its body is JSON (`application/json`, `application/*+json`).
fn is_json(parts: &Parts) -> bool {
    parts.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
        let essence = v.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
    })
}

/// The fingerprint of the method, the path (with its query) and the body: the canonical JSON of
/// a JSON body (or of its selected top-level fields), the exact bytes of any other body (or of a
/// JSON body that does not parse).
pub(crate) fn fingerprint<D: Driver>(config: &Config<D>, parts: &Parts, body: &[u8]) -> Fingerprint {
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let canonical = if is_json(parts) { canonical_body(config.fields.as_deref(), body) } else { None };
    let mut input = format!("{} {}\n", parts.method, target).into_bytes();
    match canonical {
        Some(text) => {
            input.extend_from_slice(b"json\n");
            input.extend_from_slice(text.as_bytes());
        }
        None => {
            input.extend_from_slice(b"bytes\n");
            input.extend_from_slice(body);
        }
    }
    Fingerprint::of_bytes(&input)
}

fn canonical_body(fields: Option<&[String]>, body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    match fields {
        None => canonical_json(text).ok(),
        Some(fields) => {
            // The selected members' own text, never a parsed value: numbers keep every digit
            // (serde_json's Value would round them to f64), and canonical_json sees them exactly.
            let object: std::collections::HashMap<String, Box<serde_json::value::RawValue>> = serde_json::from_str(text).ok()?;
            let mut selected = String::from("{");
            for (name, value) in fields.iter().filter_map(|f| object.get(f).map(|v| (f, v))) {
                if selected.len() > 1 {
                    selected.push(',');
                }
                selected.push_str(&serde_json::to_string(name).ok()?);
                selected.push(':');
                selected.push_str(value.get());
            }
            selected.push('}');
            canonical_json(&selected).ok()
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use crate::layer::IdempotencyLayer;
    use crate::Idempotency;

    fn config(fields: Option<&[&str]>) -> std::sync::Arc<Config> {
        let idem = Idempotency::connect("postgresql://u@127.0.0.1:1/db", 1).unwrap();
        let mut builder = IdempotencyLayer::builder(idem).anonymous();
        if let Some(fields) = fields {
            builder = builder.fingerprint_fields(fields.iter().copied());
        }
        builder.build().unwrap().config
    }

    fn parts(method: &str, uri: &str, json: bool) -> Parts {
        let mut req = http::Request::builder().method(method).uri(uri);
        if json {
            req = req.header(CONTENT_TYPE, "application/json; charset=utf-8");
        }
        req.body(()).unwrap().into_parts().0
    }

    #[test]
    fn json_bodies_are_canonical_other_bodies_exact() {
        let c = config(None);
        let post = parts("POST", "/charges", true);
        let a = fingerprint(&c, &post, br#"{"a": 1, "b": [1, 2]}"#);
        assert_eq!(a, fingerprint(&c, &post, br#"{"b":[1,2],"a":1}"#));
        assert_ne!(a, fingerprint(&c, &post, br#"{"a": 2, "b": [1, 2]}"#));
        let raw = parts("POST", "/charges", false);
        assert_ne!(fingerprint(&c, &raw, b"{\"a\":1}"), fingerprint(&c, &raw, b"{ \"a\":1}"));
    }

    #[test]
    fn method_and_path_count() {
        let c = config(None);
        let body = br#"{"a": 1}"#;
        let a = fingerprint(&c, &parts("POST", "/charges", true), body);
        assert_ne!(a, fingerprint(&c, &parts("PATCH", "/charges", true), body));
        assert_ne!(a, fingerprint(&c, &parts("POST", "/refunds", true), body));
        assert_ne!(a, fingerprint(&c, &parts("POST", "/charges?x=1", true), body));
    }

    #[test]
    fn selected_fields_only() {
        let c = config(Some(&["amount"]));
        let post = parts("POST", "/charges", true);
        let a = fingerprint(&c, &post, br#"{"amount": 1, "trace": "x"}"#);
        assert_eq!(a, fingerprint(&c, &post, br#"{"trace": "y", "amount": 1}"#));
        assert_ne!(a, fingerprint(&c, &post, br#"{"amount": 2, "trace": "x"}"#));
    }

    #[test]
    fn selected_fields_keep_every_digit() {
        // Equal as f64, different as numbers: two requests, never one fingerprint.
        let c = config(Some(&["amount"]));
        let post = parts("POST", "/charges", true);
        let a = fingerprint(&c, &post, br#"{"amount": 10000000000000000001, "trace": "x"}"#);
        assert_ne!(a, fingerprint(&c, &post, br#"{"amount": 10000000000000000000, "trace": "x"}"#));
        assert_ne!(
            fingerprint(&c, &post, br#"{"amount": 0.10000000000000000001}"#),
            fingerprint(&c, &post, br#"{"amount": 0.1}"#)
        );
        // Still canonical: the same number spelled another way, nested objects in another order.
        assert_eq!(fingerprint(&c, &post, br#"{"amount": 1.50}"#), fingerprint(&c, &post, br#"{"amount": 15e-1}"#));
        assert_eq!(fingerprint(&c, &post, br#"{"amount": {"b": 1, "a": 2}}"#), fingerprint(&c, &post, br#"{"amount": {"a": 2, "b": 1}}"#));
    }
}
