//! `run_batch`: one transaction per batch of messages, every key's outcome, the closure given the
//! transaction's connection and the created keys; concurrent batches over the same keys run each
//! key once; the round trips of a batch. Written once over the test kit's driver names, so both
//! drivers run it from one binary (`over_postgres::`, `over_sqlx::`).

idempotency_testkit::for_each_driver! {
    use idempotency_client::{BatchItem, BatchOutcome, Error, Fingerprint, Outcome, Settings, StoredResponse, TxFuture};

    use idempotency_testkit::proxy::Proxy;
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::{cluster_addr, fresh_database};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    fn fp(v: i64) -> Fingerprint {
        Fingerprint::of_json(&json!({"m": v})).unwrap()
    }

    fn items(prefix: &str, n: usize) -> Vec<BatchItem> {
        (0..n).map(|i| BatchItem { key: format!("{prefix}-{i}"), fingerprint: fp(i as i64) }).collect()
    }

    /// Writes one `charges` row per created key (tagged `user/key`) in one statement; answers 201
    /// with the key for each.
    async fn charge(conn: &mut Conn, user: &str, keys: &[String]) -> Result<Vec<StoredResponse>, DbError> {
        let tags: Vec<String> = keys.iter().map(|k| format!("{user}/{k}")).collect();
        let sql = "INSERT INTO charges (user_id, amount, k) SELECT $1, 1, unnest(pg_catalog.string_to_array($2, ' '))";
        exec(conn, sql, &[user, &tags.join(" ")]).await?;
        Ok(keys.iter().map(|k| StoredResponse::json(201, json!({"key": k}))).collect())
    }

    /// A consumer: [`charge`], counting the keys it saw.
    fn consume(user: &str, seen: &Arc<AtomicUsize>) -> impl for<'t> FnMut(&'t mut Conn, &'t [String]) -> TxFuture<'t, Vec<StoredResponse>, DbError> + Send {
        let (user, seen) = (user.to_owned(), seen.clone());
        move |conn, keys| {
            let (user, seen) = (user.clone(), seen.clone());
            Box::pin(async move {
                let answers = charge(conn, &user, keys).await?;
                seen.fetch_add(keys.len(), Ordering::SeqCst);
                Ok(answers)
            })
        }
    }

    async fn rows(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) AS n FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get("n")
    }

    #[tokio::test]
    async fn every_key_answers_in_input_order_and_the_created_ones_run() {
        let idem = handle(Settings::default()).await;
        let user = "batch-order";
        let seen = Arc::new(AtomicUsize::new(0));
        // k-done already succeeded, k-other was used with another request.
        let single = |k: &str, v: i64| {
            let key = idempotency_client::Key::new("batch.op", user, k).unwrap();
            let idem = idem.clone();
            async move {
                idem.run(&key, &fp(v), |_| Box::pin(async { Ok::<_, DbError>(StoredResponse::json(200, json!({"single": true}))) }))
                    .await
            }
        };
        assert!(matches!(single("k-done", 1).await, Ok(Outcome::Executed(_))));
        assert!(matches!(single("k-other", 9).await, Ok(Outcome::Executed(_))));
        let batch = vec![
            BatchItem { key: "k-new".into(), fingerprint: fp(0) },
            BatchItem { key: "k-done".into(), fingerprint: fp(1) },
            BatchItem { key: "k-other".into(), fingerprint: fp(2) },
            BatchItem { key: "k-new".into(), fingerprint: fp(0) },
            BatchItem { key: "k-last".into(), fingerprint: fp(3) },
        ];
        let out = idem.run_batch("batch.op", user, &batch, consume(user, &seen)).await.unwrap();
        let keys: Vec<_> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["k-new", "k-done", "k-other", "k-new", "k-last"], "input order");
        assert!(matches!(&out[0].1, BatchOutcome::Executed(r) if r.body_json() == Some(json!({"key": "k-new"}))), "{out:?}");
        assert!(matches!(&out[1].1, BatchOutcome::Replayed(r) if r.status == 200), "{out:?}");
        assert!(matches!(out[2].1, BatchOutcome::Mismatch), "{out:?}");
        assert!(matches!(out[3].1, BatchOutcome::InProgress), "a key repeated in the batch: its first occurrence holds it: {out:?}");
        assert!(matches!(&out[4].1, BatchOutcome::Executed(r) if r.body_json() == Some(json!({"key": "k-last"}))), "{out:?}");
        assert_eq!((seen.load(Ordering::SeqCst), rows(user).await), (2, 2), "the closure saw the two created keys");
        // The same batch again: every created key replays, nothing runs.
        let again = idem.run_batch("batch.op", user, &batch[..1], consume(user, &seen)).await.unwrap();
        assert!(matches!(&again[0].1, BatchOutcome::Replayed(r) if r.body_json() == Some(json!({"key": "k-new"}))), "{again:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn results_are_recorded_by_their_verdict() {
        let idem = handle(Settings::default()).await;
        let user = "batch-verdict";
        let batch = items("v", 3);
        // 201, 402 (a permanent failure), 200: both completion statements of the batch, one request.
        let out = idem
            .run_batch("batch.op", user, &batch, |_: &mut Conn, keys: &[String]| {
                let statuses = [201, 402, 200];
                let answers = keys.iter().zip(statuses).map(|(k, s)| StoredResponse::json(s, json!({"key": k}))).collect();
                Box::pin(async move { Ok(answers) }) as TxFuture<'_, _, DbError>
            })
            .await
            .unwrap();
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "{out:?}");
        let seen = Arc::new(AtomicUsize::new(0));
        let again = idem.run_batch("batch.op", user, &batch, consume(user, &seen)).await.unwrap();
        assert!(matches!(&again[0].1, BatchOutcome::Replayed(r) if r.status == 201), "{again:?}");
        assert!(matches!(&again[1].1, BatchOutcome::Failed(Some(stored)) if stored["status"] == 402), "{again:?}");
        assert!(matches!(&again[2].1, BatchOutcome::Replayed(r) if r.status == 200), "{again:?}");
        assert_eq!(seen.load(Ordering::SeqCst), 0, "nothing ran again");
    }

    #[tokio::test]
    async fn a_failed_batch_rolls_back_whole_and_reserves_nothing() {
        let idem = handle(Settings::default()).await;
        let user = "batch-fail";
        let batch = items("f", 10);
        let err = idem
            .run_batch("batch.op", user, &batch, |conn: &mut Conn, _keys: &[String]| {
                Box::pin(async move {
                    exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('batch-fail', 1, 'x')", &[]).await.map_err(|_| "insert")?;
                    Err::<Vec<StoredResponse>, _>("the consumer failed")
                }) as TxFuture<'_, _, &'static str>
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Handler { error: "the consumer failed" }), "{err:?}");
        assert_eq!(rows(user).await, 0, "the batch's writes rolled back");
        let seen = Arc::new(AtomicUsize::new(0));
        let out = idem.run_batch("batch.op", user, &batch, consume(user, &seen)).await.unwrap();
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "nothing was left reserved: {out:?}");
        // A closure that returns too few results is refused, and rolls back.
        let short = idem
            .run_batch("batch.op", user, &items("g", 3), |_: &mut Conn, _: &[String]| {
                Box::pin(async { Ok(vec![StoredResponse::json(201, json!({}))]) }) as TxFuture<'_, _, DbError>
            })
            .await
            .unwrap_err();
        assert!(matches!(&short, Error::Configuration { reason, .. } if reason.contains("one success or permanent-failure result per created key")), "{short:?}");
        // A transient result is refused (no savepoint to undo one key alone): the whole batch, its
        // writes included, rolls back.
        let transient = idem
            .run_batch("batch.op", user, &items("t", 2), |conn: &mut Conn, keys: &[String]| {
                let n = keys.len();
                Box::pin(async move {
                    exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('batch-fail', 1, 'transient')", &[]).await?;
                    Ok(vec![StoredResponse::json(503, json!({})); n])
                }) as TxFuture<'_, _, DbError>
            })
            .await
            .unwrap_err();
        assert!(matches!(&transient, Error::Configuration { reason, .. } if reason.contains("with a transient one")), "{transient:?}");
        assert_eq!(rows(user).await, 10, "only the successful batch's rows");
        let out = idem.run_batch("batch.op", user, &items("t", 2), consume(user, &seen)).await.unwrap();
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "the refused batch reserved nothing: {out:?}");
        // A bad key fails before any round trip.
        let bad = vec![BatchItem { key: String::new(), fingerprint: Fingerprint::of_bytes(b"x") }];
        assert!(matches!(idem.run_batch("batch.op", user, &bad, consume(user, &seen)).await, Err(Error::InvalidKey(_))));
    }

    #[tokio::test]
    async fn a_lost_lease_rolls_the_whole_batch_back() {
        let idem = handle(Settings::default()).await;
        let user = "batch-lease";
        let batch = items("l", 3);
        let seen = Arc::new(AtomicUsize::new(0));
        // The closure writes its rows, then (as a takeover would) moves one key's record to another
        // token: that key's completion fails, and the COMMIT behind it commits nothing. The lookup
        // first writes the reservation's record (the native hot path keeps it in memory).
        let err = idem
            .run_batch("batch.op", user, &batch, |conn: &mut Conn, keys: &[String]| {
                Box::pin(async move {
                    let answers = charge(conn, "batch-lease", keys).await?;
                    exec(conn, "SELECT FROM idem_lookup('batch.op', 'batch-lease', 'l-1')", &[]).await?;
                    exec(conn, "UPDATE idem_records SET token = token + 1000000 WHERE user_id = 'batch-lease' AND key = 'l-1'", &[]).await?;
                    Ok(answers)
                }) as TxFuture<'_, _, DbError>
            })
            .await
            .unwrap_err();
        assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
        assert_eq!(rows(user).await, 0, "the batch's writes rolled back with the COMMIT");
        let out = idem.run_batch("batch.op", user, &batch, consume(user, &seen)).await.unwrap();
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "every key free again: {out:?}");
        assert_eq!(rows(user).await, 3);
    }

    #[tokio::test]
    async fn a_serialization_failure_retries_the_whole_batch() {
        let idem = handle(Settings::default()).await;
        let user = "batch-retry";
        let seen = Arc::new(AtomicUsize::new(0));
        let tries = Arc::new(AtomicUsize::new(0));
        let out = idem
            .run_batch("batch.op", user, &items("s", 4), {
                let (tries, seen) = (tries.clone(), seen.clone());
                move |conn: &mut Conn, keys: &[String]| {
                    let first = tries.fetch_add(1, Ordering::SeqCst) == 0;
                    seen.fetch_add(keys.len(), Ordering::SeqCst);
                    Box::pin(async move {
                        let answers = charge(conn, "batch-retry", keys).await?;
                        if first {
                            batch(conn, "DO $$ BEGIN RAISE EXCEPTION 'forced' USING ERRCODE = 'serialization_failure'; END $$").await?;
                        }
                        Ok(answers)
                    }) as TxFuture<'_, _, DbError>
                }
            })
            .await
            .unwrap();
        assert_eq!(tries.load(Ordering::SeqCst), 2, "the closure ran again");
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "{out:?}");
        assert_eq!((seen.load(Ordering::SeqCst), rows(user).await), (8, 4), "only the second run's rows committed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_batches_over_the_same_keys_run_each_key_once() {
        let idem: Idem = handle(Settings::builder().wait(true)).await;
        let user = "batch-race";
        let batch = items("r", 200);
        let seen = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (idem, batch, seen) = (idem.clone(), batch.clone(), seen.clone());
            tasks.push(tokio::spawn(async move { idem.run_batch("batch.op", user, &batch, consume(user, &seen)).await }));
        }
        let mut executed = 0;
        for t in tasks {
            let out = t.await.unwrap().unwrap();
            assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_) | BatchOutcome::Replayed(_))), "{out:?}");
            executed += out.iter().filter(|(_, o)| matches!(o, BatchOutcome::Executed(_))).count();
        }
        assert_eq!(executed, 200, "every key executed by exactly one batch");
        assert_eq!((seen.load(Ordering::SeqCst), rows(user).await), (200, 200));
    }

    #[tokio::test]
    async fn a_thousand_keys_in_one_batch() {
        let idem = handle(Settings::default()).await;
        let user = "batch-big";
        let seen = Arc::new(AtomicUsize::new(0));
        let out = idem.run_batch("batch.op", user, &items("big", 1000), consume(user, &seen)).await.unwrap();
        assert_eq!(out.iter().filter(|(_, o)| matches!(o, BatchOutcome::Executed(_))).count(), 1000);
        assert_eq!(rows(user).await, 1000);
    }

    /// One simple statement (no parse round trip on either driver) for all the created keys.
    fn one<'t>(conn: &'t mut Conn, keys: &'t [String]) -> TxFuture<'t, Vec<StoredResponse>, DbError> {
        let n = keys.len();
        Box::pin(async move {
            batch(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('batch-rt', 1, 'x')").await?;
            Ok(vec![StoredResponse::json(201, json!({})); n])
        })
    }

    /// Round trips of `call` through `proxy`: those the caller waited for (counted when it returns),
    /// and all of them once the `background` ones the driver sends after returning (a queued
    /// `ROLLBACK`, sqlx's check of a connection given back to its pool) have gone out too, awaited:
    /// the count must reach `waited + background` within 10 s, and a count past it fails at once.
    /// Each call starts after the previous one's background work, so none leaks into the next count.
    async fn trips<F: std::future::Future<Output = ()>>(proxy: &Proxy, background: u64, call: F) -> (u64, u64) {
        let before = proxy.round_trips();
        call.await;
        let waited = proxy.round_trips() - before;
        let all = eventually(&format!("{NAME}: {background} round trip(s) after the call returned"), Duration::from_secs(10), || async {
            let all = proxy.round_trips() - before;
            assert!(all <= waited + background, "{NAME}: {all} round trips, {waited} waited for and more than {background} after");
            if all == waited + background { Ok(all) } else { Err(format!("{all} round trips")) }
        })
        .await;
        (waited, all)
    }

    // A current-thread runtime: nothing queued in the background leaves before the count is read at
    // the moment the call returns.
    #[tokio::test]
    async fn a_batch_takes_three_round_trips_on_either_driver() {
        let name = &db("idem_batch_round_trips");
        fresh_database(name).await;
        let proxy = Proxy::start(cluster_addr(), None).await;
        let idem = connect_with(&proxy.url(name), 1, Settings::default());
        let user = "batch-rt";
        // Either driver: BEGIN+reserve_many, the INSERT, complete_many+COMMIT (one simple query
        // each over sqlx); a batch that created nothing answers after BEGIN+reserve_many, its
        // ROLLBACK queued. sqlx also checks the connection when it is given back to the pool (one
        // more, after the queued ROLLBACK if there is one), which the call does not wait for.
        let expected = match NAME {
            "sqlx" => ((3, 4), (1, 3)),
            _ => ((3, 3), (1, 2)),
        };
        let background = |(waited, all): (u64, u64)| all - waited;
        // Warm up: the connection, the schema (a new key executes, as below).
        trips(&proxy, background(expected.0), async {
            idem.run_batch("batch.rt", user, &items("warm", 2), one).await.unwrap();
        })
        .await;
        let executed = trips(&proxy, background(expected.0), async {
            let out = idem.run_batch("batch.rt", user, &items("k", 50), one).await.unwrap();
            assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "{out:?}");
        })
        .await;
        let replayed = trips(&proxy, background(expected.1), async {
            let out = idem.run_batch("batch.rt", user, &items("k", 50), one).await.unwrap();
            assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Replayed(_))), "{out:?}");
        })
        .await;
        assert!(!pooled_in_transaction(&idem).await, "the connection went back to the pool outside any transaction");
        assert_eq!((executed, replayed), expected, "{NAME}: (waited, all) round trips of an executed and a replayed batch of 50 keys");
    }
}
