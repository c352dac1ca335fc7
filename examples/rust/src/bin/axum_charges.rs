//! Serves [`idempotency_examples::charges`] (read it for the routes and the answers):
//! `DATABASE_URL` names the database with the extension, `BIND` the address (default
//! 127.0.0.1:3000), `IDEM_SCHEMA` the extension's schema (otherwise looked up in
//! `pg_extension`); `PLAIN=1` serves the route without the layer instead.

use idempotency_client::{Idempotency, Postgres, Settings};
use idempotency_examples::charges::{plain_router, router, POOL_SIZE, SCHEMA};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to the database with the extension")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let mut settings = Settings::builder();
    if let Ok(schema) = std::env::var("IDEM_SCHEMA") {
        settings = settings.schema(schema);
    }
    let idem = Idempotency::<Postgres>::from_url(&url, POOL_SIZE.try_into()?, settings)?;
    idem.check_extension().await?;
    idem.pool().get().await?.batch_execute(SCHEMA).await?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    // PLAIN=1: the same route without the layer, to compare the two with your own load tool.
    let plain = std::env::var_os("PLAIN").is_some_and(|v| v == "1");
    println!("listening on http://{}{}", listener.local_addr()?, if plain { " (without the layer)" } else { "" });
    axum::serve(listener, if plain { plain_router(idem.pool().clone()) } else { router(idem) }).await?;
    Ok(())
}
