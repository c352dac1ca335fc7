//! `run_batch`: one transaction per batch of messages, every key's outcome, the closure given the
//! created keys; concurrent batches over the same keys run each key once.

use idempotency_client::{BatchItem, BatchOutcome, Error, Fingerprint, Idempotency, Outcome, Settings, StoredResponse, Tx, TxFuture};
use idempotency_testkit::{admin, test_database};

/// `run_batch` is the tokio-postgres driver's (the sqlx driver has no batch form yet): these
/// tests run on a tokio-postgres handle whatever the driver under test.
async fn handle(settings: Settings) -> Idempotency {
    Idempotency::connect_with(test_database().await, 100, settings).expect("pool")
}
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn items(prefix: &str, n: usize) -> Vec<BatchItem> {
    (0..n).map(|i| BatchItem { key: format!("{prefix}-{i}"), fingerprint: Fingerprint::of_json(&json!({"m": i})).unwrap() }).collect()
}

/// Writes one `charges` row per created key (tagged `user/key`) and answers 201 with the key.
fn consume(user: &str, seen: &Arc<AtomicUsize>) -> impl for<'t> FnMut(&'t Tx, &'t [String]) -> TxFuture<'t, Vec<StoredResponse>, tokio_postgres::Error> + Send {
    let (user, seen) = (user.to_owned(), seen.clone());
    move |tx, keys| {
        let (user, seen) = (user.clone(), seen.clone());
        Box::pin(async move {
            let tags: Vec<String> = keys.iter().map(|k| format!("{user}/{k}")).collect();
            tx.execute("INSERT INTO charges (user_id, amount, k) SELECT $1, 1, unnest($2::text[])", &[&user, &tags]).await?;
            seen.fetch_add(keys.len(), Ordering::SeqCst);
            Ok(keys.iter().map(|k| StoredResponse::json(201, json!({"key": k}))).collect())
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
    let fp = |v: i64| Fingerprint::of_json(&json!({"m": v})).unwrap();
    let single = |k: &str, v: i64| {
        let key = idempotency_client::Key::new("batch.op", user, k).unwrap();
        let idem = idem.clone();
        async move {
            idem.run(&key, &fp(v), |_| Box::pin(async { Ok::<_, tokio_postgres::Error>(StoredResponse::json(200, json!({"single": true}))) }))
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
    assert!(matches!(&out[4].1, BatchOutcome::Executed(_)), "{out:?}");
    assert_eq!((seen.load(Ordering::SeqCst), rows(user).await), (2, 2), "the closure saw the two created keys");
    // The same batch again: every created key replays, nothing runs.
    let again = idem.run_batch("batch.op", user, &batch[..1], consume(user, &seen)).await.unwrap();
    assert!(matches!(&again[0].1, BatchOutcome::Replayed(r) if r.body_json() == Some(json!({"key": "k-new"}))), "{again:?}");
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failed_batch_rolls_back_whole_and_reserves_nothing() {
    let idem = handle(Settings::default()).await;
    let user = "batch-fail";
    let batch = items("f", 10);
    let err = idem
        .run_batch("batch.op", user, &batch, |tx: &Tx, _keys: &[String]| {
            Box::pin(async move {
                tx.execute("INSERT INTO charges (user_id, amount, k) VALUES ('batch-fail', 1, 'x')", &[]).await.map_err(|_| "insert")?;
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
        .run_batch("batch.op", user, &items("g", 3), |_: &Tx, _: &[String]| {
            Box::pin(async { Ok(vec![StoredResponse::json(201, json!({}))]) }) as TxFuture<'_, _, tokio_postgres::Error>
        })
        .await
        .unwrap_err();
    assert!(matches!(&short, Error::Configuration { reason, .. } if reason.contains("one success or permanent-failure result per created key")), "{short:?}");
    // A bad key fails before any round trip.
    let bad = vec![BatchItem { key: String::new(), fingerprint: Fingerprint::of_bytes(b"x") }];
    assert!(matches!(idem.run_batch("batch.op", user, &bad, consume(user, &seen)).await, Err(Error::InvalidKey(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_over_the_same_keys_run_each_key_once() {
    let idem: Idempotency = handle(Settings::builder().wait(true)).await;
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
