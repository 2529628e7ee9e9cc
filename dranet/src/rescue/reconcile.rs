//! Start-up (and lost-event) reconcile: make the checkpoint true again.
//!
//! For every sandbox with devices out (its phase read again once its pod's lock is held: a hook
//! may have changed it meanwhile):
//! * attach was interrupted (`Attaching`) → roll back: every device home;
//! * pin present, runtime's netns path still names the same netns → re-adopt (watch it again);
//! * pin present, path gone or replaced → the runtime tore the pod down while we were away →
//!   bring the devices home through the pin;
//! * pin gone (someone removed it) → the kernel returned or deleted the devices → find them in
//!   the host and repair.
//!
//! Pins in the pins dir that no pod record claims (a checkpoint that did not load, a `.prev` one
//! save behind) are looked into first: one that holds devices of ours gets a record rebuilt from
//! it (`rebuild`), and is then reconciled like any other; the others are released. Records of
//! sandboxes whose netns is gone are dropped ([`Engine::sweep`]).

use std::collections::HashSet;

use serde::Serialize;
use tracing::{info, warn};

use super::{Engine, Live, Owner, RescueError};
use crate::state::{Durability, LoadSource, PodPhase, RecordKey, ReturnReason, Transition};
use crate::sys::netns::{NetnsError, Pin};

/// What a reconcile found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// Pods whose netns still lives: pinned and watched again.
    pub adopted: Vec<String>,
    /// Pods whose devices were brought home.
    pub returned: Vec<String>,
    /// Pods whose devices could not all be brought home (retried on the next reconcile).
    pub failed: Vec<String>,
    /// Pins nobody claimed, released.
    pub stray_pins: usize,
    /// Records rebuilt from pins no record claimed (their devices' host state is unknown).
    pub rebuilt: Vec<String>,
    /// Records of sandboxes whose netns is gone, dropped.
    pub dropped: usize,
}

impl Engine {
    /// Reconciles the checkpoint with the kernel.
    pub async fn reconcile(&self) -> Result<ReconcileReport, RescueError> {
        let mut report = ReconcileReport::default();
        self.recover_pins(&mut report).await;
        let sandboxes: Vec<(Owner, RecordKey)> = self
            .cp()
            .pods
            .values()
            .filter(|p| p.has_devices_out() || p.pin.is_some())
            .map(|p| (Owner::of(p), p.key()))
            .collect();
        for (owner, key) in sandboxes {
            let _owner = self.own(&owner).await;
            // The phase as it is now that we own the pod, not as it was when the list was made.
            let Some(phase) = self
                .cp()
                .pods
                .get(&key)
                .filter(|p| p.has_devices_out() || p.pin.is_some())
                .map(|p| p.phase)
            else {
                continue;
            };
            match self.reconcile_pod(&key, phase).await {
                Ok(true) => report.adopted.push(key.to_string()),
                Ok(false) => report.returned.push(key.to_string()),
                Err(e) => {
                    warn!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), "reconcile: devices not all home");
                    report.failed.push(key.to_string());
                }
            }
        }
        // Host names freed while no event could say so (dranet down, events lost).
        let renames = super::decide::names_waited_for(&self.cp());
        for action in renames {
            if let super::decide::Action::Rename { owner, key, device } = action
                && let Err(e) = self.rename_home(&owner, &key, &device).await
            {
                warn!(pod = %owner, record = %key, device, error = %crate::telemetry::chain(&e), "giving a device its name back failed");
            }
        }
        // Reports of vanished devices a kill cut short go out again (the reporter subscribed
        // before this reconcile).
        self.resend_unreported();
        report.dropped = self.sweep().await;
        self.watch_returned().await;
        // Added to the pins `recover_pins` released (it counted them; this used to overwrite them).
        report.stray_pins += self.release_stray_pins();
        info!(?report, "reconcile done");
        Ok(report)
    }

    /// Returns whether the sandbox was adopted (still running).
    async fn reconcile_pod(&self, key: &RecordKey, phase: PodPhase) -> Result<bool, RescueError> {
        // A `.prev` checkpoint is one save behind: an attach it shows under way may have
        // finished (its last save is what was lost). Trust the kernel, not the record.
        let phase = if phase == PodPhase::Attaching
            && matches!(self.inner.load_source, LoadSource::Previous { .. })
            && self.confirm_attach(key).await
        {
            PodPhase::Attached
        } else {
            phase
        };
        if phase == PodPhase::Attached && self.readopt(key).await {
            return Ok(true);
        }
        if let PodPhase::Returned(why) = phase {
            // Devices home, pin left behind (crash before release): release it now, if it
            // still holds this sandbox's netns.
            let live = self.record_pin(key).await;
            self.finish_return(key, live.map(|pin| Live { pin, socket: None }), why)
                .await?;
            return Ok(false);
        }
        let reason = if phase == PodPhase::Attaching {
            ReturnReason::Rollback
        } else {
            ReturnReason::Reconcile
        };
        self.detach_locked(key, reason).await?;
        Ok(false)
    }

    /// The pin record `key` names, re-opened if it still holds the record's netns. A pin that
    /// holds another netns is never released through this record: the record forgets it
    /// (logged), and the pin stays for whoever it belongs to.
    async fn record_pin(&self, key: &RecordKey) -> Option<Pin> {
        let (p, id) = self
            .cp()
            .pods
            .get(key)
            .and_then(|r| Some((r.pin.clone()?, r.netns)))?;
        match self.inner.kernel.reopen_pin_as(&p, id) {
            Ok(pin) => Some(pin),
            Err(e) => {
                if matches!(e, crate::sys::netns::NetnsError::PinMismatch { .. }) {
                    warn!(record = %key, pin = %p.display(), error = %crate::telemetry::chain(&e), "the record's pin does not hold its netns: left alone, the record forgets it");
                }
                if let Err(e) = self
                    .transition(key, Transition::SetPin(None), Durability::Awaited)
                    .await
                {
                    warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot record that the pin is not the record's");
                }
                None
            }
        }
    }

    /// Re-opens the pin of a pod whose runtime path still names the pinned netns.
    async fn readopt(&self, key: &RecordKey) -> bool {
        let Some((path, id, pin_path)) = self
            .cp()
            .pods
            .get(key)
            .map(|r| (r.netns_path.clone(), r.netns, r.pin.clone()))
        else {
            return false;
        };
        if super::lock(&self.inner.live).contains_key(key) {
            // Held by this process already (a reconcile at runtime, after lost events): still
            // running only if the runtime's path still names its netns.
            return self.inner.kernel.open_netns(&path).is_ok_and(|ns| ns.id() == id);
        }
        let Some(Live { pin, .. }) = self.repin(key, pin_path.as_deref()).await else {
            return false;
        };
        let alive =
            self.inner.kernel.open_netns(&path).is_ok_and(|ns| ns.id() == id) && pin.netns().id() == id;
        if !alive {
            // Keep the pin for the detach that follows.
            self.inner.live_put(key, Live { pin, socket: None });
            return false;
        }
        if let Some(w) = &self.inner.watcher
            && let Err(e) = w.watch_netns(&path, id, pin.netns().as_fd()).await
        {
            warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot watch the re-adopted netns");
        }
        self.inner.live_put(key, Live { pin, socket: None });
        info!(record = %key, netns = %id, "pod still running: re-adopted");
        // The runtime may have removed the path between our check and the watch: re-check.
        if !path.exists() {
            return false;
        }
        true
    }

    /// Watches the netns of returned sandboxes whose record stays (their teardown drops it).
    async fn watch_returned(&self) {
        let Some(w) = &self.inner.watcher else { return };
        let returned: Vec<(std::path::PathBuf, crate::sys::netns::NetnsId)> = self
            .cp()
            .pods
            .values()
            .filter(|r| matches!(r.phase, PodPhase::Returned(_)))
            .map(|r| (r.netns_path.clone(), r.netns))
            .collect();
        for (path, id) in returned {
            if let Ok(ns) = self.inner.kernel.open_netns(&path)
                && ns.id() == id
                && let Err(e) = w.watch_netns(&path, id, ns.as_fd()).await
            {
                warn!(netns = %id, error = %crate::telemetry::chain(&e), "cannot watch a returned sandbox's netns");
            }
        }
    }

    /// Releases pins no pod record refers to.
    fn release_stray_pins(&self) -> usize {
        let claimed: HashSet<_> = self.cp().pods.values().filter_map(|p| p.pin.clone()).collect();
        let Ok(pins) = self.inner.kernel.list_pins(&self.inner.store.pins_dir()) else {
            return 0;
        };
        let mut n = 0;
        for p in pins.into_iter().filter(|p| !claimed.contains(p)) {
            let released = match self.inner.kernel.reopen_pin(&p) {
                Ok(pin) => self.inner.kernel.release_pin(pin),
                // A pin file that holds no netns (dranet killed between making the mount point
                // and mounting the netns on it): nothing to lose, so it goes.
                Err(NetnsError::NotANamespace { .. }) => self.inner.kernel.release_pin_path(&p),
                Err(e) => Err(e),
            };
            match released {
                Ok(()) => n += 1,
                Err(e) => {
                    warn!(pin = %p.display(), error = %crate::telemetry::chain(&e), "cannot release a stray pin")
                }
            }
        }
        n
    }

    /// From now on every attach is refused ([`RescueError::Uninstalling`]): the daemon is being
    /// uninstalled and [`Engine::release_all`] brings everything home.
    pub fn stop_attaching(&self) {
        self.inner
            .attaching_stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`Engine::stop_attaching`] was called.
    #[must_use]
    pub fn attaching_stopped(&self) -> bool {
        self.inner
            .attaching_stopped
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Brings every device of every sandbox home, removes all pins and drops every record
    /// (uninstall). Plans of prepared claims are kept: they are kubelet's, and a daemon started
    /// again still serves those pods' new sandboxes.
    /// Works from the pins alone when the checkpoint did not load: their records are rebuilt
    /// first.
    pub async fn release_all(&self) -> Result<ReconcileReport, RescueError> {
        let mut report = ReconcileReport::default();
        self.recover_pins(&mut report).await;
        let sandboxes: Vec<(Owner, RecordKey)> =
            self.cp().pods.values().map(|r| (Owner::of(r), r.key())).collect();
        for (owner, key) in sandboxes {
            let _owner = self.own(&owner).await;
            match self.detach_locked(&key, ReturnReason::Hook).await {
                Ok(_) => {
                    report.returned.push(key.to_string());
                    // A record whose pin lingers (devices home before a crash) loses it here.
                    let live = self.record_pin(&key).await;
                    if let Some(pin) = live {
                        let _ = self.inner.kernel.release_pin(pin);
                        self.transition(&key, Transition::SetPin(None), Durability::Awaited)
                            .await?;
                    }
                    if self.drop_record(&key, "release-all").await? {
                        report.dropped += 1;
                    }
                }
                Err(e) => {
                    warn!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), "release-all: devices not all home");
                    report.failed.push(key.to_string());
                }
            }
        }
        report.stray_pins += self.release_stray_pins();
        Ok(report)
    }
}
