//! tower's readiness contract, against implementations we did not write (issue 40), over each
//! driver and in both modes:
//!
//! - tower's own middleware (`ConcurrencyLimit`, `Buffer`, `RateLimit`, `LoadShed`, `Timeout`)
//!   below and above the layer, installed with axum's `layer` and `route_layer`: a covered
//!   request runs once and its retry replays, whatever the stack;
//! - what each means there: `LoadShed` below sheds only requests that would run the handler (a
//!   replay passes while the handler is saturated) and a shed request's key is released;
//!   `ConcurrencyLimit` below makes a call wait for a permit with its key held, while replays
//!   pass; `Timeout` below answers its error and releases the key; `Timeout` above drops the
//!   request's future and the flow finishes in its own task (the retry replays);
//! - tower-test's mock below the layer: not ready, the layer waits (nothing called, the key held,
//!   a duplicate answered in-progress), then calls it once it is ready (a replay never needs it);
//!   a readiness error is answered and releases the key; a request dropped while the mock is not
//!   ready releases its key and never reaches it;
//! - the same for the gRPC adapter (`GrpcLayer`): the mock's readiness cases, and the tonic
//!   example served by tonic with each of those middleware below and above the layer (and
//!   tonic's own per-connection limit above it all), called by a tonic client.
//!
//! Nothing waits on a clock: each step waits for the state it needs (the mock's readiness polled
//! and pending, a handler started); the two timeouts bound handlers that are held until the test
//! opens them, so they always fire.

idempotency_testkit::for_each_driver! {
    use axum::body::Body;
    use axum::error_handling::HandleErrorLayer;
    use axum::http::{Request, Response, StatusCode};
    use axum::routing::post;
    use axum::{BoxError, Router};
    use idempotency_tower::{problem::types, IdempotencyLayer, Mode, ANONYMOUS_USER};
    use idempotency_client::{Key, Settings};
    use idempotency_testkit::server::eventually;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;
    use tokio::sync::{mpsc, Semaphore};
    use tower::{Service, ServiceBuilder, ServiceExt};

    const MODES: [Mode; 2] = [Mode::InTransaction, Mode::TwoPhase];

    /// A key of its own for every request of a test (both drivers share nothing: each has its
    /// database).
    fn fresh(test: &str) -> String {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        format!("{test}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The layer under test: anonymous, answering a duplicate in progress at once.
    async fn idem_layer(mode: Mode) -> IdempotencyLayer<TestDriver> {
        IdempotencyLayer::builder(handle(Settings::default()).await).mode(mode).anonymous().wait(false).build().expect("layer")
    }

    /// The record of `key` (of `POST /charges`): its status, or None.
    async fn status(operation: &str, key: &str) -> Option<String> {
        let key = Key::new(operation, ANONYMOUS_USER, key).expect("key");
        let sql = "SELECT _idem_status_word(status) AS status FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
        admin().await.query(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.expect("status").first().map(|r| r.get(0))
    }

    /// The transient failures counted for `key`.
    async fn attempts(operation: &str, key: &str) -> i32 {
        let key = Key::new(operation, ANONYMOUS_USER, key).expect("key");
        let sql = "SELECT coalesce((SELECT attempts FROM idem_retries WHERE operation = $1 AND user_id = $2 AND key = $3), 0)";
        admin().await.query_one(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.expect("attempts").get(0)
    }

    // ----- A service that tells when its inner service is not ready -----

    /// Passes everything to its inner service, and says so each time that service's `poll_ready`
    /// answered Pending: the test then knows the layer is waiting for readiness.
    #[derive(Clone)]
    struct Probe<S> {
        inner: S,
        pending: mpsc::UnboundedSender<()>,
    }

    impl<S: Service<R>, R> Service<R> for Probe<S> {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
            let ready = self.inner.poll_ready(cx);
            if ready.is_pending() {
                let _ = self.pending.send(());
            }
            ready
        }

        fn call(&mut self, req: R) -> S::Future {
            self.inner.call(req)
        }
    }

    fn probe<S>(inner: S) -> (Probe<S>, mpsc::UnboundedReceiver<()>) {
        let (pending, rx) = mpsc::unbounded_channel();
        (Probe { inner, pending }, rx)
    }

    // ----- tower's middleware around the layer, over axum -----

    /// The route's levers: how many times the handler ran; a request whose body is `hold` says
    /// it started, then waits for a permit of `gate`.
    struct Charges {
        runs: AtomicUsize,
        started: mpsc::UnboundedSender<()>,
        gate: Semaphore,
    }

    fn charges() -> (Arc<Charges>, mpsc::UnboundedReceiver<()>) {
        let (started, rx) = mpsc::unbounded_channel();
        (Arc::new(Charges { runs: AtomicUsize::new(0), started, gate: Semaphore::new(0) }), rx)
    }

    fn routes(charges: &Arc<Charges>) -> Router {
        let charges = charges.clone();
        Router::new().route(
            "/charges",
            post(move |body: String| {
                let charges = charges.clone();
                async move {
                    charges.runs.fetch_add(1, Ordering::SeqCst);
                    if body == "hold" {
                        let _ = charges.started.send(());
                        charges.gate.acquire().await.expect("gate").forget();
                    }
                    (StatusCode::CREATED, format!("charged {body}"))
                }
            }),
        )
    }

    /// What a `HandleErrorLayer` answers for the middleware's errors.
    async fn answer_error(e: BoxError) -> (StatusCode, String) {
        let status = if e.is::<tower::load_shed::error::Overloaded>() {
            StatusCode::SERVICE_UNAVAILABLE
        } else if e.is::<tower::timeout::error::Elapsed>() {
            StatusCode::GATEWAY_TIMEOUT
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        (status, e.to_string())
    }

    #[derive(Clone, Copy, Debug)]
    enum Middleware {
        ConcurrencyLimit,
        Buffer,
        RateLimit,
        LoadShed,
        Timeout,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Place {
        Below,
        Above,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Install {
        Layer,
        RouteLayer,
    }

    /// The stack installed, and the router made as `axum::serve` makes it (`with_state`: each
    /// route's service built once, so a middleware's state, a `ConcurrencyLimit`'s permits, is
    /// shared by every request, not made per request).
    macro_rules! installed {
        ($routes:expr, $install:expr, $stack:expr) => {
            match $install {
                Install::Layer => $routes.layer($stack).with_state(()),
                Install::RouteLayer => $routes.route_layer($stack).with_state(()),
            }
        };
    }

    /// The charges route with the layer and `middleware` stacked as a `ServiceBuilder` in that
    /// order (`Below`: the layer outside, the middleware between it and the route), installed
    /// with `layer` or `route_layer`. A middleware whose error is a `BoxError` has axum's
    /// `HandleErrorLayer` outside the whole stack, so the layer sees the error as its route's.
    fn app(middleware: Middleware, place: Place, install: Install, idem: IdempotencyLayer<TestDriver>, charges: &Arc<Charges>) -> Router {
        let routes = routes(charges);
        let handled = HandleErrorLayer::new(answer_error);
        let second = Duration::from_secs(1);
        let long = Duration::from_secs(120);
        match (middleware, place) {
            (Middleware::ConcurrencyLimit, Place::Below) => installed!(routes, install, ServiceBuilder::new().layer(idem).concurrency_limit(8)),
            (Middleware::ConcurrencyLimit, Place::Above) => installed!(routes, install, ServiceBuilder::new().concurrency_limit(8).layer(idem)),
            (Middleware::Buffer, Place::Below) => installed!(routes, install, ServiceBuilder::new().layer(handled).layer(idem).buffer(8)),
            (Middleware::Buffer, Place::Above) => installed!(routes, install, ServiceBuilder::new().layer(handled).buffer(8).layer(idem)),
            // RateLimit is not Clone: it sits behind a Buffer, as tower's docs say.
            (Middleware::RateLimit, Place::Below) => installed!(routes, install, ServiceBuilder::new().layer(handled).layer(idem).buffer(8).rate_limit(1000, second)),
            (Middleware::RateLimit, Place::Above) => installed!(routes, install, ServiceBuilder::new().layer(handled).buffer(8).rate_limit(1000, second).layer(idem)),
            (Middleware::LoadShed, Place::Below) => installed!(routes, install, ServiceBuilder::new().layer(handled).layer(idem).load_shed().concurrency_limit(8)),
            (Middleware::LoadShed, Place::Above) => installed!(routes, install, ServiceBuilder::new().layer(handled).load_shed().concurrency_limit(8).layer(idem)),
            (Middleware::Timeout, Place::Below) => installed!(routes, install, ServiceBuilder::new().layer(handled).layer(idem).timeout(long)),
            (Middleware::Timeout, Place::Above) => installed!(routes, install, ServiceBuilder::new().layer(handled).timeout(long).layer(idem)),
        }
    }

    /// An answer as the tests read it.
    #[derive(Debug, PartialEq)]
    struct Answer {
        status: StatusCode,
        replayed: bool,
        body: String,
    }

    async fn answer_of(response: Response<Body>) -> Answer {
        let status = response.status();
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        Answer { status, replayed, body: String::from_utf8_lossy(&body).into_owned() }
    }

    fn request(key: &str, body: &str) -> Request<Body> {
        Request::post("/charges").header("idempotency-key", format!("\"{key}\"")).body(Body::from(body.to_owned())).expect("request")
    }

    async fn send(app: &Router, key: &str, body: &str) -> Answer {
        answer_of(app.clone().oneshot(request(key, body)).await.expect("axum answers")).await
    }

    /// In both modes, below and above the layer, with `layer` and `route_layer`: the first
    /// request runs the handler (201), its retry replays it, the handler ran once.
    async fn runs_once_and_replays(middleware: Middleware) {
        for mode in MODES {
            for place in [Place::Below, Place::Above] {
                for install in [Install::Layer, Install::RouteLayer] {
                    let case = format!("{NAME} {mode:?} {middleware:?} {place:?} the layer ({install:?})");
                    let (charges, _started) = charges();
                    let app = app(middleware, place, install, idem_layer(mode).await, &charges);
                    let key = fresh("stack");
                    let first = send(&app, &key, "5").await;
                    assert_eq!((first.status, first.replayed), (StatusCode::CREATED, false), "{case}: {first:?}");
                    let again = send(&app, &key, "5").await;
                    assert_eq!(again, Answer { replayed: true, ..first }, "{case}");
                    assert_eq!(charges.runs.load(Ordering::SeqCst), 1, "{case}: the handler ran once");
                }
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_limit_around_the_layer_runs_once_and_replays() {
        runs_once_and_replays(Middleware::ConcurrencyLimit).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn buffer_around_the_layer_runs_once_and_replays() {
        runs_once_and_replays(Middleware::Buffer).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rate_limit_around_the_layer_runs_once_and_replays() {
        runs_once_and_replays(Middleware::RateLimit).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn load_shed_around_the_layer_runs_once_and_replays() {
        runs_once_and_replays(Middleware::LoadShed).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_around_the_layer_runs_once_and_replays() {
        runs_once_and_replays(Middleware::Timeout).await;
    }

    /// `LoadShed` over a `ConcurrencyLimit` of one, below the layer: while one request holds the
    /// handler, a replay still answers (it never needs the handler), a new key is shed (503) and
    /// released, and its retry runs afresh once the handler is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn load_shed_below_the_layer_sheds_handler_calls_not_replays() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (charges, mut started) = charges();
            let stack = ServiceBuilder::new().layer(HandleErrorLayer::new(answer_error)).layer(idem_layer(mode).await).load_shed().concurrency_limit(1);
            let app: Router = routes(&charges).route_layer(stack).with_state(());
            let (done, held, shed) = (fresh("shed-done"), fresh("shed-held"), fresh("shed"));
            assert_eq!(send(&app, &done, "5").await.status, StatusCode::CREATED, "{case}");
            let holder = tokio::spawn({
                let (app, held) = (app.clone(), held.clone());
                async move { send(&app, &held, "hold").await }
            });
            started.recv().await.expect("the held request reached the handler");
            let replay = send(&app, &done, "5").await;
            assert_eq!((replay.status, replay.replayed), (StatusCode::CREATED, true), "{case}: a replay needs no permit");
            let refused = send(&app, &shed, "7").await;
            assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{case}: shed: {refused:?}");
            assert_eq!(status("POST /charges", &shed).await, None, "{case}: the shed request's key is released");
            charges.gate.add_permits(1);
            assert_eq!(holder.await.expect("holder").status, StatusCode::CREATED, "{case}");
            let retry = send(&app, &shed, "7").await;
            assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false), "{case}: the retry runs afresh");
            assert_eq!(charges.runs.load(Ordering::SeqCst), 3, "{case}: the shed request never ran");
        }
    }

    /// A `ConcurrencyLimit` of one below the layer: a second key waits for the permit with its
    /// key held (a duplicate is answered in-progress, not run), a replay answers meanwhile, and
    /// the waiting request runs once the permit is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_limit_below_the_layer_holds_the_key_while_waiting_and_passes_replays() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (charges, mut started) = charges();
            let (pending_tx, mut pending) = mpsc::unbounded_channel();
            let probed = tower::layer::layer_fn(move |inner| Probe { inner, pending: pending_tx.clone() });
            let stack = ServiceBuilder::new().layer(idem_layer(mode).await).layer(probed).concurrency_limit(1);
            let app: Router = routes(&charges).route_layer(stack).with_state(());
            let (done, held, queued) = (fresh("limit-done"), fresh("limit-held"), fresh("limit-queued"));
            assert_eq!(send(&app, &done, "5").await.status, StatusCode::CREATED, "{case}");
            let spawn = |key: String| {
                let app = app.clone();
                tokio::spawn(async move { send(&app, &key, "hold").await })
            };
            let holder = spawn(held.clone());
            started.recv().await.expect("the held request reached the handler");
            let waiter = spawn(queued.clone());
            pending.recv().await.expect("the second request waits for the permit");
            let duplicate = send(&app, &queued, "hold").await;
            assert_eq!(duplicate.status, StatusCode::CONFLICT, "{case}: the waiting request holds its key: {duplicate:?}");
            assert!(duplicate.body.contains(types::IN_PROGRESS), "{case}: {duplicate:?}");
            let replay = send(&app, &done, "5").await;
            assert_eq!((replay.status, replay.replayed), (StatusCode::CREATED, true), "{case}: a replay needs no permit");
            charges.gate.add_permits(2);
            assert_eq!(holder.await.expect("holder").status, StatusCode::CREATED, "{case}");
            let waited = waiter.await.expect("waiter");
            assert_eq!((waited.status, waited.replayed), (StatusCode::CREATED, false), "{case}");
            assert_eq!(charges.runs.load(Ordering::SeqCst), 3, "{case}");
        }
    }

    /// `Timeout` below the layer, over a handler held until the test opens it: the timeout's
    /// error is the route's, so the key is released and the error answered (504); the retry
    /// runs afresh.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_below_the_layer_answers_its_error_and_releases_the_key() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (charges, _started) = charges();
            let stack = ServiceBuilder::new().layer(HandleErrorLayer::new(answer_error)).layer(idem_layer(mode).await).timeout(Duration::from_millis(300));
            let app: Router = routes(&charges).route_layer(stack).with_state(());
            let key = fresh("timeout-below");
            let timed_out = send(&app, &key, "hold").await;
            assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT, "{case}: {timed_out:?}");
            assert_eq!(status("POST /charges", &key).await, None, "{case}: the key is released");
            charges.gate.add_permits(1);
            let retry = send(&app, &key, "hold").await;
            assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false), "{case}: the retry runs afresh");
            assert_eq!(charges.runs.load(Ordering::SeqCst), 2, "{case}");
        }
    }

    /// `Timeout` above the layer drops the request's future (cancellation): the caller gets the
    /// timeout's answer, the flow runs on in its own task, and once the handler is let go the key
    /// holds its answer: the retry replays it, the handler ran once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeout_above_the_layer_drops_the_request_and_the_flow_finishes() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (charges, mut started) = charges();
            let stack = ServiceBuilder::new().layer(HandleErrorLayer::new(answer_error)).timeout(Duration::from_millis(300)).layer(idem_layer(mode).await);
            let app: Router = routes(&charges).route_layer(stack).with_state(());
            let key = fresh("timeout-above");
            let timed_out = send(&app, &key, "hold").await;
            assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT, "{case}: {timed_out:?}");
            started.recv().await.expect("the handler started");
            charges.gate.add_permits(1);
            let replay = eventually("the dropped request's flow finishes", Duration::from_secs(60), || async {
                let retry = send(&app, &key, "hold").await;
                if retry.status == StatusCode::CONFLICT { Err(format!("still held: {retry:?}")) } else { Ok(retry) }
            })
            .await;
            assert_eq!((replay.status, replay.replayed), (StatusCode::CREATED, true), "{case}: {replay:?}");
            assert_eq!(charges.runs.load(Ordering::SeqCst), 1, "{case}: the handler ran once");
        }
    }

    // ----- tower-test's mock below the HTTP layer -----

    type HttpMock = tower_test::mock::Mock<Request<Body>, Response<Body>>;
    type HttpHandle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// The layer over a probed mock.
    async fn over_mock(mode: Mode) -> (idempotency_tower::IdempotencyService<Probe<HttpMock>, TestDriver>, HttpHandle, mpsc::UnboundedReceiver<()>) {
        let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (probed, pending) = probe(mock);
        (tower::Layer::layer(&idem_layer(mode).await, probed), handle, pending)
    }

    fn created(body: &str) -> Response<Body> {
        Response::builder().status(StatusCode::CREATED).body(Body::from(body.to_owned())).expect("response")
    }

    /// Answers every request that reaches the mock with 201; counts them.
    fn respond(mut handle: HttpHandle, calls: Arc<AtomicUsize>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            handle.allow(u64::MAX);
            while let Some((_, reply)) = handle.next_request().await {
                calls.fetch_add(1, Ordering::SeqCst);
                reply.send_response(created("from the mock"));
            }
        })
    }

    /// The mock not ready: the layer waits (the request does not reach it and is not answered, no
    /// 500) with its key held (a duplicate is in-progress); once ready, the mock is called and
    /// its answer stored; the retry replays it while the mock is not ready again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inner_service_that_is_not_ready_makes_the_layer_wait() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (service, mut handle, mut pending) = over_mock(mode).await;
            handle.allow(0);
            let key = fresh("mock-wait");
            let waiting = tokio::spawn(service.clone().oneshot(request(&key, "5")));
            pending.recv().await.expect("the layer polls the mock's readiness");
            assert!(handle.poll_request().is_pending(), "{case}: nothing reached the mock");
            assert!(!waiting.is_finished(), "{case}: the request waits");
            let duplicate = answer_of(service.clone().oneshot(request(&key, "5")).await.expect("answered")).await;
            assert_eq!(duplicate.status, StatusCode::CONFLICT, "{case}: the key is held: {duplicate:?}");
            handle.allow(1);
            let (called, reply) = handle.next_request().await.expect("the layer calls the mock once it is ready");
            assert_eq!(called.headers().get("idempotency-key").map(|v| v.as_bytes()), Some(format!("\"{key}\"").as_bytes()), "{case}");
            reply.send_response(created("from the mock"));
            let first = answer_of(waiting.await.expect("task").expect("answered")).await;
            assert_eq!((first.status, first.replayed, first.body.as_str()), (StatusCode::CREATED, false, "from the mock"), "{case}");
            // Not ready again: the replay needs no readiness.
            let again = answer_of(service.clone().oneshot(request(&key, "5")).await.expect("answered")).await;
            assert_eq!(again, Answer { replayed: true, ..first }, "{case}");
            assert!(handle.poll_request().is_pending(), "{case}: the replay did not reach the mock");
        }
    }

    /// The mock's readiness fails: the error is the layer's answer, the key is released, and
    /// the retry runs afresh.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_inner_service_whose_readiness_fails_releases_the_key() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (service, mut handle, _pending) = over_mock(mode).await;
            handle.send_error("the inner service is overloaded");
            let key = fresh("mock-fails");
            let failed = service.clone().oneshot(request(&key, "5")).await.expect_err("the readiness error is answered");
            assert_eq!(failed.to_string(), "the inner service is overloaded", "{case}");
            assert_eq!(status("POST /charges", &key).await, None, "{case}: the key is released");
            let calls = Arc::new(AtomicUsize::new(0));
            let responder = respond(handle, calls.clone());
            let retry = answer_of(service.clone().oneshot(request(&key, "5")).await.expect("answered")).await;
            assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false), "{case}: the retry runs afresh: {retry:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{case}");
            drop(service);
            responder.abort();
        }
    }

    /// A request whose future is dropped while the mock is not ready (a timeout above the
    /// layer, a client gone) releases its key and never reaches the mock: the retry runs afresh.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_dropped_while_the_inner_service_is_not_ready_releases_its_key() {
        for mode in MODES {
            let case = format!("{NAME} {mode:?}");
            let (service, mut handle, mut pending) = over_mock(mode).await;
            handle.allow(0);
            let key = fresh("mock-dropped");
            let waiting = tokio::spawn(service.clone().oneshot(request(&key, "5")));
            pending.recv().await.expect("the layer polls the mock's readiness");
            waiting.abort();
            eventually("the dropped request's key is released", Duration::from_secs(30), || async {
                match (status("POST /charges", &key).await, attempts("POST /charges", &key).await) {
                    (None, 1) => Ok(()),
                    other => Err(format!("record and attempts: {other:?}")),
                }
            })
            .await;
            let calls = Arc::new(AtomicUsize::new(0));
            let responder = respond(handle, calls.clone());
            let retry = answer_of(service.clone().oneshot(request(&key, "5")).await.expect("answered")).await;
            assert_eq!((retry.status, retry.replayed), (StatusCode::CREATED, false), "{case}: the retry runs afresh: {retry:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{case}: the dropped request never reached the mock");
            drop(service);
            responder.abort();
        }
    }

    // ----- the gRPC adapter -----

    mod grpc {
        use super::*;
        use idempotency_examples::grpc_charges::proto::charges_client::ChargesClient;
        use idempotency_examples::grpc_charges::proto::charges_server::ChargesServer;
        use idempotency_examples::grpc_charges::proto::CreateCharge;
        use idempotency_examples::grpc_charges::{layer, ChargeService, KeyFrom, SCHEMA};
        use tonic::body::Body as GrpcBody;
        use tonic::{Code, Status};

        const METHOD: &str = "/charges.v1.Charges/Create";
        /// The operation the gRPC layer scopes the method's keys to.
        const OPERATION: &str = "POST /charges.v1.Charges/Create";

        type GrpcMock = tower_test::mock::Mock<Request<GrpcBody>, Response<GrpcBody>>;
        type GrpcHandle = tower_test::mock::Handle<Request<GrpcBody>, Response<GrpcBody>>;

        async fn over_mock(mode: Mode) -> (idempotency_tonic::GrpcService<Probe<GrpcMock>, TestDriver>, GrpcHandle, mpsc::UnboundedReceiver<()>) {
            let (mock, handle) = tower_test::mock::pair::<Request<GrpcBody>, Response<GrpcBody>>();
            let (probed, pending) = probe(mock);
            (tower::Layer::layer(&idempotency_tonic::GrpcLayer::from(idem_layer(mode).await), probed), handle, pending)
        }

        /// A unary call of the method: one uncompressed frame.
        fn call(key: &str) -> Request<GrpcBody> {
            let message = b"\x08\x05"; // CreateCharge { amount: 5 }
            let mut frame = vec![0u8];
            frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
            frame.extend_from_slice(message);
            Request::post(METHOD)
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .header("idempotency-key", key)
                .body(GrpcBody::new(Body::from(frame)))
                .expect("request")
        }

        /// The answer's gRPC code (in the headers of a trailers-only answer, else in the
        /// trailers) and whether it is a replay.
        async fn code_of(response: Response<GrpcBody>) -> (Code, bool) {
            use axum::body::HttpBody;
            let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
            let parse = |v: &axum::http::HeaderValue| v.to_str().ok()?.parse::<i32>().ok();
            let (parts, body) = response.into_parts();
            let mut code = parts.headers.get("grpc-status").and_then(parse);
            let mut body = std::pin::pin!(body);
            while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
                if let Ok(trailers) = frame.expect("a frame").into_trailers() {
                    code = code.or(trailers.get("grpc-status").and_then(parse));
                }
            }
            (Code::from_i32(code.expect("the answer has a grpc-status")), replayed)
        }

        fn answered_ok() -> Response<GrpcBody> {
            Status::new(Code::Ok, "").into_http()
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_an_inner_service_that_is_not_ready_makes_the_layer_wait() {
            for mode in MODES {
                let case = format!("{NAME} {mode:?} gRPC");
                let (service, mut handle, mut pending) = over_mock(mode).await;
                handle.allow(0);
                let key = fresh("grpc-wait");
                let waiting = tokio::spawn(service.clone().oneshot(call(&key)));
                pending.recv().await.expect("the layer polls the mock's readiness");
                assert!(handle.poll_request().is_pending(), "{case}: nothing reached the mock");
                assert!(!waiting.is_finished(), "{case}: the call waits");
                let duplicate = code_of(service.clone().oneshot(call(&key)).await.expect("answered")).await;
                assert_eq!(duplicate, (Code::Aborted, false), "{case}: the key is held");
                handle.allow(1);
                let (_, reply) = handle.next_request().await.expect("the layer calls the mock once it is ready");
                reply.send_response(answered_ok());
                let first = code_of(waiting.await.expect("task").expect("answered")).await;
                assert_eq!(first, (Code::Ok, false), "{case}");
                let again = code_of(service.clone().oneshot(call(&key)).await.expect("answered")).await;
                assert_eq!(again, (Code::Ok, true), "{case}: the replay needs no readiness");
                assert!(handle.poll_request().is_pending(), "{case}: the replay did not reach the mock");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_an_inner_service_whose_readiness_fails_releases_the_key() {
            for mode in MODES {
                let case = format!("{NAME} {mode:?} gRPC");
                let (service, mut handle, _pending) = over_mock(mode).await;
                handle.send_error("the inner service is overloaded");
                let key = fresh("grpc-fails");
                let failed = service.clone().oneshot(call(&key)).await.expect_err("the readiness error is answered");
                assert_eq!(failed.to_string(), "the inner service is overloaded", "{case}");
                assert_eq!(status(OPERATION, &key).await, None, "{case}: the key is released");
                handle.allow(1);
                let retry = tokio::spawn(service.clone().oneshot(call(&key)));
                let (_, reply) = handle.next_request().await.expect("the retry reaches the mock");
                reply.send_response(answered_ok());
                assert_eq!(code_of(retry.await.expect("task").expect("answered")).await, (Code::Ok, false), "{case}: the retry runs afresh");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_a_call_dropped_while_the_inner_service_is_not_ready_releases_its_key() {
            for mode in MODES {
                let case = format!("{NAME} {mode:?} gRPC");
                let (service, mut handle, mut pending) = over_mock(mode).await;
                handle.allow(0);
                let key = fresh("grpc-dropped");
                let waiting = tokio::spawn(service.clone().oneshot(call(&key)));
                pending.recv().await.expect("the layer polls the mock's readiness");
                waiting.abort();
                eventually("the dropped call's key is released", Duration::from_secs(30), || async {
                    match (status(OPERATION, &key).await, attempts(OPERATION, &key).await) {
                        (None, 1) => Ok(()),
                        other => Err(format!("record and attempts: {other:?}")),
                    }
                })
                .await;
                assert!(handle.poll_request().is_pending(), "{case}: the dropped call never reached the mock");
                handle.allow(1);
                let retry = tokio::spawn(service.clone().oneshot(call(&key)));
                let (_, reply) = handle.next_request().await.expect("the retry reaches the mock");
                reply.send_response(answered_ok());
                assert_eq!(code_of(retry.await.expect("task").expect("answered")).await, (Code::Ok, false), "{case}: the retry runs afresh");
            }
        }

        /// Serves the tonic example on `listener` behind `stack` (`Server::builder().layer`: the
        /// stack wraps every route), with tonic's own per-connection limit above it all.
        macro_rules! serve_behind {
            ($listener:expr, $idem:expr, $mode:expr, $stack:expr) => {
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .concurrency_limit_per_connection(8)
                        .layer($stack)
                        .add_service(ChargesServer::new(ChargeService::new($idem, $mode, None)))
                        .serve_with_incoming(tonic::transport::server::TcpIncoming::from($listener)),
                )
            };
        }

        /// The tonic example served by tonic with `middleware` below or above the gRPC layer,
        /// called by a tonic client, in both modes: the call runs, its retry replays, one charge.
        async fn runs_once_and_replays(middleware: Middleware) {
            admin().await.batch_execute(SCHEMA).await.expect("schema");
            for mode in MODES {
                for place in [Place::Below, Place::Above] {
                    let case = format!("{NAME} {mode:?} gRPC {middleware:?} {place:?} the layer");
                    let idem = handle(Settings::default()).await;
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                    let addr = format!("http://{}", listener.local_addr().expect("addr"));
                    let grpc = layer(idem.clone(), mode, KeyFrom::Metadata);
                    let (second, long) = (Duration::from_secs(1), Duration::from_secs(120));
                    let builder = ServiceBuilder::new();
                    let server = match (middleware, place) {
                        (Middleware::ConcurrencyLimit, Place::Below) => serve_behind!(listener, idem, mode, builder.layer(grpc).concurrency_limit(8)),
                        (Middleware::ConcurrencyLimit, Place::Above) => serve_behind!(listener, idem, mode, builder.concurrency_limit(8).layer(grpc)),
                        (Middleware::Buffer, Place::Below) => serve_behind!(listener, idem, mode, builder.layer(grpc).buffer(8)),
                        (Middleware::Buffer, Place::Above) => serve_behind!(listener, idem, mode, builder.buffer(8).layer(grpc)),
                        (Middleware::RateLimit, Place::Below) => serve_behind!(listener, idem, mode, builder.layer(grpc).buffer(8).rate_limit(1000, second)),
                        (Middleware::RateLimit, Place::Above) => serve_behind!(listener, idem, mode, builder.buffer(8).rate_limit(1000, second).layer(grpc)),
                        (Middleware::LoadShed, Place::Below) => serve_behind!(listener, idem, mode, builder.layer(grpc).load_shed().concurrency_limit(8)),
                        (Middleware::LoadShed, Place::Above) => serve_behind!(listener, idem, mode, builder.load_shed().concurrency_limit(8).layer(grpc)),
                        (Middleware::Timeout, Place::Below) => serve_behind!(listener, idem, mode, builder.layer(grpc).timeout(long)),
                        (Middleware::Timeout, Place::Above) => serve_behind!(listener, idem, mode, builder.timeout(long).layer(grpc)),
                    };
                    let client = ChargesClient::connect(addr).await.expect("connect");
                    let key = fresh("grpc-stack");
                    let user = format!("tower-{}", fresh(&format!("{mode:?}-{NAME}")));
                    let create = || {
                        let mut request = tonic::Request::new(CreateCharge { amount: 5, ..Default::default() });
                        request.metadata_mut().insert("idempotency-key", key.parse().expect("key"));
                        request.metadata_mut().insert("x-user", user.parse().expect("user"));
                        let mut client = client.clone();
                        async move { client.create(request).await }
                    };
                    let first = create().await.unwrap_or_else(|status| panic!("{case}: {status:?}"));
                    assert!(first.metadata().get("idempotent-replayed").is_none(), "{case}");
                    let again = create().await.unwrap_or_else(|status| panic!("{case}: {status:?}"));
                    assert_eq!(again.metadata().get("idempotent-replayed").map(|v| v.to_str().unwrap_or_default()), Some("true"), "{case}");
                    assert_eq!(again.get_ref(), first.get_ref(), "{case}");
                    let n: i64 = admin().await.query_one("SELECT count(*) FROM charges WHERE user_id = $1", &[&user]).await.expect("count").get(0);
                    assert_eq!(n, 1, "{case}: one charge");
                    server.abort();
                }
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_concurrency_limit_around_the_layer_runs_once_and_replays() {
            runs_once_and_replays(Middleware::ConcurrencyLimit).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_buffer_around_the_layer_runs_once_and_replays() {
            runs_once_and_replays(Middleware::Buffer).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_rate_limit_around_the_layer_runs_once_and_replays() {
            runs_once_and_replays(Middleware::RateLimit).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_load_shed_around_the_layer_runs_once_and_replays() {
            runs_once_and_replays(Middleware::LoadShed).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn grpc_timeout_around_the_layer_runs_once_and_replays() {
            runs_once_and_replays(Middleware::Timeout).await;
        }
    }
}
