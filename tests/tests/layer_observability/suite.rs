// The layer's traces and metrics, seen by a recording `tracing` subscriber and a recording
// `metrics` recorder (both global, so this file holds one test).
//
// Instantiated once per driver, each in a test binary of its own (layer_observability.rs,
// layer_observability_sqlx.rs): the suite installs the process's global tracing subscriber and
// metrics recorder.

use super::kit::*;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idempotency_tower::{IdempotencyLayer, Transaction};
use idempotency_client::{Fingerprint, Key, Settings};

use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::CompositeKey;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = HashMap<String, String>;

/// Records the fields of every `idempotency.*` span (and its name, as `span`), as they were when
/// it closed.
#[derive(Clone, Default)]
struct Capture {
    open: Arc<Mutex<HashMap<u64, Fields>>>,
    closed: Arc<Mutex<Vec<Fields>>>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name().starts_with("idempotency.") {
            let mut fields = Fields::from([("span".to_owned(), attrs.metadata().name().to_owned())]);
            attrs.record(&mut Visitor(&mut fields));
            self.open.lock().unwrap().insert(id.into_u64(), fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Visitor(fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(fields);
        }
    }
}

/// Every metric, once (a snapshot drains the histograms).
type Metrics = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

fn metric<'m>(metrics: &'m Metrics, name: &str, operation: &str, outcome: &str) -> Option<&'m DebugValue> {
    metrics.iter().find_map(|(key, _, _, value)| {
        let key = key.key();
        let labels: HashMap<_, _> = key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
        let matches = key.name() == name
            && labels.get("operation").map(String::as_str) == Some(operation)
            && labels.get("outcome").map(String::as_str) == Some(outcome);
        matches.then_some(value)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_for_every_decision() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone())).unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let idem = handle(Settings::default()).await;
    // The handler writes a row; `status` picks its answer, `hold` holds its transaction open
    // (it says it started, then waits for the gate), `steal` moves the key's record to another
    // token (so its completion finds the key lost).
    let (started, gate) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Semaphore::new(0)));
    let (held_started, held_gate) = (started.clone(), gate.clone());
    let route = post(move |tx: Transaction<TestDriver>, headers: axum::http::HeaderMap, body: String| {
        let (held_started, held_gate) = (held_started.clone(), held_gate.clone());
        async move {
            let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            exec_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('obs', 1, 'obs')", &[]).await.unwrap();
            if request["hold"] == json!(true) {
                held_started.notify_one();
                held_gate.acquire().await.expect("the gate").forget();
            }
            if request["steal"] == json!(true) {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
                exec_in(&tx, "SELECT FROM idem_lookup('POST /obs', 'anonymous', $1)", &[&key]).await.unwrap();
                exec_in(&tx, "UPDATE idem_records SET token = token + 1000000 WHERE key = $1", &[&key]).await.unwrap();
            }
            let status = request["status"].as_u64().map_or(StatusCode::CREATED, |s| StatusCode::from_u16(s as u16).unwrap());
            (status, body)
        }
    });
    let idem_direct = idem.clone();
    let hashed = IdempotencyLayer::builder(idem.clone()).anonymous().max_retries(2).build().unwrap();
    let raw = IdempotencyLayer::builder(idem).anonymous().operation("obs.raw").log_keys(true).build().unwrap();
    // A store that cannot be reached, and one whose configured schema holds no extension.
    let down = try_connect_with("postgresql://postgres@127.0.0.1:1/none", 1, Settings::builder().schema("idem")).unwrap();
    let down = IdempotencyLayer::builder(down).anonymous().operation("obs.down").build().unwrap();
    let broken = try_connect_with(test_database().await, 1, Settings::builder().schema("no_such_schema")).unwrap();
    let broken = IdempotencyLayer::builder(broken).anonymous().operation("obs.broken").build().unwrap();
    let app = Router::new()
        .route("/obs", route.clone().route_layer(hashed))
        .route("/raw", route.clone().route_layer(raw))
        .route("/down", route.clone().route_layer(down))
        .route("/broken", route.route_layer(broken));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let post = |path: &str, key: Option<&str>, body: Value| {
        let mut req = reqwest::Client::new().post(format!("{base}{path}")).body(body.to_string());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post("/obs", Some("obs-secret-1"), json!({"a": 1})).await, 201);
    assert_eq!(post("/obs", Some("obs-secret-1"), json!({"a": 1})).await, 201);
    assert_eq!(post("/obs", Some("obs-secret-1"), json!({"a": 2})).await, 422);
    assert_eq!(post("/obs", Some("obs-secret-2"), json!({"status": 503})).await, 503);
    assert_eq!(post("/obs", Some("obs-secret-2"), json!({"status": 503})).await, 503, "the second transient failure poisons");
    assert_eq!(post("/obs", Some("obs-secret-2"), json!({"status": 503})).await, 409, "the poisoned key failed");
    assert_eq!(post("/obs", None, json!({})).await, 400);
    assert_eq!(post("/obs", Some("obs-secret-3"), json!({"steal": true})).await, 409, "the lease was lost");
    // In progress: a second request while the first holds the key in its open transaction (its
    // handler started and waits for the gate, which opens only after the second was answered).
    let holder = tokio::spawn(post("/obs", Some("obs-secret-4"), json!({"hold": true})));
    tokio::time::timeout(std::time::Duration::from_secs(60), started.notified()).await.expect("the holder's handler starts");
    // (Were the duplicate run, its handler would wait for the gate too: the deadline says so.)
    let duplicate = tokio::time::timeout(std::time::Duration::from_secs(60), post("/obs", Some("obs-secret-4"), json!({"hold": true})));
    assert_eq!(duplicate.await.expect("the duplicate is answered while the key is held, without running"), 409, "in progress");
    gate.add_permits(1);
    assert_eq!(holder.await.unwrap(), 201);
    assert_eq!(post("/down", Some("obs-down-1"), json!({})).await, 503);
    assert_eq!(post("/broken", Some("obs-broken-1"), json!({})).await, 500);
    assert_eq!(post("/raw", Some("obs-raw-1"), json!({})).await, 201);

    let metrics: Metrics = snapshotter.snapshot().into_vec();
    let op = "POST /obs";
    let every: [(&str, &str, u64); 11] = [
        (op, "executed", 2),
        (op, "replayed", 1),
        (op, "mismatch", 1),
        (op, "released", 1),
        (op, "poisoned", 1),
        (op, "failed", 1),
        (op, "rejected", 1),
        (op, "lease_lost", 1),
        (op, "in_progress", 1),
        ("obs.down", "store_unavailable", 1),
        ("obs.broken", "error", 1),
    ];
    let labels: std::collections::BTreeSet<_> = every.iter().map(|(_, outcome, _)| *outcome).collect();
    let vocabulary: std::collections::BTreeSet<_> = idempotency_client::Decision::ALL.iter().map(|d| d.as_str()).collect();
    assert_eq!(labels, vocabulary, "every decision of the vocabulary is exercised");
    for (operation, outcome, n) in every {
        assert_eq!(metric(&metrics, "idempotency_requests_total", operation, outcome), Some(&DebugValue::Counter(n)), "{outcome}");
        match metric(&metrics, "idempotency_duration_seconds", operation, outcome) {
            Some(DebugValue::Histogram(samples)) => assert_eq!(samples.len(), n as usize, "{outcome}"),
            other => panic!("no duration histogram for {outcome}: {other:?}"),
        }
    }
    assert_eq!(metric(&metrics, "idempotency_requests_total", "obs.raw", "executed"), Some(&DebugValue::Counter(1)));

    // One span per covered request, closed with its outcome; the key hashed unless configured.
    let spans = capture.closed.lock().unwrap().clone();
    let of = |operation: &str| {
        spans
            .iter()
            .filter(|s| s.get("span").map(String::as_str) == Some("idempotency.request"))
            .filter(|s| s.get("operation").map(String::as_str) == Some(operation))
            .collect::<Vec<_>>()
    };
    let obs = of(op);
    let mut outcomes: Vec<_> = obs.iter().map(|s| s.get("outcome").cloned().unwrap_or_default()).collect();
    outcomes.sort();
    let mut expected: Vec<_> = every.iter().filter(|(o, _, _)| *o == op).flat_map(|(_, outcome, n)| vec![outcome.to_string(); *n as usize]).collect();
    expected.sort();
    assert_eq!(outcomes, expected);
    for span in &obs {
        assert!(span.contains_key("duration_ms") && span.contains_key("status"), "{span:?}");
        assert_eq!(span.get("mode").map(String::as_str), Some("in_transaction"));
        if span.get("outcome").map(String::as_str) == Some("rejected") {
            assert!(!span.contains_key("key"), "a request without a key records none: {span:?}");
            continue;
        }
        let key = span.get("key").unwrap_or_else(|| panic!("a request with a key records its hash: {span:?}"));
        assert!(!key.contains("obs-secret"), "the key is hashed: {span:?}");
        assert!(key.len() == 16 && key.bytes().all(|b| b.is_ascii_hexdigit()), "16 hex digits: {span:?}");
    }
    assert_eq!(of("obs.raw")[0].get("key").map(String::as_str), Some("obs-raw-1"));

    // A direct call of the handle has its own span, without the key.
    let key = Key::new("obs.direct", "u", "obs-direct-1").unwrap();
    let fingerprint = Fingerprint::of_bytes(b"direct");
    let outcome = idem_direct
        .run(&key, &fingerprint, |_tx| Box::pin(async { Ok::<_, DbError>(json!({"ok": true})) }))
        .await
        .unwrap();
    assert!(outcome.is_executed());
    let spans = capture.closed.lock().unwrap().clone();
    let call = spans.iter().find(|s| s.get("operation").map(String::as_str) == Some("obs.direct")).expect("a call span");
    assert_eq!(call.get("span").map(String::as_str), Some("idempotency.call"));
    assert_eq!(call.get("call").map(String::as_str), Some("run"));
    assert_eq!(call.get("outcome").map(String::as_str), Some("executed"));
    assert!(call.contains_key("duration_ms") && !call.values().any(|v| v.contains("obs-direct-1")), "{call:?}");
}
