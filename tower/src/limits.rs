//! The limits read from the server: the largest response body the layer reads from its route,
//! the configured one or the server's `idempotency.max_response_bytes`, read once per layer.

use idempotency_client::adapter::max_response_bytes;
use idempotency_client::Driver;
use tokio::sync::OnceCell;

/// The default of [`Builder::response_limit`](crate::Builder::response_limit) where the server's `idempotency.max_response_bytes`
/// cannot be read: that setting's documented default, 1MB.
pub const DEFAULT_RESPONSE_LIMIT: usize = 1 << 20;

/// The largest response body the layer reads from its route: the configured one, else the
/// server's `idempotency.max_response_bytes`, read once per layer.
pub(crate) struct ResponseLimit {
    set: Option<usize>,
    server: OnceCell<usize>,
}

impl ResponseLimit {
    /// The configured limit (`None`: the server's, read when first needed).
    pub(crate) fn new(set: Option<usize>) -> Self {
        ResponseLimit { set, server: OnceCell::new() }
    }

    /// The limit, reading the server's on `tx` (a connection the request's flow holds: no second
    /// one is taken) the first time it is needed, when none was configured. A read that fails
    /// is not kept: this request uses [`DEFAULT_RESPONSE_LIMIT`] and the next one reads again.
    pub(crate) async fn on<D: Driver>(&self, tx: &mut D::Tx) -> usize {
        if let Some(limit) = self.set.or_else(|| self.server.get().copied()) {
            return limit;
        }
        match server_limit::<D>(tx).await {
            Ok(limit) => {
                let _ = self.server.set(limit);
                limit
            }
            Err(e) => {
                tracing::warn!(error = %e, default = DEFAULT_RESPONSE_LIMIT, "idempotency.max_response_bytes could not be read; the documented default is used");
                DEFAULT_RESPONSE_LIMIT
            }
        }
    }

    /// [`ResponseLimit::on`] a pooled connection (two-phase: the flow holds none while the route
    /// runs), taken only when the limit is not known yet.
    pub(crate) async fn pooled<D: Driver>(&self, driver: &D) -> usize {
        if let Some(limit) = self.set.or_else(|| self.server.get().copied()) {
            return limit;
        }
        match driver.connection().await {
            Ok(mut tx) => self.on::<D>(&mut tx).await,
            Err(e) => {
                tracing::warn!(error = %e, default = DEFAULT_RESPONSE_LIMIT, "idempotency.max_response_bytes could not be read; the documented default is used");
                DEFAULT_RESPONSE_LIMIT
            }
        }
    }
}

/// The server's `idempotency.max_response_bytes` in bytes; its default where it is not defined.
async fn server_limit<D: Driver>(tx: &mut D::Tx) -> Result<usize, String> {
    match max_response_bytes::<D>(tx).await.map_err(|e| e.to_string())? {
        None => Ok(DEFAULT_RESPONSE_LIMIT),
        Some(text) if text.trim().is_empty() => Ok(DEFAULT_RESPONSE_LIMIT),
        Some(text) => memory_setting(&text).ok_or_else(|| {
            format!("idempotency.max_response_bytes must be a number of bytes with an optional unit (B, kB, MB, GB, TB), got {text:?}")
        }),
    }
}

/// A memory setting as PostgreSQL shows it (`1MB`, `4kB`, `1500B`, `1048576`), in bytes.
fn memory_setting(text: &str) -> Option<usize> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    number.parse::<usize>().ok()?.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::memory_setting;

    #[test]
    fn memory_settings_as_postgres_shows_them() {
        assert_eq!(memory_setting("1MB"), Some(1 << 20));
        assert_eq!(memory_setting("4kB"), Some(4096));
        assert_eq!(memory_setting("1500B"), Some(1500));
        assert_eq!(memory_setting(" 2 GB "), Some(2 << 30));
        assert_eq!(memory_setting("1048576"), Some(1 << 20));
        assert_eq!(memory_setting("0"), Some(0));
        assert_eq!(memory_setting("1mb"), None, "units are case-sensitive, as PostgreSQL reads them");
        assert_eq!(memory_setting("MB"), None);
        assert_eq!(memory_setting("-1"), None);
    }
}
