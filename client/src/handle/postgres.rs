//! The handle over tokio-postgres: made from a deadpool pool or from a URL
//! (`driver::postgres::connect` builds the pool and the driver over it).

use super::{Connect, Idempotency};
use crate::driver::postgres::connect;
use crate::driver::Postgres;
use crate::error::Error;
use crate::settings::Settings;
use deadpool_postgres::Pool;

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Connect for Postgres {
    type Pool = Pool;

    fn open(url: &str, pool_size: u32, settings: &Settings) -> Result<Self, Error> {
        connect::driver(url, usize::try_from(pool_size).unwrap_or(usize::MAX), settings)
    }

    fn over(pool: Pool) -> Self {
        Postgres::new(pool)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Idempotency<Postgres> {
    /// A handle over `pool` with `settings`. The cancel requests of dropped calls cannot use
    /// the pool's own TLS connector, which a pool does not tell: see [`Postgres::new`], and give
    /// it with `Idempotency::with_driver(Postgres::new(pool).cancel_tls(tls), settings)`.
    ///
    /// The same as [`Idempotency::from_pool`], the shape every driver shares.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn new(pool: Pool, settings: Settings) -> Self {
        Idempotency::with_driver(Postgres::new(pool), settings)
    }

    /// A pool of `pool_size` connections to `url` with default [`Settings`]; see
    /// [`Idempotency::connect_with`].
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::connect_with`].
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn connect(url: &str, pool_size: usize) -> Result<Self, Error> {
        Self::connect_with(url, pool_size, Settings::default())
    }

    /// A pool of `pool_size` connections to `url` whose waits are bounded by `settings`
    /// ([`Settings::pool_timeout`] for a free connection, [`Settings::connect_timeout`] to open
    /// or recycle one, 5 s each by default; the URL's `connect_timeout` wins), with TCP
    /// keepalives ([`Settings::keepalives_idle`]; the URL's `keepalives`, `keepalives_idle`,
    /// `keepalives_interval`, `keepalives_retries` win) and, if set, a server
    /// [`Settings::statement_timeout`] (a `statement_timeout` in the URL's `options` wins), so an
    /// unreachable or exhausted store is a [`Error::StoreUnavailable`] error, never a hang; every
    /// call is bounded besides by [`Settings::call_timeout`]. Nothing is connected yet (call
    /// [`Idempotency::check_extension`] to fail fast); a malformed URL or schema name, or a zero
    /// bound, is a [`Error::Configuration`] error.
    ///
    /// The URL's `sslmode` is honoured (`disable`, `prefer` — the default —, `require`,
    /// `verify-ca`, `verify-full`, with `sslrootcert`; see [`crate::tls`]): the encrypting modes
    /// need the `tls` feature (rustls), and without it `require` and the verify modes are a
    /// [`Error::Configuration`] error naming the feature.
    ///
    /// [`Idempotency::from_url`] is the same with the pool size as a `u32`, the shape every
    /// driver shares.
    ///
    /// # Errors
    ///
    /// [`Error::Configuration`], as said above; nothing is connected, so an unreachable server
    /// is the first call's [`Error::StoreUnavailable`] (the repository's docs/rust-client.md,
    /// "Errors").
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Self, Error> {
        settings.check()?;
        Ok(Self::with_driver(connect::driver(url, pool_size, &settings)?, settings))
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.driver().pool()
    }
}
