//! Recovery points (issue 45, docs/recovery-points.md, "The proof plan"): Brandur's ride flow
//! (examples/rides: create the ride, charge through a stub, send the receipt through another,
//! finish) run by `run_steps` in a CHILD process that aborts at each of the flow's 9 boundaries
//! in turn; the parent then forces the record's lease to run out (an admin `UPDATE`, never a
//! sleep) and continues in each of 3 ways: the client's retry, `idem_recover_stuck` then the
//! retry, `idem_recover_stuck` then the completer (`Idempotency::resume`). Each run must end as
//! a run without the crash does: one ride, done; each stub one effective call for its derived
//! key (a second call only when the child died between that call and its recovery point); the
//! record `SUCCESS` with the uncrashed run's response; a later `run_steps` replays it; after
//! recovery, `RESUMABLE` wherever a recovery point had committed.
//!
//! The child is this binary again, running its ignored test `<driver>::crash_child` with the
//! boundary, the key, the database's URL and the stubs' URLs in its environment (the stubs are
//! served by the parent: they outlive the child and count its calls). Then the same flow
//! dropped in-process at each boundary's next await (a `select!`-style drop, as
//! tests/tests/cancellation.rs does for the other entry points) and retried; and the contrast:
//! the same flow through `run_external` (the charge and the receipt in one call, after the
//! ride's own commit) cannot survive a death after the ride's commit. Both drivers, both
//! installs.

idempotency_testkit::for_each_driver! {
    use idempotency_client::{Error, Fingerprint, Key, Outcome, Plans, Settings, StoredResponse, TxFuture};
    use idempotency_rides::stub::Stub;
    use idempotency_rides::{no_hook, plan, response, Hook, RideRequest, RideState, Services, BOUNDARIES, OPERATION};
    use idempotency_testkit::{admin_at, fresh_database};
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::sync::OnceCell;

    /// The child's environment.
    const BOUNDARY: &str = "IDEM_STEPS_BOUNDARY";
    const URL: &str = "IDEM_STEPS_URL";
    const KEY: &str = "IDEM_STEPS_KEY";
    const CHARGE: &str = "IDEM_STEPS_CHARGE";
    const RECEIPT: &str = "IDEM_STEPS_RECEIPT";

    /// This driver's database, with the rides table, made once per process.
    async fn database() -> &'static str {
        static URL: OnceCell<String> = OnceCell::const_new();
        URL.get_or_init(|| rides_database("steps")).await
    }

    /// A fresh database `name` (per driver) with the rides table.
    async fn rides_database(name: &str) -> String {
        let url = fresh_database(&db(name)).await;
        admin_at(&url).await.batch_execute(idempotency_rides::store::SCHEMA).await.expect("the rides table");
        url
    }

    /// A handle as the child and the parent use it: a pool of two connections (a step's and
    /// the heartbeat's).
    fn handle(url: &str) -> Idem {
        connect_with(url, 2, Settings::default())
    }

    fn request(key: &Key) -> RideRequest {
        RideRequest { user: key.user_id().to_owned(), amount: 1_250 }
    }

    fn fingerprint(request: &RideRequest) -> Fingerprint {
        Fingerprint::of_json(request).expect("a fingerprint")
    }

    /// The two stubs and the plan over them.
    struct World {
        charge: Stub,
        receipt: Stub,
    }

    impl World {
        async fn new() -> World {
            World { charge: Stub::serve("charge").await.expect("the charge stub"), receipt: Stub::serve("receipt").await.expect("the receipt stub") }
        }

        fn services(&self) -> Services {
            Services::new(self.charge.url.clone(), self.receipt.url.clone())
        }

        /// What a run without a crash answers for `key`: the stubs' ids are their answers to the
        /// key's derived keys.
        fn expected(&self, key: &Key) -> StoredResponse {
            let mut state = RideState::from(request(key));
            state.charge_id = Some(format!("charge:{}", key.derive("charge").unwrap()));
            state.receipt_id = Some(format!("receipt:{}", key.derive("receipt").unwrap()));
            response(&state)
        }

        /// Each stub one effective call for the key's derived key, and as many calls in all as
        /// `charge_calls` and `receipt_calls` allow.
        fn called(&self, key: &Key, charge_calls: std::ops::RangeInclusive<usize>, receipt_calls: std::ops::RangeInclusive<usize>, what: &str) {
            let charge = self.charge.seen(&key.derive("charge").unwrap());
            let receipt = self.receipt.seen(&key.derive("receipt").unwrap());
            assert!(charge.effective == 1 && charge_calls.contains(&charge.calls), "{NAME} {what}: the charge stub saw {charge:?}, {charge_calls:?} calls expected");
            assert!(receipt.effective == 1 && receipt_calls.contains(&receipt.calls), "{NAME} {what}: the receipt stub saw {receipt:?}, {receipt_calls:?} calls expected");
        }
    }

    /// The rides of the key's user: (rows, rows done).
    async fn rides(admin: &deadpool_postgres::Client, key: &Key) -> (i64, i64) {
        let row = admin
            .query_one("SELECT count(*), count(*) FILTER (WHERE done) FROM rides WHERE user_id = $1", &[&key.user_id()])
            .await
            .expect("count rides");
        (row.get(0), row.get(1))
    }

    /// The key's record: its status and stored response, or None.
    async fn record(admin: &deadpool_postgres::Client, key: &Key) -> Option<(String, Option<serde_json::Value>)> {
        let sql = "SELECT status::text, response FROM idem_lookup($1, $2, $3)";
        let rows = admin.query(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.expect("idem_lookup");
        rows.first().map(|r| (r.get(0), r.get(1)))
    }

    /// Forces the key's lease to have run out, as the dead child's would have (no sleep).
    async fn lease_runs_out(admin: &deadpool_postgres::Client, key: &Key) {
        let sql = "UPDATE idem_records SET lease_expires_at = now() - interval '1 second' WHERE operation = $1 AND user_id = $2 AND key = $3";
        admin.execute(sql, &[&key.operation(), &key.user_id(), &key.key()]).await.expect("end the lease");
    }

    /// The one line of this driver's module in a test's name (`over_postgres`).
    fn driver_module() -> &'static str {
        module_path!().rsplit("::").next().expect("a module path")
    }

    /// The child: the ride flow, aborting at `IDEM_STEPS_BOUNDARY`. Ignored: only the crash
    /// test runs it, in a process of its own (without the environment it does nothing).
    #[tokio::test]
    #[ignore = "the crash test's child process"]
    async fn crash_child() {
        let Ok(boundary) = std::env::var(BOUNDARY) else { return };
        let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
        let parts: Vec<String> = serde_json::from_str(&var(KEY)).expect("the key's parts");
        let key = Key::new(parts[0].clone(), parts[1].clone(), parts[2].clone()).expect("a key");
        let idem = handle(&var(URL));
        if boundary == "before_reserve" {
            std::process::abort();
        }
        let at = boundary.clone();
        let hook: Hook = Arc::new(move |reached| {
            if reached == at {
                std::process::abort();
            }
        });
        let rides = plan::<TestDriver>(Services::new(var(CHARGE), var(RECEIPT)), hook);
        let input = RideState::from(request(&key));
        let result = idem.run_steps(&key, &fingerprint(&input.request), &rides, input).await;
        panic!("{NAME}: the child passed its boundary {boundary} without dying: {result:?}");
    }

    /// Runs the child for `key` until it dies at `boundary`, and until the server has ended the
    /// child's sessions: a dead client's open transaction (and its locks) lasts until its backend
    /// reads the closed socket, and recovery skips what is locked.
    async fn crash(world: &World, url: &str, key: &Key, boundary: &str) {
        static CHILDREN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let app = format!("steps-child-{}-{}", std::process::id(), CHILDREN.fetch_add(1, Ordering::Relaxed));
        let child_url = format!("{url}{}application_name={app}", if url.contains('?') { '&' } else { '?' });
        let parts = serde_json::to_string(&[key.operation(), key.user_id(), key.key()]).unwrap();
        let exe = std::env::current_exe().expect("this test binary");
        let out = tokio::process::Command::new(exe)
            .args([&format!("{}::crash_child", driver_module()), "--exact", "--ignored", "--test-threads=1"])
            .env(BOUNDARY, boundary)
            .env(URL, &child_url)
            .env(KEY, parts)
            .env(CHARGE, &world.charge.url)
            .env(RECEIPT, &world.receipt.url)
            .output()
            .await
            .expect("run the child");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(6), "{NAME}: the child dies of SIGABRT at {boundary}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stdout));
        let admin = admin_at(url).await;
        idempotency_testkit::server::eventually("the dead child's sessions end", std::time::Duration::from_secs(60), || async {
            let row = admin.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", &[&app]).await.expect("pg_stat_activity");
            let left: i64 = row.get(0);
            if left == 0 { Ok(()) } else { Err(format!("{left} sessions of {app} left")) }
        })
        .await;
    }

    /// How a run continues after the crash.
    #[derive(Debug, Clone, Copy)]
    enum Then {
        Retry,
        Recovered,
        Completer,
    }

    /// One run of the matrix: crash at `boundary`, continue per `then`, assert.
    async fn crash_then(world: &World, boundary: &str, then: Then) {
        let url = database().await;
        let admin = admin_at(url).await;
        let idem = handle(url);
        let operation = format!("{OPERATION}.{boundary}.{then:?}").to_lowercase();
        let key = Key::new(operation.clone(), format!("{}-{boundary}-{then:?}", driver_module()), "k-1").unwrap();
        let what = format!("{boundary}, then {then:?}");
        let rides_plan = plan::<TestDriver>(world.services(), no_hook());
        let input = RideState::from(request(&key));
        let fp = fingerprint(&input.request);

        crash(world, url, &key, boundary).await;
        let checkpointed = record(&admin, &key).await.is_some();
        assert_eq!(checkpointed, boundary != "before_reserve", "{NAME} {what}: the key exists once its reservation (with recovery point 0) committed");
        lease_runs_out(&admin, &key).await;
        if matches!(then, Then::Recovered | Then::Completer) {
            // Other tests of this database recover at the same time, and recovery skips a row
            // another recovery holds: recover until no recovery holds this key's row.
            let status = idempotency_testkit::server::eventually("the key recovered", std::time::Duration::from_secs(60), || async {
                admin.execute("SELECT idem_recover_stuck()", &[]).await.expect("idem_recover_stuck");
                let status = record(&admin, &key).await.map(|(status, _)| status);
                if status.as_deref() == Some("PROCESSING") { Err("PROCESSING".to_owned()) } else { Ok(status) }
            })
            .await;
            assert_eq!(status.as_deref(), checkpointed.then_some("RESUMABLE"), "{NAME} {what}: recovery keeps a checkpointed key RESUMABLE");
        }
        let expected = world.expected(&key);
        match then {
            Then::Completer if checkpointed => {
                let plans = Plans::new().with(&operation, &rides_plan);
                let resumed = idem.resume(&plans, &operation, 10).await.expect("the completer's pass");
                assert_eq!((resumed.completed, resumed.released, resumed.failed, resumed.in_progress, resumed.errors), (1, 0, 0, 0, 0), "{NAME} {what}: {resumed:?}");
            }
            // InProgress while another test's recovery holds the key's row (the answer a client
            // retries after its Retry-After): retry it, as the client would.
            _ => match idempotency_testkit::server::eventually("the retry past any recovery holding the key", std::time::Duration::from_secs(60), || async {
                match idem.run_steps(&key, &fp, &rides_plan, input.clone()).await {
                    Err(Error::InProgress { .. }) => Err("InProgress".to_owned()),
                    other => Ok(other),
                }
            })
            .await
            {
                Ok(Outcome::Executed(answer)) => assert_eq!(answer, expected, "{NAME} {what}: the answer"),
                other => panic!("{NAME} {what}: the continuation runs to the end: {other:?}"),
            },
        }
        assert_eq!(rides(&admin, &key).await, (1, 1), "{NAME} {what}: one ride, done");
        // A second call only when the child died between that call and its recovery point.
        let again = |call: &str| {
            let n = usize::from(boundary == call) + 1;
            n..=n
        };
        world.called(&key, again("after_charge_call"), again("after_receipt_call"), &what);
        let (status, stored) = record(&admin, &key).await.expect("the record");
        assert_eq!(status, "SUCCESS", "{NAME} {what}");
        assert_eq!(stored, Some(serde_json::to_value(&expected).unwrap()), "{NAME} {what}: the stored response is the uncrashed run's");
        match idem.run_steps(&key, &fp, &rides_plan, input).await {
            Ok(Outcome::Replayed(answer)) => assert_eq!(answer, expected, "{NAME} {what}: the replay"),
            other => panic!("{NAME} {what}: a later run_steps replays: {other:?}"),
        }
    }

    /// The three continuations of a crash at `boundary`.
    async fn crash_at(boundary: &str) {
        let world = World::new().await;
        for then in [Then::Retry, Then::Recovered, Then::Completer] {
            crash_then(&world, boundary, then).await;
        }
    }

    macro_rules! boundaries {
        ($($name:ident => $boundary:literal),+ $(,)?) => {
            $(
                #[tokio::test]
                async fn $name() {
                    assert!(BOUNDARIES.contains(&$boundary));
                    crash_at($boundary).await;
                }
            )+
        };
    }

    boundaries! {
        crash_before_the_reservation_then_continue_three_ways => "before_reserve",
        crash_after_the_reservation_then_continue_three_ways => "after_reserve",
        crash_in_the_ride_transaction_then_continue_three_ways => "in_ride",
        crash_after_the_ride_then_continue_three_ways => "after_ride",
        crash_after_the_charge_call_then_continue_three_ways => "after_charge_call",
        crash_after_the_charge_recovery_point_then_continue_three_ways => "after_charge",
        crash_after_the_receipt_call_then_continue_three_ways => "after_receipt_call",
        crash_after_the_receipt_recovery_point_then_continue_three_ways => "after_receipt",
        crash_in_the_finishing_transaction_then_continue_three_ways => "in_finish",
    }

    #[tokio::test]
    async fn the_uncrashed_run_answers_once_and_replays() {
        let world = World::new().await;
        let url = database().await;
        let admin = admin_at(url).await;
        let idem = handle(url);
        let key = Key::new(format!("{OPERATION}.uncrashed"), format!("{}-uncrashed", driver_module()), "k-1").unwrap();
        let rides_plan = plan::<TestDriver>(world.services(), no_hook());
        let input = RideState::from(request(&key));
        let fp = fingerprint(&input.request);
        let expected = world.expected(&key);
        match idem.run_steps(&key, &fp, &rides_plan, input.clone()).await {
            Ok(Outcome::Executed(answer)) => assert_eq!(answer, expected),
            other => panic!("{NAME}: {other:?}"),
        }
        match idem.run_steps(&key, &fp, &rides_plan, input).await {
            Ok(Outcome::Replayed(answer)) => assert_eq!(answer, expected),
            other => panic!("{NAME}: {other:?}"),
        }
        assert_eq!(rides(&admin, &key).await, (1, 1));
        world.called(&key, 1..=1, 1..=1, "uncrashed");
    }

    /// `run_steps` dropped at the first await after each boundary (inside a step's transaction,
    /// while an outside call or a recovery point is in flight), then retried once the lease has
    /// run out: no connection left inside a transaction, and the retry ends as the uncrashed run.
    #[tokio::test]
    async fn run_steps_dropped_at_each_await_then_retried_ends_as_the_uncrashed_run() {
        let world = World::new().await;
        let url = database().await;
        let admin = admin_at(url).await;
        let idem = handle(url);
        for boundary in &BOUNDARIES[1..] {
            let key = Key::new(format!("{OPERATION}.dropped.{boundary}"), format!("{}-dropped-{boundary}", driver_module()), "k-1").unwrap();
            let input = RideState::from(request(&key));
            let fp = fingerprint(&input.request);
            let reached = Arc::new(AtomicBool::new(false));
            let flag = reached.clone();
            let at = *boundary;
            let hook: Hook = Arc::new(move |b| {
                if b == at {
                    flag.store(true, Ordering::SeqCst);
                }
            });
            let dropping = plan::<TestDriver>(world.services(), hook);
            let mut call = Box::pin(idem.run_steps(&key, &fp, &dropping, input.clone()));
            // Poll until the boundary was passed, then drop at the await it is pending on.
            let dropped = std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
                std::task::Poll::Ready(result) => std::task::Poll::Ready(Some(result)),
                std::task::Poll::Pending if reached.load(Ordering::SeqCst) => std::task::Poll::Ready(None),
                std::task::Poll::Pending => std::task::Poll::Pending,
            })
            .await;
            // A driver whose answers were all there may run to the end in the poll that passed
            // the boundary (no await left pending): then there was nothing to drop.
            let finished = dropped.is_some();
            if let Some(result) = dropped {
                assert!(matches!(&result, Ok(Outcome::Executed(a)) if *a == world.expected(&key)), "{NAME} {boundary}: {result:?}");
            }
            drop(call);
            settled(&idem).await;
            assert!(!pooled_in_transaction(&idem).await, "{NAME} {boundary}: a pooled connection is inside a transaction");
            lease_runs_out(&admin, &key).await;
            let expected = world.expected(&key);
            let rides_plan = plan::<TestDriver>(world.services(), no_hook());
            // Dropped with the finish's COMMIT in flight, the key may have been completed: at
            // `after_receipt` the drop comes at the finish's first await (over sqlx its writes,
            // the completion and the COMMIT are one simple query, sent before that await).
            let finish_in_flight = at == "in_finish" || at == "after_receipt";
            match idem.run_steps(&key, &fp, &rides_plan, input).await {
                Ok(Outcome::Executed(answer)) => assert_eq!(answer, expected, "{NAME} {boundary}"),
                Ok(Outcome::Replayed(answer)) if finish_in_flight || finished => assert_eq!(answer, expected, "{NAME} {boundary}"),
                other => panic!("{NAME} {boundary}: the retry runs to the end: {other:?}"),
            }
            assert_eq!(rides(&admin, &key).await, (1, 1), "{NAME} {boundary}: one ride, done");
            // Dropped after a call, its recovery point may have been in flight and committed
            // (whole or nothing): the retry repeats the call with the same key, or not at all.
            let again = |call: &str| 1..=usize::from(*boundary == call) + 1;
            world.called(&key, again("after_charge_call"), again("after_receipt_call"), boundary);
        }
    }

    /// `run_external`'s outside call in the contrast: the ride committed on its own, then the
    /// charge; `committed` set once the ride is in.
    async fn ride_then_charge(url: &str, user: String, services: Services, committed: Arc<AtomicBool>) -> Result<StoredResponse, String> {
        let pool = admin_at(url).await;
        pool.execute("INSERT INTO rides (user_id, amount) VALUES ($1, 1250)", &[&user]).await.map_err(|e| e.to_string())?;
        committed.store(true, Ordering::SeqCst);
        let charged = idempotency_rides::stub::call(&services.http, &services.charge, &format!("{user}-charge"), serde_json::json!({})).await.map_err(|e| e.0)?;
        Ok(StoredResponse::json(201, serde_json::json!({"charge": charged})))
    }

    fn record_nothing<'t>(_: &'t mut Conn, _: &'t StoredResponse) -> TxFuture<'t, (), String> {
        Box::pin(async { Ok(()) })
    }

    /// The contrast (docs/recovery-points.md): the same flow through `run_external`, the ride
    /// committed on its own before the outside call, the worker dying after the ride's commit:
    /// without a recovery point, recovery can only fail the key (`fail`: the ride half done for
    /// good, no completion) or release it (`release`: the request runs again, a second ride).
    #[tokio::test]
    async fn run_external_cannot_survive_a_death_after_the_ride() {
        let world = World::new().await;
        // A database of its own: the crash tests' recoveries (action fail) must not reach its
        // keys, which have no recovery point.
        let url = &rides_database("steps_external").await;
        let admin = admin_at(url).await;
        let idem = handle(url);
        for action in ["fail", "release"] {
            let key = Key::new(format!("{OPERATION}.external.{action}"), format!("{}-external-{action}", driver_module()), "k-1").unwrap();
            let fp = fingerprint(&request(&key));
            let committed = Arc::new(AtomicBool::new(false));
            let first = ride_then_charge(url, key.user_id().to_owned(), world.services(), committed.clone());
            let mut call = Box::pin(idem.run_external(&key, &fp, first, record_nothing));
            // The worker dies once the ride committed (its future dropped: the key stays
            // PROCESSING, as a crash leaves it).
            let dropped = std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
                std::task::Poll::Ready(result) => std::task::Poll::Ready(Some(result.map(|_| ()))),
                std::task::Poll::Pending if committed.load(Ordering::SeqCst) => std::task::Poll::Ready(None),
                std::task::Poll::Pending => std::task::Poll::Pending,
            })
            .await;
            assert!(dropped.is_none(), "{NAME}: {dropped:?}");
            drop(call);
            lease_runs_out(&admin, &key).await;
            admin.execute("SELECT idem_recover_stuck(action => $1)", &[&action]).await.expect("idem_recover_stuck");
            let retry = ride_then_charge(url, key.user_id().to_owned(), world.services(), Arc::new(AtomicBool::new(false)));
            let again: Result<Outcome<StoredResponse>, Error<String>> = idem.run_external(&key, &fp, retry, record_nothing).await;
            if action == "fail" {
                assert!(matches!(again, Err(Error::Failed { .. })), "{NAME}: {again:?}");
                assert_eq!(record(&admin, &key).await.map(|(s, _)| s).as_deref(), Some("FAILED"), "{NAME}: no completion");
                assert_eq!(rides(&admin, &key).await.0, 1, "{NAME}: the ride stays, half done, for good");
            } else {
                assert!(matches!(again, Ok(Outcome::Executed(_))), "{NAME}: the released key runs again from its start: {again:?}");
                assert_eq!(rides(&admin, &key).await.0, 2, "{NAME}: a second ride");
            }
        }
    }
}
