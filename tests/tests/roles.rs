//! Guarantee 8, "Owned" (issue 34): a record belongs to the role that reserved it. Two real
//! login roles, Alice and Mallory, each with the application role `idempotency_user` and USAGE on
//! the schema, each on a connection of its own (its own URL): Mallory cannot complete, extend,
//! release, replay or read Alice's key, whatever token she sends (Alice's token: 42501; another:
//! a stale token, changing nothing); a member of Alice's
//! role may act for her; a heartbeat cannot wedge a key past the ttl (22023); the ceiling of
//! `idempotency.max_response_bytes` is a superuser's; a fresh install grants the write API to
//! `idempotency_user` alone. Against the extension and, with `IDEM_INSTALL=portable`, the
//! portable install (which cannot enforce the ceiling: its settings are placeholders).
//!
//! Roles are cluster-wide: the test creates them once (an existing one is reused) and leaves
//! them, so runs of this binary on other databases of the cluster do not collide.

use idempotency_testkit::{admin_at, fresh_database};
use tokio_postgres::{Client, NoTls};

const WRITE_API: [&str; 6] = [
    "idem_reserve(text,text,text,text,interval,interval,boolean)",
    "idem_complete(text,text,text,bigint,jsonb,text)",
    "idem_release(text,text,text,bigint,integer)",
    "idem_heartbeat(text,text,text,bigint,interval)",
    "idem_reserve_many(text,text,text[],text[],interval,interval,boolean)",
    "idem_complete_many(text,text,text[],bigint[],jsonb[],text)",
];

fn portable() -> bool {
    std::env::var("IDEM_INSTALL").as_deref() == Ok("portable")
}

/// The test's database (fresh, with idempotency installed as `IDEM_INSTALL` says) and its roles:
/// `idem_rt_alice`, `idem_rt_mallory` and `idem_rt_worker` (a member of Alice's role), login
/// roles with `idempotency_user` and USAGE on `public`.
async fn setup() -> String {
    static URL: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    URL.get_or_init(|| async {
        let url = fresh_database("idem_roles").await;
        let admin = admin_at(&url).await;
        admin
            .batch_execute(
                "DO $$
                 DECLARE r text;
                 BEGIN
                     FOREACH r IN ARRAY ARRAY['idem_rt_alice', 'idem_rt_mallory', 'idem_rt_worker'] LOOP
                         BEGIN
                             EXECUTE format('CREATE ROLE %I LOGIN', r);
                         EXCEPTION WHEN duplicate_object THEN NULL;
                         END;
                     END LOOP;
                 END $$;
                 GRANT idempotency_user TO idem_rt_alice, idem_rt_mallory, idem_rt_worker;
                 GRANT idem_rt_alice TO idem_rt_worker;
                 GRANT USAGE ON SCHEMA public TO idem_rt_alice, idem_rt_mallory, idem_rt_worker;",
            )
            .await
            .expect("create the roles");
        url
    })
    .await
    .clone()
}

/// A connection to the test database as `role` (the cluster trusts local logins).
async fn connect_as(role: &str) -> Client {
    let url = setup().await.replacen("://postgres@", &format!("://{role}@"), 1);
    assert!(url.contains(role), "a URL for {role}: {url}");
    let (client, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap_or_else(|e| panic!("connect as {role}: {e}"));
    tokio::spawn(conn);
    let who: String = client.query_one("SELECT session_user::text", &[]).await.expect("session_user").get(0);
    assert_eq!(who, role);
    client
}

/// The SQLSTATE and message of a statement that must fail.
async fn refused(client: &Client, sql: &str) -> (String, String) {
    match client.simple_query(sql).await {
        Ok(_) => panic!("{sql}: succeeded, must be refused"),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
            (db.code().code().to_owned(), db.message().to_owned())
        }
    }
}

async fn reserve(client: &Client, key: &str) -> i64 {
    let row = client
        .query_one("SELECT outcome, token FROM idem_reserve('roles', 'u', $1, 'h')", &[&key])
        .await
        .expect("reserve");
    assert_eq!(row.get::<_, String>(0), "created");
    row.get(1)
}

#[tokio::test]
async fn a_fresh_install_grants_the_write_api_to_idempotency_user_alone() {
    let url = setup().await;
    let admin = admin_at(&url).await;
    for function in WRITE_API {
        let row = admin
            .query_one(
                "SELECT has_function_privilege('public', $1::text::regprocedure, 'EXECUTE'),
                        has_function_privilege('idempotency_user', $1::text::regprocedure, 'EXECUTE')",
                &[&function],
            )
            .await
            .expect("privileges");
        assert!(!row.get::<_, bool>(0), "PUBLIC may execute {function}");
        assert!(row.get::<_, bool>(1), "idempotency_user may not execute {function}");
    }
    // A login role without the application role reaches nothing.
    admin
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE idem_rt_plain LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             GRANT USAGE ON SCHEMA public TO idem_rt_plain;",
        )
        .await
        .expect("create idem_rt_plain");
    let plain = connect_as("idem_rt_plain").await;
    let (code, message) = refused(&plain, "SELECT idem_reserve('roles', 'u', 'plain', 'h')").await;
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("permission denied for function idem_reserve"), "{message}");
}

#[tokio::test]
async fn another_role_cannot_complete_extend_release_or_replay_a_key_whatever_its_token() {
    setup().await;
    let (alice, mallory, worker) = (connect_as("idem_rt_alice").await, connect_as("idem_rt_mallory").await, connect_as("idem_rt_worker").await);
    let admin = admin_at(&setup().await).await;
    let t = reserve(&alice, "k1").await;
    let owner: String = admin
        .query_one("SELECT owner::text FROM idem_records WHERE operation = 'roles' AND key = 'k1'", &[])
        .await
        .expect("owner")
        .get(0);
    assert_eq!(owner, "idem_rt_alice");

    // Mallory guesses the token: every call with it is 42501, naming the rule.
    for (sql, action) in [
        (format!("SELECT idem_complete('roles', 'u', 'k1', {t}, '{{\"forged\": true}}')"), "complete a key"),
        (format!("SELECT idem_heartbeat('roles', 'u', 'k1', {t})"), "extend a lease"),
        (format!("SELECT idem_heartbeat('roles', 'u', 'k1', {t}, lease => '1 hour')"), "extend a lease"),
        (format!("SELECT idem_release('roles', 'u', 'k1', {t})"), "release a key"),
        (format!("SELECT * FROM idem_complete_many('roles', 'u', ARRAY['k1'], ARRAY[{t}]::bigint[], ARRAY['{{}}']::jsonb[])"), "complete a key"),
        ("SELECT idem_reserve('roles', 'u', 'k1', 'h')".to_owned(), "reserve a key"),
        ("SELECT idem_reserve('roles', 'u', 'k1', 'other')".to_owned(), "reserve a key"),
        ("SELECT idem_replay('roles', 'u', 'k1', 'h')".to_owned(), "replay a key"),
        ("SELECT idem_replay('roles', 'u', 'k1', 'other')".to_owned(), "replay a key"),
    ] {
        let (code, message) = refused(&mallory, &sql).await;
        assert_eq!(code, "42501", "{sql}: {message}");
        assert!(
            message.contains(&format!("permission denied to {action}: the key belongs to role idem_rt_alice")),
            "{sql}: {message}"
        );
    }
    // A wrong token is a stale token for every role: a value, changing nothing.
    let completed: bool = mallory
        .query_one("SELECT idem_complete('roles', 'u', 'k1', $1, '{\"forged\": true}')", &[&(t + 1)])
        .await
        .expect("a wrong token answers")
        .get(0);
    assert!(!completed);
    // Nothing changed: still Alice's attempt, with its 5-minute lease and no response.
    let row = admin
        .query_one(
            "SELECT _idem_status_word(status), response IS NULL, lease_expires_at - created_at = interval '5 minutes'
               FROM idem_records WHERE operation = 'roles' AND key = 'k1'",
            &[],
        )
        .await
        .expect("the record");
    assert_eq!((row.get::<_, String>(0), row.get::<_, bool>(1), row.get::<_, bool>(2)), ("PROCESSING".to_owned(), true, true));

    // A ten-year heartbeat lease is refused even to the owner: at most the record's remaining
    // ttl or idempotency.ttl, whichever is longer.
    let (code, message) = refused(&alice, &format!("SELECT idem_heartbeat('roles', 'u', 'k1', {t}, lease => '10 years')")).await;
    assert_eq!(code, "22023", "{message}");
    assert_eq!(message, "lease must not exceed the record's remaining ttl or idempotency.ttl (1 day), whichever is longer, got 10 years");
    let extended: bool = alice
        .query_one("SELECT idem_heartbeat('roles', 'u', 'k1', $1, lease => '1 hour')", &[&t])
        .await
        .expect("heartbeat")
        .get(0);
    assert!(extended);

    // A member of Alice's role completes for her; Alice replays; Mallory still cannot.
    let completed: bool = worker
        .query_one("SELECT idem_complete('roles', 'u', 'k1', $1, '{\"id\": 1}')", &[&t])
        .await
        .expect("complete as a member")
        .get(0);
    assert!(completed);
    let row = alice.query_one("SELECT outcome, response::text FROM idem_reserve('roles', 'u', 'k1', 'h')", &[]).await.expect("replay");
    assert_eq!((row.get::<_, String>(0), row.get::<_, Option<String>>(1)), ("replay".to_owned(), Some("{\"id\": 1}".to_owned())));
    let (code, message) = refused(&mallory, "SELECT response FROM idem_reserve('roles', 'u', 'k1', 'h')").await;
    assert_eq!(code, "42501", "{message}");
    assert!(!message.contains("\"id\""), "the stored response leaked: {message}");

    // idem_lookup refuses Alice's record to Mallory even once granted the function.
    admin.batch_execute("GRANT EXECUTE ON FUNCTION idem_lookup(text, text, text) TO idem_rt_mallory").await.expect("grant lookup");
    let (code, message) = refused(&mallory, "SELECT * FROM idem_lookup('roles', 'u', 'k1')").await;
    admin.batch_execute("REVOKE EXECUTE ON FUNCTION idem_lookup(text, text, text) FROM idem_rt_mallory").await.expect("revoke lookup");
    assert_eq!(code, "42501", "{message}");
    assert!(message.contains("permission denied to read a key"), "{message}");
}

#[tokio::test]
async fn a_record_from_before_owners_is_any_roles_until_it_expires() {
    setup().await;
    let (alice, mallory) = (connect_as("idem_rt_alice").await, connect_as("idem_rt_mallory").await);
    let admin = admin_at(&setup().await).await;
    let t = reserve(&alice, "legacy").await;
    // As an update from 0.5.0 leaves every existing record: no owner.
    admin.batch_execute("UPDATE idem_records SET owner = NULL WHERE operation = 'roles' AND key = 'legacy'").await.expect("unown");
    let completed: bool = mallory
        .query_one("SELECT idem_complete('roles', 'u', 'legacy', $1, '{\"id\": 2}')", &[&t])
        .await
        .expect("complete an unowned record")
        .get(0);
    assert!(completed);
}

#[tokio::test]
async fn an_ordinary_role_cannot_raise_max_response_bytes_past_the_superusers_ceiling() {
    let url = setup().await;
    let admin = admin_at(&url).await;
    // The superuser's ceiling for this role: 1kB.
    admin
        .batch_execute(&format!(
            "ALTER ROLE idem_rt_mallory IN DATABASE {} SET idempotency.max_response_bytes_limit = '1kB'",
            url.rsplit('/').next().unwrap_or("idem_roles")
        ))
        .await
        .expect("set the ceiling");
    let mallory = connect_as("idem_rt_mallory").await;
    mallory.batch_execute("SET idempotency.max_response_bytes = '1GB'").await.expect("any role may set the setting");
    let t = reserve(&mallory, "big").await;
    let big = format!("SELECT idem_complete('roles', 'u', 'big', {t}, jsonb_build_object('x', repeat('x', 2000)))");
    if portable() {
        // Documented: the portable install's settings are placeholders, so no ceiling holds.
        let done = mallory.simple_query(&big).await;
        assert!(done.is_ok(), "the portable install stores it: {done:?}");
        return;
    }
    let (code, message) = refused(&mallory, &big).await;
    assert_eq!(code, "54000", "{message}");
    assert_eq!(
        message,
        "response must be at most 1024 bytes (idempotency.max_response_bytes, capped by idempotency.max_response_bytes_limit), got 2009"
    );
    let (code, message) = refused(&mallory, "SET idempotency.max_response_bytes_limit = '1GB'").await;
    assert_eq!(code, "42501", "{message}");
    // Lowering stays every role's right.
    mallory.batch_execute("SET idempotency.max_response_bytes = 100").await.expect("lower it");
    let (code, message) = refused(&mallory, &format!("SELECT idem_complete('roles', 'u', 'big', {t}, jsonb_build_object('x', repeat('x', 200)))")).await;
    assert_eq!(code, "54000", "{message}");
    assert!(message.starts_with("response must be at most 100 bytes (idempotency.max_response_bytes),"), "{message}");
}

#[tokio::test]
async fn an_ordinary_role_cannot_raise_ttl_or_lease_past_the_superusers_ceiling() {
    let url = setup().await;
    let admin = admin_at(&url).await;
    let db = url.rsplit('/').next().unwrap_or("idem_roles").to_owned();
    admin
        .batch_execute(&format!(
            "ALTER ROLE idem_rt_worker IN DATABASE {db} SET idempotency.ttl_limit = '1h';
             ALTER ROLE idem_rt_worker IN DATABASE {db} SET idempotency.lease_limit = '1min';"
        ))
        .await
        .expect("set the ceilings");
    let worker = connect_as("idem_rt_worker").await;
    worker.batch_execute("SET idempotency.ttl = '10d'; SET idempotency.lease = '1h'").await.expect("any role may set them");
    let row = worker
        .query_one("SELECT outcome FROM idem_reserve('roles.ceiling', 'u', 'k', 'h')", &[])
        .await
        .expect("reserve");
    assert_eq!(row.get::<_, String>(0), "created");
    let as_text = admin
        .query_one(
            "SELECT (expires_at - created_at)::text, (lease_expires_at - created_at)::text FROM idem_records
              WHERE operation = 'roles.ceiling' AND key = 'k'",
            &[],
        )
        .await
        .expect("the record as text");
    let got = (as_text.get::<_, String>(0), as_text.get::<_, String>(1));
    if portable() {
        // Documented: no ceiling on the portable install.
        assert_eq!(got, ("10 days".to_owned(), "01:00:00".to_owned()));
        return;
    }
    assert_eq!(got, ("01:00:00".to_owned(), "00:01:00".to_owned()));
    let (code, message) = refused(&worker, "SELECT idem_reserve('roles.ceiling', 'u', 'k2', 'h', ttl => '2 hours')").await;
    assert_eq!((code.as_str(), message.as_str()), ("22023", "ttl must be at most 01:00:00 (idempotency.ttl_limit), got 02:00:00"));
    let (code, message) = refused(&worker, "SELECT idem_reserve('roles.ceiling', 'u', 'k2', 'h', lease => '2 minutes')").await;
    assert_eq!((code.as_str(), message.as_str()), ("22023", "lease must be at most 00:01:00 (idempotency.lease_limit), got 00:02:00"));
}
