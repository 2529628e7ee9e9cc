//! The vocabulary of record transitions: every change the rescue engine makes to the sandbox
//! records, by name: a record comes (an attach's write-ahead, an adoption, a record rebuilt from
//! a pin), changes, is re-keyed when it names its sandbox, and ends. The engine never edits the
//! checkpoint's records in place; it asks for a [`Transition`] of the record under a key
//! ([`Checkpoint::apply`]) and says how it is saved ([`Durability`]). A transition of a record
//! that is gone (or of a device index the record does not have) is an error,
//! [`StateError::RecordGone`], and changes nothing: the engine holds the pod's lock across every
//! operation, so a record vanishing under it is a bug to be seen, not work silently skipped.
//! Likewise a record never silently takes the place of another ([`StateError::RecordThere`]).

use std::path::PathBuf;

use super::{
    Checkpoint, DeviceAt, DeviceState, PodPhase, PodRecord, RecordKey, ReturnReason, Shared, StateError,
    pod_key,
};

/// How a transition is saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Handed to the writer thread, not waited for: for changes a crash may lose because the
    /// restart's reconcile finds the same truth in the kernel (a device already home). A later
    /// awaited save carries it (the writer saves in order).
    Staged,
    /// On disk before the caller goes on: the write-ahead relies on this.
    Awaited,
}

/// One change to one sandbox record. Each variant says when the engine makes it and how it saves
/// it.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// A return starts: phase `Returning`. Awaited before a hook's return moves anything;
    /// staged by a rescue (its last save carries it).
    MarkReturning,
    /// Every device is home: phase `Returned(reason)`, the pin released. Awaited.
    MarkReturned(ReturnReason),
    /// Every device of an attach is in the pod, at `placed` (in device order): phase `Attached`,
    /// devices `InPod` with their place. Awaited.
    MarkAttached { placed: Vec<DeviceAt> },
    /// An attach failed at device `failed`: every device up to it may be in the pod (`InPod`, at
    /// its place in `placed` when it has one), every later one never left (`Home`). Awaited,
    /// before the rollback's return.
    RollingBack { failed: usize, placed: Vec<DeviceAt> },
    /// Nothing of an attach moved: returned (as a rollback), no pin, every device `Home`.
    /// Awaited.
    Abandon,
    /// The previous checkpoint shows an attach under way, but every device is in the pod: phase
    /// `Attached`, every device `InPod`. Awaited.
    ConfirmAttached,
    /// Device `device` came home restored: `Home`, no place in a pod, no return error. Staged
    /// by a return (its last save waits for it), awaited by a repair.
    DeviceHome { device: usize },
    /// Device `device` came home, but its host name was taken: `HomeNameBusy` under
    /// `temp_name`, no place in a pod, no return error. Awaited (the name it carries must be
    /// known after a crash).
    HomeNameBusy { device: usize, temp_name: String },
    /// Device `device` no longer exists anywhere: `Gone`, no place, no return error, and
    /// [`DeviceRecord::vanish_unreported`](super::DeviceRecord::vanish_unreported) as
    /// `unreported` says. Awaited when `unreported` (the write-ahead of the report: on disk
    /// before it is sent); staged otherwise (the return's last save carries it).
    DeviceGone { device: usize, unreported: bool },
    /// The report of `Gone` device `device` was taken by the reporter's sink: its
    /// `vanish_unreported` is cleared. Awaited (a record ends only after it).
    VanishReported { device: usize },
    /// A rescue gave up with devices still out: each of them (`Moving`, `InPod`, `Returning`)
    /// carries `error` for `dranet status`. Awaited.
    ReturnStuck { error: String },
    /// Device `device`, home under a temporary name, has its own name back (or is no longer
    /// under the temporary one, and no longer waited for): `Home`, no temporary name. Awaited.
    NameBack { device: usize },
    /// Device `device`'s RDMA link is (or may be) in the pod netns, or is home. Awaited: moving
    /// it in is recorded before the move.
    RdmaInPod { device: usize, in_pod: bool },
    /// The record's pin: a new one (the netns pinned again) or none (released, or not the
    /// record's). Awaited.
    SetPin(Option<PathBuf>),
    /// The device named `device` was seen in another netns (tier B): its place. Awaited.
    DeviceMoved { device: String, to: DeviceAt },
    /// An attach writes ahead: the sandbox's record (phase `Attaching`, every device's snapshot
    /// and place in the pod) goes in under its own key before anything moves. It replaces a
    /// record of the same sandbox whose devices are all home (an earlier attach rolled back or
    /// returned), never one with devices out ([`StateError::RecordThere`]: they would be out
    /// with no record of them). Awaited: nothing moves before it is on disk.
    WriteAhead(Shared<PodRecord>),
    /// Adoption records a running sandbox dranet had no record of (phase `Attached`, its
    /// devices in the pod as found), under its own key, where no record is. Awaited, before the
    /// netns is pinned.
    Adopt(Shared<PodRecord>),
    /// The adopted sandbox's netns could not be pinned: the record the adoption wrote goes again
    /// (dranet claims no protection it lacks; the devices stay in the pod as found). Awaited.
    Unadopt,
    /// A pin no record claims holds devices of ours: the record rebuilt from it (no pod UID:
    /// key `/<sandbox id>`; phase `Attached`), under its own key, where no record is. Awaited.
    Rebuilt(Shared<PodRecord>),
    /// A record names its sandbox: one migrated from checkpoint format 1 (no sandbox id) or
    /// rebuilt from a pin (no pod UID) moves to key `to`, whose pod UID and sandbox id it takes,
    /// and learns what `naming` says. It replaces a record under `to` whose devices are all home
    /// (a `.prev` one save behind the attach that made the pin: the record of its rolled-back
    /// attempt), never one with devices out ([`StateError::RecordThere`]). Awaited.
    Rekey { to: RecordKey, naming: Naming },
    /// The record ends: every device home, its pin released, its sandbox gone or going (the
    /// engine decides when). Staged: a crash that loses it leaves a record with every device
    /// home and no pin, which the restart's Synchronize or sweep drops again.
    Drop,
}

/// What a record learns when it names its sandbox ([`Transition::Rekey`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Naming {
    /// The pod's namespace and name, from its plan (a rebuilt record has none).
    pub pod: Option<PodName>,
    /// Devices of a rebuilt record that a device of the pod's plan is, by kernel identity.
    pub devices: Vec<PlannedDevice>,
}

/// A pod's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

/// Device `device` (its index in the record) is the plan's device `name` (ResourceSlice name),
/// which comes home under `host_name` when the plan knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDevice {
    pub device: usize,
    pub name: String,
    pub host_name: Option<String>,
}

impl Transition {
    /// Its name, for errors and logs.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::MarkReturning => "mark_returning",
            Self::MarkReturned(_) => "mark_returned",
            Self::MarkAttached { .. } => "mark_attached",
            Self::RollingBack { .. } => "rolling_back",
            Self::Abandon => "abandon",
            Self::ConfirmAttached => "confirm_attached",
            Self::DeviceHome { .. } => "device_home",
            Self::HomeNameBusy { .. } => "home_name_busy",
            Self::DeviceGone { .. } => "device_gone",
            Self::VanishReported { .. } => "vanish_reported",
            Self::ReturnStuck { .. } => "return_stuck",
            Self::NameBack { .. } => "name_back",
            Self::RdmaInPod { .. } => "rdma_in_pod",
            Self::SetPin(_) => "set_pin",
            Self::DeviceMoved { .. } => "device_moved",
            Self::WriteAhead(_) => "write_ahead",
            Self::Adopt(_) => "adopt",
            Self::Unadopt => "unadopt",
            Self::Rebuilt(_) => "rebuilt",
            Self::Rekey { .. } => "rekey",
            Self::Drop => "drop",
        }
    }

    /// Applies the transition to `rec`; `false` (and `rec` unchanged) when it names a device the
    /// record does not have, or is not a change of one record (those [`Checkpoint::apply`] makes
    /// itself).
    fn apply_to(self, rec: &mut PodRecord) -> bool {
        match self {
            Self::MarkReturning => rec.phase = PodPhase::Returning,
            Self::MarkReturned(reason) => {
                rec.phase = PodPhase::Returned(reason);
                rec.pin = None;
            }
            Self::MarkAttached { placed } => {
                rec.phase = PodPhase::Attached;
                for (d, at) in rec.devices.iter_mut().zip(&placed) {
                    d.state = DeviceState::InPod;
                    d.at = Some(*at);
                }
            }
            Self::RollingBack { failed, placed } => {
                for (i, d) in rec.devices.iter_mut().enumerate() {
                    // The failed device may be half-way: the return finds it at its pod
                    // ifindex or at home.
                    d.state = if i <= failed {
                        DeviceState::InPod
                    } else {
                        DeviceState::Home
                    };
                    if let Some(at) = placed.get(i) {
                        d.at = Some(*at);
                    }
                }
            }
            Self::Abandon => {
                rec.phase = PodPhase::Returned(ReturnReason::Rollback);
                rec.pin = None;
                rec.devices.iter_mut().for_each(|d| d.state = DeviceState::Home);
            }
            Self::ConfirmAttached => {
                rec.phase = PodPhase::Attached;
                rec.devices.iter_mut().for_each(|d| d.state = DeviceState::InPod);
            }
            Self::DeviceHome { device: i } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.state = DeviceState::Home;
                d.at = None;
                d.return_error = None;
            }
            Self::HomeNameBusy { device: i, temp_name } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.state = DeviceState::HomeNameBusy;
                d.temp_name = Some(temp_name);
                d.at = None;
                d.return_error = None;
            }
            Self::DeviceGone {
                device: i,
                unreported,
            } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.state = DeviceState::Gone;
                d.at = None;
                d.return_error = None;
                d.vanish_unreported = unreported;
            }
            Self::VanishReported { device: i } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.vanish_unreported = false;
            }
            Self::ReturnStuck { error } => {
                for d in rec.devices.iter_mut().filter(|d| {
                    matches!(
                        d.state,
                        DeviceState::Moving | DeviceState::InPod | DeviceState::Returning
                    )
                }) {
                    d.return_error = Some(error.clone());
                }
            }
            Self::NameBack { device: i } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.state = DeviceState::Home;
                d.temp_name = None;
            }
            Self::RdmaInPod { device: i, in_pod } => {
                let Some(d) = rec.devices.get_mut(i) else {
                    return false;
                };
                d.rdma_in_pod = in_pod;
            }
            Self::SetPin(pin) => rec.pin = pin,
            Self::DeviceMoved { device, to } => {
                let Some(d) = rec.devices.iter_mut().find(|d| d.device == device) else {
                    return false;
                };
                d.at = Some(to);
            }
            Self::WriteAhead(_)
            | Self::Adopt(_)
            | Self::Unadopt
            | Self::Rebuilt(_)
            | Self::Rekey { .. }
            | Self::Drop => return false,
        }
        true
    }
}

impl Checkpoint {
    /// Applies transition `t` to the record under `key`. The record (or the device `t` names)
    /// being gone is an error, and then nothing changed.
    pub fn apply(&mut self, key: &str, t: Transition) -> Result<(), StateError> {
        let transition = t.name();
        let gone = || StateError::RecordGone {
            key: key.to_owned(),
            transition,
        };
        let t = match t {
            Transition::WriteAhead(rec) => return self.put(key, rec, transition, true),
            Transition::Adopt(rec) | Transition::Rebuilt(rec) => {
                return self.put(key, rec, transition, false);
            }
            Transition::Unadopt | Transition::Drop => {
                return self.pods.remove(key).map(drop).ok_or_else(gone);
            }
            Transition::Rekey { to, naming } => return self.rekey_record(key, to, naming, transition),
            t => t,
        };
        let rec = self.pods.get_mut(key).ok_or_else(gone)?;
        // Checked before the record is written to: a shared record is copied only when it
        // changes.
        let fits = match &t {
            Transition::DeviceHome { device }
            | Transition::HomeNameBusy { device, .. }
            | Transition::DeviceGone { device, .. }
            | Transition::VanishReported { device }
            | Transition::NameBack { device }
            | Transition::RdmaInPod { device, .. } => *device < rec.devices.len(),
            Transition::DeviceMoved { device, .. } => rec.devices.iter().any(|d| &d.device == device),
            _ => true,
        };
        if !fits || !t.apply_to(rec) {
            return Err(gone());
        }
        Ok(())
    }

    /// Puts `rec` under `key`, its own key, where no record is; or, `replace_home`, where the
    /// record has no device out.
    fn put(
        &mut self,
        key: &str,
        rec: Shared<PodRecord>,
        transition: &'static str,
        replace_home: bool,
    ) -> Result<(), StateError> {
        let own = rec.key();
        if own.as_str() != key {
            return Err(StateError::NotItsKey {
                key: key.to_owned(),
                own: own.into(),
                transition,
            });
        }
        if self
            .pods
            .get(key)
            .is_some_and(|there| !replace_home || there.has_devices_out())
        {
            return Err(StateError::RecordThere {
                key: key.to_owned(),
                transition,
            });
        }
        self.pods.insert(own, rec);
        Ok(())
    }

    /// [`Transition::Rekey`] of the record under `key`.
    fn rekey_record(
        &mut self,
        key: &str,
        to: RecordKey,
        naming: Naming,
        transition: &'static str,
    ) -> Result<(), StateError> {
        let gone = || StateError::RecordGone {
            key: key.to_owned(),
            transition,
        };
        let devices = self.pods.get(key).ok_or_else(gone)?.devices.len();
        if naming.devices.iter().any(|d| d.device >= devices) {
            return Err(gone());
        }
        let own = pod_key(to.pod_uid(), to.sandbox_id());
        if own != to {
            return Err(StateError::NotItsKey {
                key: to.into(),
                own: own.into(),
                transition,
            });
        }
        if to.as_str() != key && self.pods.get(&to).is_some_and(|r| r.has_devices_out()) {
            return Err(StateError::RecordThere {
                key: to.into(),
                transition,
            });
        }
        let mut rec = self.pods.remove(key).ok_or_else(gone)?;
        rec.pod_uid = to.pod_uid().to_owned();
        rec.sandbox_id = to.sandbox_id().to_owned();
        if let Some(p) = naming.pod {
            rec.namespace = p.namespace;
            rec.name = p.name;
        }
        for p in naming.devices {
            if let Some(d) = rec.devices.get_mut(p.device) {
                d.device = p.name;
                if let Some(h) = p.host_name {
                    d.snapshot.name = h;
                }
            }
        }
        self.pods.insert(to, rec);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::netns::NetnsId;
    use crate::test_support::device_record;

    const KEY: &str = "uid-1/sb-1";

    fn cp() -> Checkpoint {
        let mut cp = Checkpoint::default();
        let rec = PodRecord {
            pod_uid: "uid-1".into(),
            sandbox_id: "sb-1".into(),
            namespace: "ns".into(),
            name: "p".into(),
            netns_path: "/var/run/netns/x".into(),
            netns: NetnsId::test(7, 9),
            pin: Some("/run/dranet/pins/sb-1".into()),
            phase: PodPhase::Attaching,
            devices: vec![
                device_record("dev-a", DeviceState::Moving),
                device_record("dev-b", DeviceState::Moving),
            ],
            recovered: None,
        };
        cp.pods.insert(KEY.into(), rec.into());
        cp
    }

    fn at(ifindex: u32) -> DeviceAt {
        DeviceAt {
            ifindex: crate::ids::PodIfindex::new(ifindex),
            netns: NetnsId::test(7, 9),
        }
    }

    /// A transition of a record that is gone, or of a device it does not have, fails loudly
    /// and changes nothing (the engine's closures did nothing, silently); so does the end of a
    /// record that is gone.
    #[test]
    fn a_transition_of_a_gone_record_or_device_is_an_error_and_changes_nothing() {
        let mut c = cp();
        let before = c.clone();
        for (key, t) in [
            ("uid-1/sb-2", Transition::MarkReturning),
            ("uid-2/sb-1", Transition::SetPin(None)),
            (KEY, Transition::DeviceHome { device: 2 }),
            (KEY, Transition::NameBack { device: 7 }),
            (
                KEY,
                Transition::DeviceMoved {
                    device: "dev-z".into(),
                    to: at(3),
                },
            ),
        ] {
            let name = t.name();
            match c.apply(key, t) {
                Err(StateError::RecordGone { key: k, transition }) => {
                    assert_eq!((k.as_str(), transition), (key, name));
                }
                other => panic!("{name} on {key}: {other:?}"),
            }
            assert_eq!(c, before, "{name} changed the checkpoint");
        }
        assert!(matches!(
            c.apply("uid-1/sb-2", Transition::Drop),
            Err(StateError::RecordGone { .. })
        ));
        assert_eq!(c, before);
        c.apply(KEY, Transition::Drop).unwrap();
        assert!(c.pods.is_empty());
        assert!(matches!(
            c.apply(KEY, Transition::MarkReturning),
            Err(StateError::RecordGone { .. })
        ));
    }

    fn legacy() -> PodRecord {
        let mut r = (*cp().pods[KEY]).clone();
        r.sandbox_id = String::new();
        r
    }

    fn rekey(to: &str) -> Transition {
        Transition::Rekey {
            to: pod_key(to.split_once('/').unwrap().0, to.split_once('/').unwrap().1),
            naming: Naming::default(),
        }
    }

    /// A re-key of a record that is gone (named by another sandbox meanwhile, dropped) is an
    /// error and changes nothing; before, the engine's closure skipped it and the sandbox went on
    /// as if its record were named.
    #[test]
    fn a_rekey_of_a_gone_record_is_refused() {
        let mut c = cp();
        let before = c.clone();
        for (from, t) in [
            ("uid-1/", rekey("uid-1/sb-9")),
            ("/sb-1", rekey("uid-1/sb-1")),
            (
                KEY,
                Transition::Rekey {
                    to: pod_key("uid-1", "sb-9"),
                    naming: Naming {
                        pod: None,
                        devices: vec![PlannedDevice {
                            device: 2,
                            name: "dev-z".into(),
                            host_name: None,
                        }],
                    },
                },
            ),
        ] {
            match c.apply(from, t) {
                Err(StateError::RecordGone { key, transition }) => {
                    assert_eq!((key.as_str(), transition), (from, "rekey"));
                }
                other => panic!("rekey of {from}: {other:?}"),
            }
            assert_eq!(c, before, "rekey of {from} changed the checkpoint");
        }
    }

    /// A re-key never puts a record in the place of one with devices out: the sandbox's own
    /// record stays, and so does the one that would have taken its place. One whose devices are
    /// all home is replaced.
    #[test]
    fn a_rekey_onto_a_taken_key_is_refused() {
        let mut c = cp();
        let old = legacy();
        c.pods.insert(old.key(), old.into());
        let before = c.clone();
        match c.apply("uid-1/", rekey(KEY)) {
            Err(StateError::RecordThere { key, transition }) => {
                assert_eq!((key.as_str(), transition), (KEY, "rekey"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c, before);
        // A key that is not a record's own (`<pod-uid>/<sandbox-id>`) is refused too.
        let bad = Transition::Rekey {
            to: serde_json::from_str("\"uid-1\"").unwrap(),
            naming: Naming::default(),
        };
        assert!(matches!(
            c.apply("uid-1/", bad),
            Err(StateError::NotItsKey { .. })
        ));
        assert_eq!(c, before);
        c.apply(KEY, Transition::Abandon).unwrap();
        c.apply("uid-1/", rekey(KEY)).unwrap();
        assert_eq!(c, cp());
    }

    /// A record rebuilt from a pin names its sandbox: its ids from the new key, the pod's name,
    /// its devices' plan names; a format-1 record takes its sandbox id.
    #[test]
    fn a_rekey_names_the_record_and_moves_it() {
        let mut c = Checkpoint::default();
        let mut rebuilt = legacy();
        rebuilt.pod_uid = String::new();
        rebuilt.sandbox_id = "sb-1".into();
        (rebuilt.namespace, rebuilt.name) = (String::new(), String::new());
        c.apply("/sb-1", Transition::Rebuilt(rebuilt.clone().into()))
            .unwrap();
        c.apply(
            "/sb-1",
            Transition::Rekey {
                to: pod_key("uid-1", "sb-1"),
                naming: Naming {
                    pod: Some(PodName {
                        namespace: "ns".into(),
                        name: "p".into(),
                    }),
                    devices: vec![PlannedDevice {
                        device: 1,
                        name: "pci-0000-3b-00-1".into(),
                        host_name: Some("eth7".into()),
                    }],
                },
            },
        )
        .unwrap();
        assert!(!c.pods.contains_key("/sb-1"));
        let r = c.record(KEY).unwrap();
        assert_eq!(r.key(), KEY);
        assert_eq!((r.namespace.as_str(), r.name.as_str()), ("ns", "p"));
        assert_eq!(r.devices[0], rebuilt.devices[0]);
        assert_eq!(r.devices[1].device, "pci-0000-3b-00-1");
        assert_eq!(r.devices[1].snapshot.name, "eth7");
        let mut c = Checkpoint::default();
        c.pods.insert(legacy().key(), legacy().into());
        c.apply("uid-1/", rekey(KEY)).unwrap();
        assert_eq!(c, cp());
    }

    /// A write-ahead replaces a record of its sandbox whose devices are all home (an attach again
    /// after a rollback), never one with devices out; adoption and rebuilt records go only where
    /// no record is; every record goes under its own key.
    #[test]
    fn a_new_record_never_hides_one_with_devices_out() {
        let mut c = cp();
        let rec = || c_rec(&cp());
        let before = c.clone();
        for t in [
            Transition::WriteAhead(rec().into()),
            Transition::Adopt(rec().into()),
            Transition::Rebuilt(rec().into()),
        ] {
            let name = t.name();
            match c.apply(KEY, t) {
                Err(StateError::RecordThere { key, transition }) => {
                    assert_eq!((key.as_str(), transition), (KEY, name));
                }
                other => panic!("{name}: {other:?}"),
            }
            assert_eq!(c, before, "{name} changed the checkpoint");
        }
        assert!(matches!(
            c.apply("uid-1/sb-2", Transition::WriteAhead(rec().into())),
            Err(StateError::NotItsKey { .. })
        ));
        assert_eq!(c, before);
        c.apply(KEY, Transition::Abandon).unwrap();
        c.apply(KEY, Transition::WriteAhead(rec().into())).unwrap();
        assert_eq!(c, before);
        c.apply(KEY, Transition::Abandon).unwrap();
        assert!(matches!(
            c.apply(KEY, Transition::Adopt(rec().into())),
            Err(StateError::RecordThere { .. })
        ));
        c.apply(KEY, Transition::Unadopt).unwrap();
        c.apply(KEY, Transition::Adopt(rec().into())).unwrap();
        assert_eq!(c, before);
        assert!(matches!(
            c.apply("uid-1/sb-2", Transition::Unadopt),
            Err(StateError::RecordGone { .. })
        ));
    }

    fn c_rec(c: &Checkpoint) -> PodRecord {
        (*c.pods[KEY]).clone()
    }

    /// An attach, its return with a name taken, the name back: each step by name.
    #[test]
    fn the_life_of_a_record_in_transitions() {
        let mut c = cp();
        c.apply(
            KEY,
            Transition::MarkAttached {
                placed: vec![at(11), at(12)],
            },
        )
        .unwrap();
        let r = c.record(KEY).unwrap();
        assert_eq!(r.phase, PodPhase::Attached);
        assert!(r.devices.iter().all(|d| d.state == DeviceState::InPod));
        assert_eq!(r.devices[1].at, Some(at(12)));
        c.apply(KEY, Transition::MarkReturning).unwrap();
        c.apply(KEY, Transition::DeviceHome { device: 0 }).unwrap();
        c.apply(
            KEY,
            Transition::HomeNameBusy {
                device: 1,
                temp_name: "dn7".into(),
            },
        )
        .unwrap();
        c.apply(KEY, Transition::MarkReturned(ReturnReason::Hook))
            .unwrap();
        let r = c.record(KEY).unwrap();
        assert_eq!(r.phase, PodPhase::Returned(ReturnReason::Hook));
        assert_eq!(r.pin, None);
        assert_eq!((r.devices[0].state, r.devices[0].at), (DeviceState::Home, None));
        assert_eq!(r.devices[1].state, DeviceState::HomeNameBusy);
        assert_eq!(r.devices[1].temp_name.as_deref(), Some("dn7"));
        assert_eq!(r.devices[1].at, None);
        c.apply(KEY, Transition::NameBack { device: 1 }).unwrap();
        let r = c.record(KEY).unwrap();
        assert_eq!(
            (r.devices[1].state, r.devices[1].temp_name.as_deref()),
            (DeviceState::Home, None)
        );
        assert!(!r.has_devices_out());
    }

    /// A failed attach: the devices up to the failed one may be in the pod, the rest never left;
    /// nothing moved at all is abandoned as a rollback.
    #[test]
    fn rollback_and_abandon_say_where_each_device_may_be() {
        let mut c = cp();
        c.apply(
            KEY,
            Transition::RollingBack {
                failed: 0,
                placed: vec![at(11)],
            },
        )
        .unwrap();
        let r = c.record(KEY).unwrap();
        assert_eq!(r.devices[0].state, DeviceState::InPod);
        assert_eq!(r.devices[0].at, Some(at(11)));
        assert_eq!(r.devices[1].state, DeviceState::Home);
        c.apply(KEY, Transition::Abandon).unwrap();
        let r = c.record(KEY).unwrap();
        assert_eq!(r.phase, PodPhase::Returned(ReturnReason::Rollback));
        assert_eq!(r.pin, None);
        assert!(r.devices.iter().all(|d| d.state == DeviceState::Home));
    }

    /// The record key is a type of its own but the plain string it always was on disk, built
    /// from ids checked once at the boundary.
    #[test]
    fn a_record_key_is_its_plain_string_on_disk() {
        use crate::state::RecordKey;
        let key = RecordKey::new(
            &crate::ids::pod_uid("uid-1").unwrap(),
            &crate::ids::sandbox_id("sb-1").unwrap(),
        );
        assert_eq!(key, KEY);
        assert_eq!((key.pod_uid(), key.sandbox_id()), ("uid-1", "sb-1"));
        assert_eq!(serde_json::to_string(&key).unwrap(), format!("\"{KEY}\""));
        let c = cp();
        let json = serde_json::to_value(&c).unwrap();
        assert!(json["pods"][KEY].is_object(), "{json}");
        let back: Checkpoint = serde_json::from_value(json).unwrap();
        assert_eq!(back, c);
        assert!(crate::ids::sandbox_id("a/b").is_err() && crate::ids::pod_uid("a/b").is_err());
    }
}
