//! Handing freed heap back to the kernel after a burst of work.
//!
//! glibc returns an arena's free pages only from the top of its heap; pages freed in the middle
//! stay resident until `malloc_trim`. A burst of pods (256 attached, then all gone) leaves
//! several MiB so, and nothing else would trim them: a pod's removal changes no link, so no
//! inventory scan (which trims right after itself, once per debounced scan) follows it.
//! [`after_burst`] asks for one trim once the burst has settled, from any thread, without
//! blocking the caller. Never during the burst: a trim holds each arena's lock while it walks
//! the free chunks, which would stall the allocations of a drain's hooks.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A trim waits until no burst asked for one for this long.
pub const SETTLE: Duration = Duration::from_millis(250);

/// The daemon's heap.
static HEAP: Debounced = Debounced::new(crate::sys::os::release_freed_heap);

/// Work that freed much of the heap just ended: trim once no ask came for [`SETTLE`]. Cheap: an
/// atomic store, and a thread per burst.
pub fn after_burst() {
    HEAP.ask();
}

/// Below this capacity a table is kept whatever it holds (too small to matter).
const SPARSE_MIN: usize = 32;

/// Gives back the table of a map that holds a quarter or less of its capacity (it grew with a
/// burst of pods that are gone), keeping room for twice what it holds. Call it after removals:
/// a table kept at the burst's size is live heap that pins its pages, and the burst's small
/// allocations around it, in the arena for good. Amortised O(1): after a shrink the map must
/// lose half of what it holds again before the next one.
pub fn shrink_sparse<K: Eq + Hash, V, S: BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > SPARSE_MIN && map.len().saturating_mul(4) <= map.capacity() {
        map.shrink_to(map.len().saturating_mul(2));
    }
}

/// [`shrink_sparse`] for a queue.
pub fn shrink_sparse_queue<T>(q: &mut VecDeque<T>) {
    if q.capacity() > SPARSE_MIN && q.len().saturating_mul(4) <= q.capacity() {
        q.shrink_to(q.len().saturating_mul(2));
    }
}

/// How many trims [`after_burst`] has led to.
#[must_use]
pub fn trims() -> u64 {
    HEAP.done.load(Ordering::SeqCst)
}

/// Runs `action` on a thread of its own once asks settle.
struct Debounced {
    action: fn(),
    /// A thread is scheduled to run the action.
    pending: AtomicBool,
    /// When the latest ask came (ms, CLOCK_MONOTONIC).
    last_ask: AtomicU64,
    done: AtomicU64,
}

fn clock_ms() -> u64 {
    crate::sys::os::mono_now().as_ns() / 1_000_000
}

impl Debounced {
    const fn new(action: fn()) -> Self {
        Self {
            action,
            pending: AtomicBool::new(false),
            last_ask: AtomicU64::new(0),
            done: AtomicU64::new(0),
        }
    }

    fn ask(&'static self) {
        self.last_ask.store(clock_ms(), Ordering::SeqCst);
        if !self.claim() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("dranet-trim".into())
            .spawn(move || self.run());
        if let Err(e) = spawned {
            self.pending.store(false, Ordering::SeqCst);
            tracing::debug!(error = %e, "no thread to trim the heap with");
        }
    }

    fn claim(&self) -> bool {
        self.pending
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    fn run(&self) {
        let settle = u64::try_from(SETTLE.as_millis()).unwrap_or(u64::MAX);
        loop {
            loop {
                let now = clock_ms();
                let quiet_at = self.last_ask.load(Ordering::SeqCst).saturating_add(settle);
                if now >= quiet_at {
                    break;
                }
                std::thread::sleep(Duration::from_millis(quiet_at - now));
            }
            let started = clock_ms();
            (self.action)();
            self.done.fetch_add(1, Ordering::SeqCst);
            self.pending.store(false, Ordering::SeqCst);
            // An ask that came while the action ran saw `pending` set and left it to this
            // thread: go round again (unless a new ask already started a thread of its own).
            let asked_meanwhile = self.last_ask.load(Ordering::SeqCst) >= started;
            if !asked_meanwhile || !self.claim() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nothing() {}

    /// Asks in a burst make one run, after the burst settles; a later burst makes another.
    #[test]
    fn a_burst_of_asks_runs_once_after_it_settles() {
        static D: Debounced = Debounced::new(nothing);
        let runs = || D.done.load(Ordering::SeqCst);
        if ask_every(&D, Duration::from_millis(40), Duration::from_millis(200)) {
            assert_eq!(runs(), 0, "not while the burst goes on");
        }
        wait_for(|| runs() >= 1);
        let after_first = runs();
        std::thread::sleep(SETTLE * 2);
        assert_eq!(runs(), after_first, "one burst, no further run");
        D.ask();
        wait_for(|| runs() > after_first);
    }

    /// Asks every `gap` for `lasting`; returns whether no pause between asks, up to now,
    /// reached [`SETTLE`] (a loaded machine may stretch a sleep past it: then the asks were
    /// two bursts, and a run in between is right).
    fn ask_every(d: &'static Debounced, gap: Duration, lasting: Duration) -> bool {
        let until = std::time::Instant::now() + lasting;
        let mut last = std::time::Instant::now();
        let mut widest = Duration::ZERO;
        while std::time::Instant::now() < until {
            d.ask();
            widest = widest.max(last.elapsed());
            last = std::time::Instant::now();
            std::thread::sleep(gap);
        }
        widest.max(last.elapsed()) < SETTLE
    }

    fn wait_for(ok: impl Fn() -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(std::time::Instant::now() < until, "no run within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Under a steady stream of asks (a drain's returns) it waits: one run once the stream ends.
    #[test]
    fn a_steady_stream_of_asks_runs_once_when_it_ends() {
        static D: Debounced = Debounced::new(nothing);
        let runs = || D.done.load(Ordering::SeqCst);
        if ask_every(&D, Duration::from_millis(30), SETTLE * 6) {
            assert_eq!(runs(), 0, "not while the asks go on");
        }
        wait_for(|| runs() >= 1);
    }

    /// A map that grew with a burst gives its table back once a quarter or less of it is used,
    /// and not before; a small one is left alone.
    #[test]
    fn a_map_that_grew_with_a_burst_shrinks_once_it_is_sparse() {
        let mut m: HashMap<u32, [u8; 64]> = (0..256).map(|i| (i, [0; 64])).collect();
        let grown = m.capacity();
        m.retain(|k, _| *k < 150);
        shrink_sparse(&mut m);
        // (Removals leave tombstones, which `capacity` does not count: compare loosely.)
        assert!(
            m.capacity() >= 256,
            "150 of {grown}: not sparse yet, {} kept",
            m.capacity()
        );
        m.retain(|k, _| *k < 8);
        shrink_sparse(&mut m);
        assert!(
            m.capacity() < grown / 8,
            "8 left of {grown}: {} kept",
            m.capacity()
        );
        assert_eq!(m.len(), 8);
        let mut small: HashMap<u32, u32> = HashMap::with_capacity(SPARSE_MIN / 2);
        let cap = small.capacity();
        shrink_sparse(&mut small);
        assert_eq!(small.capacity(), cap, "a small map is left alone");
        let mut q: VecDeque<u32> = (0..256).collect();
        q.truncate(3);
        shrink_sparse_queue(&mut q);
        assert!(q.capacity() < 32, "{}", q.capacity());
    }

    /// The daemon's own trims the heap (glibc's `malloc_trim`) without trouble.
    #[test]
    fn the_heap_is_trimmed_after_a_burst() {
        let before = trims();
        after_burst();
        wait_for(|| trims() > before);
    }
}
