//! Cancellation: every entry point's future dropped at each of its round trips in turn (what a
//! `tokio::time::timeout`, tower's `TimeoutLayer` or a `select!` around a call does). Each step
//! is stalled in the server, not guessed with a timer: a reservation (made with `wait`) waits for
//! another transaction's uncommitted reservation of the same key, a closure's write and a
//! completion for an advisory lock taken by a
//! statement-level trigger (armed from inside the closure for a completion, so the reservation
//! before it passes), `check_extension` for a lock on `pg_extension`; the test holds each lock,
//! and the future is dropped once the server shows the call's backend waiting for it.
//!
//! Over tokio-postgres a dropped guard sends a cancel request; over sqlx (no cancel request) it
//! closes the connection, and the server's connection check (`client_connection_check_interval`,
//! which the sqlx handle's pool sets to 1 s) ends the backend. So the suite first shows the
//! dropped backend gone while the lock is still held: nothing it sent can commit. Then the lock is released, and the suite checks what a
//! production service needs: no session of the database is left in a transaction, the pooled
//! connection is not inside one,
//! the key's record is what the entry point's documentation says, and the next attempt runs (or
//! replays) with exactly one business row. Every handle has a pool of ONE connection, so the next
//! attempt gets whatever connection the dropped call left behind. Written once over the test
//! kit's driver names: both drivers run it from one binary (`over_postgres::`, `over_sqlx::`),
//! on both installs. `run` dropped at its reservation and in its closure runs besides over a
//! server that accepts TLS only, in each `sslmode` that reaches it (`..._over_tls_<mode>_...`).

idempotency_testkit::for_each_driver! {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::post;
    use axum::Router;
    use idempotency_tower::{IdempotencyLayer, Mode, Transaction};
    use idempotency_client::{BatchItem, Error, Fingerprint, Key, OneStatement, Outcome, Settings, SettingsBuilder, StoredResponse, TxFuture};
    use idempotency_testkit::server::eventually;
    use idempotency_testkit::tls_server::TlsServer;
    use idempotency_testkit::{admin_at, charges_for, fresh_database, unique_key, Failure};
    use serde_json::{json, Value};
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tower::ServiceExt;

    /// The advisory lock the stalled steps wait for.
    const GATE: i64 = 4_242_001;

    /// What the stall trigger needs in a test database: the points where a statement waits at the
    /// gate (`<TG_OP> <table>`), and the trigger on the records table and the business table.
    const SETUP: &str = "
    CREATE TABLE stall_points (point text PRIMARY KEY);
    CREATE FUNCTION stall_gate() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN
        IF EXISTS (SELECT FROM public.stall_points WHERE point IN (TG_OP || ' ' || TG_TABLE_NAME, '* ' || TG_TABLE_NAME)) THEN
            PERFORM pg_catalog.pg_advisory_xact_lock_shared(4242001);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER stall BEFORE INSERT OR UPDATE OR DELETE ON idem_records FOR EACH STATEMENT EXECUTE FUNCTION stall_gate();
    CREATE TRIGGER stall BEFORE INSERT OR UPDATE OR DELETE ON charges FOR EACH STATEMENT EXECUTE FUNCTION stall_gate();
    ";

    /// A test database with the stall trigger, the gate held by a session of its own, an admin
    /// connection, and a handle whose pool has one connection.
    struct Stage {
        admin: Arc<deadpool_postgres::Client>,
        gate: deadpool_postgres::Client,
        gate_pid: i32,
        idem: Idem,
    }

    impl Stage {
        async fn new(name: &str, settings: impl Into<Settings>) -> Stage {
            let url = fresh_database(&db(name)).await;
            Stage::at(&url, &url, settings.into()).await
        }

        /// The stage on the database of `admin_url` (the admin's and the gate's sessions), the
        /// handle connected through `url` (the same database, its own TLS options).
        async fn at(admin_url: &str, url: &str, settings: Settings) -> Stage {
            let admin = admin_at(admin_url).await;
            admin.batch_execute(SETUP).await.expect("the stall trigger");
            let gate = admin_at(admin_url).await;
            let gate_pid: i32 = gate.query_one("SELECT pg_catalog.pg_backend_pid()", &[]).await.unwrap().get(0);
            gate.execute("SELECT pg_catalog.pg_advisory_lock($1)", &[&GATE]).await.expect("take the gate");
            Stage { admin: Arc::new(admin), gate, gate_pid, idem: connect_with(url, 1, settings) }
        }

        /// Statements `point` (`INSERT charges`, `* idem_records`, ...) wait at the gate from now.
        async fn stall_at(&self, point: &str) {
            stall_at(&self.admin, point).await
        }

        /// A reservation of `key` made with `wait` waits from now: the gate's session holds an
        /// uncommitted reservation of it (the same request), rolled back when the gate opens.
        async fn stall_reservations_of(&self, key: &Key) {
            self.gate.batch_execute("BEGIN").await.unwrap();
            let sql = "SELECT outcome FROM idem_reserve($1, $2, $3, $4)";
            let row = self.gate.query_one(sql, &[&key.operation(), &key.user_id(), &key.key(), &fp().as_str()]).await.expect("hold the key");
            assert_eq!(row.get::<_, String>(0), "created");
        }

        /// Drops the stalled `call`; over a driver that cancels on drop, shows the dropped backend
        /// gone while the gate is still closed (so nothing it sent can commit); then opens the gate
        /// and waits until the database has settled.
        async fn drop_stalled<F: Future>(&self, call: F) {
            drop_when_stalled(self, call).await;
            self.quiet("the dropped call's backend ends with the gate closed").await;
            self.open().await;
            self.settled().await;
        }

        /// Until a backend of this database (not the gate's) waits for a lock: the call is stalled
        /// inside the server.
        async fn stalled(&self) {
            let sql = "SELECT count(*) FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a USING (pid)
                        WHERE NOT l.granted AND a.datname = pg_catalog.current_database() AND a.pid <> $1";
            eventually("the call waits at the gate", Duration::from_secs(60), || async {
                let n: i64 = self.admin.query_one(sql, &[&self.gate_pid]).await.map_err(|e| e.to_string())?.get(0);
                if n > 0 { Ok(()) } else { Err("no backend waits".to_owned()) }
            })
            .await
        }

        /// Opens the gate (and ends the gate session's transaction, if it locked a table).
        async fn open(&self) {
            self.admin.execute("DELETE FROM stall_points", &[]).await.unwrap();
            self.gate.batch_execute("SELECT pg_catalog.pg_advisory_unlock_all(); ROLLBACK").await.expect("open the gate");
        }

        /// Until no session of this database but the admin's and the gate's is inside a
        /// transaction or running a statement: the dropped call's backend has ended its work (rolled
        /// back, or committed what it had already sent).
        async fn settled(&self) {
            self.quiet("no session of the dropped call is left in a transaction").await;
            assert!(!pooled_in_transaction(&self.idem).await, "{NAME}: the pool's connection is inside a transaction");
        }

        /// Until no session of this database but the admin's and the gate's is inside a
        /// transaction or running a statement.
        async fn quiet(&self, what: &str) {
            self.quiet_within(what, Duration::from_secs(60)).await
        }

        /// [`Stage::quiet`], failing after `bound`.
        async fn quiet_within(&self, what: &str, bound: Duration) {
            let sql = "SELECT count(*), string_agg(a.pid || ' ' || a.state, ', ') FROM pg_catalog.pg_stat_activity a
                        WHERE a.datname = pg_catalog.current_database() AND a.pid NOT IN ($1, pg_catalog.pg_backend_pid())
                          AND (a.xact_start IS NOT NULL OR a.state <> 'idle')";
            eventually(what, bound, || async {
                let row = self.admin.query_one(sql, &[&self.gate_pid]).await.map_err(|e| e.to_string())?;
                let n: i64 = row.get(0);
                if n == 0 { Ok(()) } else { Err(row.get::<_, Option<String>>(1).unwrap_or_default()) }
            })
            .await
        }

        /// The key's record: its status, or None when there is none.
        async fn status(&self, key: &Key) -> Option<String> {
            let sql = "SELECT _idem_status_word(status) AS status FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
            let rows = self.admin.query(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap();
            rows.first().map(|r| r.get(0))
        }

        /// How many transient failures are counted for the key.
        async fn attempts(&self, key: &Key) -> i32 {
            let sql = "SELECT coalesce((SELECT attempts FROM idem_retries WHERE operation = $1 AND user_id = $2 AND key = $3), 0)";
            self.admin.query_one(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap().get(0)
        }

        async fn charges(&self, key: &Key) -> i64 {
            charges_for(&self.admin, key).await
        }
    }

    async fn stall_at(admin: &deadpool_postgres::Client, point: &str) {
        admin.execute("INSERT INTO stall_points VALUES ($1) ON CONFLICT DO NOTHING", &[&point]).await.unwrap();
    }

    /// Drives `call` until the stage shows it stalled, then drops it.
    async fn drop_when_stalled<F: Future>(stage: &Stage, call: F) {
        tokio::select! {
            _ = call => panic!("{NAME}: the call ended before it reached the gate"),
            _ = stage.stalled() => {}
        }
    }

    /// The settings of every stage: reservations wait for a concurrent holder (so one can be stalled).
    fn waiting() -> SettingsBuilder {
        Settings::builder().wait(true)
    }

    fn fp() -> Fingerprint {
        Fingerprint::of_json(&json!({"amount": 100})).unwrap()
    }

    /// `run` with the charge handler; the number of runs is counted in `runs`.
    async fn run_charge(idem: &Idem, key: &Key, runs: &Arc<AtomicUsize>) -> Result<Outcome<StoredResponse>, Error<Failure>> {
        idem.run(key, &fp(), Charge::of(key).handler::<Failure>(runs)).await
    }

    /// The in-transaction rule after a drop before anything was committed: no record, no business
    /// row, nothing counted, and the next attempt on the same pool executes once.
    async fn nothing_left_and_next_runs(stage: &Stage, key: &Key) {
        assert_eq!(stage.attempts(key).await, 0, "{NAME}: a drop is not a failure of the key");
        next_runs(stage, key).await;
    }

    /// No record and no business row; the next attempt on the same pool executes once.
    async fn next_runs(stage: &Stage, key: &Key) {
        assert_eq!(stage.status(key).await, None, "{NAME}: the dropped call left a record");
        assert_eq!(stage.charges(key).await, 0, "{NAME}: the dropped call's business row was committed");
        let runs = Arc::new(AtomicUsize::new(0));
        let next = run_charge(&stage.idem, key, &runs).await.expect("the next attempt");
        assert!(matches!(next, Outcome::Executed(_)), "{NAME}: {next:?}");
        assert_eq!((runs.load(Ordering::SeqCst), stage.charges(key).await), (1, 1), "{NAME}");
    }

    /// The rule once the completion and COMMIT have left: without a cancel request the server may
    /// still commit them (then the key is completed, with its one business row, and the next attempt
    /// replays it), or roll them back (then nothing is left and the next attempt runs); with one,
    /// nothing is left. Never a PROCESSING record.
    async fn committed_whole_or_nothing(stage: &Stage, key: &Key) {
        assert_eq!(stage.status(key).await, None, "{NAME}: the cancelled completion committed");
        let runs = Arc::new(AtomicUsize::new(0));
        let next = run_charge(&stage.idem, key, &runs).await.expect("the next attempt");
        assert!(matches!(next, Outcome::Executed(_)), "{NAME}: {next:?}");
        assert_eq!(stage.charges(key).await, 1, "{NAME}: exactly one business row");
    }

    #[tokio::test]
    async fn run_dropped_at_its_reservation_leaves_nothing() {
        let stage = Stage::new("idem_cancel_run_reserve", waiting()).await;
        let key = unique_key("cancel.run");
        stage.stall_reservations_of(&key).await;
        stage.drop_stalled(run_charge(&stage.idem, &key, &Arc::default())).await;
        nothing_left_and_next_runs(&stage, &key).await;
    }

    #[tokio::test]
    async fn run_dropped_in_its_closure_leaves_nothing() {
        let stage = Stage::new("idem_cancel_run_closure", waiting()).await;
        let key = unique_key("cancel.run");
        stage.stall_at("INSERT charges").await;
        stage.drop_stalled(run_charge(&stage.idem, &key, &Arc::default())).await;
        nothing_left_and_next_runs(&stage, &key).await;
    }

    #[tokio::test]
    async fn run_dropped_at_its_completion_commits_whole_or_nothing() {
        let stage = Stage::new("idem_cancel_run_complete", waiting()).await;
        let key = unique_key("cancel.run");
        let (admin, fingerprint, tag) = (stage.admin.clone(), fp(), key.to_string());
        // The closure charges, then arms the gate for the completion that follows it.
        let call = stage.idem.run(&key, &fingerprint, move |conn: &mut Conn| {
            let (admin, tag) = (admin.clone(), tag.clone());
            Box::pin(async move {
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 100, $1)", &[&tag]).await?;
                stall_at(&admin, "* idem_records").await;
                Ok(StoredResponse::json(201, json!({"charged": 100})))
            }) as TxFuture<'_, StoredResponse, DbError>
        });
        stage.drop_stalled(call).await;
        committed_whole_or_nothing(&stage, &key).await;
    }

    #[tokio::test]
    async fn run_dropped_while_recording_a_failure_leaves_nothing() {
        let stage = Stage::new("idem_cancel_run_failure", waiting()).await;
        let key = unique_key("cancel.run");
        // The closure fails (transient) after arming the gate for the failure path's reservation
        // again; its own reservation has already passed.
        let (admin, fingerprint) = (stage.admin.clone(), fp());
        let call = stage.idem.run(&key, &fingerprint, move |_conn: &mut Conn| {
            let admin = admin.clone();
            Box::pin(async move {
                stall_at(&admin, "* idem_records").await;
                Err::<StoredResponse, _>(Failure(None))
            }) as TxFuture<'_, StoredResponse, Failure>
        });
        stage.drop_stalled(call).await;
        // The failure path's request carries its own COMMIT (the failure counted, the key released):
        // without a cancel request it may commit; either way the key is free and nothing ran.
        let counted = stage.attempts(&key).await;
        assert_eq!(counted, 0, "{NAME}: {counted} failures counted");
        next_runs(&stage, &key).await;
    }

    /// A batch of three keys of one user, charged by one statement.
    fn batch_items(prefix: &str) -> Vec<BatchItem> {
        (0..3).map(|i| BatchItem { key: format!("{prefix}-{i}"), fingerprint: fp() }).collect()
    }

    async fn run_batch(idem: &Idem, user: &str, items: &[BatchItem], arm: Option<Arc<deadpool_postgres::Client>>) -> Result<Vec<(String, idempotency_client::BatchOutcome<StoredResponse>)>, Error<DbError>> {
        let owner = user.to_owned();
        idem.run_batch("cancel.batch", user, items, move |conn: &mut Conn, keys: &[String]| {
            let (user, arm) = (owner.clone(), arm.clone());
            Box::pin(async move {
                let tags: Vec<String> = keys.iter().map(|k| format!("{user}/{k}")).collect();
                let sql = "INSERT INTO charges (user_id, amount, k) SELECT $1, 1, unnest(pg_catalog.string_to_array($2, ' '))";
                exec(conn, sql, &[&user, &tags.join(" ")]).await?;
                if let Some(admin) = arm {
                    stall_at(&admin, "* idem_records").await; // the completions wait
                }
                Ok(keys.iter().map(|k| StoredResponse::json(201, json!({"key": k}))).collect())
            }) as TxFuture<'_, Vec<StoredResponse>, DbError>
        })
        .await
    }

    async fn batch_rows(stage: &Stage, user: &str) -> (i64, i64) {
        let records: i64 = stage.admin.query_one("SELECT count(*) FROM idem_records WHERE user_id = $1", &[&user]).await.unwrap().get(0);
        let charges: i64 = stage.admin.query_one("SELECT count(*) FROM charges WHERE user_id = $1", &[&user]).await.unwrap().get(0);
        (records, charges)
    }

    /// Where a batch is dropped.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum At {
        Reservation,
        Closure,
        Completion,
    }

    async fn batch_dropped_at(at: At, db: &str) {
        let stage = Stage::new(db, waiting()).await;
        let (user, items) = ("cancel-batch", batch_items("m"));
        match at {
            At::Reservation => stage.stall_reservations_of(&Key::new("cancel.batch", user, &items[0].key).unwrap()).await,
            At::Closure => stage.stall_at("INSERT charges").await,
            At::Completion => {}
        }
        let arm = (at == At::Completion).then(|| stage.admin.clone());
        stage.drop_stalled(run_batch(&stage.idem, user, &items, arm)).await;
        // The dropped backend ended with the gate closed: nothing it sent committed.
        assert_eq!(batch_rows(&stage, user).await, (0, 0), "{NAME}: the dropped batch committed");
        let next = run_batch(&stage.idem, user, &items, None).await.expect("the next batch");
        for (key, outcome) in &next {
            assert!(!matches!(outcome, idempotency_client::BatchOutcome::Replayed(_)), "{NAME}: {key}: {outcome:?}");
        }
        assert_eq!(batch_rows(&stage, user).await, (3, 3), "{NAME}: each key ran once");
    }

    #[tokio::test]
    async fn run_batch_dropped_at_its_reservations_leaves_nothing() {
        batch_dropped_at(At::Reservation, "idem_cancel_batch_reserve").await;
    }

    #[tokio::test]
    async fn run_batch_dropped_in_its_closure_leaves_nothing() {
        batch_dropped_at(At::Closure, "idem_cancel_batch_closure").await;
    }

    #[tokio::test]
    async fn run_batch_dropped_at_its_completions_commits_whole_or_nothing() {
        batch_dropped_at(At::Completion, "idem_cancel_batch_complete").await;
    }

    #[tokio::test]
    async fn run_statement_dropped_in_flight_commits_whole_or_nothing() {
        let stage = Stage::new("idem_cancel_statement", waiting()).await;
        let key = unique_key("cancel.statement");
        let tag = key.to_string();
        let write = OneStatement::new("INSERT INTO charges (user_id, amount, k) SELECT $1, 100, $2 FROM created RETURNING id")
            .text(key.user_id())
            .text(&tag);
        // Stalled mid-statement: the reservation is made, the write waits.
        stage.stall_at("INSERT charges").await;
        stage.drop_stalled(stage.idem.run_statement::<Value>(&key, &fp(), &write)).await;
        // One statement in autocommit: the server commits all of it or none of it (none, when it
        // was cancelled).
        assert_eq!(stage.status(&key).await, None, "{NAME}: the cancelled statement committed");
        let next = stage.idem.run_statement::<Value>(&key, &fp(), &write).await.expect("the next attempt");
        assert!(next.is_executed(), "{NAME}: {next:?}");
        assert_eq!(stage.charges(&key).await, 1, "{NAME}");
    }

    /// `run_external` with an outside call counted in `calls`, recording nothing locally but its
    /// business row.
    async fn external<C>(idem: &Idem, key: &Key, call: C) -> Result<Outcome<StoredResponse>, Error<DbError>>
    where
        C: Future<Output = Result<StoredResponse, DbError>> + Send,
    {
        external_arming(idem, key, call, None).await
    }

    /// [`external`], arming the gate for the completion from inside `record` when `arm` is given.
    async fn external_arming<C>(idem: &Idem, key: &Key, call: C, arm: Option<Arc<deadpool_postgres::Client>>) -> Result<Outcome<StoredResponse>, Error<DbError>>
    where
        C: Future<Output = Result<StoredResponse, DbError>> + Send,
    {
        let tag = key.to_string();
        idem.run_external(key, &fp(), call, move |conn: &mut Conn, _: &StoredResponse| {
            let (tag, arm) = (tag.clone(), arm.clone());
            Box::pin(async move {
                exec(conn, "INSERT INTO charges (user_id, amount, k) VALUES ('u', 100, $1)", &[&tag]).await?;
                if let Some(admin) = arm {
                    stall_at(&admin, "* idem_records").await;
                }
                Ok(())
            }) as TxFuture<'_, (), DbError>
        })
        .await
    }

    async fn counted(calls: Arc<AtomicUsize>) -> Result<StoredResponse, DbError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(StoredResponse::json(201, json!({"paid": true})))
    }

    #[tokio::test]
    async fn run_external_dropped_before_its_call_releases_the_key() {
        // max_retries 1: a release that could poison would poison at once.
        let stage = Stage::new("idem_cancel_external_reserve", waiting().max_retries(1)).await;
        let key = unique_key("cancel.external");
        let calls = Arc::new(AtomicUsize::new(0));
        stage.stall_reservations_of(&key).await;
        // The reservation goes on in a task of its own (so it is not cancelled): it commits once
        // the gate opens, after the caller is gone, and the task releases the key.
        drop_when_stalled(&stage, external(&stage.idem, &key, counted(calls.clone()))).await;
        stage.open().await;
        stage.settled().await;
        eventually("the dropped reservation is released", Duration::from_secs(60), || async {
            match stage.status(&key).await {
                None => Ok(()),
                Some(status) => Err(status),
            }
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{NAME}: the outside call never started");
        // Counted once (idem_release counts), never poisoned by the drop.
        assert_eq!(stage.attempts(&key).await, 1, "{NAME}");
        let next = external(&stage.idem, &key, counted(calls.clone())).await.expect("the next attempt");
        assert!(matches!(next, Outcome::Executed(_)), "{NAME}: {next:?}");
        assert_eq!((calls.load(Ordering::SeqCst), stage.charges(&key).await), (1, 1), "{NAME}");
    }

    #[tokio::test]
    async fn run_external_dropped_during_its_call_keeps_the_key_for_its_lease_then_recovers() {
        let lease = Duration::from_secs(1);
        let stage = Stage::new("idem_cancel_external_call", waiting().lease(lease)).await;
        let key = unique_key("cancel.external");
        let started = Arc::new(tokio::sync::Notify::new());
        let call = {
            let started = started.clone();
            async move {
                started.notify_one();
                std::future::pending::<Result<StoredResponse, DbError>>().await
            }
        };
        tokio::select! {
            _ = external(&stage.idem, &key, call) => panic!("{NAME}: the outside call never returns"),
            _ = started.notified() => {}
        }
        // The call may have had its effect: the key is held, PROCESSING, and nobody extends it.
        stage.settled().await;
        assert_eq!(stage.status(&key).await.as_deref(), Some("PROCESSING"), "{NAME}");
        let sql = "SELECT lease_expires_at::text FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
        let lease_end = |admin: Arc<deadpool_postgres::Client>, key: Key| async move {
            admin.query_one(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.unwrap().get::<_, String>(0)
        };
        let first = lease_end(stage.admin.clone(), key.clone()).await;
        // A heartbeat still running would extend the lease every third of it: it would never end.
        eventually("the dropped call's lease ends", Duration::from_secs(60), || async {
            let sql = "SELECT lease_expires_at < clock_timestamp() FROM idem_records WHERE operation = $1 AND user_id = $2 AND key = $3";
            let ended: bool = stage.admin.query_one(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.map_err(|e| e.to_string())?.get(0);
            if ended { Ok(()) } else { Err("the lease is live".to_owned()) }
        })
        .await;
        assert_eq!(lease_end(stage.admin.clone(), key.clone()).await, first, "{NAME}: the heartbeat outlived the dropped call");
        // Then recovered per recovery_action ('fail' by default): the retry is told it failed.
        // (Recovered here, or already by a maintenance worker: the record is FAILED either way.)
        stage.admin.query_one("SELECT idem_recover_stuck()", &[]).await.unwrap();
        assert_eq!(stage.status(&key).await.as_deref(), Some("FAILED"), "{NAME}");
        let next = external(&stage.idem, &key, counted(Arc::default())).await;
        assert!(matches!(next, Err(Error::Failed { .. })), "{NAME}: {next:?}");
    }

    #[tokio::test]
    async fn run_external_dropped_while_recording_never_runs_the_call_again() {
        let stage = Stage::new("idem_cancel_external_record", waiting()).await;
        let key = unique_key("cancel.external");
        let calls = Arc::new(AtomicUsize::new(0));
        stage.drop_stalled(external_arming(&stage.idem, &key, counted(calls.clone()), Some(stage.admin.clone()))).await;
        // The effect happened: the key is kept (its completion committed, or it waits for recovery),
        // never released for a second call.
        let status = stage.status(&key).await;
        assert_eq!(status.as_deref(), Some("PROCESSING"), "{NAME}: the cancelled completion committed");
        let next = external(&stage.idem, &key, counted(calls.clone())).await;
        assert!(matches!(next, Err(Error::InProgress { .. })), "{NAME}: {next:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{NAME}: the outside call ran once");
    }

    #[tokio::test]
    async fn check_extension_dropped_in_flight_leaves_a_clean_pool() {
        let stage = Stage::new("idem_cancel_check", waiting()).await;
        stage.gate.batch_execute("BEGIN; LOCK TABLE pg_catalog.pg_extension IN ACCESS EXCLUSIVE MODE").await.expect("lock pg_extension");
        stage.drop_stalled(stage.idem.check_extension()).await;
        assert!(stage.idem.check_extension().await.is_ok(), "{NAME}: the next call answers");
    }

    /// An in-transaction or two-phase route whose handler charges the key of the request.
    fn router(idem: Idem, mode: Mode) -> Router {
        let layer = IdempotencyLayer::builder(idem).mode(mode).anonymous().wait(true).build().expect("layer");
        let route = match mode {
            Mode::InTransaction => post(|tx: Transaction<TestDriver>, body: String| async move {
                exec_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('layer', 1, $1)", &[&body]).await.unwrap();
                (StatusCode::CREATED, "charged").into_response()
            }),
            _ => post(|| async { (StatusCode::CREATED, "paid").into_response() }),
        };
        Router::new().route("/charges", route).route_layer(layer)
    }

    fn request(key: &str) -> Request<Body> {
        Request::post("/charges").header("idempotency-key", format!("\"{key}\"")).body(Body::from(key.to_owned())).unwrap()
    }

    /// The layer runs its flow in a task of its own, so a request whose future is dropped (a client
    /// that disconnects, a timeout above the layer) still finishes: the key is completed with the
    /// handler's one business row, and the retry replays it.
    async fn layer_dropped_at(mode: Mode, at: At, db: &str) {
        let stage = Stage::new(db, waiting()).await;
        let app = router(stage.idem.clone(), mode);
        let k = format!("k-{}", unique_key("cancel.layer").key());
        match at {
            // Held with another request's hash: a waiting reservation waits all the same.
            At::Reservation => stage.stall_reservations_of(&Key::new("POST /charges", "anonymous", &k).unwrap()).await,
            _ => stage.stall_at("INSERT charges").await,
        }
        drop_when_stalled(&stage, app.clone().oneshot(request(&k))).await;
        stage.open().await;
        eventually("the dropped request's flow finishes", Duration::from_secs(60), || async {
            let n: i64 = stage.admin.query_one("SELECT count(*) FROM idem_records WHERE status = 's'", &[]).await.map_err(|e| e.to_string())?.get(0);
            if n == 1 { Ok(()) } else { Err(format!("{n} completed records")) }
        })
        .await;
        stage.settled().await;
        let next = app.oneshot(request(&k)).await.unwrap();
        assert_eq!(next.status(), StatusCode::CREATED, "{NAME}");
        assert_eq!(next.headers().get("idempotent-replayed").map(|v| v.as_bytes()), Some(&b"true"[..]), "{NAME}: the retry replays");
        if mode == Mode::InTransaction {
            let n: i64 = stage.admin.query_one("SELECT count(*) FROM charges", &[]).await.unwrap().get(0);
            assert_eq!(n, 1, "{NAME}: the handler ran once");
        }
    }

    #[tokio::test]
    async fn in_transaction_layer_dropped_in_its_handler_finishes_its_flow() {
        layer_dropped_at(Mode::InTransaction, At::Closure, "idem_cancel_layer_tx").await;
    }

    #[tokio::test]
    async fn two_phase_layer_dropped_at_its_reservation_finishes_its_flow() {
        layer_dropped_at(Mode::TwoPhase, At::Reservation, "idem_cancel_layer_two_phase").await;
    }

    /// A handler that keeps its `Transaction` past its request (a clone sent to a task that outlives
    /// it) reaches no connection with it: the layer took the connection back when the request ended,
    /// and the kept copy's `lock` is `TransactionEnded`.
    #[tokio::test]
    async fn a_transaction_kept_past_its_request_reaches_no_connection() {
        let stage = Stage::new("idem_cancel_kept_tx", waiting()).await;
        let kept: Arc<std::sync::Mutex<Option<Transaction<TestDriver>>>> = Arc::default();
        let layer = IdempotencyLayer::builder(stage.idem.clone()).anonymous().build().expect("layer");
        let handler = {
            let kept = kept.clone();
            post(move |tx: Transaction<TestDriver>, body: String| async move {
                exec_in(&tx, "INSERT INTO charges (user_id, amount, k) VALUES ('layer', 1, $1)", &[&body]).await.unwrap();
                *kept.lock().unwrap() = Some(tx.clone());
                (StatusCode::CREATED, "charged").into_response()
            })
        };
        let app = Router::new().route("/charges", handler).route_layer(layer);
        let answer = app.oneshot(request("k-kept")).await.unwrap();
        assert_eq!(answer.status(), StatusCode::CREATED, "{NAME}");
        let tx = kept.lock().unwrap().take().expect("the handler kept its transaction");
        assert!(matches!(tx.lock().await, Err(idempotency_client::TransactionEnded)), "{NAME}: the kept transaction still reaches a connection");
        stage.settled().await;
        let n: i64 = stage.admin.query_one("SELECT count(*) FROM charges", &[]).await.unwrap().get(0);
        assert_eq!(n, 1, "{NAME}");
    }

    /// How long the backend of a dropped call may go on after the drop, with the blocker still
    /// holding its lock: the documented bound (at once over tokio-postgres, whose cancel request
    /// goes through the pool's own TLS connector; within the 1 s `client_connection_check_interval`
    /// over sqlx, which closes the connection) and room for a loaded machine. Without either, the
    /// backend waits as long as the blocker lives.
    const DROPPED_BACKEND_ENDS: Duration = Duration::from_secs(15);

    /// A URL to `database` on the TLS-only server in `mode`, through `localhost` (the name its
    /// certificate carries), the verify modes trusting the test CA.
    fn tls_url(server: &TlsServer, database: &str, mode: &str) -> String {
        let params = match mode {
            "prefer" | "require" => format!("sslmode={mode}"),
            _ => format!("sslmode={mode}&sslrootcert={}", server.ca.display()),
        };
        server.database_url(database, "localhost", &params)
    }

    /// The reservation and closure cases over a server that accepts TLS only (a plain TCP
    /// connection is refused there, so every session of the database is encrypted; `disable` is
    /// refused, tests/tests/tls.rs), the handle connected in `mode`: the dropped call's backend
    /// ends while the blocker still holds its lock, within [`DROPPED_BACKEND_ENDS`]. At the
    /// closure the blocker is an unrelated lock, so a duplicate of the key then runs at once (it
    /// would be told the key is in progress, a 409, for as long as the backend held the key); at
    /// the reservation the blocker is the gate's own uncommitted reservation of the key, so the
    /// gate is opened first. Then nothing is left, and the next attempt runs once.
    async fn dropped_over_tls(at: At, mode: &str) {
        let server = TlsServer::shared();
        let case = if at == At::Reservation { "reserve" } else { "closure" };
        let name = db(&format!("idem_cancel_tls_{case}_{}", mode.replace('-', "_")));
        server.fresh_database(&name);
        let admin_url = server.database_url(&name, "localhost", "sslmode=require");
        let stage = Stage::at(&admin_url, &tls_url(server, &name, mode), waiting().build()).await;
        let key = unique_key("cancel.tls");
        match at {
            At::Reservation => stage.stall_reservations_of(&key).await,
            _ => stage.stall_at("INSERT charges").await,
        }
        drop_when_stalled(&stage, run_charge(&stage.idem, &key, &Arc::default())).await;
        let what = format!("sslmode={mode}: the dropped call's backend ends with the blocker still holding its lock");
        stage.quiet_within(&what, DROPPED_BACKEND_ENDS).await;
        if at == At::Closure {
            // The blocker keeps its lock; only the stall point goes, so a new write passes.
            stage.admin.execute("DELETE FROM stall_points", &[]).await.unwrap();
            let duplicate = connect_with(&tls_url(server, &name, mode), 1, Settings::default());
            let runs = Arc::new(AtomicUsize::new(0));
            let answer = run_charge(&duplicate, &key, &runs).await;
            assert!(matches!(answer, Ok(Outcome::Executed(_))), "{NAME} sslmode={mode}: a duplicate while the blocker lives: {answer:?}");
            assert_eq!((runs.load(Ordering::SeqCst), stage.charges(&key).await), (1, 1), "{NAME} sslmode={mode}");
            stage.open().await;
            stage.settled().await;
            assert_eq!(stage.status(&key).await.as_deref(), Some("SUCCESS"), "{NAME} sslmode={mode}");
            assert_eq!(stage.attempts(&key).await, 0, "{NAME} sslmode={mode}: a drop is not a failure of the key");
        } else {
            stage.open().await;
            stage.settled().await;
            nothing_left_and_next_runs(&stage, &key).await;
        }
    }

    #[tokio::test]
    async fn run_dropped_at_its_reservation_over_tls_prefer_ends_its_backend() {
        dropped_over_tls(At::Reservation, "prefer").await;
    }

    #[tokio::test]
    async fn run_dropped_at_its_reservation_over_tls_require_ends_its_backend() {
        dropped_over_tls(At::Reservation, "require").await;
    }

    #[tokio::test]
    async fn run_dropped_at_its_reservation_over_tls_verify_ca_ends_its_backend() {
        dropped_over_tls(At::Reservation, "verify-ca").await;
    }

    #[tokio::test]
    async fn run_dropped_at_its_reservation_over_tls_verify_full_ends_its_backend() {
        dropped_over_tls(At::Reservation, "verify-full").await;
    }

    #[tokio::test]
    async fn run_dropped_in_its_closure_over_tls_prefer_ends_its_backend_and_frees_the_key() {
        dropped_over_tls(At::Closure, "prefer").await;
    }

    #[tokio::test]
    async fn run_dropped_in_its_closure_over_tls_require_ends_its_backend_and_frees_the_key() {
        dropped_over_tls(At::Closure, "require").await;
    }

    #[tokio::test]
    async fn run_dropped_in_its_closure_over_tls_verify_ca_ends_its_backend_and_frees_the_key() {
        dropped_over_tls(At::Closure, "verify-ca").await;
    }

    #[tokio::test]
    async fn run_dropped_in_its_closure_over_tls_verify_full_ends_its_backend_and_frees_the_key() {
        dropped_over_tls(At::Closure, "verify-full").await;
    }

    /// The sqlx handle's pool asks the server to check every second that its client is there
    /// (what ends a dropped call's statement over sqlx); the tokio-postgres handle sends a cancel
    /// request instead and leaves the server's (0, off). The URL's `options` win for both.
    #[tokio::test]
    async fn the_sqlx_pool_sets_the_connection_check_and_the_urls_options_win() {
        let url = fresh_database(&db("idem_cancel_check_interval")).await;
        let expected = if NAME == "sqlx" { 1000 } else { 0 };
        assert_eq!(setting_of(&connect_with(&url, 1, Settings::default()), "client_connection_check_interval").await, expected, "{NAME}");
        let named = format!("{url}?options=-c%20client_connection_check_interval%3D5000");
        assert_eq!(setting_of(&connect_with(&named, 1, Settings::default()), "client_connection_check_interval").await, 5000, "{NAME}: the URL's options win");
    }
}
