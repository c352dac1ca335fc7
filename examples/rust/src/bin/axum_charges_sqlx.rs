//! Serves [`idempotency_examples::charges_sqlx`] (read it for the routes and the answers):
//! `DATABASE_URL` names the database with the extension, `BIND` the address (default
//! 127.0.0.1:3000), `IDEM_SCHEMA` the extension's schema (otherwise looked up in
//! `pg_extension`).

use idempotency_client::{Idempotency, Settings, Sqlx};
use idempotency_examples::charges_sqlx::{router, SCHEMA};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to the database with the extension")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let mut settings = Settings::builder();
    if let Ok(schema) = std::env::var("IDEM_SCHEMA") {
        settings = settings.schema(schema);
    }
    let idem = Idempotency::<Sqlx>::from_url(&url, 16, settings)?;
    idem.check_extension().await?;
    sqlx::raw_sql(SCHEMA).execute(idem.pool()).await?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(idem)).await?;
    Ok(())
}
