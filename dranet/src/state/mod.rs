// Over 500 lines: the checkpoint's record types and their identity rules, which the on-disk format and the engine both read.
//! Crash-safe checkpoint of what dranet did to the node: prepared plans, pods whose netns holds our
//! devices, their pins and every device's host snapshot. (Files only.)
//!
//! **Format 3: one file per record.** Every plan and every sandbox record is a small JSON file of
//! its own in `<state-dir>/checkpoint/` (`plan_<pod-uid>.json`, `pod_<pod-uid>_<sandbox-id>.json`,
//! [`plan_file_name`], [`pod_file_name`]; `{"version":3,"plan":{..}}` / `{"version":3,"pod":{..}}`). A save writes
//! only the records that changed since the last one ([`Writer`] keeps what it staged last, sharing
//! every record with the engine's checkpoint until the engine writes to it, [`Shared`], so an
//! unchanged record costs one pointer compare): each
//! goes to a temp file of its own (`tmp.<pid>.<n>`), is `fsync`ed, the file it replaces is kept as
//! `<name>.prev` (a hard link renamed into place), the temp file is renamed over it; a removed
//! record loses its `.prev`, then its file; then the directory is `fsync`ed once. A save of one
//! record in a checkpoint of 500 writes one record, not the 4 MiB of all of them. A crash at any
//! point leaves every record at its old or its new value, never torn, and a record's file is never
//! missing in between. (A save that changes several records is not atomic across them: each record
//! is, and every caller that needs a change durable awaits it before acting on it.) Each device
//! moves through [`DeviceState`] with a write-ahead record (`Moving` is saved *before* the kernel is
//! asked), so after a SIGKILL the reconcile knows exactly which devices may be half-way and where to
//! look for them.
//!
//! One process owns the state dir at a time: [`StateLock`], an exclusive `flock` on
//! `<state-dir>/lock` held for the life of `dranet run` and of `dranet release-all` (`dranet
//! status` only reads). Saves run on a thread of their own ([`Writer`]); a caller that needs its
//! change durable (the write-ahead) awaits it without blocking an async worker.
//!
//! A record file that does not load (unreadable, truncated, garbage, no format version, a newer
//! format, an invalid pod UID or sandbox id, a name that is not its record's) is moved aside as
//! `<name>.corrupt-<unix time>` and its `.prev` is tried ([`Store::load_or_recover`]); if that
//! fails too, the record is dropped and the engine rebuilds it from its pin (`rescue::rebuild`).
//! Every other record loads as it is. `{}` is valid JSON but not a record: every format dranet ever
//! wrote carries `version`. An absent or empty `checkpoint/` is the empty checkpoint.
//!
//! Formats 1 and 2 were one JSON document, `state.json` (with `state.json.prev`, one save behind).
//! When the state dir still has one, it is the checkpoint (with the fallbacks it always had: a
//! `state.json` that does not load is moved aside and `state.json.prev` used), and
//! [`Store::load_or_recover`] migrates it: every record is written as its own file, the files of
//! `checkpoint/` it does not hold are removed, then `state.json.prev` and `state.json` are renamed
//! to `*.migrated` (in that order: a crash in between migrates again from `state.json`).
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
//! device's kernel identity ([`DeviceRecord::at`]); 3 stores each record in a file of its own (the
//! records themselves are as in format 2). A format-1 file is migrated on load: its records keep an
//! empty sandbox id (unknown) until a hook or Synchronize names their sandbox. Records rebuilt from
//! a pin ([`PodRecord::recovered`]) keep an empty pod UID until a hook or Synchronize names their
//! sandbox.

mod disk;
mod lock;
mod store;
mod transition;
mod validate;
mod writer;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ids::PodIfindex;
use crate::plan::PodPlan;
use crate::sys::link::LinkSnapshot;
use crate::sys::netns::NetnsId;

pub use crate::shared::Shared;
pub use lock::StateLock;
pub use store::{LoadSource, Loaded, Store};
pub use transition::{Durability, Naming, PlannedDevice, PodName, Transition};
pub use writer::Writer;

/// Version of the checkpoint format; a newer file is refused rather than misread.
pub const FORMAT_VERSION: u32 = 3;
/// The single-file checkpoint of formats 1 and 2 (read and migrated).
const FILE: &str = "state.json";
/// The directory of the record files (format 3).
const RECORDS_DIR: &str = "checkpoint";

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
    /// A [`Transition`] of a record (or of a device) that is not there: nothing changed.
    #[error("sandbox record {key}: {transition}: no such record or device")]
    RecordGone { key: String, transition: &'static str },
    /// A [`Transition`] that puts a record under a key where one is already (for a write-ahead
    /// or a re-key: one that still has devices out): nothing changed.
    #[error("sandbox record {key}: {transition}: a record is there already")]
    RecordThere { key: String, transition: &'static str },
    /// A [`Transition`] that puts a record under a key that is not its own
    /// ([`PodRecord::key`]): nothing changed.
    #[error("sandbox record {key}: {transition}: the record's own key is {own}")]
    NotItsKey {
        key: String,
        own: String,
        transition: &'static str,
    },
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
    /// No longer exists anywhere (by kernel identity: not at its index in the pod netns we
    /// hold, not in the host, no move out recorded, no PCI function left behind it): deleted
    /// while in the pod (a tenant's `ip link del`, a VF destroyed, a hot-unplug). Reported once;
    /// nothing is left to bring home.
    Gone,
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
    /// Where the device is or is about to be, by kernel identity: its ifindex in the netns
    /// `netns`. An attach chooses the device's ifindex in the pod and writes it here *ahead* of
    /// the move (the move asks the kernel for that index), so a move cut short by a crash is
    /// looked for there; tier B records a later move; a return clears it once the device is
    /// home. `None` at home, in records migrated from format 1, and in a record written before
    /// the pod-side index was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DeviceAt>,
    /// The snapshot was read from the device inside the pod when the record was rebuilt from a
    /// pin (no checkpoint loaded), not taken before the attach: the host state is unknown. Such
    /// a device comes home under [`LinkSnapshot::name`], up, without addresses, with its
    /// permanent MAC when it has one; its MTU, offloads and IP sysctls stay as the pod left
    /// them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebuilt: bool,
    /// Why the device is still out after a rescue's retries (the last error), until it is home;
    /// `dranet status` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_error: Option<String>,
    /// A `Gone` device whose report (the pod's `NetworkDeviceVanished` event, its claim's status,
    /// device health) is not confirmed sent yet. **Write-ahead, at least once to an idempotent
    /// sink:** set and saved (awaited) *before* the report is handed to the reporter, cleared
    /// (awaited) once the reporter says its sink took it; the record does not end while it is
    /// set. A restart re-sends the report of every device still flagged. The event's name is
    /// fixed by the pod, the record and the device, so a re-sent report that had gone out finds
    /// its Event there and adds nothing (the API server: `AlreadyExists`; embedded mode: the
    /// name already in `events.jsonl`), and a claim status apply is idempotent: reported
    /// exactly once across a SIGKILL anywhere on the way. Absent in records written before it
    /// (their report went out before the save): `false`, no format change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vanish_unreported: bool,
}

/// A device's kernel identity in one netns: the ifindex is fixed while the device stays in that
/// netns, and the netns is known by its cookie (never reused) and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAt {
    pub ifindex: PodIfindex,
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

impl ReturnReason {
    /// Its name as the checkpoint spells it (`hook`, `netns_teardown`, ...): also the `trigger`
    /// label of `dranet_rescue_returns` for the reasons counted there
    /// ([`ReturnReason::counted_as`]).
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::Hook => "hook",
            Self::NetnsTeardown => "netns_teardown",
            Self::Reconcile => "reconcile",
            Self::Rollback => "rollback",
            Self::Replaced => "replaced",
            Self::Vanished => "vanished",
        }
    }

    /// Which counter a finished return of this reason counts in.
    #[must_use]
    pub const fn counted_as(self) -> ReturnCount {
        match self {
            Self::Hook | Self::Reconcile | Self::Replaced | Self::Vanished => ReturnCount::Returns {
                trigger: self.label(),
            },
            Self::Rollback => ReturnCount::Rollback,
            Self::NetnsTeardown => ReturnCount::Rescued,
        }
    }

    /// Whether the return is part of an attach (its rollback, its pod's older sandbox): never
    /// queued behind other returns.
    #[must_use]
    pub const fn is_foreground(self) -> bool {
        matches!(self, Self::Rollback | Self::Replaced)
    }
}

impl std::fmt::Display for ReturnReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// The metric a finished return counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnCount {
    /// `dranet_rescue_returns{trigger}`.
    Returns { trigger: &'static str },
    /// `dranet_rollbacks`.
    Rollback,
    /// `dranet_rescued` (the probe-triggered rescue also counts its probe's trigger in
    /// `dranet_rescue_returns`).
    Rescued,
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
    /// Wall-clock time of the rebuild (Unix seconds; a bare number on disk).
    pub at: crate::clock::UnixSecs,
}

/// The checkpoint key of a pod's sandbox: `<pod-uid>/<sandbox-id>` (the sandbox id is empty for
/// a record migrated from format 1, the pod UID for a record rebuilt from a pin until its
/// sandbox is named). Both parts are checked at the boundary ([`crate::ids`]) and on load, so
/// neither contains `/`.
///
/// Built from checked ids with [`RecordKey::new`]; `pod_key` takes raw parts because a record
/// migrated from format 1 or rebuilt from a pin has one part empty until it is named.
#[must_use]
pub fn pod_key(pod_uid: &str, sandbox_id: &str) -> RecordKey {
    RecordKey(format!("{pod_uid}/{sandbox_id}"))
}

/// The key of one sandbox record, `<pod-uid>/<sandbox-id>` ([`pod_key`]): not a pod UID, not a
/// sandbox id. On disk it is the plain string it always was.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RecordKey(String);

impl RecordKey {
    /// The key of sandbox `sandbox` of pod `uid`, both checked at the boundary.
    #[must_use]
    pub fn new(uid: &crate::ids::PodUid, sandbox: &crate::ids::SandboxId) -> Self {
        pod_key(uid, sandbox)
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The pod UID part (empty in a record rebuilt from a pin, until it is named).
    #[must_use]
    pub fn pod_uid(&self) -> &str {
        self.0.split_once('/').map_or(self.0.as_str(), |(u, _)| u)
    }

    /// The sandbox id part (empty in a record migrated from format 1, until it is named).
    #[must_use]
    pub fn sandbox_id(&self) -> &str {
        self.0.split_once('/').map_or("", |(_, s)| s)
    }
}

impl std::ops::Deref for RecordKey {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for RecordKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A `String` key (tests, tools) looks a record up as the key itself: same bytes, same order.
impl std::borrow::Borrow<String> for RecordKey {
    fn borrow(&self) -> &String {
        &self.0
    }
}

impl PartialEq<str> for RecordKey {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for RecordKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for RecordKey {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl AsRef<str> for RecordKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key as read from a file or written by a test: records are checked on load
/// ([`Checkpoint::rekey`] re-keys each by its own ids).
impl From<String> for RecordKey {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<RecordKey> for String {
    fn from(k: RecordKey) -> Self {
        k.0
    }
}

impl From<&str> for RecordKey {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl PodRecord {
    /// This record's key in [`Checkpoint::pods`].
    #[must_use]
    pub fn key(&self) -> RecordKey {
        pod_key(&self.pod_uid, &self.sandbox_id)
    }

    /// The pod UID, checked; `None` while unknown (a record rebuilt from a pin, until it is
    /// named). On disk it stays the plain string (empty: unknown); records are made from checked
    /// ids and checked on load, so a UID that is there parses.
    #[must_use]
    pub fn uid(&self) -> Option<crate::ids::PodUid> {
        crate::ids::pod_uid(&self.pod_uid).ok()
    }

    /// The runtime's sandbox id, checked; `None` while unknown (a record migrated from format 1,
    /// until it is named). Checked as [`PodRecord::uid`] is.
    #[must_use]
    pub fn sandbox(&self) -> Option<crate::ids::SandboxId> {
        crate::ids::sandbox_id(&self.sandbox_id).ok()
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
    pub plans: BTreeMap<String, Shared<PodPlan>>,
    /// Sandboxes with devices attached or recently returned, by [`pod_key`].
    #[serde(default)]
    pub pods: BTreeMap<RecordKey, Shared<PodRecord>>,
}

impl Checkpoint {
    /// The sandbox record under `key` ([`pod_key`]).
    #[must_use]
    pub fn record(&self, key: &str) -> Option<&PodRecord> {
        self.pods.get(key).map(|r| &**r)
    }

    /// Every sandbox record, in key order.
    pub fn records(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values().map(|r| &**r)
    }

    /// The records of every sandbox of pod `uid`.
    pub fn records_of<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a PodRecord> + 'a {
        let from = pod_key(uid, "");
        self.pods
            .range(from..)
            .take_while(move |(_, r)| r.pod_uid == uid)
            .map(|(_, r)| &**r)
    }

    /// The keys of every sandbox record of pod `uid`.
    #[must_use]
    pub fn keys_of(&self, uid: &str) -> Vec<RecordKey> {
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

/// Checks a format version: present, not 0, not newer than this dranet reads.
fn check_version(version: Option<u32>, path: &Path) -> Result<u32, StateError> {
    let invalid = |what: String| StateError::Invalid {
        path: path.to_owned(),
        what,
    };
    // Every format ever written carries its version: `{}` is not a checkpoint.
    match version {
        None => Err(invalid("no format version".into())),
        Some(0) => Err(invalid("format version 0".into())),
        Some(n) if n > FORMAT_VERSION => Err(StateError::Version {
            path: path.to_owned(),
            found: n,
        }),
        Some(n) => Ok(n),
    }
}

/// Whether a plan's key and pod UID are a valid pod UID.
fn plan_ok(uid: &str, plan: &PodPlan) -> bool {
    crate::ids::pod_uid(uid).is_ok() && plan.pod_uid == uid
}

/// Whether a record's identifiers (from which paths and keys are built) are valid: a rebuilt
/// record has no pod UID yet, a format-1 one no sandbox id, none has neither.
fn record_ok(r: &PodRecord) -> bool {
    let uid_ok = r.pod_uid.is_empty() || crate::ids::pod_uid(&r.pod_uid).is_ok();
    let sandbox_ok = r.sandbox_id.is_empty() || crate::ids::sandbox_id(&r.sandbox_id).is_ok();
    uid_ok && sandbox_ok && !(r.pod_uid.is_empty() && r.sandbox_id.is_empty())
}

/// Decodes a single-file checkpoint (formats 1 and 2, `state.json`; a format-3 document is the
/// in-memory form, e.g. `dranet status --json`), migrating older ones, and checks the identifiers
/// that paths and keys are built from. `path` only names the file in errors.
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
    check_version(v.version, path)?;
    let mut cp: Checkpoint = serde_json::from_slice(bytes).map_err(derr)?;
    for (uid, plan) in &cp.plans {
        if !plan_ok(uid, plan) {
            return Err(invalid(format!("plan {uid:?}")));
        }
    }
    for (key, r) in &cp.pods {
        if !record_ok(r) {
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

/// One record of the checkpoint, as a format-3 file holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Plan(PodPlan),
    Pod(PodRecord),
}

impl Record {
    /// Its key: the pod UID of a plan, [`PodRecord::key`] of a sandbox record.
    #[must_use]
    pub fn key(&self) -> String {
        match self {
            Record::Plan(p) => p.pod_uid.clone(),
            Record::Pod(r) => r.key().into(),
        }
    }

    /// The name of the file that holds it ([`record_file_name`]).
    #[must_use]
    pub fn file_name(&self) -> String {
        match self {
            Record::Plan(p) => plan_file_name(&p.pod_uid),
            Record::Pod(r) => pod_file_name(&r.pod_uid, &r.sandbox_id),
        }
    }
}

/// Longest record file name built from the identifiers themselves; longer ones are hashed.
const MAX_NATURAL_NAME: usize = 200;

/// The file of a record in `checkpoint/`: `<kind>_<id>.json` when `id` is made of the characters
/// identifiers may hold (`[A-Za-z0-9._-]`, not starting with `.`) and the name is at most 200
/// bytes, else `<kind>_~<SHA-256 of the key, hex>.json` (`~` is in no identifier, so the two
/// forms never meet).
fn record_file_name(kind: &str, id: &str, key: &str) -> String {
    let safe = !id.starts_with('.')
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    let name = format!("{kind}_{id}.json");
    if safe && name.len() <= MAX_NATURAL_NAME {
        return name;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{kind}_~{hex}.json")
}

/// The file of pod `uid`'s plan: `plan_<uid>.json`.
#[must_use]
pub fn plan_file_name(uid: &str) -> String {
    record_file_name("plan", uid, uid)
}

/// The file of a sandbox record: `pod_<uid>_<sandbox>.json` (a pod UID holds no `_`, so the name
/// is unambiguous; a UID that does is hashed).
#[must_use]
pub fn pod_file_name(uid: &str, sandbox: &str) -> String {
    let key = pod_key(uid, sandbox);
    if uid.contains('_') {
        return record_file_name("pod", &key, &key);
    }
    record_file_name("pod", &format!("{uid}_{sandbox}"), &key)
}

/// A record file's content: `{"version":3,"plan":{..}}` and a newline.
pub(crate) fn encode_plan(plan: &PodPlan) -> Result<Vec<u8>, StateError> {
    #[derive(Serialize)]
    struct PlanFile<'a> {
        version: u32,
        plan: &'a PodPlan,
    }
    let mut b = serde_json::to_vec(&PlanFile {
        version: FORMAT_VERSION,
        plan,
    })
    .map_err(StateError::Encode)?;
    b.push(b'\n');
    Ok(b)
}

/// A record file's content: `{"version":3,"pod":{..}}` and a newline.
pub(crate) fn encode_pod(pod: &PodRecord) -> Result<Vec<u8>, StateError> {
    #[derive(Serialize)]
    struct PodFile<'a> {
        version: u32,
        pod: &'a PodRecord,
    }
    let mut b = serde_json::to_vec(&PodFile {
        version: FORMAT_VERSION,
        pod,
    })
    .map_err(StateError::Encode)?;
    b.push(b'\n');
    Ok(b)
}

/// [`encode_plan`] or [`encode_pod`].
pub(crate) fn encode_record(record: &Record) -> Result<Vec<u8>, StateError> {
    match record {
        Record::Plan(p) => encode_plan(p),
        Record::Pod(r) => encode_pod(r),
    }
}

/// Decodes one record file (format 3) and checks its identifiers. Whether the file's name is its
/// record's is the store's check. `path` only names the file in errors.
pub fn decode_record(bytes: &[u8], path: &Path) -> Result<Record, StateError> {
    #[derive(Deserialize)]
    struct Version {
        version: Option<u32>,
    }
    #[derive(Deserialize)]
    struct RecordFile {
        #[serde(default)]
        plan: Option<PodPlan>,
        #[serde(default)]
        pod: Option<PodRecord>,
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
    let version = check_version(v.version, path)?;
    if version < 3 {
        return Err(invalid(format!(
            "format version {version} in a record file (formats 1 and 2 are one state.json)"
        )));
    }
    let f: RecordFile = serde_json::from_slice(bytes).map_err(derr)?;
    match (f.plan, f.pod) {
        (Some(plan), None) if plan_ok(&plan.pod_uid, &plan) => Ok(Record::Plan(plan)),
        (Some(plan), None) => Err(invalid(format!("plan {:?}", plan.pod_uid))),
        (None, Some(pod)) if record_ok(&pod) => Ok(Record::Pod(pod)),
        (None, Some(pod)) => Err(invalid(format!("record {:?}", pod.key()))),
        _ => Err(invalid("not one plan or one pod record".into())),
    }
}

/// The property the `store` fuzz target checks (through [`crate::fuzzing::checkpoint`]) and
/// the test of its seed corpus: any bytes either fail to decode or decode to a checkpoint keyed
/// by sandbox that encodes and decodes back unchanged; the same bytes as a record file (format 3)
/// either fail to decode or decode to a record that encodes and decodes back unchanged.
///
/// # Errors
/// The rule the decoded checkpoint or record breaks.
#[doc(hidden)]
pub fn check_decode(bytes: &[u8]) -> Result<(), String> {
    let path = Path::new("fuzz");
    if let Ok(record) = decode_record(bytes, path) {
        let again = encode_record(&record).map_err(|e| format!("a decoded record does not encode: {e}"))?;
        match decode_record(&again, path) {
            Ok(back) if back == record => {}
            Ok(_) => return Err("a saved record loads back changed".into()),
            Err(e) => return Err(format!("a saved record does not load: {e}")),
        }
        if record.file_name().contains('/') {
            return Err(format!("record file name {:?}", record.file_name()));
        }
    }
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
