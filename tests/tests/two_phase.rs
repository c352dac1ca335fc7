//! `run_external`, the two-phase flow: the heartbeat keeps a long call's key; a worker that lost
//! its key cannot complete it, and its local writes roll back.

idempotency_testkit::for_each_driver! {
    use idempotency_client::ops::{self, RecoverAction};
    use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, Postgres, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::{charges_for, unique_key};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A handle of the driver under test on a fresh database `name`, and a tokio-postgres pool on
    /// it for the operator's side.
    async fn private(name: &str, lease: Duration) -> (Idem, deadpool_postgres::Pool) {
        let idem = handle_in(name, Settings::builder().lease(lease)).await;
        let operator = Idempotency::<Postgres>::from_url(&idempotency_testkit::database_url(name), 4, Settings::default()).expect("pool");
        (idem, operator.pool().clone())
    }

    /// The local write of the two-phase flow: one row tagged with the key.
    fn record(tag: String) -> impl for<'t> FnMut(&'t mut Conn, &'t StoredResponse) -> TxFuture<'t, (), DbError> + Send {
        move |tx, _response| {
            let tag = tag.clone();
            Box::pin(async move {
                exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, $1)", &[&tag]).await?;
                Ok(())
            })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeat_keeps_the_key_through_a_call_longer_than_the_lease() {
        // A lease that cannot run out on its own while the test looks (15 s; heartbeats 5 s apart):
        // the call outlives its lease by the operator's hand, not by the clock. Twice, the operator
        // ends the lease (lease_expires_at in the past, as after a lease with no beat); a heartbeat
        // renews it (awaited: only a beat writes the record meanwhile); then recovery takes nothing
        // and a duplicate is told the key is in progress, with no second call.
        let lease = Duration::from_secs(15);
        let (idem, operator) = private(&db("idem_two_phase_heartbeat"), lease).await;
        let key = unique_key("external.long");
        let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let recovered = Arc::new(AtomicUsize::new(0));
        let schema = idem.schema().await.unwrap();

        let call = {
            let (idem, key, fp, calls, recovered, operator, schema) =
                (idem.clone(), key.clone(), fp.clone(), calls.clone(), recovered.clone(), operator.clone(), schema.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let client = operator.get().await.unwrap();
                eventually("the call's reservation is recorded", Duration::from_secs(60), || async {
                    match ops::lookup(&client, &schema, &key).await {
                        Ok(Some(r)) if r.status == ops::Status::Processing => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                let live = "SELECT lease_expires_at > clock_timestamp() FROM idem_records WHERE key = $1";
                for round in 1..=2 {
                    let ended = "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = $1";
                    assert_eq!(client.execute(ended, &[&key.key()]).await.unwrap(), 1);
                    assert!(!client.query_one(live, &[&key.key()]).await.unwrap().get::<_, bool>(0), "round {round}: the lease ended");
                    eventually(&format!("round {round}: a heartbeat renews the ended lease"), Duration::from_secs(60), || async {
                        let renewed: bool = client.query_one(live, &[&key.key()]).await.map_err(|e| e.to_string())?.get(0);
                        if renewed { Ok(()) } else { Err("the lease is still over".into()) }
                    })
                    .await;
                    let n = ops::recover_stuck(&client, &schema, 100, RecoverAction::Fail, None).await.unwrap();
                    recovered.fetch_add(n as usize, Ordering::SeqCst);
                    // (Boxed, as the call below: a flow's future inside another's is large for a test
                    // thread's stack in a debug build.)
                    let dup = Box::pin(idem.run_external(&key, &fp, async { Ok::<_, DbError>(StoredResponse::json(201, json!({}))) }, record("dup".into())))
                        .await;
                    assert!(matches!(dup, Err(Error::InProgress { .. })), "round {round}: {dup:?}");
                }
                Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_1"})))
            }
        };
        let outcome = Box::pin(idem.run_external(&key, &fp, Box::pin(call), record(key.to_string()))).await.unwrap();

        assert!(matches!(&outcome, Outcome::Executed(r) if r.body_json().unwrap_or_default()["network_ref"] == "ch_1"));
        assert_eq!(recovered.load(Ordering::SeqCst), 0, "a heartbeating key is never recovered");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let client = operator.get().await.unwrap();
        assert_eq!(charges_for(&client, &key).await, 1);
        assert_eq!(ops::lookup(&client, &schema, &key).await.unwrap().unwrap().status, ops::Status::Success);
        // And the replay does not call out again.
        let again = idem
            .run_external(&key, &fp, async { Ok::<_, DbError>(StoredResponse::json(500, json!({}))) }, record("again".into()))
            .await
            .unwrap();
        assert!(again.is_replayed());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heartbeat_keeps_a_key_whose_ttl_is_above_the_sessions_idempotency_ttl() {
        // Issue 40: the heartbeat's ceiling is the record's own ttl, not the session's
        // idempotency.ttl. The database's idempotency.ttl is 1 s; the handle reserves for an hour
        // with a 15 s lease (within the record's ttl, as idem_reserve requires). The operator
        // ends the lease; a heartbeat must renew it (before the fix every beat was 22023, and
        // the swallowed error let recovery release the key and a duplicate call out again).
        let name = db("idem_two_phase_record_ttl");
        let url = idempotency_testkit::fresh_database(&name).await;
        idempotency_testkit::admin_at(&url)
            .await
            .batch_execute(&format!("ALTER DATABASE {name} SET idempotency.ttl = '1s'"))
            .await
            .unwrap();
        let lease = Duration::from_secs(15);
        let idem = connect_with(&url, 32, Settings::builder().ttl(Duration::from_secs(3600)).lease(lease));
        let operator = Idempotency::<Postgres>::from_url(&url, 4, Settings::default()).expect("pool").pool().clone();
        let key = unique_key("external.record_ttl");
        let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let schema = idem.schema().await.unwrap();

        let call = {
            let (idem, key, fp, calls, operator, schema) =
                (idem.clone(), key.clone(), fp.clone(), calls.clone(), operator.clone(), schema.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let client = operator.get().await.unwrap();
                let ttl: bool = client.query_one("SELECT current_setting('idempotency.ttl') = '1s'", &[]).await.unwrap().get(0);
                assert!(ttl, "the session's idempotency.ttl is 1 s");
                eventually("the call's reservation is recorded", Duration::from_secs(60), || async {
                    match ops::lookup(&client, &schema, &key).await {
                        Ok(Some(r)) if r.status == ops::Status::Processing => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                let own_ttl = "SELECT expires_at - created_at = interval '1 hour' FROM idem_records WHERE key = $1";
                assert!(client.query_one(own_ttl, &[&key.key()]).await.unwrap().get::<_, bool>(0), "the record's own ttl");
                let ended = "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = $1";
                assert_eq!(client.execute(ended, &[&key.key()]).await.unwrap(), 1);
                let live = "SELECT lease_expires_at > clock_timestamp() FROM idem_records WHERE key = $1";
                eventually("a heartbeat renews the ended lease", Duration::from_secs(60), || async {
                    let renewed: bool = client.query_one(live, &[&key.key()]).await.map_err(|e| e.to_string())?.get(0);
                    if renewed { Ok(()) } else { Err("the lease is still over".into()) }
                })
                .await;
                let n = ops::recover_stuck(&client, &schema, 100, RecoverAction::Release, None).await.unwrap();
                assert_eq!(n, 0, "a heartbeating key is never recovered");
                let dup = Box::pin(idem.run_external(&key, &fp, async { Ok::<_, DbError>(StoredResponse::json(201, json!({}))) }, record("dup".into())))
                    .await;
                assert!(matches!(dup, Err(Error::InProgress { .. })), "{dup:?}");
                Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_2"})))
            }
        };
        let outcome = Box::pin(idem.run_external(&key, &fp, Box::pin(call), record(key.to_string()))).await.unwrap();

        assert!(matches!(&outcome, Outcome::Executed(r) if r.body_json().unwrap_or_default()["network_ref"] == "ch_2"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let client = operator.get().await.unwrap();
        assert_eq!(charges_for(&client, &key).await, 1);
    }

    /// The client's events at warn level and above, as (level, message, sqlstate), seen by a
    /// subscriber set as this thread's default: the test runs on a current-thread runtime, so
    /// the heartbeat task it spawns reports here too.
    #[derive(Clone, Default)]
    struct Events(Arc<std::sync::Mutex<Vec<(tracing::Level, String, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Events {
        fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            struct Fields(String, String);
            impl tracing::field::Visit for Fields {
                fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                    if field.name() == "sqlstate" {
                        self.1 = value.to_owned();
                    }
                }
                fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                    if field.name() == "message" {
                        self.0 = format!("{value:?}");
                    }
                }
            }
            let meta = event.metadata();
            if meta.target().starts_with("idempotency_client") && *meta.level() <= tracing::Level::WARN {
                let mut fields = Fields(String::new(), String::new());
                event.record(&mut fields);
                self.0.lock().unwrap().push((*meta.level(), fields.0, fields.1));
            }
        }
    }

    impl Events {
        fn refused(&self) -> Vec<String> {
            let seen = self.0.lock().unwrap();
            seen.iter().filter(|(level, message, _)| *level == tracing::Level::ERROR && message.contains("heartbeat was refused"))
                .map(|(_, _, sqlstate)| sqlstate.clone())
                .collect()
        }
    }

    #[tokio::test]
    async fn a_refused_heartbeat_is_traced_at_error_level_and_stops_and_a_lapsed_lease_is_lost() {
        // Issue 40: the heartbeat task swallowed every error. A beat the server refuses (here
        // 22023: the record, 1 s from its expiry, cannot take a 3 s lease under a session whose
        // idempotency.ttl is 1 s) is traced at error level once and ends the task; the lease
        // lapses, recovery releases the key, and run_external answers LeaseLost (the fence).
        use tracing_subscriber::layer::SubscriberExt;
        let events = Events::default();
        let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(events.clone()));
        let name = db("idem_two_phase_refused_beat");
        let url = idempotency_testkit::fresh_database(&name).await;
        idempotency_testkit::admin_at(&url)
            .await
            .batch_execute(&format!("ALTER DATABASE {name} SET idempotency.ttl = '1s'"))
            .await
            .unwrap();
        let lease = Duration::from_secs(3);
        let idem = connect_with(&url, 8, Settings::builder().ttl(Duration::from_secs(3600)).lease(lease));
        let operator = Idempotency::<Postgres>::from_url(&url, 2, Settings::default()).expect("pool").pool().clone();
        let key = unique_key("external.refused_beat");
        let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
        let schema = idem.schema().await.unwrap();

        let call = {
            let (key, operator, schema, events) = (key.clone(), operator.clone(), schema.clone(), events.clone());
            async move {
                let client = operator.get().await.unwrap();
                eventually("the call's reservation is recorded", Duration::from_secs(60), || async {
                    match ops::lookup(&client, &schema, &key).await {
                        Ok(Some(r)) if r.status == ops::Status::Processing => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                let near = "UPDATE idem_records SET expires_at = clock_timestamp() + interval '1 second' WHERE key = $1";
                assert_eq!(client.execute(near, &[&key.key()]).await.unwrap(), 1);
                eventually("a refused heartbeat is traced at error level", Duration::from_secs(60), || async {
                    let refused = events.refused();
                    if refused.is_empty() { Err("no event yet".to_owned()) } else { Ok(()) }
                })
                .await;
                // Three more beats' worth of time: a task that kept beating would be refused again.
                tokio::time::sleep(lease).await;
                let lapsed = "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = $1";
                assert_eq!(client.execute(lapsed, &[&key.key()]).await.unwrap(), 1);
                let n = ops::recover_stuck(&client, &schema, 100, RecoverAction::Release, None).await.unwrap();
                assert_eq!(n, 1, "the lapsed lease is recovered");
                Ok::<_, DbError>(StoredResponse::json(201, json!({"network_ref": "ch_3"})))
            }
        };
        let outcome = Box::pin(idem.run_external(&key, &fp, Box::pin(call), record(key.to_string()))).await;

        assert!(matches!(outcome, Err(Error::LeaseLost { .. })), "{outcome:?}");
        assert_eq!(events.refused(), vec!["22023".to_owned()], "one refused beat, then no more");
        let client = operator.get().await.unwrap();
        assert_eq!(charges_for(&client, &key).await, 0, "the local write rolled back");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_that_lost_its_key_cannot_complete_it() {
        let lease = Duration::from_millis(300);
        let (idem, operator) = private(&db("idem_two_phase_lost"), lease).await;
        let key = unique_key("external.lost");
        let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
        let schema = idem.schema().await.unwrap();

        // While the worker is out calling, its lease is cut short (as if its heartbeats had stopped
        // reaching the database), the key is recovered and a new attempt takes it over.
        let call = {
            let (pool, key, schema) = (operator.clone(), key.clone(), schema.clone());
            async move {
                let mut client = pool.get().await.unwrap();
                // The reservation the call runs under, committed.
                eventually("the worker's reservation is recorded", Duration::from_secs(30), || async {
                    match ops::lookup(&client, &schema, &key).await {
                        Ok(Some(r)) if r.status == ops::Status::Processing => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await;
                // In one transaction, so a heartbeat in between cannot renew the lease.
                let tx = client.transaction().await.unwrap();
                tx.execute(
                    "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second', \
                     expires_at = clock_timestamp() - interval '1 second' WHERE key = $1",
                    &[&key.key()],
                )
                .await
                .unwrap();
                assert_eq!(ops::recover_stuck(&tx, &schema, 10, RecoverAction::Release, None).await.unwrap(), 1);
                tx.commit().await.unwrap();
                let newer = ops::reserve(&client, &schema, &key, &Fingerprint::of_bytes(b"other-request"), &ops::ReserveOptions::default()).await.unwrap();
                assert!(matches!(newer.outcome, ops::ReserveOutcome::Created(_)));
                Ok::<_, DbError>(StoredResponse::json(201, json!({"late": true})))
            }
        };
        let err = idem.run_external(&key, &fp, call, record(key.to_string())).await.unwrap_err();
        assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
        assert_eq!(idempotency_tower::http_status(&err), 409);
        let client = operator.get().await.unwrap();
        assert_eq!(charges_for(&client, &key).await, 0, "the stale worker's local write rolled back");
        let record = ops::lookup(&client, &schema, &key).await.unwrap().unwrap();
        let other = Fingerprint::of_bytes(b"other-request");
        assert_eq!((record.status, record.request_hash.as_str()), (ops::Status::Processing, other.as_str()));
    }

    #[tokio::test]
    async fn external_transient_failures_release_and_permanent_ones_are_stored() {
        let (idem, _operator) = private(&db("idem_two_phase_failures"), Duration::from_secs(5)).await;
        let key: Key = unique_key("external.failures");
        let fp = Fingerprint::of_json(&json!({"a": 1})).unwrap();
        let ok = || async { Ok::<_, DbError>(StoredResponse::json(502, json!({"upstream": "down"}))) };
        let out = idem.run_external(&key, &fp, ok(), record("x".into())).await.unwrap();
        assert!(matches!(out, Outcome::Released(_)), "a 5xx from the outside call releases the key");
        let declined = || async { Ok::<_, DbError>(StoredResponse::json(402, json!({"error": "declined"}))) };
        let out = idem.run_external(&key, &fp, declined(), record("y".into())).await.unwrap();
        assert!(matches!(&out, Outcome::Executed(r) if r.status == 402));
        let err = idem.run_external(&key, &fp, ok(), record("z".into())).await.unwrap_err();
        assert!(matches!(&err, Error::Failed { response: Some(r) } if r["status"] == 402), "{err:?}");
    }
}
