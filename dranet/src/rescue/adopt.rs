//! Adoption: a running sandbox dranet has no record of, whose netns holds devices allocated to
//! its pod by this driver, is pinned and protected as if dranet had attached it. This covers pods
//! started by upstream dranet before a switch, and a lost or corrupt checkpoint.
//!
//! What says a link in the pod's netns is one of ours is the kernel, never a name or a MAC: the
//! link's parent device (`IFLA_PARENT_DEV_NAME` on its bus) resolves, through sysfs, to the PCI
//! address of a device allocated to the pod (from the plan, or from the claims and the attributes
//! this driver published). A device without a PCI address (a veth, a virtual device) cannot be
//! recognised in a netns dranet did not put it in, and is left alone (logged).
//!
//! Its host state before it moved is unknown: at teardown an adopted device comes home under its
//! host name with its permanent MAC and the MTU it has, and is set up; addresses, offloads and
//! sysctls are not restored (there is no snapshot of them).

use std::path::Path;

use serde::Serialize;
use tracing::{info, warn};

use super::{Engine, Live, RescueError, SandboxInfo};
use crate::ids::PodIfindex;
use crate::state::{DeviceAt, DeviceRecord, DeviceState, Durability, PodPhase, PodRecord, Transition};
use crate::sys::link::{LinkSnapshot, Netlink};

/// A device of this driver allocated to a pod, as adoption looks for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Allocated {
    /// ResourceSlice device name.
    pub device: String,
    /// Its name in the host (the slice device name for a netdev, or `dra.net/ifName`).
    pub host_ifname: Option<String>,
    /// PCI address (`dra.net/pciAddress`): its kernel identity anywhere.
    pub pci_address: Option<String>,
    pub rdma_device: Option<String>,
}

/// What [`Engine::adopt`] did for one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum AdoptOutcome {
    /// dranet has a record of this sandbox: nothing to adopt.
    Known,
    /// None of the pod's devices is in the sandbox's netns.
    NothingFound { unidentified: Vec<String> },
    /// Pinned and recorded: these devices (by slice device name) come home at teardown.
    Adopted {
        devices: Vec<String>,
        unidentified: Vec<String>,
    },
}

/// The PCI address behind a parent device `<bus>/<name>` (`pci/0000:3b:00.1`,
/// `virtio/virtio2` → the virtio device's PCI function), read from sysfs (not per netns).
#[must_use]
pub fn parent_pci_address(sysfs: &Path, parent: &str) -> Option<String> {
    let (bus, name) = parent.split_once('/')?;
    if bus.is_empty() || name.is_empty() || name.contains('/') || bus.contains('.') {
        return None;
    }
    let real = std::fs::canonicalize(sysfs.join("bus").join(bus).join("devices").join(name)).ok()?;
    crate::inventory::pci_address_of(&real)
}

impl Engine {
    /// Adopts the running sandbox `sb` (no record of it) if its netns holds any of `devices` by
    /// kernel identity: pins the netns and records the devices found, so they come home at
    /// teardown in either order.
    pub async fn adopt(&self, sb: &SandboxInfo, devices: &[Allocated]) -> Result<AdoptOutcome, RescueError> {
        let _owner = self.own(&sb.uid).await;
        // A record rebuilt from this sandbox's pin (the checkpoint did not load) is named, not
        // adopted a second time.
        let this_netns = |r: &PodRecord| {
            sb.netns
                .as_deref()
                .is_some_and(|p| self.inner.kernel.open_netns(p).is_ok_and(|ns| ns.id() == r.netns))
        };
        if self
            .name_recovered_record(&sb.uid, &sb.sandbox, this_netns)
            .await?
        {
            return Ok(AdoptOutcome::Known);
        }
        let key = sb.key();
        if self.cp().pods.contains_key(&key) || self.cp().records_of(&sb.uid).any(PodRecord::has_devices_out)
        {
            return Ok(AdoptOutcome::Known);
        }
        let Some(path) = sb.netns.as_deref() else {
            return Ok(AdoptOutcome::NothingFound {
                unidentified: Vec::new(),
            });
        };
        let netns = self
            .inner
            .kernel
            .open_netns(path)
            .map_err(|source| RescueError::Netns {
                pod: (&sb.uid).into(),
                path: path.to_owned(),
                source,
            })?;
        if netns.id() == self.inner.host.id() {
            return Err(RescueError::HostNetns {
                pod: (&sb.uid).into(),
                path: path.to_owned(),
            });
        }
        let (pod_nl, pod_socket) =
            Netlink::in_netns_kept(&netns, None)
                .await
                .map_err(|source| RescueError::PodNetlink {
                    pod: (&sb.uid).into(),
                    source,
                })?;
        let links = pod_nl.links().await.map_err(|source| RescueError::PodNetlink {
            pod: (&sb.uid).into(),
            source,
        })?;
        let sysfs = self.inner.opts.sysfs.clone();
        let mut found = Vec::new();
        let mut unidentified = Vec::new();
        for d in devices {
            let Some(pci) = d.pci_address.as_deref() else {
                unidentified.push(d.device.clone());
                continue;
            };
            let hit = links.iter().find_map(|m| {
                let s = crate::sys::link::snapshot_of_message(m);
                let parent = s.parent.as_deref()?;
                (s.kind.is_none() && parent_pci_address(&sysfs, parent).as_deref() == Some(pci)).then_some(s)
            });
            match hit {
                Some(in_pod) => found.push(adopted_record(d, in_pod, netns.id())),
                None => unidentified.push(d.device.clone()),
            }
        }
        if found.is_empty() {
            return Ok(AdoptOutcome::NothingFound { unidentified });
        }
        let names: Vec<String> = found.iter().map(|r| r.device.clone()).collect();
        let pin_path = self.inner.store.pins_dir().join(sb.sandbox.as_str());
        let record = PodRecord {
            pod_uid: sb.uid.to_string(),
            sandbox_id: sb.sandbox.to_string(),
            namespace: String::new(),
            name: String::new(),
            netns_path: path.to_owned(),
            netns: netns.id(),
            pin: Some(pin_path),
            phase: PodPhase::Attached,
            devices: found,
            recovered: None,
        };
        // A record there already (none was, under the pod's lock) is an error: adoption never
        // takes the place of a record.
        self.transition(&key, Transition::Adopt(record.into()), Durability::Awaited)
            .await?;
        let pin = match self
            .inner
            .kernel
            .create_pin(&netns, &self.inner.store.pins_dir(), &sb.sandbox)
        {
            Ok(p) => p,
            Err(source) => {
                // Not pinned: forget the record again rather than claim a protection we lack. Gone
                // meanwhile (the pod's lock is held: a bug) is the error that surfaces.
                self.transition(&key, Transition::Unadopt, Durability::Awaited)
                    .await?;
                return Err(RescueError::Pin {
                    pod: (&sb.uid).into(),
                    source,
                });
            }
        };
        if let Some(w) = &self.inner.watcher
            && let Err(e) = w.watch_netns(path, netns.id(), pin.netns().as_fd()).await
        {
            warn!(pod = %sb.uid, error = %crate::telemetry::chain(&e), "cannot watch the adopted netns");
        }
        // One connection at a time on the kept socket: this one goes before a return can
        // take the pin and make its own.
        drop(pod_nl);
        self.inner.live_put(
            &key,
            Live {
                pin,
                socket: Some(pod_socket),
            },
        );
        info!(pod = %sb.uid, sandbox = %sb.sandbox, devices = ?names, ?unidentified,
              "adopted a running sandbox dranet had no record of: its devices are pinned and come home at teardown");
        Ok(AdoptOutcome::Adopted {
            devices: names,
            unidentified,
        })
    }
}

/// The name an adopted device comes home under: its host name when known, else its slice device
/// name when the kernel takes it as a netdev name, else the name it has in the pod (what the
/// kernel itself would give it back under). A PCI function's slice name (`pci-dddd-bb-dd-f`, 16
/// bytes) or a `net-<base32>` name is no netdev name: recorded, it would fail every detach with
/// ERANGE and the device could never come home.
fn home_name(d: &Allocated, in_pod: &LinkSnapshot) -> String {
    [d.host_ifname.as_deref(), Some(d.device.as_str())]
        .into_iter()
        .flatten()
        .find(|n| crate::ids::is_ifname(n))
        .map_or_else(|| in_pod.name.clone(), str::to_owned)
}

/// The record of a device found in a pod's netns by its kernel identity. Its host state before
/// the move is unknown: it comes home under its host name ([`home_name`]), with its permanent
/// MAC and current MTU, up.
fn adopted_record(d: &Allocated, in_pod: LinkSnapshot, netns: crate::sys::netns::NetnsId) -> DeviceRecord {
    let host_name = home_name(d, &in_pod);
    let snapshot = LinkSnapshot {
        // Its host ifindex is unknown; the pod's is the best guess (a move keeps the index when
        // it is free) and harmless: the device is found by its parent device, the index only
        // asked for on the way home (refused if taken: then the move goes without it). 0
        // (unknown, as a rebuilt record says) would do as well: it loads again too.
        ifindex: in_pod.ifindex,
        name: host_name,
        mtu: in_pod.mtu,
        mac: in_pod.perm_mac.clone().or_else(|| in_pod.mac.clone()),
        perm_mac: in_pod.perm_mac.clone(),
        up: true,
        kind: None,
        parent: in_pod.parent.clone(),
        identified: true,
        ..LinkSnapshot::default()
    };
    DeviceRecord {
        device: d.device.clone(),
        pod_ifname: in_pod.name.clone(),
        pci_address: d.pci_address.clone(),
        permanent_mac: in_pod.perm_mac,
        rdma_device: d.rdma_device.clone(),
        rdma_in_pod: false,
        pod_mac: None,
        snapshot,
        state: DeviceState::InPod,
        temp_name: None,
        at: Some(DeviceAt {
            ifindex: PodIfindex::new(in_pod.ifindex),
            netns,
        }),
        rebuilt: false,
        return_error: None,
        vanish_unreported: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adopted_device_comes_home_under_a_name_the_kernel_takes() {
        let in_pod = LinkSnapshot {
            name: "net1".into(),
            ..LinkSnapshot::default()
        };
        let dev = |device: &str, host: Option<&str>| Allocated {
            device: device.into(),
            host_ifname: host.map(str::to_owned),
            ..Allocated::default()
        };
        assert_eq!(home_name(&dev("pci-0000-00-05-0", Some("eth1")), &in_pod), "eth1");
        assert_eq!(home_name(&dev("eth1", None), &in_pod), "eth1");
        // No host name known and a slice name the kernel refuses (16 bytes): the pod-side name.
        assert_eq!(home_name(&dev("pci-0000-00-05-0", None), &in_pod), "net1");
        assert_eq!(home_name(&dev("net-mv2gqmbogeyda", None), &in_pod), "net1");
        assert_eq!(home_name(&dev("pci-0000-00-05-0", Some("a/b")), &in_pod), "net1");
    }

    /// An adopted device's host ifindex is its pod ifindex, a real index: the record survives
    /// a restart. At 0 (unknown, as a rebuilt record says) it survives too, with no earlier
    /// version on disk to fall back on.
    #[test]
    fn an_adopted_record_keeps_a_real_host_ifindex_and_loads_again() {
        use crate::state::{Checkpoint, PodPhase, PodRecord, Store};
        let dir = std::env::temp_dir().join(format!("dranet-adopt-reload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir).unwrap();
        let netns = crate::sys::netns::NetnsId::test(7, 9);
        let in_pod = LinkSnapshot {
            ifindex: 5,
            name: "net1".into(),
            mtu: 1500,
            perm_mac: Some("0c:42:a1:00:00:01".into()),
            parent: Some("pci/0000:3b:00.1".into()),
            ..LinkSnapshot::default()
        };
        let d = Allocated {
            device: "pci-0000-3b-00-1".into(),
            host_ifname: Some("eth1".into()),
            pci_address: Some("0000:3b:00.1".into()),
            rdma_device: None,
        };
        let dev = adopted_record(&d, in_pod, netns);
        assert_eq!((dev.snapshot.ifindex, dev.snapshot.name.as_str()), (5, "eth1"));
        let record = |dev: DeviceRecord, sandbox: &str| PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: sandbox.into(),
            namespace: String::new(),
            name: String::new(),
            netns_path: "/run/netns/x".into(),
            netns,
            pin: Some(store.pins_dir().join(sandbox)),
            phase: PodPhase::Attached,
            devices: vec![dev],
            recovered: None,
        };
        let mut cp = Checkpoint::default();
        let r = record(dev.clone(), "sb-1");
        cp.pods.insert(r.key(), r.into());
        store.save(&cp).unwrap();
        let loaded = store.load_or_recover().cp.pods;
        assert_eq!(loaded, cp.pods);
        let mut unknown = dev;
        unknown.snapshot.ifindex = 0;
        let r = record(unknown, "sb-2");
        cp.pods.insert(r.key(), r.into());
        store.save(&cp).unwrap();
        let _ = std::fs::remove_file(store.records_dir().join("pod_uid-1_sb-2.json.prev"));
        assert_eq!(store.load_or_recover().cp.pods, cp.pods);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_parent_resolves_to_its_pci_function_through_sysfs() {
        let root = std::env::temp_dir().join(format!("dranet-adopt-sysfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dev = root.join("devices/pci0000:00/0000:00:04.0/virtio3");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(root.join("bus/virtio/devices")).unwrap();
        std::os::unix::fs::symlink(&dev, root.join("bus/virtio/devices/virtio3")).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            root.join("devices/pci0000:00/0000:00:04.0"),
            root.join("bus/pci/devices/0000:00:04.0"),
        )
        .unwrap();
        assert_eq!(
            parent_pci_address(&root, "virtio/virtio3").as_deref(),
            Some("0000:00:04.0")
        );
        assert_eq!(
            parent_pci_address(&root, "pci/0000:00:04.0").as_deref(),
            Some("0000:00:04.0")
        );
        for bad in [
            "virtio/virtio9",
            "virtio",
            "/virtio3",
            "virtio/../x",
            "../bus/virtio3",
        ] {
            assert_eq!(parent_pci_address(&root, bad), None, "{bad}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }
}
