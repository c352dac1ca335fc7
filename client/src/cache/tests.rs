//! The replay cache's unit tests.

use super::*;
use crate::settings::Settings;
use crate::types::Token;
use serde_json::json;

fn key(n: usize) -> Key {
    Key::new("cache.test", "user", format!("k{n}")).unwrap()
}

fn fp(body: &str) -> Fingerprint {
    Fingerprint::of_bytes(body.as_bytes())
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

fn deadline_of(cache: &ReplayCache, k: &Key) -> Instant {
    cache.shard(k).map[k].deadline
}

fn replay(v: Value) -> Answer {
    Answer::Replay(Some(Arc::new(v)))
}

#[test]
fn a_hit_is_the_answer_kept_for_the_same_request() {
    let cache = one_shard(10, Duration::from_secs(60));
    assert_eq!(cache.lookup(&key(1), &fp("a")), None);
    cache.insert(&key(1), &fp("a"), replay(json!({"id": 1})), far());
    assert_eq!(cache.lookup(&key(1), &fp("a")), Some(replay(json!({"id": 1}))));
    assert_eq!(cache.lookup(&key(2), &fp("a")), None, "another key");
    let other_scope = Key::new("cache.test", "someone-else", "k1").unwrap();
    assert_eq!(cache.lookup(&other_scope, &fp("a")), None, "another user");
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (1, 3, 1));
}

#[test]
fn another_fingerprint_is_a_miss_not_a_mismatch_and_keeps_the_entry() {
    let cache = one_shard(10, Duration::from_secs(60));
    cache.insert(&key(1), &fp("a"), replay(json!(1)), far());
    assert_eq!(cache.lookup(&key(1), &fp("b")), None);
    assert_eq!(cache.lookup(&key(1), &fp("a")), Some(replay(json!(1))), "the original request still replays");
}

#[test]
fn the_capacity_bounds_the_entries_across_shards() {
    for (entries, shards) in [(1, 1), (7, 7), (100, 16), (1000, 16), (5, 1)] {
        let cache = ReplayCache::with_shards(entries, Duration::from_secs(60), shards);
        for n in 0..entries * 5 {
            cache.insert(&key(n), &fp("a"), replay(json!(n)), far());
            assert!(cache.stats().entries <= entries, "{} entries in a cache of {entries}", cache.stats().entries);
        }
        let stats = cache.stats();
        assert!(stats.evictions >= (entries * 4) as u64, "{stats:?}");
        // The newest key of every shard is held.
        assert!(cache.lookup(&key(entries * 5 - 1), &fp("a")).is_some());
    }
    assert_eq!(ReplayCache::new(100_000, Duration::from_secs(1)).inner.shards.len(), MAX_SHARDS);
    let split = ReplayCache::with_shards(10, Duration::from_secs(1), 4);
    let capacities: Vec<_> = split.inner.shards.iter().map(|s| lock(s).capacity).collect();
    assert_eq!(capacities, [3, 3, 2, 2]);
}

#[test]
fn a_replayed_entry_survives_the_clock_over_a_cold_one() {
    let cache = ReplayCache::with_shards(3, Duration::from_secs(60), 1);
    for n in 0..3 {
        cache.insert(&key(n), &fp("a"), replay(json!(n)), far());
    }
    assert!(cache.lookup(&key(0), &fp("a")).is_some());
    cache.insert(&key(3), &fp("a"), replay(json!(3)), far());
    assert!(cache.lookup(&key(0), &fp("a")).is_some(), "hit: passed over once");
    assert_eq!(cache.lookup(&key(1), &fp("a")), None, "the coldest went");
    assert!(cache.lookup(&key(2), &fp("a")).is_some() && cache.lookup(&key(3), &fp("a")).is_some());
    assert_eq!(cache.stats().evictions, 1);
}

#[test]
fn an_expired_entry_is_evicted_first_even_when_hit() {
    let cache = ReplayCache::with_shards(2, Duration::from_secs(60), 1);
    cache.insert(&key(0), &fp("a"), replay(json!(0)), Instant::now() + Duration::from_millis(30));
    cache.insert(&key(1), &fp("a"), replay(json!(1)), far());
    assert!(cache.lookup(&key(0), &fp("a")).is_some());
    let past = Instant::now() + Duration::from_millis(30);
    while Instant::now() < past {
        std::thread::yield_now(); // the entry's own deadline, a real 30 ms
    }
    assert_eq!(cache.lookup(&key(0), &fp("a")), None, "past the record's expiry");
    cache.insert(&key(2), &fp("a"), replay(json!(2)), far());
    assert_eq!(cache.stats().entries, 2);
    assert!(cache.lookup(&key(1), &fp("a")).is_some() && cache.lookup(&key(2), &fp("a")).is_some());
}

#[test]
fn the_deadline_is_the_earlier_of_the_cache_ttl_and_the_record_expiry() {
    let cache = one_shard(4, Duration::from_millis(20));
    cache.insert(&key(0), &fp("a"), replay(json!(0)), far());
    let held = deadline_of(&cache, &key(0));
    assert!(held <= Instant::now() + Duration::from_millis(20), "the cache's ttl bounds a far record");
    let short = Instant::now() + Duration::from_millis(5);
    let cache = one_shard(4, Duration::from_secs(60));
    cache.insert(&key(1), &fp("a"), replay(json!(1)), short);
    assert_eq!(deadline_of(&cache, &key(1)), short, "the record's expiry bounds a long ttl");
    cache.insert(&key(2), &fp("a"), replay(json!(2)), Instant::now());
    assert_eq!(cache.lookup(&key(2), &fp("a")), None, "an expired record is not kept");
    assert_eq!(cache.stats().entries, 1);
}

/// A cache of one shard: with `new`'s shards of one entry each (10 entries, 10 shards) two
/// keys share a shard one time in ten under the random hasher, and the second evicts the first.
fn one_shard(entries: usize, ttl: Duration) -> ReplayCache {
    ReplayCache::with_shards(entries, ttl, 1)
}

fn settings(cache: &ReplayCache) -> Settings {
    Settings::builder().replay_cache(cache.clone()).ttl(Duration::from_secs(600)).build()
}

fn reservation(outcome: ReserveOutcome, expires_in: Duration) -> Reservation {
    Reservation { outcome, attempts: 0, expires_at: Some(SystemTime::now() + expires_in) }
}

#[test]
fn a_failed_record_is_answered_as_stored() {
    let cache = one_shard(10, Duration::from_secs(60));
    let settings = settings(&cache);
    let (k, f) = (key(1), fp("a"));
    let stored = json!({"status": 402, "body": "declined"});
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k, &f, &reservation(ReserveOutcome::Failed(Some(stored.clone())), Duration::from_secs(60)));
    match hit::<Value, ()>(settings.replay_cache.as_ref(), &k, &f) {
        Some(Err(Error::Failed { response })) => assert_eq!(response, Some(stored)),
        other => panic!("a FAILED record answers Failed: {other:?}"),
    }
    // A completion with FAILED (a result whose verdict is a failure) is kept the same way.
    let k2 = key(2);
    let memo = Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k2, &f, &reservation(ReserveOutcome::Created(Token(1)), Duration::from_secs(60)));
    memo.executed(Status::Failed, &json!({"status": 409}));
    assert!(matches!(hit::<Value, ()>(settings.replay_cache.as_ref(), &k2, &f), Some(Err(Error::Failed { response: Some(_) }))));
}

#[test]
fn replays_and_completions_fill_it_and_nothing_else_does() {
    let cache = one_shard(10, Duration::from_secs(60));
    let settings = settings(&cache);
    let f = fp("a");
    let keys: Vec<Key> = (0..5).map(key).collect();
    let minute = Duration::from_secs(60);
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&keys[0], &f, &reservation(ReserveOutcome::Replay(Some(json!({"id": 7}))), minute));
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&keys[1], &f, &reservation(ReserveOutcome::InProgress, minute));
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&keys[2], &f, &reservation(ReserveOutcome::Mismatch, minute));
    // Created but never completed (released, poisoned, lease lost): nothing.
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&keys[3], &f, &reservation(ReserveOutcome::Created(Token(1)), minute));
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&keys[4], &f, &reservation(ReserveOutcome::Created(Token(2)), minute)).executed(Status::Success, &json!(42));
    assert!(matches!(hit::<Value, ()>(settings.replay_cache.as_ref(), &keys[0], &f), Some(Ok(Outcome::Replayed(v))) if v == json!({"id": 7})));
    for k in &keys[1..4] {
        assert!(hit::<Value, ()>(settings.replay_cache.as_ref(), k, &f).is_none(), "{k}");
    }
    assert!(matches!(hit::<Value, ()>(settings.replay_cache.as_ref(), &keys[4], &f), Some(Ok(Outcome::Replayed(v))) if v == json!(42)));
    // A replay without a stored response decodes from null, as the database path does.
    let k = key(9);
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k, &f, &reservation(ReserveOutcome::Replay(None), minute));
    assert!(matches!(hit::<(), ()>(settings.replay_cache.as_ref(), &k, &f), Some(Ok(Outcome::Replayed(())))));
}

#[test]
fn an_expired_or_unknown_record_expiry_is_not_kept() {
    let cache = one_shard(10, Duration::from_secs(60));
    let settings = settings(&cache);
    let (k, f) = (key(1), fp("a"));
    let past = Reservation { outcome: ReserveOutcome::Replay(Some(json!(1))), attempts: 0, expires_at: Some(SystemTime::now() - Duration::from_secs(1)) };
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k, &f, &past);
    let unknown = Reservation { expires_at: None, ..past };
    Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k, &f, &unknown);
    assert!(hit::<Value, ()>(settings.replay_cache.as_ref(), &k, &f).is_none());
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn an_executed_entry_never_outlives_the_requested_ttl_whatever_the_server_clock_says() {
    let cache = one_shard(10, Duration::from_secs(3600));
    let settings = Settings::builder().replay_cache(cache.clone()).ttl(Duration::from_millis(50)).build();
    let (k, f) = (key(1), fp("a"));
    // A server clock an hour ahead: its expires_at reads an hour too late here.
    let skewed = reservation(ReserveOutcome::Created(Token(1)), Duration::from_secs(3600));
    let memo = Memo::start(settings.replay_cache.as_ref(), settings.ttl);
    let before = Instant::now();
    memo.reserved(&k, &f, &skewed).executed(Status::Success, &json!(1));
    let deadline = deadline_of(&cache, &k);
    assert!(deadline <= before + Duration::from_millis(50), "bounded by the ttl counted from before the reservation");
}

#[test]
fn off_is_one_option_check() {
    let settings = Settings::default();
    let (k, f) = (key(1), fp("a"));
    assert!(hit::<Value, ()>(settings.replay_cache.as_ref(), &k, &f).is_none());
    let memo = Memo::start(settings.replay_cache.as_ref(), settings.ttl).reserved(&k, &f, &reservation(ReserveOutcome::Created(Token(1)), Duration::from_secs(1)));
    assert!(memo.0.is_none());
    memo.executed(Status::Success, &json!(1));
}

#[test]
fn clones_share_it_and_the_arguments_are_checked() {
    let cache = ReplayCache::new(3, Duration::from_secs(1));
    cache.clone().insert(&key(1), &fp("a"), replay(json!(1)), far());
    assert_eq!(cache.stats().entries, 1);
    cache.clear();
    assert_eq!(cache.stats().entries, 0);
    assert_eq!((cache.capacity(), cache.ttl()), (3, Duration::from_secs(1)));
    let zero = std::panic::catch_unwind(|| ReplayCache::new(0, Duration::from_secs(1))).unwrap_err();
    assert_eq!(zero.downcast_ref::<&str>(), Some(&"ReplayCache::new: entries must be at least 1, got 0"));
    assert!(std::panic::catch_unwind(|| ReplayCache::new(1, Duration::ZERO)).is_err());
}

#[test]
fn concurrent_lookups_and_inserts_keep_the_bound() {
    let cache = ReplayCache::new(64, Duration::from_secs(60));
    std::thread::scope(|s| {
        for t in 0..4 {
            let cache = cache.clone();
            s.spawn(move || {
                for n in 0..2_000 {
                    let k = key(t * 10_000 + n % 300);
                    if cache.lookup(&k, &fp("a")).is_none() {
                        cache.insert(&k, &fp("a"), replay(json!(n)), far());
                    }
                }
            });
        }
    });
    let stats = cache.stats();
    assert!(stats.entries <= 64, "{stats:?}");
    assert_eq!(stats.hits + stats.misses, 8_000);
}
