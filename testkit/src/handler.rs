//! The business handler of the tests and the demo: "charge a card" by writing one `charges` row
//! tagged with the key, counting every run.

use crate::{Conn, DbError};
use idempotency_client::{Key, StoredResponse, TxFuture};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a charge does; build it with [`Charge::of`] and the setters, then take its
/// [`handler`](Charge::handler).
#[derive(Debug, Clone)]
pub struct Charge {
    tag: String,
    user: String,
    amount: i64,
    status: u16,
    delay: Duration,
}

impl Charge {
    /// A charge of 100 for `key` (the row's `k`), answering 201 at once.
    pub fn of(key: &Key) -> Self {
        Charge { tag: key.to_string(), user: "u".into(), amount: 100, status: 201, delay: Duration::ZERO }
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
    pub fn handler<E>(self, runs: &Arc<AtomicUsize>) -> impl for<'t> FnMut(&'t mut Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Send + 'static + From<DbError>,
    {
        self.run_with(runs, None::<fn() -> E>)
    }

    /// [`handler`](Charge::handler), but failing with `fail` after the write.
    pub fn failing<E>(self, runs: &Arc<AtomicUsize>, fail: E) -> impl for<'t> FnMut(&'t mut Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Clone + Send + Sync + 'static + From<DbError>,
    {
        self.run_with(runs, Some(move || fail.clone()))
    }

    fn run_with<E, F>(self, runs: &Arc<AtomicUsize>, fail: Option<F>) -> impl for<'t> FnMut(&'t mut Conn) -> TxFuture<'t, StoredResponse, E> + Send
    where
        E: Send + 'static + From<DbError>,
        F: Fn() -> E + Send + 'static,
    {
        let runs = runs.clone();
        move |tx| {
            let (runs, charge, fail) = (runs.clone(), self.clone(), fail.as_ref().map(|f| f()));
            Box::pin(async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let amount = charge.amount.to_string();
                let insert = "INSERT INTO charges (user_id, amount, k) VALUES ($1, $2::text::bigint, $3) RETURNING id";
                let id = crate::query_i64(tx, insert, &[&charge.user, &amount, &charge.tag]).await?;
                tokio::time::sleep(charge.delay).await;
                match fail {
                    Some(e) => Err(e),
                    None => Ok(StoredResponse::json(charge.status, json!({"id": id, "run": n, "charged": charge.amount}))),
                }
            })
        }
    }
}
