//! The async-closure entry points (`run_async`, `run_batch_async`, `run_external_async`) as
//! handlers write them: inside an axum handler (a router serves it, so its future is checked
//! `Send`), an actix-web handler (registered on an `App`), a tonic method (the generated
//! service trait, whose futures are `Send`) and a `tokio::spawn`, over both drivers. That these
//! compile is half the test; each then runs against the private cluster and is checked to run
//! its closure once per key. And the one constructor shape of every driver (`from_url`,
//! `from_pool`) the handles are made with.

idempotency_testkit::for_each_driver! {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::Json;
    use idempotency_client::{BatchItem, BatchOutcome, Error, Fingerprint, Idempotency, Key, Outcome, Settings, StoredResponse};
    use idempotency_examples::grpc_charges::proto::charges_server::Charges as ChargesRpc;
    use idempotency_examples::grpc_charges::proto::{Charge as ChargeReply, CreateCharge};
    use idempotency_testkit::{charges_for, unique_key};
    use serde_json::{json, Value};
    use tower::ServiceExt;

    const INSERT: &str = "INSERT INTO charges (user_id, amount, k) VALUES ('closures', 1, $1)";

    fn fp(v: &Value) -> Fingerprint {
        Fingerprint::of_json(v).expect("fingerprint")
    }

    /// An axum handler: the key in the body, `run_async` with an `async move` closure.
    async fn axum_create(State(idem): State<Idem>, Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
        let key = Key::new("closures.axum", "u", body["key"].as_str().unwrap_or_default()).expect("key");
        let tag = key.to_string();
        let outcome = idem
            .run_async(&key, &fp(&body), async move |tx| {
                exec(tx, INSERT, &[&tag]).await?;
                Ok::<_, DbError>(StoredResponse::json(201, json!({})))
            })
            .await;
        match outcome {
            Ok(outcome) => (StatusCode::CREATED, Json(json!({"replayed": outcome.is_replayed()}))),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": e.to_string()}))),
        }
    }

    #[tokio::test]
    async fn run_async_in_an_axum_handler() {
        let idem = handle(Settings::default()).await;
        let router = axum::Router::new().route("/charges", axum::routing::post(axum_create)).with_state(idem);
        let key = unique_key("closures.axum");
        let body = json!({"key": key.key()});
        let mut replayed = Vec::new();
        for _ in 0..2 {
            let request = axum::http::Request::post("/charges")
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap();
            let response = router.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let answer: Value = serde_json::from_slice(&axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap()).unwrap();
            assert_eq!(status, StatusCode::CREATED, "{answer}");
            replayed.push(answer["replayed"].clone());
        }
        assert_eq!(replayed, [json!(false), json!(true)], "the second request is a replay");
        let key = Key::new("closures.axum", "u", key.key()).unwrap();
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    /// An actix-web handler: a batch of keys, `run_batch_async` with an `async move` closure.
    async fn actix_batch(idem: actix_web::web::Data<Idem>, body: actix_web::web::Json<Vec<String>>) -> actix_web::HttpResponse {
        let items: Vec<BatchItem> = body.iter().map(|k| BatchItem { key: k.clone(), fingerprint: fp(&json!({"k": k})) }).collect();
        let answers = idem
            .run_batch_async("closures.actix", "u", &items, async move |tx, created| {
                for key in created {
                    exec(tx, INSERT, &[key]).await?;
                }
                Ok::<_, DbError>(created.iter().map(|_| StoredResponse::json(201, json!({}))).collect())
            })
            .await;
        match answers {
            Ok(answers) => {
                let executed = answers.iter().filter(|(_, outcome)| matches!(outcome, BatchOutcome::Executed(_))).count();
                actix_web::HttpResponse::Ok().json(json!({"executed": executed}))
            }
            Err(e) => actix_web::HttpResponse::InternalServerError().body(e.to_string()),
        }
    }

    #[tokio::test]
    async fn run_batch_async_in_an_actix_handler() {
        let idem = handle(Settings::default()).await;
        // The handler is an actix-web handler: it registers on an App.
        let _app = actix_web::App::new()
            .app_data(actix_web::web::Data::new(idem.clone()))
            .route("/batch", actix_web::web::post().to(actix_batch));
        let prefix = unique_key("closures.actix").key().to_owned();
        let keys: Vec<String> = (0..3).map(|i| format!("{prefix}-{i}")).collect();
        let mut executed = Vec::new();
        for _ in 0..2 {
            let response = actix_batch(actix_web::web::Data::new(idem.clone()), actix_web::web::Json(keys.clone())).await;
            assert_eq!(response.status(), actix_web::http::StatusCode::OK);
            let bytes = actix_web::body::to_bytes(response.into_body()).await.unwrap_or_else(|_| panic!("the body"));
            executed.push(serde_json::from_slice::<Value>(&bytes).unwrap()["executed"].clone());
        }
        assert_eq!(executed, [json!(3), json!(0)], "the redelivered batch replays every key");
        let admin = admin().await;
        for key in &keys {
            let n: i64 = admin.query_one("SELECT count(*) FROM charges WHERE k = $1", &[key]).await.unwrap().get(0);
            assert_eq!(n, 1, "{key}");
        }
    }

    /// A tonic service: `run_external_async` with an async `record` closure.
    struct Rpc {
        idem: Idem,
    }

    #[tonic::async_trait]
    impl ChargesRpc for Rpc {
        async fn create(&self, request: tonic::Request<CreateCharge>) -> Result<tonic::Response<ChargeReply>, tonic::Status> {
            let message = request.into_inner();
            let key = Key::new("closures.tonic", "u", message.request_id.as_str()).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
            let tag = key.to_string();
            let amount = message.amount;
            let outside = async move { Ok::<_, DbError>(StoredResponse::json(201, json!({"amount": amount}))) };
            let outcome = self
                .idem
                .run_external_async(&key, &fp(&json!({"amount": amount})), outside, async move |tx, _result| {
                    exec(tx, INSERT, &[&tag]).await?;
                    Ok::<_, DbError>(())
                })
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let id = if outcome.is_replayed() { 2 } else { 1 };
            Ok(tonic::Response::new(ChargeReply { id, amount }))
        }

        type WatchStream = futures_util::stream::Empty<Result<ChargeReply, tonic::Status>>;

        async fn watch(&self, _request: tonic::Request<CreateCharge>) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Ok(tonic::Response::new(futures_util::stream::empty()))
        }
    }

    #[tokio::test]
    async fn run_external_async_in_a_tonic_method() {
        let rpc = Rpc { idem: handle(Settings::default()).await };
        let key = unique_key("closures.tonic");
        let request = || tonic::Request::new(CreateCharge { amount: 5, request_id: key.key().to_owned(), ..Default::default() });
        let first = rpc.create(request()).await.unwrap().into_inner();
        let second = rpc.create(request()).await.unwrap().into_inner();
        assert_eq!((first.id, second.id), (1, 2), "the second call is a replay");
        let key = Key::new("closures.tonic", "u", key.key()).unwrap();
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    #[tokio::test]
    async fn run_async_in_a_spawned_task_with_owned_captures() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("closures.spawn");
        let tag = std::sync::Arc::new(key.to_string());
        let task = {
            let (idem, key) = (idem.clone(), key.clone());
            tokio::spawn(async move {
                idem.run_async(&key, &fp(&json!({})), async move |tx| {
                    exec(tx, INSERT, &[tag.as_str()]).await?;
                    Ok::<_, DbError>(StoredResponse::json(201, json!({})))
                })
                .await
            })
        };
        assert!(matches!(task.await.unwrap(), Ok(Outcome::Executed(_))));
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    #[tokio::test]
    async fn one_constructor_shape_for_either_driver() {
        let url = test_database().await;
        let opened = Idempotency::<TestDriver>::from_url(url, 2, Settings::default()).unwrap();
        let lent = Idempotency::<TestDriver>::from_pool(opened.pool().clone(), Settings::default());
        for idem in [opened, lent] {
            let key = unique_key("closures.constructors");
            let tag = key.to_string();
            let outcome = idem
                .run_async(&key, &fp(&json!({})), async move |tx| {
                    exec(tx, INSERT, &[&tag]).await?;
                    Ok::<_, DbError>(StoredResponse::json(201, json!({})))
                })
                .await
                .unwrap();
            assert!(matches!(outcome, Outcome::Executed(_)));
            assert_eq!(charges_for(&admin().await, &key).await, 1);
        }
        let zero = Idempotency::<TestDriver>::from_url(url, 0, Settings::default()).unwrap_err();
        assert!(matches!(&zero, Error::Configuration { reason, .. } if reason.contains("pool_size")), "{zero:?}");
    }
}
