//! The one-statement flow from Rust (`Idempotency::run_statement`), over the driver under test:
//! every outcome `run` has, in one round trip, and the concurrency cases of the isolation spec
//! one_statement (in progress at once while a holder's reservation is uncommitted; with `wait`,
//! a replay after its commit and an execution after its rollback; one charge per key).

idempotency_testkit::for_each_driver! {
    use idempotency_client::{Error, Fingerprint, Json, Key, OneStatement, Outcome, Settings};

    use idempotency_testkit::proxy::Proxy;
    use idempotency_testkit::{charges_for, cluster_addr, fresh_database, unique_key};
    use serde::Deserialize;
    use serde_json::json;
    use std::time::Duration;

    const CHARGE: &str = "INSERT INTO charges (user_id, amount, k) SELECT $1, $2, $3 FROM created RETURNING id, amount";

    #[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
    struct Charged {
        id: i64,
        amount: i64,
    }

    type Answer = Json<serde_json::Value>;

    fn fp(amount: i64) -> Fingerprint {
        Fingerprint::of_json(&json!({ "amount": amount })).unwrap()
    }

    fn charge<'a>(key: &'a Key, k: &'a str, amount: i64) -> OneStatement<'a> {
        OneStatement::new(CHARGE).text(key.user_id()).int8(amount).text(k)
    }

    #[tokio::test]
    async fn executes_once_replays_and_refuses_another_request() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("one.charge");
        let k = key.to_string();
        let first = idem.run_statement::<Json<Charged>>(&key, &fp(100), &charge(&key, &k, 100)).await.unwrap();
        let Outcome::Executed(Json(charged)) = first else { panic!("{NAME}: {first:?}") };
        assert_eq!(charged.amount, 100);
        let again = idem.run_statement::<Json<Charged>>(&key, &fp(100), &charge(&key, &k, 100)).await.unwrap();
        assert_eq!(again, Outcome::Replayed(Json(charged.clone())), "{NAME}: the replay is the written row");
        let other = idem.run_statement::<Answer>(&key, &fp(7), &charge(&key, &k, 7)).await;
        assert!(matches!(other, Err(Error::Mismatch)), "{NAME}: {other:?}");
        assert_eq!(charges_for(&admin().await, &key).await, 1, "{NAME}: one charge");
    }

    #[tokio::test]
    async fn one_round_trip_for_an_execution_and_for_a_replay() {
        let name = &db("idem_one_statement_trips");
        fresh_database(name).await;
        let proxy = Proxy::start(cluster_addr(), None).await;
        let idem = connect_with(&proxy.url(name), 1, Settings::default());
        let mut trips = Vec::new();
        for i in 0..3 {
            let key = Key::new("one.trips", "u", format!("k{}", i.min(1))).unwrap();
            let k = key.to_string();
            settled(&idem).await;
            let before = proxy.round_trips();
            idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await.unwrap();
            trips.push(proxy.round_trips() - before);
        }
        // The first call also prepares the statement (tokio-postgres: one round trip more).
        assert_eq!(&trips[1..], &[1, 1], "{NAME}: an execution, then its replay: {trips:?}");
    }

    #[tokio::test]
    async fn a_failing_write_rolls_the_key_back_and_counts_until_poisoned() {
        let idem = handle(Settings::builder().max_retries(2)).await;
        let key = unique_key("one.fail");
        let k = key.to_string();
        // amount is NOT NULL: the write fails, the reservation rolls back with it, the failure is
        // counted in a second request.
        let failing = OneStatement::new("INSERT INTO charges (user_id, amount, k) SELECT $1, NULL, $2 FROM created RETURNING id").text(key.user_id()).text(&k);
        let first = idem.run_statement::<Answer>(&key, &fp(1), &failing).await;
        match &first {
            Err(Error::Handler { error }) => assert_eq!(error.sqlstate(), Some("23502"), "{NAME}"),
            other => panic!("{NAME}: {other:?}"),
        }
        let second = idem.run_statement::<Answer>(&key, &fp(1), &failing).await;
        assert!(matches!(second, Err(Error::Poisoned { .. })), "{NAME}: the max_retries-th failure poisons: {second:?}");
        let after = idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await;
        assert!(matches!(after, Err(Error::Failed { response: None })), "{NAME}: a poisoned key answers failed: {after:?}");
        assert_eq!(charges_for(&admin().await, &key).await, 0, "{NAME}: nothing written");

        // One failure, then a corrected write executes (the key was free).
        let key = unique_key("one.fail");
        let k = key.to_string();
        let failing = OneStatement::new("INSERT INTO charges (user_id, amount, k) SELECT $1, NULL, $2 FROM created RETURNING id").text(key.user_id()).text(&k);
        assert!(matches!(idem.run_statement::<Answer>(&key, &fp(1), &failing).await, Err(Error::Handler { .. })));
        let fixed = idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await.unwrap();
        assert!(fixed.is_executed(), "{NAME}: {fixed:?}");
    }

    #[tokio::test]
    async fn statements_that_break_the_rules_are_refused_before_a_round_trip() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("one.rules");
        for (sql, rule) in [("INSERT INTO charges (user_id, amount) VALUES ($1, 1) RETURNING id", "created"), ("INSERT INTO charges (user_id, amount) SELECT $1, 1 FROM created", "RETURNING")] {
            match idem.run_statement::<Answer>(&key, &fp(1), &OneStatement::new(sql).text("u")).await {
                Err(Error::Configuration { reason, .. }) => assert!(reason.contains(rule), "{reason}"),
                other => panic!("{sql}: {other:?}"),
            }
        }
    }

    /// A holder's uncommitted reservation of `key`, on a connection of its own.
    async fn hold(key: &Key) -> deadpool_postgres::Client {
        let holder = admin().await;
        holder.batch_execute("BEGIN").await.unwrap();
        let row = holder
            .query_one("SELECT outcome FROM idem_reserve($1, $2, $3, $4)", &[&key.operation(), &key.user_id(), &key.key(), &fp(1).as_str()])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "created");
        holder
    }

    #[tokio::test]
    async fn a_held_key_is_in_progress_at_once_or_waited_for() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("one.held");
        let k = key.to_string();
        let holder = hold(&key).await;
        let busy = idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{NAME}: {busy:?}");

        // With wait: blocked until the holder ends; its rollback lets this call execute.
        let waiting = handle(Settings::builder().wait(true)).await;
        let call = {
            let (key, k) = (key.clone(), k.clone());
            tokio::spawn(async move { waiting.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await })
        };
        wait_for_lock_waiter(&key).await;
        holder.batch_execute("ROLLBACK").await.unwrap();
        let out = call.await.unwrap().unwrap();
        assert!(out.is_executed(), "{NAME}: after the holder's rollback: {out:?}");
        assert_eq!(charges_for(&admin().await, &key).await, 1);
    }

    /// A holder's charge of `key` (reserved, written and completed with the row as its response),
    /// uncommitted, on a connection of its own; and that response.
    async fn charge_uncommitted(key: &Key, k: &str) -> (deadpool_postgres::Client, serde_json::Value) {
        let holder = admin().await;
        holder.batch_execute("BEGIN").await.unwrap();
        let (op, user, kk, hash) = (key.operation(), key.user_id(), key.key(), fp(1));
        let token: i64 = holder
            .query_one("SELECT token FROM idem_reserve($1, $2, $3, $4) WHERE outcome = 'created'", &[&op, &user, &kk, &hash.as_str()])
            .await
            .unwrap()
            .get(0);
        let row = holder.query_one("INSERT INTO charges (user_id, amount, k) VALUES ($1, 1, $2) RETURNING id, amount", &[&user, &k]).await.unwrap();
        let response = json!({ "id": row.get::<_, i64>(0), "amount": row.get::<_, i64>(1) });
        holder.execute("SELECT idem_complete($1, $2, $3, $4, $5)", &[&op, &user, &kk, &token, &response]).await.unwrap();
        (holder, response)
    }

    #[tokio::test]
    async fn a_key_charged_by_an_uncommitted_holder_replays_its_row_after_the_commit() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("one.commit");
        let k = key.to_string();
        let (holder, response) = charge_uncommitted(&key, &k).await;
        let busy = idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{NAME}: while the holder is open: {busy:?}");

        // With wait: blocked until the holder ends; its commit makes this call a replay of the
        // holder's row, and the statement writes nothing.
        let waiting = handle(Settings::builder().wait(true)).await;
        let call = {
            let (key, k) = (key.clone(), k.clone());
            tokio::spawn(async move { waiting.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await })
        };
        wait_for_lock_waiter(&key).await;
        holder.batch_execute("COMMIT").await.unwrap();
        let waited = call.await.unwrap().unwrap();
        assert_eq!(waited, Outcome::Replayed(Json(response.clone())), "{NAME}: the waiter after the holder's commit");
        // Without wait, after the commit: the same replay.
        let after = idem.run_statement::<Answer>(&key, &fp(1), &charge(&key, &k, 1)).await.unwrap();
        assert_eq!(after, Outcome::Replayed(Json(response)), "{NAME}: after the holder's commit");
        assert_eq!(charges_for(&admin().await, &key).await, 1, "{NAME}: the holder's charge only");
    }

    /// Until some session waits on a lock (the blocked reservation).
    async fn wait_for_lock_waiter(key: &Key) {
        let admin = admin().await;
        idempotency_testkit::server::eventually(&format!("a session blocked on {key}"), Duration::from_secs(10), || async {
            let n: i64 = admin
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()", &[])
                .await
                .map_err(|e| e.to_string())?
                .get(0);
            if n > 0 { Ok(()) } else { Err("no waiter".to_owned()) }
        })
        .await
    }

    #[tokio::test]
    async fn concurrent_duplicates_charge_once() {
        let idem = handle(Settings::default()).await;
        let key = unique_key("one.race");
        let k = key.to_string();
        let calls: Vec<_> = (0..32)
            .map(|_| {
                let (idem, key, k) = (idem.clone(), key.clone(), k.clone());
                tokio::spawn(async move { idem.run_statement::<Answer>(&key, &fp(5), &charge(&key, &k, 5)).await })
            })
            .collect();
        let mut executed = 0;
        for call in calls {
            match call.await.unwrap() {
                Ok(Outcome::Executed(_)) => executed += 1,
                Ok(Outcome::Replayed(_)) | Err(Error::InProgress { .. }) => {}
                other => panic!("{NAME}: {other:?}"),
            }
        }
        assert_eq!(executed, 1, "{NAME}: one execution");
        assert_eq!(charges_for(&admin().await, &key).await, 1, "{NAME}: one charge");
    }
}
