//! The replay cache: an opt-in, bounded, in-process memory of completed answers, consulted
//! before the database by `run`, `run_external` and the layer (both drivers; the flows fill it).
//!
//! An entry is keyed by the key's scope `(operation, user_id, key)` and holds the request's
//! fingerprint, the answer (a `SUCCESS` record's stored response, or a `FAILED` record's) and a
//! deadline: the earliest of the cache's time to live and the record's expiry. A lookup with
//! another fingerprint is a miss (the database answers the mismatch), a lookup past the deadline
//! is a miss. The entries are spread over a few shards, each a `Mutex<HashMap>` bounded by its
//! share of the capacity and evicting with the clock algorithm (an approximate LRU: an entry hit
//! since the hand last passed gets a second chance; an expired one goes first).
//!
//! The flows meet the cache through [`hit`] (before anything else) and [`Memo`] (created before
//! the reservation, told of the reservation's answer and of a completion). With the cache off
//! each is one `Option` check.

use crate::error::Error;
use crate::types::{Reservation, ReserveOutcome, Status};
use crate::response::Replayable;
use crate::Outcome;
use idempotency_core::{Fingerprint, Key};
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// The most shards a cache is split into (fewer when it holds fewer entries).
const MAX_SHARDS: usize = 16;

/// An in-process cache of completed answers, for [`crate::Settings::replay_cache`]: a replay it holds
/// is answered from memory, with no round trip and no pooled connection.
///
/// `entries` bounds how many answers it keeps (across every key; the least recently replayed go
/// first, approximately); `ttl` bounds how long one is kept after it was filled. An entry never
/// outlives the record it copies: its deadline is the earlier of `ttl` and the record's
/// `expires_at`. It serves only the same request (the same fingerprint): a reuse of the key
/// with another body still reaches the database and gets [`Error::Mismatch`] (the layer's 422).
/// A `FAILED` record's answer is kept as stored ([`Error::Failed`] with its response).
///
/// What it trades (docs/rust-client.md, "The replay cache"): a record removed or changed in the
/// database (by hand, by an early sweep, by an operator) is still replayed from memory until its
/// entry's deadline; each process has its own cache; a replayed record's expiry is read on the
/// client's clock, so a clock ahead of or behind the server's moves that deadline by the skew,
/// never beyond `ttl`.
///
/// Clones share the cache. Give one to the settings of a handle (a layer built on that handle
/// inherits it):
///
/// ```no_run
/// use idempotency_client::{Idempotency, ReplayCache, Settings};
/// use std::time::Duration;
/// # fn demo() -> Result<(), idempotency_client::Error> {
/// let cache = ReplayCache::new(10_000, Duration::from_secs(60));
/// let settings = Settings::builder().replay_cache(cache.clone());
/// let idem: Idempotency = Idempotency::from_url("postgresql://app@localhost/shop", 16, settings)?;
/// // ... later: how often replays were answered from memory.
/// let stats = cache.stats();
/// println!("{} hits, {} misses, {} entries", stats.hits, stats.misses, stats.entries);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ReplayCache {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<Shard>]>,
    ttl: Duration,
    capacity: usize,
    hasher: std::collections::hash_map::RandomState,
}

/// One shard: its entries, the clock's ring of their keys (each key of the map exactly once),
/// its share of the capacity and its counters.
struct Shard {
    map: HashMap<Arc<Key>, Entry>,
    ring: VecDeque<Arc<Key>>,
    capacity: usize,
    hits: u64,
    misses: u64,
    evictions: u64,
}

struct Entry {
    fingerprint: Fingerprint,
    answer: Answer,
    deadline: Instant,
    /// Hit since the clock's hand last passed it.
    referenced: bool,
}

/// A completed record's answer, as the database gives it on a replay.
#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// A `SUCCESS` record: its stored response.
    Replay(Option<Arc<Value>>),
    /// A `FAILED` record: its stored response, if any.
    Failed(Option<Arc<Value>>),
}

/// What a [`ReplayCache`] counted since it was made (every clone's calls together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayCacheStats {
    /// Lookups answered from memory.
    pub hits: u64,
    /// Lookups that went to the database (no entry, another fingerprint, or past its deadline).
    pub misses: u64,
    /// Entries evicted to make room for another.
    pub evictions: u64,
    /// Entries held now (expired ones included until they are evicted or replaced).
    pub entries: usize,
}

impl ReplayCache {
    /// A cache of at most `entries` answers, each kept at most `ttl` (and never past its
    /// record's expiry).
    ///
    /// # Panics
    ///
    /// When `entries` is 0 or `ttl` is zero: such a cache could never answer (leave
    /// [`crate::Settings::replay_cache`] unset instead).
    ///
    /// # Errors
    ///
    /// None (it panics instead, above: a constant of your configuration).
    ///
    /// # Cancel safety
    ///
    /// Not async: nothing to cancel.
    pub fn new(entries: usize, ttl: Duration) -> Self {
        assert!(entries > 0, "ReplayCache::new: entries must be at least 1, got 0");
        assert!(!ttl.is_zero(), "ReplayCache::new: ttl must be longer than zero");
        Self::with_shards(entries, ttl, entries.min(MAX_SHARDS))
    }

    /// [`ReplayCache::new`] over `shards` shards (the tests take one, to see the clock's order).
    fn with_shards(entries: usize, ttl: Duration, shards: usize) -> Self {
        let shards = (0..shards)
            .map(|i| {
                // The capacity split exactly: the first `entries % shards` shards hold one more.
                let capacity = entries / shards + usize::from(i < entries % shards);
                Mutex::new(Shard {
                    map: HashMap::with_capacity(capacity.min(1024)),
                    ring: VecDeque::with_capacity(capacity.min(1024)),
                    capacity,
                    hits: 0,
                    misses: 0,
                    evictions: 0,
                })
            })
            .collect();
        ReplayCache { inner: Arc::new(Inner { shards, ttl, capacity: entries, hasher: Default::default() }) }
    }

    /// At most how many answers it holds.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// At most how long it keeps an answer.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Its counters, summed over its shards.
    pub fn stats(&self) -> ReplayCacheStats {
        self.inner.shards.iter().fold(ReplayCacheStats::default(), |mut sum, shard| {
            let shard = lock(shard);
            sum.hits += shard.hits;
            sum.misses += shard.misses;
            sum.evictions += shard.evictions;
            sum.entries += shard.map.len();
            sum
        })
    }

    /// Forgets every answer (the counters stay).
    pub fn clear(&self) {
        for shard in self.inner.shards.iter() {
            let mut shard = lock(shard);
            shard.map.clear();
            shard.ring.clear();
        }
    }

    fn shard(&self, key: &Key) -> MutexGuard<'_, Shard> {
        let shards = &self.inner.shards;
        let index = if shards.len() == 1 { 0 } else { (self.inner.hasher.hash_one(key) % shards.len() as u64) as usize };
        lock(&shards[index])
    }

    /// The answer held for `key` and this request, if it is still within its deadline.
    fn lookup(&self, key: &Key, fingerprint: &Fingerprint) -> Option<Answer> {
        let now = Instant::now();
        let mut guard = self.shard(key);
        let shard = &mut *guard;
        match shard.map.get_mut(key) {
            Some(entry) if entry.deadline > now && entry.fingerprint == *fingerprint => {
                entry.referenced = true;
                shard.hits += 1;
                Some(entry.answer.clone())
            }
            _ => {
                shard.misses += 1;
                None
            }
        }
    }

    /// Keeps `answer` for `key` and this request until `record_deadline` (the record's expiry
    /// on this process's clock) or the cache's ttl, whichever is first.
    fn insert(&self, key: &Key, fingerprint: &Fingerprint, answer: Answer, record_deadline: Instant) {
        let now = Instant::now();
        let deadline = record_deadline.min(now + self.inner.ttl);
        if deadline <= now {
            return;
        }
        let entry = Entry { fingerprint: fingerprint.clone(), answer, deadline, referenced: false };
        let mut shard = self.shard(key);
        if let Some(held) = shard.map.get_mut(key) {
            *held = entry;
            return;
        }
        if shard.map.len() >= shard.capacity {
            shard.evict_one(now);
        }
        let key = Arc::new(key.clone());
        shard.ring.push_back(key.clone());
        shard.map.insert(key, entry);
    }
}

impl Shard {
    /// The clock's hand: the first entry past its deadline or not hit since the hand last
    /// passed goes; a hit one is passed over once (its mark cleared).
    fn evict_one(&mut self, now: Instant) {
        while let Some(key) = self.ring.pop_front() {
            let Some(entry) = self.map.get_mut(&key) else { continue };
            if entry.referenced && entry.deadline > now {
                entry.referenced = false;
                self.ring.push_back(key);
            } else {
                self.map.remove(&key);
                self.evictions += 1;
                return;
            }
        }
    }
}

/// A shard's lock; a panic elsewhere while it was held leaves entries that are each whole.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for ReplayCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCache").field("entries", &self.inner.capacity).field("ttl", &self.inner.ttl).finish_non_exhaustive()
    }
}

/// The answer from memory for `key` and this request, as the database would give it on a
/// replay; `None` when the cache is off or holds none (then the call goes to the database).
pub(crate) fn hit<T: Replayable, E>(cache: Option<&ReplayCache>, key: &Key, fingerprint: &Fingerprint) -> Option<Result<Outcome<T>, Error<E>>> {
    let answer = cache?.lookup(key, fingerprint)?;
    #[cfg(feature = "tracing")]
    tracing::debug!(replay_cache = "hit", "answered from the replay cache");
    Some(match answer {
        Answer::Replay(response) => {
            T::deserialize(response.as_deref().unwrap_or(&Value::Null)).map(Outcome::Replayed).map_err(Error::Decode)
        }
        Answer::Failed(response) => Err(Error::Failed { response: response.map(Arc::unwrap_or_clone) }),
    })
}

/// What one attempt of a flow tells the cache: made before its reservation is sent (so the
/// record's ttl, which counts from the reservation, is measured from an earlier instant on this
/// process's clock), then told of the reservation's answer and of the completion. Empty when
/// the cache is off.
pub(crate) struct Memo<'a>(Option<Filling<'a>>);

struct Filling<'a> {
    cache: &'a ReplayCache,
    /// Before the reservation was sent.
    started: Instant,
    /// The ttl the reservation asked for (None: the server's default).
    ttl: Option<Duration>,
    /// The record's expiry on this process's clock, once the reservation answered.
    expires: Option<Instant>,
    key: Option<&'a Key>,
    fingerprint: Option<&'a Fingerprint>,
}

impl<'a> Memo<'a> {
    /// Before the reservation, which asks for `ttl` (None: the server's default).
    pub(crate) fn start(cache: Option<&'a ReplayCache>, ttl: Option<Duration>) -> Self {
        Memo(cache.map(|cache| Filling {
            cache,
            started: Instant::now(),
            ttl,
            expires: None,
            key: None,
            fingerprint: None,
        }))
    }

    /// The reservation's answer: a replay or a `FAILED` record is kept (until the record's
    /// expiry); for a created reservation the expiry is kept for the completion.
    pub(crate) fn reserved(mut self, key: &'a Key, fingerprint: &'a Fingerprint, reservation: &Reservation) -> Self {
        let Some(f) = self.0.as_mut() else { return self };
        let Some(expires) = reservation.expires_at.and_then(on_this_clock) else { return Memo(None) };
        let answer = match &reservation.outcome {
            ReserveOutcome::Replay(response) => Answer::Replay(response.clone().map(Arc::new)),
            ReserveOutcome::Failed(response) => Answer::Failed(response.clone().map(Arc::new)),
            ReserveOutcome::Created(_) => {
                // The record expires `ttl` after the reservation, which came after `started`:
                // with an explicit ttl that bound holds whatever the clocks say.
                let bound = f.ttl.map_or(expires, |ttl| expires.min(f.started + ttl));
                (f.expires, f.key, f.fingerprint) = (Some(bound), Some(key), Some(fingerprint));
                return self;
            }
            ReserveOutcome::InProgress | ReserveOutcome::Mismatch | ReserveOutcome::Resume { .. } => return Memo(None),
        };
        f.cache.insert(key, fingerprint, answer, expires);
        Memo(None)
    }

    /// The attempt completed its key with `stored` as `status` (and committed).
    pub(crate) fn executed(&self, status: Status, stored: &Value) {
        let Some(Filling { cache, expires: Some(expires), key: Some(key), fingerprint: Some(fingerprint), .. }) = &self.0 else {
            return;
        };
        let response = Some(Arc::new(stored.clone()));
        let answer = match status {
            Status::Success => Answer::Replay(response),
            Status::Failed => Answer::Failed(response),
            Status::Processing | Status::Resumable => return,
        };
        cache.insert(key, fingerprint, answer, *expires);
    }
}

/// A server instant on this process's monotonic clock (read through its wall clock); `None`
/// when it has passed.
fn on_this_clock(at: SystemTime) -> Option<Instant> {
    let left = at.duration_since(SystemTime::now()).ok()?;
    Instant::now().checked_add(left)
}

#[cfg(test)]
mod tests;
