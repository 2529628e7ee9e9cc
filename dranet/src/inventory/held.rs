// Over 500 lines: the kept attributes of held devices and the identity rule for their names share one merge (apply); most of the length is its tests.
//! Devices in pods keep their published attributes (upstream's `PersistentResourceSliceAttributes`,
//! always on here), across restarts too.
//!
//! A netdev moved into a pod leaves the host's `/sys/class/net`: a non-PCI device would vanish
//! from the slice and a PCI one would shrink to its PCI attributes, so the scheduler and the
//! Cluster Autoscaler would see a different node while the pod runs. So for every device that is
//! in a pod, the last attributes published while it was home fill in what the live scan lacks
//! (live values win, as upstream's `mergeDevices`), and a device the scan does not see at all
//! is published as it was.
//!
//! Those attributes are kept in `<state-dir>/published-devices.json` (replaced atomically) for
//! every device that is prepared or attached, so a restarted dranet publishes the same slice.
//! The window it cannot cover: a device prepared, moved and dranet restarted before any scan saw
//! it home (scans follow link events within a second).
//!
//! A held device named after its host netdev is bound to the MAC its plan or record holds
//! ([`Held::drop_impostors`], issue 38): a host link that takes its name meanwhile (a squatter)
//! is neither published as the device nor merged into it, and the device home under a temporary
//! name is no device of its own. The device is then published as it was, and Prepare says why
//! it does not take it ([`Device::squatted`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{AttrValue, Device};
use crate::mac::Mac;
use crate::shared::Shared;

/// The file in the state dir.
pub const HELD_FILE: &str = "published-devices.json";
const FORMAT: u32 = 1;

/// Shared with the devices' entries in the scans ([`Shared`]).
type Attributes = Shared<BTreeMap<String, AttrValue>>;

#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct FileFormat {
    version: u32,
    devices: BTreeMap<String, Attributes>,
}

/// Errors of this module (logged by the caller: a lost file only loses attributes).
#[derive(Debug, thiserror::Error)]
pub enum HeldError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decoding {path}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} has format {found}, this dranet reads {FORMAT}")]
    Version { path: PathBuf, found: u32 },
}

/// The published attributes of prepared and attached devices.
#[derive(Debug, Default)]
pub struct HeldAttributes {
    path: Option<PathBuf>,
    saved: BTreeMap<String, Attributes>,
    /// Each device's attribute map from before it last changed or left the scan.
    attributes: Earlier<BTreeMap<String, AttrValue>>,
    /// Each device's published entry from before it last changed or left the scan.
    devices: Earlier<Device>,
}

/// For each device, the value (its attribute map, its whole entry) it had before it last changed
/// or left the scan, for [`EARLIER_KEPT`]: a device that goes back to it (a veth whose peer went
/// into a pod and came back, a link that went down and up, a device moved away by another tool
/// and back) gets that value again rather than a fresh copy.
#[derive(Debug)]
struct Earlier<T> {
    kept: HashMap<String, (Shared<T>, Instant)>,
}

impl<T> Default for Earlier<T> {
    fn default() -> Self {
        Self { kept: HashMap::new() }
    }
}

impl<T: PartialEq> Earlier<T> {
    fn expire(&mut self, now: Instant) {
        self.kept
            .retain(|_, (_, since)| now.saturating_duration_since(*since) < EARLIER_KEPT);
        crate::heap::shrink_sparse(&mut self.kept);
    }

    /// What to publish instead of `new`, the rescanned value of `name`: `prev`, its value in
    /// the last scan, when they are equal, else its value from before it last changed or left
    /// when `new` is back to that. None: `new` is new, and `prev` is remembered (from `now`).
    fn share(
        &mut self,
        name: &str,
        new: &Shared<T>,
        prev: Option<&Shared<T>>,
        now: Instant,
    ) -> Option<Shared<T>> {
        if let Some(prev) = prev
            && prev == new
        {
            // What was kept is this value again (a device home from a pod, published meanwhile
            // from the map it left with): nothing to go back to.
            if self.kept.get(name).is_some_and(|(before, _)| before == new) {
                self.kept.remove(name);
            }
            return Some(prev.clone());
        }
        match self.kept.get(name) {
            Some((before, _)) if before == new => {
                let before = before.clone();
                self.kept.remove(name);
                Some(before)
            }
            Some(_) => None,
            None => {
                if let Some(prev) = prev {
                    self.kept.insert(name.to_owned(), (prev.clone(), now));
                }
                None
            }
        }
    }

    /// `name`, last published as `prev`, is not in the scan.
    fn left(&mut self, name: &str, prev: &Shared<T>, now: Instant) {
        self.kept
            .entry(name.to_owned())
            .or_insert_with(|| (prev.clone(), now));
    }
}

/// How long [`HeldAttributes`] keeps a device's map from before a change (longer than a drain).
pub const EARLIER_KEPT: Duration = Duration::from_secs(120);

/// Which devices matter now (from the checkpoint).
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// Prepared (in a plan) or attached (in a sandbox record): their attributes are kept.
    pub tracked: BTreeSet<String>,
    /// In a pod now (moving, in the pod or on their way back): their kept attributes are
    /// published.
    pub out: BTreeSet<String>,
    /// What the checkpoint knows of the kernel identity of tracked devices named after their
    /// host netdev (no PCI function): see [`Held::drop_impostors`].
    pub identity: BTreeMap<String, HeldIdentity>,
}

/// The kernel identity of a held netdev device, as the checkpoint recorded it (issue 38: a name
/// anyone can set is only a hint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldIdentity {
    /// The permanent MAC, else the MAC, Prepare recorded from the device itself: what an attach
    /// checks the host link against (compared as bytes).
    pub mac: Mac,
    /// The name the device has in the host while another link holds its own (`HomeNameBusy`).
    pub temp_name: Option<String>,
}

impl Held {
    /// From the checkpoint: devices of every plan and sandbox record; out when their record
    /// says moving, in the pod or returning.
    #[must_use]
    pub fn from_checkpoint(cp: &crate::state::Checkpoint) -> Self {
        use crate::state::DeviceState;
        let mut h = Self::default();
        // Records first: what an attach found in the kernel; a plan only adds what no record has.
        for rec in cp.pods.values() {
            for d in &rec.devices {
                h.tracked.insert(d.device.clone());
                if matches!(
                    d.state,
                    DeviceState::Moving | DeviceState::InPod | DeviceState::Returning
                ) {
                    h.out.insert(d.device.clone());
                }
                if d.state != DeviceState::Gone && d.pci_address.is_none() {
                    h.add_identity(&d.device, d.permanent_mac.as_deref());
                    if d.state == DeviceState::HomeNameBusy
                        && let Some(id) = h.identity.get_mut(&d.device)
                    {
                        id.temp_name.clone_from(&d.temp_name);
                    }
                }
            }
        }
        for plan in cp.plans.values() {
            for d in &plan.devices {
                h.tracked.insert(d.device.clone());
                if d.pci_address.is_none() {
                    h.add_identity(&d.device, d.permanent_mac.as_deref());
                }
            }
        }
        h
    }

    /// The identity of `device` from the MAC its record or plan holds (checked when it was
    /// loaded); none without one.
    fn add_identity(&mut self, device: &str, mac: Option<&str>) {
        if let Some(mac) = mac.and_then(Mac::parse_recorded)
            && !self.identity.contains_key(device)
        {
            self.identity
                .insert(device.to_owned(), HeldIdentity { mac, temp_name: None });
        }
    }

    /// Issue 38: a held netdev device is the link with its kernel identity, not whatever link
    /// has its name. Removes from a scan every link that has the name of a held device but not
    /// its MAC (a squatter: a host link that took the name while the device was in a pod, or
    /// while it is home under a temporary name), and the held device's own link under its
    /// temporary name (it is that device, not a device of its own). Devices with a PCI function
    /// are left alone: their netdev is found through sysfs, by the kernel. Returns, by device
    /// name, why each squatted device is not its link.
    pub fn drop_impostors(&self, devs: &mut Vec<Device>) -> BTreeMap<String, String> {
        if self.identity.is_empty() {
            return BTreeMap::new();
        }
        let temp: HashMap<&str, (&str, &HeldIdentity)> = self
            .identity
            .iter()
            .filter_map(|(dev, id)| Some((id.temp_name.as_deref()?, (dev.as_str(), id))))
            .collect();
        let mut squatted = BTreeMap::new();
        devs.retain(|d| {
            let (None, Some(ifname)) = (&d.pci_address, d.ifname.as_deref()) else {
                return true;
            };
            let has = |id: &HeldIdentity| d.mac.as_deref().and_then(Mac::parse_recorded) == Some(id.mac);
            if let Some(id) = self.identity.get(&d.name)
                && !has(id)
            {
                let why = format!(
                    "its host name {ifname} is held by another link (MAC {}, the device's is {})",
                    d.mac.as_deref().unwrap_or("none"),
                    id.mac
                );
                tracing::debug!(device = %d.name, %why, "a link with a held device's name is not the device");
                squatted.insert(d.name.clone(), why);
                return false;
            }
            !temp
                .get(ifname)
                .is_some_and(|(dev, id)| *dev != d.name && has(id))
        });
        squatted
    }
}

impl HeldAttributes {
    /// Reads `<state_dir>/published-devices.json`; a missing file is empty, a bad one is
    /// logged and ignored (it is rewritten at the next scan).
    #[must_use]
    pub fn load(state_dir: &Path) -> Self {
        let path = state_dir.join(HELD_FILE);
        let saved = match read(&path) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %crate::telemetry::chain(&e),
                    "kept attributes of devices in pods unreadable: they come back as devices return");
                BTreeMap::new()
            }
        };
        Self {
            path: Some(path),
            saved,
            ..Self::default()
        }
    }

    /// Not persisted (tests, `dranet inventory`).
    #[must_use]
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// Gives each device of `devs` whose attributes equal those of its entry in `last` (by name)
    /// that entry's map, or the map it had before it last changed or left when they are back to
    /// that. Remembers the map of a device that changes or leaves (for [`EARLIER_KEPT`] from
    /// `now`).
    fn reuse_unchanged(&mut self, devs: &mut [Device], last: &[Shared<Device>], now: Instant) {
        self.attributes.expire(now);
        let by_name: HashMap<&str, &Attributes> =
            last.iter().map(|d| (d.name.as_str(), &d.attributes)).collect();
        for d in devs.iter_mut() {
            let prev = by_name.get(d.name.as_str()).copied();
            if let Some(kept) = self.attributes.share(&d.name, &d.attributes, prev, now) {
                d.attributes = kept;
            }
        }
        let seen: HashSet<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        for d in last.iter().filter(|d| !seen.contains(d.name.as_str())) {
            self.attributes.left(&d.name, &d.attributes, now);
        }
    }

    /// The published list: each device whose entry equals its entry in `last`, or the entry it
    /// had before it last changed or left, is that entry itself, with its strings and lists.
    fn share_unchanged(
        &mut self,
        devs: Vec<Device>,
        last: &[Shared<Device>],
        now: Instant,
    ) -> Vec<Shared<Device>> {
        self.devices.expire(now);
        let by_name: HashMap<&str, &Shared<Device>> = last.iter().map(|d| (d.name.as_str(), d)).collect();
        let out: Vec<Shared<Device>> = devs
            .into_iter()
            .map(|d| {
                let new = Shared::new(d);
                let prev = by_name.get(new.name.as_str()).copied();
                self.devices.share(&new.name, &new, prev, now).unwrap_or(new)
            })
            .collect();
        let seen: HashSet<&str> = out.iter().map(|d| d.name.as_str()).collect();
        for d in last.iter().filter(|d| !seen.contains(d.name.as_str())) {
            self.devices.left(&d.name, d, now);
        }
        out
    }

    /// The kept attributes of `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&BTreeMap<String, AttrValue>> {
        self.saved.get(name).map(|a| &**a)
    }

    /// Merges the kept attributes into a scan: each device that is out gets the attributes of
    /// its last published entry (in `last`, else the file) where the scan has none, or is
    /// published as it was when the scan does not see it. Then the file is brought up to date
    /// for every tracked device (a write error is logged). Returns the devices sorted by name.
    ///
    /// A device whose entry is its entry in `last` is published as that entry itself
    /// ([`Shared`]), as is a device back home from a pod whose entry is unchanged (its entry in
    /// `last` was published from the one it had before it left); a device that changed keeps
    /// its attribute map when that did not. So a rescan allocates a device only when it
    /// changes: during a drain, a fresh copy would be placed among the pods' short-lived memory
    /// and keep those pages from being given back after it.
    pub fn apply(
        &mut self,
        mut devs: Vec<Device>,
        held: &Held,
        last: &[Shared<Device>],
    ) -> Vec<Shared<Device>> {
        let now = Instant::now();
        let squatted = held.drop_impostors(&mut devs);
        self.reuse_unchanged(&mut devs, last, now);
        let last_of = |name: &str| last.iter().find(|d| d.name == name);
        let mut keep: BTreeMap<String, Attributes> = BTreeMap::new();
        for name in &held.tracked {
            // A device whose name another link holds is published as it was, as one in a pod.
            let out = held.out.contains(name) || squatted.contains_key(name);
            let idx = devs.iter().position(|d| &d.name == name);
            if out {
                let prev: Option<Attributes> = last_of(name)
                    .map(|d| d.attributes.clone())
                    .or_else(|| self.saved.get(name).cloned());
                match (idx, prev) {
                    (Some(i), Some(prev)) => {
                        for (k, v) in prev.iter() {
                            devs[i].attributes.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    }
                    (None, Some(prev)) => {
                        let mut d = last_of(name).map_or_else(
                            || Device {
                                name: name.clone(),
                                ..Device::default()
                            },
                            |d| (**d).clone(),
                        );
                        d.attributes = prev;
                        d.held = true;
                        d.squatted = squatted.get(name).cloned();
                        devs.push(d);
                    }
                    (_, None) => {}
                }
            }
            match devs.iter().find(|d| &d.name == name) {
                Some(d) => {
                    keep.insert(name.clone(), d.attributes.clone());
                }
                None => {
                    if let Some(prev) = self.saved.get(name) {
                        keep.insert(name.clone(), prev.clone());
                    }
                }
            }
        }
        devs.sort_by(|a, b| a.name.cmp(&b.name));
        if keep != self.saved {
            self.saved = keep;
            if let Some(path) = &self.path
                && let Err(e) = write(path, &self.saved)
            {
                tracing::warn!(error = %crate::telemetry::chain(&e),
                    "cannot keep the attributes of devices in pods across a restart");
            }
        }
        self.share_unchanged(devs, last, now)
    }
}

fn read(path: &Path) -> Result<BTreeMap<String, Attributes>, HeldError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(HeldError::Io {
                what: "reading",
                path: path.to_owned(),
                source,
            });
        }
    };
    let f: FileFormat = serde_json::from_slice(&bytes).map_err(|source| HeldError::Decode {
        path: path.to_owned(),
        source,
    })?;
    if f.version != FORMAT {
        return Err(HeldError::Version {
            path: path.to_owned(),
            found: f.version,
        });
    }
    Ok(f.devices)
}

/// Temp file, fsync, rename over the file, fsync the directory.
fn write(path: &Path, devices: &BTreeMap<String, Attributes>) -> Result<(), HeldError> {
    let io = |what: &'static str, p: &Path| {
        let p = p.to_owned();
        move |source| HeldError::Io {
            what,
            path: p,
            source,
        }
    };
    let body = serde_json::to_vec(&FileFormat {
        version: FORMAT,
        devices: devices.clone(),
    })
    .map_err(|source| HeldError::Decode {
        path: path.to_owned(),
        source,
    })?;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
    f.write_all(&body).map_err(io("writing", &tmp))?;
    f.sync_all().map_err(io("syncing", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io("renaming over", path))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, attrs: &[(&str, &str)]) -> Device {
        Device {
            name: name.into(),
            attributes: attrs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), AttrValue::String((*v).to_owned())))
                .collect(),
            ..Device::default()
        }
    }

    fn held(tracked: &[&str], out: &[&str]) -> Held {
        Held {
            tracked: tracked.iter().map(|s| (*s).to_owned()).collect(),
            out: out.iter().map(|s| (*s).to_owned()).collect(),
            identity: BTreeMap::new(),
        }
    }

    fn plain(devs: &[Shared<Device>]) -> Vec<Device> {
        devs.iter().map(|d| (**d).clone()).collect()
    }

    fn by_name(devs: &[Shared<Device>]) -> BTreeMap<&str, &Attributes> {
        devs.iter().map(|d| (d.name.as_str(), &d.attributes)).collect()
    }

    /// A rescan allocates a device's attributes only when they change: an unchanged device keeps
    /// the map of the last scan, a device back home from a pod with the attributes it left with
    /// gets back the map it had before it left (which was published for it meanwhile), and so
    /// does a device whose attributes flap back, or that left the scan and came back.
    #[test]
    fn an_unchanged_or_returning_device_keeps_its_attribute_map() {
        let mut h = HeldAttributes::in_memory();
        let scan = |a: &str| {
            vec![
                dev("a", &[("dra.net/ifName", a)]),
                dev("b", &[("dra.net/ifName", "b")]),
            ]
        };
        let none = held(&[], &[]);
        let first = h.apply(scan("a"), &none, &[]);
        let second = h.apply(scan("a"), &none, &first);
        assert_eq!(second, first);
        assert!(Shared::same(&second[0].attributes, &first[0].attributes));
        assert!(Shared::same(&second[1].attributes, &first[1].attributes));
        // b goes into a pod: the scan does not see it; it stays published, held, with its map.
        let third = h.apply(
            vec![dev("a", &[("dra.net/ifName", "a")])],
            &held(&["b"], &["b"]),
            &second,
        );
        assert!(third[1].held && Shared::same(&third[1].attributes, &first[1].attributes));
        // b is home, unchanged: the scan's fresh map gives way to the one it had.
        let fourth = h.apply(scan("a"), &held(&["b"], &[]), &third);
        assert!(!fourth[1].held && Shared::same(&fourth[1].attributes, &first[1].attributes));
        // A device that changed gets its new map.
        let fifth = h.apply(scan("a2"), &none, &fourth);
        assert!(!Shared::same(&fifth[0].attributes, &first[0].attributes));
        assert_eq!(
            fifth[0].attributes["dra.net/ifName"],
            AttrValue::String("a2".into())
        );
        assert!(Shared::same(&fifth[1].attributes, &first[1].attributes));
        // a goes back to what it was (a flap, a veth's peer back from a pod): its first map again.
        let sixth = h.apply(scan("a"), &none, &fifth);
        assert!(Shared::same(&sixth[0].attributes, &first[0].attributes));
        // b leaves the scan untracked (moved by another tool), then comes back unchanged.
        let seventh = h.apply(vec![dev("a", &[("dra.net/ifName", "a")])], &none, &sixth);
        assert_eq!(seventh.len(), 1);
        let eighth = h.apply(scan("a"), &none, &seventh);
        assert!(Shared::same(&eighth[1].attributes, &first[1].attributes));
        // Not after EARLIER_KEPT: the map from before a change is let go.
        let changed_at = Instant::now();
        let mut ninth = scan("a3");
        h.reuse_unchanged(&mut ninth, &eighth, changed_at);
        assert_eq!(h.attributes.kept.len(), 1);
        let mut tenth = scan("a");
        let ninth: Vec<Shared<Device>> = ninth.into_iter().map(Shared::new).collect();
        h.reuse_unchanged(&mut tenth, &ninth, changed_at + EARLIER_KEPT);
        assert!(!Shared::same(&tenth[0].attributes, &first[0].attributes));
        assert!(
            h.attributes
                .kept
                .values()
                .all(|(m, _)| !Shared::same(m, &first[0].attributes))
        );
    }

    /// A rescan publishes an unchanged device as the last scan's entry itself (its strings and
    /// lists too), a device that changed as a new entry, and a device that went back to what it
    /// was, or came home from a pod unchanged, as the entry it had before.
    #[test]
    fn an_unchanged_or_returning_device_keeps_its_whole_entry() {
        let mut h = HeldAttributes::in_memory();
        let none = held(&[], &[]);
        let scan = |mtu: u32| {
            vec![
                Device {
                    mtu: Some(mtu),
                    ..dev("a", &[])
                },
                dev("b", &[("dra.net/ifName", "b")]),
            ]
        };
        let first = h.apply(scan(1500), &none, &[]);
        let second = h.apply(scan(1500), &none, &first);
        assert!(Shared::same(&first[0], &second[0]) && Shared::same(&first[1], &second[1]));
        let third = h.apply(scan(9000), &none, &second);
        assert!(!Shared::same(&first[0], &third[0]));
        assert_eq!(third[0].mtu, Some(9000));
        assert!(Shared::same(&first[1], &third[1]));
        let fourth = h.apply(scan(1500), &none, &third);
        assert!(
            Shared::same(&first[0], &fourth[0]),
            "a is back to its first entry"
        );
        // b goes into a pod: published held while out, then home with its first entry.
        let out = h.apply(vec![scan(1500).remove(0)], &held(&["b"], &["b"]), &fourth);
        assert!(out[1].held && Shared::same(&first[0], &out[0]));
        let back = h.apply(scan(1500), &held(&["b"], &[]), &out);
        assert!(!back[1].held && Shared::same(&first[1], &back[1]));
        // Nothing is kept once everything is back to what it was.
        assert!(h.devices.kept.is_empty(), "{:?}", h.devices.kept.keys());
        assert!(h.attributes.kept.is_empty(), "{:?}", h.attributes.kept.keys());
    }

    /// A live netdev entry with `mac`.
    fn link(name: &str, ifname: &str, mac: &str) -> Device {
        Device {
            ifname: Some(ifname.into()),
            mac: Some(mac.into()),
            ..dev(name, &[("dra.net/ifName", ifname), ("dra.net/mac", mac)])
        }
    }

    fn identity(mac: &str, temp: Option<&str>) -> HeldIdentity {
        HeldIdentity {
            mac: Mac::parse_recorded(mac).unwrap(),
            temp_name: temp.map(str::to_owned),
        }
    }

    /// Issue 38 squatter bug 1: a host link takes the host name of a device held by a pod. It is
    /// not published as the device (the device is published as it was, held, saying why, so
    /// Prepare neither takes it nor the link), the device home under its temporary name is not a
    /// device of its own, and once the device has its name back it is published live again.
    #[test]
    fn a_link_with_a_held_devices_name_but_not_its_identity_is_not_that_device() {
        let nic = "02:d7:00:00:00:01";
        let mut h = HeldAttributes::in_memory();
        let home = h.apply(
            vec![
                link("drn1", "drn1", nic),
                link("eth9", "eth9", "02:00:00:00:00:09"),
            ],
            &Held::default(),
            &[],
        );
        // In pod A; a squatter takes the name.
        let mut out = held(&["drn1"], &["drn1"]);
        out.identity.insert("drn1".into(), identity(nic, None));
        let squatter = link("drn1", "drn1", "D2:F6:9A:FB:15:98");
        let published = h.apply(vec![squatter.clone()], &out, &home);
        let d = published.iter().find(|d| d.name == "drn1").unwrap();
        assert!(d.held, "the squatter is published as the device: {d:?}");
        assert_eq!(d.attributes, home[0].attributes);
        assert!(
            d.squatted.as_deref().unwrap().contains("held by another link"),
            "{d:?}"
        );
        // Home under a temporary name (A's record HomeNameBusy, its plan gone).
        let mut busy = held(&["drn1"], &[]);
        busy.identity.insert("drn1".into(), identity(nic, Some("dn7")));
        let scan = vec![squatter.clone(), link("dn7", "dn7", nic)];
        let published = h.apply(scan, &busy, &published);
        let names: Vec<&str> = published.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["drn1"], "{published:?}");
        assert!(published[0].held && published[0].attributes == home[0].attributes);
        let inv = crate::inventory::SharedInventory::new(plain(&published));
        assert!(inv.get("drn1").is_none(), "Prepare would take the squatter");
        let why = inv.squatted("drn1").unwrap();
        assert!(why.contains("drn1") && why.contains("D2:F6:9A:FB:15:98"), "{why}");
        // The squatter goes, the device has its name back: published live, as before.
        let back = h.apply(vec![link("drn1", "drn1", nic)], &busy, &published);
        assert!(!back[0].held && back[0].squatted.is_none(), "{:?}", back[0]);
        assert_eq!(back[0].mac.as_deref(), Some(nic));
        // The MAC is compared as the kernel's, whatever its case.
        let mut devs = vec![link("drn1", "drn1", &nic.to_uppercase())];
        assert!(busy.drop_impostors(&mut devs).is_empty());
        assert_eq!(devs.len(), 1);
        // ... and as bytes: a record holding it in another of Go's forms names the same link.
        let mut dashed = held(&["drn1"], &[]);
        dashed
            .identity
            .insert("drn1".into(), identity("02-D7-00-00-00-01", None));
        let mut devs = vec![link("drn1", "drn1", nic)];
        assert!(dashed.drop_impostors(&mut devs).is_empty(), "{devs:?}");
        assert_eq!(devs.len(), 1);
    }

    /// Only netdev-named devices are bound to a MAC: a PCI device's netdev is found through
    /// sysfs, and devices nothing holds, or holds without a MAC, are published as scanned.
    #[test]
    fn pci_devices_and_devices_without_a_held_identity_are_published_as_scanned() {
        let mut held = held(&["pci-0000-17-00-0", "drn2"], &[]);
        held.identity
            .insert("pci-0000-17-00-0".into(), identity("02:00:00:00:00:01", None));
        let pci = Device {
            pci_address: Some("0000:17:00.0".into()),
            ..link("pci-0000-17-00-0", "ens1", "02:00:00:00:00:02")
        };
        let mut devs = vec![
            pci,
            link("drn2", "drn2", "02:00:00:00:00:03"),
            link("drn3", "drn3", "02:00:00:00:00:04"),
        ];
        let before = devs.clone();
        assert!(held.drop_impostors(&mut devs).is_empty());
        assert_eq!(devs, before);
    }

    #[test]
    fn devices_in_pods_keep_their_attributes_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("dranet-held-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let full_pci = dev(
            "pci-0000-17-00-0",
            &[("dra.net/pciAddress", "0000:17:00.0"), ("dra.net/ifName", "ens1")],
        );
        let dummy = dev("dummy0", &[("dra.net/ifName", "dummy0")]);
        let other = dev("eth9", &[("dra.net/ifName", "eth9")]);
        // Prepared, still home: the file keeps their attributes; untracked eth9 is not kept.
        let mut h = HeldAttributes::load(&dir);
        let live = vec![dummy.clone(), other.clone(), full_pci.clone()];
        let out = h.apply(live.clone(), &held(&["pci-0000-17-00-0", "dummy0"], &[]), &[]);
        assert_eq!(plain(&out), live);
        let file: FileFormat = serde_json::from_slice(&std::fs::read(dir.join(HELD_FILE)).unwrap()).unwrap();
        assert_eq!(
            file.devices.keys().collect::<Vec<_>>(),
            ["dummy0", "pci-0000-17-00-0"]
        );

        // Restart while both are in a pod: the scan sees the PCI function without its netdev
        // and no dummy0 at all.
        drop(h);
        let mut h = HeldAttributes::load(&dir);
        let shrunk = dev("pci-0000-17-00-0", &[("dra.net/pciAddress", "0000:17:00.0")]);
        let both = held(&["pci-0000-17-00-0", "dummy0"], &["pci-0000-17-00-0", "dummy0"]);
        let out = h.apply(vec![shrunk, other.clone()], &both, &[]);
        let got = by_name(&out);
        assert_eq!(got["pci-0000-17-00-0"], &full_pci.attributes);
        assert_eq!(got["dummy0"], &dummy.attributes);
        assert_eq!(got["eth9"], &other.attributes);
        // Published, but Prepare does not take a device the scan did not see.
        let inv = crate::inventory::SharedInventory::new(plain(&out));
        assert!(inv.get("dummy0").is_none());
        assert!(
            inv.get("pci-0000-17-00-0").is_some(),
            "seen by the scan, attributes filled in"
        );

        // Live values win over kept ones.
        let moved = dev(
            "pci-0000-17-00-0",
            &[
                ("dra.net/pciAddress", "0000:17:00.0"),
                ("dra.net/ifName", "renamed"),
            ],
        );
        let out = h.apply(vec![moved], &both, &[]);
        assert_eq!(
            by_name(&out)["pci-0000-17-00-0"]["dra.net/ifName"],
            AttrValue::String("renamed".into())
        );

        // Home and unprepared: nothing kept, the file empties.
        let out = h.apply(vec![other.clone()], &Held::default(), &[]);
        assert_eq!(plain(&out), vec![other]);
        let file: FileFormat = serde_json::from_slice(&std::fs::read(dir.join(HELD_FILE)).unwrap()).unwrap();
        assert!(file.devices.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_last_published_entry_wins_over_the_file_and_bad_files_are_ignored() {
        let dir = std::env::temp_dir().join(format!("dranet-held-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(HELD_FILE), b"{not json").unwrap();
        let mut h = HeldAttributes::load(&dir);
        assert!(h.get("dummy0").is_none());
        let last: [Shared<Device>; 1] = [dev("dummy0", &[("dra.net/mtu", "9000")]).into()];
        let out = h.apply(Vec::new(), &held(&["dummy0"], &["dummy0"]), &last);
        assert_eq!(out[0].attributes, last[0].attributes);
        assert!(out[0].held);
        assert!(h.get("dummy0").is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
