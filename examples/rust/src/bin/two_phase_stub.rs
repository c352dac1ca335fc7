//! Serves [`idempotency_examples::payouts`] (read it for the route and the provider stub), the
//! stub on a free port of 127.0.0.1: `DATABASE_URL` names the database with the extension, `BIND`
//! the address (default 127.0.0.1:3001); `PLAIN=1` serves the route without the layer instead.

use idempotency_client::{Idempotency, Postgres, Settings};
use idempotency_examples::payouts::{plain_router, provider, router, POOL_SIZE};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL to the database with the extension")?;
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3001".into());
    let idem = Idempotency::<Postgres>::from_url(&url, POOL_SIZE.try_into()?, Settings::default())?;
    idem.check_extension().await?;
    let provider_url = provider("127.0.0.1:0").await?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    // PLAIN=1: the same route without the layer, to compare the two with your own load tool.
    let plain = std::env::var_os("PLAIN").is_some_and(|v| v == "1");
    println!("listening on http://{} (provider stub at {provider_url}){}", listener.local_addr()?, if plain { ", without the layer" } else { "" });
    axum::serve(listener, if plain { plain_router(provider_url) } else { router(idem, provider_url) }).await?;
    Ok(())
}
