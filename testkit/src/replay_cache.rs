//! `IDEM_REPLAY_CACHE=on`: every handle the test kit makes ([`crate::connect_with`], and so
//! [`crate::handle`] and [`crate::handle_in`]) gets a replay cache of its own, unless its
//! settings already have one, so a suite (the checklist's and the faults' concurrency tests) runs
//! again with replays answered from memory. Unset or `off`: the settings as given.

use idempotency_client::{ReplayCache, Settings, SettingsBuilder};
use std::time::Duration;

/// The cache's size and time to live when the variable turns it on.
const ENTRIES: usize = 10_000;
const TTL: Duration = Duration::from_secs(60);

/// `settings`, with a new cache when `IDEM_REPLAY_CACHE` is `on` (any other value but `off` or
/// empty is refused, naming the variable and its values).
pub fn from_env(settings: Settings) -> Settings {
    match std::env::var("IDEM_REPLAY_CACHE").as_deref() {
        Ok("on") if settings.replay_cache.is_none() => SettingsBuilder::from(settings).replay_cache(ReplayCache::new(ENTRIES, TTL)).build(),
        Ok("on" | "off" | "") | Err(_) => settings,
        Ok(other) => panic!("IDEM_REPLAY_CACHE must be on or off, got {other:?}"),
    }
}
