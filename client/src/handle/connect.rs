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
    /// A handle over a new pool of `pool_size` connections to `url`, with `settings` (a
    /// [`Settings`] or the builder `Settings::builder()` gives): the one shape for either driver
    /// (`Idempotency::<Sqlx>::from_url(..)` over sqlx; a plain `Idempotency`, the
    /// tokio-postgres handle, where the type is written or inferred). Nothing is connected yet:
    /// call [`Idempotency::check_extension`] to fail fast.
    ///
    /// The pool's waits are bounded by `settings` ([`Settings::pool_timeout`] for a free
    /// connection, [`Settings::connect_timeout`] to open one, 5 s each by default; the URL's
    /// `connect_timeout` wins), and a server [`Settings::statement_timeout`] is sent when
    /// connecting if set (a `statement_timeout` in the URL's `options` wins), so an unreachable
    /// or exhausted store is an [`Error::StoreUnavailable`] error, never a hang; every call is
    /// bounded besides by [`Settings::call_timeout`]. The URL's `sslmode` is honoured
    /// (`disable`, `prefer` — the default, `PGSSLMODE` is not read —, `require`, `verify-ca`,
    /// `verify-full`, with `sslrootcert`; see [`crate::tls`]): the encrypting modes need the
    /// `tls` feature (rustls), and without it `require` and the verify modes are an
    /// [`Error::Configuration`] error naming the mode and the feature; `sslcert` and `sslkey`
    /// are refused.
    ///
    /// Over tokio-postgres (`Postgres`): the pool's connections keep TCP keepalives
    /// ([`Settings::keepalives_idle`]; the URL's `keepalives`, `keepalives_idle`,
    /// `keepalives_interval`, `keepalives_retries` win), and the URL may list several hosts
    /// (`target_session_attrs` picks the one that takes writes).
    ///
    /// Over sqlx (`Sqlx`; call it inside a tokio runtime): sqlx bounds the wait for a free
    /// connection and the opening of a new one together, by [`Settings::pool_timeout`] plus
    /// [`Settings::connect_timeout`]. sqlx sets no TCP keepalive and has no option for one: a
    /// URL naming `keepalives` (other than `keepalives=0`), `keepalives_idle`,
    /// `keepalives_interval` or `keepalives_retries` is refused. The URL is sqlx's URL form
    /// (`postgres://...`; sqlx reads no key=value string), with one host: a host list
    /// (`postgresql://a,b/db`, for failover) is refused with an error naming the alternatives.
    /// TLS is sqlx's own rustls with ring and the system roots when the client's `tls` feature
    /// is on; without it `prefer` connects in plain text (encrypted if your build turns on one
    /// of sqlx's own TLS features). `require` with an `sslrootcert` file verifies the CA, as
    /// libpq does. Where sqlx differs from tokio-postgres: with an `sslrootcert` file,
    /// `verify-ca` and `verify-full` trust the system roots as well as the file's (libpq and
    /// the tokio-postgres handle trust only the file); `hostaddr` replaces the host, so
    /// `verify-full` checks the certificate against that address, not the `host` name; and
    /// without `sslrootcert` in the URL sqlx reads `PGSSLROOTCERT` (and `PGSSLCERT`,
    /// `PGSSLKEY`) from the environment.
    ///
    /// # Errors
    ///
    /// [`Error::Configuration`] for a malformed URL, an option the driver refuses (above), a
    /// bad schema name, a zero bound or a zero `pool_size`, a TLS mode without the `tls`
    /// feature, an unreadable `sslrootcert` of a verify mode. Nothing is connected yet: an
    /// unreachable server is an [`Error::StoreUnavailable`] of the first call (the repository's
    /// docs/rust-client.md, "Errors").
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn from_url(url: &str, pool_size: u32, settings: impl Into<Settings>) -> Result<Self, Error> {
        let settings = settings.into();
        settings.check()?;
        if pool_size == 0 {
            return Err(Error::Configuration { reason: "pool_size must be at least 1".into(), source: None });
        }
        Ok(Self::with_driver(D::open(url, pool_size, &settings)?, settings))
    }

    /// A handle over your own `pool` with `settings`: the one shape for either driver. The
    /// pool's bounds, TLS and keepalives are yours (`settings`' pool, connect and keepalive
    /// bounds apply only to a pool [`Idempotency::from_url`] makes). Over tokio-postgres the
    /// cancel requests of dropped calls cannot use the pool's own TLS connector, which a pool
    /// does not tell: see `Postgres::new`, and give it with
    /// `Idempotency::with_driver(Postgres::new(pool).cancel_tls(tls), settings)`.
    ///
    /// # Errors
    ///
    /// None: the pool is used as it is.
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn from_pool(pool: D::Pool, settings: impl Into<Settings>) -> Self {
        Self::with_driver(D::over(pool), settings)
    }
}
