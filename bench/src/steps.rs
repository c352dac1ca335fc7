//! The recovery points' row (issue 45, docs/recovery-points.md): a three-step request through
//! `run_steps` (a local step inserting a row, an outside call to an in-process stub with no
//! latency, a local step writing the call's result, then the finish marking the row done and
//! completing the key) against the same steps by hand without idempotency, cut at the same
//! boundaries in three transactions (`BEGIN; INSERT; COMMIT`, the call, `BEGIN; UPDATE; COMMIT`,
//! `BEGIN; UPDATE; COMMIT`), over tokio-postgres and over sqlx, at 1, 8 and 32 tasks (1 and 8
//! in smoke mode), interleaved. The figure is requests per second; what `run_steps` adds per request: the
//! reservation with recovery point 0 (one statement), an `idem_checkpoint` queued with each
//! local step's `COMMIT`, the outside step's recovery point (one statement), `idem_complete`
//! queued with the finish's `COMMIT`, and the heartbeat task started and stopped around the call.

use crate::pgbench::Measure;
use crate::Row;
use idempotency_client::{Connect, Driver, Fingerprint, Idempotency, Key, Outcome, Plan, Postgres, Sqlx, StoredResponse, Tx};
use tokio_postgres::types::ToSql;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_steps (id bigserial PRIMARY KEY, user_id text NOT NULL, result text, done boolean NOT NULL DEFAULT false)";
const INSERT: &str = "INSERT INTO bench_steps (user_id) VALUES ($1) RETURNING id";
const RECORD: &str = "UPDATE bench_steps SET result = $2 WHERE id = $1";
const DONE: &str = "UPDATE bench_steps SET done = true WHERE id = $1";

/// The outside service: one effective call per idempotency key, in process, no latency.
#[derive(Clone, Default)]
struct Stub(Arc<Mutex<HashMap<String, String>>>);

impl Stub {
    fn call(&self, key: &str) -> String {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.entry(key.to_owned()).or_insert_with(|| format!("r-{key}")).clone()
    }
}

/// The state of the three steps: the user, the row's id, the call's result.
type State = (String, Option<i64>, Option<String>);

fn db(e: tokio_postgres::Error) -> String {
    e.to_string()
}

/// The plan of the three steps.
fn plan(stub: Stub) -> Plan<State, StoredResponse, String, Postgres> {
    Plan::new()
        .local_boxed("create", |tx: &mut Tx, mut s: State| {
            Box::pin(async move {
                let insert = tx.prepare_cached(INSERT).await.map_err(db)?;
                s.1 = Some(tx.query_one(&insert, &[&s.0]).await.map_err(db)?.get(0));
                Ok(s)
            })
        })
        .outside_boxed("call", move |derived, mut s: State| {
            let stub = stub.clone();
            Box::pin(async move {
                s.2 = Some(stub.call(derived.as_str()));
                Ok(s)
            })
        })
        .local_boxed("record", |tx: &mut Tx, s: State| {
            Box::pin(async move {
                let record = tx.prepare_cached(RECORD).await.map_err(db)?;
                tx.execute(&record, &[&s.1 as &(dyn ToSql + Sync), &s.2]).await.map_err(db)?;
                Ok(s)
            })
        })
        .finish_boxed(|tx: &mut Tx, s: State| {
            Box::pin(async move {
                let done = tx.prepare_cached(DONE).await.map_err(db)?;
                tx.execute(&done, &[&s.1]).await.map_err(db)?;
                Ok(StoredResponse::json(201, serde_json::json!({"id": s.1, "result": s.2})))
            })
        })
}

/// The same steps by hand: three transactions and the call between the first two.
async fn by_hand(idem: &Idempotency, stub: &Stub, user: &str, n: u64) {
    let mut client = idem.pool().get().await.expect("connection");
    let tx = client.transaction().await.expect("begin");
    let insert = tx.prepare_cached(INSERT).await.expect("prepare");
    let id: i64 = tx.query_one(&insert, &[&user]).await.expect("insert").get(0);
    tx.commit().await.expect("commit");
    drop(client);
    let result = stub.call(&format!("{user}-{n}"));
    for (sql, params) in [(RECORD, Some(&result)), (DONE, None)] {
        let mut client = idem.pool().get().await.expect("connection");
        let tx = client.transaction().await.expect("begin");
        let stmt = tx.prepare_cached(sql).await.expect("prepare");
        match params {
            Some(result) => tx.execute(&stmt, &[&id, result]).await.expect("record"),
            None => tx.execute(&stmt, &[&id]).await.expect("done"),
        };
        tx.commit().await.expect("commit");
    }
}

/// The three steps over a driver: as a plan, and by hand.
trait Steps: Driver + Connect + Sized {
    const NAME: &'static str;
    fn plan(stub: Stub) -> Plan<State, StoredResponse, String, Self>;
    fn by_hand(idem: &Idempotency<Self>, stub: &Stub, user: &str, n: u64) -> impl std::future::Future<Output = ()> + Send;
    fn handle(url: &str, tasks: usize) -> Idempotency<Self> {
        Idempotency::<Self>::from_url(url, crate::client::pool_size(tasks), idempotency_client::Settings::default()).expect("pool")
    }
}

impl Steps for Postgres {
    const NAME: &'static str = "tokio-postgres";

    fn plan(stub: Stub) -> Plan<State, StoredResponse, String, Self> {
        plan(stub)
    }

    async fn by_hand(idem: &Idempotency<Self>, stub: &Stub, user: &str, n: u64) {
        by_hand(idem, stub, user, n).await
    }
}

impl Steps for Sqlx {
    const NAME: &'static str = "sqlx";

    fn plan(stub: Stub) -> Plan<State, StoredResponse, String, Self> {
        Plan::new()
            .local_boxed("create", |tx: &mut sqlx::PgConnection, mut s: State| {
                Box::pin(async move {
                    s.1 = Some(sqlx::query_scalar::<_, i64>(INSERT).bind(&s.0).fetch_one(&mut *tx).await.map_err(|e| e.to_string())?);
                    Ok(s)
                })
            })
            .outside_boxed("call", move |derived, mut s: State| {
                let stub = stub.clone();
                Box::pin(async move {
                    s.2 = Some(stub.call(derived.as_str()));
                    Ok(s)
                })
            })
            .local_boxed("record", |tx: &mut sqlx::PgConnection, s: State| {
                Box::pin(async move {
                    sqlx::query(RECORD).bind(s.1).bind(&s.2).execute(&mut *tx).await.map_err(|e| e.to_string())?;
                    Ok(s)
                })
            })
            .finish_boxed(|tx: &mut sqlx::PgConnection, s: State| {
                Box::pin(async move {
                    sqlx::query(DONE).bind(s.1).execute(&mut *tx).await.map_err(|e| e.to_string())?;
                    Ok(StoredResponse::json(201, serde_json::json!({"id": s.1, "result": s.2})))
                })
            })
    }

    async fn by_hand(idem: &Idempotency<Self>, stub: &Stub, user: &str, n: u64) {
        use sqlx::Connection;
        let mut conn = idem.pool().acquire().await.expect("connection");
        let mut tx = conn.begin().await.expect("begin");
        let id: i64 = sqlx::query_scalar(INSERT).bind(user).fetch_one(&mut *tx).await.expect("insert");
        tx.commit().await.expect("commit");
        drop(conn);
        let result = stub.call(&format!("{user}-{n}"));
        for record in [true, false] {
            let mut conn = idem.pool().acquire().await.expect("connection");
            let mut tx = conn.begin().await.expect("begin");
            if record {
                sqlx::query(RECORD).bind(id).bind(&result).execute(&mut *tx).await.expect("record");
            } else {
                sqlx::query(DONE).bind(id).execute(&mut *tx).await.expect("done");
            }
            tx.commit().await.expect("commit");
        }
    }
}

/// One run of `tasks` loops for `run`, through `run_steps` or by hand.
async fn throughput<D: Steps>(url: &str, db: &tokio_postgres::Client, tasks: usize, run: Duration, ours: bool) -> Measure {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let idem = D::handle(url, tasks);
    let stub = Stub::default();
    let plan = Arc::new(D::plan(stub.clone()));
    let before = crate::client::wal_lsn(db).await;
    let stop = Instant::now() + run;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (idem, stub, plan) = (idem.clone(), stub.clone(), plan.clone());
        handles.push(tokio::spawn(async move {
            let user = format!("steps-{t}");
            let fingerprint = Fingerprint::of_bytes(b"steps");
            let mut latencies = Vec::new();
            while Instant::now() < stop {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let t0 = Instant::now();
                if ours {
                    let key = Key::new("bench.steps", user.as_str(), format!("k{n}-{}", std::process::id())).expect("key");
                    let input: State = (user.clone(), None, None);
                    let out = idem.run_steps(&key, &fingerprint, &plan, input).await.expect("run_steps");
                    assert!(matches!(out, Outcome::Executed(_)), "a new key executes");
                } else {
                    D::by_hand(&idem, &stub, &user, n).await;
                }
                latencies.push(t0.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let wal = crate::client::wal_since(db, &before).await;
    crate::client::measure(latencies, elapsed, wal)
}

/// The rows: per task count, `reps` interleaved pairs.
pub(crate) async fn rows(url: &str, db: &tokio_postgres::Client, smoke: bool, reps: usize, run: Duration) -> Vec<Row> {
    db.batch_execute(TABLE).await.expect("bench_steps");
    let tasks: &[usize] = if smoke { &[1, 8] } else { &[1, 8, 32] };
    let mut rows = Vec::new();
    for &n in tasks {
        rows.push(row::<Postgres>(url, db, n, reps, run).await);
    }
    for &n in tasks {
        rows.push(row::<Sqlx>(url, db, n, reps, run).await);
    }
    rows
}

/// One row: `reps` interleaved pairs at `n` tasks over `D`.
async fn row<D: Steps>(url: &str, db: &tokio_postgres::Client, n: usize, reps: usize, run: Duration) -> Row {
    let (mut hand, mut ours) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        for first in [rep % 2 == 0, rep % 2 != 0] {
            let m = throughput::<D>(url, db, n, run, !first).await;
            if first { hand.push(m) } else { ours.push(m) }
        }
    }
    Row {
        figure: format!("three-step request via run_steps vs the same steps by hand in three transactions ({})", D::NAME),
        clients: format!("{n} tasks"),
        baseline: "BEGIN; INSERT; COMMIT, the call, BEGIN; UPDATE; COMMIT, BEGIN; UPDATE; COMMIT (no idempotency)".into(),
        base: Measure::mean(&hand),
        ours: Measure::mean(&ours),
        goal: None,
        work: Some(
            "round trips per request, counted from the code (statements prepared once per connection): by hand 9 (BEGIN, the statement, COMMIT, three times); \
             run_steps 8 (the reservation with recovery point 0; BEGIN + INSERT, checkpoint + COMMIT; the call's checkpoint; BEGIN + UPDATE, checkpoint + COMMIT; BEGIN + UPDATE, complete + COMMIT)"
                .into(),
        ),
    }
}
