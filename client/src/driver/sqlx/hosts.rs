//! A connection URL naming several hosts, for the sqlx driver: refused with a configuration error
//! that names the limitation and the alternatives, instead of sqlx's "invalid port number".
//!
//! libpq and tokio-postgres read `postgresql://a:5432,b:5432/db?target_session_attrs=read-write`
//! as a list: each new connection tries the hosts in order and keeps the first that takes
//! writes, so a pool follows a promotion by itself. sqlx reads one host and one port. The
//! client could emulate the list above sqlx, but only by moving the whole pool at once (one set
//! of connect options, `PgPool::set_connect_options`) after something noticed the failure,
//! since sqlx's pool has no hook on a connection attempt: a refused connection is retried on
//! the same host until the pool's timeout. That is a weaker rule than libpq's, under the same
//! URL. So the URL is refused, and the error says what works: one endpoint that follows the
//! primary, or the tokio-postgres driver.
//!
//! A single host with `target_session_attrs` is accepted: sqlx ignores the option, and a write
//! on a server that takes none (a standby) is [`crate::Error::StoreUnavailable`] (SQLSTATE
//! 25006), as the option would make it.

/// The rule, in the words of the error.
const ALTERNATIVES: &str = "give the sqlx driver one endpoint that follows the primary (a managed database's writer \
     endpoint, or a proxy such as HAProxy in front of the servers), or use the tokio-postgres driver \
     (Idempotency::<Postgres>::from_url), which tries the hosts in order and keeps to the one that takes writes \
     with target_session_attrs=read-write";

/// Ok when `url` names at most one host and one port (in its authority, and in its `host`,
/// `hostaddr` and `port` parameters); otherwise the reason, for a configuration error.
pub(crate) fn one_host(url: &str) -> Result<(), String> {
    // Not a URL (sqlx reads no key=value string): sqlx's own error says so.
    let Some((_, rest)) = url.split_once("://") else { return Ok(()) };
    let (rest, _fragment) = rest.split_once('#').unwrap_or((rest, ""));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    // The user and password end at the last `@` (sqlx reads it so too); no secret is quoted.
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, hosts)| hosts);
    if hosts.contains(',') {
        return Err(several("the URL", hosts));
    }
    let query = rest[end..].split_once('?').map_or("", |(_, query)| query);
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if matches!(name, "host" | "hostaddr" | "port") && (value.contains(',') || value.to_ascii_lowercase().contains("%2c")) {
            return Err(several(&format!("the URL's {name} parameter"), value));
        }
    }
    Ok(())
}

fn several(place: &str, list: &str) -> String {
    let n = list.split(',').count().max(list.to_ascii_lowercase().matches("%2c").count() + 1);
    format!(
        "{place} names {n} hosts or ports ({list}), and the sqlx driver connects to one: sqlx reads a single host \
         and port, so it cannot try a list in order for the one that takes writes as libpq does; {ALTERNATIVES}"
    )
}

#[cfg(test)]
mod tests {
    use super::one_host;
    use crate::{Error, Idempotency};

    #[test]
    fn a_url_with_one_host_passes() {
        for url in [
            "postgres://db/x",
            "postgresql://app:secret@127.0.0.1:5432/shop?sslmode=disable",
            "postgresql://app@[::1]:5432/shop",
            // A comma in the password or the database name is not a host list.
            "postgres://app:pa,ss@db:5432/x",
            "postgres://db/x,y?application_name=a,b",
            "postgres:///x?host=/var/run/postgresql",
            "postgres://db/x?target_session_attrs=read-write",
            "host=db dbname=x",
        ] {
            assert_eq!(one_host(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn a_host_list_is_refused_naming_the_hosts_and_the_alternatives() {
        let e = one_host("postgresql://app:secret@127.0.0.1:5001,127.0.0.1:5002/db?target_session_attrs=read-write").unwrap_err();
        assert!(e.starts_with("the URL names 2 hosts or ports (127.0.0.1:5001,127.0.0.1:5002), and the sqlx driver connects to one"), "{e}");
        assert!(e.contains("one endpoint that follows the primary") && e.contains("Idempotency::<Postgres>::from_url"), "{e}");
        assert!(!e.contains("secret"), "the password is quoted: {e}");
        let e = one_host("postgres://[::1]:5001,[::2]:5002,db3/x").unwrap_err();
        assert!(e.starts_with("the URL names 3 hosts or ports ([::1]:5001,[::2]:5002,db3)"), "{e}");
        for (url, place, n) in [
            ("postgres:///x?host=a,b", "the URL's host parameter", 2),
            ("postgres:///x?sslmode=disable&hostaddr=10.0.0.1,10.0.0.2,10.0.0.3", "the URL's hostaddr parameter", 3),
            ("postgres://db/x?port=5432,5433", "the URL's port parameter", 2),
            ("postgres:///x?host=a%2Cb", "the URL's host parameter", 2),
        ] {
            let e = one_host(url).unwrap_err();
            assert!(e.starts_with(&format!("{place} names {n} hosts or ports")), "{url}: {e}");
        }
    }

    #[test]
    fn from_url_refuses_a_host_list_as_a_configuration_error() {
        match Idempotency::<crate::Sqlx>::from_url("postgresql://127.0.0.1:5001,127.0.0.1:5002/db?target_session_attrs=read-write", 1, crate::Settings::default()) {
            Err(Error::Configuration { reason, source: None }) => {
                assert!(reason.starts_with("the URL names 2 hosts or ports"), "{reason}");
            }
            Err(other) => panic!("not the configuration error: {other:?}"),
            Ok(_) => panic!("a host list was accepted"),
        }
    }
}
