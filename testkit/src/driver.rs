//! The client driver under test, one per build: tokio-postgres by default, sqlx when the test
//! kit is built with its `sqlx` feature (`cargo test -p idempotency-tests --features sqlx`).
//! The suites are written once against these names: [`TestDriver`], the handle [`Idem`], the
//! connection a closure gets ([`Conn`]), the driver's error ([`DbError`]) and a few statements
//! run the same way on either ([`exec`], [`query_i64`], [`batch`], [`pooled_in_transaction`]).

use idempotency_client::{Driver, Idempotency, Settings};

#[cfg(not(feature = "sqlx"))]
mod imp {
    use idempotency_client::{Idempotency, Settings};
    /// The driver under test.
    pub type TestDriver = idempotency_client::Postgres;
    /// The driver's error type.
    pub type DbError = tokio_postgres::Error;
    /// The driver's name, for messages.
    pub const NAME: &str = "tokio-postgres";
    /// Whether a call dropped mid-request asks the server to cancel its statement (a cancel
    /// request) besides closing the connection.
    pub const CANCELS_ON_DROP: bool = true;

    pub(crate) fn try_connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Idempotency<TestDriver>, idempotency_client::Error> {
        Idempotency::connect_with(url, pool_size, settings)
    }

    /// The driver's error for `sql` run on a connection of its own to `url`.
    pub async fn error_of(url: &str, sql: &str) -> DbError {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.batch_execute(sql).await.expect_err("the statement fails")
    }

    pub(crate) fn params<'a>(args: &'a [&'a str]) -> Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)> {
        args.iter().map(|a| a as &(dyn tokio_postgres::types::ToSql + Sync)).collect()
    }

    /// A handle on `url` whose pool has one connection, waited for at most `wait`, and that
    /// connection, held: the pool is exhausted until the second value is dropped.
    pub async fn exhausted(url: &str, wait: std::time::Duration) -> (Idempotency<TestDriver>, Box<dyn std::any::Any + Send>) {
        use deadpool_postgres::{Config, PoolConfig, Runtime, Timeouts};
        let mut cfg = Config::new();
        cfg.url = Some(url.to_owned());
        let wait = Some(wait);
        cfg.pool = Some(PoolConfig { max_size: 1, timeouts: Timeouts { wait, create: wait, recycle: wait }, ..PoolConfig::default() });
        let idem = Idempotency::new(cfg.create_pool(Some(Runtime::Tokio1), tokio_postgres::NoTls).expect("pool"), Settings::default());
        let held = idem.pool().get().await.expect("the one connection");
        (idem, Box::new(held))
    }

    /// Runs `sql` with text arguments; the rows it affected.
    pub async fn exec(conn: &mut super::Conn, sql: &str, args: &[&str]) -> Result<u64, DbError> {
        let statement = conn.prepare_cached(sql).await?;
        conn.execute(&statement, &params(args)).await
    }

    /// The first column (a bigint) of the one row `sql` answers.
    pub async fn query_i64(conn: &mut super::Conn, sql: &str, args: &[&str]) -> Result<i64, DbError> {
        let statement = conn.prepare_cached(sql).await?;
        conn.query_one(&statement, &params(args)).await?.try_get(0)
    }

    /// `sql` (one or more statements, no arguments) as a simple query.
    pub async fn batch(conn: &mut super::Conn, sql: &str) -> Result<(), DbError> {
        conn.batch_execute(sql).await
    }

    /// Every connection of `idem`'s pool is idle in it (none being given back).
    pub fn pool_idle(idem: &Idempotency<TestDriver>) -> bool {
        let status = idem.pool().status();
        status.available == status.size
    }

    /// Whether the next connection of `idem`'s pool is inside a transaction block (a savepoint
    /// can only be set in one): a flow must never give one back mid-transaction.
    pub async fn pooled_in_transaction(idem: &Idempotency<TestDriver>) -> bool {
        let client = idem.pool().get().await.expect("a pooled connection");
        client.batch_execute("SAVEPOINT probe").await.is_ok()
    }

    /// [`query_i64`] through the request's transaction of an in-transaction layer.
    pub async fn query_i64_in(tx: &idempotency_client::layer::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<i64, DbError> {
        let conn = tx.lock().await.expect("the request's transaction is live");
        let statement = conn.prepare_cached(sql).await?;
        conn.query_one(&statement, &params(args)).await?.try_get(0)
    }

    /// [`exec`] through the request's transaction of an in-transaction layer.
    pub async fn exec_in(tx: &idempotency_client::layer::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<u64, DbError> {
        let conn = tx.lock().await.expect("the request's transaction is live");
        let statement = conn.prepare_cached(sql).await?;
        conn.execute(&statement, &params(args)).await
    }
}

#[cfg(feature = "sqlx")]
mod imp {
    use idempotency_client::{Idempotency, Settings};
    use sqlx::AssertSqlSafe;
    /// The driver under test.
    pub type TestDriver = idempotency_client::Sqlx;
    /// The driver's error type.
    pub type DbError = sqlx::Error;
    /// The driver's name, for messages.
    pub const NAME: &str = "sqlx";
    /// Whether a call dropped mid-request asks the server to cancel its statement (sqlx has no
    /// cancel request: the connection is closed, and the server notices after the statement).
    pub const CANCELS_ON_DROP: bool = false;

    pub(crate) fn try_connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Idempotency<TestDriver>, idempotency_client::Error> {
        let size = u32::try_from(pool_size).expect("a pool size that fits u32");
        Idempotency::connect_sqlx_with(url, size, settings)
    }

    /// The driver's error for `sql` run on a connection of its own to `url`.
    pub async fn error_of(url: &str, sql: &str) -> DbError {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(&mut conn).await.expect_err("the statement fails")
    }

    fn bound<'q>(sql: &str, args: &'q [&'q str]) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        args.iter().fold(sqlx::query(AssertSqlSafe(sql.to_owned())), |q, a| q.bind(*a))
    }

    /// A handle on `url` whose pool has one connection, waited for at most `wait`, and that
    /// connection, held: the pool is exhausted until the second value is dropped.
    pub async fn exhausted(url: &str, wait: std::time::Duration) -> (Idempotency<TestDriver>, Box<dyn std::any::Any + Send>) {
        use std::str::FromStr;
        let options = sqlx::postgres::PgConnectOptions::from_str(url).expect("url");
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).acquire_timeout(wait).connect_lazy_with(options);
        let held = pool.acquire().await.expect("the one connection");
        (Idempotency::from_sqlx(pool, Settings::default()), Box::new(held))
    }

    /// Runs `sql` with text arguments; the rows it affected.
    pub async fn exec(conn: &mut super::Conn, sql: &str, args: &[&str]) -> Result<u64, DbError> {
        Ok(bound(sql, args).execute(&mut *conn).await?.rows_affected())
    }

    /// The first column (a bigint) of the one row `sql` answers.
    pub async fn query_i64(conn: &mut super::Conn, sql: &str, args: &[&str]) -> Result<i64, DbError> {
        use sqlx::Row;
        bound(sql, args).fetch_one(&mut *conn).await?.try_get(0)
    }

    /// [`query_i64`] through the request's transaction of an in-transaction layer.
    pub async fn query_i64_in(tx: &idempotency_client::layer::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<i64, DbError> {
        let mut conn = tx.lock().await?;
        query_i64(&mut conn, sql, args).await
    }

    /// [`exec`] through the request's transaction of an in-transaction layer.
    pub async fn exec_in(tx: &idempotency_client::layer::Transaction<TestDriver>, sql: &str, args: &[&str]) -> Result<u64, DbError> {
        let mut conn = tx.lock().await?;
        exec(&mut conn, sql, args).await
    }

    /// `sql` (one or more statements, no arguments) as a simple query.
    pub async fn batch(conn: &mut super::Conn, sql: &str) -> Result<(), DbError> {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(&mut *conn).await.map(|_| ())
    }

    /// Every connection of `idem`'s pool is idle in it (none being given back: sqlx checks a
    /// connection when it is given back, a round trip nobody waits for).
    pub fn pool_idle(idem: &Idempotency<TestDriver>) -> bool {
        idem.pool().num_idle() == idem.pool().size() as usize
    }

    /// Whether the next connection of `idem`'s pool is inside a transaction block (a savepoint
    /// can only be set in one): a flow must never give one back mid-transaction.
    pub async fn pooled_in_transaction(idem: &Idempotency<TestDriver>) -> bool {
        let mut conn = idem.pool().acquire().await.expect("a pooled connection");
        sqlx::raw_sql("SAVEPOINT probe").execute(&mut *conn).await.is_ok()
    }
}

pub use imp::{batch, error_of, exec, CANCELS_ON_DROP, exec_in, exhausted, pool_idle, pooled_in_transaction, query_i64, query_i64_in, DbError, TestDriver, NAME};

/// Until the pool of `idem` has taken back every connection (sqlx checks one given back, a round
/// trip the call did not wait for and that must not be counted against the next call), within
/// 10 s.
pub async fn settled(idem: &Idem) {
    crate::server::eventually("the pool's connections are idle", std::time::Duration::from_secs(10), || async {
        if pool_idle(idem) {
            Ok(())
        } else {
            Err("a connection is being given back".to_owned())
        }
    })
    .await
}

/// The handle of the driver under test.
pub type Idem = Idempotency<TestDriver>;

/// What a closure of `run` / `run_external` gets, as `&mut Conn`.
pub type Conn = <TestDriver as Driver>::Conn;

/// A handle of the driver under test on `url`, with a pool of `pool_size` connections.
pub fn connect_with(url: &str, pool_size: usize, settings: Settings) -> Idem {
    try_connect_with(url, pool_size, settings).expect("pool")
}

/// [`connect_with`], or its error (a malformed URL, a bad schema name).
pub fn try_connect_with(url: &str, pool_size: usize, settings: Settings) -> Result<Idem, idempotency_client::Error> {
    imp::try_connect_with(url, pool_size, crate::replay_cache::from_env(settings))
}
