//! How the actix-web and gRPC examples write a charge over either driver: through the request's
//! transaction (in-transaction mode) or on a connection of their own (two-phase mode).

use idempotency_client::driver::Lease;
use idempotency_client::{Driver, Idempotency, Postgres};
use std::future::Future;
use std::ops::DerefMut;

/// The request's transaction used as the connection, whichever stack's extractor holds it
/// (idempotency-tower's `Connection`, idempotency-actix's).
pub trait Conn<D: Driver>: DerefMut<Target = <D::Shared as Lease>::Conn> + Send {}

impl<D: Driver, C: DerefMut<Target = <D::Shared as Lease>::Conn> + Send> Conn<D> for C {}

/// The insert of a charge, per driver.
pub trait Charges: Driver {
    /// Inserts the charge through the request's transaction, used as the connection; its id.
    fn insert(tx: &mut impl Conn<Self>, user: &str, amount: i64) -> impl Future<Output = Result<i64, String>> + Send;

    /// Inserts the charge on a pooled connection of `idem`, committed at once (the effect of a
    /// two-phase route); its id.
    fn insert_own(idem: &Idempotency<Self>, user: &str, amount: i64) -> impl Future<Output = Result<i64, String>> + Send;
}

const INSERT: &str = "INSERT INTO charges (user_id, amount) VALUES ($1, $2) RETURNING id";

impl Charges for Postgres {
    async fn insert(tx: &mut impl Conn<Self>, user: &str, amount: i64) -> Result<i64, String> {
        let insert = tx.prepare_cached(INSERT).await.map_err(|e| e.to_string())?;
        tx.query_one(&insert, &[&user, &amount]).await.and_then(|row| row.try_get("id")).map_err(|e| e.to_string())
    }

    async fn insert_own(idem: &Idempotency<Self>, user: &str, amount: i64) -> Result<i64, String> {
        let conn = idem.pool().get().await.map_err(|e| e.to_string())?;
        conn.query_one(INSERT, &[&user, &amount]).await.and_then(|row| row.try_get("id")).map_err(|e| e.to_string())
    }
}

#[cfg(feature = "sqlx")]
impl Charges for idempotency_client::Sqlx {
    async fn insert(tx: &mut impl Conn<Self>, user: &str, amount: i64) -> Result<i64, String> {
        sqlx::query_scalar::<_, i64>(INSERT).bind(user).bind(amount).fetch_one(&mut **tx).await.map_err(|e| e.to_string())
    }

    async fn insert_own(idem: &Idempotency<Self>, user: &str, amount: i64) -> Result<i64, String> {
        sqlx::query_scalar::<_, i64>(INSERT).bind(user).bind(amount).fetch_one(idem.pool()).await.map_err(|e| e.to_string())
    }
}
