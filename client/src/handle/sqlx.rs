//! The handle over sqlx: its [`Connect`] impl (`driver::sqlx::connect` builds the pool from a
//! URL), the pool accessor, and the constructors of 0.6.0, deprecated for
//! [`Idempotency::from_url`] and [`Idempotency::from_pool`].

use super::{Connect, Idempotency};
use crate::driver::sqlx::connect;
use crate::driver::Sqlx;
use crate::error::Error;
use crate::settings::Settings;
use sqlx::PgPool;

#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl Connect for Sqlx {
    type Pool = PgPool;

    fn open(url: &str, pool_size: u32, settings: &Settings) -> Result<Self, Error> {
        Ok(Sqlx::new(connect::pool(url, pool_size, settings)?))
    }

    fn over(pool: PgPool) -> Self {
        Sqlx::new(pool)
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
impl Idempotency<Sqlx> {
    /// The pool.
    pub fn pool(&self) -> &PgPool {
        self.driver().pool()
    }

    /// `Idempotency::<Sqlx>::from_pool(pool, settings)`.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn from_sqlx(pool: PgPool, settings: impl Into<Settings>) -> Self {
        Self::from_pool(pool, settings)
    }

    /// `Idempotency::<Sqlx>::from_url(url, pool_size, Settings::default())`.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::from_url`].
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn connect_sqlx(url: &str, pool_size: u32) -> Result<Self, Error> {
        Self::from_url(url, pool_size, Settings::default())
    }

    /// `Idempotency::<Sqlx>::from_url(url, pool_size, settings)`.
    ///
    /// # Errors
    ///
    /// Those of [`Idempotency::from_url`].
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    #[deprecated(since = "0.7.0", note = "use Idempotency::from_url / from_pool")]
    pub fn connect_sqlx_with(url: &str, pool_size: u32, settings: impl Into<Settings>) -> Result<Self, Error> {
        Self::from_url(url, pool_size, settings)
    }
}
