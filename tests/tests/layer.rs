//! `IdempotencyLayer` over real HTTP on loopback, in both modes: every answer, replayed headers,
//! 64 concurrent duplicates (63 answered while the first holds the key), a panicking handler, a
//! client that disconnects mid-request, a body over the limit, and users sharing a key; the
//! request's transaction used as the connection itself (`Connection`) in an axum and an
//! actix-web handler, extracted once (a second extraction is `TransactionRejection::Taken`).

/// A charge tagged `key` written through the request's connection (the `Connection` of
/// idempotency-tower or of idempotency-actix, dereferenced) as each driver's users write it
/// (`tx.execute(..)` over tokio-postgres, `.execute(&mut *tx)` over sqlx); the rows written.
trait WriteThrough {
    fn charge(&mut self, key: &str) -> impl std::future::Future<Output = u64> + Send;
}

impl WriteThrough for deadpool_postgres::Client {
    async fn charge(&mut self, key: &str) -> u64 {
        self.execute("INSERT INTO charges (user_id, amount, k) VALUES ('conn', 1, $1)", &[&key]).await.expect("insert")
    }
}

impl WriteThrough for sqlx::PgConnection {
    async fn charge(&mut self, key: &str) -> u64 {
        let query = sqlx::query("INSERT INTO charges (user_id, amount, k) VALUES ('conn', 1, $1)").bind(key);
        query.execute(&mut *self).await.expect("insert").rows_affected()
    }
}

idempotency_testkit::for_each_driver! {
    use axum::extract::State;
    use axum::http::{HeaderMap, HeaderName, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use idempotency_tower::{problem::types, Builder, IdempotencyLayer, Mode, Transaction};
    use idempotency_client::{Idempotency, Postgres, Settings};

    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::sync::{mpsc, Mutex, Semaphore};

    /// The route's state: how many times it ran, and the levers of the tests.
    struct App {
        pool: deadpool_postgres::Pool,
        runs: AtomicUsize,
        panic_next: AtomicBool,
        /// Requests with `"hold": true` say they started, then wait for a permit.
        started: mpsc::UnboundedSender<()>,
        gate: Semaphore,
    }

    /// A served route and its levers.
    struct Served {
        url: String,
        app: Arc<App>,
        started: Mutex<mpsc::UnboundedReceiver<()>>,
    }

    /// The business handler: counts the run, honours the levers, writes a `charges` row tagged with
    /// the key (through the request's transaction in-transaction, on its own connection two-phase)
    /// and answers `{"id", "amount"}` with the requested status and a few headers.
    async fn charge(db: Db<'_>, app: &App, headers: &HeaderMap, body: &str) -> Response {
        let request: Value = serde_json::from_str(body).unwrap_or(Value::Null);
        app.runs.fetch_add(1, Ordering::SeqCst);
        if request["hold"] == json!(true) {
            let _ = app.started.send(());
            app.gate.acquire().await.expect("gate open").forget();
        }
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let status = request["status"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::CREATED);
        let amount = request["amount"].as_i64().unwrap_or(0);
        let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, $2::text::bigint, $3) RETURNING id";
        let args = [header("x-user"), amount.to_string(), header("idempotency-key")];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let id = match db {
            Db::Request(tx) => query_i64_in(tx, insert, &args).await.expect("insert the charge"),
            Db::Own(client) => {
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = args.iter().map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                client.query_one(insert, &params).await.expect("insert the charge").get(0)
            }
        };
        if app.panic_next.swap(false, Ordering::SeqCst) {
            panic!("the handler failed half-way, after its write");
        }
        let headers = [
            ("location", format!("/charges/{id}")),
            ("set-cookie", "session=secret".to_owned()),
            ("x-charge-id", id.to_string()),
            ("x-debug", "not stored".to_owned()),
        ];
        (status, headers, axum::Json(json!({"id": id, "amount": amount}))).into_response()
    }

    /// Where the handler writes: the request's transaction (in-transaction) or a connection of its
    /// own (two-phase).
    enum Db<'a> {
        Request(&'a Transaction<TestDriver>),
        Own(&'a deadpool_postgres::Client),
    }

    async fn in_transaction(tx: Transaction<TestDriver>, State(app): State<Arc<App>>, headers: HeaderMap, body: String) -> Response {
        charge(Db::Request(&tx), &app, &headers, &body).await
    }

    async fn two_phase(State(app): State<Arc<App>>, headers: HeaderMap, body: String) -> Response {
        let db = app.pool.get().await.expect("a connection");
        charge(Db::Own(&db), &app, &headers, &body).await
    }

    /// Serves `POST /charges` in `mode` behind a layer that reads the user from `X-User`, stores
    /// `X-Charge-Id` too, and takes `configure`'s settings.
    async fn serve(idem: Idem, mode: Mode, configure: impl FnOnce(Builder<TestDriver>) -> Builder<TestDriver>) -> Served {
        let (tx, rx) = mpsc::unbounded_channel();
        let app = Arc::new(App {
            pool: Idempotency::<Postgres>::from_url(test_database().await, 16, Settings::default()).expect("pool").pool().clone(),
            runs: AtomicUsize::new(0),
            panic_next: AtomicBool::new(false),
            started: tx,
            gate: Semaphore::new(0),
        });
        let builder = IdempotencyLayer::builder(idem)
            .mode(mode)
            .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
            .stored_headers([HeaderName::from_static("x-charge-id")]);
        let layer = configure(builder).build().expect("layer");
        let route = match mode {
            Mode::InTransaction => post(in_transaction),
            Mode::TwoPhase => post(two_phase),
        };
        let router = Router::new().route("/charges", route.get(|| async { "listed" })).route_layer(layer).with_state(app.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Served { url, app, started: Mutex::new(rx) }
    }

    /// Waits until the held request's handler started; fails if the request was answered without it.
    async fn started(served: &Served, request: &mut tokio::task::JoinHandle<Answer>) {
        let mut started = served.started.lock().await;
        tokio::select! {
            _ = started.recv() => {}
            answer = request => panic!("answered without reaching the handler: {:?}", answer.map(|a| a.body)),
        }
    }

    /// An answer: status, headers, body.
    #[derive(Debug)]
    struct Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Value,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers.get(name).map(|v| v.to_str().unwrap())
        }

        fn replayed(&self) -> bool {
            self.header("idempotent-replayed") == Some("true")
        }

        /// Asserts a problem answer of this status and type.
        fn problem(&self, status: u16, kind: &str) {
            assert_eq!((self.status.as_u16(), self.body["type"].as_str()), (status, Some(kind)), "{}", self.body);
            assert_eq!(self.header("content-type"), Some("application/problem+json"));
            assert_eq!(self.body["status"], json!(status));
        }
    }

    async fn send(url: &str, key: Option<&str>, user: Option<&str>, body: Value) -> Answer {
        send_text(url, key, user, &body.to_string()).await
    }

    /// [`send`] with the body's exact text.
    async fn send_text(url: &str, key: Option<&str>, user: Option<&str>, body: &str) -> Answer {
        let mut req = reqwest::Client::new().post(url).header("content-type", "application/json").body(body.to_owned());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        if let Some(user) = user {
            req = req.header("x-user", user);
        }
        let resp = req.send().await.expect("request");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let text = resp.text().await.unwrap_or_default();
        Answer { status, headers, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
    }

    async fn rows(user: &str, key: &str) -> i64 {
        admin()
            .await
            .query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1 AND k = $2", &[&user, &key])
            .await
            .unwrap()
            .get("n")
    }

    fn user(test: &str, mode: Mode) -> String {
        format!("{test}-{mode:?}")
    }

    async fn every_answer(mode: Mode) {
        let served = serve(handle(Settings::default()).await, mode, |b| b.body_limit(1024)).await;
        let (url, name) = (served.url.as_str(), user("answers", mode));
        let u = Some(name.as_str());
        let charge = json!({"amount": 100, "currency": "EUR"});

        send(url, None, u, charge.clone()).await.problem(400, types::KEY_MISSING);
        send(url, Some("\"open"), u, charge.clone()).await.problem(400, types::KEY_INVALID);
        send(url, Some(&"k".repeat(300)), u, charge.clone()).await.problem(400, types::KEY_INVALID);
        send(url, Some("k-1"), None, charge.clone()).await.problem(401, types::USER_MISSING);
        let big = json!({"amount": 1, "pad": "x".repeat(2048)});
        send(url, Some("k-big"), u, big).await.problem(413, types::BODY_TOO_LARGE);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 0, "no request so far reached the handler");
        let listed = reqwest::get(url).await.unwrap();
        assert_eq!(listed.text().await.unwrap(), "listed", "GET is not covered: it passes through without a key");

        // First run: every header the handler set; the retry: the stored ones and the replay mark.
        let first = send(url, Some("k-1"), u, charge.clone()).await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(!first.replayed());
        assert_eq!(first.header("set-cookie"), Some("session=secret"));
        assert_eq!(first.header("x-debug"), Some("not stored"));
        let again = send(url, Some("\"k-1\""), u, charge.clone()).await;
        assert_eq!((again.status, again.replayed()), (StatusCode::CREATED, true));
        assert_eq!(again.body, first.body);
        for stored in ["location", "content-type", "x-charge-id"] {
            assert_eq!(again.header(stored), first.header(stored), "{stored} is replayed");
        }
        for unstored in ["set-cookie", "x-debug"] {
            assert_eq!(again.header(unstored), None, "{unstored} is never replayed");
        }
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 1);
        assert_eq!(rows(&name, "k-1").await, 1);

        // Same key, another request; the same body in another key order and spacing (sent as text,
        // so the order really differs on the wire) is the same request.
        send(url, Some("k-1"), u, json!({"amount": 999, "currency": "EUR"})).await.problem(422, types::MISMATCH);
        let reordered = send_text(url, Some("k-1"), u, r#"{ "currency": "EUR", "amount": 100.0 }"#).await;
        assert!(reordered.replayed(), "{}", reordered.body);
        let first_order = send_text(url, Some("k-1"), u, r#"{"amount":100,"currency":"EUR"}"#).await;
        assert!(first_order.replayed(), "{}", first_order.body);

        // A 4xx is a stored failure, replayed as such.
        let declined = send(url, Some("k-4xx"), u, json!({"amount": 5, "status": 402})).await;
        assert_eq!((declined.status.as_u16(), declined.replayed()), (402, false));
        let replay = send(url, Some("k-4xx"), u, json!({"amount": 5, "status": 402})).await;
        assert_eq!((replay.status.as_u16(), replay.replayed(), &replay.body), (402, true, &declined.body));

        // A 5xx releases the key: the retry runs again.
        let runs = served.app.runs.load(Ordering::SeqCst);
        let failed = send(url, Some("k-5xx"), u, json!({"amount": 5, "status": 503})).await;
        assert_eq!((failed.status.as_u16(), failed.replayed()), (503, false));
        let retried = send(url, Some("k-5xx"), u, json!({"amount": 5, "status": 503})).await;
        assert_eq!((retried.status.as_u16(), retried.replayed()), (503, false));
        assert_eq!(served.app.runs.load(Ordering::SeqCst), runs + 2, "a released key runs again");
        // In-transaction, the released attempts' rows rolled back; two-phase, they are the handler's.
        let expected = if mode == Mode::InTransaction { 0 } else { 2 };
        assert_eq!(rows(&name, "k-5xx").await, expected);

        // A duplicate while the first holds the key: 409 with Retry-After.
        let mut holder = {
            let url = url.to_owned();
            let u = u.map(str::to_owned);
            tokio::spawn(async move { send(&url, Some("k-held"), u.as_deref(), json!({"amount": 1, "hold": true})).await })
        };
        started(&served, &mut holder).await;
        let busy = send(url, Some("k-held"), u, json!({"amount": 1, "hold": true})).await;
        busy.problem(409, types::IN_PROGRESS);
        assert_eq!(busy.header("retry-after"), Some("1"));
        served.app.gate.add_permits(1);
        assert_eq!(holder.await.unwrap().status, StatusCode::CREATED);

        // Another user with the same key runs separately.
        let other = user("answers-other", mode);
        let theirs = send(url, Some("k-1"), Some(&other), charge.clone()).await;
        assert_eq!((theirs.status, theirs.replayed()), (StatusCode::CREATED, false));
        assert_ne!(theirs.body["id"], first.body["id"]);
        assert_eq!((rows(&name, "k-1").await, rows(&other, "k-1").await), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_answer_in_transaction() {
        every_answer(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn every_answer_two_phase() {
        every_answer(Mode::TwoPhase).await;
    }

    async fn answers_with_the_store_down(mode: Mode) {
        let idem = store_down(2);
        let served = serve(idem, mode, |b| b).await;
        let down = send(&served.url, Some("k"), Some("u"), json!({"amount": 1})).await;
        down.problem(503, types::STORE_UNAVAILABLE);
        assert!(down.header("retry-after").is_some());
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn store_down_answers_503_in_both_modes() {
        answers_with_the_store_down(Mode::InTransaction).await;
        answers_with_the_store_down(Mode::TwoPhase).await;
    }

    /// 64 concurrent duplicates, started together: the one that reaches the handler holds the key
    /// (its handler waits for the gate) until the 63 others have been answered, so they overlap it by
    /// construction: requests served one after another would never answer the 63 (the deadline
    /// fails the test), and each must be in progress, never a second run or a replay.
    async fn duplicates(mode: Mode) {
        let served = Arc::new(serve(handle(Settings::default()).await, mode, |b| b).await);
        let u = user("dup64", mode);
        let start = Arc::new(tokio::sync::Barrier::new(64));
        let (done, mut answers) = mpsc::unbounded_channel();
        for _ in 0..64 {
            let (served, u, start, done) = (served.clone(), u.clone(), start.clone(), done.clone());
            tokio::spawn(async move {
                start.wait().await;
                let _ = done.send(send(&served.url, Some("k-64"), Some(&u), json!({"amount": 64, "hold": true})).await);
            });
        }
        drop(done);
        let deadline = std::time::Duration::from_secs(60);
        for n in 0..63 {
            let answer = tokio::time::timeout(deadline, answers.recv())
                .await
                .unwrap_or_else(|_| panic!("{n} of 63 duplicates answered while the key was held"))
                .expect("an answer");
            answer.problem(409, types::IN_PROGRESS);
        }
        // The holder's handler starts after its reservation is visible (two-phase: committed
        // first), so the 63 may all have been answered before it counts its run: awaited.
        let runs = &served.app.runs;
        idempotency_testkit::server::eventually("the holder's handler runs", deadline, || async {
            if runs.load(Ordering::SeqCst) > 0 { Ok(()) } else { Err("not yet".to_owned()) }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "one handler holds the key; no duplicate reached it");
        served.app.gate.add_permits(1);
        let holder = tokio::time::timeout(deadline, answers.recv()).await.expect("the holder finishes").expect("an answer");
        assert_eq!((holder.status, holder.replayed()), (StatusCode::CREATED, false), "{}", holder.body);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 1, "the handler ran once");
        assert_eq!(rows(&u, "k-64").await, 1, "one business row");
        // (A retry that reached the handler would wait for the gate: the deadline would say so.)
        let retry = tokio::time::timeout(deadline, send(&served.url, Some("k-64"), Some(&u), json!({"amount": 64, "hold": true})))
            .await
            .expect("the retry is answered without the handler");
        assert!(retry.replayed(), "{}", retry.body);
        assert_eq!(retry.body, holder.body);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sixty_four_duplicates_run_once_in_transaction() {
        duplicates(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sixty_four_duplicates_run_once_two_phase() {
        duplicates(Mode::TwoPhase).await;
    }

    async fn panicking_handler(mode: Mode) {
        let served = serve(handle(Settings::default()).await, mode, |b| b).await;
        let u = user("panic", mode);
        served.app.panic_next.store(true, Ordering::SeqCst);
        let crashed = send(&served.url, Some("k-p"), Some(&u), json!({"amount": 3})).await;
        crashed.problem(500, types::HANDLER_FAILED);
        // The key was released, not left stuck: the retry runs the handler and succeeds.
        let retried = send(&served.url, Some("k-p"), Some(&u), json!({"amount": 3})).await;
        assert_eq!((retried.status, retried.replayed()), (StatusCode::CREATED, false), "{}", retried.body);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 2);
        match mode {
            // The panic came after the write: the write rolled back with the attempt.
            Mode::InTransaction => assert_eq!(rows(&u, "k-p").await, 1, "the panicking attempt's write was undone"),
            // Two-phase writes leave the database on their own connection: both runs' rows stay.
            Mode::TwoPhase => assert_eq!(rows(&u, "k-p").await, 2, "two-phase effects are outside the key's transaction"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn panicking_handler_releases_the_key_in_transaction() {
        panicking_handler(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn panicking_handler_releases_the_key_two_phase() {
        panicking_handler(Mode::TwoPhase).await;
    }

    async fn disconnected_client(mode: Mode) {
        let served = Arc::new(serve(handle(Settings::default()).await, mode, |b| b).await);
        let u = user("gone", mode);
        let request = json!({"amount": 9, "hold": true});
        let mut client = {
            let (served, u, request) = (served.clone(), u.clone(), request.clone());
            tokio::spawn(async move { send(&served.url, Some("k-gone"), Some(&u), request).await })
        };
        started(&served, &mut client).await;
        client.abort(); // the client hangs up while the handler runs
        assert!(client.await.unwrap_err().is_cancelled());
        served.app.gate.add_permits(1);
        // The handler finishes anyway; the retry replays its response once it is stored.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let answer = loop {
            let answer = send(&served.url, Some("k-gone"), Some(&u), request.clone()).await;
            if answer.status != StatusCode::CONFLICT {
                break answer;
            }
            assert!(std::time::Instant::now() < deadline, "still in progress after 30 s: {} {}", answer.status, answer.body);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!((answer.status, answer.replayed()), (StatusCode::CREATED, true), "{}", answer.body);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 1);
        assert_eq!(rows(&u, "k-gone").await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn disconnected_client_is_answered_by_the_retry_in_transaction() {
        disconnected_client(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn disconnected_client_is_answered_by_the_retry_two_phase() {
        disconnected_client(Mode::TwoPhase).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_waiting_duplicate_replays_the_holders_response() {
        let served = serve(handle(Settings::default()).await, Mode::InTransaction, |b| b.wait(true)).await;
        let u = user("wait", Mode::InTransaction);
        let request = json!({"amount": 2, "hold": true});
        let send_one = || {
            let (url, u, request) = (served.url.clone(), u.clone(), request.clone());
            tokio::spawn(async move { send(&url, Some("k-wait"), Some(&u), request).await })
        };
        let mut holder = send_one();
        started(&served, &mut holder).await;
        let duplicate = send_one();
        // The duplicate blocks on the holder's uncommitted reservation before the holder goes on.
        let blocked = "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while admin().await.query_one(blocked, &[]).await.unwrap().get::<_, i64>("n") == 0 {
            assert!(std::time::Instant::now() < deadline, "no session waited on a lock within 30 s");
            tokio::task::yield_now().await;
        }
        served.app.gate.add_permits(1);
        let (first, second) = (holder.await.unwrap(), duplicate.await.unwrap());
        assert_eq!((first.status, first.replayed()), (StatusCode::CREATED, false));
        assert_eq!((second.status, second.replayed()), (StatusCode::CREATED, true), "{}", second.body);
        assert_eq!(second.body, first.body);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_missing_key_passes_through_when_configured() {
        // Two-phase: the handler runs on every request without a key, with no idempotency.
        let served = serve(handle(Settings::default()).await, Mode::TwoPhase, |b| b.require_key(false)).await;
        let u = user("optional", Mode::TwoPhase);
        for _ in 0..2 {
            let answer = send(&served.url, None, Some(&u), json!({"amount": 1})).await;
            assert_eq!((answer.status, answer.replayed()), (StatusCode::CREATED, false));
        }
        assert_eq!((served.app.runs.load(Ordering::SeqCst), rows(&u, "").await), (2, 2));

        // In-transaction: a handler that needs the transaction gets a 500 problem without a key.
        let served = serve(handle(Settings::default()).await, Mode::InTransaction, |b| b.require_key(false)).await;
        let u = user("optional", Mode::InTransaction);
        send(&served.url, None, Some(&u), json!({"amount": 1})).await.problem(500, types::NO_TRANSACTION);
        assert_eq!(served.app.runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn unsafe_configurations_are_refused() {
        let idem = connect_with("postgresql://u@127.0.0.1:1/db", 1, Settings::default());
        let err = IdempotencyLayer::builder(idem.clone()).build().unwrap_err().to_string();
        assert!(err.contains(".user(") && err.contains(".anonymous()"), "{err}");
        let err = IdempotencyLayer::builder(idem.clone())
            .anonymous()
            .stored_headers([HeaderName::from_static("set-cookie")])
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("stored_headers: set-cookie"), "{err}");
        let err = IdempotencyLayer::builder(idem).anonymous().body_limit(0).build().unwrap_err().to_string();
        assert!(err.contains("body_limit"), "{err}");
    }

    // ---- the transaction used as the connection (issue 41) ------------------------------------

    use super::WriteThrough;
    use idempotency_tower::{Connection, TransactionRejection};

    /// The rows `'conn'` charges tagged `key`.
    async fn conn_rows(key: &str) -> i64 {
        admin().await.query_one("SELECT count(*) FROM charges WHERE user_id = 'conn' AND k = $1", &[&key]).await.unwrap().get(0)
    }

    /// A `POST /c` through an anonymous in-transaction layer on `router`'s route, by `oneshot`:
    /// the status, whether it was replayed, and the body.
    async fn post_once(router: Router, key: &str) -> (StatusCode, bool, Value) {
        use tower::ServiceExt;
        let request = axum::http::Request::post("/c").header("idempotency-key", key).body(axum::body::Body::from(key.to_owned())).unwrap();
        let response = router.oneshot(request).await.unwrap();
        let replayed = response.headers().get("idempotent-replayed").is_some();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, replayed, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The handler's connection is the request's transaction: its write commits with the stored
    /// answer (once, the retry replays), and rolls back with a failed answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_connection_is_the_transaction_in_an_axum_handler() {
        let layer = IdempotencyLayer::in_transaction(handle(Settings::default()).await).anonymous().build().expect("layer");
        let handler = post(|mut tx: Connection<TestDriver>, body: String| async move {
            let written = tx.charge(&body).await;
            let status = if body.ends_with("-fails") { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::CREATED };
            (status, axum::Json(json!({ "written": written }))).into_response()
        });
        let router = Router::new().route("/c", handler).route_layer(layer);
        let key = format!("conn-axum-{NAME}");
        assert_eq!(post_once(router.clone(), &key).await, (StatusCode::CREATED, false, json!({ "written": 1 })));
        assert_eq!(post_once(router.clone(), &key).await, (StatusCode::CREATED, true, json!({ "written": 1 })));
        assert_eq!(conn_rows(&key).await, 1, "the write committed with the answer, once");
        let failing = format!("conn-axum-{NAME}-fails");
        assert_eq!(post_once(router, &failing).await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(conn_rows(&failing).await, 0, "the write rolled back with the failed answer");
    }

    /// The connection is extracted once: a second `Connection`, or a `Transaction` after it, is
    /// `TransactionRejection::Taken` (answered as the no-transaction problem); without the layer
    /// it is `Missing`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_extraction_is_the_typed_rejection() {
        type Second = Result<Connection<TestDriver>, TransactionRejection>;
        type Shared = Result<Transaction<TestDriver>, TransactionRejection>;
        let layer = IdempotencyLayer::in_transaction(handle(Settings::default()).await).anonymous().build().expect("layer");
        let handler = post(|mut tx: Connection<TestDriver>, second: Second, shared: Shared, body: String| async move {
            let rejections = (second.err(), shared.err());
            assert_eq!(rejections, (Some(TransactionRejection::Taken), Some(TransactionRejection::Taken)));
            tx.charge(&body).await;
            StatusCode::CREATED.into_response()
        });
        let router = Router::new().route("/c", handler).route_layer(layer);
        let key = format!("conn-twice-{NAME}");
        assert_eq!(post_once(router, &key).await.0, StatusCode::CREATED, "the handler saw both rejections");
        assert_eq!(conn_rows(&key).await, 1);

        // As the extractor's rejection: the no-transaction problem, whose detail says why.
        let layer = IdempotencyLayer::in_transaction(handle(Settings::default()).await).anonymous().build().expect("layer");
        let twice = post(|_: Connection<TestDriver>, _: Connection<TestDriver>| async { StatusCode::CREATED });
        let (status, _, problem) = post_once(Router::new().route("/c", twice).route_layer(layer), &format!("conn-twice-{NAME}-2")).await;
        assert_eq!((status, &problem["type"]), (StatusCode::INTERNAL_SERVER_ERROR, &json!(types::NO_TRANSACTION)));
        assert_eq!(problem["detail"], TransactionRejection::Taken.to_string());

        // Without the layer.
        let bare = post(|missing: Second| async move { format!("{:?}", missing.err()) });
        let request = axum::http::Request::post("/c").body(axum::body::Body::empty()).unwrap();
        let response = tower::ServiceExt::oneshot(Router::new().route("/c", bare), request).await.unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 10).await.unwrap();
        assert_eq!(&bytes[..], b"Some(Missing)");
    }

    /// The same in an actix-web handler: its write commits with the stored answer, once, and a
    /// second extraction is the typed rejection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_connection_is_the_transaction_in_an_actix_handler() {
        let idem = handle(Settings::default()).await;
        let key = format!("conn-actix-{NAME}");
        let k = key.clone();
        let answers = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                use actix_web::{test, web, App, HttpResponse};
                use idempotency_actix::{Connection, IdempotencyLayer, TransactionRejection};
                let layer = IdempotencyLayer::in_transaction(idem).anonymous().build().expect("layer");
                let handler = |mut tx: Connection<TestDriver>, second: Result<Connection<TestDriver>, TransactionRejection>, body: String| async move {
                    let written = tx.charge(&body).await;
                    HttpResponse::Created().json(json!({ "written": written, "second": format!("{:?}", second.err()) }))
                };
                let app = test::init_service(App::new().service(web::resource("/c").wrap(layer).route(web::post().to(handler)))).await;
                let mut answers = Vec::new();
                for _ in 0..2 {
                    let request = test::TestRequest::post().uri("/c").insert_header(("idempotency-key", k.as_str())).set_payload(k.clone()).to_request();
                    let response = test::call_service(&app, request).await;
                    let replayed = response.headers().contains_key("idempotent-replayed");
                    let status = response.status().as_u16();
                    let body: Value = serde_json::from_slice(&test::read_body(response).await).unwrap();
                    answers.push((status, replayed, body));
                }
                answers
            })
        })
        .join()
        .expect("the actix-web system");
        let first = json!({ "written": 1, "second": "Some(Taken)" });
        assert_eq!(answers, vec![(201, false, first.clone()), (201, true, first)]);
        assert_eq!(conn_rows(&key).await, 1, "the write committed with the answer, once");
    }
}
