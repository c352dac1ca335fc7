//! The convenience constructors of the tokio-postgres handle.

use super::Postgres;
use crate::error::Error;
use crate::settings::{Settings, POOL_TIMEOUT};
use crate::Idempotency;
use deadpool_postgres::Pool;

impl Idempotency<Postgres> {
    /// A handle over `pool` with `settings`.
    pub fn new(pool: Pool, settings: Settings) -> Self {
        Idempotency::with_driver(Postgres::new(pool), settings)
    }

    /// A pool of `pool_size` connections to `url` with default [`Settings`]; see
    /// [`Idempotency::connect_with`].
    pub fn connect(url: &str, pool_size: usize) -> Result<Self, Error> {
        Self::connect_with(url, pool_size, Settings::default())
    }

    /// A pool of `pool_size` connections to `url` whose waits are bounded (5 s to get a
    /// connection, to connect, to recycle), so an unreachable or exhausted store is a
    /// [`Error::StoreUnavailable`] error, never a hang. Nothing is connected yet (call
    /// [`Idempotency::check_extension`] to fail fast); a malformed URL or schema name is a
    /// [`Error::Configuration`] error.
    ///
    /// The URL's `sslmode` is honoured (`disable`, `prefer` — the default —, `require`,
    /// `verify-ca`, `verify-full`, with `sslrootcert`; see [`crate::tls`]): the encrypting modes
    /// need the `tls` feature (rustls), and without it `require` and the verify modes are a
    /// [`Error::Configuration`] error naming the feature.
    pub fn connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Self, Error> {
        use crate::tls::{connect_params, Connector};
        use deadpool_postgres::{Manager, ManagerConfig, Runtime};
        settings.check()?;
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
        Ok(Self::new(pool, settings))
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.driver().pool()
    }
}
