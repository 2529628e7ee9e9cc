//! Crash-safe checkpoint of what dranet did to the node: prepared plans, pods whose netns holds our
//! devices, their pins and every device's host snapshot. (Files only.)
//!
//! The checkpoint is one JSON document, replaced atomically ([`Store::save`]): write a temp file
//! of its own (`state.json.tmp.<pid>.<n>`), `fsync` it, keep the document it replaces as
//! `state.json.prev` (a hard link renamed into place), `rename` the temp file over `state.json`,
//! `fsync` the directory. A crash at any point leaves the old or the new document, never a torn
//! one, and `state.json` is never missing in between. Each device moves through [`DeviceState`]
//! with a write-ahead record (`Moving` is saved *before* the kernel is asked), so after a
//! SIGKILL the reconcile knows exactly which devices may be half-way and where to look for them.
//!
//! One process owns the state dir at a time: [`StateLock`], an exclusive `flock` on
//! `<state-dir>/lock` held for the life of `dranet run` and of `dranet release-all` (`dranet
//! status` only reads). Saves run on a thread of their own ([`Writer`]); a caller that needs its
//! change durable (the write-ahead) awaits it without blocking an async worker.
//!
//! A checkpoint that does not load (unreadable, truncated, garbage, no format version, a newer
//! format, a record with an invalid pod UID or sandbox id) is moved aside as
//! `state.json.corrupt-<unix time>` and `state.json.prev` is tried ([`Store::load_or_recover`]);
//! if that fails too, the engine starts empty and rebuilds records from the pins
//! (`rescue::rebuild`). `{}` is valid JSON but not a checkpoint: every format dranet ever wrote
//! carries `version`, so a document without one is corrupt, not empty (an *absent* file is the
//! empty checkpoint).
//!
//! The state dir lives on tmpfs by default (`/run/dranet`): after a reboot there are no pod netns
//! and no pins left, and the devices are back in the host anyway, so forgetting is right.
//!
//! **A pod is a sandbox in a netns, not a UID.** kubelet re-creates a pod's sandbox under the same
//! pod UID and removes the old one later, so pod records are keyed by pod UID *and* sandbox id
//! ([`pod_key`]) and carry the identity of the netns they attached to. Plans stay per pod UID:
//! the claims of a pod stay prepared across its sandboxes.
//!
//! Format history: 1 keyed records by pod UID only; 2 keys them by sandbox and records every
//! device's kernel identity ([`DeviceRecord::at`]). A format-1 file is migrated on load: its
//! records keep an empty sandbox id (unknown) until a hook or Synchronize names their sandbox.
//! Records rebuilt from a pin ([`PodRecord::recovered`]) keep an empty pod UID until a hook or
//! Synchronize names their sandbox.

mod disk;
mod lock;
mod store;
mod writer;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::plan::PodPlan;
use crate::sys::link::LinkSnapshot;
use crate::sys::netns::NetnsId;

pub use lock::StateLock;
pub use store::{LoadSource, Loaded, Store};
pub use writer::Writer;

/// Version of the checkpoint format; a newer file is refused rather than misread.
pub const FORMAT_VERSION: u32 = 2;
const FILE: &str = "state.json";

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing checkpoint {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading checkpoint {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("checkpoint {path} is not valid")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint {path} is not valid: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("encoding checkpoint")]
    Encode(#[source] serde_json::Error),
    #[error("checkpoint {path} has format version {found}, this dranet reads up to {FORMAT_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("state dir lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "state dir {dir} is in use by another dranet ({holder}): {path} stayed locked for {waited_s} s; stop that process first"
    )]
    Locked {
        dir: PathBuf,
        path: PathBuf,
        holder: String,
        waited_s: u64,
    },
    #[error("starting the checkpoint writer thread")]
    Thread(#[source] io::Error),
    #[error("the checkpoint writer stopped")]
    WriterStopped,
    #[error("saving the checkpoint")]
    Save(#[source] Arc<StateError>),
}

/// Where one managed device is, as far as the checkpoint knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    /// Snapshot taken, move requested or about to be: the device is in the host or in the pod.
    Moving,
    /// In the pod netns under its pod-side name.
    InPod,
    /// Move back requested or about to be: in the pod or in the host.
    Returning,
    /// Back in the host with its snapshot restored.
    Home,
    /// Back in the host, but its original name was taken: kept under `temp_name`.
    HomeNameBusy,
}

/// One device of a pod.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// ResourceSlice device name.
    pub device: String,
    /// Name inside the pod.
    pub pod_ifname: String,
    pub pci_address: Option<String>,
    pub permanent_mac: Option<String>,
    pub rdma_device: Option<String>,
    /// The RDMA link was (or may have been) moved into the pod (exclusive netns mode).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rdma_in_pod: bool,
    /// MAC set inside the pod (config `hardwareAddr`), if any: the kernel returns the device with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_mac: Option<String>,
    /// Host state before attach: what detach restores (on disk in the checkpoint's own form,
    /// [`disk`]).
    #[serde(with = "disk::snapshot")]
    pub snapshot: LinkSnapshot,
    pub state: DeviceState,
    /// Name the device carries in the host while its own is taken (see `link` name policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_name: Option<String>,
    /// Where the device is, by kernel identity: its ifindex in the netns `netns` (the pod's, once
    /// the move is confirmed). `None` while the move may be half-way (a crash between the
    /// request and this record) and in records migrated from format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DeviceAt>,
    /// The snapshot was read from the device inside the pod when the record was rebuilt from a
    /// pin (no checkpoint loaded), not taken before the attach: the host state is unknown. Such
    /// a device comes home under [`LinkSnapshot::name`], up, without addresses, with its
    /// permanent MAC when it has one; its MTU, offloads and IP sysctls stay as the pod left
    /// them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilt: bool,
}

/// A device's kernel identity in one netns: the ifindex is fixed while the device stays in that
/// netns, and the netns is known by its cookie (never reused) and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAt {
    pub ifindex: u32,
    pub netns: NetnsId,
}

/// Why a pod's devices came home.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReturnReason {
    /// StopPodSandbox / RemovePodSandbox while the netns was alive.
    Hook,
    /// The runtime unmounted or unlinked the netns bind mount first (CRI-O order).
    NetnsTeardown,
    /// Found at start-up: the netns went away while dranet was down.
    Reconcile,
    /// An attach failed part-way: rolled back.
    Rollback,
    /// A new sandbox of the same pod started (kubelet re-created it): the devices left the old
    /// one to move to the new one.
    Replaced,
    /// Synchronize: the runtime no longer knows the sandbox.
    Vanished,
}

/// Life of a pod's devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PodPhase {
    Attaching,
    Attached,
    Returning,
    /// Every device is home; a later hook is a fast no-op.
    Returned(ReturnReason),
}

/// One sandbox of a pod whose netns we put devices into.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    pub pod_uid: String,
    /// The runtime's sandbox id; empty in a record migrated from format 1 (unknown until a hook
    /// or Synchronize names it).
    #[serde(default)]
    pub sandbox_id: String,
    pub namespace: String,
    pub name: String,
    /// The runtime's netns path (`/var/run/netns/<id>`).
    pub netns_path: PathBuf,
    pub netns: NetnsId,
    /// Our pin (bind mount under the state dir); `None` once released.
    pub pin: Option<PathBuf>,
    pub phase: PodPhase,
    pub devices: Vec<DeviceRecord>,
    /// Set on a record rebuilt from a pin because no checkpoint had it: the pod UID, namespace
    /// and name are unknown (empty) until a hook or Synchronize names the sandbox, and the
    /// devices' host snapshots are unknown ([`DeviceRecord::rebuilt`]). Adoption (claims,
    /// Synchronize, kernel identity) can fill in the rest through the same naming step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<Recovered>,
}

/// Why and when a record was rebuilt from a pin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovered {
    /// Why no checkpoint had the record.
    pub reason: String,
    /// Unix time of the rebuild.
    pub at: u64,
}

/// The checkpoint key of a pod's sandbox: `<pod-uid>/<sandbox-id>` (the sandbox id is empty for
/// a record migrated from format 1, the pod UID for a record rebuilt from a pin until its
/// sandbox is named). Both parts are checked at the boundary ([`crate::ids`]) and on load, so
/// neither contains `/`.
#[must_use]
pub fn pod_key(pod_uid: &str, sandbox_id: &str) -> String {
    format!("{pod_uid}/{sandbox_id}")
}

impl PodRecord {
    /// This record's key in [`Checkpoint::pods`].
    #[must_use]
    pub fn key(&self) -> String {
        pod_key(&self.pod_uid, &self.sandbox_id)
    }

    /// The file name of this sandbox's pin: the sandbox id (format 1: the pod UID; a record
    /// rebuilt from a pin: that pin's name).
    #[must_use]
    pub fn pin_name(&self) -> String {
        if self.sandbox_id.is_empty() {
            self.pod_uid.clone()
        } else {
            self.sandbox_id.clone()
        }
    }

    /// Whether any device may still be outside the host.
    #[must_use]
    pub fn has_devices_out(&self) -> bool {
        self.devices.iter().any(|d| {
            matches!(
                d.state,
                DeviceState::Moving | DeviceState::InPod | DeviceState::Returning
            )
        })
    }
}

/// The whole checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// Prepared plans by pod UID (from NodePrepareResources).
    #[serde(default)]
    pub plans: BTreeMap<String, PodPlan>,
    /// Sandboxes with devices attached or recently returned, by [`pod_key`].
    #[serde(default)]
    pub pods: BTreeMap<String, PodRecord>,
}

impl Checkpoint {
    /// The records of every sandbox of pod `uid`.
    pub fn records_of<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a PodRecord> + 'a {
        let from = pod_key(uid, "");
        self.pods
            .range(from..)
            .take_while(move |(_, r)| r.pod_uid == uid)
            .map(|(_, r)| r)
    }

    /// The keys of every sandbox record of pod `uid`.
    #[must_use]
    pub fn keys_of(&self, uid: &str) -> Vec<String> {
        self.records_of(uid).map(PodRecord::key).collect()
    }

    /// Re-keys every record by [`PodRecord::key`] (format 1 keyed them by pod UID; a hand-edited
    /// key cannot point at another record). Returns whether no two records share a key.
    fn rekey(&mut self) -> bool {
        let pods = std::mem::take(&mut self.pods);
        let n = pods.len();
        self.pods = pods.into_values().map(|r| (r.key(), r)).collect();
        self.pods.len() == n
    }
}

/// Decodes a checkpoint of any format this dranet reads, migrating older ones, and checks the
/// identifiers that paths and keys are built from. `path` only names the file in errors.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint, StateError> {
    #[derive(Deserialize)]
    struct Version {
        version: Option<u32>,
    }
    let derr = |source| StateError::Decode {
        path: path.to_owned(),
        source,
    };
    let invalid = |what: String| StateError::Invalid {
        path: path.to_owned(),
        what,
    };
    let v: Version = serde_json::from_slice(bytes).map_err(derr)?;
    // Every format ever written carries its version: `{}` is not an empty checkpoint.
    match v.version {
        None => return Err(invalid("no format version".into())),
        Some(0) => return Err(invalid("format version 0".into())),
        Some(n) if n > FORMAT_VERSION => {
            return Err(StateError::Version {
                path: path.to_owned(),
                found: n,
            });
        }
        Some(_) => {}
    }
    let mut cp: Checkpoint = serde_json::from_slice(bytes).map_err(derr)?;
    for (uid, plan) in &cp.plans {
        if crate::ids::pod_uid(uid).is_err() || plan.pod_uid != *uid {
            return Err(invalid(format!("plan {uid:?}")));
        }
    }
    for (key, r) in &cp.pods {
        let uid_ok = r.pod_uid.is_empty() || crate::ids::pod_uid(&r.pod_uid).is_ok();
        let sandbox_ok = r.sandbox_id.is_empty() || crate::ids::sandbox_id(&r.sandbox_id).is_ok();
        if !uid_ok || !sandbox_ok || (r.pod_uid.is_empty() && r.sandbox_id.is_empty()) {
            return Err(invalid(format!("record {key:?}")));
        }
    }
    // Format 1 keyed records by pod UID: format 2 keys them by sandbox.
    if !cp.rekey() {
        return Err(invalid("two records of one sandbox".into()));
    }
    cp.version = FORMAT_VERSION;
    Ok(cp)
}

/// The property the `store` fuzz target checks (through [`crate::fuzzing::checkpoint`]) and
/// the test of its seed corpus: any bytes either fail to decode or decode to a format-2
/// checkpoint keyed by sandbox that encodes and decodes back unchanged.
///
/// # Errors
/// The rule the decoded checkpoint breaks.
#[doc(hidden)]
pub fn check_decode(bytes: &[u8]) -> Result<(), String> {
    let path = Path::new("fuzz");
    let Ok(cp) = decode(bytes, path) else {
        return Ok(());
    };
    if cp.version != FORMAT_VERSION {
        return Err(format!("decoded as version {}", cp.version));
    }
    if let Some((k, r)) = cp.pods.iter().find(|(k, r)| **k != r.key()) {
        return Err(format!("record {k:?} keyed as {:?}", r.key()));
    }
    let again = serde_json::to_vec(&cp).map_err(|e| format!("a decoded checkpoint does not encode: {e}"))?;
    match decode(&again, path) {
        Ok(back) if back == cp => Ok(()),
        Ok(_) => Err("a saved checkpoint loads back changed".into()),
        Err(e) => Err(format!("a saved checkpoint does not load: {e}")),
    }
}

#[cfg(test)]
mod tests;
