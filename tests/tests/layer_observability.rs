//! The layer's traces and metrics, seen by a recording `tracing` subscriber and a recording
//! `metrics` recorder (both global, so this file holds one test).

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idempotency_client::layer::{IdempotencyLayer, Transaction};
use idempotency_client::{Fingerprint, Key, Settings};
use idempotency_testkit::driver::query_i64_in;
use idempotency_testkit::{handle, DbError, TestDriver};
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
    let route = post(|tx: Transaction<TestDriver>, body: String| async move {
        let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        query_i64_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('obs', 1, 'obs') RETURNING id", &[]).await.unwrap();
        let status = request["status"].as_u64().map_or(StatusCode::CREATED, |s| StatusCode::from_u16(s as u16).unwrap());
        (status, body)
    });
    let idem_direct = idem.clone();
    let hashed = IdempotencyLayer::builder(idem.clone()).anonymous().build().unwrap();
    let raw = IdempotencyLayer::builder(idem).anonymous().operation("obs.raw").log_keys(true).build().unwrap();
    let app = Router::new()
        .route("/obs", route.clone().route_layer(hashed))
        .route("/raw", route.route_layer(raw));
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
    assert_eq!(post("/obs", None, json!({})).await, 400);
    assert_eq!(post("/raw", Some("obs-raw-1"), json!({})).await, 201);

    let metrics: Metrics = snapshotter.snapshot().into_vec();
    let op = "POST /obs";
    for (outcome, n) in [("executed", 1), ("replayed", 1), ("mismatch", 1), ("released", 1), ("rejected", 1)] {
        assert_eq!(metric(&metrics, "idempotency_requests_total", op, outcome), Some(&DebugValue::Counter(n)), "{outcome}");
        match metric(&metrics, "idempotency_duration_seconds", op, outcome) {
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
    let outcomes: Vec<_> = obs.iter().map(|s| s.get("outcome").cloned().unwrap_or_default()).collect();
    assert_eq!(outcomes, ["executed", "replayed", "mismatch", "released", "rejected"]);
    for span in &obs {
        assert!(span.contains_key("duration_ms") && span.contains_key("status"), "{span:?}");
        assert_eq!(span.get("mode").map(String::as_str), Some("in_transaction"));
        if let Some(key) = span.get("key") {
            assert!(!key.contains("obs-secret"), "the key is hashed: {span:?}");
            assert_eq!(key.len(), 16, "{span:?}");
        }
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
