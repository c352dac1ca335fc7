//! The axum example of the driver under test (`idempotency_examples::charges`, or its sqlx
//! twin `charges_sqlx`: examples/rust/src) served on loopback and exercised over real HTTP: the
//! IETF checks of the test kit (`idempotency_testkit::ietf`, which the actix-web example passes
//! too: tests/tests/actix.rs), and the one-statement route.

idempotency_testkit::for_each_driver! {
    /// The example service of each driver.
    trait App: idempotency_client::Driver {
        const SCHEMA: &'static str;
        fn router(idem: idempotency_client::Idempotency<Self>) -> axum::Router;
    }

    impl App for idempotency_client::Postgres {
        const SCHEMA: &'static str = idempotency_examples::charges::SCHEMA;
        fn router(idem: idempotency_client::Idempotency<Self>) -> axum::Router {
            idempotency_examples::charges::router(idem)
        }
    }

    impl App for idempotency_client::Sqlx {
        const SCHEMA: &'static str = idempotency_examples::charges_sqlx::SCHEMA;
        fn router(idem: idempotency_client::Idempotency<Self>) -> axum::Router {
            idempotency_examples::charges_sqlx::router(idem)
        }
    }

    use idempotency_client::Settings;

    use reqwest::StatusCode;
    use serde_json::{json, Value};

    async fn serve(idem: Idem) -> String {
        admin().await.batch_execute(<TestDriver as App>::SCHEMA).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, <TestDriver as App>::router(idem)).await });
        format!("http://{addr}/charges")
    }

    async fn post(url: &str, key: Option<&str>, user: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = reqwest::Client::new().post(url).header("x-user", user).body(body.to_string());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        let resp = req.send().await.expect("request");
        let (status, headers) = (resp.status(), resp.headers().clone());
        (status, headers, resp.json().await.unwrap_or(Value::Null))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_one_statement_route_executes_once_and_replays() {
        let url = format!("{}/one", serve(handle(Settings::default()).await).await);
        let (status, headers, first) = post(&url, Some("one-1"), "http-one", json!({"amount": 7})).await;
        assert_eq!(status, StatusCode::CREATED, "{first}");
        assert!(headers.get("idempotent-replayed").is_none());
        assert_eq!(first["amount"], 7, "the stored response is the inserted row: {first}");
        let (status, headers, again) = post(&url, Some("one-1"), "http-one", json!({"amount": 7})).await;
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(headers.get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
        assert_eq!(again, first);
        let (status, headers, body) = post(&url, Some("one-1"), "http-one", json!({"amount": 8})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "another request under the key: {body}");
        // The handler answers the client's Error through its IntoResponse: the layer's problem+json.
        assert_eq!(headers.get("content-type").map(|v| v.to_str().unwrap()), Some("application/problem+json"));
        assert_eq!(body["type"], "urn:idempotency:problem:mismatch");
        assert_eq!(charges_of("http-one").await, 1);
    }

    async fn charges_of(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn post_charges_maps_every_outcome_to_http() {
        let url = serve(handle(Settings::default()).await).await;
        idempotency_testkit::ietf::every_outcome(&url, test_database().await, "http-a").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_concurrent_requests_with_one_key_charge_once() {
        let url = serve(handle(Settings::default()).await).await;
        idempotency_testkit::ietf::concurrent_duplicates_charge_once(&url, test_database().await, "http-race").await;
    }

    #[tokio::test]
    async fn store_down_answers_503() {
        let idem = store_down(2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, <TestDriver as App>::router(idem)).await });
        idempotency_testkit::ietf::store_down_answers_503(&url).await;
    }
}
