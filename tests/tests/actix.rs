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
        let idem = store_down(2);
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
        use idempotency_actix::{IdempotencyLayer, Transaction};
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

    /// A route of its own whose handler reports that it started, waits for a permit of `gate`,
    /// then writes a charge (through the transaction in-transaction, on its own connection
    /// two-phase) and answers 201.
    fn held_server(idem: Idem, mode: idempotency_tower::Mode, listener: std::net::TcpListener, held: Held) -> actix_web::dev::Server {
        use actix_web::{web, App, HttpResponse, HttpServer};
        use idempotency_actix::{IdempotencyLayer, Mode, Transaction};
        use std::sync::atomic::Ordering;
        let layer = IdempotencyLayer::builder(idem).mode(mode).anonymous().build().expect("layer");
        HttpServer::new(move || {
            let held = held.clone();
            let handler = move |tx: Option<Transaction<TestDriver>>| {
                let held = held.clone();
                async move {
                    held.runs.fetch_add(1, Ordering::SeqCst);
                    let _ = held.started.send(());
                    held.gate.acquire().await.expect("gate open").forget();
                    let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, 1, 'g') RETURNING id";
                    let user = format!("actix-gone-{mode:?}");
                    match (mode, tx) {
                        (Mode::InTransaction, Some(tx)) => {
                            query_i64_in(&tx, insert, &[&user]).await.expect("insert");
                        }
                        _ => {
                            admin().await.query_one(insert, &[&user]).await.expect("insert");
                        }
                    }
                    HttpResponse::Created().body("charged")
                }
            };
            App::new().service(web::resource("/held").wrap(layer.clone()).route(web::post().to(handler)))
        })
        .listen(listener)
        .expect("listen")
        .workers(1)
        .run()
    }

    /// The levers of [`held_server`].
    #[derive(Clone)]
    struct Held {
        runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        started: tokio::sync::mpsc::UnboundedSender<()>,
        gate: std::sync::Arc<tokio::sync::Semaphore>,
    }

    async fn disconnected_client(mode: idempotency_tower::Mode) {
        use std::sync::atomic::Ordering;
        let idem = handle(Settings::default()).await;
        let user = format!("actix-gone-{mode:?}");
        admin().await.execute("DELETE FROM charges WHERE user_id = $1", &[&user]).await.unwrap();
        let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
        let held = Held { runs: Default::default(), started, gate: std::sync::Arc::new(tokio::sync::Semaphore::new(0)) };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/held", listener.local_addr().unwrap());
        let server_held = held.clone();
        std::thread::spawn(move || actix_web::rt::System::new().block_on(async move { held_server(idem, mode, listener, server_held).await }));
        let key = format!("gone-{mode:?}-{NAME}");
        let send = |url: String, key: String| async move {
            reqwest::Client::new().post(&url).header("idempotency-key", key).body("{}").send().await
        };
        let mut client = tokio::spawn(send(url.clone(), key.clone()));
        tokio::select! {
            _ = started_rx.recv() => {}
            answer = &mut client => panic!("answered without reaching the handler: {answer:?}"),
        }
        client.abort(); // the client hangs up while the handler runs
        assert!(client.await.unwrap_err().is_cancelled());
        held.gate.add_permits(1);
        // The handler finishes anyway; the retry replays its answer once it is stored.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let answer = loop {
            let answer = send(url.clone(), key.clone()).await.expect("request");
            if answer.status() != reqwest::StatusCode::CONFLICT {
                break answer;
            }
            assert!(std::time::Instant::now() < deadline, "still in progress after 30 s");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(answer.status().as_u16(), 201);
        assert_eq!(answer.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"), "the retry replays");
        assert_eq!(held.runs.load(Ordering::SeqCst), 1, "the handler ran once");
        let rows: i64 = admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n");
        assert_eq!(rows, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_hangs_up_is_answered_by_its_retry_in_transaction() {
        disconnected_client(idempotency_tower::Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_that_hangs_up_is_answered_by_its_retry_two_phase() {
        disconnected_client(idempotency_tower::Mode::TwoPhase).await;
    }

    /// actix-web drops a request's future when it gives the request up (a shutdown, an HTTP/2
    /// reset, its client-disconnect timeout); the route still runs to its end. Driven in process
    /// (actix's test service) to drop the future at a known point: while the handler is held.
    async fn dropped_future(mode: idempotency_tower::Mode) {
        use actix_web::dev::Service;
        use actix_web::{test, web, App, HttpResponse};
        use idempotency_actix::{IdempotencyLayer, Transaction};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let idem = handle(Settings::default()).await;
        let user = format!("actix-dropped-{mode:?}");
        admin().await.execute("DELETE FROM charges WHERE user_id = $1", &[&user]).await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (started, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let key = format!("dropped-{mode:?}-{NAME}");
        let (handler_runs, handler_gate, handler_user) = (runs.clone(), gate.clone(), user.clone());
        let handler = move |tx: Option<Transaction<TestDriver>>| {
            let (runs, gate, started, user) = (handler_runs.clone(), handler_gate.clone(), started.clone(), handler_user.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started.send(());
                gate.acquire().await.expect("gate open").forget();
                let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, 1, 'd') RETURNING id";
                match tx {
                    Some(tx) => query_i64_in(&tx, insert, &[&user]).await.expect("insert"),
                    None => admin().await.query_one(insert, &[&user]).await.expect("insert").get(0),
                };
                HttpResponse::Created().body("charged")
            }
        };
        let layer = IdempotencyLayer::builder(idem).mode(mode).anonymous().build().expect("layer");
        let (runs_seen, gate_seen) = (runs.clone(), gate.clone());
        // actix's test service needs an actix system: run it on a thread of its own.
        let outcome = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let app = test::init_service(App::new().service(web::resource("/held").wrap(layer).route(web::post().to(handler)))).await;
                let request = || test::TestRequest::post().uri("/held").insert_header(("idempotency-key", key.clone())).set_payload("{}").to_request();
                {
                    let first = app.call(request());
                    tokio::pin!(first);
                    tokio::select! {
                        _ = started_rx.recv() => {}
                        answer = &mut first => panic!("answered without reaching the handler: {:?}", answer.map(|r| r.status())),
                    }
                } // the request's future is dropped while its handler is held
                gate_seen.add_permits(1);
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                loop {
                    assert!(std::time::Instant::now() < deadline, "the key is still in progress after 30 s");
                    let answer = app.call(request()).await.expect("an answer");
                    if answer.status().as_u16() != 409 {
                        let replayed = answer.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
                        return (answer.status().as_u16(), replayed);
                    }
                    actix_web::rt::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
        })
        .join()
        .expect("the actix thread");
        assert_eq!(outcome, (201, true), "the retry replays the answer of the dropped request's route");
        assert_eq!(runs_seen.load(Ordering::SeqCst), 1, "the handler ran once");
        let rows: i64 = admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n");
        assert_eq!(rows, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_request_still_completes_its_key_in_transaction() {
        dropped_future(idempotency_tower::Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_request_still_completes_its_key_two_phase() {
        dropped_future(idempotency_tower::Mode::TwoPhase).await;
    }
}
