//! The tonic example (`idempotency_examples::grpc_charges`, examples/rust/src) over each driver
//! and in both modes, served by tonic on loopback and called by a real tonic client over the
//! network: a replay is the stored answer (message, or status and message) with
//! `idempotent-replayed: true`; another message under the key is INVALID_ARGUMENT; a duplicate
//! while the key is held is ABORTED; a retry storm (duplicates sent while the first call is held
//! in its handler, so they overlap it) runs once per key; the key from the message's `request_id`
//! (AIP-155); a streaming method refused; the store down UNAVAILABLE.

idempotency_testkit::for_each_driver! {
    use idempotency_tower::Mode;
    use idempotency_client::Settings;
    use idempotency_examples::grpc_charges::proto::charges_client::ChargesClient;
    use idempotency_examples::grpc_charges::proto::{Charge, CreateCharge};
    use idempotency_examples::grpc_charges::{serve, Hold, KeyFrom, SCHEMA};
    use std::sync::Arc;
    use tokio::sync::{mpsc, Semaphore};
    use tonic::transport::Channel;
    use tonic::Code;

    /// A served example and its levers.
    struct Served {
        addr: String,
        hold: Arc<Hold>,
        started: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
    }

    async fn serve_with(idem: Idem, mode: Mode, key_from: KeyFrom) -> Served {
        admin().await.batch_execute(SCHEMA).await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let hold = Arc::new(Hold { started: tx, gate: Semaphore::new(0) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve(idem, mode, key_from, Some(hold.clone()), listener));
        Served { addr, hold, started: tokio::sync::Mutex::new(rx) }
    }

    async fn client(served: &Served) -> ChargesClient<Channel> {
        ChargesClient::connect(served.addr.clone()).await.expect("connect")
    }

    /// `Create` with this key (metadata) and user.
    async fn create(client: &mut ChargesClient<Channel>, key: Option<&str>, user: &str, message: CreateCharge) -> Result<tonic::Response<Charge>, tonic::Status> {
        let mut request = tonic::Request::new(message);
        if let Some(key) = key {
            request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
        }
        request.metadata_mut().insert("x-user", user.parse().unwrap());
        client.create(request).await
    }

    fn charge(amount: i64) -> CreateCharge {
        CreateCharge { amount, ..Default::default() }
    }

    fn replayed<T>(response: &tonic::Response<T>) -> bool {
        response.metadata().get("idempotent-replayed").is_some_and(|v| v == "true")
    }

    fn problem(status: &tonic::Status) -> &str {
        status.metadata().get("idempotency-problem").and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    async fn charges_of(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n")
    }

    fn user(test: &str, mode: Mode) -> String {
        format!("grpc-{test}-{mode:?}-{NAME}")
    }

    async fn replays(mode: Mode) {
        let served = serve_with(handle(Settings::default()).await, mode, KeyFrom::Metadata).await;
        let mut client = client(&served).await;
        let u = user("replay", mode);
        let first = create(&mut client, Some("g-1"), &u, charge(5)).await.expect("created");
        assert!(!replayed(&first));
        let again = create(&mut client, Some("g-1"), &u, charge(5)).await.expect("replayed");
        assert!(replayed(&again), "{:?}", again.metadata());
        assert_eq!(again.get_ref(), first.get_ref(), "the stored message");
        assert_eq!(charges_of(&u).await, 1);

        // A permanent error (NOT_FOUND after the write) is stored: its code and message replay.
        let failing = CreateCharge { amount: 1, fail_code: Code::NotFound as i32, ..Default::default() };
        let first = create(&mut client, Some("g-err"), &u, failing.clone()).await.expect_err("fails");
        assert_eq!((first.code(), first.message()), (Code::NotFound, "failed after the write"));
        assert!(first.metadata().get("idempotent-replayed").is_none());
        let again = create(&mut client, Some("g-err"), &u, failing).await.expect_err("replayed failure");
        assert_eq!((again.code(), again.message()), (Code::NotFound, "failed after the write"));
        assert_eq!(again.metadata().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
        // A stored answer is an answer like any other: its write commits with it (in-transaction
        // in the same transaction), and the replay did not write again.
        let expected = 2;
        assert_eq!(charges_of(&u).await, expected);

        // A transient error (UNAVAILABLE after the write) releases the key: the retry runs again,
        // and in-transaction each failed call's write rolled back with it.
        let flaky = CreateCharge { amount: 2, fail_code: Code::Unavailable as i32, ..Default::default() };
        for _ in 0..2 {
            let status = create(&mut client, Some("g-flaky"), &u, flaky.clone()).await.expect_err("fails");
            assert_eq!(status.code(), Code::Unavailable);
            assert!(status.metadata().get("idempotent-replayed").is_none(), "a released key runs again");
        }
        let expected = if mode == Mode::InTransaction { expected } else { expected + 2 };
        assert_eq!(charges_of(&u).await, expected);

        // Another message under the key: INVALID_ARGUMENT, nothing runs.
        let mismatch = create(&mut client, Some("g-1"), &u, charge(6)).await.expect_err("mismatch");
        assert_eq!((mismatch.code(), problem(&mismatch)), (Code::InvalidArgument, "urn:idempotency:problem:mismatch"));
        // No key: INVALID_ARGUMENT; no user: UNAUTHENTICATED.
        let missing = create(&mut client, None, &u, charge(5)).await.expect_err("no key");
        assert_eq!(missing.code(), Code::InvalidArgument);
        let mut anonymous = tonic::Request::new(charge(5));
        anonymous.metadata_mut().insert("idempotency-key", "g-2".parse().unwrap());
        assert_eq!(client.create(anonymous).await.expect_err("no user").code(), Code::Unauthenticated);
        assert_eq!(charges_of(&u).await, expected);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_replays_the_stored_answer_in_transaction() {
        replays(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_replays_the_stored_answer_two_phase() {
        replays(Mode::TwoPhase).await;
    }

    /// For each key: the first call is held in its handler; 15 duplicates sent meanwhile (so
    /// they overlap it) are all ABORTED with `retry-after`; released, it answers; a retry replays.
    async fn storm(mode: Mode) {
        let served = serve_with(handle(Settings::default()).await, mode, KeyFrom::Metadata).await;
        let u = user("storm", mode);
        for round in 0..4 {
            let key = format!("storm-{round}");
            let mut holder = {
                let (mut client, key, u) = (client(&served).await, key.clone(), u.clone());
                tokio::spawn(async move { create(&mut client, Some(&key), &u, CreateCharge { amount: 9, hold: true, ..Default::default() }).await })
            };
            tokio::select! {
                _ = async { served.started.lock().await.recv().await } => {}
                answer = &mut holder => panic!("answered without reaching the handler: {answer:?}"),
            }
            let duplicates = (0..15).map(|_| {
                let (addr, key, u) = (served.addr.clone(), key.clone(), u.clone());
                tokio::spawn(async move {
                    let mut client = ChargesClient::connect(addr).await.expect("connect");
                    create(&mut client, Some(&key), &u, CreateCharge { amount: 9, hold: true, ..Default::default() }).await
                })
            });
            for duplicate in futures_util::future::join_all(duplicates).await {
                let status = duplicate.unwrap().expect_err("the key is held");
                assert_eq!((status.code(), problem(&status)), (Code::Aborted, "urn:idempotency:problem:in-progress"), "{status:?}");
                assert!(status.metadata().get("retry-after").is_some());
            }
            served.hold.gate.add_permits(1);
            let first = holder.await.unwrap().expect("the held call answers");
            assert!(!replayed(&first));
            let mut client = client(&served).await;
            let retry = create(&mut client, Some(&key), &u, CreateCharge { amount: 9, hold: true, ..Default::default() }).await.expect("replay");
            assert!(replayed(&retry));
            assert_eq!(retry.get_ref(), first.get_ref());
        }
        assert_eq!(charges_of(&u).await, 4, "one charge per key");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_storm_runs_once_per_key_in_transaction() {
        storm(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_retry_storm_runs_once_per_key_two_phase() {
        storm(Mode::TwoPhase).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_key_from_the_request_id_field() {
        let served = serve_with(handle(Settings::default()).await, Mode::InTransaction, KeyFrom::RequestId).await;
        let mut client = client(&served).await;
        let u = user("aip155", Mode::InTransaction);
        let message = CreateCharge { amount: 4, request_id: "req-1".into(), ..Default::default() };
        let first = create(&mut client, None, &u, message.clone()).await.expect("created");
        let again = create(&mut client, None, &u, message).await.expect("replayed");
        assert!(!replayed(&first) && replayed(&again));
        let other = create(&mut client, None, &u, CreateCharge { amount: 5, request_id: "req-1".into(), ..Default::default() }).await;
        assert_eq!(other.expect_err("mismatch").code(), Code::InvalidArgument);
        assert_eq!(create(&mut client, None, &u, charge(4)).await.expect_err("no request_id").code(), Code::InvalidArgument);
        // A gzip request: the extractor reads the decompressed message, so the same key.
        let mut gzip = client.clone().send_compressed(tonic::codec::CompressionEncoding::Gzip);
        let compressed = create(&mut gzip, None, &u, CreateCharge { amount: 4, request_id: "req-1".into(), ..Default::default() }).await;
        assert!(replayed(&compressed.expect("replayed, compressed")));
        assert_eq!(charges_of(&u).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_streaming_method_is_refused() {
        let served = serve_with(handle(Settings::default()).await, Mode::InTransaction, KeyFrom::Metadata).await;
        let mut client = client(&served).await;
        let mut request = tonic::Request::new(charge(1));
        request.metadata_mut().insert("idempotency-key", "stream-1".parse().unwrap());
        request.metadata_mut().insert("x-user", "grpc-stream".parse().unwrap());
        let refused = match client.watch(request).await {
            Err(status) => status,
            Ok(response) => {
                let mut stream = response.into_inner();
                stream.message().await.expect_err("the stream is refused")
            }
        };
        assert_eq!((refused.code(), problem(&refused)), (Code::FailedPrecondition, "urn:idempotency:problem:streaming"));
        assert!(refused.message().contains("unary"), "{refused:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_down_is_unavailable() {
        let idem = store_down(2);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve(idem, Mode::InTransaction, KeyFrom::Metadata, None, listener));
        let mut client = ChargesClient::connect(addr).await.expect("connect");
        let status = create(&mut client, Some("k"), "u", charge(1)).await.expect_err("store down");
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.metadata().get("retry-after").is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_layer_serves_every_route_of_a_server_too() {
        // `Server::builder().layer(..)` instead of one service: the same answers.
        use idempotency_examples::grpc_charges::{layer, ChargeService};
        use idempotency_examples::grpc_charges::proto::charges_server::ChargesServer;
        admin().await.batch_execute(SCHEMA).await.unwrap();
        let idem = handle(Settings::default()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let server = tonic::transport::Server::builder()
            .layer(layer(idem.clone(), Mode::InTransaction, KeyFrom::Metadata))
            .add_service(ChargesServer::new(ChargeService::new(idem, Mode::InTransaction, None)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        let mut client = ChargesClient::connect(addr).await.expect("connect");
        let u = user("routes", Mode::InTransaction);
        let first = create(&mut client, Some("r-1"), &u, charge(3)).await.expect("created");
        let again = create(&mut client, Some("r-1"), &u, charge(3)).await.expect("replayed");
        assert!(!replayed(&first) && replayed(&again));
        assert_eq!(again.get_ref(), first.get_ref());
        assert_eq!(charges_of(&u).await, 1);
    }

    /// What an authentication layer outside the idempotency layer found: the principal.
    #[derive(Clone)]
    struct Principal(String);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scope_from_an_authentication_layer_outside() {
        use idempotency_examples::grpc_charges::proto::charges_server::ChargesServer;
        use idempotency_tonic::GrpcLayer;
        use idempotency_examples::grpc_charges::ChargeService;
        admin().await.batch_execute(SCHEMA).await.unwrap();
        let idem = handle(Settings::default()).await;
        // The "auth layer": a bearer token in the metadata becomes a Principal extension.
        let auth = tower::util::MapRequestLayer::new(|mut req: axum::http::Request<tonic::body::Body>| {
            let token = req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::to_owned);
            if let Some(token) = token {
                req.extensions_mut().insert(Principal(format!("principal-of-{token}-{NAME}")));
            }
            req
        });
        let idempotent = GrpcLayer::in_transaction(idem.clone())
            .user(|parts| parts.extensions.get::<Principal>().map(|p| p.0.clone()))
            .build()
            .expect("layer");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let server = tonic::transport::Server::builder()
            .layer(auth)
            .layer(idempotent)
            .add_service(ChargesServer::new(ChargeService::new(idem, Mode::InTransaction, None)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        let mut client = ChargesClient::connect(addr).await.expect("connect");
        let call = |token: Option<&'static str>| {
            let mut request = tonic::Request::new(charge(8));
            request.metadata_mut().insert("idempotency-key", "auth-1".parse().unwrap());
            if let Some(token) = token {
                request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
            }
            request
        };
        let alice = client.create(call(Some("alice"))).await.expect("alice's call");
        let again = client.create(call(Some("alice"))).await.expect("alice's retry");
        assert!(!replayed(&alice) && replayed(&again));
        // Bob's call with the same key is his own: it runs.
        let bob = client.create(call(Some("bob"))).await.expect("bob's call");
        assert!(!replayed(&bob));
        assert_ne!(bob.get_ref().id, alice.get_ref().id);
        // No principal: UNAUTHENTICATED.
        assert_eq!(client.create(call(None)).await.expect_err("no principal").code(), Code::Unauthenticated);
        let records: i64 = admin()
            .await
            .query_one("SELECT count(*) AS n FROM idem_records WHERE key = 'auth-1' AND user_id = ANY($1)", &[&vec![format!("principal-of-alice-{NAME}"), format!("principal-of-bob-{NAME}")]])
            .await
            .unwrap()
            .get("n");
        assert_eq!(records, 2, "one record per principal");
    }
}
