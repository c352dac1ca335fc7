//! `run_batch` and a message that can never be handled: a closure error is counted for every key
//! the batch created, as `run` counts its key's, so a batch whose closure keeps failing poisons
//! its keys after `max_retries` attempts instead of being redelivered for ever; a permanent error
//! fails them at once with its response. Written once over the test kit's driver names, so both
//! drivers run it from one binary (`over_postgres::`, `over_sqlx::`).

idempotency_testkit::for_each_driver! {
    use idempotency_client::{BatchItem, BatchOutcome, Error, Fingerprint, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::{Failure};
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn items(prefix: &str, n: usize) -> Vec<BatchItem> {
        (0..n).map(|i| BatchItem { key: format!("{prefix}-{i}"), fingerprint: Fingerprint::of_json(&json!({"m": i})).unwrap() }).collect()
    }

    /// A batch whose closure writes a row, then fails with `error`; its calls counted in `calls`.
    async fn failing_batch(idem: &Idem, user: &str, items: &[BatchItem], calls: &Arc<AtomicUsize>, error: Failure) -> Result<Vec<(String, BatchOutcome<StoredResponse>)>, Error<Failure>> {
        let (calls, tag) = (calls.clone(), user.to_owned());
        idem.run_batch("poison.op", user, items, move |conn: &mut Conn, _keys: &[String]| {
            let (calls, tag, error) = (calls.clone(), tag.clone(), error.clone());
            Box::pin(async move {
                calls.fetch_add(1, Ordering::SeqCst);
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ($1, 1, 'poison')", &[&tag]).await?;
                Err::<Vec<StoredResponse>, _>(error)
            }) as TxFuture<'_, _, Failure>
        })
        .await
    }

    /// The failures counted for each of `user`'s keys, in key order.
    async fn attempts(user: &str) -> Vec<i32> {
        let sql = "SELECT attempts FROM idem_retries WHERE operation = 'poison.op' AND user_id = $1 ORDER BY key";
        admin().await.query(sql, &[&user]).await.unwrap().iter().map(|r| r.get(0)).collect()
    }

    async fn statuses(user: &str) -> Vec<String> {
        let sql = "SELECT _idem_status_word(status) AS status FROM idem_records WHERE operation = 'poison.op' AND user_id = $1 ORDER BY key";
        admin().await.query(sql, &[&user]).await.unwrap().iter().map(|r| r.get(0)).collect()
    }

    async fn rows(user: &str) -> i64 {
        admin().await.query_one("SELECT count(*) FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get(0)
    }

    #[tokio::test]
    async fn a_batch_whose_closure_keeps_failing_poisons_its_keys_after_max_retries() {
        let idem = handle(Settings::builder().max_retries(3)).await;
        let user = format!("poison-transient-{}", NAME.replace('-', "_"));
        let batch = items("p", 4);
        let calls = Arc::new(AtomicUsize::new(0));
        for attempt in 1..=2 {
            let err = failing_batch(&idem, &user, &batch, &calls, Failure(None)).await.unwrap_err();
            assert!(matches!(err, Error::Handler { error: Failure(None) }), "{NAME}: attempt {attempt}: {err:?}");
            assert_eq!(attempts(&user).await, vec![attempt; 4], "{NAME}: attempt {attempt} counted once for every key");
            assert!(statuses(&user).await.is_empty(), "{NAME}: attempt {attempt} released every key");
        }
        // The third failure is the last one allowed: every key is FAILED now.
        let err = failing_batch(&idem, &user, &batch, &calls, Failure(None)).await.unwrap_err();
        assert!(matches!(err, Error::Poisoned { error: Failure(None) }), "{NAME}: {err:?}");
        assert_eq!(statuses(&user).await, vec!["FAILED"; 4], "{NAME}");
        assert_eq!(rows(&user).await, 0, "{NAME}: every attempt's writes rolled back");
        // The redelivered batch is answered without calling the closure.
        let out = failing_batch(&idem, &user, &batch, &calls, Failure(None)).await.expect("a batch of failed keys");
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Failed(None))), "{NAME}: {out:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 3, "{NAME}: the closure ran three times, not a fourth");
    }

    #[tokio::test]
    async fn a_permanent_closure_error_fails_every_created_key_with_its_response() {
        let idem = handle(Settings::default()).await;
        let user = format!("poison-permanent-{}", NAME.replace('-', "_"));
        let batch = items("q", 3);
        let calls = Arc::new(AtomicUsize::new(0));
        let response = json!({"status": 422, "body": "unreadable message"});
        let err = failing_batch(&idem, &user, &batch, &calls, Failure(Some(response.clone()))).await.unwrap_err();
        assert!(matches!(&err, Error::Handler { error: Failure(Some(r)) } if *r == response), "{NAME}: {err:?}");
        assert_eq!(statuses(&user).await, vec!["FAILED"; 3], "{NAME}");
        assert_eq!(rows(&user).await, 0, "{NAME}: the batch's writes rolled back");
        let out = failing_batch(&idem, &user, &batch, &calls, Failure(None)).await.expect("a batch of failed keys");
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Failed(Some(r)) if *r == response)), "{NAME}: {out:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{NAME}: the closure ran once");
    }
}
