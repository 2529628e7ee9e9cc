//! Crash-safe checkpoint of what dranet did to the node: prepared plans, pods whose netns holds our
//! devices, their pins and every device's host snapshot. (Files only.)
//!
//! The checkpoint is one JSON document, replaced atomically: write `state.json.tmp`, `fsync` it,
//! `rename` over `state.json`, `fsync` the directory. A crash at any point leaves either the old or
//! the new document, never a torn one. Each device moves through [`DeviceState`] with a write-ahead
//! record (`Moving` is saved *before* the kernel is asked), so after a SIGKILL the reconcile knows
//! exactly which devices may be half-way and where to look for them.
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

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::link::LinkSnapshot;
use crate::netns::NetnsId;
use crate::plan::PodPlan;

/// Version of the checkpoint format; a newer file is refused rather than misread.
pub const FORMAT_VERSION: u32 = 2;
const FILE: &str = "state.json";

/// Errors of the checkpoint store.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state dir {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing checkpoint {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading checkpoint {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("checkpoint {path} is not valid: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding checkpoint: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("checkpoint {path} has format version {found}, this dranet reads up to {FORMAT_VERSION}")]
    Version { path: PathBuf, found: u32 },
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
    /// Host state before attach: what detach restores.
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
}

/// The checkpoint key of a pod's sandbox: `<pod-uid>/<sandbox-id>` (the sandbox id is empty for
/// a record migrated from format 1). Both parts are checked at the boundary ([`crate::ids`]), so
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

    /// The file name of this sandbox's pin: the sandbox id (format 1: the pod UID).
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

    /// Re-keys every record by [`PodRecord::key`] (format 1 keyed them by pod UID).
    fn rekey(&mut self) {
        let pods = std::mem::take(&mut self.pods);
        self.pods = pods.into_values().map(|r| (r.key(), r)).collect();
    }
}

/// The state dir: checkpoint file and the pins directory.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Opens (creating, mode 0700) the state dir.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        fs::create_dir_all(dir.join("pins")).map_err(|source| StateError::Dir {
            path: dir.clone(),
            source,
        })?;
        set_private(&dir).map_err(|source| StateError::Dir {
            path: dir.clone(),
            source,
        })?;
        Ok(Self { dir })
    }

    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where pins (netns bind mounts) live.
    #[must_use]
    pub fn pins_dir(&self) -> PathBuf {
        self.dir.join("pins")
    }

    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Loads the checkpoint; an absent file is an empty checkpoint.
    pub fn load(&self) -> Result<Checkpoint, StateError> {
        let path = self.path();
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: FORMAT_VERSION,
                    ..Checkpoint::default()
                });
            }
            Err(source) => return Err(StateError::Read { path, source }),
        };
        decode(&bytes, &path)
    }

    /// Replaces the checkpoint atomically and durably.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), StateError> {
        let mut cp_bytes = serde_json::to_vec(cp).map_err(StateError::Encode)?;
        cp_bytes.push(b'\n');
        let path = self.path();
        let tmp = self.dir.join(format!("{FILE}.tmp"));
        let werr = |source| StateError::Write {
            path: tmp.clone(),
            source,
        };
        let mut f = File::create(&tmp).map_err(werr)?;
        f.write_all(&cp_bytes).map_err(werr)?;
        f.sync_all().map_err(werr)?;
        drop(f);
        fs::rename(&tmp, &path).map_err(|source| StateError::Write {
            path: path.clone(),
            source,
        })?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| StateError::Write {
                path: self.dir.clone(),
                source,
            })
    }
}

/// Decodes a checkpoint file of any format this dranet reads, migrating older ones.
fn decode(bytes: &[u8], path: &Path) -> Result<Checkpoint, StateError> {
    #[derive(Deserialize)]
    struct Version {
        #[serde(default)]
        version: u32,
    }
    let derr = |source| StateError::Decode {
        path: path.to_owned(),
        source,
    };
    let v: Version = serde_json::from_slice(bytes).map_err(derr)?;
    if v.version > FORMAT_VERSION {
        return Err(StateError::Version {
            path: path.to_owned(),
            found: v.version,
        });
    }
    let mut cp: Checkpoint = serde_json::from_slice(bytes).map_err(derr)?;
    // Format 1 (and 0, unversioned) keyed records by pod UID: format 2 keys them by sandbox.
    // Records of format 2 are re-keyed too, so a hand-edited key cannot point at another record.
    cp.rekey();
    cp.version = FORMAT_VERSION;
    Ok(cp)
}

fn set_private(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests;
