//! The report of a vanished device, exactly once across crashes ([`DeviceRecord::vanish_unreported`]).
//!
//! With a reporter that confirms ([`Engine::report_vanished_with_acks`], `dranet run` with its
//! kubelet side): a device judged gone is saved `Gone` and `vanish_unreported` (awaited), then its
//! `Vanished` activity goes out; the reporter sends the pod's event and the claim's status and
//! then calls [`Engine::vanish_reported`], which clears the flag (awaited) and lets the record
//! end. A restart's reconcile sends the activity again for every device still flagged
//! ([`Engine::resend_unreported`]); the event's name is fixed by pod, record and device, so a
//! report that did go out before the kill is not added twice. Without such a reporter (`dranet
//! release-all`, `--no-dra`, the unit tests) nothing is flagged and flags found on disk are
//! ignored: nobody would clear them.

use std::sync::atomic::Ordering;

use tracing::{info, warn};

use super::activity::ActivityKind;
use super::{Engine, Owner, RescueError};
use crate::state::{DeviceRecord, DeviceState, Durability, RecordKey, Transition};

impl Engine {
    /// A reporter will confirm every vanished device's report with [`Engine::vanish_reported`]:
    /// from now on a device judged gone is flagged `vanish_unreported` until it does, and its
    /// record waits. Call before the start-up reconcile, with the reporter's activity receiver
    /// already subscribed.
    pub fn report_vanished_with_acks(&self) {
        self.inner.vanish_acks.store(true, Ordering::Release);
    }

    /// Whether reports of vanished devices are confirmed ([`Engine::report_vanished_with_acks`]).
    pub(super) fn vanish_acks(&self) -> bool {
        self.inner.vanish_acks.load(Ordering::Acquire)
    }

    /// Whether record `r` must stay for a report still to be confirmed.
    pub(super) fn waits_for_a_report(&self, r: &crate::state::PodRecord) -> bool {
        self.vanish_acks() && r.devices.iter().any(unreported)
    }

    /// The reporter's sink took the report of vanished device `device` of record `record`
    /// (`pod_uid`'s): its flag is cleared (awaited) and the record ends if nothing else keeps it
    /// (its netns gone; otherwise RemovePodSandbox, Synchronize or the sweep ends it). A record
    /// or device no longer flagged is a no-op.
    pub async fn vanish_reported(&self, pod_uid: &str, record: &str, device: &str) {
        // Named as the feed named it ([`Owner::uid_str`]): no record is of anything else.
        let Some(owner) = Owner::from_feed(pod_uid) else {
            return;
        };
        if self.cleared_and_ended(&owner, record, device).await {
            self.prune_lock(&owner);
        }
    }

    /// [`Engine::vanish_reported`] under the pod's lock: whether the record ended.
    async fn cleared_and_ended(&self, owner: &Owner, record: &str, device: &str) -> bool {
        let _owner = self.own(owner).await;
        let found = self.cp().pods.get(record).and_then(|r| {
            let i = r
                .devices
                .iter()
                .position(|d| d.device == device && unreported(d))?;
            Some((r.key(), i))
        });
        let Some((key, i)) = found else {
            return false;
        };
        if let Err(e) = self
            .transition(
                &key,
                Transition::VanishReported { device: i },
                Durability::Awaited,
            )
            .await
        {
            warn!(record = %key, device, error = %crate::telemetry::chain(&e), "cannot record that a vanished device was reported");
            return false;
        }
        super::lock(&self.inner.vanish_sent).remove(&(key.clone(), device.to_owned()));
        info!(record = %key, device, "vanished device reported");
        match self.drop_if_torn_down(&key).await {
            Ok(ended) => ended,
            Err(e) => {
                warn!(record = %key, error = %crate::telemetry::chain(&e), "cannot drop the record");
                false
            }
        }
    }

    /// At start-up: the report of every device still `vanish_unreported` goes out again (a
    /// kill between its write-ahead and the reporter's confirmation), but for those this
    /// process sent itself and waits for (a reconcile after lost events). Returns how many.
    pub(super) fn resend_unreported(&self) -> usize {
        if !self.vanish_acks() {
            return 0;
        }
        let pending: Vec<(Owner, RecordKey, DeviceRecord)> = self
            .cp()
            .records()
            .flat_map(|r| {
                r.devices
                    .iter()
                    .filter(|d| unreported(d))
                    .map(|d| (Owner::of(r), r.key(), d.clone()))
            })
            .filter(|(_, key, d)| {
                super::lock(&self.inner.vanish_sent).insert((key.clone(), d.device.clone()))
            })
            .collect();
        for (owner, key, d) in &pending {
            info!(record = %key, device = d.device, "a vanished device's report is not confirmed: sent again");
            self.send_vanished(owner, key, d);
        }
        pending.len()
    }

    /// Records device `i` of sandbox `key` as gone and reports it once: a WARN, the activity
    /// feed (the pod's Warning event, its claim's status, device health) and
    /// `dranet_devices_vanished_total` (counted by the process that judged it gone). With a
    /// confirming reporter, `Gone` and `vanish_unreported` are on disk before the report goes
    /// out; without one the return's last save carries `Gone`.
    pub(super) async fn mark_gone(
        &self,
        owner: &Owner,
        key: &RecordKey,
        i: usize,
        d: &DeviceRecord,
    ) -> Result<(), RescueError> {
        let acks = self.vanish_acks();
        let durability = if acks {
            Durability::Awaited
        } else {
            Durability::Staged
        };
        self.transition(
            key,
            Transition::DeviceGone {
                device: i,
                unreported: acks,
            },
            durability,
        )
        .await?;
        self.inner.metrics.vanished.inc();
        if acks {
            super::lock(&self.inner.vanish_sent).insert((key.clone(), d.device.clone()));
        }
        warn!(
            device = d.device,
            host_name = d.snapshot.name,
            "device no longer exists anywhere (deleted while in the pod): its record ends"
        );
        self.send_vanished(owner, key, d);
        Ok(())
    }

    /// The report of gone device `d` of sandbox `key` into the activity feed: the same when
    /// [`Engine::mark_gone`] sends it and when [`Engine::resend_unreported`] sends it again, so
    /// the reporter names the same event both times.
    fn send_vanished(&self, owner: &Owner, key: &RecordKey, d: &DeviceRecord) {
        self.record(
            owner,
            ActivityKind::Vanished {
                device: d.device.clone(),
                host_name: d.snapshot.name.clone(),
                record: key.to_string(),
            },
        );
    }
}

/// Whether `d` is a gone device whose report is not confirmed.
fn unreported(d: &DeviceRecord) -> bool {
    d.state == DeviceState::Gone && d.vanish_unreported
}
