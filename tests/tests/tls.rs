//! `sslmode` end to end: tokio-postgres with the client's TLS connector (client/src/tls.rs)
//! against a server that accepts TLS only (`idempotency_testkit::tls_server`), one test per
//! mode and per refusal. Each success is checked on the server side: `pg_stat_ssl` says the
//! session is encrypted.


use idempotency_testkit::tls_server::{TlsServer, SCRAM_PASSWORD};
use std::time::Duration;
use idempotency_client::tls::{connect_params, Connector};

/// Every connection attempt's bound (an awaited condition, not a timing).
const DEADLINE: Duration = Duration::from_secs(30);

/// Connects through the connector `url` asks for; `Ok(true)` when the session is encrypted.
async fn connect(url: &str) -> Result<bool, String> {
    let params = connect_params(url)?;
    let config = params.options.config;
    let client = match params.connector {
        Connector::NoTls(tls) => {
            let (client, conn) = tokio::time::timeout(DEADLINE, config.connect(tls)).await.map_err(|_| "timed out")?.map_err(|e| describe(&e))?;
            tokio::spawn(conn);
            client
        }
        Connector::Rustls(tls) => {
            let (client, conn) = tokio::time::timeout(DEADLINE, config.connect(tls)).await.map_err(|_| "timed out")?.map_err(|e| describe(&e))?;
            tokio::spawn(conn);
            client
        }
    };
    let row = client
        .query_one("SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()", &[])
        .await
        .map_err(|e| describe(&e))?;
    Ok(row.get::<_, bool>("ssl"))
}

/// The error with its sources (the TLS reason is in the source chain).
fn describe(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

fn ca(server: &TlsServer) -> String {
    format!("sslrootcert={}", server.ca.display())
}

#[tokio::test]
async fn disable_is_refused_by_a_hostssl_only_server() {
    let server = TlsServer::shared();
    let e = connect(&server.url("localhost", "sslmode=disable")).await.expect_err("plain text must be refused");
    assert!(e.contains("no pg_hba.conf entry") && e.contains("no encryption"), "{e}");
}

#[tokio::test]
async fn prefer_connects_encrypted() {
    let server = TlsServer::shared();
    assert_eq!(connect(&server.url("localhost", "sslmode=prefer")).await, Ok(true));
    // No sslmode means prefer, as in libpq.
    assert_eq!(connect(&server.url("localhost", "")).await, Ok(true));
}

#[tokio::test]
async fn require_connects_encrypted_without_checking_the_certificate() {
    let server = TlsServer::shared();
    // The test CA is in no trust store, and the host name is wrong: neither is checked.
    assert_eq!(connect(&server.url("wrong.test", "sslmode=require")).await, Ok(true));
}

#[tokio::test]
async fn require_with_sslrootcert_checks_the_ca_as_libpq_does() {
    let server = TlsServer::shared();
    assert_eq!(connect(&server.url("wrong.test", &format!("sslmode=require&{}", ca(server)))).await, Ok(true));
    let other = format!("sslmode=require&sslrootcert={}", server.other_ca.display());
    let e = connect(&server.url("localhost", &other)).await.expect_err("a certificate from another CA must be refused");
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn verify_ca_accepts_the_right_ca_under_any_host_name() {
    let server = TlsServer::shared();
    let params = format!("sslmode=verify-ca&{}", ca(server));
    assert_eq!(connect(&server.url("localhost", &params)).await, Ok(true));
    assert_eq!(connect(&server.url("wrong.test", &params)).await, Ok(true));
}

#[tokio::test]
async fn verify_ca_refuses_a_certificate_from_another_ca() {
    let server = TlsServer::shared();
    let params = format!("sslmode=verify-ca&sslrootcert={}", server.other_ca.display());
    let e = connect(&server.url("localhost", &params)).await.expect_err("another CA must be refused");
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn verify_ca_without_sslrootcert_trusts_only_the_system_roots() {
    let server = TlsServer::shared();
    match connect(&server.url("localhost", "sslmode=verify-ca")).await {
        Ok(encrypted) => panic!("the test CA is no system root, yet the connection was made (encrypted: {encrypted})"),
        // Refused by the handshake, or no system roots on this machine at all: both refuse.
        Err(e) => assert!(e.contains("UnknownIssuer") || e.starts_with("no system root certificate"), "{e}"),
    }
}

#[tokio::test]
async fn verify_full_accepts_the_right_ca_and_host_name() {
    let server = TlsServer::shared();
    assert_eq!(connect(&server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)))).await, Ok(true));
}

#[tokio::test]
async fn verify_full_refuses_a_wrong_host_name() {
    let server = TlsServer::shared();
    let e = connect(&server.url("wrong.test", &format!("sslmode=verify-full&{}", ca(server))))
        .await
        .expect_err("a certificate for localhost must not pass for wrong.test");
    assert!(e.contains("certificate not valid for name \"wrong.test\""), "{e}");
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let server = TlsServer::shared();
    let params = format!("sslmode=verify-full&sslrootcert={}", server.other_ca.display());
    let e = connect(&server.url("localhost", &params)).await.expect_err("another CA must be refused");
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn scram_with_channel_binding_required_works_over_each_encrypting_mode() {
    let server = TlsServer::shared();
    let scram = |host: &str, params: &str| {
        server.url(host, params).replacen("postgres@", &format!("idem_scram:{SCRAM_PASSWORD}@"), 1) + "&channel_binding=require"
    };
    for params in ["sslmode=require".to_owned(), format!("sslmode=verify-ca&{}", ca(server)), format!("sslmode=verify-full&{}", ca(server))] {
        assert_eq!(connect(&scram("localhost", &params)).await, Ok(true), "{params}");
    }
    let e = connect(&scram("localhost", "sslmode=require").replace(SCRAM_PASSWORD, "wrong")).await.expect_err("a wrong password");
    assert!(e.contains("password authentication failed"), "{e}");
}

#[tokio::test]
async fn a_deadpool_pool_connects_through_the_connector() {
    // What Idempotency::connect_with does with the connector.
    use deadpool_postgres::{Manager, ManagerConfig, Pool, Runtime};
    let server = TlsServer::shared();
    let params = connect_params(&server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)))).unwrap();
    let manager = match params.connector {
        Connector::NoTls(tls) => Manager::from_config(params.options.config, tls, ManagerConfig::default()),
        Connector::Rustls(tls) => Manager::from_config(params.options.config, tls, ManagerConfig::default()),
    };
    let pool = Pool::builder(manager).max_size(2).runtime(Runtime::Tokio1).wait_timeout(Some(DEADLINE)).build().unwrap();
    let client = pool.get().await.expect("a pooled TLS connection");
    let row = client.query_one("SELECT ssl FROM pg_catalog.pg_stat_ssl WHERE pid = pg_catalog.pg_backend_pid()", &[]).await.unwrap();
    assert!(row.get::<_, bool>("ssl"));
}

/// The same modes through the client's own constructor: `Idempotency::connect` builds its pool
/// from the URL's sslmode, and the in-transaction flow runs over the encrypted connection.
#[tokio::test]
async fn the_handle_connects_with_the_urls_sslmode_and_runs_the_flow() {
    use idempotency_client::{Error, Fingerprint, Idempotency, Key, Outcome, StoredResponse, Tx, TxFuture};
    let server = TlsServer::shared();
    let admin_url = server.url("localhost", &format!("sslmode=verify-full&{}", ca(server)));
    let idem = Idempotency::connect(&admin_url, 2).unwrap();
    let client = idem.pool().get().await.expect("a verify-full pool connects");
    client.batch_execute("CREATE EXTENSION IF NOT EXISTS idempotency").await.unwrap();
    let ssl: bool = client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.unwrap().get(0);
    assert!(ssl, "the pooled connection is encrypted");
    drop(client);
    let key = Key::new("tls.run", "u", format!("k-{}", std::process::id())).unwrap();
    fn work<'t>(_: &'t mut Tx) -> TxFuture<'t, StoredResponse, tokio_postgres::Error> {
        Box::pin(async { Ok(StoredResponse::json(201, serde_json::json!({}))) })
    }
    let fp = Fingerprint::of_bytes(b"tls");
    assert!(matches!(idem.run(&key, &fp, work).await, Ok(Outcome::Executed(_))));
    assert!(matches!(idem.run(&key, &fp, work).await, Ok(Outcome::Replayed(_))));
    // A wrong hostname under verify-full fails to connect: StoreUnavailable, nothing reserved.
    let wrong = Idempotency::connect(&server.url("wrong.test", &format!("sslmode=verify-full&{}", ca(server))), 1).unwrap();
    let err = wrong.run(&key, &fp, work).await.unwrap_err();
    assert!(matches!(err, Error::StoreUnavailable(_) | Error::Database(_)), "{err:?}");
    // Plain text is refused by the server's pg_hba.
    let plain = Idempotency::connect(&server.url("localhost", "sslmode=disable"), 1).unwrap();
    assert!(plain.run(&key, &fp, work).await.is_err());
}
