//! One constructor shape for every driver: [`Idempotency::from_url`] (a pool the handle
//! opens, its size a `u32` whatever the driver) and [`Idempotency::from_pool`] (your own pool),
//! over the per-driver part, [`Connect`], implemented in `postgres` and `sqlx`.

use super::Idempotency;
use crate::driver::Driver;
use crate::error::Error;
use crate::settings::Settings;

/// How a driver's handle is made: from a URL or from a pool of the driver's own type.
/// Implemented for `Postgres` and `Sqlx` only (the `Driver` trait is sealed).
pub trait Connect: Driver {
    /// The driver's pool: `deadpool_postgres::Pool` for `Postgres`, `sqlx::PgPool` for `Sqlx`.
    type Pool;

    /// The driver over a new pool of `pool_size` connections to `url`, bounded by `settings`.
    #[doc(hidden)]
    fn open(url: &str, pool_size: u32, settings: &Settings) -> Result<Self, Error>;

    /// The driver over `pool`.
    #[doc(hidden)]
    fn over(pool: Self::Pool) -> Self;
}

impl<D: Connect> Idempotency<D> {
    /// A handle over a new pool of `pool_size` connections to `url`, with `settings`: the one
    /// shape for either driver (`Idempotency::<Sqlx>::from_url(..)` over sqlx; a plain
    /// `Idempotency`, the tokio-postgres handle, where the type is written or inferred). What
    /// the URL may say and how `settings` bound the pool's waits are the driver's:
    /// `Idempotency::connect_with` (tokio-postgres), `Idempotency::connect_sqlx_with` (sqlx),
    /// which this replaces (they stay, with their `usize` and `u32` sizes).
    ///
    /// # Errors
    ///
    /// [`Error::Configuration`] for a malformed URL, an option the driver refuses, a bad schema
    /// name, a zero bound or a zero `pool_size`, a TLS mode without the `tls` feature. Nothing is
    /// connected yet: an unreachable server is an [`Error::StoreUnavailable`] of the first call
    /// (call [`Idempotency::check_extension`] to fail fast).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn from_url(url: &str, pool_size: u32, settings: Settings) -> Result<Self, Error> {
        settings.check()?;
        if pool_size == 0 {
            return Err(Error::Configuration { reason: "pool_size must be at least 1".into(), source: None });
        }
        Ok(Self::with_driver(D::open(url, pool_size, &settings)?, settings))
    }

    /// A handle over your own `pool` with `settings` (for `Postgres` as `Idempotency::new`,
    /// for `Sqlx` as `Idempotency::from_sqlx`): the one shape for either driver.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is (its bounds are yours).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn from_pool(pool: D::Pool, settings: Settings) -> Self {
        Self::with_driver(D::over(pool), settings)
    }
}
