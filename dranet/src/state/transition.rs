//! The vocabulary of record transitions: every change the rescue engine makes to an existing
//! sandbox record, by name. The engine never edits a record in place; it asks for a
//! [`Transition`] of the record under a key ([`Checkpoint::apply`]) and says how it is saved
//! ([`Durability`]). A transition of a record that is gone (or of a device index the record does
//! not have) is an error, [`StateError::RecordGone`], and changes nothing: the engine holds the
//! pod's lock across every operation, so a record vanishing under it is a bug to be seen, not
//! work silently skipped.
//!
//! Records come and go through [`Checkpoint::pods`] directly (an attach's write-ahead inserts
//! one, adoption and the naming of legacy or rebuilt records re-key one, a drop removes one).

use std::path::PathBuf;

use super::{Checkpoint, DeviceAt, DeviceState, PodPhase, PodRecord, ReturnReason, StateError};

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
        }
    }

    /// Applies the transition to `rec`; `false` (and `rec` unchanged) when it names a device the
    /// record does not have.
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

    /// Drops the record under `key` (its devices home); whether there was one.
    pub fn drop_record(&mut self, key: &str) -> bool {
        self.pods.remove(key).is_some()
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
            netns: NetnsId { cookie: 7, inode: 9 },
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
            ifindex,
            netns: NetnsId { cookie: 7, inode: 9 },
        }
    }

    /// A transition of a record that is gone, or of a device it does not have, fails loudly
    /// and changes nothing (the engine's closures did nothing, silently).
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
        assert!(!c.drop_record("uid-1/sb-2"));
        assert!(c.drop_record(KEY));
        assert!(matches!(
            c.apply(KEY, Transition::MarkReturning),
            Err(StateError::RecordGone { .. })
        ));
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
