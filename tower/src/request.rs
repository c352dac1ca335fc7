//! What the layer reads from a request: its operation, its user and its fingerprint.

use crate::config::{Config, ANONYMOUS_USER};
use crate::extract::Scope;
use crate::matched::MatchedRoute;
use crate::names;
use crate::pointer;
use crate::problem::{types, Problem};
use http::header::CONTENT_TYPE;
use http::request::Parts;
use idempotency_client::{canonical_json, Driver, Fingerprint, FingerprintError};

/// The operation a request's key is scoped to, and its bounded label for spans and metrics.
pub(crate) struct Operation {
    /// The namespace, if any, then the operation name.
    pub(crate) scoped: String,
    /// The name without the namespace, or `METHOD (unmatched)` when the name is the raw path.
    pub(crate) label: String,
}

/// The configured operation name, else the method and the matched route (`POST /charges/{id}`,
/// when an adapter put a [`MatchedRoute`] in the request: axum's `MatchedPath` when the layer is
/// added with `route_layer`, actix-web's match pattern, the gRPC method), else the method and the path (whose label is bounded:
/// `POST (unmatched)`). The namespace prefixes the scoped name ([`names::scoped`]).
pub(crate) fn operation<D: Driver>(config: &Config<D>, parts: &Parts) -> Operation {
    let (name, label) = match named(config, parts) {
        Some(name) => (name.clone(), name),
        None => (format!("{} {}", parts.method, parts.uri.path()), format!("{} (unmatched)", parts.method)),
    };
    Operation { scoped: names::scoped(config.namespace.as_deref(), &name), label }
}

/// The configured name or the matched route, the names with few values.
fn named<D: Driver>(config: &Config<D>, parts: &Parts) -> Option<String> {
    if let Some(name) = &config.operation {
        return Some(name.clone());
    }
    parts.extensions.get::<MatchedRoute>().map(|route| format!("{} {}", parts.method, route.0))
}

/// The user the request acts for, `None` when the scope extractor found none.
pub(crate) async fn user<D: Driver>(config: &Config<D>, parts: &Parts) -> Option<String> {
    match &config.scope {
        Scope::User(user) => user(parts).await,
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

/// The fingerprint of the method, the path (with its query when the configuration says so) and
/// the body: the canonical JSON of a JSON body (or of its selected subset), the exact bytes of
/// any other body (or of a JSON body that does not parse, or nests deeper than the
/// canonicaliser's 1,024 levels).
///
/// A JSON body whose canonical form would exceed its bound (16 bytes per byte of the text plus
/// 8 KiB: numbers with huge exponents, such as `{"a":1e60000000}`) is refused with a 422
/// problem ([`types::FINGERPRINT_LIMIT`]), before anything is written out: its fingerprint would
/// cost far more than the body, and no key is reserved for it. The canonicaliser runs in time
/// linear in the body (at most the layer's `body_limit`), on the executor.
pub(crate) fn fingerprint<D: Driver>(config: &Config<D>, parts: &Parts, body: &[u8]) -> Result<Fingerprint, Problem> {
    let target = match config.query_in_fingerprint {
        true => parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        false => parts.uri.path(),
    };
    let canonical = if is_json(parts) { canonical_body(config.subset.as_deref(), body)? } else { None };
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
    Ok(Fingerprint::of_bytes(&input))
}

/// The canonical JSON of the body (or of its selected subset); `None` when it is not JSON (its
/// bytes are hashed instead), a problem when it is over the canonical form's bound.
fn canonical_body(subset: Option<&[pointer::Pointer]>, body: &[u8]) -> Result<Option<String>, Problem> {
    let Ok(text) = std::str::from_utf8(body) else { return Ok(None) };
    let canonical = match subset {
        None => canonical_json(text),
        // The selected values' own text, never a parsed value: numbers keep every digit
        // (serde_json's Value would round them to f64), and canonical_json sees them exactly.
        Some(pointers) => match pointer::select(text, pointers) {
            Some(selected) => canonical_json(&selected),
            None => return Ok(None),
        },
    };
    match canonical {
        Ok(text) => Ok(Some(text)),
        Err(e @ FingerprintError::TooLarge { .. }) => {
            Err(Problem::new(422, types::FINGERPRINT_LIMIT, "Request body over the fingerprint limit", e.to_string()))
        }
        Err(_) => Ok(None),
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;
    use crate::IdempotencyLayer;
    use idempotency_client::Idempotency;

    fn config(fields: Option<&[&str]>) -> std::sync::Arc<Config> {
        configured(|builder| match fields {
            Some(fields) => builder.fingerprint_fields(fields.iter().copied()),
            None => builder,
        })
    }

    fn configured(f: impl FnOnce(crate::Builder) -> crate::Builder) -> std::sync::Arc<Config> {
        let idem = Idempotency::from_url("postgresql://u@127.0.0.1:1/db", 1, idempotency_client::Settings::default()).unwrap();
        f(IdempotencyLayer::builder(idem).anonymous()).build().unwrap().config().clone()
    }

    fn fp(config: &Config, parts: &Parts, body: &[u8]) -> Fingerprint {
        fingerprint(config, parts, body).unwrap_or_else(|p| panic!("refused: {p:?}"))
    }

    /// The refusal's status and problem type.
    fn refusal(config: &Config, parts: &Parts, body: &[u8]) -> (u16, String) {
        let Err(problem) = fingerprint(config, parts, body) else { panic!("not refused") };
        let response = problem.into_response::<bytes::Bytes>();
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body: serde_json::Value = serde_json::from_slice(response.body()).expect("problem+json");
        assert!(body["detail"].as_str().is_some_and(|d| d.contains("the limit for a text of")), "{body}");
        (response.status().as_u16(), body["type"].as_str().unwrap_or_default().to_owned())
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
        let a = fp(&c, &post, br#"{"a": 1, "b": [1, 2]}"#);
        assert_eq!(a, fp(&c, &post, br#"{"b":[1,2],"a":1}"#));
        assert_ne!(a, fp(&c, &post, br#"{"a": 2, "b": [1, 2]}"#));
        let raw = parts("POST", "/charges", false);
        assert_ne!(fp(&c, &raw, b"{\"a\":1}"), fp(&c, &raw, b"{ \"a\":1}"));
    }

    #[test]
    fn method_and_path_count() {
        let c = config(None);
        let body = br#"{"a": 1}"#;
        let a = fp(&c, &parts("POST", "/charges", true), body);
        assert_ne!(a, fp(&c, &parts("PATCH", "/charges", true), body));
        assert_ne!(a, fp(&c, &parts("POST", "/refunds", true), body));
    }

    #[test]
    fn the_query_counts_only_when_asked() {
        let body = br#"{"a": 1}"#;
        let c = config(None);
        let a = fp(&c, &parts("POST", "/charges?utm=1&ref=x", true), body);
        assert_eq!(a, fp(&c, &parts("POST", "/charges?ref=x&utm=1", true), body), "tracking parameters in another order");
        assert_eq!(a, fp(&c, &parts("POST", "/charges", true), body));
        let c = configured(|b| b.fingerprint_query(true));
        assert_ne!(fp(&c, &parts("POST", "/charges?x=1", true), body), fp(&c, &parts("POST", "/charges", true), body));
    }

    #[test]
    fn nested_paths_select_the_subset() {
        let c = configured(|b| b.fingerprint_paths(["/amount", "/customer/id"]));
        let post = parts("POST", "/charges", true);
        let a = fp(&c, &post, br#"{"amount": 1, "customer": {"id": "c-1", "trace": "x"}, "at": 1}"#);
        assert_eq!(a, fp(&c, &post, br#"{"customer": {"trace": "y", "id": "c-1"}, "amount": 1.0, "at": 2}"#));
        assert_ne!(a, fp(&c, &post, br#"{"amount": 1, "customer": {"id": "c-2", "trace": "x"}, "at": 1}"#));
        // A top-level field is the pointer to it: the same fingerprint either way.
        let by_field = config(Some(&["amount"]));
        let by_path = configured(|b| b.fingerprint_paths(["/amount"]));
        assert_eq!(fp(&by_field, &post, br#"{"amount": 5, "x": 1}"#), fp(&by_path, &post, br#"{"amount": 5, "x": 2}"#));
    }

    #[test]
    fn unmatched_operations_have_a_bounded_label_and_namespaces_prefix() {
        let c = configured(|b| b.namespace("billing"));
        let seven = operation(&c, &parts("POST", "/charges/7", true));
        let eight = operation(&c, &parts("POST", "/charges/8", true));
        assert_eq!((seven.scoped.as_str(), seven.label.as_str()), ("billing:POST /charges/7", "POST (unmatched)"));
        assert_eq!(seven.label, eight.label);
        let named = configured(|b| b.operation("charges.create"));
        let op = operation(&named, &parts("POST", "/charges/7", true));
        assert_eq!((op.scoped.as_str(), op.label.as_str()), ("charges.create", "charges.create"));
        let mut matched = parts("POST", "/charges/7", true);
        matched.extensions.insert(MatchedRoute("/charges/{id}".into()));
        assert_eq!(operation(&config(None), &matched).label, "POST /charges/{id}");
    }

    #[test]
    fn namespace_and_operation_pairs_never_share_a_scope() {
        let scope = |namespace: Option<&str>, name: &str| {
            let c = configured(|b| {
                let b = b.operation(name);
                match namespace {
                    Some(ns) => b.namespace(ns),
                    None => b,
                }
            });
            operation(&c, &parts("POST", "/x", true)).scoped
        };
        // The issue's pairs: one scope each in 0.6.0 ("a:b:c").
        let pairs = [(Some("a:b"), "c"), (Some("a"), "b:c"), (None, "a:b:c"), (Some("a\\"), "b:c"), (Some("a"), "\\b:c")];
        let scopes: Vec<String> = pairs.iter().map(|(ns, name)| scope(*ns, name)).collect();
        for (i, a) in scopes.iter().enumerate() {
            for (j, b) in scopes.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?} share the scope {a}", pairs[i], pairs[j]);
            }
        }
        // Names without ':' or '\\' keep the scope 0.6.0 gave them (keys in flight across the update).
        assert_eq!(scope(Some("billing"), "charges.create"), "billing:charges.create");
        assert_eq!(scope(None, "charges.create"), "charges.create");
        let mut matched = parts("POST", "/charges/7", true);
        matched.extensions.insert(MatchedRoute("/charges/{id}".into()));
        assert_eq!(operation(&configured(|b| b.namespace("billing")), &matched).scoped, "billing:POST /charges/{id}");
        // The escapes, written out.
        assert_eq!(names::scoped(Some("a:b"), "c"), "a\\:b:c");
        assert_eq!(names::scoped(Some("a"), "b:c"), "a:b\\:c");
        assert_eq!(names::scoped(None, "a:b\\c"), "a\\:b\\\\c");
    }

    #[test]
    fn selected_fields_only() {
        let c = config(Some(&["amount"]));
        let post = parts("POST", "/charges", true);
        let a = fp(&c, &post, br#"{"amount": 1, "trace": "x"}"#);
        assert_eq!(a, fp(&c, &post, br#"{"trace": "y", "amount": 1}"#));
        assert_ne!(a, fp(&c, &post, br#"{"amount": 2, "trace": "x"}"#));
    }

    #[test]
    fn selected_fields_keep_every_digit() {
        // Equal as f64, different as numbers: two requests, never one fingerprint.
        let c = config(Some(&["amount"]));
        let post = parts("POST", "/charges", true);
        let a = fp(&c, &post, br#"{"amount": 10000000000000000001, "trace": "x"}"#);
        assert_ne!(a, fp(&c, &post, br#"{"amount": 10000000000000000000, "trace": "x"}"#));
        assert_ne!(
            fp(&c, &post, br#"{"amount": 0.10000000000000000001}"#),
            fp(&c, &post, br#"{"amount": 0.1}"#)
        );
        // Still canonical: the same number spelled another way, nested objects in another order.
        assert_eq!(fp(&c, &post, br#"{"amount": 1.50}"#), fp(&c, &post, br#"{"amount": 15e-1}"#));
        assert_eq!(fp(&c, &post, br#"{"amount": {"b": 1, "a": 2}}"#), fp(&c, &post, br#"{"amount": {"a": 2, "b": 1}}"#));
    }

    #[test]
    fn a_body_over_the_canonical_bound_is_a_422_problem() {
        let c = config(None);
        let post = parts("POST", "/charges", true);
        let limit = (422, types::FINGERPRINT_LIMIT.to_owned());
        assert_eq!(refusal(&c, &post, br#"{"a":1e60000000}"#), limit);
        assert_eq!(refusal(&c, &post, br#"[1e30000,1e30000]"#), limit);
        // Within the bound: a fingerprint.
        assert_eq!(fp(&c, &post, br#"{"a":1e8000}"#), fp(&c, &post, format!("{{\"a\":1{}}}", "0".repeat(8000)).as_bytes()));
        // Not JSON by its content type: its bytes, as before.
        let raw = parts("POST", "/charges", false);
        assert_ne!(fp(&c, &raw, br#"{"a":1e60000000}"#), fp(&c, &raw, br#"{"a":1e60000001}"#));
        // Selected fields: only what is selected counts.
        let c = config(Some(&["amount"]));
        assert_eq!(refusal(&c, &post, br#"{"amount": 1e60000000, "trace": 1}"#), limit);
        let c = config(Some(&["trace"]));
        assert_eq!(fp(&c, &post, br#"{"amount": 1e60000000, "trace": 1}"#), fp(&c, &post, br#"{"trace": 1}"#));
    }

    #[test]
    fn invalid_or_too_deep_json_bodies_are_hashed_as_bytes_as_before() {
        let c = config(None);
        let (json, raw) = (parts("POST", "/charges", true), parts("POST", "/charges", false));
        let deep = "[".repeat(1100) + &"]".repeat(1100);
        for body in [&b"{\"a\": 1,}"[..], b"\xff\xfe", deep.as_bytes()] {
            assert_eq!(fp(&c, &json, body), fp(&c, &raw, body));
        }
    }
}
