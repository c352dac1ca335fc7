//! Recovery points in the layer (issue 45, docs/recovery-points.md, "In the layer"): an axum
//! route behind a two-phase `IdempotencyLayer` whose handler takes the `Steps` extractor and
//! runs the ride flow of examples/rides (create the ride: a local step; charge and receipt:
//! outside steps against stubs that count calls per `Idempotency-Key`; finish) with
//! `steps.run(&plan, input)`. The happy path answers and replays; a handler that fails
//! transiently after the first recovery point (the card network unreachable: 503) leaves the
//! key `RESUMABLE`, and the retry resumes at the recorded step (the ride's row once, one
//! effective call per derived key); a second `Steps` in one handler is a typed rejection. Both
//! drivers.

idempotency_testkit::for_each_driver! {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::{Json, Router};
    use idempotency_client::{Body, DerivedKey, Key};
    use idempotency_rides::stub::Stub;
    use idempotency_rides::{no_hook, plan, RideRequest, RideState, Services};
    use idempotency_testkit::{admin_at, fresh_database};
    use idempotency_tower::{problem::types, IdempotencyLayer, Mode, Steps};
    use serde_json::{json, Value};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::sync::OnceCell;

    /// The layer's operation name for the route.
    const OPERATION: &str = "rides.layer";

    /// A port nothing listens on: the card network unreachable.
    const UNREACHABLE: &str = "http://127.0.0.1:9/";

    /// The route's state: the stubs, and a lever that makes the next request's charge fail.
    struct App {
        charge: Stub,
        receipt: Stub,
        fail_charge: AtomicBool,
    }

    /// Runs the ride flow through the request's `Steps`; a step's error answers 503 (transient:
    /// the layer releases the key).
    async fn ride(State(app): State<Arc<App>>, steps: Steps<TestDriver>, Json(request): Json<RideRequest>) -> Response {
        let charge = match app.fail_charge.swap(false, Ordering::SeqCst) {
            true => UNREACHABLE.to_owned(),
            false => app.charge.url.clone(),
        };
        let plan = plan::<TestDriver>(Services::new(charge, app.receipt.url.clone()), no_hook());
        match steps.run(&plan, RideState::from(request)).await {
            Ok(stored) => {
                let Body::Json(body) = stored.body else { panic!("the ride's answer is JSON") };
                (StatusCode::from_u16(stored.status).expect("a status"), Json(body)).into_response()
            }
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        }
    }

    /// A handler that extracts `Steps` twice: the second is refused before it runs.
    async fn twice(_first: Steps<TestDriver>, _second: Steps<TestDriver>) -> &'static str {
        "unreachable"
    }

    /// A served app: its URL, its state, the admin connection to its database.
    struct Served {
        url: String,
        app: Arc<App>,
        admin: deadpool_postgres::Client,
    }

    /// This driver's database, with the rides table, made once per process.
    async fn database() -> &'static str {
        static URL: OnceCell<String> = OnceCell::const_new();
        URL.get_or_init(|| async {
            let url = fresh_database(&db("layer_steps")).await;
            admin_at(&url).await.batch_execute(idempotency_rides::store::SCHEMA).await.expect("the rides table");
            url
        })
        .await
    }

    async fn serve() -> Served {
        let database = database().await;
        let admin = admin_at(database).await;
        let app = Arc::new(App {
            charge: Stub::serve("charge").await.expect("the charge stub"),
            receipt: Stub::serve("receipt").await.expect("the receipt stub"),
            fail_charge: AtomicBool::new(false),
        });
        let layer = IdempotencyLayer::builder(connect_with(database, 4, idempotency_client::Settings::default()))
            .mode(Mode::TwoPhase)
            .operation(OPERATION)
            .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
            .build()
            .expect("layer");
        let router = Router::new().route("/rides", post(ride)).route("/twice", post(twice)).route_layer(layer).with_state(app.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        Served { url, app, admin }
    }

    /// An answer's status, `Idempotent-Replayed` and body.
    async fn send(url: &str, key: &str, user: &str) -> (u16, bool, Value) {
        let body = json!({"user": user, "amount": 1250});
        let resp = reqwest::Client::new().post(url).header("idempotency-key", key).header("x-user", user).json(&body).send().await.expect("request");
        let (status, replayed) = (resp.status().as_u16(), resp.headers().get("idempotent-replayed").is_some_and(|v| v == "true"));
        let text = resp.text().await.unwrap_or_default();
        (status, replayed, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// The rides of `user`: (rows, rows done).
    async fn rides(served: &Served, user: &str) -> (i64, i64) {
        let row = served.admin.query_one("SELECT count(*), count(*) FILTER (WHERE done) FROM rides WHERE user_id = $1", &[&user]).await.unwrap();
        (row.get(0), row.get(1))
    }

    /// The key's record: status and recorded step.
    async fn record(served: &Served, user: &str, key: &str) -> (String, Option<i32>) {
        let sql = "SELECT _idem_status_word(status), step FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
        let row = served.admin.query_one(sql, &[&OPERATION, &user, &key]).await.expect("the key's record");
        (row.get(0), row.get(1))
    }

    /// The derived key of step `step` of the request (`user`, `key`), as the stubs saw it.
    fn derived(user: &str, key: &str, step: &str) -> String {
        DerivedKey::of(&Key::new(OPERATION, user, key).expect("a key"), step).expect("a derived key").into_string()
    }

    /// (calls, effective calls) each stub saw for the request's derived keys.
    fn seen(served: &Served, user: &str, key: &str) -> [(usize, usize); 2] {
        let charge = served.app.charge.seen(&derived(user, key, "charge"));
        let receipt = served.app.receipt.seen(&derived(user, key, "receipt"));
        [(charge.calls, charge.effective), (receipt.calls, receipt.effective)]
    }

    #[tokio::test]
    async fn steps_in_the_layer_answer_and_replay() {
        let served = serve().await;
        let (user, url) = ("happy", format!("{}/rides", served.url));
        let (status, replayed, body) = send(&url, "k1", user).await;
        assert_eq!((status, replayed), (201, false), "{body}");
        assert_eq!(body["done"], json!(true), "{body}");
        assert_eq!(body["charge"], json!(format!("charge:{}", derived(user, "k1", "charge"))), "{body}");
        let (again, replayed, replay) = send(&url, "k1", user).await;
        assert_eq!((again, replayed, &replay), (201, true, &body));
        assert_eq!(rides(&served, user).await, (1, 1));
        assert_eq!(seen(&served, user, "k1"), [(1, 1), (1, 1)]);
        assert_eq!(record(&served, user, "k1").await.0, "SUCCESS");
    }

    #[tokio::test]
    async fn a_transient_failure_after_a_recovery_point_resumes_there() {
        let served = serve().await;
        let (user, url) = ("resumed", format!("{}/rides", served.url));
        served.app.fail_charge.store(true, Ordering::SeqCst);
        let (status, _, body) = send(&url, "k2", user).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(record(&served, user, "k2").await, ("RESUMABLE".to_owned(), Some(1)), "the ride's recovery point stands");
        assert_eq!(rides(&served, user).await, (1, 0));
        assert_eq!(seen(&served, user, "k2"), [(0, 0), (0, 0)]);

        let (status, replayed, body) = send(&url, "k2", user).await;
        assert_eq!((status, replayed), (201, false), "{body}");
        assert_eq!(body["done"], json!(true), "{body}");
        assert_eq!(rides(&served, user).await, (1, 1), "the ride's row exists once: the retry resumed after it");
        assert_eq!(seen(&served, user, "k2"), [(1, 1), (1, 1)], "one effective call per derived key");
        assert_eq!(record(&served, user, "k2").await.0, "SUCCESS");
        let (again, replayed, replay) = send(&url, "k2", user).await;
        assert_eq!((again, replayed, &replay), (201, true, &body));
    }

    #[tokio::test]
    async fn a_second_steps_is_a_typed_rejection() {
        let served = serve().await;
        let (status, replayed, body) = send(&format!("{}/twice", served.url), "k3", "twice").await;
        assert_eq!((status, replayed, body["type"].as_str()), (500, false, Some(types::NO_STEPS)), "{body}");
        assert!(body["detail"].as_str().is_some_and(|d| d.contains("already taken")), "{body}");
    }
}
