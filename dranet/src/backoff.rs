//! Exponential backoff with jitter for calls to the API server: many nodes that lost the API
//! server at once must not come back in lockstep.

use std::hash::BuildHasher;
use std::time::Duration;

/// `d` scaled by a random factor in [0.8, 1.2).
#[must_use]
pub fn jittered(d: Duration) -> Duration {
    // RandomState is seeded per instance from the OS (and a per-thread counter): enough
    // randomness for spreading retries, without a dependency.
    let r = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    #[expect(
        clippy::cast_precision_loss,
        reason = "a factor in [0, 1), precision irrelevant"
    )]
    let frac = (r % 10_000) as f64 / 10_000.0;
    d.mul_f64(0.8 + 0.4 * frac)
}

/// Doubling delays from `first` up to `max`, each jittered.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Option<Duration>,
}

impl Backoff {
    #[must_use]
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: None,
        }
    }

    /// The wait before the next attempt (jittered), doubling the one after.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next.unwrap_or(self.first).min(self.max);
        self.next = Some((d * 2).min(self.max));
        jittered(d)
    }

    /// The last attempt worked: start again from `first`.
    pub fn reset(&mut self) {
        self.next = None;
    }

    /// Whether an attempt failed since the last reset.
    #[must_use]
    pub fn failing(&self) -> bool {
        self.next.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_within_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        let mut seen = Vec::new();
        for want in [2u64, 4, 8, 16, 32, 60, 60] {
            let d = b.next_delay();
            let w = Duration::from_secs(want);
            assert!(d >= w.mul_f64(0.8) && d < w.mul_f64(1.2), "{d:?} vs {w:?}");
            seen.push(d);
        }
        assert!(b.failing());
        b.reset();
        assert!(!b.failing());
        assert!(b.next_delay() < Duration::from_millis(2400));
        // Not all the same: jitter spreads them.
        let many: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| jittered(Duration::from_secs(10))).collect();
        assert!(many.len() > 1);
    }
}
