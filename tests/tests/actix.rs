//! The actix-web example (`idempotency_examples::actix_charges`, examples/rust/src) over each
//! driver, served by actix-web's own server (two workers, on a thread running an actix-web
//! system) on loopback and exercised over real HTTP with reqwest: the same IETF checks as the
//! axum example (`idempotency_testkit::ietf`), and the middleware's rules that are its own (a
//! panicking handler releases the key; the transaction commits with the response).

idempotency_testkit::for_each_driver! {
    use idempotency_client::Settings;
    use serde_json::json;

    /// Serves the example over `idem` on a port of its own; the base URL of `POST /charges`.
    async fn serve(idem: Idem, schema: bool) -> String {
        if schema {
            admin().await.batch_execute(idempotency_examples::actix_charges::SCHEMA).await.unwrap();
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                idempotency_examples::actix_charges::server(idem, listener).expect("the server").await
            })
        });
        url
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_actix_example_maps_every_outcome_to_http() {
        let url = serve(handle(Settings::default()).await, true).await;
        idempotency_testkit::ietf::every_outcome(&url, test_database().await, &format!("actix-a-{NAME}")).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_actix_example_charges_once_for_concurrent_duplicates() {
        let url = serve(handle(Settings::default()).await, true).await;
        idempotency_testkit::ietf::concurrent_duplicates_charge_once(&url, test_database().await, &format!("actix-race-{NAME}")).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_actix_example_answers_503_when_the_store_is_down() {
        let idem = connect_with("postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=2", 2, Settings::default());
        let url = serve(idem, false).await;
        idempotency_testkit::ietf::store_down_answers_503(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replay_is_the_stored_answer_with_its_headers() {
        let url = serve(handle(Settings::default()).await, true).await;
        let user = format!("actix-replay-{NAME}");
        let (_, first_headers, first) = idempotency_testkit::ietf::post(&url, Some("r-1"), &user, json!({"amount": 3})).await;
        let (status, headers, again) = idempotency_testkit::ietf::post(&url, Some("r-1"), &user, json!({"amount": 3})).await;
        assert_eq!((status.as_u16(), &again), (201, &first));
        assert_eq!(headers.get("content-type"), first_headers.get("content-type"));
        assert_eq!(headers.get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    }

    /// A route of its own behind the middleware: it writes a charge through the transaction, then
    /// panics the first time; how many times it ran.
    fn flaky_server(idem: Idem, listener: std::net::TcpListener, runs: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> actix_web::dev::Server {
        use actix_web::{web, App, HttpResponse, HttpServer};
        use idempotency_client::layer::{IdempotencyLayer, Transaction};
        use std::sync::atomic::Ordering;
        let layer = IdempotencyLayer::in_transaction(idem).anonymous().build().expect("layer");
        HttpServer::new(move || {
            let runs = runs.clone();
            let handler = move |tx: Transaction<TestDriver>| {
                let runs = runs.clone();
                async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst);
                    query_i64_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('actix-flaky', 1, 'f') RETURNING id", &[]).await.expect("insert");
                    if run == 0 {
                        panic!("the handler failed half-way, after its write");
                    }
                    HttpResponse::Created().body("charged")
                }
            };
            App::new().service(web::resource("/flaky").wrap(layer.clone()).route(web::post().to(handler)))
        })
        .listen(listener)
        .expect("listen")
        .workers(1)
        .run()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_handler_releases_the_key_and_rolls_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let idem = handle(Settings::default()).await;
        admin().await.batch_execute("DELETE FROM charges WHERE user_id = 'actix-flaky'").await.unwrap();
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/flaky", listener.local_addr().unwrap());
        let server_runs = runs.clone();
        std::thread::spawn(move || actix_web::rt::System::new().block_on(async move { flaky_server(idem, listener, server_runs).await }));
        let (status, headers, body) = idempotency_testkit::ietf::post(&url, Some(&format!("flaky-{NAME}")), "u", json!({})).await;
        assert_eq!(status.as_u16(), 500, "{body}");
        assert_eq!(headers.get("content-type").map(|v| v.to_str().unwrap()), Some("application/problem+json"));
        assert_eq!(body["type"], "urn:idempotency:problem:handler-failed");
        let resp = reqwest::Client::new().post(&url).header("idempotency-key", format!("flaky-{NAME}")).body("{}").send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 201, "the retry runs again");
        assert!(resp.headers().get("idempotent-replayed").is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        let rows: i64 = admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = 'actix-flaky'", &[]).await.unwrap().get("n");
        assert_eq!(rows, 1, "the panicking attempt's write rolled back with its reservation");
    }
}
