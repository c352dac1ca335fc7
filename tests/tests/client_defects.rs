//! The client API defects (wrong errors, names outside their ecosystem, extra round trips), one test each; each failed against the API before the fix
//! (commit b0a1f05 holds their first form, written against that API).

idempotency_testkit::for_each_driver! {
    use idempotency_client::ops::{self, ReserveOptions};
    use idempotency_client::{Error, Fingerprint, HandlerError, Outcome, Settings, StoredResponse, TxFuture};

    use idempotency_testkit::{charges_for, unique_key};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Raises a real SQLSTATE 40001 from a statement.
    const SERIALIZATION_FAILURE: &str =
        "DO $$ BEGIN RAISE EXCEPTION 'forced serialization failure' USING ERRCODE = 'serialization_failure'; END $$";

    fn fp() -> Fingerprint {
        Fingerprint::of_json(&json!({"amount": 1})).unwrap()
    }

    /// Defect 1: a 40001 raised inside the closure retries the whole transaction and never counts
    /// as a transient failure of the key.
    #[tokio::test]
    async fn serialization_failure_inside_the_closure_retries_the_transaction_without_counting() {
        let idem = handle(Settings::builder().max_retries(3)).await;
        let key = unique_key("defect.closure_40001");
        let runs = Arc::new(AtomicUsize::new(0));
        let out = idem
            .run(&key, &fp(), {
                let (runs, tag) = (runs.clone(), key.to_string());
                move |tx| {
                    let (runs, tag) = (runs.clone(), tag.clone());
                    Box::pin(async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst);
                        exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
                        if n < 3 {
                            batch(tx, SERIALIZATION_FAILURE).await?;
                        }
                        Ok(StoredResponse::json(201, json!({"run": n})))
                    }) as TxFuture<'_, _, DbError>
                }
            })
            .await;
        assert!(matches!(&out, Ok(Outcome::Executed(_))), "{out:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 4, "three serialization failures, then the run that commits");
        let admin = admin().await;
        assert_eq!(charges_for(&admin, &key).await, 1, "only the committed run's write is kept");
        let schema = idem.schema().await.unwrap();
        let again = ops::reserve(&admin, &schema, &key, &fp(), &ReserveOptions::default()).await.unwrap();
        assert_eq!(again.outcome, ops::ReserveOutcome::Replay(Some(json!({"status": 201, "headers": [], "body": {"run": 3}}))));
        assert_eq!(again.attempts, 0, "a serialization failure is not a failure of the key");
    }

    /// Defect 2: an undefined function in the caller's own SQL is a database error, not
    /// `IncompatibleExtension`.
    #[tokio::test]
    async fn an_undefined_function_in_the_callers_sql_is_not_extension_missing() {
        let url = test_database().await;
        let db_error = error_of(url, "SELECT no_such_function_in_your_schema()").await;
        let err: Error = db_error.into();
        assert!(matches!(err, Error::Database(_)), "{err:?}");
        assert_eq!(err.sqlstate(), Some("42883"));

        // Through `run`, with a closure whose error type is the crate's own: a handler error.
        let idem = handle(Settings::default()).await;
        let key = unique_key("defect.undefined_in_closure");
        let err = idem
            .run(&key, &fp(), |tx| {
                Box::pin(async move {
                    exec(tx, "SELECT no_such_function_in_your_schema()", &[]).await?;
                    Ok(StoredResponse::json(201, json!({})))
                }) as TxFuture<'_, _, Box<dyn std::error::Error + Send + Sync>>
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Handler { .. }), "{err:?}");

        // Our own statement without the extension is still `IncompatibleExtension`, with its source.
        use std::error::Error as _;
        let wrong = connect_with(url, 2, Settings::builder().schema("pg_catalog"));
        let err = wrong.run(&key, &fp(), |_tx| Box::pin(async { Ok(StoredResponse::json(201, json!({}))) }) as TxFuture<'_, _, DbError>).await.unwrap_err();
        assert!(matches!(err, Error::IncompatibleExtension { source: Some(_), .. }), "{err:?}");
        assert!(err.source().is_some_and(|s| s.is::<DbError>()));
    }

    /// The local write of the two-phase flow: one row tagged with the key; its first `failures`
    /// runs then raise a serialization failure (`usize::MAX`: every run fails with 42P01).
    fn record(
        tag: String,
        runs: Arc<AtomicUsize>,
        failures: usize,
    ) -> impl for<'t> FnMut(&'t mut Conn, &'t StoredResponse) -> TxFuture<'t, (), DbError> + Send {
        move |tx, _response| {
            let (tag, runs) = (tag.clone(), runs.clone());
            Box::pin(async move {
                if failures == usize::MAX {
                    batch(tx, "INSERT INTO no_such_table VALUES (1)").await?;
                }
                exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
                if runs.fetch_add(1, Ordering::SeqCst) < failures {
                    batch(tx, SERIALIZATION_FAILURE).await?;
                }
                Ok(())
            })
        }
    }

    /// Defect 3: after the outside call succeeded, a transient failure of the local transaction is
    /// retried; the outside call never runs twice and its result is recorded.
    #[tokio::test]
    async fn run_external_retries_the_local_transaction_after_a_transient_error() {
        let idem = handle(Settings::builder().lease(Duration::from_secs(5))).await;
        let key = unique_key("defect.record_40001");
        let calls = Arc::new(AtomicUsize::new(0));
        let call = {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_1"})))
            }
        };
        let attempts = Arc::new(AtomicUsize::new(0));
        let out = idem.run_external(&key, &fp(), call, record(key.to_string(), attempts.clone(), 1)).await;
        assert!(matches!(&out, Ok(Outcome::Executed(_))), "{out:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(attempts.load(Ordering::SeqCst), 2, "the local transaction ran twice, the outside call once");
        let admin = admin().await;
        assert_eq!(charges_for(&admin, &key).await, 1);
        let schema = idem.schema().await.unwrap();
        assert_eq!(ops::lookup(&admin, &schema, &key).await.unwrap().unwrap().status, ops::Status::Success);
    }

    /// Defect 3: when the local write fails for good, the key is not left to be recovered as a
    /// failure: it holds the outside result, so a retry replays it and never calls out again.
    #[tokio::test]
    async fn run_external_keeps_the_outside_result_when_the_local_write_fails() {
        let idem = handle(Settings::builder().lease(Duration::from_secs(5))).await;
        let key = unique_key("defect.record_fails");
        let call = async { Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_2"}))) };
        let err = idem.run_external(&key, &fp(), call, record(key.to_string(), Arc::default(), usize::MAX)).await.unwrap_err();
        match &err {
            Error::RecordFailed { response, key_completed: true, error } => {
                assert_eq!(response["body"]["network_ref"], "ch_2");
                assert!(matches!(**error, Error::Handler { .. }), "{error:?}");
            }
            other => panic!("{other:?}"),
        }
        let admin = admin().await;
        let schema = idem.schema().await.unwrap();
        let stored = ops::lookup(&admin, &schema, &key).await.unwrap().unwrap();
        assert_eq!(stored.status, ops::Status::Success, "{err:?}: the outside call happened; its result is kept");
        assert_eq!(stored.response.unwrap()["body"]["network_ref"], "ch_2");
        // A retry replays the result and never calls out again.
        let again = idem
            .run_external(&key, &fp(), async { panic!("called out twice") }, record(key.to_string(), Arc::default(), 0))
            .await
            .unwrap();
        assert!(matches!(&again, Outcome::Replayed(r) if r.body_json().unwrap_or_default()["network_ref"] == "ch_2"), "{again:?}");
        assert_eq!(charges_for(&admin, &key).await, 0);
    }

    /// Defect 4: the transient result that poisons the key is not reported as released.
    #[tokio::test]
    async fn the_transient_result_that_poisons_the_key_is_not_reported_as_released() {
        let idem = handle(Settings::builder().max_retries(1)).await;
        let key = unique_key("defect.poison_outcome");
        let out: Outcome<StoredResponse> = idem
            .run(&key, &fp(), |_tx| Box::pin(async { Ok(StoredResponse::json(503, json!({}))) }) as TxFuture<'_, _, DbError>)
            .await
            .unwrap();
        let schema = idem.schema().await.unwrap();
        assert_eq!(ops::lookup(&admin().await, &schema, &key).await.unwrap().unwrap().status, ops::Status::Failed);
        assert!(matches!(out, Outcome::Poisoned(ref r) if r.status == 503), "a poisoned key reported as released: {out:?}");

        // A transient handler error says so too.
        let key = unique_key("defect.poison_error");
        let err = idem
            .run(&key, &fp(), |_tx| Box::pin(async { Err::<StoredResponse, _>("upstream timeout") }) as TxFuture<'_, _, &str>)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Poisoned { .. }), "{err:?}");
    }

    /// Defect 5: a malformed URL is a configuration error, and errors keep their sources.
    #[tokio::test]
    async fn errors_keep_their_sources_and_a_bad_url_is_a_configuration_error() {
        use std::error::Error as _;
        let bad = try_connect_with("postgresql://127.0.0.1:not-a-port/db", 2, Settings::default());
        assert!(matches!(bad, Err(Error::Configuration { source: Some(_), .. })), "a malformed URL is not the store being down: {:?}", bad.err());

        let down = store_down(2);
        let err = down.check_extension().await.unwrap_err();
        assert!(matches!(err, Error::StoreUnavailable(_)), "{err:?}");
        let source = err.source().expect("StoreUnavailable keeps its source");
        assert!(source.is::<deadpool_postgres::PoolError>() || source.is::<DbError>(), "{source:?}");

        // A stored response that does not decode as the caller's type.
        let idem = handle(Settings::default()).await;
        let key = unique_key("defect.decode");
        idem.run(&key, &fp(), |_tx| Box::pin(async { Ok(StoredResponse::json(201, json!({}))) }) as TxFuture<'_, _, DbError>)
            .await
            .unwrap();
        let err = idem
            .run(&key, &fp(), |_tx| Box::pin(async { Ok(7i64) }) as TxFuture<'_, i64, DbError>)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err:?}");
        assert!(err.source().is_some_and(|s| s.is::<serde_json::Error>()), "Decode keeps the serde error: {err:?}");
    }

    /// Defect 5: an answer the client does not understand is a protocol error, not a missing
    /// extension. A schema whose `idem_reserve` answers an unknown word stands in for a skewed server.
    #[tokio::test]
    async fn an_unexpected_answer_is_a_protocol_error() {
        let admin = admin().await;
        admin
            .batch_execute(
                "CREATE SCHEMA IF NOT EXISTS skewed;
                 CREATE OR REPLACE FUNCTION skewed.idem_reserve(operation text, user_id text, key text, request_hash text,
                     ttl interval DEFAULT NULL, lease interval DEFAULT NULL, wait boolean DEFAULT false)
                 RETURNS TABLE (outcome text, token bigint, response jsonb, attempts int, expires_at timestamptz)
                 LANGUAGE sql AS $$ SELECT 'maybe'::text, NULL::bigint, NULL::jsonb, 0, NULL::timestamptz $$;",
            )
            .await
            .unwrap();
        let skewed = idempotency_client::Schema::named("skewed").unwrap();
        let key = unique_key("defect.protocol");
        let err = ops::reserve(&admin, &skewed, &key, &fp(), &ReserveOptions::default()).await.unwrap_err();
        assert!(matches!(&err, Error::Protocol { reason, .. } if reason.contains("maybe")), "{err:?}");
        // The same through the driver under test (the two-phase flow's reservation is the only
        // statement it sends first).
        let idem = connect_with(test_database().await, 2, Settings::builder().schema("skewed"));
        let call = async { Ok::<_, DbError>(StoredResponse::json(201, json!({}))) };
        let err = idem.run_external(&key, &fp(), call, |_, _| Box::pin(async { Ok(()) })).await.unwrap_err();
        assert!(matches!(&err, Error::Protocol { reason, .. } if reason.contains("maybe")), "{err:?}");
    }

    /// A server that cannot take writes (a standby after a failover, or a read-only database)
    /// refuses with 25006: the client reports `StoreUnavailable` (a retry after the failover reaches
    /// the new primary), and the source says why.
    #[tokio::test]
    async fn a_read_only_server_is_store_unavailable() {
        let name = db("idem_read_only");
        let url = idempotency_testkit::fresh_database(&name).await;
        idempotency_testkit::admin_at(&url).await.batch_execute(&format!("ALTER DATABASE {name} SET default_transaction_read_only = on")).await.unwrap();
        let idem = connect_with(&url, 2, Settings::default());
        let key = unique_key("defect.read_only");
        let runs = Arc::new(AtomicUsize::new(0));
        let err = idem
            .run(&key, &fp(), {
                let runs = runs.clone();
                move |_tx: &mut Conn| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Box::pin(async { Ok(StoredResponse::json(201, json!({}))) }) as TxFuture<'_, _, DbError>
                }
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::StoreUnavailable(_)), "{err:?}");
        let source = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<DbError>());
        assert_eq!(source.and_then(HandlerError::sqlstate), Some("25006"), "the source is the server's refusal: {err:?}");
        assert!(source.is_some_and(|e| format!("{e:?}").contains("read-only transaction")), "{err:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    }
}
