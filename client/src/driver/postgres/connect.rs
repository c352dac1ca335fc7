//! The tokio-postgres pool a handle makes from a URL (`Idempotency::from_url`): its TLS
//! options read by `crate::tls`, its waits bounded and its keepalives and `statement_timeout`
//! set by the [`Settings`] where the URL does not name them; the driver over it sends its cancel
//! requests through the pool's own connector.

use super::Postgres;
use crate::error::Error;
use crate::settings::{Settings, KEEPALIVES_INTERVAL, KEEPALIVES_RETRIES};

/// A driver over a pool of `pool_size` connections to `url`, nothing connected yet, whose cancel
/// requests go through the connector of its connections; a malformed URL, or an `sslmode` this
/// build cannot honour, is a [`Error::Configuration`] error.
pub(crate) fn driver(url: &str, pool_size: u32, settings: &Settings) -> Result<Postgres, Error> {
    use crate::tls::{connect_params, Connector};
    use deadpool_postgres::{Manager, ManagerConfig, Pool, Runtime};
    let params = connect_params(url).map_err(|reason| Error::Configuration {
        reason,
        // The driver's own parse error, when it is the rest of the URL (its TLS options
        // taken out) that does not parse.
        source: crate::tls::SslParams::parse(url)
            .ok()
            .and_then(|ssl| ssl.rest.parse::<tokio_postgres::Config>().err())
            .map(|e| Box::new(e) as _),
    })?;
    let mut config = params.options.config;
    bounds(&mut config, url, settings);
    let connect = config.get_connect_timeout().copied().unwrap_or(settings.connect_timeout);
    let manager = match params.connector.clone() {
        Connector::NoTls(tls) => Manager::from_config(config, tls, ManagerConfig::default()),
        #[cfg(feature = "tls")]
        Connector::Rustls(tls) => Manager::from_config(config, tls, ManagerConfig::default()),
    };
    let pool = Pool::builder(manager)
        .max_size(usize::try_from(pool_size).unwrap_or(usize::MAX))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.pool_timeout))
        .create_timeout(Some(connect))
        .recycle_timeout(Some(connect))
        .build()
        .map_err(|e| Error::Configuration {
            reason: format!("cannot build a connection pool for the given URL: {e}"),
            source: Some(Box::new(e)),
        })?;
    Ok(Postgres::with_connector(pool, params.connector))
}

/// The settings' bounds on `config`, each where the URL `url` does not name its own: the
/// connect timeout, the keepalives, the `statement_timeout` sent when connecting.
fn bounds(config: &mut tokio_postgres::Config, url: &str, settings: &Settings) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(settings.connect_timeout);
    }
    if !names(url, "keepalives") {
        config.keepalives(settings.keepalives_idle.is_some());
    }
    if let Some(idle) = settings.keepalives_idle {
        if !names(url, "keepalives_idle") {
            config.keepalives_idle(idle);
        }
        if !names(url, "keepalives_interval") {
            config.keepalives_interval(KEEPALIVES_INTERVAL);
        }
        if !names(url, "keepalives_retries") {
            config.keepalives_retries(KEEPALIVES_RETRIES);
        }
    }
    if let Some(limit) = settings.statement_timeout {
        let options = config.get_options().unwrap_or("");
        if !options.contains("statement_timeout") {
            let mine = format!("-c statement_timeout={}", limit.as_millis());
            let joined = if options.is_empty() { mine } else { format!("{options} {mine}") };
            config.options(joined);
        }
    }
}

/// Whether the connection string `url` (a URL, or key=value pairs) names the option `name`.
fn names(url: &str, name: &str) -> bool {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let query = query.split_once('#').map_or(query, |(q, _)| q);
        return query.split('&').any(|pair| pair.split_once('=').map_or(pair, |(n, _)| n) == name);
    }
    // key=value: the name at the start or after a space, then `=` (spaces allowed around it).
    url.match_indices(name).any(|(at, _)| {
        let before = url[..at].chars().next_back();
        let after = url[at + name.len()..].trim_start();
        before.is_none_or(char::is_whitespace) && after.starts_with('=')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config_of(url: &str, settings: &Settings) -> tokio_postgres::Config {
        let mut config: tokio_postgres::Config = url.parse().expect("the URL parses");
        bounds(&mut config, url, settings);
        config
    }

    #[test]
    fn the_settings_fill_in_what_the_url_does_not_name() {
        let settings = Settings::builder()
            .connect_timeout(Duration::from_secs(7))
            .keepalives_idle(Some(Duration::from_secs(20)))
            .statement_timeout(Some(Duration::from_millis(1500)))
            .build();
        let c = config_of("postgresql://app@db/shop", &settings);
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(7)));
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(20));
        assert_eq!(c.get_keepalives_interval(), Some(KEEPALIVES_INTERVAL));
        assert_eq!(c.get_keepalives_retries(), Some(KEEPALIVES_RETRIES));
        assert_eq!(c.get_options(), Some("-c statement_timeout=1500"));
        // The defaults: 5 s to connect, keepalives after 60 s, the server's statement_timeout.
        let c = config_of("postgresql://app@db/shop", &Settings::default());
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!((c.get_keepalives(), c.get_keepalives_idle()), (true, Duration::from_secs(60)));
        assert_eq!(c.get_options(), None);
        // Off.
        let c = config_of("postgresql://app@db/shop", &Settings::builder().keepalives_idle(None).build());
        assert!(!c.get_keepalives());
    }

    #[test]
    fn what_the_url_names_wins() {
        let settings = Settings::builder().keepalives_idle(Some(Duration::from_secs(20))).statement_timeout(Some(Duration::from_secs(1))).build();
        for url in [
            "postgresql://app@db/shop?connect_timeout=9&keepalives_idle=11&keepalives_interval=2&keepalives_retries=4&options=-c%20statement_timeout%3D3s",
            "host=db user=app connect_timeout=9 keepalives_idle = 11 keepalives_interval=2 keepalives_retries=4 options='-c statement_timeout=3s'",
        ] {
            let c = config_of(url, &settings);
            assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(9)), "{url}");
            assert_eq!(c.get_keepalives_idle(), Duration::from_secs(11), "{url}");
            assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(2)), "{url}");
            assert_eq!(c.get_keepalives_retries(), Some(4), "{url}");
            assert_eq!(c.get_options(), Some("-c statement_timeout=3s"), "{url}");
        }
        // keepalives=0 in the URL turns them off whatever the settings; other options are kept
        // beside the settings' statement_timeout.
        let c = config_of("postgresql://app@db/shop?keepalives=0&options=-c%20geqo%3Doff", &settings);
        assert!(!c.get_keepalives());
        assert_eq!(c.get_options(), Some("-c geqo=off -c statement_timeout=1000"));
        let c = config_of("postgresql://app@db/shop?keepalives=1", &Settings::builder().keepalives_idle(None).build());
        assert!(c.get_keepalives());
    }

    #[test]
    fn a_name_is_matched_whole() {
        assert!(!names("postgresql://db/x?keepalives_idle=3", "keepalives"));
        assert!(names("postgresql://db/x?a=1&keepalives=0", "keepalives"));
        assert!(!names("host=db keepalives_idle=3", "keepalives"));
        assert!(!names("host=db password=xkeepalives=1", "keepalives"));
        assert!(names("host=db keepalives =0", "keepalives"));
    }
}
