//! The business handler of the tests and the demo: "charge a card" by writing one `charges` row
//! tagged with the key, counting every run; its closure error ([`Failure`]); and the race the
//! concurrency suites run it in ([`duplicates_of_a_held_key`]).

use crate::driver::Kit;
use idempotency_client::{Disposition, Driver, Error, Fingerprint, HandlerError, Idempotency, Key, Outcome, StoredResponse, TxFuture};
use std::marker::PhantomData;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a charge does over driver `D`; build it with [`Charge::of`] and the setters, then take
/// its [`handler`](Charge::handler). (Each driver module names it `Charge`.)
#[derive(Debug)]
pub struct Charge<D> {
    tag: String,
    user: String,
    amount: i64,
    status: u16,
    delay: Duration,
    driver: PhantomData<fn() -> D>,
}

impl<D> Clone for Charge<D> {
    fn clone(&self) -> Self {
        Charge { tag: self.tag.clone(), user: self.user.clone(), amount: self.amount, status: self.status, delay: self.delay, driver: PhantomData }
    }
}

impl<D: Kit> Charge<D> {
    /// A charge of 100 for `key` (the row's `k`), answering 201 at once.
    pub fn of(key: &Key) -> Self {
        Charge { tag: key.to_string(), user: "u".into(), amount: 100, status: 201, delay: Duration::ZERO, driver: PhantomData }
    }

    /// The row's `user_id` (default `u`).
    pub fn user(mut self, user: &str) -> Self {
        self.user = user.into();
        self
    }

    /// The amount charged and echoed in the answer (default 100).
    pub fn amount(mut self, amount: i64) -> Self {
        self.amount = amount;
        self
    }

    /// The HTTP status of the answer (default 201).
    pub fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// How long the handler keeps its transaction open after the write (default none).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The closure for `Idempotency::run`: counts the run in `runs`, writes the row, waits, then
    /// answers `{"id", "run", "charged"}` with the status.
    pub fn handler<E>(self, runs: &Arc<AtomicUsize>) -> impl for<'t> FnMut(&'t mut D::Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Send + 'static + From<D::DbError>,
    {
        self.run_with(runs, None::<fn() -> E>)
    }

    /// [`handler`](Charge::handler), but failing with `fail` after the write.
    pub fn failing<E>(self, runs: &Arc<AtomicUsize>, fail: E) -> impl for<'t> FnMut(&'t mut D::Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Clone + Send + Sync + 'static + From<D::DbError>,
    {
        self.run_with(runs, Some(move || fail.clone()))
    }

    fn run_with<E, F>(self, runs: &Arc<AtomicUsize>, fail: Option<F>) -> impl for<'t> FnMut(&'t mut D::Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Send + 'static + From<D::DbError>,
        F: Fn() -> E + Send + 'static,
    {
        let runs = runs.clone();
        move |tx| {
            let (runs, charge, fail) = (runs.clone(), self.clone(), fail.as_ref().map(|f| f()));
            Box::pin(async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let amount = charge.amount.to_string();
                let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, $2::text::bigint, $3) RETURNING id";
                let id = D::query_i64(tx, insert, &[&charge.user, &amount, &charge.tag]).await?;
                tokio::time::sleep(charge.delay).await;
                match fail {
                    Some(e) => Err(e),
                    None => Ok(StoredResponse::json(charge.status, json!({"id": id, "run": n, "charged": charge.amount}))),
                }
            })
        }
    }
}

/// A closure error that is transient unless built with a response (then a permanent failure
/// storing it). A database error inside the handler is not expected: it panics.
#[derive(Debug, Clone)]
pub struct Failure(pub Option<serde_json::Value>);

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        panic!("unexpected database error in the handler: {e}")
    }
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        panic!("unexpected database error in the handler: {e}")
    }
}

impl HandlerError for Failure {
    fn disposition(&self) -> Disposition {
        match &self.0 {
            Some(response) => Disposition::Permanent(Some(response.clone())),
            None => Disposition::Transient,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "failure {:?}", self.0)
    }
}

/// What [`duplicates_of_a_held_key`] saw.
#[derive(Debug)]
pub struct HeldRace {
    /// The answers of the 63 calls that did not get the key, received while it was held.
    pub duplicates: Vec<Result<Outcome<StoredResponse>, Error<Failure>>>,
    /// The answer of the call that got the key, after it was let go.
    pub holder: Result<Outcome<StoredResponse>, Error<Failure>>,
    /// How many times the closure ran.
    pub runs: usize,
}

/// 64 concurrent `run`s of `key` with `fingerprint`, started together: the call that gets the
/// key writes its charge row and then holds its transaction open until the 63 others have
/// answered (each within 30 s), then commits.
pub async fn duplicates_of_a_held_key<D: Kit>(idem: &Idempotency<D>, key: &Key, fingerprint: &Fingerprint) -> HeldRace {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let (done, mut answers) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..64 {
        let (idem, key, fingerprint, runs, gate, start, done) =
            (idem.clone(), key.clone(), fingerprint.clone(), runs.clone(), gate.clone(), start.clone(), done.clone());
        tokio::spawn(async move {
            start.wait().await;
            let tag = key.to_string();
            let answer = idem
                .run(&key, &fingerprint, move |tx: &mut <D as Driver>::Conn| {
                    let (runs, gate, tag) = (runs.clone(), gate.clone(), tag.clone());
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let insert = "INSERT INTO charges (user_id, amount, k) VALUES ('u', 100, $1)";
                        D::exec(tx, insert, &[&tag]).await.map_err(|_| Failure(None))?;
                        gate.acquire().await.expect("gate").forget();
                        Ok::<_, Failure>(StoredResponse::json(201, json!({})))
                    })
                })
                .await;
            let _ = done.send(answer);
        });
    }
    drop(done);
    let mut duplicates = Vec::new();
    while duplicates.len() < 63 {
        let answer = tokio::time::timeout(Duration::from_secs(30), answers.recv()).await;
        duplicates.push(answer.expect("63 duplicates answer while the holder waits").expect("an answer"));
    }
    gate.add_permits(1);
    let holder = tokio::time::timeout(Duration::from_secs(30), answers.recv()).await.expect("the holder finishes").expect("an answer");
    HeldRace { duplicates, holder, runs: runs.load(Ordering::SeqCst) }
}
