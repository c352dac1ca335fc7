//! Serves [`idempotency_examples::actix_charges`] (read it for the route and the answers):
//! `DATABASE_URL` names the database with the extension, `BIND` the address (default
//! 127.0.0.1:3000), `IDEM_SCHEMA` the extension's schema (otherwise looked up in
//! `pg_extension`), `IDEM_DRIVER=sqlx` the sqlx driver (tokio-postgres otherwise).

use idempotency_client::{Idempotency, Postgres, Settings, Sqlx};
use idempotency_examples::actix_charges::{server, SCHEMA};
use idempotency_examples::charges::POOL_SIZE;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to the database with the extension")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let mut settings = Settings::builder();
    if let Ok(schema) = std::env::var("IDEM_SCHEMA") {
        settings = settings.schema(schema);
    }
    let sqlx = std::env::var("IDEM_DRIVER").is_ok_and(|d| d == "sqlx");
    actix_web::rt::System::new().block_on(async move {
        let listener = std::net::TcpListener::bind(&bind)?;
        println!("listening on http://{}", listener.local_addr()?);
        if sqlx {
            let idem = Idempotency::<Sqlx>::from_url(&url, 16, settings)?;
            idem.check_extension().await?;
            sqlx::raw_sql(SCHEMA).execute(idem.pool()).await?;
            server(idem, listener)?.await?;
        } else {
            let idem = Idempotency::<Postgres>::from_url(&url, POOL_SIZE.try_into()?, settings)?;
            idem.check_extension().await?;
            idem.pool().get().await?.batch_execute(SCHEMA).await?;
            server(idem, listener)?.await?;
        }
        Ok(())
    })
}
