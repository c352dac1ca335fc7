//! A server crash under load (`pg_ctl stop -m immediate` mid-run, then restart), several rounds.
//! Invariants: every key whose commit was acknowledged replays; once every client has retried
//! every key, each key has exactly one business row and one SUCCESS record.
//! Its own test binary: it restarts the shared private cluster, so its two drivers' instances
//! take turns ([`ONE_CRASH_AT_A_TIME`]).

/// Held by each driver's instance for its whole run: a crash of the shared cluster by one must
/// not land in the other's checks.
static ONE_CRASH_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

idempotency_testkit::for_each_driver! {
    use idempotency_client::{Settings, Fingerprint, Key, Outcome, StoredResponse};
    use idempotency_testkit::server::Stop;
    use idempotency_testkit::{admin_at, fresh_database, private_server};
    use serde_json::json;
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    const ROUNDS: usize = 3;
    const KEYS: usize = 1500;
    const WORKERS: usize = 8;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn server_crash_under_load_loses_no_acknowledged_key_and_runs_none_twice() {
        let _turn = super::ONE_CRASH_AT_A_TIME.lock().await;
        let url = fresh_database(&db("idem_fault_crash")).await;
        let idem = connect_with(&url, u32::try_from(WORKERS * 2).expect("the pool size"), Settings::default());
        let fp = Fingerprint::of_json(&json!({"amount": 1})).unwrap();
        let mut report = Vec::new();
        for round in 0..ROUNDS {
            let keys: Arc<Vec<Key>> = Arc::new((0..KEYS).map(|i| Key::new("fault.crash", format!("round-{round}"), format!("k{i}")).unwrap()).collect());
            let acked = Arc::new(Mutex::new(HashSet::<usize>::new()));
            let executed = Arc::new(AtomicUsize::new(0));
            let failures = Arc::new(AtomicUsize::new(0));
            let mut workers = Vec::new();
            for w in 0..WORKERS {
                let (idem, keys, acked, executed, failures, fp) = (idem.clone(), keys.clone(), acked.clone(), executed.clone(), failures.clone(), fp.clone());
                workers.push(tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    for i in (w..KEYS).step_by(WORKERS) {
                        let tag = keys[i].to_string();
                        loop {
                            let tag = tag.clone();
                            let result = idem
                                .run(&keys[i], &fp, move |tx| {
                                    let tag = tag.clone();
                                    Box::pin(async move {
                                        exec(tx, "INSERT INTO charges (user_id, amount, k) VALUES ('crash', 1, $1)", &[&tag]).await?;
                                        Ok::<_, DbError>(StoredResponse::json(201, json!({})))
                                    })
                                })
                                .await;
                            match result {
                                Ok(outcome) => {
                                    if matches!(outcome, Outcome::Executed(_)) {
                                        executed.fetch_add(1, Ordering::SeqCst);
                                    }
                                    acked.lock().unwrap().insert(i);
                                    break;
                                }
                                // The server is down or restarting: the client retries the same key.
                                Err(_) => {
                                    failures.fetch_add(1, Ordering::SeqCst);
                                    assert!(Instant::now() < deadline, "the server never came back");
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            }
                        }
                    }
                }));
            }
            // Crash once a third of the keys are acknowledged.
            while acked.lock().unwrap().len() < KEYS / 3 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let acked_before_crash: HashSet<usize> = acked.lock().unwrap().clone();
            tokio::task::spawn_blocking(|| {
                private_server().stop(Stop::Immediate);
                std::thread::sleep(Duration::from_millis(300));
                private_server().start();
            })
            .await
            .unwrap();
            for w in workers {
                w.await.unwrap();
            }

            // Every acknowledged key replays; every key has one row and one SUCCESS record.
            let client = admin_at(&url).await;
            for &i in &acked_before_crash {
                let again = idem
                    .run(&keys[i], &fp, |_tx| Box::pin(async { Ok::<_, DbError>(StoredResponse::json(500, json!({}))) }))
                    .await
                    .unwrap();
                assert!(again.is_replayed(), "round {round}: acknowledged key {i} did not replay: {again:?}");
            }
            let rows = client
                .query(
                    "SELECT k, count(*) AS n FROM charges WHERE user_id = 'crash' AND k LIKE $1 GROUP BY k",
                    &[&format!("fault.crash/round-{round}/%")],
                )
                .await
                .unwrap();
            let doubles = rows.iter().filter(|r| r.get::<_, i64>("n") != 1).count();
            let success: i64 = client
                .query_one(
                    "SELECT count(*) AS n FROM idem_records WHERE operation = 'fault.crash' AND user_id = $1 AND status = 'SUCCESS'",
                    &[&format!("round-{round}")],
                )
                .await
                .unwrap()
                .get("n");
            assert_eq!(doubles, 0, "round {round}: keys with more than one business row");
            assert_eq!(rows.len(), KEYS, "round {round}: every key has its business row");
            assert_eq!(success as usize, KEYS, "round {round}: every key has one SUCCESS record");
            report.push(format!(
                "round {round}: {KEYS} keys, {} acknowledged before the crash (all replayed), {} failed calls retried, {} executions, 0 double executions",
                acked_before_crash.len(),
                failures.load(Ordering::SeqCst),
                executed.load(Ordering::SeqCst)
            ));
        }
        for line in report {
            println!("{line}");
        }
    }
}
