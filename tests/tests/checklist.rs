//! The release checklist (what a release must show before it ships), end to end through the client, against the
//! private cluster. Each assertion would fail on a check-then-run implementation.

idempotency_testkit::for_each_driver! {
    use idempotency_client::ops::{self, RecoverAction, ReserveOptions, ReserveOutcome, Status};
    use idempotency_client::{
        Error, Fingerprint, Key, Outcome, Settings, StoredResponse,
    };
    use idempotency_testkit::{admin_at, charges_for, fresh_database, unique_key, until_passed, Failure, Passed};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn fp(v: serde_json::Value) -> Fingerprint {
        Fingerprint::of_json(&v).expect("fingerprint")
    }

    #[tokio::test]
    async fn duplicate_replays_and_runs_once() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("checklist.duplicate");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        let second = idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(first, Outcome::Executed(_)));
        assert!(second.is_replayed());
        assert_eq!(first.value(), second.value(), "the replay is the stored response");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    #[tokio::test]
    async fn same_key_with_a_different_payload_is_a_mismatch() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("checklist.mismatch");
        let runs = Arc::new(AtomicUsize::new(0));
        idem.run(&key, &fp(json!({"amount": 100})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        let err = idem.run(&key, &fp(json!({"amount": 200})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(err, Error::Mismatch), "{err:?}");
        assert_eq!(idempotency_tower::http_status(&err), 422);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// 64 concurrent runs of one key with `wait`: the one that gets the key holds it until the 63
    /// others are blocked behind it.
    async fn waiting_duplicates() -> (Vec<Result<Outcome<StoredResponse>, Error<Failure>>>, usize, i64) {
        let idem = handle(Settings::builder().wait(true)).await;
        let key = unique_key("checklist.concurrent.wait");
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
                        runs.fetch_add(1, Ordering::SeqCst);
                        let insert = "INSERT INTO charges (user_id, amount, k) VALUES ('u', 100, $1)";
                        exec(tx, insert, &[&tag]).await?;
                        let pid = query_i64(tx, "SELECT pg_backend_pid()::int8", &[]).await?;
                        // Hold the reservation open until every duplicate is blocked behind it, so
                        // they really overlap.
                        idempotency_testkit::blocked_behind(pid, 63).await;
                        Ok::<_, Failure>(StoredResponse::json(201, json!({"id": pid})))
                    })
                })
                .await
            }));
        }
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.expect("task"));
        }
        let charges = charges_for(&admin().await, &key).await;
        (results, runs.load(Ordering::SeqCst), charges)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicates_run_once_and_the_others_are_in_progress() {
        // The attempt that gets the key holds it (its row written, its transaction open) until every
        // duplicate has answered: none can be a replay, each must be in progress, at once.
        let idem = handle(Settings::default()).await;
        let key = unique_key("checklist.concurrent.nowait");
        let race = duplicates_of_a_held_key(&idem, &key, &fp(json!({"amount": 100}))).await;
        assert!(race.duplicates.iter().all(|r| matches!(r, Err(Error::InProgress { .. }))), "every duplicate is in progress: {:?}", race.duplicates);
        assert!(matches!(race.holder, Ok(Outcome::Executed(_))), "{:?}", race.holder);
        assert_eq!(race.runs, 1, "the closure ran exactly once");
        assert_eq!(charges_for(&admin().await, &key).await, 1, "exactly one business row");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicates_run_once_and_waiting_duplicates_replay() {
        let (results, runs, charges) = waiting_duplicates().await;
        assert_eq!((runs, charges), (1, 1));
        let executed: Vec<_> = results.iter().filter_map(|r| match r {
            Ok(Outcome::Executed(v)) => Some(v.clone()),
            _ => None,
        }).collect();
        assert_eq!(executed.len(), 1);
        for r in &results {
            match r {
                Ok(Outcome::Executed(_)) => {}
                Ok(Outcome::Replayed(v)) => assert_eq!(v, &executed[0]),
                other => panic!("a waiting duplicate must replay, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn permanent_failure_is_stored_and_replayed_as_failure() {
        let idem = handle(Settings::default()).await;
        let admin = admin().await;
        let schema = idem.schema().await.unwrap();

        // A 4xx result is remembered as FAILED (never as a success), with its writes.
        let key = unique_key("checklist.permanent.response");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).status(402).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(&first, Outcome::Executed(r) if r.status == 402));
        let record = ops::lookup(&admin, &schema, &key).await.unwrap().expect("record");
        assert_eq!(record.status, Status::Failed, "an error response is never recorded as success");
        let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap_err();
        match &err {
            Error::Failed { response: Some(r) } => assert_eq!(r["status"], 402),
            other => panic!("expected the stored failure, got {other:?}"),
        }
        assert_eq!(idempotency_tower::http_status(&err), 402);
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // A permanent handler error: its writes roll back, its response is stored and replayed.
        let key = unique_key("checklist.permanent.error");
        let runs = Arc::new(AtomicUsize::new(0));
        let declined = Failure(Some(json!({"status": 402, "body": {"error": "card declined"}})));
        let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).failing(&runs, declined)).await.unwrap_err();
        assert!(matches!(err, Error::Handler { .. }), "{err:?}");
        assert_eq!(charges_for(&admin, &key).await, 0, "the failed attempt's writes rolled back");
        let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(&err, Error::Failed { response: Some(r) } if r["body"]["error"] == "card declined"), "{err:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn transient_failure_releases_and_reexecutes() {
        let idem = handle(Settings::default()).await;
        let admin = admin().await;
        let schema = idem.schema().await.unwrap();
        let key = unique_key("checklist.transient");
        let runs = Arc::new(AtomicUsize::new(0));
        // A 5xx result is released: its writes roll back and the retry runs again.
        let first = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).status(503).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(&first, Outcome::Released(r) if r.status == 503));
        assert_eq!(charges_for(&admin, &key).await, 0);
        // So is a transient handler error.
        let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).failing(&runs, Failure(None))).await.unwrap_err();
        assert!(matches!(err, Error::Handler { error: Failure(None), .. }));
        assert_eq!(charges_for(&admin, &key).await, 0);
        let third = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(&third, Outcome::Executed(r) if r.status == 201));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(charges_for(&admin, &key).await, 1);
        let reservation = ops::reserve(&admin, &schema, &key, &fp(json!({"a": 1})), &ReserveOptions::default()).await.unwrap();
        assert_eq!(reservation.attempts, 2, "two transient failures were counted");
    }

    #[tokio::test]
    async fn max_retries_transient_failures_poison_the_key() {
        let idem = handle(Settings::builder().max_retries(3)).await;
        let key = unique_key("checklist.poison");
        let runs = Arc::new(AtomicUsize::new(0));
        for n in 1..=3 {
            let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).failing(&runs, Failure(None))).await.unwrap_err();
            if n < 3 {
                assert!(matches!(err, Error::Handler { .. }), "failure {n} released the key: {err:?}");
            } else {
                assert!(matches!(err, Error::Poisoned { .. }), "failure {n} poisoned the key: {err:?}");
            }
        }
        let err = idem.run(&key, &fp(json!({"a": 1})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(err, Error::Failed { response: None }), "{err:?}");
        assert_eq!(idempotency_tower::http_status(&err), 409);
        assert_eq!(runs.load(Ordering::SeqCst), 3, "the poisoned key never runs again");
    }

    #[tokio::test]
    async fn store_down_is_store_unavailable_within_a_bounded_time() {
        // Nothing listens on port 1.
        let idem = store_down(4);
        let key = unique_key("checklist.down");
        let runs = Arc::new(AtomicUsize::new(0));
        let fingerprint = fp(json!({}));
        // Nothing will ever answer, so only the client's own bounds (the refused connection, its
        // connect_timeout, the pool's wait) can end the call. The deadline is a hang guard far above
        // those bounds (a client that waited forever would meet it), not a measured speed.
        let answer = tokio::time::timeout(Duration::from_secs(60), idem.run(&key, &fingerprint, Charge::of(&key).handler::<Failure>(&runs))).await;
        let err = answer.expect("an unreachable store answers at the end of the client's own bounds, never hangs").unwrap_err();
        assert!(matches!(err, Error::StoreUnavailable(_)), "{err:?}");
        assert_eq!(idempotency_tower::http_status(&err), 503);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(matches!(idem.check_extension().await, Err(Error::StoreUnavailable(_))));
    }

    #[tokio::test]
    async fn keys_are_isolated_per_user_and_per_operation() {
        let idem = handle(Settings::default()).await;
        let runs = Arc::new(AtomicUsize::new(0));
        let base = unique_key("checklist.scope");
        let other_user = Key::new(base.operation(), format!("{}-other", base.user_id()), base.key()).unwrap();
        let other_op = Key::new("checklist.scope.other", base.user_id(), base.key()).unwrap();
        for key in [&base, &other_user, &other_op] {
            let out = idem.run(key, &fp(json!({"a": 1})), Charge::of(key).handler::<Failure>(&runs)).await.unwrap();
            assert!(matches!(out, Outcome::Executed(_)), "{key}: a new key in its own scope");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn recover_stuck_unblocks_a_crashed_workers_key() {
        // Its own database: recovery acts on every stuck record, so keep other tests' records away.
        let url = fresh_database(&db("idem_checklist_recover")).await;
        let idem = connect_with(&url, 8, Settings::default());
        let client = admin_at(&url).await;
        let schema = idem.schema().await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let short = ReserveOptions { lease: Some(Duration::from_millis(200)), ..ReserveOptions::default() };

        // Two two-phase workers reserve, commit, and die.
        let first = unique_key("checklist.crash.first");
        let second = unique_key("checklist.crash.second");
        for key in [&first, &second] {
            let r = ops::reserve(&client, &schema, key, &fp(json!({})), &short).await.unwrap();
            assert!(matches!(r.outcome, ReserveOutcome::Created(_)));
        }
        let err = idem.run(&first, &fp(json!({})), Charge::of(&first).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(err, Error::InProgress { .. }), "the key is wedged until recovery: {err:?}");
        for key in [&first, &second] {
            until_passed(&client, &schema, key, Passed::Lease).await;
        }

        // Oldest lease first: `fail` takes the first worker's key, `release` the second's.
        assert_eq!(ops::recover_stuck(&client, &schema, 1, RecoverAction::Fail, None).await.unwrap(), 1);
        assert_eq!(ops::recover_stuck(&client, &schema, 10, RecoverAction::Release, None).await.unwrap(), 1);
        assert_eq!(ops::recover_stuck(&client, &schema, 10, RecoverAction::Release, None).await.unwrap(), 0);

        let err = idem.run(&first, &fp(json!({})), Charge::of(&first).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(err, Error::Failed { response: None }), "fail: at most once, never rerun: {err:?}");
        let out = idem.run(&second, &fp(json!({})), Charge::of(&second).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(out, Outcome::Executed(_)), "release: the retry runs");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn sweep_frees_an_expired_key() {
        let url = fresh_database(&db("idem_checklist_sweep")).await;
        let ttl = Duration::from_millis(200);
        let idem = connect_with(&url, 8, Settings::builder().ttl(ttl));
        let schema = idem.schema().await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let key = unique_key("checklist.sweep");
        idem.run(&key, &fp(json!({})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        assert!(idem.run(&key, &fp(json!({})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap().is_replayed());
        let client = admin_at(&url).await;
        until_passed(&client, &schema, &key, Passed::Expiry).await;
        assert_eq!(ops::sweep(&client, &schema, 100).await.unwrap(), 1);
        assert!(ops::lookup(&client, &schema, &key).await.unwrap().is_none());
        let out = idem.run(&key, &fp(json!({"new": true})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap();
        assert!(matches!(out, Outcome::Executed(_)), "the expired key is free, even for another payload");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn stale_token_can_never_complete() {
        let url = fresh_database(&db("idem_checklist_stale")).await;
        let idem = connect_with(&url, 8, Settings::default());
        let client = admin_at(&url).await;
        let schema = idem.schema().await.unwrap();
        let key = unique_key("checklist.stale");
        let short = ReserveOptions { lease: Some(Duration::from_millis(100)), ..ReserveOptions::default() };
        let ReserveOutcome::Created(old) = ops::reserve(&client, &schema, &key, &Fingerprint::of_bytes(b"h"), &short).await.unwrap().outcome else {
            panic!("created")
        };
        until_passed(&client, &schema, &key, Passed::Lease).await;
        assert_eq!(ops::recover_stuck(&client, &schema, 10, RecoverAction::Release, None).await.unwrap(), 1);
        let ReserveOutcome::Created(new) = ops::reserve(&client, &schema, &key, &Fingerprint::of_bytes(b"h"), &ReserveOptions::default()).await.unwrap().outcome
        else {
            panic!("created")
        };
        assert!(new > old);
        assert!(!ops::complete(&client, &schema, &key, old, Some(&json!({"by": "old"})), Status::Success).await.unwrap());
        assert!(!ops::heartbeat(&client, &schema, &key, old, None).await.unwrap());
        assert_eq!(ops::release(&client, &schema, &key, old, None).await.unwrap(), ops::ReleaseOutcome::Stale);
        assert!(ops::complete(&client, &schema, &key, new, Some(&json!({"by": "new"})), Status::Success).await.unwrap());
        assert_eq!(ops::lookup(&client, &schema, &key).await.unwrap().unwrap().response, Some(json!({"by": "new"})));
    }

    #[tokio::test]
    async fn check_extension_reports_the_version_or_its_absence() {
        let idem = handle(Settings::default()).await;
        // The extension, or the portable install (IDEM_INSTALL=portable): the version of this build.
        assert_eq!(idem.check_extension().await.unwrap(), env!("CARGO_PKG_VERSION"));
        let admin = admin().await;
        let name = db("idem_no_extension");
        admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.unwrap();
        admin.batch_execute(&format!("CREATE DATABASE {name}")).await.unwrap();
        let bare = connect_with(&idempotency_testkit::database_url(&name), 2, Settings::default());
        let err = bare.check_extension().await.unwrap_err();
        assert!(matches!(err, Error::IncompatibleExtension { .. }), "{err:?}");
        // And a call without the extension fails as IncompatibleExtension, not as an obscure error.
        let key = unique_key("checklist.noext");
        let runs = Arc::new(AtomicUsize::new(0));
        let err = bare.run(&key, &fp(json!({})), Charge::of(&key).handler::<Failure>(&runs)).await.unwrap_err();
        assert!(matches!(err, Error::IncompatibleExtension { .. }), "{err:?}");
    }
}

/// Key rules, before any driver: checked once.
#[test]
fn invalid_keys_are_refused_by_key_new_with_http_400() {
    use idempotency_client::{Error, Key};
    let err = Key::new("op", "user", "bad\nkey").unwrap_err();
    assert_eq!(err.argument(), "key");
    let err: Error = err.into();
    assert_eq!(idempotency_tower::http_status(&err), 400);
    assert!(Key::new("op", "", "k").is_err());
    assert!(Key::new("op", "u", "k".repeat(256)).is_err());
}

/// `ops` over sqlx, from the same statements as over tokio-postgres: a reservation, your write,
/// a heartbeat and the completion inside a sqlx transaction you hold commit together; a
/// reservation rolled back with its transaction leaves nothing; a release, the operators'
/// calls, over the pool.
#[tokio::test]
async fn ops_over_sqlx_run_inside_your_own_transaction() {
    use idempotency_client::ops::{self, RecoverAction, ReleaseOutcome, ReserveOptions, ReserveOutcome, Status};
    use idempotency_client::{Fingerprint, Settings};
    use idempotency_testkit::driver::over_sqlx::{admin, handle};
    use idempotency_testkit::{charges_for, unique_key};
    use serde_json::json;

    let idem = handle(Settings::default()).await;
    let schema = idem.schema().await.unwrap();
    let fp = Fingerprint::of_bytes(b"ops over sqlx");
    let key = unique_key("checklist.ops_sqlx");
    let mut tx = idem.pool().begin().await.unwrap();
    let ReserveOutcome::Created(token) = ops::sqlx::reserve(&mut *tx, &schema, &key, &fp, &ReserveOptions::default()).await.unwrap().outcome else {
        panic!("a new key is created");
    };
    sqlx::query("INSERT INTO charges (user_id, amount, k) VALUES ('ops', 1, $1)").bind(key.to_string()).execute(&mut *tx).await.unwrap();
    assert!(ops::sqlx::heartbeat(&mut *tx, &schema, &key, token, None).await.unwrap());
    assert!(ops::sqlx::complete(&mut *tx, &schema, &key, token, Some(&json!({"status": 201})), Status::Success).await.unwrap());
    tx.commit().await.unwrap();
    let again = ops::sqlx::reserve(idem.pool(), &schema, &key, &fp, &ReserveOptions::default()).await.unwrap();
    assert_eq!(again.outcome, ReserveOutcome::Replay(Some(json!({"status": 201}))));
    assert_eq!(ops::sqlx::lookup(idem.pool(), &schema, &key).await.unwrap().expect("record").response, Some(json!({"status": 201})));
    assert_eq!(charges_for(&admin().await, &key).await, 1);

    let other = unique_key("checklist.ops_sqlx");
    let mut tx = idem.pool().begin().await.unwrap();
    let reserved = ops::sqlx::reserve(&mut *tx, &schema, &other, &fp, &ReserveOptions::default()).await.unwrap();
    assert!(matches!(reserved.outcome, ReserveOutcome::Created(_)));
    tx.rollback().await.unwrap();
    assert!(ops::sqlx::lookup(idem.pool(), &schema, &other).await.unwrap().is_none(), "rolled back with its transaction");
    let ReserveOutcome::Created(token) = ops::sqlx::reserve(idem.pool(), &schema, &other, &fp, &ReserveOptions::default()).await.unwrap().outcome else {
        panic!("created again");
    };
    assert_eq!(ops::sqlx::release(idem.pool(), &schema, &other, token, None).await.unwrap(), ReleaseOutcome::Released);
    ops::sqlx::stats(idem.pool(), &schema).await.unwrap();
    assert!(ops::sqlx::sweep(idem.pool(), &schema, 1).await.unwrap() >= 0);
    assert!(ops::sqlx::recover_stuck(idem.pool(), &schema, 1, RecoverAction::Release, None).await.unwrap() >= 0);
}

/// `ops::stats` on a table never analyzed, over both drivers: `idem_stats` has no estimate of
/// the finished records before the first `ANALYZE` (its `success` and `failed` are NULL), so
/// `Stats` reads them as `None` and the exact counts as they are; after an `ANALYZE`, estimates
/// whose sum is the finished records.
/// Before 0.7.0 the call failed with "column success is NULL".
#[tokio::test]
async fn ops_stats_before_the_first_analyze() {
    use idempotency_client::ops::{self, ReserveOptions, ReserveOutcome, Stats, Status};
    use idempotency_client::{Fingerprint, Idempotency, Settings, Sqlx};
    use idempotency_testkit::{admin_at, fresh_database, unique_key};

    let url = fresh_database("checklist_stats").await;
    let admin = admin_at(&url).await;
    let sqlx = Idempotency::<Sqlx>::from_url(&url, 1, Settings::default()).unwrap();
    let schema = sqlx.schema().await.unwrap();
    let fp = Fingerprint::of_bytes(b"stats");
    let (done, held) = (unique_key("checklist.stats"), unique_key("checklist.stats"));
    let ReserveOutcome::Created(token) = ops::reserve(&admin, &schema, &done, &fp, &ReserveOptions::default()).await.unwrap().outcome else {
        panic!("a new key is created");
    };
    assert!(ops::complete(&admin, &schema, &done, token, None, Status::Success).await.unwrap());
    assert!(matches!(ops::reserve(&admin, &schema, &held, &fp, &ReserveOptions::default()).await.unwrap().outcome, ReserveOutcome::Created(_)));

    let never_analyzed = Stats { processing: 1, success: None, failed: None, stuck: 0, expired: 0, oldest_processing_age: None };
    let over_postgres = ops::stats(&admin, &schema).await.expect("idem_stats read before the first ANALYZE (tokio-postgres)");
    let over_sqlx = ops::sqlx::stats(sqlx.pool(), &schema).await.expect("idem_stats read before the first ANALYZE (sqlx)");
    for stats in [over_postgres, over_sqlx] {
        assert!(stats.oldest_processing_age.is_some(), "{stats:?}");
        assert_eq!(Stats { oldest_processing_age: None, ..stats }, never_analyzed);
    }

    admin.batch_execute(&format!("ANALYZE {}.idem_records", schema.name())).await.unwrap();
    for stats in [ops::stats(&admin, &schema).await.unwrap(), ops::sqlx::stats(sqlx.pool(), &schema).await.unwrap()] {
        // Estimates from two rows: the one finished record split between the two statuses.
        assert_eq!((stats.processing, stats.success.zip(stats.failed).map(|(s, f)| s + f)), (1, Some(1)), "{stats:?}");
    }
}
