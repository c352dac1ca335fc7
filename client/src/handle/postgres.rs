//! The handle over tokio-postgres: its [`Connect`] impl (`driver::postgres::connect` builds the
//! pool from a URL), the pool accessor, and the constructors of 0.6.0, deprecated for
//! [`Idempotency::from_url`] and [`Idempotency::from_pool`].

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
        connect::driver(url, pool_size, settings)
    }

    fn over(pool: Pool) -> Self {
        Postgres::new(pool)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Idempotency<Postgres> {
    /// The pool.
    pub fn pool(&self) -> &Pool {
        self.driver().pool()
    }

    /// `Idempotency::from_pool(pool, settings)`.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn new(pool: Pool, settings: impl Into<Settings>) -> Self {
        Self::from_pool(pool, settings)
    }

    /// `Idempotency::from_url(url, pool_size, Settings::default())`.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::from_url`], and a `pool_size` beyond `u32::MAX`.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn connect(url: &str, pool_size: usize) -> Result<Self, Error> {
        Self::from_url(url, pool_size_u32(pool_size)?, Settings::default())
    }

    /// `Idempotency::from_url(url, pool_size, settings)`.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::from_url`], and a `pool_size` beyond `u32::MAX`.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn connect_with(url: &str, pool_size: usize, settings: impl Into<Settings>) -> Result<Self, Error> {
        Self::from_url(url, pool_size_u32(pool_size)?, settings)
    }
}

/// A deprecated constructor's `usize` pool size as the `u32` of [`Idempotency::from_url`].
fn pool_size_u32(pool_size: usize) -> Result<u32, Error> {
    u32::try_from(pool_size).map_err(|_| Error::Configuration { reason: format!("pool_size must be at most {} (got {pool_size})", u32::MAX), source: None })
}
