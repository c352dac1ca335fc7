//! The wait for a key's holder (issue 44; `Settings::wait` / `wait_timeout`, the layer's
//! `wait`): 50 duplicates of a two-phase holder whose outside call takes 2 s wait for it and
//! replay its answer, through the handle (both flows) and through the layer on every stack
//! (axum, actix-web, tonic): one outside call, no 409 before the bound, on a pool far smaller
//! than the waiters (a waiter holds no connection between its polls). A holder that dies leaves
//! its waiters `InProgress` (409 + `Retry-After`) at the bound, not before, and its key is
//! recovered as before; a mismatch is answered at once; a waiter dropped mid-wait leaves nothing.

idempotency_testkit::for_each_driver! {
    use idempotency_tower::{self as layer, IdempotencyLayer, Mode};
    use idempotency_client::{Error, Fingerprint, Key, Outcome, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::unique_key;
    use serde_json::json;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The holder's outside call.
    const OUTSIDE: Duration = Duration::from_secs(2);
    /// A bound the holders of the waiting tests never reach.
    const FAR: Duration = Duration::from_secs(20);
    /// The duplicates of each waiting test.
    const DUPLICATES: usize = 50;

    /// Settings that wait up to `bound`, on a pool whose wait for a connection is 1 s: a waiter
    /// that held its connection while waiting would starve the others of the pool.
    fn waiting(bound: Duration) -> Settings {
        Settings::builder().wait(true).wait_timeout(bound).pool_timeout(Duration::from_secs(1)).build()
    }

    /// A handle of the driver under test on a fresh database `name`, with a pool of 3
    /// connections for 50 waiters; and the database's URL.
    async fn small_pool(name: &str, bound: Duration) -> (Idem, String) {
        let url = idempotency_testkit::fresh_database(&db(name)).await;
        (connect_with(&url, 3, waiting(bound)), url)
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_json(&json!({"amount": 100})).unwrap()
    }

    /// The two-phase flow's local write: nothing.
    fn nothing() -> impl for<'t> FnMut(&'t mut Conn, &'t StoredResponse) -> TxFuture<'t, (), DbError> + Send {
        |_, _| Box::pin(async { Ok(()) })
    }

    /// An outside call: counts itself in `calls`, takes `took`, answers 201 `{"by": by}`.
    fn outside(calls: &Arc<AtomicUsize>, took: Duration, by: &'static str) -> impl Future<Output = Result<StoredResponse, DbError>> + Send + 'static {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(took).await;
            Ok(StoredResponse::json(201, json!({"by": by})))
        }
    }

    /// A two-phase holder of `key` on `idem` whose outside call takes `took`, spawned; returns
    /// once its reservation is committed (its outside call has started).
    async fn two_phase_holder(idem: &Idem, key: &Key, calls: &Arc<AtomicUsize>, took: Duration) -> tokio::task::JoinHandle<Result<Outcome<StoredResponse>, Error<DbError>>> {
        let (started, reserved) = tokio::sync::oneshot::channel();
        let call = {
            let calls = calls.clone();
            async move {
                let _ = started.send(());
                outside(&calls, took, "holder").await
            }
        };
        let (idem, key) = (idem.clone(), key.clone());
        let holder = tokio::spawn(async move { Box::pin(idem.run_external(&key, &fp(), call, nothing())).await });
        reserved.await.expect("the holder reserved the key and called out");
        holder
    }

    /// Whether `answer` is the holder's answer, replayed.
    fn holders_replay(answer: &Result<Outcome<StoredResponse>, Error<DbError>>) -> bool {
        matches!(answer, Ok(Outcome::Replayed(r)) if r.status == 201 && r.body_json().unwrap_or_default()["by"] == "holder")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_two_phase_duplicates_wait_for_the_holder_and_replay_its_answer() {
        let (idem, _) = small_pool("idem_wait_two_phase", FAR).await;
        let key = unique_key("wait.two_phase");
        let calls = Arc::new(AtomicUsize::new(0));
        let holder = two_phase_holder(&idem, &key, &calls, OUTSIDE).await;
        let duplicates: Vec<_> = (0..DUPLICATES)
            .map(|_| {
                let (idem, key, calls) = (idem.clone(), key.clone(), calls.clone());
                tokio::spawn(async move { Box::pin(idem.run_external(&key, &fp(), outside(&calls, Duration::ZERO, "duplicate"), nothing())).await })
            })
            .collect();
        for (i, duplicate) in duplicates.into_iter().enumerate() {
            let answer = duplicate.await.expect("task");
            assert!(holders_replay(&answer), "{NAME}: duplicate {i}: {answer:?}");
        }
        assert!(matches!(holder.await.expect("task"), Ok(Outcome::Executed(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{NAME}: one outside call");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_in_transaction_duplicates_wait_for_a_two_phase_holder_and_replay_its_answer() {
        let (idem, _) = small_pool("idem_wait_in_tx", FAR).await;
        let key = unique_key("wait.in_tx");
        let calls = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let holder = two_phase_holder(&idem, &key, &calls, OUTSIDE).await;
        let duplicates: Vec<_> = (0..DUPLICATES)
            .map(|_| {
                let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
                tokio::spawn(async move {
                    Box::pin(idem.run(&key, &fp(), move |_tx: &mut Conn| {
                        let runs = runs.clone();
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, DbError>(StoredResponse::json(201, json!({"by": "duplicate"})))
                        }) as TxFuture<'_, _, _>
                    }))
                    .await
                })
            })
            .collect();
        for (i, duplicate) in duplicates.into_iter().enumerate() {
            let answer = duplicate.await.expect("task");
            assert!(holders_replay(&answer), "{NAME}: duplicate {i}: {answer:?}");
        }
        assert!(matches!(holder.await.expect("task"), Ok(Outcome::Executed(_))));
        assert_eq!((calls.load(Ordering::SeqCst), runs.load(Ordering::SeqCst)), (1, 0), "{NAME}: one outside call, no local run");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_of_a_dead_holder_answer_in_progress_at_the_bound_and_its_key_is_recovered() {
        // The holder reserved the key for its outside call (committed, lease 60 s) and died: it
        // never completes and never beats. Its waiters answer InProgress at their bound (1 s),
        // not before; then recovery settles the key as before and a retry is told Failed.
        let bound = Duration::from_secs(1);
        let (idem, url) = small_pool("idem_wait_dead", bound).await;
        let operator = idempotency_testkit::admin_at(&url).await;
        let key = unique_key("wait.dead");
        let reserve = "SELECT outcome FROM idem_reserve($1, $2, $3, $4, lease => '60 s')";
        let outcome: String = operator.query_one(reserve, &[&key.operation(), &key.user_id(), &key.key(), &fp().as_str()]).await.unwrap().get(0);
        assert_eq!(outcome, "created");
        let calls = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..10)
            .map(|_| {
                let (idem, key, calls) = (idem.clone(), key.clone(), calls.clone());
                tokio::spawn(async move {
                    let began = Instant::now();
                    let answer = Box::pin(idem.run_external(&key, &fp(), outside(&calls, Duration::ZERO, "waiter"), nothing())).await;
                    (answer, began.elapsed())
                })
            })
            .collect();
        for waiter in waiters {
            let (answer, waited) = waiter.await.expect("task");
            let Err(error) = answer else { panic!("{NAME}: {answer:?}") };
            assert!(matches!(error, Error::InProgress { .. }), "{NAME}: {error:?}");
            assert_eq!(layer::http_status(&error), 409);
            assert!(layer::retry_after(&error, Duration::from_secs(5)).is_some(), "{NAME}: 409 with Retry-After");
            assert!(waited >= bound, "{NAME}: answered after {waited:?}, before the bound {bound:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        // Recovered as before: once the lease has ended, idem_recover_stuck fails the key.
        let ended = "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE operation = $1 AND user_id = $2 AND key = $3";
        assert_eq!(operator.execute(ended, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap(), 1);
        let recovered: i64 = operator.query_one("SELECT idem_recover_stuck()", &[]).await.unwrap().get(0);
        assert_eq!(recovered, 1);
        let retry = Box::pin(idem.run_external(&key, &fp(), outside(&calls, Duration::ZERO, "retry"), nothing())).await;
        assert!(matches!(retry, Err(Error::Failed { .. })), "{NAME}: {retry:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{NAME}: never called out");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mismatch_is_answered_at_once_while_the_holder_runs() {
        let (idem, _) = small_pool("idem_wait_mismatch", FAR).await;
        let key = unique_key("wait.mismatch");
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (started, reserved) = tokio::sync::oneshot::channel();
        let holder = {
            let (idem, key, gate) = (idem.clone(), key.clone(), gate.clone());
            let call = async move {
                let _ = started.send(());
                gate.acquire().await.expect("gate").forget();
                Ok::<_, DbError>(StoredResponse::json(201, json!({"by": "holder"})))
            };
            tokio::spawn(async move { Box::pin(idem.run_external(&key, &fp(), call, nothing())).await })
        };
        reserved.await.unwrap();
        let other = Fingerprint::of_json(&json!({"amount": 999})).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        // The holder is held by the gate, which opens only after this answer.
        let answer = Box::pin(idem.run_external(&key, &other, outside(&calls, Duration::ZERO, "other"), nothing())).await;
        assert!(matches!(answer, Err(Error::Mismatch)), "{NAME}: {answer:?}");
        assert_eq!(layer::http_status(&answer.unwrap_err()), 422);
        gate.add_permits(1);
        assert!(matches!(holder.await.expect("task"), Ok(Outcome::Executed(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_dropped_mid_wait_leaves_nothing() {
        let (idem, url) = small_pool("idem_wait_dropped", FAR).await;
        let operator = idempotency_testkit::admin_at(&url).await;
        let key = unique_key("wait.dropped");
        let calls = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (started, reserved) = tokio::sync::oneshot::channel();
        let holder = {
            let (idem, key, gate) = (idem.clone(), key.clone(), gate.clone());
            let call = async move {
                let _ = started.send(());
                gate.acquire().await.expect("gate").forget();
                Ok::<_, DbError>(StoredResponse::json(201, json!({"by": "holder"})))
            };
            tokio::spawn(async move { Box::pin(idem.run_external(&key, &fp(), call, nothing())).await })
        };
        reserved.await.unwrap();
        let token = "SELECT token, _idem_status_word(status) FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
        let before = operator.query_one(token, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap();
        // Both flows' waiters, dropped while they wait (each has polled: 300 ms is past its
        // first pauses).
        let two_phase = tokio::time::timeout(Duration::from_millis(300), Box::pin(idem.run_external(&key, &fp(), outside(&calls, Duration::ZERO, "dropped"), nothing()))).await;
        assert!(two_phase.is_err(), "{NAME}: still waiting: {two_phase:?}");
        let in_tx = tokio::time::timeout(
            Duration::from_millis(300),
            Box::pin(idem.run(&key, &fp(), |_tx: &mut Conn| Box::pin(async { Ok::<_, DbError>(StoredResponse::json(201, json!({}))) }) as TxFuture<'_, _, _>)),
        )
        .await;
        assert!(in_tx.is_err(), "{NAME}: still waiting: {in_tx:?}");
        // Nothing left: the pool has every connection back, none in a transaction; the holder's
        // record is as it was, and it completes.
        settled(&idem).await;
        assert!(!pooled_in_transaction(&idem).await, "{NAME}");
        let after = operator.query_one(token, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap();
        assert_eq!((before.get::<_, i64>(0), before.get::<_, String>(1)), (after.get::<_, i64>(0), after.get::<_, String>(1)));
        gate.add_permits(1);
        assert!(matches!(holder.await.expect("task"), Ok(Outcome::Executed(_))));
        let retry = Box::pin(idem.run_external(&key, &fp(), outside(&calls, Duration::ZERO, "retry"), nothing())).await;
        assert!(holders_replay(&retry), "{NAME}: {retry:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    // ---------------------------------------------------------------------------------------------
    // The layer: the stored response once the holder finishes, on every stack.

    /// 1 + [`DUPLICATES`] POSTs of one key and body to `url`, the first sent alone and the
    /// others once its handler has started (`started`); every answer's status, replay header and
    /// body.
    async fn storm(url: &str, key: &str, body: &str, started: impl Future<Output = ()>) -> (reqwest::Response, Vec<reqwest::Response>) {
        let client = reqwest::Client::new();
        let post = {
            let (client, url, key, body) = (client.clone(), url.to_owned(), key.to_owned(), body.to_owned());
            move || {
                let request = client.post(&url).header("idempotency-key", &key).header("content-type", "application/json").body(body.clone());
                tokio::spawn(async move { request.send().await.expect("answered") })
            }
        };
        let first = post();
        started.await;
        let duplicates: Vec<_> = (0..DUPLICATES).map(|_| post()).collect();
        let mut answers = Vec::new();
        for duplicate in duplicates {
            answers.push(duplicate.await.expect("task"));
        }
        (first.await.expect("task"), answers)
    }

    /// Asserts the first answer ran the handler and every duplicate replays it.
    async fn all_replayed(stack: &str, first: reqwest::Response, duplicates: Vec<reqwest::Response>) {
        assert_eq!(first.status().as_u16(), 201, "{stack} {NAME}");
        assert!(first.headers().get("idempotent-replayed").is_none());
        let body = first.text().await.unwrap();
        for (i, duplicate) in duplicates.into_iter().enumerate() {
            assert_eq!(duplicate.status().as_u16(), 201, "{stack} {NAME}: duplicate {i}");
            assert_eq!(duplicate.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned()), Some("true".into()), "{stack} {NAME}: duplicate {i}");
            assert_eq!(duplicate.text().await.unwrap(), body, "{stack} {NAME}: duplicate {i}");
        }
    }

    /// An axum route behind a two-phase layer with `configure`'s settings: its handler reports
    /// it started, then takes [`OUTSIDE`] (or waits for `gate`), counting its runs.
    async fn axum_route(idem: Idem, configure: impl FnOnce(layer::Builder<TestDriver>) -> layer::Builder<TestDriver>, runs: Arc<AtomicUsize>, gate: Option<Arc<tokio::sync::Semaphore>>) -> (String, tokio::sync::mpsc::UnboundedReceiver<()>) {
        use axum::routing::post;
        let (started, starts) = tokio::sync::mpsc::unbounded_channel();
        let layer = configure(IdempotencyLayer::builder(idem).mode(Mode::TwoPhase).anonymous()).build().expect("layer");
        let handler = move || {
            let (runs, started, gate) = (runs.clone(), started.clone(), gate.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started.send(());
                match gate {
                    Some(gate) => gate.acquire().await.expect("gate").forget(),
                    None => tokio::time::sleep(OUTSIDE).await,
                }
                (axum::http::StatusCode::CREATED, axum::Json(json!({"paid": true})))
            }
        };
        let router = axum::Router::new().route("/pay", post(handler)).route_layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/pay", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        (url, starts)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn axum_answers_fifty_waiting_duplicates_the_stored_response() {
        let (idem, _) = small_pool("idem_wait_axum", FAR).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let (url, mut starts) = axum_route(idem, |b| b, runs.clone(), None).await;
        let (first, duplicates) = storm(&url, "axum-1", "{}", async { starts.recv().await.expect("started") }).await;
        all_replayed("axum", first, duplicates).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn axum_answers_409_with_retry_after_at_the_bound_and_422_at_once() {
        let (idem, _) = small_pool("idem_wait_axum_bound", FAR).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let bound = Duration::from_secs(1);
        let (url, mut starts) = axum_route(idem, |b| b.wait_timeout(bound).retry_after(Duration::from_secs(3)), runs.clone(), Some(gate.clone())).await;
        let client = reqwest::Client::new();
        let post = |body: &'static str| client.post(&url).header("idempotency-key", "axum-2").header("content-type", "application/json").body(body).send();
        let first = tokio::spawn(post("{}"));
        starts.recv().await.expect("started");
        let began = Instant::now();
        let busy = post("{}").await.unwrap();
        let waited = began.elapsed();
        assert_eq!(busy.status().as_u16(), 409, "{NAME}");
        assert_eq!(busy.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned()), Some("3".into()));
        assert!(waited >= bound, "{NAME}: 409 after {waited:?}, before the bound");
        // The holder is still held by the gate: the mismatch did not wait for it.
        let mismatch = post(r#"{"other": 1}"#).await.unwrap();
        assert_eq!(mismatch.status().as_u16(), 422, "{NAME}");
        gate.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap().status().as_u16(), 201);
        let replay = post("{}").await.unwrap();
        assert_eq!(replay.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned()), Some("true".into()));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn actix_answers_fifty_waiting_duplicates_the_stored_response() {
        use actix_web::{web, App, HttpResponse, HttpServer};
        let (idem, _) = small_pool("idem_wait_actix", FAR).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel::<()>();
        let layer = idempotency_actix::IdempotencyLayer::builder(idem).mode(Mode::TwoPhase).anonymous().build().expect("layer");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/pay", listener.local_addr().unwrap());
        let server_runs = runs.clone();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                HttpServer::new(move || {
                    let (runs, started) = (server_runs.clone(), started.clone());
                    let handler = move || {
                        let (runs, started) = (runs.clone(), started.clone());
                        async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            let _ = started.send(());
                            actix_web::rt::time::sleep(OUTSIDE).await;
                            HttpResponse::Created().json(json!({"paid": true}))
                        }
                    };
                    App::new().service(web::resource("/pay").wrap(layer.clone()).route(web::post().to(handler)))
                })
                .listen(listener)
                .expect("listen")
                .workers(2)
                .run()
                .await
            })
        });
        let (first, duplicates) = storm(&url, "actix-1", "{}", async { starts.recv().await.expect("started") }).await;
        all_replayed("actix-web", first, duplicates).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tonic_answers_fifty_waiting_duplicates_the_stored_response() {
        use idempotency_examples::grpc_charges::proto::charges_client::ChargesClient;
        use idempotency_examples::grpc_charges::proto::CreateCharge;
        use idempotency_examples::grpc_charges::{serve, Hold, KeyFrom, SCHEMA};
        let (idem, url) = small_pool("idem_wait_tonic", FAR).await;
        idempotency_testkit::admin_at(&url).await.batch_execute(SCHEMA).await.unwrap();
        let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
        let hold = Arc::new(Hold { started, gate: tokio::sync::Semaphore::new(0) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve(idem, Mode::TwoPhase, KeyFrom::Metadata, Some(hold.clone()), listener));
        let create = |addr: String| async move {
            let mut client = ChargesClient::connect(addr).await.expect("connect");
            let mut request = tonic::Request::new(CreateCharge { amount: 7, hold: true, ..Default::default() });
            request.metadata_mut().insert("idempotency-key", "tonic-1".parse().unwrap());
            request.metadata_mut().insert("x-user", format!("wait-{NAME}").parse().unwrap());
            client.create(request).await
        };
        let first = tokio::spawn(create(addr.clone()));
        starts.recv().await.expect("started");
        let duplicates: Vec<_> = (0..DUPLICATES).map(|_| tokio::spawn(create(addr.clone()))).collect();
        // The holder's call takes OUTSIDE from here, while the duplicates wait.
        tokio::time::sleep(OUTSIDE).await;
        hold.gate.add_permits(1);
        let first = first.await.unwrap().expect("the holder's answer");
        assert!(first.metadata().get("idempotent-replayed").is_none());
        for (i, duplicate) in duplicates.into_iter().enumerate() {
            let answer = duplicate.await.unwrap().unwrap_or_else(|status| panic!("{NAME}: duplicate {i}: {status:?}"));
            assert_eq!(answer.metadata().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned()), Some("true".into()), "{NAME}: duplicate {i}");
            assert_eq!(answer.get_ref(), first.get_ref(), "{NAME}: duplicate {i}");
        }
        assert!(starts.try_recv().is_err(), "{NAME}: the handler ran once");
    }
}

/// The SQL API's wait (`idem_await`), whatever the driver: a waiter mid-wait answers the holder's
/// replay once the holder completes, its lease and timeout far away; the completion does not wait
/// for the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idem_await_replays_a_holder_that_completes_while_it_waits() {
    let url = idempotency_testkit::fresh_database("idem_wait_sql").await;
    let (holder, waiter) = (idempotency_testkit::admin_at(&url).await, idempotency_testkit::admin_at(&url).await);
    let token: i64 = holder.query_one("SELECT token FROM idem_reserve('sql.await', 'u', 'k', 'h', lease => '1 minute')", &[]).await.unwrap().get(0);
    let waiting = tokio::spawn(async move {
        let row = waiter.query_one("SELECT outcome, response FROM idem_await('sql.await', 'u', 'k', 'h', '50 seconds')", &[]).await.unwrap();
        (row.get::<_, String>(0), row.get::<_, Option<serde_json::Value>>(1))
    });
    // The waiter is inside its call (its statement running) when the holder completes.
    idempotency_testkit::server::eventually("the waiter waits", std::time::Duration::from_secs(30), || async {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%idem_await(%' AND state = 'active' AND pid <> pg_backend_pid()";
        let n: i64 = holder.query_one(sql, &[]).await.map_err(|e| e.to_string())?.get(0);
        if n == 1 { Ok(()) } else { Err(format!("{n} waiters")) }
    })
    .await;
    let completed: bool = holder.query_one("SELECT idem_complete('sql.await', 'u', 'k', $1, '{\"paid\": true}')", &[&token]).await.unwrap().get(0);
    assert!(completed);
    let (outcome, response) = waiting.await.unwrap();
    assert_eq!((outcome.as_str(), response), ("replay", Some(serde_json::json!({"paid": true}))));
}
