//! Rescue decisions: which lifecycle event means which action on which pod sandbox. Pure
//! functions of the checkpoint and one event, so the rules are easy to read and to test.
//!
//! | event | condition | action |
//! |---|---|---|
//! | `NetnsUnmounted` (ret 0) / `NetnsUnlinked` (ret 0) | path or identity of an attached sandbox's netns | rescue that sandbox |
//! | `NetnsUnmounted` (ret 0) / `NetnsUnlinked` (ret 0) | path or identity of a returned sandbox's netns | forget its record |
//! | `NsfsUnmounting` (tier B) | identity of an attached sandbox's netns | rescue that sandbox |
//! | `NetnsReleased` (tier B) | identity of an attached sandbox's netns | rescue it (cannot happen while pinned; defensive) |
//! | `DeviceMoving` (tier B) | (ifindex, netns) of a device we placed | record where it went (repair it if that is the host) |
//! | `LinkAppeared` in the host | parent device, else permanent MAC, else its own host ifindex, of a device we believe is out; same link kind | repair that device |
//! | `LinkDeleted` / `LinkChanged` in the host | a device home under a temporary name whose host name the link may have freed | give it its name back (if free) |
//! | `Lost` | — | reconcile everything |
//!
//! **Identity.** A device is recognised only by what the kernel sets: its ifindex in a netns we
//! hold, its link kind, its parent device (a PCI function) and its permanent MAC. A MAC a claim
//! wrote (`interface.hardwareAddr`), the device's original MAC or a name are never enough: any
//! host link can carry those (Calico gives every host-side veth the same MAC).
//!
//! Not a trigger: "the last task in the netns exited" (CRI-O runs pods without an infra process),
//! `cleanup_net` queued (tier A has no identity; a pinned netns cannot reach it anyway).

use super::Owner;
use crate::ids::PodIfindex;
use crate::mac::Mac;
use crate::state::{Checkpoint, DeviceAt, DeviceState, PodPhase, PodRecord, RecordKey};
use crate::watch::{EventKind, LifecycleEvent};

/// What told the engine a sandbox's netns is being torn down: the probe event's kind. Its
/// [`RescueTrigger::label`] is the `trigger` label of `dranet_rescue_returns` and what logs,
/// the activity feed and [`super::RescueTiming`] show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RescueTrigger {
    /// The runtime unmounted the netns bind mount.
    NetnsUnmounted,
    /// The runtime unlinked the netns bind mount's path.
    NetnsUnlinked,
    /// The nsfs inode of the netns is being unmounted.
    NsfsUnmounting,
    /// The kernel released the netns.
    NetnsReleased,
}

impl RescueTrigger {
    /// The metric label (`netns_unmounted`, ...).
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::NetnsUnmounted => "netns_unmounted",
            Self::NetnsUnlinked => "netns_unlinked",
            Self::NsfsUnmounting => "nsfs_unmounting",
            Self::NetnsReleased => "netns_released",
        }
    }
}

impl std::fmt::Display for RescueTrigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// What the engine should do about one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Bring every device of the sandbox `key` home now (netns teardown started at `at`,
    /// CLOCK_MONOTONIC ns).
    Rescue {
        owner: Owner,
        key: RecordKey,
        trigger: RescueTrigger,
        at: crate::clock::MonoTime,
    },
    /// A managed device showed up in the host without us: restore it.
    Repair {
        owner: Owner,
        key: RecordKey,
        device: String,
        ifindex: u32,
    },
    /// A device we placed moved to another netns (tier B): record where it is now.
    Moved {
        owner: Owner,
        key: RecordKey,
        device: String,
        to: DeviceAt,
    },
    /// The netns of a sandbox whose devices are all home was torn down: the sandbox can never
    /// run again, so its record goes (containerd sends no RemovePodSandbox for sandboxes it
    /// recovered after a restart).
    Forget { owner: Owner, key: RecordKey },
    /// A host link was deleted or renamed: the host name of device `device`, home under a
    /// temporary name because that name was taken, may be free now: give it back.
    Rename {
        owner: Owner,
        key: RecordKey,
        device: String,
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
    // The identity wins over the path: a path can name a newer netns by now.
    if let Some(id) = id {
        return cp.records().filter(|p| attached(p)).find(|p| p.netns == id);
    }
    cp.records()
        .filter(|p| attached(p))
        .find(|p| path.is_some_and(|path| p.netns_path.to_str().map(normalize_path) == Some(path)))
}

/// A returned sandbox (devices home, pin released) whose netns path or identity the event names.
fn returned_by_path_or_id<'a>(cp: &'a Checkpoint, ev: &LifecycleEvent) -> Option<&'a PodRecord> {
    let returned = |p: &&PodRecord| matches!(p.phase, PodPhase::Returned(_)) && p.pin.is_none();
    if let Some(id) = ev.netns() {
        return cp.records().filter(returned).find(|p| p.netns == id);
    }
    let path = ev.path().map(normalize_path)?;
    cp.records()
        .filter(returned)
        .find(|p| p.netns_path.to_str().map(normalize_path) == Some(path))
}

/// Rescue an attached sandbox, or forget a returned one, whose netns the event says is going.
fn teardown(cp: &Checkpoint, trigger: RescueTrigger, ev: &LifecycleEvent) -> Vec<Action> {
    if let Some(p) = pod_by_path_or_id(cp, ev) {
        return rescue(p, trigger, ev);
    }
    returned_by_path_or_id(cp, ev).map_or_else(Vec::new, |p| {
        vec![Action::Forget {
            owner: Owner::of(p),
            key: p.key(),
        }]
    })
}

fn rescue(pod: &PodRecord, trigger: RescueTrigger, ev: &LifecycleEvent) -> Vec<Action> {
    vec![Action::Rescue {
        owner: Owner::of(pod),
        key: pod.key(),
        trigger,
        at: ev.time,
    }]
}

/// The actions one event calls for.
#[must_use]
pub fn decide(cp: &Checkpoint, ev: &LifecycleEvent) -> Vec<Action> {
    match &ev.kind {
        EventKind::NetnsUnmounted { ret: 0, .. } => teardown(cp, RescueTrigger::NetnsUnmounted, ev),
        EventKind::NetnsUnlinked { ret: 0, .. } => teardown(cp, RescueTrigger::NetnsUnlinked, ev),
        EventKind::NsfsUnmounting { netns: Some(id), .. } => cp
            .pods
            .values()
            .find(|p| attached(p) && p.netns == *id)
            .map_or_else(Vec::new, |p| rescue(p, RescueTrigger::NsfsUnmounting, ev)),
        EventKind::NetnsReleased { netns, .. } => cp
            .pods
            .values()
            .find(|p| attached(p) && p.netns == *netns)
            .map_or_else(Vec::new, |p| rescue(p, RescueTrigger::NetnsReleased, ev)),
        EventKind::DeviceMoving {
            ifindex,
            new_ifindex,
            from,
            to,
            ..
        } => moved_device(cp, *ifindex, *new_ifindex, *from, *to),
        EventKind::LinkAppeared {
            ifindex,
            perm_mac,
            parent,
            kind,
            ..
        } => returned_device(
            cp,
            *ifindex,
            perm_mac.as_deref(),
            parent.as_deref(),
            kind.as_deref(),
        ),
        EventKind::LinkDeleted { name, .. } => name_freed(cp, |d| d.snapshot.name == *name),
        // A rename says the new name only: any device waiting for a name other than that one
        // may have had it freed (the engine checks the name is free before it acts).
        EventKind::LinkChanged { ifindex, name, .. } => name_freed(cp, |d| {
            d.snapshot.name != *name
                && d.temp_name.as_deref() != Some(name.as_str())
                && d.snapshot.ifindex != *ifindex
        }),
        EventKind::Lost { .. } => vec![Action::Reconcile],
        _ => Vec::new(),
    }
}

/// Every device home under a temporary name: a [`Action::Rename`] each (the engine renames those
/// whose name is free).
#[must_use]
pub fn names_waited_for(cp: &Checkpoint) -> Vec<Action> {
    name_freed(cp, |_| true)
}

/// Devices home under a temporary name (`HomeNameBusy`) for which `freed` says their host
/// name may be free now.
fn name_freed(cp: &Checkpoint, freed: impl Fn(&crate::state::DeviceRecord) -> bool) -> Vec<Action> {
    cp.records()
        .flat_map(|pod| {
            pod.devices
                .iter()
                .filter(|d| d.state == DeviceState::HomeNameBusy && d.temp_name.is_some() && freed(d))
                .map(|d| Action::Rename {
                    owner: Owner::of(pod),
                    key: pod.key(),
                    device: d.device.clone(),
                })
        })
        .collect()
}

fn out(state: DeviceState) -> bool {
    matches!(
        state,
        DeviceState::InPod | DeviceState::Moving | DeviceState::Returning
    )
}

/// Tier B saw a device change namespace: if it is one we placed (its ifindex in the netns we
/// recorded), remember where it went.
fn moved_device(
    cp: &Checkpoint,
    ifindex: u32,
    new_ifindex: i32,
    from: crate::sys::netns::NetnsId,
    to: crate::sys::netns::NetnsId,
) -> Vec<Action> {
    for pod in cp.records() {
        for d in pod.devices.iter().filter(|d| out(d.state)) {
            if d.at
                .is_some_and(|a| a.ifindex.get() == ifindex && a.netns == from)
            {
                return vec![Action::Moved {
                    owner: Owner::of(pod),
                    key: pod.key(),
                    device: d.device.clone(),
                    to: DeviceAt {
                        ifindex: PodIfindex::new(u32::try_from(new_ifindex).unwrap_or(ifindex)),
                        netns: to,
                    },
                }];
            }
        }
    }
    Vec::new()
}

/// Both are addresses ([`Mac::parse`]) and they are the same bytes.
fn same_mac(a: Option<&str>, b: Option<&str>) -> bool {
    matches!((a.and_then(Mac::parse), b.and_then(Mac::parse)), (Some(a), Some(b)) if a == b)
}

/// A device appeared in the host: is it one we think is out (the kernel returned it)? Only the
/// kernel's identity counts: the parent device, else the permanent MAC, and the link kind.
fn returned_device(
    cp: &Checkpoint,
    ifindex: u32,
    perm_mac: Option<&str>,
    parent: Option<&str>,
    kind: Option<&str>,
) -> Vec<Action> {
    for pod in cp.records() {
        for d in pod.devices.iter().filter(|d| out(d.state)) {
            let s = &d.snapshot;
            if s.identified && s.kind.as_deref() != kind {
                continue;
            }
            let hit = match (&s.parent, &s.perm_mac) {
                (Some(p), _) => parent == Some(p.as_str()),
                (None, Some(_)) => same_mac(perm_mac, s.perm_mac.as_deref()),
                // No identity that travels: only its own host ifindex (the kernel returns a
                // device there when it is free, and the host never hands it to another link
                // while the device is away); 0, unknown, is none.
                (None, None) => s.identified && s.ifindex > 0 && s.ifindex == ifindex,
            };
            if hit {
                return vec![Action::Repair {
                    owner: Owner::of(pod),
                    key: pod.key(),
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

#[cfg(test)]
#[path = "decide_props.rs"]
mod props;
