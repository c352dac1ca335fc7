//! The layer's and the flows' edges (issue 32, items 3 and 4), in both modes, written once over
//! both drivers (from one binary: `over_postgres::`, `over_sqlx::`):
//!
//! - a response over the limit never loops: in-transaction it is refused, rolled back and
//!   counted, so the retries end in a poisoned key after `max_retries` runs; two-phase its effect
//!   stands and the key is completed with the too-large marker, replayed without a second run;
//!   the same for `run` / `run_external` with an oversized `StoredResponse`; the route's body
//!   is read only up to the limit, which by default is the server's
//!   `idempotency.max_response_bytes` (8kB for this file's database);
//! - binary bodies replay byte for byte, and a record in 0.5.0's stored form still replays;
//! - no 5xx answer carries a driver's text, a host, an OS error, a panic's message or an
//!   error's Display: its `correlation_id` finds the real error in the `tracing` event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use tracing::field::{Field, Visit};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

// ---- the tracing events of 5xx answers (one recording subscriber for the process, shared by
// both drivers' instances of the suite) --------------------------------------------------------

type Fields = HashMap<String, String>;

/// Every event that carries a `correlation_id`, with its fields.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Fields>>>);

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        if fields.contains_key("correlation_id") {
            self.0.lock().unwrap().push(fields);
        }
    }
}

/// The process's recording subscriber (global: the layer's tasks run on any thread).
fn events() -> &'static Events {
    static EVENTS: OnceLock<Events> = OnceLock::new();
    EVENTS.get_or_init(|| {
        let events = Events::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(events.clone())).expect("the only subscriber");
        events
    })
}


idempotency_testkit::for_each_driver! {
    use super::events;
    use axum::body::{Body as HttpBody, Bytes};
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use futures_util::StreamExt;
    use idempotency_tower::{problem::types, Builder, IdempotencyLayer, Mode, Transaction, DEFAULT_RESPONSE_LIMIT};
    use idempotency_client::{Body, Error, Fingerprint, Settings, StoredResponse, TxFuture};

    use idempotency_testkit::{unique_key};
    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The server's `idempotency.max_response_bytes` for this file's database (set once, before any
    /// handle connects), so that the layer's default limit is read from the server.
    const SERVER_LIMIT: usize = 8 * 1024;

    /// The route's operation (the layer names it from the matched route).
    const OPERATION: &str = "POST /r";

    /// A handle on this file's database, whose `idempotency.max_response_bytes` is 8kB.
    async fn idem(settings: Settings) -> Idem {
        static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        READY
            .get_or_init(|| async {
                let url = test_database().await;
                let name = url.rsplit('/').next().expect("a database name");
                let sql = format!("ALTER DATABASE {name} SET idempotency.max_response_bytes = '{}kB'", SERVER_LIMIT / 1024);
                admin().await.batch_execute(&sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
            })
            .await;
        handle(settings).await
    }

    /// The `error` of the event logged with the correlation id of the 5xx answer `body`.
    fn logged_error(body: &Value) -> String {
        let id = body["correlation_id"].as_str().unwrap_or_else(|| panic!("a 5xx answer carries a correlation_id: {body}"));
        assert!(id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()), "16 hex digits: {id}");
        let events = events().0.lock().unwrap();
        let event = events.iter().find(|e| e.get("correlation_id").map(String::as_str) == Some(id));
        event.and_then(|e| e.get("error").cloned()).unwrap_or_else(|| panic!("no error event with correlation_id {id}"))
    }

    // ---- the route ------------------------------------------------------------------------------

    /// The route's counters.
    #[derive(Default)]
    struct App {
        /// Runs of the handler.
        runs: AtomicUsize,
        /// Chunks of a streamed body that were read.
        polled: Arc<AtomicUsize>,
    }

    /// Answers the request `{"fill", "size", "message"}`: `size` bytes of `x` (`"x"`), of `"`
    /// (`"quote"`: its stored form, escaped, is twice as long), bytes 0, 1, 2 ... (`"binary"`, stored
    /// as hex: twice as long), a stream of 1 KiB chunks (`"stream"`, 64 MiB, counted as read), a
    /// body that fails with `message` (`"fails"`), or a panic with `message` (`"panic"`).
    fn respond(app: &App, request: &str) -> Response {
        app.runs.fetch_add(1, Ordering::SeqCst);
        let request: Value = serde_json::from_str(request).unwrap_or(Value::Null);
        let size = request["size"].as_u64().unwrap_or(0) as usize;
        let message = request["message"].as_str().unwrap_or_default().to_owned();
        match request["fill"].as_str().unwrap_or("x") {
            "quote" => (StatusCode::CREATED, "\"".repeat(size)).into_response(),
            "binary" => {
                let bytes: Vec<u8> = (0..size).map(|i| (i % 256) as u8).collect();
                (StatusCode::CREATED, [("content-type", "application/octet-stream")], bytes).into_response()
            }
            "stream" => {
                let polled = app.polled.clone();
                let chunks = futures_util::stream::iter(0..64 * 1024).map(move |_| {
                    polled.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1024]))
                });
                (StatusCode::CREATED, HttpBody::from_stream(chunks)).into_response()
            }
            "fails" => {
                let chunks = futures_util::stream::iter([Ok(Bytes::from_static(b"partial")), Err(std::io::Error::other(message))]);
                (StatusCode::CREATED, HttpBody::from_stream(chunks)).into_response()
            }
            "panic" => panic!("{message}"),
            _ => (StatusCode::CREATED, "x".repeat(size)).into_response(),
        }
    }

    /// In-transaction: a business row tagged with the key, through the request's transaction.
    async fn in_transaction(tx: Transaction<TestDriver>, State(app): State<Arc<App>>, headers: HeaderMap, body: String) -> Response {
        let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        exec_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('edges', 1, $1)", &[&key]).await.expect("insert");
        respond(&app, &body)
    }

    /// Two-phase: the effect is the run itself (counted).
    async fn two_phase(State(app): State<Arc<App>>, body: String) -> Response {
        respond(&app, &body)
    }

    struct Served {
        url: String,
        app: Arc<App>,
    }

    /// Serves `POST /r` in `mode` over `idem`, anonymous, with `configure`'s settings.
    async fn serve(idem: Idem, mode: Mode, configure: impl FnOnce(Builder<TestDriver>) -> Builder<TestDriver>) -> Served {
        events();
        let app = Arc::new(App::default());
        let layer = configure(IdempotencyLayer::builder(idem).mode(mode).anonymous()).build().expect("layer");
        let route = match mode {
            Mode::InTransaction => post(in_transaction),
            Mode::TwoPhase => post(two_phase),
        };
        let router = Router::new().route("/r", route).route_layer(layer).with_state(app.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/r", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Served { url, app }
    }

    /// An answer.
    #[derive(Debug)]
    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        bytes: Vec<u8>,
    }

    impl Answer {
        fn json(&self) -> Value {
            serde_json::from_slice(&self.bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.bytes).into_owned()))
        }

        fn replayed(&self) -> bool {
            self.headers.get("idempotent-replayed").and_then(|v| v.to_str().ok()) == Some("true")
        }

        /// Asserts a problem answer of this status and type; its body.
        fn problem(&self, status: u16, kind: &str) -> Value {
            let body = self.json();
            assert_eq!((self.status.as_u16(), body["type"].as_str()), (status, Some(kind)), "{body}");
            assert_eq!(self.headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/problem+json"));
            body
        }

        /// Asserts that none of `secrets` is in the answer (body or headers).
        fn hides(&self, secrets: &[&str]) {
            let text = format!("{:?} {}", self.headers, String::from_utf8_lossy(&self.bytes)).to_lowercase();
            for secret in secrets {
                assert!(!text.contains(&secret.to_lowercase()), "{secret:?} reached the answer: {text}");
            }
        }
    }

    async fn send(url: &str, key: &str, request: Value) -> Answer {
        let resp = reqwest::Client::new().post(url).header("idempotency-key", key).body(request.to_string()).send().await.expect("request");
        let (status, headers) = (resp.status(), resp.headers().clone());
        Answer { status, headers, bytes: resp.bytes().await.expect("body").to_vec() }
    }

    /// Business rows tagged `k`.
    async fn rows(k: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM charges WHERE k = $1", &[&k]).await.unwrap().get("n")
    }

    /// The status and stored response of a key of the route.
    async fn record(key: &str) -> (String, Value) {
        let sql = "SELECT _idem_status_word(status) AS status, response::text AS response FROM idem_records WHERE operation = $1 AND user_id = 'anonymous' AND key = $2";
        let row = admin().await.query_one(sql, &[&OPERATION, &key]).await.expect("the key's record");
        let response: Option<String> = row.get("response");
        (row.get("status"), response.map_or(Value::Null, |r| serde_json::from_str(&r).unwrap()))
    }

    fn marker() -> Value {
        serde_json::to_value(StoredResponse::too_large()).unwrap()
    }

    /// Chunks of 1 KiB read before a body over the server's limit was refused: at most one past it.
    const MOST_CHUNKS: usize = SERVER_LIMIT / 1024 + 1;

    // ---- item 3: bounded responses, and no loop -------------------------------------------------

    /// The over-limit requests of both modes: refused by the layer's read (`x`, `stream`, over 8kB
    /// raw) or by the server's check of the stored form (`quote` and `binary`, under 8kB raw but
    /// twice that stored); the logged cause says which.
    const OVER: [(&str, usize, &str); 4] = [
        ("x", 10_000, "larger than the response limit (8192 bytes)"),
        ("stream", 0, "larger than the response limit (8192 bytes)"),
        ("quote", 5_000, "idempotency.max_response_bytes"),
        ("binary", 5_000, "idempotency.max_response_bytes"),
    ];

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn over_the_limit_in_transaction_is_rolled_back_counted_and_poisoned() {
        let served = serve(idem(Settings::default()).await, Mode::InTransaction, |b| b.max_retries(2)).await;
        for (fill, size, cause) in OVER {
            let key = format!("tx-over-{fill}");
            let request = json!({"fill": fill, "size": size});
            let runs = served.app.runs.load(Ordering::SeqCst);
            for attempt in 1..=2 {
                let answer = send(&served.url, &key, request.clone()).await;
                let body = answer.problem(502, types::RESPONSE_TOO_LARGE);
                assert!(!answer.replayed());
                assert!(body["detail"].as_str().unwrap().contains("rolled back"), "{body}");
                let logged = logged_error(&body);
                assert!(logged.contains(cause), "{fill}, attempt {attempt}: {logged}");
            }
            assert_eq!(rows(&key).await, 0, "{fill}: every attempt's write was rolled back");
            // Counted: the second refusal poisoned the key, so the handler never runs a third time.
            for _ in 0..2 {
                send(&served.url, &key, request.clone()).await.problem(409, types::FAILED);
            }
            assert_eq!(served.app.runs.load(Ordering::SeqCst) - runs, 2, "{fill}: max_retries runs, not more");
            assert_eq!(record(&key).await.0, "FAILED");
        }
        let polled = served.app.polled.load(Ordering::SeqCst);
        assert!(polled <= 2 * MOST_CHUNKS, "two streams of 64 MiB were read only to the limit: {polled} chunks");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn over_the_limit_two_phase_completes_the_key_with_the_marker() {
        let served = serve(idem(Settings::default()).await, Mode::TwoPhase, |b| b).await;
        for (fill, size, cause) in OVER {
            let key = format!("tp-over-{fill}");
            let request = json!({"fill": fill, "size": size});
            let runs = served.app.runs.load(Ordering::SeqCst);
            let first = send(&served.url, &key, request.clone()).await;
            let body = first.problem(502, types::RESPONSE_TOO_LARGE);
            assert!(!first.replayed());
            assert_eq!(body["detail"], StoredResponse::TOO_LARGE_DETAIL);
            assert!(logged_error(&body).contains(cause), "{fill}");
            // The effect happened: the key is completed with the marker, not left PROCESSING.
            assert_eq!(record(&key).await, ("FAILED".to_owned(), marker()), "{fill}");
            for _ in 0..2 {
                let retry = send(&served.url, &key, request.clone()).await;
                let replayed = retry.problem(502, types::RESPONSE_TOO_LARGE);
                assert!(retry.replayed(), "{fill}: the marker is replayed");
                assert_eq!(Some(replayed), StoredResponse::too_large().body_json());
            }
            assert_eq!(served.app.runs.load(Ordering::SeqCst) - runs, 1, "{fill}: the effect ran once");
        }
        let polled = served.app.polled.load(Ordering::SeqCst);
        assert!(polled <= MOST_CHUNKS, "a stream of 64 MiB was read only to the limit: {polled} chunks");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_configured_response_limit_refuses_below_the_servers() {
        let served = serve(idem(Settings::default()).await, Mode::InTransaction, |b| b.max_retries(1).response_limit(1000)).await;
        let fits = send(&served.url, "limit-fits", json!({"size": 1000})).await;
        assert_eq!((fits.status, fits.bytes.len()), (StatusCode::CREATED, 1000));
        let over = send(&served.url, "limit-over", json!({"size": 1001})).await;
        let body = over.problem(502, types::RESPONSE_TOO_LARGE);
        assert!(logged_error(&body).contains("larger than the response limit (1000 bytes)"));
        send(&served.url, "limit-over", json!({"size": 1001})).await.problem(409, types::FAILED);
        assert_eq!((rows("limit-fits").await, rows("limit-over").await), (1, 0));
        assert!(IdempotencyLayer::builder(idem(Settings::default()).await).anonymous().response_limit(0).build().is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_a_setting_the_limit_is_the_documented_default() {
        // A database that sets no idempotency.max_response_bytes: the extension shows its default,
        // 1MB; the portable install shows nothing, and the layer takes the documented default.
        let url = idempotency_testkit::fresh_database(&db("idem_layer_edges_unset")).await;
        let idem = connect_with(&url, 4, Settings::default());
        let served = serve(idem, Mode::InTransaction, |b| b).await;
        let over = send(&served.url, "default-over", json!({"size": DEFAULT_RESPONSE_LIMIT + 1})).await;
        let body = over.problem(502, types::RESPONSE_TOO_LARGE);
        let logged = logged_error(&body);
        assert!(logged.contains(&format!("larger than the response limit ({DEFAULT_RESPONSE_LIMIT} bytes)")), "{logged}");
    }

    /// A `StoredResponse` whose stored form is over the server's 8kB.
    fn oversized() -> StoredResponse {
        StoredResponse { status: 201, headers: vec![], body: Body::Text("x".repeat(SERVER_LIMIT + 1)) }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_with_an_oversized_response_is_counted_then_poisoned() {
        let idem = idem(Settings::builder().max_retries(2).build()).await;
        let key = unique_key("edges.run");
        let fp = Fingerprint::of_bytes(b"run");
        let runs = Arc::new(AtomicUsize::new(0));
        let attempt = || {
            let (runs, tag) = (runs.clone(), key.to_string());
            idem.run(&key, &fp, move |tx: &mut Conn| {
                let (runs, tag) = (runs.clone(), tag.clone());
                Box::pin(async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('edges', 1, $1)", &[&tag]).await?;
                    Ok::<_, DbError>(oversized())
                }) as TxFuture<'_, StoredResponse, DbError>
            })
        };
        for last in [false, true] {
            match attempt().await {
                Err(Error::ResponseTooLarge { effect_stands: false, key_failed }) => assert_eq!(key_failed, last),
                other => panic!("expected ResponseTooLarge: {other:?}"),
            }
        }
        assert!(matches!(attempt().await, Err(Error::Failed { response: None })));
        assert_eq!(runs.load(Ordering::SeqCst), 2, "max_retries runs, not more");
        assert_eq!(rows(&key.to_string()).await, 0, "every run's write was rolled back");
    }

    /// `run_external`'s local write: one row tagged `tag`, counted.
    fn local(tag: String, writes: Arc<AtomicUsize>) -> impl for<'t> FnMut(&'t mut Conn, &'t StoredResponse) -> TxFuture<'t, (), DbError> + Send {
        move |conn, _response| {
            let (tag, writes) = (tag.clone(), writes.clone());
            Box::pin(async move {
                writes.fetch_add(1, Ordering::SeqCst);
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('edges', 1, $1)", &[&tag]).await?;
                Ok(())
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_external_with_an_oversized_response_stores_the_marker() {
        let idem = idem(Settings::default()).await;
        let key = unique_key("edges.external");
        let fp = Fingerprint::of_bytes(b"external");
        let (calls, writes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let call = || {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, DbError>(oversized())
            }
        };
        let first = idem.run_external(&key, &fp, call(), local(key.to_string(), writes.clone())).await;
        assert!(matches!(first, Err(Error::ResponseTooLarge { effect_stands: true, key_failed: true })), "{first:?}");
        // The local transaction ran again with the marker: its write committed once.
        assert_eq!((writes.load(Ordering::SeqCst), rows(&key.to_string()).await), (2, 1));
        for _ in 0..2 {
            match idem.run_external(&key, &fp, call(), local(key.to_string(), writes.clone())).await {
                Err(Error::Failed { response: Some(stored) }) => assert_eq!(stored, marker()),
                other => panic!("expected the marker: {other:?}"),
            }
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the outside call ran once");
    }

    // ---- binary bodies --------------------------------------------------------------------------

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn binary_bodies_replay_byte_for_byte() {
        for mode in [Mode::InTransaction, Mode::TwoPhase] {
            let served = serve(idem(Settings::default()).await, mode, |b| b).await;
            let key = format!("bin-{mode:?}");
            let request = json!({"fill": "binary", "size": 512});
            let every: Vec<u8> = (0..512).map(|i| (i % 256) as u8).collect();
            let first = send(&served.url, &key, request.clone()).await;
            assert_eq!((first.status, &first.bytes, first.replayed()), (StatusCode::CREATED, &every, false));
            let hex: String = every.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(record(&key).await.1["hex"], json!(hex), "{mode:?}: stored as hex");
            let replay = send(&served.url, &key, request.clone()).await;
            assert_eq!((replay.status, &replay.bytes, replay.replayed()), (StatusCode::CREATED, &every, true), "{mode:?}");
            assert_eq!(replay.headers.get("content-type").unwrap(), "application/octet-stream");

            // A record as 0.5.0 stored it, written by hand: it still replays.
            let old = r#"{"status": 201, "headers": [["content-type", "application/octet-stream"]], "hex": "00019f80ff"}"#;
            let sql = "UPDATE idem_records SET response = $3::text::jsonb WHERE operation = $1 AND user_id = 'anonymous' AND key = $2";
            assert_eq!(admin().await.execute(sql, &[&OPERATION, &key, &old]).await.unwrap(), 1);
            let replay = send(&served.url, &key, request).await;
            assert_eq!((replay.status, replay.bytes.as_slice(), replay.replayed()), (StatusCode::CREATED, &[0, 1, 0x9f, 0x80, 0xff][..], true));
            assert_eq!(served.app.runs.load(Ordering::SeqCst), 1, "{mode:?}: the handler ran once");
        }
    }

    // ---- item 4: nothing internal in an answer --------------------------------------------------

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_internal_text_in_a_5xx() {
        for mode in [Mode::InTransaction, Mode::TwoPhase] {
            // The store is down: a pool to a closed port.
            let down = store_down(1);
            let served = serve(down, mode, |b| b).await;
            let answer = send(&served.url, "down-1", json!({})).await;
            let body = answer.problem(503, types::STORE_UNAVAILABLE);
            let logged = logged_error(&body);
            // The pool's own words: tokio-postgres names the refused connection, sqlx its pool's
            // timeout after the refusals.
            let said = if NAME == "sqlx" { "pool timed out" } else { "refused" };
            assert!(logged.to_lowercase().contains(said), "{mode:?}: the real error is logged: {logged}");
            answer.hides(&["127.0.0.1", "refused", "os error", "connect", logged.as_str()]);
            assert_eq!(served.app.runs.load(Ordering::SeqCst), 0);

            let served = serve(idem(Settings::default()).await, mode, |b| b).await;
            // A handler that panics with a distinctive message.
            let answer = send(&served.url, &format!("panic-{mode:?}"), json!({"fill": "panic", "message": "kaboom-7f3a at /srv/app.rs"})).await;
            let body = answer.problem(500, types::HANDLER_FAILED);
            assert!(logged_error(&body).contains("kaboom-7f3a at /srv/app.rs"), "{mode:?}: the panic is logged");
            answer.hides(&["kaboom", "/srv/app.rs", "panicked"]);
            // A response body whose error has a distinctive Display.
            let answer = send(&served.url, &format!("fails-{mode:?}"), json!({"fill": "fails", "message": "disk-9c1 failed on 10.1.2.3"})).await;
            let body = answer.problem(500, types::HANDLER_FAILED);
            assert!(logged_error(&body).contains("disk-9c1 failed on 10.1.2.3"), "{mode:?}: the error is logged");
            answer.hides(&["disk-9c1", "10.1.2.3"]);
            // The members are the documented ones.
            let mut members: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
            members.sort_unstable();
            assert_eq!(members, ["correlation_id", "detail", "status", "title", "type"]);
        }
    }
}
