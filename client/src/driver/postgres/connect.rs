//! The tokio-postgres pool a handle makes from a URL (`Idempotency::connect_with`): its TLS
//! options read by `crate::tls`, every wait bounded by [`POOL_TIMEOUT`].

use crate::error::Error;
use crate::settings::POOL_TIMEOUT;
use deadpool_postgres::Pool;

/// A pool of `pool_size` connections to `url`, nothing connected yet; a malformed URL, or an
/// `sslmode` this build cannot honour, is a [`Error::Configuration`] error.
pub(crate) fn pool(url: &str, pool_size: usize) -> Result<Pool, Error> {
    use crate::tls::{connect_params, Connector};
    use deadpool_postgres::{Manager, ManagerConfig, Runtime};
    let params = connect_params(url).map_err(|reason| Error::Configuration {
        reason,
        // The driver's own parse error, when it is the rest of the URL (its TLS options
        // taken out) that does not parse.
        source: crate::tls::SslParams::parse(url)
            .ok()
            .and_then(|ssl| ssl.rest.parse::<tokio_postgres::Config>().err())
            .map(|e| Box::new(e) as _),
    })?;
    let mut config = params.options.config;
    config.connect_timeout(POOL_TIMEOUT);
    let manager = match params.connector {
        Connector::NoTls(tls) => Manager::from_config(config, tls, ManagerConfig::default()),
        #[cfg(feature = "tls")]
        Connector::Rustls(tls) => Manager::from_config(config, tls, ManagerConfig::default()),
    };
    let timeout = Some(POOL_TIMEOUT);
    let pool = Pool::builder(manager)
        .max_size(pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(timeout)
        .create_timeout(timeout)
        .recycle_timeout(timeout)
        .build()
        .map_err(|e| Error::Configuration {
            reason: format!("cannot build a connection pool for the given URL: {e}"),
            source: Some(Box::new(e)),
        })?;
    Ok(pool)
}
