//! The replay cache ([`ReplayCache`], `Settings::replay_cache`) through the client against the
//! private cluster, over both drivers (`over_postgres::`, `over_sqlx::`): a replay from memory
//! costs no round trip (the test kit's counting proxy proves it) and no pooled connection; a
//! reuse with another body still reaches the database and is a mismatch; an expired record is
//! not served; a FAILED record answers as stored; a record removed by hand is still replayed until
//! its entry's ttl (the documented trade); the capacity evicts; `run_external` and the layer
//! (both modes) replay from memory; 64 concurrent duplicates still run once with the cache on.
//! Replay first (`Settings::replay_first`, issue 43 item 3): a replay, a mismatch and a stored
//! failure answered by `idem_replay` in one round trip; a fresh key and a key in progress fall
//! through to the reservation (one round trip more); the answer fills the cache.

idempotency_testkit::for_each_driver! {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::post;
    use axum::Router;
    use idempotency_tower::{IdempotencyLayer, Mode, Transaction};
    use idempotency_client::{Error, Fingerprint, Outcome, ReplayCache, Settings, SettingsBuilder, StoredResponse, TxFuture};
    use idempotency_testkit::proxy::Proxy;
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::{charges_for, cluster_addr, unique_key, Failure};
    use serde_json::{json, Value};
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn fp(v: Value) -> Fingerprint {
        Fingerprint::of_json(&v).expect("fingerprint")
    }

    /// A cache and settings that use it (the record's ttl left to the server unless set after).
    fn cached(entries: usize, ttl: Duration) -> (ReplayCache, SettingsBuilder) {
        let cache = ReplayCache::new(entries, ttl);
        (cache.clone(), Settings::builder().replay_cache(cache))
    }

    /// A handle on this process's test database through a new round-trip counting proxy.
    async fn through_proxy(settings: impl Into<Settings>, pool: u32) -> (Idem, Proxy) {
        let url = test_database().await;
        let db = url.rsplit('/').next().expect("a database name");
        let proxy = Proxy::start(cluster_addr(), None).await;
        (connect_with(&proxy.url(db), pool, settings), proxy)
    }

    /// `f`'s answer and the round trips the proxy counted while it ran.
    async fn counted<T>(proxy: &Proxy, f: impl Future<Output = T>) -> (T, u64) {
        let before = proxy.round_trips();
        let out = f.await;
        (out, proxy.round_trips() - before)
    }

    #[tokio::test]
    async fn a_replay_from_memory_costs_no_round_trip_and_no_connection() {
        let (cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 1).await;
        let key = unique_key("cache.hit");
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        let first = idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        assert!(first.is_executed(), "{first:?}");

        let (second, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        let second = second.unwrap();
        assert_eq!(trips, 0, "a replay from memory sends nothing");
        assert!(second.is_replayed(), "{second:?}");
        assert_eq!(second.value(), first.value(), "the stored response");
        assert_eq!(second.decision().as_str(), "replayed", "as a replay from the database is labelled");

        // The pool's one connection is held elsewhere, and stays held until the hit has answered: a
        // hit that wanted a connection could only fail (the pool's wait ends in StoreUnavailable) or
        // never answer (the deadline, a hang guard far above the pool's wait, fails the test).
        let held = hold_a_connection(&idem).await;
        let (third, trips) = counted(&proxy, tokio::time::timeout(Duration::from_secs(60), idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)))).await;
        let third = third.expect("a hit answers while the pool's one connection is held").expect("a hit takes no pooled connection");
        assert!(third.is_replayed());
        assert_eq!(trips, 0, "nor a round trip");
        drop(held);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(charges_for(&admin().await, &key).await, 1);
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.entries), (2, 1), "{stats:?}");
    }

    #[tokio::test]
    async fn a_replay_from_the_database_fills_the_cache() {
        // Executed through a handle without a cache: the first replay comes from the database and
        // is kept, the next from memory.
        let key = unique_key("cache.fill");
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        let plain = connect_with(test_database().await, 2, Settings::default());
        plain.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();

        let (cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let (from_db, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(from_db.unwrap().is_replayed());
        assert!(trips > 0, "the first replay reaches the database");
        let (from_memory, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(from_memory.unwrap().is_replayed());
        assert_eq!(trips, 0, "the second is answered from memory");
        assert_eq!((runs.load(Ordering::SeqCst), cache.stats().hits), (1, 1));
    }

    #[tokio::test]
    async fn another_body_still_reaches_the_database_and_is_a_mismatch() {
        let (_cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let key = unique_key("cache.mismatch");
        let runs = Arc::new(AtomicUsize::new(0));
        idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        let (err, trips) = counted(&proxy, idem.run(&key, &fp(json!({"amount": 200})), Charge::of(&key).handler::<Failure>(&runs))).await;
        let err = err.unwrap_err();
        assert!(matches!(err, Error::Mismatch), "{err:?}");
        assert_eq!(idempotency_tower::http_status(&err), 422);
        assert!(trips > 0, "the mismatch is the database's answer");
        // The original request still replays from memory.
        let (again, trips) = counted(&proxy, idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(again.unwrap().is_replayed());
        assert_eq!((trips, runs.load(Ordering::SeqCst)), (0, 1));
    }

    #[tokio::test]
    async fn an_expired_record_is_not_served_from_memory() {
        // The cache would keep the answer a minute; the record expires after 1 s, and so does
        // its entry: the key is then taken over and runs again.
        let (cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings.ttl(Duration::from_secs(1)), 2).await;
        let key = unique_key("cache.expiry");
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        let (hit, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(hit.unwrap().is_replayed() && trips == 0, "served from memory before the record's expiry");
        let out = eventually("the record expires and the key runs again", Duration::from_secs(10), || async {
            match idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await {
                Ok(Outcome::Executed(v)) => Ok(v),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert_eq!(out.body.json().map(|b| b["run"].clone()), Some(json!(2)), "{out:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(cache.stats().misses >= 1);
    }

    #[tokio::test]
    async fn a_failed_record_is_answered_as_stored() {
        let (_cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let plain = connect_with(test_database().await, 2, Settings::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));

        // A 4xx result: executed, committed as FAILED, kept on completion.
        let key = unique_key("cache.failed.result");
        let first = idem.run(&key, &body, Charge::of(&key).status(402).handler::<Failure>(&runs)).await.unwrap();
        assert!(first.is_executed());
        let (from_memory, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert_eq!(trips, 0);
        let from_db = plain.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await;
        match (&from_memory, &from_db) {
            (Err(Error::Failed { response: Some(memory) }), Err(Error::Failed { response: Some(db) })) => assert_eq!(memory, db),
            other => panic!("both answer the stored failure: {other:?}"),
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // A permanent error: FAILED with its response, kept at its first replay from the database.
        let key = unique_key("cache.failed.error");
        let declined = json!({"status": 402, "body": "declined"});
        let err = idem.run(&key, &body, Charge::of(&key).failing(&runs, Failure(Some(declined.clone())))).await.unwrap_err();
        assert!(matches!(err, Error::Handler { .. }), "{err:?}");
        for expected_trips in [true, false] {
            let (answer, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
            match answer {
                Err(Error::Failed { response }) => assert_eq!(response, Some(declined.clone())),
                other => panic!("the stored failure: {other:?}"),
            }
            assert_eq!(trips > 0, expected_trips, "from the database, then from memory");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_record_removed_by_hand_is_replayed_until_its_entry_expires() {
        // The documented trade: the cache does not see the database change.
        // (The entry lives 3 s: the delete and the next call happen well within it.)
        let (_cache, settings) = cached(100, Duration::from_secs(3));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let key = unique_key("cache.deleted");
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        let admin = admin().await;
        idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        let deleted = admin
            .execute("DELETE FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3", &[&key.operation(), &key.user_id(), &key.key()])
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        let (stale, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(stale.unwrap().is_replayed() && trips == 0, "still replayed from memory");
        eventually("the entry's ttl passes and the key runs again", Duration::from_secs(10), || async {
            match idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await {
                Ok(Outcome::Executed(_)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_capacity_evicts() {
        let (cache, settings) = cached(1, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        let (a, b) = (unique_key("cache.capacity"), unique_key("cache.capacity"));
        idem.run(&a, &body, Charge::of(&a).handler::<Failure>(&runs)).await.unwrap();
        idem.run(&b, &body, Charge::of(&b).handler::<Failure>(&runs)).await.unwrap();
        let stats = cache.stats();
        assert_eq!((stats.entries, stats.evictions), (1, 1), "{stats:?}");
        let (b_again, trips) = counted(&proxy, idem.run(&b, &body, Charge::of(&b).handler::<Failure>(&runs))).await;
        assert!(b_again.unwrap().is_replayed() && trips == 0, "the newest is held");
        let (a_again, trips) = counted(&proxy, idem.run(&a, &body, Charge::of(&a).handler::<Failure>(&runs))).await;
        assert!(a_again.unwrap().is_replayed(), "replayed by the database");
        assert!(trips > 0, "the evicted one reached the database");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn run_external_replays_from_memory_without_calling_out() {
        let (_cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings, 2).await;
        let key = unique_key("cache.external");
        let calls = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        let outside = |calls: Arc<AtomicUsize>| async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<_, Failure>(StoredResponse::json(201, json!({"call": n})))
        };
        let first = idem.run_external(&key, &body, outside(calls.clone()), nothing).await.unwrap();
        assert!(first.is_executed());
        let (second, trips) = counted(&proxy, idem.run_external(&key, &body, outside(calls.clone()), nothing)).await;
        let second = second.unwrap();
        assert!(second.is_replayed() && trips == 0, "{second:?} after {trips} round trips");
        assert_eq!(second.value(), first.value());
        let (other, trips) = counted(&proxy, idem.run_external(&key, &fp(json!({"amount": 1})), outside(calls.clone()), nothing)).await;
        assert!(matches!(other, Err(Error::Mismatch)) && trips > 0, "{other:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// The two-phase record step that writes nothing locally.
    fn nothing<'t>(_: &'t mut Conn, _: &'t StoredResponse) -> TxFuture<'t, (), Failure> {
        Box::pin(async { Ok(()) })
    }

    /// The work of a call that must be a replay.
    fn never(_: &mut Conn) -> TxFuture<'_, StoredResponse, Failure> {
        panic!("a replay never runs the work")
    }

    /// `POST /charges` behind a layer in `mode` on `idem` (the user from `X-User`): in-transaction
    /// the route writes a charge through the request's transaction; two-phase it writes nothing.
    async fn serve(idem: Idem, mode: Mode, runs: Arc<AtomicUsize>) -> String {
        let layer = IdempotencyLayer::builder(idem)
            .mode(mode)
            .user(|req| req.headers.get("x-user")?.to_str().ok().map(str::to_owned))
            .build()
            .expect("layer");
        let router = match mode {
            Mode::InTransaction => Router::new().route(
                "/charges",
                post(move |tx: Transaction<TestDriver>, body: String| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let id = query_i64_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('layer', 1, $1) RETURNING id", &[&body]).await.unwrap();
                    (StatusCode::CREATED, axum::Json(json!({"id": id, "run": n}))).into_response()
                }),
            ),
            _ => Router::new().route(
                "/charges",
                post(move |_body: String| async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, axum::Json(json!({"run": n}))).into_response()
                }),
            ),
        };
        let router = router.route_layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/charges", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        url
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_layer_inherits_the_cache_in_both_modes() {
        for mode in [Mode::InTransaction, Mode::TwoPhase] {
            let (cache, settings) = cached(100, Duration::from_secs(60));
            let (idem, proxy) = through_proxy(settings, 4).await;
            let runs = Arc::new(AtomicUsize::new(0));
            let url = serve(idem, mode, runs.clone()).await;
            let http = reqwest::Client::new();
            let key = format!("layer-cache-{mode:?}-{}", std::process::id());
            let post = |body: &'static str| http.post(&url).header("idempotency-key", &key).header("x-user", "u1").body(body).send();
            let first = post("{\"amount\": 1}").await.unwrap();
            assert_eq!(first.status(), 201, "{mode:?}");
            assert!(first.headers().get("idempotent-replayed").is_none());
            let first: Value = first.json().await.unwrap();

            let (second, trips) = counted(&proxy, post("{\"amount\": 1}")).await;
            let second = second.unwrap();
            assert_eq!(trips, 0, "{mode:?}: the replay is answered from memory");
            assert_eq!(second.status(), 201);
            assert_eq!(second.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
            assert_eq!(second.json::<Value>().await.unwrap(), first);

            let (other, trips) = counted(&proxy, post("{\"amount\": 2}")).await;
            assert_eq!(other.unwrap().status(), 422, "{mode:?}: another body is still a mismatch");
            assert!(trips > 0);
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{mode:?}");
            assert_eq!(cache.stats().hits, 1, "{mode:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_layer_replays_first_in_its_in_transaction_mode() {
        // The layer inherits its handle's settings: a replay is idem_replay's one round trip.
        let (idem, proxy) = through_proxy(Settings::builder().replay_first(true), 4).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let url = serve(idem.clone(), Mode::InTransaction, runs.clone()).await;
        let http = reqwest::Client::new();
        let key = format!("layer-first-{}", std::process::id());
        let post = |body: &'static str| http.post(&url).header("idempotency-key", &key).header("x-user", "u1").body(body).send();
        let first = post("{\"amount\": 1}").await.unwrap();
        assert_eq!(first.status(), 201);
        let first: Value = first.json().await.unwrap();
        // One replay first, uncounted: over sqlx the first use of idem_replay's statement on a
        // connection prepares it (a round trip, once per connection). Another body, so that a
        // replay cache (IDEM_REPLAY_CACHE=on) does not answer it from memory instead.
        assert_eq!(post("{\"amount\": 2}").await.unwrap().status(), 422);
        settled(&idem).await;
        let (second, trips) = counted(&proxy, post("{\"amount\": 1}")).await;
        let second = second.unwrap();
        assert_eq!(second.status(), 201);
        assert_eq!(second.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
        assert_eq!(second.json::<Value>().await.unwrap(), first);
        // Over sqlx this two-thread window may also take in the pool's check of the connection
        // given back (sqlx's exact counts, on one thread, are round_trips.rs's): never the
        // reservation's BEGIN and its ROLLBACK besides.
        let most = if NAME == "sqlx" { 2 } else { 1 };
        let least = u64::from(!from_memory());
        assert!((least..=most).contains(&trips), "{NAME}: idem_replay alone (none from the cache), got {trips} round trips");
        settled(&idem).await;
        let (other, trips) = counted(&proxy, post("{\"amount\": 2}")).await;
        assert_eq!(other.unwrap().status(), 422, "another body is a mismatch");
        assert!((1..=most).contains(&trips), "{NAME}: the mismatch is idem_replay's answer, got {trips}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicates_run_once_with_the_cache_on() {
        // The checklist's 64 waiting duplicates, with a cache: the one that gets the key holds it (its
        // row written, its transaction open) until the 63 others are blocked behind its backend, so
        // they overlap it (served one after another, they never would: the deadline fails the test);
        // one runs, the others replay (from the database, which fills the cache), then a late
        // duplicate is answered from memory.
        let (cache, settings) = cached(1_000, Duration::from_secs(60));
        let (idem, _proxy) = through_proxy(settings.wait(true), 64).await;
        let key = unique_key("cache.concurrent");
        let runs = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(tokio::sync::Barrier::new(64));
        let mut tasks = Vec::new();
        for _ in 0..64 {
            let (idem, key, runs, start) = (idem.clone(), key.clone(), runs.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let tag = key.to_string();
                idem.run(&key, &fp(json!({"amount": 100})), move |tx| {
                    let (runs, tag) = (runs.clone(), tag.clone());
                    Box::pin(async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        let insert = "INSERT INTO charges (user_id, amount, k) VALUES ('u', 100, $1)";
                        exec(tx, insert, &[&tag]).await?;
                        let pid = query_i64(tx, "SELECT pg_backend_pid()::int8", &[]).await?;
                        idempotency_testkit::blocked_behind(pid, 63).await;
                        Ok::<_, Failure>(StoredResponse::json(201, json!({"run": n, "pid": pid})))
                    })
                })
                .await
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("task").expect("every duplicate answers"));
        }
        let executed: Vec<_> = results.iter().filter(|r| r.is_executed()).collect();
        assert_eq!(executed.len(), 1, "{results:?}");
        assert!(results.iter().all(|r| r.is_executed() || (r.is_replayed() && r.value() == executed[0].value())), "{results:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(charges_for(&admin().await, &key).await, 1);
        // The late duplicate on a handle of its own sharing the cache, through a proxy of its own:
        // the 64's connections may still send (a pool returning a connection after an error), and
        // those trips are no part of the late call's.
        let (late_idem, late_proxy) = through_proxy(Settings::builder().replay_cache(cache.clone()), 1).await;
        let (late, trips) = counted(&late_proxy, late_idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(late.unwrap().is_replayed() && trips == 0);
        assert_eq!(cache.stats().entries, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicates_of_a_held_key_are_in_progress_with_the_cache_on() {
        // Nothing is cached while the key is held: every duplicate reaches the database and is in
        // progress; after the holder commits, a duplicate replays from memory.
        let (cache, settings) = cached(1_000, Duration::from_secs(60));
        let (idem, _proxy) = through_proxy(settings, 64).await;
        let key = unique_key("cache.concurrent.held");
        let race = duplicates_of_a_held_key(&idem, &key, &fp(json!({"amount": 100}))).await;
        assert!(race.duplicates.iter().all(|r| matches!(r, Err(Error::InProgress { .. }))), "every duplicate is in progress: {:?}", race.duplicates);
        assert!(matches!(race.holder, Ok(Outcome::Executed(_))), "{:?}", race.holder);
        // On a handle of its own sharing the cache (as in concurrent_duplicates_run_once_with_the_cache_on).
        let (late_idem, late_proxy) = through_proxy(Settings::builder().replay_cache(cache), 1).await;
        let (late, trips) = counted(&late_proxy, late_idem.run(&key, &fp(json!({"amount": 100})), never)).await;
        assert!(late.unwrap().is_replayed() && trips == 0, "the completion filled the cache");
        assert_eq!(race.runs, 1);
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    /// A first call on `idem`, so that the counted ones find the connection open and the schema
    /// known.
    /// Whether the test kit gave every handle a replay cache (`IDEM_REPLAY_CACHE=on`, the core
    /// runs' rerun of this suite): a retry of a key this handle answered is then answered from
    /// memory, without the round trip replay first costs.
    fn from_memory() -> bool {
        idempotency_testkit::replay_cache::from_env(Settings::default()).replay_cache.is_some()
    }

    async fn warm_up(idem: &Idem) {
        let key = unique_key("first.warm");
        let runs = Arc::new(AtomicUsize::new(0));
        idem.run(&key, &fp(json!({})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
    }

    #[tokio::test]
    async fn replay_first_answers_a_final_record_in_one_round_trip_and_falls_through_otherwise() {
        let (idem, proxy) = through_proxy(Settings::builder().replay_first(true), 1).await;
        let plain = connect_with(test_database().await, 2, Settings::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        warm_up(&idem).await;

        // A fresh key: idem_replay answers nothing, the flow reserves and runs.
        let key = unique_key("first.fresh");
        settled(&idem).await;
        let (first, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(first.as_ref().unwrap().is_executed(), "{first:?}");
        assert_eq!(trips, 4, "idem_replay, then BEGIN+reserve, the INSERT, complete+COMMIT");
        // Its retry: the stored answer, one round trip, as a reservation's replay answers it.
        settled(&idem).await;
        let (again, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        let again = again.unwrap();
        assert!(again.is_replayed(), "{again:?}");
        assert_eq!(again.value(), first.unwrap().value(), "the stored response");
        assert_eq!(again.decision().as_str(), "replayed");
        assert_eq!(trips, u64::from(!from_memory()), "idem_replay alone (none from the cache)");
        assert!(!pooled_in_transaction(&idem).await, "nothing left open on the connection");
        // Another body: the database's mismatch, one round trip.
        settled(&idem).await;
        let (err, trips) = counted(&proxy, idem.run(&key, &fp(json!({"amount": 200})), Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(matches!(err, Err(Error::Mismatch)), "{err:?}");
        assert_eq!(trips, 1);

        // A stored failure: answered as the reservation answers it (the plain handle's answer).
        let key = unique_key("first.failed");
        let declined = json!({"status": 402, "body": "declined"});
        let err = idem.run(&key, &body, Charge::of(&key).failing(&runs, Failure(Some(declined.clone())))).await.unwrap_err();
        assert!(matches!(err, Error::Handler { .. }), "{err:?}");
        settled(&idem).await;
        let (first, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        let reserved = plain.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await;
        match (&first, &reserved) {
            (Err(Error::Failed { response: Some(a) }), Err(Error::Failed { response: Some(b) })) => assert_eq!((a, b), (&declined, &declined)),
            other => panic!("both answer the stored failure: {other:?}"),
        }
        assert_eq!(trips, 1);

        // A key in progress (a committed PROCESSING record): not final, so the flow reserves and
        // answers InProgress from the reservation (two round trips).
        let key = unique_key("first.held");
        let admin = admin().await;
        admin.batch_execute("BEGIN").await.unwrap();
        admin
            .execute("SELECT idem_reserve($1, $2, $3, $4, lease => interval '1 hour')", &[&key.operation(), &key.user_id(), &key.key(), &body.as_str()])
            .await
            .unwrap();
        admin.batch_execute("COMMIT").await.unwrap();
        settled(&idem).await;
        let (held, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(matches!(held, Err(Error::InProgress { .. })), "{held:?}");
        assert_eq!(trips, 2, "idem_replay, then BEGIN+reserve");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the fresh key and the failing one ran, nothing else");
    }

    #[tokio::test]
    async fn replay_first_fills_the_cache() {
        let (cache, settings) = cached(100, Duration::from_secs(60));
        let (idem, proxy) = through_proxy(settings.replay_first(true), 1).await;
        warm_up(&idem).await;
        let key = unique_key("first.cache");
        let runs = Arc::new(AtomicUsize::new(0));
        let body = fp(json!({"amount": 100}));
        // Completed by another handle: this one's cache knows nothing of it.
        let plain = connect_with(test_database().await, 2, Settings::default());
        plain.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        settled(&idem).await;
        let (from_db, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(from_db.unwrap().is_replayed() && trips == 1, "idem_replay's answer");
        settled(&idem).await;
        let (from_memory, trips) = counted(&proxy, idem.run(&key, &body, Charge::of(&key).handler::<Failure>(&runs))).await;
        assert!(from_memory.unwrap().is_replayed() && trips == 0, "kept by the cache");
        assert_eq!((runs.load(Ordering::SeqCst), cache.stats().hits), (1, 1));
    }
}
