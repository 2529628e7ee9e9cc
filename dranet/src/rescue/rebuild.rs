// Over 500 lines: a record rebuilt from a pin, from the links found to its naming, with the test that it loads again.
//! Records rebuilt from pins: when no checkpoint has a record of a pinned netns (neither the
//! record's file nor its `.prev` loaded, or `.prev` is one save behind the attach that made the
//! pin), the pin itself says that dranet put devices there, and the kernel says which.
//!
//! **Which links of a pinned netns are ours** (there is no record to say so): a link is taken
//! when both hold —
//!
//! 1. the inventory would publish it if that netns were the host's: the same skip rules
//!    (loopback, the netns's uplink — the link with its default route, i.e. the CNI's primary
//!    interface — and its master descendants) and the daemon's `--filter` (upstream's default
//!    hides veth). A device can only be in a pod because a claim allocated it, and a claim can
//!    only allocate what the inventory publishes;
//! 2. it did not start life in that netns: it has a parent bus device (a PCI function, which no
//!    pod or CNI can create) or its peer or lower device lives in another netns
//!    (`IFLA_LINK_NETNSID`: a veth or macvlan moved in from the host). Links a pod makes inside
//!    its own netns (dummies, bridges, VLANs on our NIC, veth pairs) are never taken.
//!
//! What this can get wrong, and accepts: a secondary CNI interface (Multus) that the filter
//! would publish and whose lower device is in the host is taken as ours and comes home at
//! teardown; a device of ours that holds the pod's default route, or that the filter only
//! matches on attributes a pod-side link lacks (PCI vendor, NUMA node), is left in the pod
//! (the kernel returns a physical NIC when the netns dies, as without dranet).
//!
//! **What comes home, and under which name.** The snapshot taken before the attach is gone, so a
//! rebuilt device ([`DeviceRecord::rebuilt`]) comes home under the host name of its plan when a
//! plan of its pod has a device with the same kernel identity (PCI address or permanent MAC),
//! else under dranet's temporary name `dn<ifindex>` (never a name a pod chose); up (as adopted
//! devices, `adopt`), without addresses, with its permanent MAC when it has one. Its MTU,
//! alias, offloads and IP sysctls stay as the pod left them. All of this is logged when the record is rebuilt and again when
//! the device is home, and `dranet status` shows the record as rebuilt.
//!
//! **Naming.** A rebuilt record has no pod UID (pins are named by sandbox id): its key is
//! `/<sandbox-id>` until a hook or Synchronize names its sandbox (the same sandbox id, or the
//! netns path the record found for it in the mount table), which re-keys it under the pod's
//! UID ([`Engine::name_recovered_record`]). Adoption (Synchronize + claims + kernel identity)
//! plugs in at the same place: it names the record and fills in what the claims say.

use std::path::{Path, PathBuf};

use tracing::{info, warn};

use super::reconcile::ReconcileReport;
use super::{Engine, Owner, RescueError};
use crate::ids::{PodIfindex, PodUid, SandboxId};
use crate::inventory::{self, NetnsTarget, PciIds, ScanOptions, Sysfs};
use crate::state::{
    DeviceAt, DeviceRecord, DeviceState, Durability, LoadSource, Naming, PlannedDevice, PodName, PodPhase,
    PodRecord, RecordKey, Recovered, Transition, pod_key,
};
use crate::sys::link::{self, LinkSnapshot};
use crate::sys::netns::{NetnsId, Pin};

/// A link of a pinned netns taken as ours.
struct Found {
    ifindex: u32,
    name: String,
    identity: LinkSnapshot,
}

impl Engine {
    /// Looks into every pin no record claims: one holding devices of ours gets a rebuilt record
    /// (phase `Attached`, reconciled next like any other); an empty or stale one is released.
    pub(super) async fn recover_pins(&self, report: &mut ReconcileReport) {
        let pins_dir = self.inner.store.pins_dir();
        let Ok(pins) = self.inner.kernel.list_pins(&pins_dir) else {
            return;
        };
        for path in pins {
            let claimed = self
                .cp()
                .pods
                .values()
                .any(|r| r.pin.as_deref() == Some(path.as_path()));
            if claimed {
                continue;
            }
            match self.recover_pin(&path).await {
                Ok(Some(key)) => report.rebuilt.push(key),
                Ok(None) => report.stray_pins += 1,
                Err(e) => {
                    warn!(pin = %path.display(), error = %crate::telemetry::chain(&e), "cannot rebuild a record from the pin")
                }
            }
        }
    }

    /// One unclaimed pin: `Some(key)` of the record rebuilt from it, `None` when it was released.
    async fn recover_pin(&self, path: &Path) -> Result<Option<String>, RescueError> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Ok(pin) = self.inner.kernel.reopen_pin(path) else {
            // Nothing mounted there any more: a leftover file.
            self.inner
                .kernel
                .release_pin_path(path)
                .map_err(|source| RescueError::StrayPin {
                    pin: path.to_owned(),
                    source,
                })?;
            return Ok(None);
        };
        let id = pin.netns().id();
        let known = self.cp().pods.values().any(|r| r.netns == id);
        if known || crate::ids::sandbox_id(&name).is_err() {
            // A second pin of a sandbox we have a record of, or not a name dranet gives a pin.
            self.inner
                .kernel
                .release_pin(pin)
                .map_err(|source| RescueError::StrayPin {
                    pin: path.to_owned(),
                    source,
                })?;
            return Ok(None);
        }
        let found = self.ours_in(path, &pin).await?;
        if found.is_empty() {
            info!(pin = %path.display(), netns = %id, "pin without a record holds no device of ours: released");
            self.inner
                .kernel
                .release_pin(pin)
                .map_err(|source| RescueError::StrayPin {
                    pin: path.to_owned(),
                    source,
                })?;
            return Ok(None);
        }
        let skip = self.inner.store.pins_dir();
        let netns_path = tokio::task::spawn_blocking(move || crate::sys::netns::bind_mounts_of(id, &skip))
            .await
            .ok()
            .and_then(|v| v.into_iter().next())
            .unwrap_or_default();
        let record = self.rebuilt_record(&name, path, id, netns_path, &found);
        let key = record.key();
        let devices: Vec<String> = record
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{} (pod ifindex {}) -> {}",
                    d.pod_ifname,
                    d.at.map_or(0, |a| a.ifindex.get()),
                    d.snapshot.name
                )
            })
            .collect();
        warn!(
            sandbox = name,
            netns = %id,
            netns_path = %record.netns_path.display(),
            devices = ?devices,
            reason = record.recovered.as_ref().map(|r| r.reason.as_str()).unwrap_or_default(),
            "record rebuilt from the pin: its devices come home at teardown, but their state before the attach is unknown: they come home up, without addresses, with their permanent MAC, under the name shown; MTU, alias, offloads and IP sysctls are not restored"
        );
        // A record under its key already (`/<sandbox id>`, which claims no pin) is an error, logged
        // by the caller: the pin is looked at again by the next reconcile.
        self.transition(&key, Transition::Rebuilt(record.into()), Durability::Awaited)
            .await?;
        drop(pin);
        Ok(Some(key.into()))
    }

    /// The links of the pinned netns that are ours (see the module docs).
    async fn ours_in(&self, path: &Path, pin: &Pin) -> Result<Vec<Found>, RescueError> {
        let filter = inventory::Filter::compile(&self.inner.opts.device_filter)
            .ok()
            .flatten();
        let opts = ScanOptions {
            sysfs: Sysfs::new(&self.inner.opts.sysfs),
            netns: NetnsTarget::Path(path.to_owned()),
            move_ib_interfaces: true,
            pci_ids: PciIds::default(),
            filter,
            numa_list: false,
            extra: None,
            keep_uplinks: false,
        };
        let published: Vec<String> = tokio::task::spawn_blocking(move || inventory::scan(&opts))
            .await
            .map_err(|_| RescueError::Task {
                what: "scanning a pinned netns",
            })?
            .map_err(RescueError::Inventory)?
            .into_iter()
            .filter_map(|d| d.ifname)
            .collect();
        let nl = self
            .link_op(
                "rtnetlink in a pinned netns",
                self.inner.kernel.pod_netlink(pin.netns()),
            )
            .await
            .map_err(|source| RescueError::StrayPinNetlink {
                pin: path.to_owned(),
                source,
            })?;
        let links = self
            .link_op("listing a pinned netns's links", nl.links())
            .await
            .map_err(|source| RescueError::StrayPinNetlink {
                pin: path.to_owned(),
                source,
            })?;
        Ok(links
            .iter()
            .filter(|m| link::came_from_elsewhere(m))
            .map(|m| (m, link::snapshot_of_message(m)))
            .filter(|(_, s)| published.contains(&s.name))
            .map(|(m, identity)| Found {
                ifindex: m.header.index,
                name: identity.name.clone(),
                identity,
            })
            .collect())
    }

    fn rebuilt_record(
        &self,
        sandbox: &str,
        pin: &Path,
        id: NetnsId,
        netns_path: PathBuf,
        found: &[Found],
    ) -> PodRecord {
        let reason = match &self.inner.load_source {
            LoadSource::Nothing {
                problem,
                prev_problem,
                ..
            } => format!("{problem}; {prev_problem}"),
            LoadSource::Previous { problem, .. } => {
                format!("{problem}; the previous checkpoint has no record of this pin")
            }
            LoadSource::Absent | LoadSource::Current => "no record of this pin".to_owned(),
        };
        let at = crate::clock::UnixSecs::now();
        PodRecord {
            pod_uid: String::new(),
            sandbox_id: sandbox.to_owned(),
            namespace: String::new(),
            name: String::new(),
            netns_path,
            netns: id,
            pin: Some(pin.to_owned()),
            phase: PodPhase::Attached,
            devices: found.iter().map(|f| rebuilt_device(f, id)).collect(),
            recovered: Some(Recovered { reason, at }),
        }
    }

    /// A record rebuilt from a pin names its sandbox `sandbox` of pod `uid`: the record keyed by
    /// that sandbox id, or the rebuilt record `owns` says is this sandbox's (its netns). It is
    /// re-keyed under the pod's UID, and its devices take the device and host names of the
    /// pod's plan, matched by kernel identity (PCI address, permanent MAC). Returns whether a
    /// record was named. The pod's lock must be held; the rebuilt records' own lock (empty pod
    /// UID) is taken here, so a rescue of the record cannot run meanwhile. This is where
    /// adoption plugs in.
    pub(super) async fn name_recovered_record(
        &self,
        uid: &PodUid,
        sandbox: &SandboxId,
        owns: impl Fn(&PodRecord) -> bool,
    ) -> Result<bool, RescueError> {
        let unnamed = |r: &PodRecord| r.pod_uid.is_empty() && r.recovered.is_some();
        // The key of a record rebuilt from this sandbox's pin: no pod UID yet.
        let by_id = pod_key("", sandbox);
        let exists = self.cp().record(&by_id).is_some_and(unnamed)
            || self.cp().records().any(|r| unnamed(r) && owns(r));
        if !exists {
            return Ok(false);
        }
        let _rebuilt = self.own(&Owner::Unnamed).await;
        let from = {
            let cp = self.cp();
            if cp.record(&by_id).is_some_and(unnamed) {
                Some(by_id)
            } else {
                cp.records().find(|r| unnamed(r) && owns(r)).map(PodRecord::key)
            }
        };
        let Some(from) = from else {
            return Ok(false);
        };
        let key = RecordKey::new(uid, sandbox);
        let naming = {
            let cp = self.cp();
            let plan = cp.plans.get(uid.as_str());
            let devices = cp
                .record(&from)
                .map(|r| planned_devices(r, plan.map_or(&[][..], |p| &p.devices)))
                .unwrap_or_default();
            Naming {
                pod: plan.map(|p| PodName {
                    namespace: p.pod_namespace.clone(),
                    name: p.pod_name.clone(),
                }),
                devices,
            }
        };
        // An error that surfaces (the hook, the attach or the adoption fails, Synchronize logs
        // it), and the rebuilt record stays as it was: gone meanwhile (both locks are held: a
        // bug), or the sandbox has a record of its own with devices out, which it must not
        // lose to this one.
        let rekey = Transition::Rekey {
            to: key.clone(),
            naming,
        };
        self.transition(&from, rekey, Durability::Awaited).await?;
        if let Some(l) = self.inner.live_take(&from) {
            self.inner.live_put(&key, l);
        }
        info!(pod = %uid, sandbox = %sandbox, from = %from, "record rebuilt from a pin now names its pod");
        Ok(true)
    }

    /// A checkpoint from `.prev` shows an attach under way: it finished if every device is in
    /// the pinned netns at the ifindex written ahead for it (and is that device by its
    /// identity). Then the record is marked attached.
    pub(super) async fn confirm_attach(&self, key: &RecordKey) -> bool {
        let Some((pin_path, devices)) = self
            .cp()
            .pods
            .get(key)
            .map(|r| (r.pin.clone(), r.devices.clone()))
        else {
            return false;
        };
        let Some(pin) = pin_path.and_then(|p| self.inner.kernel.reopen_pin(&p).ok()) else {
            return false;
        };
        let Ok(nl) = self
            .link_op(
                "rtnetlink in the pod netns",
                self.inner.kernel.pod_netlink(pin.netns()),
            )
            .await
        else {
            return false;
        };
        for d in &devices {
            let Some(at) = d.at.filter(|a| a.netns == pin.netns().id()) else {
                return false;
            };
            let found = self
                .link_op("looking up a device", nl.link_by_index(at.ifindex.get()))
                .await;
            if !matches!(found, Ok(Some(m)) if link::same_device(&m, &d.snapshot)) {
                return false;
            }
        }
        let done = self
            .transition(key, Transition::ConfirmAttached, Durability::Awaited)
            .await;
        if done.is_ok() {
            warn!(
                record = %key,
                "the previous checkpoint shows this attach under way, but every device is in the pod: taken as attached"
            );
        }
        done.is_ok()
    }

    /// Logs what a return of rebuilt devices could not restore.
    pub(super) fn say_what_was_not_restored(&self, key: &RecordKey, devices: &[DeviceRecord]) {
        let rebuilt: Vec<&str> = devices
            .iter()
            .filter(|d| d.rebuilt)
            .map(|d| d.snapshot.name.as_str())
            .collect();
        if !rebuilt.is_empty() {
            warn!(
                record = %key,
                devices = ?rebuilt,
                "devices of a record rebuilt from a pin are home under these names, up, without addresses; their MTU, alias, offloads and IP sysctls from before the attach were unknown and are not restored"
            );
        }
    }
}

/// The rebuilt devices of `r` that a device of `plan` is by kernel identity ([`same_identity`]):
/// they take its ResourceSlice name and its host name.
fn planned_devices(r: &PodRecord, plan: &[crate::plan::DevicePlan]) -> Vec<PlannedDevice> {
    r.devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.rebuilt)
        .filter_map(|(i, d)| {
            let p = plan.iter().find(|p| same_identity(p, &d.snapshot))?;
            Some(PlannedDevice {
                device: i,
                name: p.device.clone(),
                host_name: p.host_ifname.clone(),
            })
        })
        .collect()
}

/// Whether plan device `p` is the device of `snap` by what the kernel sets (PCI address,
/// permanent MAC); never by a name or a MAC a pod can set.
fn same_identity(p: &crate::plan::DevicePlan, snap: &LinkSnapshot) -> bool {
    let pci = snap.parent.as_deref().and_then(|s| s.strip_prefix("pci/"));
    let by_pci = pci.is_some() && p.pci_address.as_deref() == pci;
    let by_mac = match (&p.permanent_mac, &snap.perm_mac) {
        (Some(a), Some(b)) => {
            matches!((link::parse_mac(a), link::parse_mac(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    };
    by_pci || by_mac
}

/// The record of one link taken as ours: in the pod at its ifindex there; host snapshot unknown
/// (see the module docs for what comes home).
fn rebuilt_device(f: &Found, netns: NetnsId) -> DeviceRecord {
    let host_name = link::temp_name(f.ifindex);
    let pci = f
        .identity
        .parent
        .as_deref()
        .and_then(|s| s.strip_prefix("pci/"))
        .map(str::to_owned);
    let device = pci.as_deref().map_or_else(
        || inventory::netdev_device_name(&host_name),
        inventory::pci_device_name,
    );
    let snapshot = LinkSnapshot {
        // Unknown: `link` then never looks for the device at a host ifindex.
        ifindex: 0,
        name: host_name,
        altnames: f.identity.altnames.clone(),
        alias: f.identity.alias.clone(),
        // 0: not restored.
        mtu: 0,
        mac: f.identity.perm_mac.clone(),
        perm_mac: f.identity.perm_mac.clone(),
        up: true,
        kind: f.identity.kind.clone(),
        parent: f.identity.parent.clone(),
        identified: true,
        ..LinkSnapshot::default()
    };
    DeviceRecord {
        device,
        pod_ifname: f.name.clone(),
        pci_address: pci,
        permanent_mac: f.identity.perm_mac.clone(),
        rdma_device: None,
        rdma_in_pod: false,
        pod_mac: None,
        snapshot,
        state: DeviceState::InPod,
        temp_name: None,
        at: Some(DeviceAt {
            ifindex: PodIfindex::new(f.ifindex),
            netns,
        }),
        rebuilt: true,
        return_error: None,
        vanish_unreported: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Checkpoint, Store};

    /// A rebuilt device's host ifindex is 0 (unknown): its record, named, loads again at the next
    /// start with no earlier version to fall back on, instead of being moved aside as corrupt
    /// and rebuilt from the pin again without its naming.
    #[test]
    fn a_rebuilt_record_loads_again() {
        let dir = std::env::temp_dir().join(format!("dranet-rebuilt-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let netns = NetnsId::test(7, 9);
        let identity = LinkSnapshot {
            name: "net1".into(),
            perm_mac: Some("0c:42:a1:00:00:01".into()),
            parent: Some("pci/0000:3b:00.1".into()),
            ..LinkSnapshot::default()
        };
        let found = Found {
            ifindex: 5,
            name: "net1".into(),
            identity,
        };
        let mut dev = rebuilt_device(&found, netns);
        assert_eq!((dev.snapshot.ifindex, dev.snapshot.name.as_str()), (0, "dn5"));
        // Named by its plan: the host name it comes home under.
        dev.snapshot.name = "eth1".into();
        let record = PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
            namespace: "ns".into(),
            name: "pod".into(),
            netns_path: "/run/netns/x".into(),
            netns,
            pin: Some(store.pins_dir().join("sb-1")),
            phase: PodPhase::Attached,
            devices: vec![dev],
            recovered: Some(Recovered {
                reason: "no record of this pin".into(),
                at: crate::clock::UnixSecs::from_secs(1),
            }),
        };
        let mut cp = Checkpoint::default();
        cp.pods.insert(record.key(), record.into());
        store.save(&cp).unwrap();
        let _ = std::fs::remove_file(store.records_dir().join("pod_uid-1_sb-1.json.prev"));
        let got = store.load_or_recover();
        assert_eq!(got.cp.pods, cp.pods);
        assert!(matches!(got.source, LoadSource::Current), "{:?}", got.source);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
