//! The publish loop: rescan the inventory when asked (rtnetlink link events, devices coming
//! home, kubelet re-registration) once the requests have been quiet for `settle`, at most once
//! per `min_interval`, or every `max_interval`; re-publish the slices when the devices changed
//! (always, when a re-publish was forced); retry a failed publish with backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{Publisher, SliceController};
use crate::inventory::{InventoryError, SharedInventory};

/// Upstream's `--inventory-min-poll-interval` / `--inventory-max-poll-interval` defaults.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(2);
pub const DEFAULT_MAX_INTERVAL: Duration = Duration::from_secs(60);

/// Asks the loop for a rescan; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct RescanHandle {
    notify: Arc<Notify>,
    force: Arc<AtomicBool>,
}

impl RescanHandle {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Rescan soon; publish if something changed.
    pub fn request_rescan(&self) {
        self.notify.notify_one();
    }

    /// Rescan soon and publish even if nothing changed (kubelet wiped the slices).
    pub fn request_republish(&self) {
        self.force.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// A burst of link events is over after this much quiet (a new NIC is renamed by udev a few
/// milliseconds after it appears: scanning at its first event would publish the kernel's name).
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(150);
/// A burst that never goes quiet is scanned after this long anyway.
pub const DEFAULT_SETTLE_MAX: Duration = Duration::from_secs(1);

/// Timing of the loop.
#[derive(Clone, Copy, Debug)]
pub struct LoopTiming {
    pub min_interval: Duration,
    pub max_interval: Duration,
    /// Debounce: after a request, wait until none came for this long...
    pub settle: Duration,
    /// ...but at most this long.
    pub settle_max: Duration,
}

impl Default for LoopTiming {
    fn default() -> Self {
        Self {
            min_interval: DEFAULT_MIN_INTERVAL,
            max_interval: DEFAULT_MAX_INTERVAL,
            settle: DEFAULT_SETTLE,
            settle_max: DEFAULT_SETTLE_MAX,
        }
    }
}

/// Runs until `shutdown` turns true. `scan` is blocking (it runs on the blocking pool).
pub async fn publish_loop<P, S, D>(
    scan: S,
    inventory: SharedInventory,
    mut controller: SliceController<P>,
    handle: RescanHandle,
    timing: LoopTiming,
    mut shutdown: watch::Receiver<bool>,
) where
    P: Publisher,
    S: Fn() -> Result<D, InventoryError> + Send + Sync + 'static,
    D: crate::inventory::IntoDeviceList + Send + 'static,
{
    let scan = Arc::new(scan);
    let mut last_scan: Option<Instant> = None;
    // After a failed publish: the wait before the next attempt (doubling from min_interval up to
    // max_interval, jittered so that nodes that lost the API server together do not return in
    // lockstep).
    let mut backoff = crate::backoff::Backoff::new(timing.min_interval, timing.max_interval);
    let mut retry: Option<Duration> = None;
    loop {
        if let Some(t) = last_scan {
            // Wait for a request, the periodic rescan or the retry.
            let next = t + retry.map_or(timing.max_interval, |r| r.min(timing.max_interval));
            let requested = tokio::select! {
                () = handle.notify.notified() => true,
                () = tokio::time::sleep_until(next) => false,
                _ = shutdown.wait_for(|s| *s) => return,
            };
            if requested {
                // Rate limit: no sooner than `min_interval` after the last scan. Waited for only
                // when a request came: a timer armed after every scan would wake an idle node
                // `min_interval` after each periodic rescan (issue 41). Requests coming meanwhile
                // are folded into this one (the notify keeps one permit).
                tokio::select! {
                    () = tokio::time::sleep_until(t + timing.min_interval) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
                // Debounce: scan once the burst of requests is over.
                let cap = Instant::now() + timing.settle_max;
                loop {
                    let quiet = (Instant::now() + timing.settle).min(cap);
                    tokio::select! {
                        () = handle.notify.notified() => {}
                        () = tokio::time::sleep_until(quiet) => break,
                        _ = shutdown.wait_for(|s| *s) => return,
                    }
                }
            }
        }
        last_scan = Some(Instant::now());
        let s = scan.clone();
        let started = std::time::Instant::now();
        let scanned = tokio::task::spawn_blocking(move || s()).await;
        if let Some(m) = controller.metrics() {
            m.scanned(started.elapsed().as_secs_f64());
        }
        let devices = match scanned {
            Ok(Ok(d)) => d.into_list(),
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::telemetry::chain(&e), "inventory scan failed");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::chain(&e), "inventory scan task failed");
                continue;
            }
        };
        inventory.replace(devices.clone());
        let force = handle.force.swap(false, Ordering::SeqCst);
        let res = if force {
            controller.publish_shared(&devices).await.map(|()| true)
        } else {
            controller.update_shared(&devices).await
        };
        match res {
            Ok(true) => {
                retry = None;
                backoff.reset();
                tracing::info!(
                    devices = devices.len(),
                    generation = controller.generation().unwrap_or_default(),
                    "published ResourceSlices"
                );
            }
            Ok(false) => {
                retry = None;
                backoff.reset();
            }
            Err(e) => {
                let wait = backoff.next_delay();
                retry = Some(wait);
                tracing::warn!(
                    error = %e.reason(),
                    retry_in = ?wait,
                    "publishing ResourceSlices failed"
                );
                handle.force.store(true, Ordering::SeqCst);
            }
        }
        // What the scan and the build allocated is free now: hand it back (off the workers).
        drop(devices);
        let _ = tokio::task::spawn_blocking(crate::sys::os::release_freed_heap).await;
    }
}

/// Requests a rescan on every host link change (RTNLGRP_LINK), until `shutdown`. The changes are
/// counted, not decoded: a scan reads the links anyway.
pub async fn link_events(
    handle: RescanHandle,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), InventoryError> {
    let mut changes = crate::sys::rtnl::LinkChanges::open().map_err(|source| InventoryError::Io {
        what: "rtnetlink link monitor",
        source,
    })?;
    loop {
        tokio::select! {
            r = changes.next() => match r {
                Ok(_) => handle.request_rescan(),
                Err(source) => return Err(InventoryError::Io {
                    what: "rtnetlink link monitor",
                    source,
                }),
            },
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    Ok(())
}
