//! The canonical form's bound through the layer, over real HTTP and the test kit's driver
//! (both, from one binary: `over_postgres::`, `over_sqlx::`): a JSON body whose numbers would write out
//! past 16 bytes per byte plus 8 KiB (`{"a":1e60000000}`) is answered 422 problem+json before
//! anything is reserved or run; a body within the bound, a body that is not JSON, and the same
//! bytes sent as another content type still run.

idempotency_testkit::for_each_driver! {
    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::routing::post;
    use axum::Router;
    use idempotency_tower::{problem::types, IdempotencyLayer, Mode};
    use idempotency_client::Settings;

    use serde_json::Value;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Answer {
        status: StatusCode,
        content_type: String,
        body: Value,
    }

    /// Serves `POST /charges` behind the layer in `mode`, anonymous; the handler only counts its runs.
    async fn serve(mode: Mode) -> (String, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::builder(handle(Settings::default()).await).mode(mode).anonymous().build().expect("layer");
        let handler = |State(runs): State<Arc<AtomicUsize>>| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, "charged")
        };
        let router = Router::new().route("/charges", post(handler)).route_layer(layer).with_state(runs.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        (url, runs)
    }

    async fn send(url: &str, key: &str, content_type: &str, body: &str) -> Answer {
        let resp = reqwest::Client::new()
            .post(url)
            .header("content-type", content_type)
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .expect("request");
        let status = resp.status();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let text = resp.text().await.unwrap_or_default();
        Answer { status, content_type, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) }
    }

    /// How many records the key has, whatever its operation and user.
    async fn records(key: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM idem_records WHERE key = $1", &[&key]).await.unwrap().get("n")
    }

    async fn bound_through_the_layer(mode: Mode) {
        let (url, runs) = serve(mode).await;
        let key = format!("fingerprint-bound-{mode:?}");
        let json = "application/json";

        let refused = send(&url, &key, json, r#"{"a":1e60000000}"#).await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", refused.body);
        assert_eq!(refused.content_type, "application/problem+json");
        assert_eq!(refused.body["type"], types::FINGERPRINT_LIMIT);
        assert_eq!(refused.body["status"], 422);
        let detail = refused.body["detail"].as_str().unwrap_or_default();
        // 16 bytes: 16 × 16 + 8192.
        assert!(detail.contains("would exceed 8448 bytes, the limit for a text of 16 bytes"), "{detail}");
        // Many numbers, each allowed alone, together over the bound.
        let many = format!("[{}]", vec!["1e90"; 10_000].join(","));
        assert_eq!(send(&url, &key, json, &many).await.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(runs.load(Ordering::SeqCst), 0, "a refused body never reaches the handler");
        assert_eq!(records(&key).await, 0, "nor reserves its key");

        // The same key then serves a body within the bound, once; its retry replays.
        let allowed = r#"{"a":1e8000}"#;
        assert_eq!(send(&url, &key, json, allowed).await.status, StatusCode::CREATED);
        let replay = send(&url, &key, json, &format!("{{\"a\":1{}}}", "0".repeat(8000))).await;
        assert_eq!(replay.status, StatusCode::CREATED, "the same number written out is the same request");
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // As before: a body that is not JSON by its content type, or not valid JSON, is hashed as
        // its bytes and runs.
        let other = format!("{key}-text");
        assert_eq!(send(&url, &other, "text/plain", r#"{"a":1e60000000}"#).await.status, StatusCode::CREATED);
        let invalid = format!("{key}-invalid");
        assert_eq!(send(&url, &invalid, json, r#"{"a":1e60000000,}"#).await.status, StatusCode::CREATED);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_body_over_the_bound_is_422_in_transaction() {
        bound_through_the_layer(Mode::InTransaction).await;
    }

    #[tokio::test]
    async fn a_body_over_the_bound_is_422_two_phase() {
        bound_through_the_layer(Mode::TwoPhase).await;
    }
}
