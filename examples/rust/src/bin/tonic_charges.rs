//! Serves [`idempotency_examples::grpc_charges`] (read it for the service and the answers):
//! `DATABASE_URL` names the database with the extension, `BIND` the address (default
//! 127.0.0.1:50051), `IDEM_SCHEMA` the extension's schema (otherwise looked up in
//! `pg_extension`), `IDEM_DRIVER=sqlx` the sqlx driver (tokio-postgres otherwise),
//! `IDEM_MODE=two_phase` the two-phase mode, `IDEM_KEY=request_id` the key from the message.

use idempotency_tower::Mode;
use idempotency_client::{Idempotency, Postgres, Settings, Sqlx};
use idempotency_examples::charges::POOL_SIZE;
use idempotency_examples::grpc_charges::{serve, KeyFrom, SCHEMA};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to the database with the extension")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let mut settings = Settings::builder();
    if let Ok(schema) = std::env::var("IDEM_SCHEMA") {
        settings = settings.schema(schema);
    }
    let mode = if std::env::var("IDEM_MODE").is_ok_and(|m| m == "two_phase") { Mode::TwoPhase } else { Mode::InTransaction };
    let key_from = if std::env::var("IDEM_KEY").is_ok_and(|k| k == "request_id") { KeyFrom::RequestId } else { KeyFrom::Metadata };
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on {} (gRPC, {mode:?}, key from {key_from:?})", listener.local_addr()?);
    if std::env::var("IDEM_DRIVER").is_ok_and(|d| d == "sqlx") {
        let idem = Idempotency::<Sqlx>::from_url(&url, 16, settings)?;
        idem.check_extension().await?;
        sqlx::raw_sql(SCHEMA).execute(idem.pool()).await?;
        serve(idem, mode, key_from, None, listener).await?;
    } else {
        let idem = Idempotency::<Postgres>::from_url(&url, POOL_SIZE.try_into()?, settings)?;
        idem.check_extension().await?;
        idem.pool().get().await?.batch_execute(SCHEMA).await?;
        serve(idem, mode, key_from, None, listener).await?;
    }
    Ok(())
}
