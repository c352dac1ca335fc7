//! The gRPC adapter against gRPC's own contract, through clients we did not write: tonic's own
//! client with gzip on and off, and Python's grpcio (examples/python/grpc_check.py, its stubs
//! generated from examples/rust/proto/charges.proto at test time). The example's service is
//! served behind a layer installed on every route (`Server::builder().layer(..)`) beside tonic's
//! health and reflection services, over each driver and in both modes:
//!
//! - every gRPC code's rule (remembered, or the key released) as docs/rust-client.md's table
//!   says: the first call returns the code, the retry replays it or runs afresh;
//! - request and response compression: a retry that differs only in compression is the same
//!   request, and a replay decodes in any client;
//! - a trailers-only error's metadata (ascii, `-bin`) and `grpc-status-details-bin` replayed;
//! - an answer over the response limit, in both modes, a RESOURCE_EXHAUSTED status (never an
//!   HTTP answer);
//! - health and reflection pass through the layer untouched;
//! - the message size bound: the layer's `body_limit` (1 MiB) applies before tonic's decode
//!   limit (4 MiB), compressed or not: RESOURCE_EXHAUSTED, nothing reserved.

idempotency_testkit::for_each_driver! {
    use idempotency_tonic::{GrpcLayer, Mode};
    use idempotency_client::Settings;
    use idempotency_examples::grpc_charges::proto::charges_client::ChargesClient;
    use idempotency_examples::grpc_charges::proto::charges_server::ChargesServer;
    use idempotency_examples::grpc_charges::proto::{Charge, CreateCharge};
    use idempotency_examples::grpc_charges::{fail_metadata, ChargeService, FAIL_DETAILS, SCHEMA};
    use tonic::codec::CompressionEncoding::Gzip;
    use tonic::transport::Channel;
    use tonic::Code;

    /// The layer of the example (the user from `x-user`), over every route, with this response
    /// limit.
    fn layer(idem: Idem, mode: Mode, response_limit: Option<usize>) -> GrpcLayer<TestDriver> {
        let builder = GrpcLayer::builder(idem).mode(mode).user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned));
        let builder = match response_limit {
            Some(limit) => builder.response_limit(limit),
            None => builder,
        };
        builder.build().expect("a complete layer configuration")
    }

    /// Serves the example's service (gzip accepted and sent) behind `layer` on every route,
    /// beside tonic's health and reflection services; its address.
    pub(crate) async fn serve(idem: Idem, mode: Mode, response_limit: Option<usize>) -> String {
        admin().await.batch_execute(SCHEMA).await.unwrap();
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<ChargesServer<ChargeService<TestDriver>>>().await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .expect("the reflection service");
        let charges = ChargesServer::new(ChargeService::new(idem.clone(), mode, None)).accept_compressed(Gzip).send_compressed(Gzip);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tonic::transport::Server::builder()
            .layer(layer(idem, mode, response_limit))
            .add_service(health_service)
            .add_service(reflection)
            .add_service(charges)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        addr
    }

    async fn client(addr: &str, gzip: bool) -> ChargesClient<Channel> {
        let client = ChargesClient::connect(format!("http://{addr}")).await.expect("connect");
        match gzip {
            true => client.send_compressed(Gzip).accept_compressed(Gzip),
            false => client,
        }
    }

    async fn create(client: &mut ChargesClient<Channel>, key: &str, user: &str, message: CreateCharge) -> Result<tonic::Response<Charge>, tonic::Status> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert("idempotency-key", key.parse().unwrap());
        request.metadata_mut().insert("x-user", user.parse().unwrap());
        client.create(request).await
    }

    fn replayed(metadata: &tonic::metadata::MetadataMap) -> bool {
        metadata.get("idempotent-replayed").is_some_and(|v| v == "true")
    }

    fn problem(status: &tonic::Status) -> &str {
        status.metadata().get("idempotency-problem").and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    async fn charges_of(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n")
    }

    async fn records_of(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM idem_records WHERE user_id = $1", &[&user]).await.unwrap().get("n")
    }

    /// A user of its own per test, mode, driver and run (the database outlives a run).
    fn user(test: &str, mode: Mode) -> String {
        let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        format!("grpcc-{test}-{mode:?}-{NAME}-{run}")
    }

    /// docs/rust-client.md's table, written out again: whether the default policy remembers an
    /// answer with each code (else the key is released).
    const RULES: [(Code, bool); 16] = [
        (Code::Cancelled, false),
        (Code::Unknown, false),
        (Code::InvalidArgument, true),
        (Code::DeadlineExceeded, false),
        (Code::NotFound, true),
        (Code::AlreadyExists, false),
        (Code::PermissionDenied, true),
        (Code::ResourceExhausted, false),
        (Code::FailedPrecondition, true),
        (Code::Aborted, false),
        (Code::OutOfRange, true),
        (Code::Unimplemented, false),
        (Code::Internal, false),
        (Code::Unavailable, false),
        (Code::DataLoss, false),
        (Code::Unauthenticated, true),
    ];

    /// Each code after the write: the first call returns it; a remembered one replays (and its
    /// write stands once), a released one runs again (in-transaction its writes rolled back,
    /// two-phase they stand: two).
    async fn codes(mode: Mode) {
        let addr = serve(handle(Settings::default()).await, mode, None).await;
        let mut client = client(&addr, false).await;
        for (code, remembered) in RULES {
            let u = user(&format!("code{}", code as i32), mode);
            let message = CreateCharge { amount: 1, fail_code: code as i32, ..Default::default() };
            let first = create(&mut client, "c-1", &u, message.clone()).await.expect_err("the handler's code");
            assert_eq!((first.code(), first.message(), replayed(first.metadata())), (code, "failed after the write", false), "{first:?}");
            let again = create(&mut client, "c-1", &u, message).await.expect_err("the handler's code again");
            assert_eq!(again.code(), code, "{again:?}");
            assert_eq!(replayed(again.metadata()), remembered, "{code:?}: remembered {remembered}, got {again:?}");
            let writes = match (remembered, mode) {
                (true, _) => 1,
                (false, Mode::InTransaction) => 0,
                (false, Mode::TwoPhase) => 2,
            };
            assert_eq!(charges_of(&u).await, writes, "{code:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_code_is_remembered_or_released_per_the_table_in_transaction() {
        codes(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_code_is_remembered_or_released_per_the_table_two_phase() {
        codes(Mode::TwoPhase).await;
    }

    /// gzip on and off, in either order: one request, one charge, every retry a replay that
    /// decodes with the first answer's message.
    async fn compression(mode: Mode) {
        let addr = serve(handle(Settings::default()).await, mode, None).await;
        let (mut plain, mut gzip) = (client(&addr, false).await, client(&addr, true).await);
        let u = user("gzip", mode);
        for (key, first_gzip) in [("z-1", true), ("z-2", false)] {
            let message = CreateCharge { amount: 7, request_id: "x".repeat(300), ..Default::default() };
            let first = match first_gzip {
                true => create(&mut gzip, key, &u, message.clone()).await,
                false => create(&mut plain, key, &u, message.clone()).await,
            };
            let first = first.expect("created");
            assert!(!replayed(first.metadata()));
            for (retry, with_gzip) in [(&mut gzip, true), (&mut plain, false)] {
                let again = create(retry, key, &u, message.clone()).await;
                let again = again.unwrap_or_else(|e| panic!("the retry (gzip {with_gzip}) after a first call with gzip {first_gzip}: {e:?}"));
                assert!(replayed(again.metadata()), "gzip {with_gzip}: {:?}", again.metadata());
                assert_eq!(again.get_ref(), first.get_ref());
            }
        }
        assert_eq!(charges_of(&u).await, 2, "one charge per key");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_in_another_compression_is_the_same_request_in_transaction() {
        compression(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_in_another_compression_is_the_same_request_two_phase() {
        compression(Mode::TwoPhase).await;
    }

    /// `Status::with_details_and_metadata`: ascii and `-bin` metadata and the details, in the
    /// first answer and in its replay (a remembered code; and a released one's live answer).
    async fn metadata(mode: Mode) {
        let addr = serve(handle(Settings::default()).await, mode, None).await;
        let mut client = client(&addr, true).await;
        let u = user("metadata", mode);
        let expected = fail_metadata();
        for code in [Code::NotFound, Code::Unavailable] {
            let message = CreateCharge { amount: 1, fail_code: code as i32, fail_metadata: true, ..Default::default() };
            let key = format!("m-{}", code as i32);
            for attempt in 0..2 {
                let status = create(&mut client, &key, &u, message.clone()).await.expect_err("the handler's status");
                let context = format!("{code:?} attempt {attempt}: {status:?}");
                assert_eq!(status.code(), code, "{context}");
                assert_eq!(status.details(), FAIL_DETAILS, "{context}");
                assert_eq!(status.metadata().get("x-reason"), expected.get("x-reason"), "{context}");
                let trace = status.metadata().get_bin("x-trace-bin").map(|v| v.to_bytes().unwrap());
                assert_eq!(trace.as_deref(), Some(&[0u8, 159, 255][..]), "{context}");
                assert_eq!(replayed(status.metadata()), attempt == 1 && code == Code::NotFound, "{context}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trailers_only_error_replays_its_metadata_and_details_in_transaction() {
        metadata(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trailers_only_error_replays_its_metadata_and_details_two_phase() {
        metadata(Mode::TwoPhase).await;
    }

    /// An answer over a 4-byte response limit: RESOURCE_EXHAUSTED `response-too-large`, first
    /// and on the retry. Two-phase the effect stands and the retry replays the key's marker as
    /// that status; in-transaction the write rolled back and the retry runs again.
    async fn over_the_limit(mode: Mode) {
        let addr = serve(handle(Settings::default()).await, mode, Some(4)).await;
        let u = user("limit", mode);
        for (attempt, gzip) in [(0, false), (1, false), (2, true)] {
            let mut client = client(&addr, gzip).await;
            let status = create(&mut client, "l-1", &u, CreateCharge { amount: 3, ..Default::default() }).await.expect_err("over the limit");
            assert_eq!((status.code(), problem(&status)), (Code::ResourceExhausted, "urn:idempotency:problem:response-too-large"), "attempt {attempt}: {status:?}");
            assert_eq!(replayed(status.metadata()), attempt > 0 && mode == Mode::TwoPhase, "attempt {attempt}: {status:?}");
        }
        assert_eq!(charges_of(&u).await, if mode == Mode::TwoPhase { 1 } else { 0 });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_over_the_limit_is_resource_exhausted_in_transaction() {
        over_the_limit(Mode::InTransaction).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_over_the_limit_is_resource_exhausted_two_phase() {
        over_the_limit(Mode::TwoPhase).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn health_and_reflection_pass_through_a_layer_on_every_route() {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::health_client::HealthClient;
        use tonic_health::pb::HealthCheckRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        let addr = serve(handle(Settings::default()).await, Mode::InTransaction, None).await;
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.expect("connect");
        let mut health = HealthClient::new(channel.clone());
        let checked = health.check(HealthCheckRequest { service: String::new() }).await.expect("the health check passes the layer");
        assert_eq!(checked.get_ref().status(), ServingStatus::Serving);
        let named = HealthCheckRequest { service: "charges.v1.Charges".into() };
        assert_eq!(health.check(named.clone()).await.expect("the service's health").get_ref().status(), ServingStatus::Serving);
        let mut watched = health.watch(named).await.expect("health's streaming watch passes the layer").into_inner();
        assert_eq!(watched.message().await.expect("a status").expect("one").status(), ServingStatus::Serving);

        let mut reflection = ServerReflectionClient::new(channel);
        let ask = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
        let mut answers = reflection.server_reflection_info(futures_util::stream::iter([ask])).await.expect("reflection passes the layer").into_inner();
        let Some(MessageResponse::ListServicesResponse(list)) = answers.message().await.expect("an answer").expect("one").message_response else {
            panic!("not a list of services");
        };
        let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
        // Nothing was recorded for them.
        let records: i64 = admin().await.query_one("SELECT count(*) AS n FROM idem_records WHERE operation LIKE '%grpc.%'", &[]).await.unwrap().get("n");
        assert_eq!(records, 0);
    }

    /// The layer's body limit (1 MiB of the framed message, decompressed) is below tonic's decode
    /// limit (4 MiB), so it applies first: RESOURCE_EXHAUSTED `body-too-large` before anything is
    /// reserved, compressed (a 2 MiB message that gzips to a few KiB) or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_body_limit_applies_before_tonics_decode_limit() {
        let addr = serve(handle(Settings::default()).await, Mode::InTransaction, None).await;
        let u = user("size", Mode::InTransaction);
        let big = CreateCharge { amount: 1, request_id: "y".repeat(2 << 20), ..Default::default() };
        for gzip in [false, true] {
            let mut client = client(&addr, gzip).await;
            let status = create(&mut client, "s-1", &u, big.clone()).await.expect_err("over the body limit");
            assert_eq!((status.code(), problem(&status)), (Code::ResourceExhausted, "urn:idempotency:problem:body-too-large"), "gzip {gzip}: {status:?}");
        }
        // Just under it: served.
        let mut client = client(&addr, true).await;
        let fits = CreateCharge { amount: 1, request_id: "y".repeat((1 << 20) - 64), ..Default::default() };
        assert!(!replayed(create(&mut client, "s-2", &u, fits).await.expect("within the limit").metadata()));
        assert_eq!((records_of(&u).await, charges_of(&u).await), (1, 1), "nothing reserved for the refused calls");
    }

    /// With tonic's decode limit set below the layer's body limit, tonic's applies first (the
    /// layer cannot know it): tonic's own OUT_OF_RANGE, an answer like any other (never a hang or
    /// a 500), remembered per the table; the handler never ran. Hence the docs' advice: keep
    /// `body_limit` at or below `max_decoding_message_size`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lower_decode_limit_of_tonics_answers_first_with_its_own_code() {
        admin().await.batch_execute(SCHEMA).await.unwrap();
        let idem = handle(Settings::default()).await;
        let charges = ChargesServer::new(ChargeService::new(idem.clone(), Mode::InTransaction, None)).max_decoding_message_size(1024);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tonic::transport::Server::builder()
            .layer(layer(idem, Mode::InTransaction, None))
            .add_service(charges)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
        tokio::spawn(server);
        let mut client = client(&addr, false).await;
        let u = user("decode-limit", Mode::InTransaction);
        let message = CreateCharge { amount: 1, request_id: "y".repeat(2048), ..Default::default() };
        for attempt in 0..2 {
            let status = create(&mut client, "d-1", &u, message.clone()).await.expect_err("over tonic's limit");
            assert_eq!((status.code(), replayed(status.metadata())), (Code::OutOfRange, attempt == 1), "{status:?}");
        }
        assert_eq!(charges_of(&u).await, 0);
    }
}

/// Python's grpcio (not tonic) against the example behind a layer on every route: the checks of
/// examples/python/grpc_check.py, over tokio-postgres (the client is what this proves; the
/// drivers are the suite's above).
mod python {
    use idempotency_tower::Mode;
    use idempotency_client::Settings;
    use idempotency_testkit::driver::over_postgres::*;
    use std::process::Command;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grpcio_sees_every_rule_of_the_layer() {
        let importable = Command::new("python3").args(["-c", "import grpc, grpc_tools"]).output();
        assert!(
            importable.as_ref().is_ok_and(|o| o.status.success()),
            "grpcio and grpcio-tools must be importable by python3: run bash scripts/setup.sh (or python3 -m pip install grpcio grpcio-tools): {importable:?}"
        );
        let mut addrs = Vec::new();
        for (mode, limit) in [(Mode::InTransaction, None), (Mode::TwoPhase, None), (Mode::InTransaction, Some(4)), (Mode::TwoPhase, Some(4))] {
            addrs.push(super::over_postgres::serve(handle(Settings::default()).await, mode, limit).await);
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/python/grpc_check.py");
        let out_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/grpc-python");
        let run = tokio::process::Command::new("python3").arg(script).arg(out_dir).args(&addrs).output().await.expect("python3 runs");
        let text = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        println!("{text}");
        let last = text.lines().last().unwrap_or_default();
        let counts = last.split_once(" passed, ").and_then(|(p, rest)| Some((p.parse::<u32>().ok()?, rest.strip_suffix(" failed")?.parse::<u32>().ok()?)));
        match counts {
            Some((passed, 0)) if passed > 0 && run.status.success() => {}
            _ => panic!("grpc_check.py failed:\n{text}"),
        }
    }
}
