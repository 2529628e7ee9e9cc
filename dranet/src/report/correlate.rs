//! Event correlation as client-go's `EventCorrelator` (`tools/record/events_cache.go`) does it
//! for identical events, so a fault that repeats is one Event with a growing `count` instead of
//! a flood of objects:
//!
//! * **Same event** = same source (component, host), involved object (kind, namespace, name,
//!   UID, API version; dranet sets no field path), type, reason and message (client-go's
//!   `getEventKey`). The first one creates the Event; each repeat bumps `count`, and the Event
//!   is PATCHed (strategic merge) with `count`, `lastTimestamp` and `message`, what client-go's
//!   `eventObserve` puts in its patch. A PATCH that finds the Event gone (404: its TTL ran out)
//!   creates it again under the same name with the current count, as `recordEvent` does.
//! * **Window**: a repeat more than [`DEDUP_WINDOW`] after the last one starts a new Event
//!   (client-go keeps the entry until the LRU evicts it and learns from the 404 that the Event
//!   expired; the API server keeps an Event for `--event-ttl`, 1 h by default, from its last
//!   write, so we skip the doomed PATCH).
//! * **Spam filter**: a token bucket per source + involved object (`getSpamKey`: not the
//!   reason or message), [`SPAM_BURST`] events at once, refilled one every [`SPAM_REFILL`]
//!   (client-go's 25 and 1/300 qps). As in client-go the occurrence is counted before the
//!   filter, so the next Event that goes out carries every repeat in its `count`.
//! * **Bounded**: both caches are LRUs of [`CACHE_ENTRIES`] (client-go's 4096) entries.
//!
//! One event key has at most one request in flight: while it runs, repeats only bump the
//! state, and the sender sends the newest state when it is done (so the server's `count` only
//! grows, and a burst costs one request, not one per repeat). Nothing here waits: the caller
//! takes a short lock and returns.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Event;

/// Entries of each cache (client-go's `maxLruCacheEntries`).
pub const CACHE_ENTRIES: usize = 4096;
/// Events per source + object at once (client-go's `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// One more event per source + object after this (client-go's `defaultSpamQPS` = 1/300).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// A repeat later than this after the last one is a new Event (the API server's default
/// `--event-ttl`).
pub const DEDUP_WINDOW: Duration = Duration::from_secs(3600);

/// Limits of a [`Correlator`].
#[derive(Clone, Copy, Debug)]
pub struct CorrelatorOptions {
    pub entries: usize,
    pub burst: u32,
    pub refill: Duration,
    pub window: Duration,
}

impl Default for CorrelatorOptions {
    fn default() -> Self {
        Self {
            entries: CACHE_ENTRIES,
            burst: SPAM_BURST,
            refill: SPAM_REFILL,
            window: DEDUP_WINDOW,
        }
    }
}

/// A least-recently-used map of at most `cap` entries.
#[derive(Debug)]
struct Lru<V> {
    cap: usize,
    tick: u64,
    map: HashMap<String, (u64, V)>,
    /// Use tick → key, oldest first.
    order: BTreeMap<u64, String>,
}

impl<V> Lru<V> {
    fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            tick: 0,
            map: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// The entry of `key`, made the most recent; `make` creates a missing one (evicting the
    /// least recent when full).
    fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> V) -> &mut V {
        self.tick += 1;
        let tick = self.tick;
        if let Some((used, _)) = self.map.get(key) {
            let used = *used;
            self.order.remove(&used);
        } else {
            while self.map.len() >= self.cap {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                self.map.remove(&oldest);
            }
        }
        self.order.insert(tick, key.to_owned());
        let entry = self.map.entry(key.to_owned()).or_insert_with(|| (tick, make()));
        entry.0 = tick;
        &mut entry.1
    }
}

/// A token bucket of the spam filter.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// What one event key has seen and sent.
#[derive(Debug)]
pub(super) struct SlotState {
    /// The Event as it should be on the server now (name and `firstTimestamp` of the first
    /// occurrence, `count` and `lastTimestamp` of the latest).
    pub(super) event: Event,
    /// The name of the Event the server has (created, or patched since), if any.
    pub(super) created: Option<String>,
    /// The `count` the server has.
    pub(super) sent_count: i32,
    /// A sender runs for this key.
    pub(super) sending: bool,
    last_seen: Instant,
}

/// One event key's state, shared with its sender.
pub(super) type Slot = Arc<Mutex<SlotState>>;

pub(super) fn lock(slot: &Slot) -> MutexGuard<'_, SlotState> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`Correlator::observe`] decided.
#[derive(Debug)]
pub(super) enum Observed {
    /// The spam filter holds it back (counted; a later one carries the count).
    Spam,
    /// A sender for this key is running and will send it.
    Queued,
    /// Start a sender for this slot (its `sending` is set).
    Send(Slot),
}

/// The correlator's state; the reporter keeps one behind a mutex.
#[derive(Debug)]
pub struct Correlator {
    opts: CorrelatorOptions,
    spam: Lru<Bucket>,
    log: Lru<Slot>,
}

impl Default for Correlator {
    fn default() -> Self {
        Self::new(CorrelatorOptions::default())
    }
}

impl Correlator {
    #[must_use]
    pub fn new(opts: CorrelatorOptions) -> Self {
        Self {
            opts,
            spam: Lru::new(opts.entries),
            log: Lru::new(opts.entries),
        }
    }

    /// Entries in the (event, spam) caches.
    #[must_use]
    pub fn len(&self) -> (usize, usize) {
        (self.log.len(), self.spam.len())
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.log.len() == 0 && self.spam.len() == 0
    }

    /// Takes one occurrence of `ev` at `now`.
    pub(super) fn observe(&mut self, ev: Event, now: Instant) -> Observed {
        let window = self.opts.window;
        let mut fresh = false;
        let slot = self
            .log
            .get_or_insert_with(&event_key(&ev), || {
                fresh = true;
                Arc::new(Mutex::new(SlotState {
                    event: ev.clone(),
                    created: None,
                    sent_count: 0,
                    sending: false,
                    last_seen: now,
                }))
            })
            .clone();
        let mut st = lock(&slot);
        if !fresh {
            if now.saturating_duration_since(st.last_seen) > window {
                // Too long ago: a new Event (a running sender will create it).
                st.event = ev.clone();
            } else {
                st.event.count = st.event.count.saturating_add(1);
                st.event.last_timestamp.clone_from(&ev.last_timestamp);
            }
        }
        st.last_seen = now;
        if !self.admit(&ev, now) {
            return Observed::Spam;
        }
        if st.sending {
            return Observed::Queued;
        }
        st.sending = true;
        drop(st);
        Observed::Send(slot)
    }

    /// The spam filter: one token of the bucket of `ev`'s source + object.
    fn admit(&mut self, ev: &Event, now: Instant) -> bool {
        let (burst, refill) = (f64::from(self.opts.burst), self.opts.refill.as_secs_f64());
        let b = self.spam.get_or_insert_with(&spam_key(ev), || Bucket {
            tokens: burst,
            at: now,
        });
        if refill > 0.0 {
            let gained = now.saturating_duration_since(b.at).as_secs_f64() / refill;
            b.tokens = (b.tokens + gained).min(burst);
        } else {
            b.tokens = burst;
        }
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// client-go's `getEventKey`: the spam key plus type, reason and message.
fn event_key(e: &Event) -> String {
    [spam_key(e).as_str(), &e.type_, &e.reason, &e.message].join("\u{0}")
}

/// client-go's `getSpamKey`.
fn spam_key(e: &Event) -> String {
    let o = &e.involved_object;
    [
        e.source.component.as_str(),
        &e.source.host,
        &o.kind,
        &o.namespace,
        &o.name,
        &o.uid,
        &o.api_version,
    ]
    .join("\u{0}")
}
