//! Bounded waits: a server that stops answering in the middle of a call (the test kit's proxy
//! holds every chunk the client sends from the moment it is told to stall, its TCP connections
//! still up) must not hang the call. Each entry point runs with `Settings::call_timeout` of
//! [`BOUND`] through a stalled proxy, and the suite checks what a production service needs: the
//! call ends in `Error::StoreUnavailable` whose source is the `Elapsed` of `call_timeout`, well
//! within the bound plus a generous margin; no session of the database is left inside a
//! transaction (the dropped call's connection was closed, so the server rolled back), awaited
//! with a deadline; and once the server answers again, the next attempt on the same one-connection
//! pool executes, with exactly one business row. `run` and `run_batch` stall inside their
//! transaction (their closure starts the stall before its statement); the others stall before
//! their first request. Besides, `Settings::statement_timeout` reaches the server, and the URL's
//! `options` win over it. Written once over the test kit's driver names: both e2e passes
//! (`over_postgres::`, `over_sqlx::`, one binary) run it.

idempotency_testkit::for_each_driver! {
    use idempotency_client::{BatchItem, BatchOutcome, Elapsed, Error, Fingerprint, Key, OneStatement, Outcome, Settings, StoredResponse, TxFuture};
    use idempotency_testkit::proxy::Proxy;
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::{admin_at, charges_for, cluster_addr, fresh_database, unique_key, Failure};
    use serde_json::json;
    use std::fmt::Debug;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Every call's deadline in this suite.
    const BOUND: Duration = Duration::from_secs(2);
    /// What the test allows past the bound before it calls the call hung: generous, for a loaded
    /// machine.
    const MARGIN: Duration = Duration::from_secs(15);

    /// A fresh database reached through a proxy, an admin connection straight to it, and a handle
    /// through the proxy whose pool has one connection (the next attempt gets whatever the cut
    /// call left behind), already connected.
    struct Stage {
        proxy: Proxy,
        admin: deadpool_postgres::Client,
        idem: Idem,
    }

    impl Stage {
        async fn new(tag: &str) -> Stage {
            let db = format!("idem_stalled_{tag}_{}", NAME.replace('-', "_"));
            let url = fresh_database(&db).await;
            let admin = admin_at(&url).await;
            let proxy = Proxy::start(cluster_addr(), None).await;
            let idem = connect_with(&proxy.url(&db), 1, Settings::builder().call_timeout(Some(BOUND)));
            idem.check_extension().await.expect("the handle reaches the database through the proxy");
            Stage { proxy, admin, idem }
        }

        /// Awaits `call`, which the stall must cut: `StoreUnavailable` from the deadline of
        /// `call_timeout` naming `name`, within [`BOUND`] + [`MARGIN`]; the stall held something.
        async fn cut<T: Debug, E: Debug>(&self, name: &str, call: impl Future<Output = Result<T, Error<E>>>) {
            let started = Instant::now();
            // A call the deadline does not cut would hang: the guard fails the test instead.
            let result = tokio::time::timeout(BOUND + MARGIN, call).await.unwrap_or_else(|_| panic!("{NAME}: {name} through a stalled server hung past {:?}", BOUND + MARGIN));
            let took = started.elapsed();
            match &result {
                Err(Error::StoreUnavailable(source)) => {
                    let elapsed = source.downcast_ref::<Elapsed>().unwrap_or_else(|| panic!("{NAME}: {name}: not the deadline: {source:?}"));
                    assert_eq!((elapsed.setting(), elapsed.call(), elapsed.limit()), ("call_timeout", name, BOUND), "{NAME}");
                }
                other => panic!("{NAME}: {name} through a stalled server was not cut by its deadline: {other:?}"),
            }
            assert!(took < BOUND + MARGIN, "{NAME}: {name} ended {took:?} after it began; its bound is {BOUND:?}");
            assert!(self.proxy.held() > 0, "{NAME}: {name}: the proxy held nothing, so the call was never stalled");
        }

        /// Until no session of the database but the admin's is inside a transaction (within 30 s):
        /// the cut call's connection was closed, so the server rolled back what it had begun, while
        /// the server still answers nothing through the proxy. Then the proxy resumes.
        async fn settled_then_resume(&self) {
            let sql = "SELECT count(*), string_agg(pid || ' ' || state, ', ') FROM pg_catalog.pg_stat_activity
                        WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() AND xact_start IS NOT NULL";
            eventually(&format!("{NAME}: no session of the cut call is left in a transaction"), Duration::from_secs(30), || async {
                let row = self.admin.query_one(sql, &[]).await.map_err(|e| e.to_string())?;
                let n: i64 = row.get(0);
                if n == 0 { Ok(()) } else { Err(row.get::<_, Option<String>>(1).unwrap_or_default()) }
            })
            .await;
            self.proxy.resume();
        }

        /// The key's record, if any: its status.
        async fn status(&self, key: &Key) -> Option<String> {
            let sql = "SELECT _idem_status_word(status) AS status FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
            let rows = self.admin.query(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap();
            rows.first().map(|r| r.get(0))
        }

        /// The key is free: no record, no business row; the next attempt (the server answering
        /// again) executes once.
        async fn next_run_executes(&self, key: &Key) {
            assert_eq!(self.status(key).await, None, "{NAME}: the cut call left a record");
            assert_eq!(charges_for(&self.admin, key).await, 0, "{NAME}: the cut call's business row was committed");
            let runs = Arc::new(AtomicUsize::new(0));
            let next = self.idem.run(key, &fp(), Charge::of(key).handler::<Failure>(&runs)).await.expect("the next attempt");
            assert!(matches!(next, Outcome::Executed(_)), "{NAME}: {next:?}");
            assert_eq!((runs.load(Ordering::SeqCst), charges_for(&self.admin, key).await), (1, 1), "{NAME}");
        }
    }

    /// A `record` closure that writes nothing locally.
    fn nothing<'t>(_: &'t mut Conn, _: &'t StoredResponse) -> TxFuture<'t, (), DbError> {
        Box::pin(async { Ok(()) })
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_json(&json!({"amount": 100})).unwrap()
    }

    #[tokio::test]
    async fn run_stalled_inside_its_transaction_is_cut_and_leaves_the_key_free() {
        let stage = Stage::new("run").await;
        let key = unique_key("stalled.run");
        let proxy = stage.proxy.clone();
        let (tag, fingerprint) = (key.to_string(), fp());
        let call = stage.idem.run(&key, &fingerprint, move |conn: &mut Conn| {
            let (proxy, tag) = (proxy.clone(), tag.clone());
            Box::pin(async move {
                // The reservation is in the server's open transaction; from here the server answers
                // nothing.
                proxy.stall();
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('stalled', 1, $1)", &[&tag]).await?;
                Ok(StoredResponse::json(201, json!({})))
            }) as TxFuture<'_, _, DbError>
        });
        stage.cut("run", call).await;
        stage.settled_then_resume().await;
        stage.next_run_executes(&key).await;
    }

    #[tokio::test]
    async fn run_batch_stalled_inside_its_transaction_is_cut_and_leaves_the_keys_free() {
        let stage = Stage::new("batch").await;
        let user = "stalled-batch";
        let items: Vec<BatchItem> = (0..3).map(|i| BatchItem { key: format!("b-{i}"), fingerprint: fp() }).collect();
        let proxy = stage.proxy.clone();
        let call = stage.idem.run_batch("stalled.batch", user, &items, move |conn: &mut Conn, keys: &[String]| {
            let proxy = proxy.clone();
            let n = keys.len();
            Box::pin(async move {
                proxy.stall();
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('stalled-batch', 1, 'b')", &[]).await?;
                Ok(vec![StoredResponse::json(201, json!({})); n])
            }) as TxFuture<'_, _, DbError>
        });
        stage.cut("run_batch", call).await;
        stage.settled_then_resume().await;
        let records: i64 = stage.admin.query_one("SELECT count(*) FROM idem_records WHERE user_id = $1", &[&user]).await.unwrap().get(0);
        assert_eq!(records, 0, "{NAME}: the cut batch left records");
        let out = stage
            .idem
            .run_batch("stalled.batch", user, &items, |conn: &mut Conn, keys: &[String]| {
                let n = keys.len();
                Box::pin(async move {
                    exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('stalled-batch', 1, 'b')", &[]).await?;
                    Ok(vec![StoredResponse::json(201, json!({})); n])
                }) as TxFuture<'_, _, DbError>
            })
            .await
            .expect("the next batch");
        assert!(out.iter().all(|(_, o)| matches!(o, BatchOutcome::Executed(_))), "{NAME}: every key was free: {out:?}");
        let rows: i64 = stage.admin.query_one("SELECT count(*) FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get(0);
        assert_eq!(rows, 1, "{NAME}: only the second batch's row");
    }

    #[tokio::test]
    async fn run_statement_stalled_is_cut_and_leaves_the_key_free() {
        let stage = Stage::new("statement").await;
        let key = unique_key("stalled.statement");
        let tag = key.to_string();
        let write = OneStatement::new("INSERT INTO charges (user_id, amount, k) SELECT $1, 1, $2 FROM created RETURNING id").text(key.user_id()).text(&tag);
        stage.proxy.stall();
        stage.cut("run_statement", stage.idem.run_statement::<serde_json::Value>(&key, &fp(), &write)).await;
        stage.settled_then_resume().await;
        stage.next_run_executes(&key).await;
    }

    #[tokio::test]
    async fn run_external_stalled_at_its_reservation_is_cut_before_calling_out() {
        let stage = Stage::new("external").await;
        let key = unique_key("stalled.external");
        let calls = Arc::new(AtomicUsize::new(0));
        let call = |calls: Arc<AtomicUsize>| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, DbError>(StoredResponse::json(201, json!({"outside": true})))
        };
        stage.proxy.stall();
        stage.cut("run_external", stage.idem.run_external(&key, &fp(), call(calls.clone()), nothing)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{NAME}: the outside call was made although nothing was reserved");
        stage.settled_then_resume().await;
        // The reservation left in a task of its own (a dropped run_external never leaves a key that
        // nobody runs): once the server answers again it runs, sees nobody took its answer and
        // releases the key. Until then the next attempt finds it in progress.
        let next = eventually(&format!("{NAME}: the next attempt executes"), Duration::from_secs(30), || async {
            match stage.idem.run_external(&key, &fp(), call(calls.clone()), nothing).await {
                Err(Error::InProgress { .. }) => Err("in progress".to_owned()),
                other => Ok(other),
            }
        })
        .await;
        assert!(matches!(next, Ok(Outcome::Executed(_))), "{NAME}: {next:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{NAME}: the outside call was made once, by the next attempt");
    }

    #[tokio::test]
    async fn run_externals_outside_call_is_not_cut_by_the_deadline() {
        let stage = Stage::new("external_slow").await;
        let key = unique_key("stalled.external");
        // An outside call three bounds long: the deadline covers the database steps only.
        let slow = async {
            tokio::time::sleep(BOUND * 3).await;
            Ok::<_, DbError>(StoredResponse::json(201, json!({"outside": true})))
        };
        let out = stage.idem.run_external(&key, &fp(), slow, nothing).await.expect("a slow outside call is not a stalled store");
        assert!(matches!(out, Outcome::Executed(_)), "{NAME}: {out:?}");
        assert_eq!(stage.status(&key).await.as_deref(), Some("SUCCESS"), "{NAME}");
    }

    #[tokio::test]
    async fn check_extension_stalled_is_cut() {
        let stage = Stage::new("check").await;
        stage.proxy.stall();
        stage.cut("check_extension", stage.idem.check_extension()).await;
        stage.settled_then_resume().await;
        let version = stage.idem.check_extension().await.expect("the server answers again");
        assert!(!version.is_empty(), "{NAME}");
    }

    #[tokio::test]
    async fn statement_timeout_reaches_the_server_from_the_settings_and_the_urls_options_win() {
        let stage = Stage::new("statement_timeout").await;
        let db = format!("idem_stalled_statement_timeout_{}", NAME.replace('-', "_"));
        let settings = || Settings::builder().statement_timeout(Some(Duration::from_millis(1500)));
        let from_settings = connect_with(&stage.proxy.url(&db), 1, settings());
        assert_eq!(setting_of(&from_settings, "statement_timeout").await, 1500, "{NAME}: the setting is sent when connecting");
        let url = format!("{}&options=-c%20statement_timeout%3D2500", stage.proxy.url(&db));
        let from_url = connect_with(&url, 1, settings());
        assert_eq!(setting_of(&from_url, "statement_timeout").await, 2500, "{NAME}: the URL's options win");
        // Unset: the server's own (0 on the test cluster).
        assert_eq!(setting_of(&stage.idem, "statement_timeout").await, 0, "{NAME}: nothing is sent by default");
    }
}
