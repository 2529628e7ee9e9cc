//! The kernel lane: how many device returns run at once, and who goes first.
//!
//! Every netns move (and most link changes) runs under the kernel's one RTNL mutex, and a veth
//! or NIC move holds it through an RCU grace period (`synchronize_net` in
//! `__dev_change_net_namespace`): tens of ms on a busy machine. Device moves of a node are
//! serialized by the kernel whatever dranet does. Starting many at once buys nothing in
//! throughput, and it queues every other RTNL user behind all of them: during a drain of 64 pods
//! a new pod's RunPodSandbox (which needs RTNL for its snapshot, its move and its link-up) would
//! wait behind every queued return at each of its RTNL steps, and blow the runtime's 2 s budget.
//!
//! So returns are *background* work: at most [`BACKGROUND`] devices come home at a time, first
//! come first served. Four, not two: a return waits for RTNL at its lookups and restore steps
//! too, not only at its move, and with two lanes both were often at such a step, so the kernel
//! sat between moves (`perf` of `cargo xtask bench --only churn`: one move in flight for most of
//! the stop phase, one finished every 28 ms against the baseline's 20). With four, churn's stop
//! phase went from 7.3–7.7 s to 6.8–7.1 s (baseline 5.9–6.2), and a newcomer's RunPodSandbox
//! during a drain stayed within 1.08× of a bare attach behind a one-pod-at-a-time drain.
//! An attach is *foreground*: it never waits for the lane, and while one runs no background
//! return starts (those already running finish their device). Work that belongs to an attach
//! (rolling it back, taking the devices out of the pod's older sandbox) is foreground too.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// Device returns in flight at once.
pub const BACKGROUND: usize = 4;

/// The lane of one engine.
pub(super) struct Lane {
    background: Arc<Semaphore>,
    /// Attaches running now.
    foreground: watch::Sender<usize>,
}

/// A background slot: one device on its way home.
pub(super) struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
}

/// Held for the whole of an attach: background returns wait while any is held.
pub(super) struct Foreground {
    count: watch::Sender<usize>,
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.count.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Lane {
    pub(super) fn new() -> Self {
        Self {
            background: Arc::new(Semaphore::new(BACKGROUND)),
            foreground: watch::channel(0).0,
        }
    }

    /// Marks an attach as running until the guard drops.
    pub(super) fn foreground(&self) -> Foreground {
        self.foreground.send_modify(|n| *n += 1);
        Foreground {
            count: self.foreground.clone(),
        }
    }

    /// Waits for a background slot (first come, first served) and for no attach to be running.
    pub(super) async fn background(&self) -> Slot {
        // The semaphore is never closed, so this cannot fail; if it ever did, the return goes
        // ahead without a slot rather than never.
        let permit = self.background.clone().acquire_owned().await.ok();
        let mut rx = self.foreground.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
        Slot { _permit: permit }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn background_waits_for_attaches_and_is_capped() {
        let lane = Arc::new(Lane::new());
        let mut held = Vec::new();
        for _ in 0..BACKGROUND {
            held.push(lane.background().await);
        }
        // Full: one more waits.
        let l = lane.clone();
        let third = tokio::spawn(async move { l.background().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!third.is_finished());
        // An attach starts: a freed slot is not taken while it runs.
        let fg = lane.foreground();
        held.pop();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!third.is_finished(), "a return started during an attach");
        drop(fg);
        let c = tokio::time::timeout(Duration::from_secs(1), third)
            .await
            .expect("the return never started after the attach")
            .expect("task");
        drop((held, c));
        // Two attaches at once; both must end before a return starts.
        let f1 = lane.foreground();
        let f2 = lane.foreground();
        let l = lane.clone();
        let next = tokio::spawn(async move { l.background().await });
        drop(f1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!next.is_finished());
        drop(f2);
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("the return never started")
            .expect("task");
    }
}
