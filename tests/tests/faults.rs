//! Faults: lost acknowledgements, killed backends and workers, exhausted pools, timeouts and
//! REPEATABLE READ races. Each test states its invariant; none may see a double execution or
//! lose an acknowledged key. (The server crash test is in `fault_crash.rs`: it restarts the
//! cluster, so it runs in its own test binary.)

idempotency_testkit::for_each_driver! {
    use idempotency_client::ops::{self, RecoverAction, ReleaseOutcome, ReserveOptions, Status, Token};
    use idempotency_client::{Error, Fingerprint, HandlerError, Idempotency, Key, Outcome, Postgres, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::proxy::{Cut, Proxy};
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::{charges_for, cluster_addr, database_url, fresh_database, unique_key};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A tokio-postgres pool on database `name`, for the operator's side (whatever the driver under
    /// test).
    fn operator(name: &str) -> deadpool_postgres::Pool {
        Idempotency::<Postgres>::from_url(&database_url(name), 8, Settings::default()).expect("pool").pool().clone()
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_json(&json!({"amount": 1})).unwrap()
    }

    /// The handler of these tests: counts runs, writes one row tagged with the key, waits `delay`.
    fn charge(
        runs: &Arc<AtomicUsize>,
        key: &Key,
        delay: Duration,
    ) -> impl for<'t> FnMut(&'t mut Conn) -> TxFuture<'t, StoredResponse, DbError> + Send {
        Charge::of(key).amount(1).delay(delay).handler(runs)
    }

    /// A handle whose connections go through a proxy that cuts the first COMMIT, and a direct one.
    async fn through_proxy(name: &str, cut: Cut) -> (Idem, Idem, Proxy) {
        let direct = handle_in(name, Settings::default()).await;
        let proxy = Proxy::start(cluster_addr(), Some(cut)).await;
        let via = connect_with(&proxy.url(name), 2, Settings::default());
        (via, direct, proxy)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lost_commit_acknowledgement_replays_on_retry_and_never_runs_twice() {
        let (via, direct, proxy) = through_proxy(&db("idem_fault_after_commit"), Cut::AfterCommit).await;
        let key = unique_key("fault.ack.lost");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = via.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await;
        assert_eq!(proxy.cuts(), 1, "the proxy cut the connection at COMMIT");
        assert!(matches!(first, Err(Error::StoreUnavailable(_)) | Err(Error::Database(_))), "the client cannot know: {first:?}");
        // The client retries with the same key (honouring 409 + Retry-After while the server is
        // still finishing the cut-off transaction): the commit did happen, so it replays.
        let deadline = Instant::now() + Duration::from_secs(60);
        let retry = loop {
            match direct.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await {
                Err(Error::InProgress { .. }) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
                other => break other.unwrap(),
            }
        };
        assert!(retry.is_replayed(), "{retry:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "executed once");
        assert_eq!(charges_for(&operator(&db("idem_fault_after_commit")).get().await.unwrap(), &key).await, 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connection_lost_before_commit_executes_once_on_retry() {
        let (via, direct, proxy) = through_proxy(&db("idem_fault_before_commit"), Cut::BeforeCommit).await;
        let key = unique_key("fault.ack.before");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = via.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await;
        assert_eq!(proxy.cuts(), 1);
        assert!(first.is_err(), "{first:?}");
        // Nothing committed, nothing left behind: the retry executes.
        let client = operator(&db("idem_fault_before_commit")).get().await.unwrap();
        let schema = direct.schema().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while ops::lookup(&client, &schema, &key).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "the aborted reservation never went away");
            tokio::time::sleep(Duration::from_millis(20)).await; // the backend is still rolling back
        }
        let retry = direct.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await.unwrap();
        assert!(matches!(retry, Outcome::Executed(_)), "{retry:?}");
        assert_eq!(charges_for(&client, &key).await, 1, "exactly one business row");
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the first run rolled back with its connection");
    }

    // ---------------------------------------------------------------------------------------------

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_terminated_holder_lets_a_waiting_duplicate_run_once() {
        let idem = handle_in(&db("idem_fault_terminate"), Settings::builder().wait(true)).await;
        let key = unique_key("fault.terminate");
        let runs = Arc::new(AtomicUsize::new(0));
        let (pid_tx, pid_rx) = tokio::sync::oneshot::channel::<i64>();
        let holder = {
            let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
            let mut pid_tx = Some(pid_tx);
            tokio::spawn(async move {
                idem.run(&key, &fp(), move |tx| {
                    let pid_tx = pid_tx.take();
                    let runs = runs.clone();
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let pid = query_i64(tx, "SELECT pg_backend_pid()::int8", &[]).await?;
                        exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('holder', 1, 'x')", &[]).await?;
                        if let Some(p) = pid_tx {
                            let _ = p.send(pid);
                        }
                        tokio::time::sleep(Duration::from_secs(600)).await; // stuck until terminated
                        Ok::<_, DbError>(StoredResponse::json(201, json!({"by": "holder"})))
                    }) as TxFuture<'_, _, _>
                })
                .await
            })
        };
        let pid = pid_rx.await.expect("holder reserved");
        let waiter = {
            let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
            tokio::spawn(async move { idem.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await })
        };
        // The duplicate is blocked by the holder, as the server sees it (a lock wait whose blocker is
        // the holder's backend), and so has not answered: not merely slow.
        let admin = operator(&db("idem_fault_terminate")).get().await.unwrap();
        let blocked = "SELECT count(*) FROM pg_catalog.pg_stat_activity
                        WHERE wait_event_type = 'Lock' AND $1::int8::int4 = ANY (pg_catalog.pg_blocking_pids(pid))";
        eventually("the duplicate is blocked by the holder's backend", Duration::from_secs(30), || async {
            let n: i64 = admin.query_one(blocked, &[&pid]).await.map_err(|e| e.to_string())?.get(0);
            if n == 1 { Ok(()) } else { Err(format!("{n} sessions blocked by the holder")) }
        })
        .await;
        assert!(!waiter.is_finished(), "the duplicate waits for the uncommitted holder");
        let killed: bool = admin.query_one("SELECT pg_terminate_backend($1::int8::int4) AS ok", &[&pid]).await.unwrap().get("ok");
        assert!(killed);
        holder.abort(); // its connection is gone; the task would sleep on
        let out = tokio::time::timeout(Duration::from_secs(60), waiter).await.expect("waiter finished").unwrap().unwrap();
        assert!(matches!(out, Outcome::Executed(_)), "{out:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(charges_for(&admin, &key).await, 1, "the holder's write died with it; the waiter's committed");
        let holder_rows: i64 = admin.query_one("SELECT count(*) AS n FROM charges WHERE user_id = 'holder'", &[]).await.unwrap().get("n");
        assert_eq!(holder_rows, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_killed_two_phase_worker_is_recovered_and_fenced() {
        // A lease that cannot run out on its own during the test (30 s): the lease ends by the
        // operator's hand once the worker is dead, not by the clock.
        let lease = Duration::from_secs(30);
        let idem = handle_in(&db("idem_fault_killed_worker"), Settings::builder().lease(lease)).await;
        let pool = operator(&db("idem_fault_killed_worker"));
        let admin = pool.get().await.unwrap();
        let schema = idem.schema().await.unwrap();
        let mut tokens: Vec<(Key, Token)> = Vec::new();
        for (name, action) in [("fault.killed.fail", RecoverAction::Fail), ("fault.killed.release", RecoverAction::Release)] {
            let key = unique_key(name);
            let worker = {
                let (idem, key) = (idem.clone(), key.clone());
                tokio::spawn(async move {
                    let call = async {
                        tokio::time::sleep(Duration::from_secs(600)).await; // the card network, forever
                        Ok::<_, DbError>(StoredResponse::json(201, json!({})))
                    };
                    idem.run_external(&key, &fp(), call, |_, _| Box::pin(async { Ok(()) })).await
                })
            };
            // Let it reserve (its reservation committed, the call under way), then kill it.
            let record = eventually("the worker's reservation is recorded", Duration::from_secs(60), || async {
                match ops::lookup(&admin, &schema, &key).await {
                    Ok(Some(r)) if r.status == Status::Processing => Ok(r),
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            assert_eq!(ops::recover_stuck(&admin, &schema, 100, RecoverAction::Fail, None).await.unwrap(), 0, "a live lease is not recovered");
            worker.abort();
            let _ = worker.await;
            // Its lease ends (by hand, in the transaction that recovers, so no beat still on its way
            // from the dead worker can renew it in between: it would wait for the row and then find
            // the key no longer PROCESSING); recovery takes the key.
            let mut client = pool.get().await.unwrap();
            let tx = client.transaction().await.unwrap();
            let ended = "UPDATE idem_records SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE key = $1";
            assert_eq!(tx.execute(ended, &[&key.key()]).await.unwrap(), 1);
            assert_eq!(ops::recover_stuck(&tx, &schema, 100, action, None).await.unwrap(), 1);
            tx.commit().await.unwrap();
            tokens.push((key, record.token));
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let (failed, released) = (&tokens[0], &tokens[1]);
        let err = idem.run(&failed.0, &fp(), charge(&runs, &failed.0, Duration::ZERO)).await.unwrap_err();
        assert!(matches!(err, Error::Failed { response: None }), "fail: poisoned, never rerun: {err:?}");
        let out = idem.run(&released.0, &fp(), charge(&runs, &released.0, Duration::ZERO)).await.unwrap();
        assert!(matches!(out, Outcome::Executed(_)), "release: the retry runs");
        // The dead worker's late calls are all rejected.
        for (key, token) in &tokens {
            assert!(!ops::complete(&admin, &schema, key, *token, Some(&json!({"late": 1})), Status::Success).await.unwrap());
            assert_eq!(ops::release(&admin, &schema, key, *token, None).await.unwrap(), ReleaseOutcome::Stale);
            assert!(!ops::heartbeat(&admin, &schema, key, *token, None).await.unwrap());
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pool_exhaustion_is_a_bounded_store_unavailable() {
        let url = fresh_database(&db("idem_fault_pool")).await;
        let (idem, held) = exhausted(&url, Duration::from_millis(300)).await;
        let key = unique_key("fault.pool");
        let runs = Arc::new(AtomicUsize::new(0));
        // The one connection stays held until the answer: only the pool's own wait (300 ms) can end
        // the call. The deadline is a hang guard far above that wait (a pool that waited forever
        // would meet it and fail the test), not a measured speed.
        let err = tokio::time::timeout(Duration::from_secs(60), idem.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)))
            .await
            .expect("an exhausted pool answers at the end of its wait, not never")
            .unwrap_err();
        assert!(matches!(err, Error::StoreUnavailable(_)), "{err:?}");
        drop(held);
        assert!(matches!(idem.run(&key, &fp(), charge(&runs, &key, Duration::ZERO)).await, Ok(Outcome::Executed(_))));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn timeouts_are_typed_errors_and_leave_no_reservation_behind() {
        let idem = handle_in(&db("idem_fault_timeouts"), Settings::default()).await;
        let pool = operator(&db("idem_fault_timeouts"));
        let admin = pool.get().await.unwrap();
        let schema = idem.schema().await.unwrap();

        // statement_timeout inside the closure: a transient failure, rolled back and released.
        let key = unique_key("fault.statement_timeout");
        let err = idem
            .run(&key, &fp(), |tx| {
                Box::pin(async move {
                    batch(tx, "SET LOCAL statement_timeout = '100ms'").await?;
                    exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 1, 'timeout')", &[]).await?;
                    exec(tx, "SELECT pg_sleep(5)", &[]).await?;
                    Ok(StoredResponse::json(201, json!({})))
                }) as TxFuture<'_, StoredResponse, DbError>
            })
            .await
            .unwrap_err();
        match &err {
            Error::Handler { error: e, .. } => assert_eq!(e.sqlstate(), Some("57014"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(ops::lookup(&admin, &schema, &key).await.unwrap().is_none(), "no reservation left behind");
        let rows: i64 = admin.query_one("SELECT count(*) AS n FROM charges WHERE k = 'timeout'", &[]).await.unwrap().get("n");
        assert_eq!(rows, 0);

        // lock_timeout on a business row another transaction holds: same.
        let mut blocker = pool.get().await.unwrap();
        admin.execute("INSERT INTO charges (id, user_id, amount, k) VALUES (-1, 'locked', 1, 'locked')", &[]).await.unwrap();
        let btx = blocker.transaction().await.unwrap();
        btx.execute("UPDATE charges SET amount = 2 WHERE id = -1", &[]).await.unwrap();
        let key = unique_key("fault.lock_timeout");
        let err = idem
            .run(&key, &fp(), |tx| {
                Box::pin(async move {
                    batch(tx, "SET LOCAL lock_timeout = '100ms'").await?;
                    exec(tx, "UPDATE charges SET amount = 3 WHERE id = -1", &[]).await?;
                    Ok(StoredResponse::json(201, json!({})))
                }) as TxFuture<'_, StoredResponse, DbError>
            })
            .await
            .unwrap_err();
        match &err {
            Error::Handler { error: e, .. } => assert_eq!(e.sqlstate(), Some("55P03"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(ops::lookup(&admin, &schema, &key).await.unwrap().is_none());
        btx.rollback().await.unwrap();

        // statement_timeout on a reservation waiting for an uncommitted holder: a typed error
        // (57014) within the timeout, and nothing left behind.
        let key = unique_key("fault.wait_timeout");
        let mut holder_client = pool.get().await.unwrap();
        let holder = holder_client.transaction().await.unwrap();
        ops::reserve(&holder, &schema, &key, &fp(), &ReserveOptions::default()).await.unwrap();
        let mut waiter_client = pool.get().await.unwrap();
        let tx = waiter_client.transaction().await.unwrap();
        tx.batch_execute("SET LOCAL statement_timeout = '200ms'").await.unwrap();
        let wait = ReserveOptions { wait: true, ..ReserveOptions::default() };
        // The holder stays uncommitted until the answer: only the statement timeout can end the wait
        // (the deadline is a hang guard, far above it, not a measured speed).
        let err = tokio::time::timeout(Duration::from_secs(60), ops::reserve(&tx, &schema, &key, &fp(), &wait))
            .await
            .expect("the statement timeout ends the wait")
            .unwrap_err();
        assert_eq!(err.sqlstate(), Some(tokio_postgres::error::SqlState::QUERY_CANCELED.code()), "{err:?}");
        drop(tx);
        holder.rollback().await.unwrap();
        assert!(ops::lookup(&admin, &schema, &key).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn repeatable_read_duplicates_are_retried_on_40001_and_run_once() {
        let config = Settings::builder().isolation(idempotency_client::Isolation::RepeatableRead).wait(true);
        // Through a proxy that counts the 40001 errors the server sends: the test must see retries.
        drop(handle_in(&db("idem_fault_rr"), Settings::default()).await);
        let proxy = Proxy::start(cluster_addr(), None).await;
        let idem = connect_with(&proxy.url(&db("idem_fault_rr")), 32, config);
        // A long REPEATABLE READ reader holds an old snapshot throughout.
        let pool = operator(&db("idem_fault_rr"));
        let mut reader = pool.get().await.unwrap();
        let snapshot = reader.build_transaction().isolation_level(tokio_postgres::IsolationLevel::RepeatableRead).start().await.unwrap();
        snapshot.query_one("SELECT count(*) FROM charges", &[]).await.unwrap();

        for round in 0..5 {
            let key = Key::new("fault.rr", "u", format!("k{round}")).unwrap();
            let runs = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
                tasks.push(tokio::spawn(async move { idem.run(&key, &fp(), charge(&runs, &key, Duration::from_millis(50))).await }));
            }
            let mut executed = 0;
            for t in tasks {
                match t.await.unwrap() {
                    Ok(Outcome::Executed(_)) => executed += 1,
                    Ok(Outcome::Replayed(_)) => {}
                    other => panic!("round {round}: {other:?}"),
                }
            }
            assert_eq!(executed, 1, "round {round}");
            assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}: a 40001 never reaches the closure");
            assert_eq!(charges_for(&pool.get().await.unwrap(), &key).await, 1);
        }
        snapshot.rollback().await.unwrap();
        // Every round raced 8 duplicates that waited on the holder: at least one of them must have
        // met a 40001 and been retried, or this test proved nothing about the retry.
        assert!(proxy.serialization_failures() >= 1, "no serialization failure happened");
    }
}
