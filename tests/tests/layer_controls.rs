//! The layer's controls over real HTTP on loopback, each against the behaviour without it: a
//! namespace keeps two services on one database apart, a payload subset by nested JSON Pointers,
//! query parameters out of the fingerprint unless asked, async key and user extractors with
//! state, a status policy closure with state, a hook on replays. Each suite's database is its own.

idempotency_testkit::for_each_driver! {
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use idempotency_tower::{problem::types, Builder, IdempotencyLayer, Reply, Transaction};
    use idempotency_client::{Settings, Verdict};
    use serde_json::{json, Value};
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The database of this suite (one per driver), made once.
    async fn database() -> &'static str {
        static URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
        URL.get_or_init(|| async { idempotency_testkit::fresh_database(&db("layer_controls")).await }).await.as_str()
    }

    /// The route: counts its runs, writes a charge row through the request's transaction, and
    /// answers `{"id", "amount"}` with the status the body asks for (201 by default).
    async fn charge(tx: Transaction<TestDriver>, State(runs): State<Arc<AtomicUsize>>, headers: HeaderMap, body: String) -> Response {
        runs.fetch_add(1, Ordering::SeqCst);
        let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let status = request["status"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::CREATED);
        let user = headers.get("x-user").and_then(|v| v.to_str().ok()).unwrap_or("none").to_owned();
        let amount = request["amount"].as_i64().unwrap_or(0).to_string();
        let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, $2::text::bigint, 'controls') RETURNING id";
        let id = query_i64_in(&tx, insert, &[&user, &amount]).await.expect("insert the charge");
        (status, axum::Json(json!({"id": id, "amount": request["amount"]}))).into_response()
    }

    /// A served `POST /charges` behind a layer that reads the user from `X-User` (unless
    /// `configure` says otherwise), and how many times its route ran.
    struct Served {
        url: String,
        runs: Arc<AtomicUsize>,
    }

    async fn serve(configure: impl FnOnce(Builder<TestDriver>) -> Builder<TestDriver>) -> Served {
        let idem = connect_with(database().await, 8, Settings::default());
        let builder = IdempotencyLayer::builder(idem).user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned));
        let layer = configure(builder).build().expect("layer");
        let runs = Arc::new(AtomicUsize::new(0));
        let router = Router::new().route("/charges", post(charge)).route_layer(layer).with_state(runs.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Served { url, runs }
    }

    #[derive(Debug)]
    struct Answer {
        status: u16,
        headers: HeaderMap,
        body: Value,
    }

    impl Answer {
        fn replayed(&self) -> bool {
            self.headers.get("idempotent-replayed").is_some_and(|v| v == "true")
        }

        fn problem(&self) -> (u16, &str) {
            (self.status, self.body["type"].as_str().unwrap_or_default())
        }
    }

    /// Posts `body` to `url` with these headers.
    async fn send(url: &str, headers: &[(&str, &str)], body: Value) -> Answer {
        let mut req = reqwest::Client::new().post(url).header("content-type", "application/json").body(body.to_string());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await.expect("request");
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        let text = resp.text().await.unwrap_or_default();
        Answer { status, headers, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
    }

    fn runs(served: &Served) -> usize {
        served.runs.load(Ordering::SeqCst)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_namespace_keeps_two_services_on_one_database_apart() {
        let headers = [("idempotency-key", "ns-1"), ("x-user", "ns-user")];
        let charge = json!({"amount": 10});
        // Without namespaces, the second service's first request is the first one's replay.
        let (a, b) = (serve(|b| b).await, serve(|b| b).await);
        assert!(!send(&a.url, &headers, charge.clone()).await.replayed());
        let collided = send(&b.url, &headers, charge.clone()).await;
        assert!(collided.replayed() && runs(&b) == 0, "two services sharing one database collide: {collided:?}");
        // With one namespace each, each runs its own.
        let headers = [("idempotency-key", "ns-2"), ("x-user", "ns-user")];
        let (a, b) = (serve(|b| b.namespace("billing")).await, serve(|b| b.namespace("ledger")).await);
        let first = send(&a.url, &headers, charge.clone()).await;
        let second = send(&b.url, &headers, charge.clone()).await;
        assert_eq!((first.status, first.replayed(), second.status, second.replayed()), (201, false, 201, false));
        assert_eq!((runs(&a), runs(&b)), (1, 1));
        assert_ne!(first.body["id"], second.body["id"]);
        // Each still replays its own.
        let again = send(&b.url, &headers, charge).await;
        assert_eq!((again.replayed(), &again.body), (true, &second.body));
        let records = admin_at_suite().await
            .query_one("SELECT count(*) AS n FROM idem_records WHERE key = 'ns-2' AND operation IN ('billing:POST /charges', 'ledger:POST /charges')", &[])
            .await
            .unwrap()
            .get::<_, i64>("n");
        assert_eq!(records, 2, "one record per namespace");
    }

    async fn admin_at_suite() -> deadpool_postgres::Client {
        idempotency_testkit::admin_at(database().await).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nested_paths_decide_what_a_retry_may_change() {
        let body = |id: &str, trace: &str| json!({"amount": 5, "customer": {"id": id, "name": "x"}, "trace": trace});
        // The whole body by default: a retry with a new trace id is another request.
        let whole = serve(|b| b).await;
        let headers = [("idempotency-key", "sub-1"), ("x-user", "sub-user")];
        assert_eq!(send(&whole.url, &headers, body("c-1", "t-1")).await.status, 201);
        assert_eq!(send(&whole.url, &headers, body("c-1", "t-2")).await.problem(), (422, types::MISMATCH));
        // With a subset, only the selected values (nested included) count.
        let subset = serve(|b| b.fingerprint_paths(["/amount", "/customer/id"])).await;
        let headers = [("idempotency-key", "sub-2"), ("x-user", "sub-user")];
        assert_eq!(send(&subset.url, &headers, body("c-1", "t-1")).await.status, 201);
        let retry = send(&subset.url, &headers, json!({"trace": "t-2", "customer": {"name": "y", "id": "c-1"}, "amount": 5.0})).await;
        assert!(retry.replayed(), "{retry:?}");
        assert_eq!(send(&subset.url, &headers, body("c-2", "t-1")).await.problem(), (422, types::MISMATCH));
        assert_eq!(runs(&subset), 1);
        let refused = IdempotencyLayer::builder(connect_with(database().await, 1, Settings::default()))
            .anonymous()
            .fingerprint_paths(["amount"])
            .build()
            .unwrap_err()
            .to_string();
        assert!(refused.contains("fingerprint_paths") && refused.contains("'/'"), "{refused}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn query_parameters_stay_out_of_the_fingerprint_unless_asked() {
        let charge = json!({"amount": 3});
        let out = serve(|b| b).await;
        let headers = [("idempotency-key", "q-1"), ("x-user", "q-user")];
        assert_eq!(send(&format!("{}?utm=a&ref=b", out.url), &headers, charge.clone()).await.status, 201);
        let retry = send(&format!("{}?ref=b&utm=a&t=9", out.url), &headers, charge.clone()).await;
        assert!(retry.replayed(), "tracking parameters in another order replay: {retry:?}");
        let asked = serve(|b| b.fingerprint_query(true)).await;
        let headers = [("idempotency-key", "q-2"), ("x-user", "q-user")];
        assert_eq!(send(&format!("{}?utm=a", asked.url), &headers, charge.clone()).await.status, 201);
        assert_eq!(send(&format!("{}?utm=b", asked.url), &headers, charge).await.problem(), (422, types::MISMATCH));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_key_and_user_extractors_with_state() {
        // The user from a session store (state), looked up asynchronously; the key from the
        // body's `request_id` (AIP-155), asynchronously too.
        let sessions: Arc<HashMap<String, String>> = Arc::new([("s-1".to_owned(), "alice-ext".to_owned())].into());
        let lookups = Arc::new(AtomicUsize::new(0));
        let served = {
            let lookups = lookups.clone();
            serve(move |b| {
                b.user_from(move |parts| {
                    let (sessions, lookups) = (sessions.clone(), lookups.clone());
                    let token = parts.headers.get("x-session").and_then(|v| v.to_str().ok()).map(str::to_owned);
                    async move {
                        tokio::task::yield_now().await;
                        lookups.fetch_add(1, Ordering::SeqCst);
                        sessions.get(&token?).cloned()
                    }
                })
                .key_from(|_, body| {
                    let request: Option<Value> = serde_json::from_slice(body).ok();
                    async move { Some(request?.get("request_id")?.as_str()?.to_owned()) }
                })
            })
            .await
        };
        let session = [("x-session", "s-1")];
        let first = send(&served.url, &session, json!({"request_id": "req-1", "amount": 2})).await;
        assert_eq!((first.status, first.replayed()), (201, false), "{first:?}");
        let again = send(&served.url, &session, json!({"request_id": "req-1", "amount": 2})).await;
        assert!(again.replayed(), "{again:?}");
        assert_eq!(runs(&served), 1);
        let stored = admin_at_suite().await
            .query_one("SELECT count(*) AS n FROM idem_records WHERE user_id = 'alice-ext' AND key = 'req-1'", &[])
            .await
            .unwrap()
            .get::<_, i64>("n");
        assert_eq!(stored, 1, "the record is scoped to the user the async extractor found");
        // No key in the body: 400; an unknown session: 401; neither reached the route.
        assert_eq!(send(&served.url, &session, json!({"amount": 2})).await.problem(), (400, types::KEY_MISSING));
        let stranger = send(&served.url, &[("x-session", "s-9")], json!({"request_id": "req-1", "amount": 2})).await;
        assert_eq!(stranger.problem(), (401, types::USER_MISSING));
        assert_eq!(runs(&served), 1);
        assert!(lookups.load(Ordering::SeqCst) >= 3, "the async extractor ran for each request");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_status_policy_closure_with_state() {
        let declined = json!({"amount": 4, "status": 402});
        // The default policy stores a 402: the retry replays it.
        let default = serve(|b| b).await;
        let headers = [("idempotency-key", "pol-1"), ("x-user", "pol-user")];
        assert_eq!(send(&default.url, &headers, declined.clone()).await.status, 402);
        assert!(send(&default.url, &headers, declined.clone()).await.replayed());
        // A policy holding a set of retryable statuses (402 among them) releases the key.
        let retryable: Arc<HashSet<u16>> = Arc::new([402, 503].into());
        let policy = serve(move |b| {
            b.status_policy(move |status| match retryable.contains(&status) {
                true => Verdict::Transient,
                false => idempotency_tower::default_status_policy(status),
            })
        })
        .await;
        let headers = [("idempotency-key", "pol-2"), ("x-user", "pol-user")];
        for _ in 0..2 {
            let answer = send(&policy.url, &headers, declined.clone()).await;
            assert_eq!((answer.status, answer.replayed()), (402, false));
        }
        assert_eq!(runs(&policy), 2, "a released key runs again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_replay_hook_sees_every_replay_and_only_replays() {
        let seen = Arc::new(AtomicUsize::new(0));
        let served = {
            let seen = seen.clone();
            serve(move |b| {
                b.on_replay(move |reply: &mut Reply| {
                    assert!(reply.is_replayed());
                    seen.fetch_add(1, Ordering::SeqCst);
                    reply.headers.insert("x-replayed-by", "hook".parse().unwrap());
                })
            })
            .await
        };
        let headers = [("idempotency-key", "hook-1"), ("x-user", "hook-user")];
        let first = send(&served.url, &headers, json!({"amount": 1})).await;
        assert!(first.headers.get("x-replayed-by").is_none());
        assert_eq!(seen.load(Ordering::SeqCst), 0, "not called for the attempt that ran");
        for n in 1..=2 {
            let again = send(&served.url, &headers, json!({"amount": 1})).await;
            assert_eq!(again.headers.get("x-replayed-by").map(|v| v.to_str().unwrap()), Some("hook"));
            assert_eq!(seen.load(Ordering::SeqCst), n);
        }
        // Without the hook a replay has no such header.
        let plain = serve(|b| b).await;
        let headers = [("idempotency-key", "hook-2"), ("x-user", "hook-user")];
        send(&plain.url, &headers, json!({"amount": 1})).await;
        assert!(send(&plain.url, &headers, json!({"amount": 1})).await.headers.get("x-replayed-by").is_none());
    }
}
