//! The client drivers under test, both in every build: [`over_postgres`] (tokio-postgres) and
//! [`over_sqlx`] export the same names (the driver [`TestDriver`](over_postgres::TestDriver), its
//! handle `Idem`, the connection a closure gets `Conn`, its error `DbError`, the test kit's
//! handles and handler over it, and a few statements run the same way on either: `exec`,
//! `query_i64`, `batch`, `pooled_in_transaction`), so a suite is written once and instantiated
//! per driver in one test binary by [`crate::for_each_driver`]: its tests are named
//! `over_postgres::...` and `over_sqlx::...`, and a filter picks a driver at run time.
//!
//! What differs between the drivers is the [`Kit`] trait, one impl per driver; the two modules
//! are written once, by a macro, over it.

use idempotency_tower::Transaction;
use idempotency_client::{Connect, Driver, Idempotency, Postgres, Sqlx};
use std::future::Future;
use std::time::Duration;

/// What the test kit needs of a driver, beyond the client's [`Driver`].
pub trait Kit: Driver + Connect {
    /// The driver's error type.
    type DbError: std::error::Error + Send + Sync + 'static;
    /// The driver's name, for messages.
    const NAME: &'static str;
    /// A short name for the databases a suite makes per driver (`pg`, `sqlx`).
    const SHORT: &'static str;

    /// The driver's error for `sql` run on a connection of its own to `url`.
    fn error_of(url: &str, sql: &str) -> impl Future<Output = Self::DbError> + Send;

    /// A handle on `url` whose pool has one connection, waited for at most `wait`, and that
    /// connection, held: the pool is exhausted until the second value is dropped.
    fn exhausted(url: &str, wait: Duration) -> impl Future<Output = (Idempotency<Self>, Box<dyn std::any::Any + Send>)> + Send;

    /// Runs `sql` with text arguments; the rows it affected.
    fn exec<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> impl Future<Output = Result<u64, Self::DbError>> + Send + 'a;

    /// The first column (a bigint) of the one row `sql` answers.
    fn query_i64<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> impl Future<Output = Result<i64, Self::DbError>> + Send + 'a;

    /// `sql` (one or more statements, no arguments) as a simple query.
    fn batch<'a>(conn: &'a mut Self::Conn, sql: &'a str) -> impl Future<Output = Result<(), Self::DbError>> + Send + 'a;

    /// [`Kit::query_i64`] through the request's transaction of an in-transaction layer.
    fn query_i64_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> impl Future<Output = Result<i64, Self::DbError>> + Send + 'a;

    /// [`Kit::exec`] through the request's transaction of an in-transaction layer.
    fn exec_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> impl Future<Output = Result<u64, Self::DbError>> + Send + 'a;

    /// Every connection of `idem`'s pool is idle in it (none being given back).
    fn pool_idle(idem: &Idempotency<Self>) -> bool;

    /// Takes a connection of `idem`'s pool and holds it until the value is dropped.
    fn hold_a_connection(idem: &Idempotency<Self>) -> impl Future<Output = Box<dyn std::any::Any + Send>> + Send + '_;

    /// Whether the next connection of `idem`'s pool is inside a transaction block (a savepoint
    /// can only be set in one): a flow must never give one back mid-transaction.
    fn pooled_in_transaction(idem: &Idempotency<Self>) -> impl Future<Output = bool> + Send + '_;
}

fn params<'a>(args: &'a [&'a str]) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
    args.iter().map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync)).collect()
}

impl Kit for Postgres {
    type DbError = tokio_postgres::Error;
    const NAME: &'static str = "tokio-postgres";
    const SHORT: &'static str = "pg";

    async fn error_of(url: &str, sql: &str) -> tokio_postgres::Error {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.batch_execute(sql).await.expect_err("the statement fails")
    }

    async fn exhausted(url: &str, wait: Duration) -> (Idempotency<Self>, Box<dyn std::any::Any + Send>) {
        use deadpool_postgres::{Config, PoolConfig, Runtime, Timeouts};
        let mut cfg = Config::new();
        cfg.url = Some(url.to_owned());
        let wait = Some(wait);
        cfg.pool = Some(PoolConfig { max_size: 1, timeouts: Timeouts { wait, create: wait, recycle: wait }, ..PoolConfig::default() });
        let idem = Idempotency::<Postgres>::from_pool(cfg.create_pool(Some(Runtime::Tokio1), tokio_postgres::NoTls).expect("pool"), idempotency_client::Settings::default());
        let held = idem.pool().get().await.expect("the one connection");
        (idem, Box::new(held))
    }

    async fn exec<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> Result<u64, tokio_postgres::Error> {
        let statement = conn.prepare_cached(sql).await?;
        conn.execute(&statement, &params(args)).await
    }

    async fn query_i64<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> Result<i64, tokio_postgres::Error> {
        let statement = conn.prepare_cached(sql).await?;
        conn.query_one(&statement, &params(args)).await?.try_get(0)
    }

    async fn batch<'a>(conn: &'a mut Self::Conn, sql: &'a str) -> Result<(), tokio_postgres::Error> {
        conn.batch_execute(sql).await
    }

    async fn query_i64_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> Result<i64, tokio_postgres::Error> {
        let conn = tx.lock().await.expect("the request's transaction is live");
        let statement = conn.prepare_cached(sql).await?;
        conn.query_one(&statement, &params(args)).await?.try_get(0)
    }

    async fn exec_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> Result<u64, tokio_postgres::Error> {
        let conn = tx.lock().await.expect("the request's transaction is live");
        let statement = conn.prepare_cached(sql).await?;
        conn.execute(&statement, &params(args)).await
    }

    fn pool_idle(idem: &Idempotency<Self>) -> bool {
        let status = idem.pool().status();
        status.available == status.size
    }

    async fn hold_a_connection(idem: &Idempotency<Self>) -> Box<dyn std::any::Any + Send> {
        Box::new(idem.pool().get().await.expect("a pooled connection"))
    }

    async fn pooled_in_transaction(idem: &Idempotency<Self>) -> bool {
        let client = idem.pool().get().await.expect("a pooled connection");
        client.batch_execute("SAVEPOINT probe").await.is_ok()
    }
}

fn bound<'q>(sql: &str, args: &'q [&'q str]) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    args.iter().fold(sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())), |q, a| q.bind(*a))
}

impl Kit for Sqlx {
    type DbError = sqlx::Error;
    const NAME: &'static str = "sqlx";
    const SHORT: &'static str = "sqlx";
    // sqlx has no cancel request: the connection is closed, and the server's connection check
    // (client_connection_check_interval, set to 1 s by from_url) ends the statement.

    async fn error_of(url: &str, sql: &str) -> sqlx::Error {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut conn).await.expect_err("the statement fails")
    }

    async fn exhausted(url: &str, wait: Duration) -> (Idempotency<Self>, Box<dyn std::any::Any + Send>) {
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(url).expect("url");
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).acquire_timeout(wait).connect_lazy_with(options);
        let held = pool.acquire().await.expect("the one connection");
        (Idempotency::from_pool(pool, idempotency_client::Settings::default()), Box::new(held))
    }

    async fn exec<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> Result<u64, sqlx::Error> {
        Ok(bound(sql, args).execute(&mut *conn).await?.rows_affected())
    }

    async fn query_i64<'a>(conn: &'a mut Self::Conn, sql: &'a str, args: &'a [&'a str]) -> Result<i64, sqlx::Error> {
        use sqlx::Row;
        bound(sql, args).fetch_one(&mut *conn).await?.try_get(0)
    }

    async fn batch<'a>(conn: &'a mut Self::Conn, sql: &'a str) -> Result<(), sqlx::Error> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(&mut *conn).await.map(|_| ())
    }

    async fn query_i64_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> Result<i64, sqlx::Error> {
        let mut conn = tx.lock().await?;
        Self::query_i64(&mut conn, sql, args).await
    }

    async fn exec_in<'a>(tx: &'a Transaction<Self>, sql: &'a str, args: &'a [&'a str]) -> Result<u64, sqlx::Error> {
        let mut conn = tx.lock().await?;
        Self::exec(&mut conn, sql, args).await
    }

    // sqlx checks a connection when it is given back, a round trip nobody waits for.
    fn pool_idle(idem: &Idempotency<Self>) -> bool {
        idem.pool().num_idle() == idem.pool().size() as usize
    }

    async fn hold_a_connection(idem: &Idempotency<Self>) -> Box<dyn std::any::Any + Send> {
        Box::new(idem.pool().acquire().await.expect("a pooled connection"))
    }

    async fn pooled_in_transaction(idem: &Idempotency<Self>) -> bool {
        let mut conn = idem.pool().acquire().await.expect("a pooled connection");
        sqlx::raw_sql("SAVEPOINT probe").execute(&mut *conn).await.is_ok()
    }
}

/// The names a suite uses, over one driver: `driver_module!(over_postgres, Postgres)`.
macro_rules! driver_module {
    ($module:ident, $driver:ty, $error:ty, $doc:literal) => {
        #[doc = $doc]
        pub mod $module {
            use super::Kit;
            use idempotency_client::{Driver, Idempotency, Key, Settings};
            use std::time::Duration;

            /// The driver under test.
            pub type TestDriver = $driver;
            /// The handle of the driver under test.
            pub type Idem = Idempotency<TestDriver>;
            /// What a closure of `run` / `run_external` gets, as `&mut Conn`.
            pub type Conn = <TestDriver as Driver>::Conn;
            /// The driver's error type (named, not projected: a projection is not normalised when
            /// a suite implements `From<DbError>` for its own error).
            pub type DbError = $error;
            /// The charge handler over this driver.
            pub type Charge = crate::handler::Charge<TestDriver>;
            /// The driver's name, for messages.
            pub const NAME: &str = <TestDriver as Kit>::NAME;

            /// A handle on `url` with a pool of `pool_size` connections (and the test kit's
            /// replay cache when `IDEM_REPLAY_CACHE=on`).
            pub fn connect_with(url: &str, pool_size: u32, settings: impl Into<Settings>) -> Idem {
                try_connect_with(url, pool_size, settings).expect("pool")
            }

            /// [`connect_with`], or its error (a malformed URL, a bad schema name).
            pub fn try_connect_with(url: &str, pool_size: u32, settings: impl Into<Settings>) -> Result<Idem, idempotency_client::Error> {
                Idem::from_url(url, pool_size, crate::replay_cache::from_env(settings.into()))
            }

            /// A handle on a store that is down (nothing listens on port 1) with a pool of
            /// `pool_size`: a call ends at the client's own bounds, never hangs: at once over
            /// tokio-postgres (the refused connection), after its 1 s pool wait plus the URL's 1 s
            /// connect_timeout over sqlx (it retries the refused connection until then).
            pub fn store_down(pool_size: u32) -> Idem {
                let settings = Settings::builder().pool_timeout(Duration::from_secs(1));
                connect_with("postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=1", pool_size, settings)
            }

            /// The database of this test process for this driver (shared by its tests).
            pub async fn test_database() -> &'static str {
                crate::cluster::test_database_of(<TestDriver as Kit>::SHORT).await
            }

            /// A pooled superuser connection (tokio-postgres) to [`test_database`], for
            /// assertions and direct `ops` calls.
            pub async fn admin() -> deadpool_postgres::Client {
                crate::admin_at(test_database().await).await
            }

            /// A handle with `settings` on [`test_database`] (shared by this process's tests).
            pub async fn handle(settings: impl Into<Settings>) -> Idem {
                connect_with(test_database().await, 100, settings)
            }

            /// A handle with `settings` on a fresh database `name` of its own (name it with
            /// [`db`] in a suite that runs per driver).
            pub async fn handle_in(name: &str, settings: impl Into<Settings>) -> Idem {
                connect_with(&crate::fresh_database(name).await, 32, settings)
            }

            /// The name of this driver's database `name` (`name_pg`, `name_sqlx`): both drivers'
            /// instances of a suite run at once in one binary.
            pub fn db(name: &str) -> String {
                format!("{name}_{}", <TestDriver as Kit>::SHORT)
            }

            /// The driver's error for `sql` run on a connection of its own to `url`.
            pub async fn error_of(url: &str, sql: &str) -> DbError {
                TestDriver::error_of(url, sql).await
            }

            /// A handle on `url` whose pool has one held connection (see [`super::Kit::exhausted`]).
            pub async fn exhausted(url: &str, wait: Duration) -> (Idem, Box<dyn std::any::Any + Send>) {
                TestDriver::exhausted(url, wait).await
            }

            /// Runs `sql` with text arguments; the rows it affected.
            pub async fn exec(conn: &mut Conn, sql: &str, args: &[&str]) -> Result<u64, DbError> {
                TestDriver::exec(conn, sql, args).await
            }

            /// The first column (a bigint) of the one row `sql` answers.
            pub async fn query_i64(conn: &mut Conn, sql: &str, args: &[&str]) -> Result<i64, DbError> {
                TestDriver::query_i64(conn, sql, args).await
            }

            /// `sql` (one or more statements, no arguments) as a simple query.
            pub async fn batch(conn: &mut Conn, sql: &str) -> Result<(), DbError> {
                TestDriver::batch(conn, sql).await
            }

            /// [`query_i64`] through the request's transaction of an in-transaction layer.
            pub async fn query_i64_in(tx: &idempotency_tower::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<i64, DbError> {
                TestDriver::query_i64_in(tx, sql, args).await
            }

            /// [`exec`] through the request's transaction of an in-transaction layer.
            pub async fn exec_in(tx: &idempotency_tower::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<u64, DbError> {
                TestDriver::exec_in(tx, sql, args).await
            }

            /// The server's setting `name` (an integer, such as a timeout in ms) on a connection
            /// of `idem`'s pool, read in a `run` closure (a fresh key of its own each time).
            pub async fn setting_of(idem: &Idem, name: &str) -> i64 {
                use idempotency_client::{Outcome, StoredResponse, TxFuture};
                let key = crate::unique_key("kit.setting_of");
                let fingerprint = idempotency_client::Fingerprint::of_json(&serde_json::json!({"setting": name})).expect("a fingerprint");
                let name = name.to_owned();
                let out = idem
                    .run(&key, &fingerprint, move |conn: &mut Conn| {
                        let name = name.clone();
                        Box::pin(async move {
                            let sql = "SELECT setting::int8 FROM pg_catalog.pg_settings WHERE name = $1";
                            let value = query_i64(conn, sql, &[name.as_str()]).await?;
                            Ok(StoredResponse::json(200, serde_json::json!({"value": value})))
                        }) as TxFuture<'_, StoredResponse, DbError>
                    })
                    .await
                    .expect("the closure reads the setting");
                match out {
                    Outcome::Executed(r) => r.body_json().and_then(|b| b["value"].as_i64()).expect("a number"),
                    other => panic!("{}: {other:?}", NAME),
                }
            }

            /// Every connection of `idem`'s pool is idle in it.
            pub fn pool_idle(idem: &Idem) -> bool {
                TestDriver::pool_idle(idem)
            }

            /// Takes a connection of `idem`'s pool and holds it until the value is dropped.
            pub async fn hold_a_connection(idem: &Idem) -> Box<dyn std::any::Any + Send> {
                TestDriver::hold_a_connection(idem).await
            }

            /// Whether the next connection of `idem`'s pool is inside a transaction block.
            pub async fn pooled_in_transaction(idem: &Idem) -> bool {
                TestDriver::pooled_in_transaction(idem).await
            }

            /// Until the pool of `idem` has taken back every connection, within 10 s.
            pub async fn settled(idem: &Idem) {
                crate::server::eventually("the pool's connections are idle", Duration::from_secs(10), || async {
                    if pool_idle(idem) {
                        Ok(())
                    } else {
                        Err("a connection is being given back".to_owned())
                    }
                })
                .await
            }

            /// 64 concurrent `run`s of `key` (see [`crate::handler::duplicates_of_a_held_key`]).
            pub async fn duplicates_of_a_held_key(idem: &Idem, key: &Key, fingerprint: &idempotency_client::Fingerprint) -> crate::HeldRace {
                crate::handler::duplicates_of_a_held_key(idem, key, fingerprint).await
            }
        }
    };
}

driver_module!(over_postgres, idempotency_client::Postgres, tokio_postgres::Error, "The suites' names over tokio-postgres.");
driver_module!(over_sqlx, idempotency_client::Sqlx, sqlx::Error, "The suites' names over sqlx.");

/// Instantiates a suite once per driver in one test binary: `mod over_postgres` and
/// `mod over_sqlx`, each importing that driver's names ([`over_postgres`], [`over_sqlx`]) before
/// the suite's items. A suite imports only driver-neutral names itself: an explicit import of a
/// driver's name would shadow the one the macro brings.
#[macro_export]
macro_rules! for_each_driver {
    ($($suite:tt)*) => {
        mod over_postgres {
            #[allow(unused_imports)]
            use $crate::driver::over_postgres::*;
            $($suite)*
        }
        mod over_sqlx {
            #[allow(unused_imports)]
            use $crate::driver::over_sqlx::*;
            $($suite)*
        }
    };
}
