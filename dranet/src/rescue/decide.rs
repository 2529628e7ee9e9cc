//! Rescue decisions: which lifecycle event means which action on which pod. Pure functions of
//! the checkpoint and one event, so the rules are easy to read and to test.
//!
//! | event | condition | action |
//! |---|---|---|
//! | `NetnsUnmounted` (ret 0) / `NetnsUnlinked` (ret 0) | path or identity of an attached pod's netns | rescue the pod |
//! | `NsfsUnmounting` (tier B) | identity of an attached pod's netns | rescue the pod |
//! | `NetnsReleased` (tier B) | identity of an attached pod's netns | rescue the pod (cannot happen while pinned; defensive) |
//! | `LinkAppeared` in the host | MAC / permanent MAC / name of a device we believe is in a pod | repair that device |
//! | `Lost` | — | reconcile everything |
//!
//! Not a trigger: "the last task in the netns exited" (CRI-O runs pods without an infra process),
//! `cleanup_net` queued (tier A has no identity; a pinned netns cannot reach it anyway).

use crate::state::{Checkpoint, DeviceState, PodPhase, PodRecord};
use crate::watch::{EventKind, LifecycleEvent};

/// What the engine should do about one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Bring every device of the pod home now (netns teardown started at `at`, CLOCK_MONOTONIC ns).
    Rescue {
        pod_uid: String,
        trigger: &'static str,
        at: u64,
    },
    /// A managed device showed up in the host without us: restore it.
    Repair {
        pod_uid: String,
        device: String,
        ifindex: u32,
    },
    /// Events were lost: re-check every pod.
    Reconcile,
}

/// `/var/run/...` and `/run/...` are the same place on every distro dranet supports.
#[must_use]
pub fn normalize_path(p: &str) -> &str {
    p.strip_prefix("/var")
        .filter(|rest| rest.starts_with("/run/"))
        .unwrap_or(p)
}

fn attached(pod: &PodRecord) -> bool {
    matches!(
        pod.phase,
        PodPhase::Attaching | PodPhase::Attached | PodPhase::Returning
    ) && pod.has_devices_out()
}

fn pod_by_path_or_id<'a>(cp: &'a Checkpoint, ev: &LifecycleEvent) -> Option<&'a PodRecord> {
    let id = ev.netns();
    let path = ev.path().map(normalize_path);
    cp.pods.values().filter(|p| attached(p)).find(|p| {
        id.is_some_and(|id| id == p.netns)
            || path.is_some_and(|path| p.netns_path.to_str().map(normalize_path) == Some(path))
    })
}

fn rescue(pod: &PodRecord, trigger: &'static str, ev: &LifecycleEvent) -> Vec<Action> {
    vec![Action::Rescue {
        pod_uid: pod.pod_uid.clone(),
        trigger,
        at: ev.time,
    }]
}

/// The actions one event calls for.
#[must_use]
pub fn decide(cp: &Checkpoint, ev: &LifecycleEvent) -> Vec<Action> {
    match &ev.kind {
        EventKind::NetnsUnmounted { ret: 0, .. } => {
            pod_by_path_or_id(cp, ev).map_or_else(Vec::new, |p| rescue(p, "netns_unmounted", ev))
        }
        EventKind::NetnsUnlinked { ret: 0, .. } => {
            pod_by_path_or_id(cp, ev).map_or_else(Vec::new, |p| rescue(p, "netns_unlinked", ev))
        }
        EventKind::NsfsUnmounting { netns: Some(id), .. } => cp
            .pods
            .values()
            .find(|p| attached(p) && p.netns == *id)
            .map_or_else(Vec::new, |p| rescue(p, "nsfs_unmounting", ev)),
        EventKind::NetnsReleased { netns, .. } => cp
            .pods
            .values()
            .find(|p| attached(p) && p.netns == *netns)
            .map_or_else(Vec::new, |p| rescue(p, "netns_released", ev)),
        EventKind::LinkAppeared {
            ifindex,
            mac,
            perm_mac,
            ..
        } => returned_device(cp, *ifindex, mac.as_deref(), perm_mac.as_deref()),
        EventKind::Lost { .. } => vec![Action::Reconcile],
        _ => Vec::new(),
    }
}

fn same_mac(a: Option<&str>, b: Option<&str>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if !a.is_empty() && a.eq_ignore_ascii_case(b))
}

/// A device appeared in the host: is it one we think is in a pod (the kernel returned it)?
fn returned_device(cp: &Checkpoint, ifindex: u32, mac: Option<&str>, perm_mac: Option<&str>) -> Vec<Action> {
    for pod in cp.pods.values() {
        for d in &pod.devices {
            if !matches!(d.state, DeviceState::InPod | DeviceState::Moving) {
                continue;
            }
            let s = &d.snapshot;
            let hit = same_mac(perm_mac, s.perm_mac.as_deref())
                || same_mac(perm_mac, d.permanent_mac.as_deref())
                || same_mac(mac, s.mac.as_deref())
                || same_mac(mac, d.pod_mac.as_deref());
            if hit {
                return vec![Action::Repair {
                    pod_uid: pod.pod_uid.clone(),
                    device: d.device.clone(),
                    ifindex,
                }];
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
