//! The ride flow's writes, per driver: the insert of the ride and its completion.

use crate::{RideError, RideRequest};
use idempotency_client::{Driver, Postgres, Sqlx};
use std::future::Future;

/// The table the flow writes (the crash test and the benchmark create it).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS rides (
    id bigserial PRIMARY KEY, user_id text NOT NULL, amount bigint NOT NULL,
    charge_id text, receipt_id text, done boolean NOT NULL DEFAULT false)";

const INSERT: &str = "INSERT INTO rides (user_id, amount) VALUES ($1, $2) RETURNING id";
const DONE: &str = "UPDATE rides SET done = true, charge_id = $2, receipt_id = $3 WHERE id = $1";

/// The ride flow's writes over a driver's transaction.
pub trait Rides: Driver {
    /// Inserts the ride; its id.
    fn insert_ride<'a>(conn: &'a mut Self::Conn, request: &'a RideRequest) -> impl Future<Output = Result<i64, RideError>> + Send + 'a;

    /// Marks the ride done with the outside services' ids.
    fn mark_done<'a>(conn: &'a mut Self::Conn, ride: i64, charge: Option<&'a str>, receipt: Option<&'a str>) -> impl Future<Output = Result<(), RideError>> + Send + 'a;
}

fn db(e: impl std::fmt::Display) -> RideError {
    RideError(format!("database: {e}"))
}

impl Rides for Postgres {
    async fn insert_ride<'a>(conn: &'a mut Self::Conn, request: &'a RideRequest) -> Result<i64, RideError> {
        let insert = conn.prepare_cached(INSERT).await.map_err(db)?;
        conn.query_one(&insert, &[&request.user, &request.amount]).await.and_then(|row| row.try_get(0)).map_err(db)
    }

    async fn mark_done<'a>(conn: &'a mut Self::Conn, ride: i64, charge: Option<&'a str>, receipt: Option<&'a str>) -> Result<(), RideError> {
        let done = conn.prepare_cached(DONE).await.map_err(db)?;
        conn.execute(&done, &[&ride, &charge, &receipt]).await.map(drop).map_err(db)
    }
}

impl Rides for Sqlx {
    async fn insert_ride<'a>(conn: &'a mut Self::Conn, request: &'a RideRequest) -> Result<i64, RideError> {
        sqlx::query_scalar::<_, i64>(INSERT).bind(&request.user).bind(request.amount).fetch_one(&mut *conn).await.map_err(db)
    }

    async fn mark_done<'a>(conn: &'a mut Self::Conn, ride: i64, charge: Option<&'a str>, receipt: Option<&'a str>) -> Result<(), RideError> {
        sqlx::query(DONE).bind(ride).bind(charge).bind(receipt).execute(&mut *conn).await.map(drop).map_err(db)
    }
}
