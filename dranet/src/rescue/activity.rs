//! The engine's activity feed: hook calls, rescue decisions and returns, timestamped with the
//! watcher's clock (CLOCK_MONOTONIC) so `dranet trace` can put them on one timeline with the
//! kernel events. Served as JSON lines on `<state-dir>/events.sock` (root only) by `dranet run`.

use serde::{Deserialize, Serialize};

use super::decide::RescueTrigger;
use super::detach::StuckReason;
use crate::state::ReturnReason;

/// One thing the daemon did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// CLOCK_MONOTONIC, ns.
    pub at: crate::clock::MonoTime,
    pub pod_uid: String,
    /// `namespace/name`, when known.
    #[serde(default)]
    pub pod: String,
    /// The runtime's netns path, when known.
    #[serde(default)]
    pub netns_path: Option<String>,
    pub kind: ActivityKind,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ActivityKind {
    /// A runtime hook arrived (RunPodSandbox, StopPodSandbox, RemovePodSandbox, ...): on the
    /// wire its NRI method name, as before it had a type.
    Hook { name: crate::nri::hooks::PodHook },
    /// Devices moved into the pod.
    Attached { devices: Vec<String>, took_us: u64 },
    /// The watcher saw the pod's netns being torn down; a rescue starts.
    RescueStarted { trigger: RescueTrigger },
    /// Every device of the pod is home.
    Returned {
        reason: ReturnReason,
        devices: Vec<String>,
        took_us: u64,
    },
    /// A return or attach failed (will be retried where possible).
    Failed {
        action: FailedAction,
        error: String,
        /// The one device concerned (a repair), if not the pod's devices.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<String>,
    },
    /// A device no longer exists anywhere (deleted while in the pod): its record ends. Sent once
    /// per process; a restart sends it again while its record still says it is unreported
    /// ([`crate::state::DeviceRecord::vanish_unreported`]).
    Vanished {
        /// ResourceSlice device name.
        device: String,
        /// Its host name before the attach.
        host_name: String,
        /// The sandbox record it was in (its key): with the pod and the device, it fixes the
        /// report's event name, and the reporter's confirmation names it.
        #[serde(default)]
        record: String,
    },
    /// A return still failed after the rescue's retries: the devices stay out (in the pinned
    /// pod netns) until the next trigger, hook or reconcile. Sent once per rescue given up.
    ReturnStuck {
        /// ResourceSlice device names of the devices still out.
        devices: Vec<String>,
        /// `name_taken`, `timeout` or `other`.
        reason: StuckReason,
        error: String,
    },
}

/// What failed, in a [`ActivityKind::Failed`] entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailedAction {
    /// An attach (moving devices into the pod).
    Attach,
    /// A return (bringing the pod's devices home).
    Return,
    /// The repair of one device the kernel handed back.
    Repair,
}

impl FailedAction {
    /// `attach`, `return` or `repair`: its name on the feed and in `dranet trace`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Return => "return",
            Self::Repair => "repair",
        }
    }
}

impl std::fmt::Display for FailedAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The feed's JSON lines (read by `dranet trace`) name triggers, reasons and actions by
    /// their labels, and read back as the same values.
    #[test]
    fn typed_kinds_are_their_labels_on_the_wire() {
        let kinds = [
            (
                ActivityKind::RescueStarted {
                    trigger: RescueTrigger::NetnsUnlinked,
                },
                r#"{"type":"rescue_started","trigger":"netns_unlinked"}"#,
            ),
            (
                ActivityKind::Returned {
                    reason: ReturnReason::NetnsTeardown,
                    devices: vec!["eth1".into()],
                    took_us: 7,
                },
                r#"{"type":"returned","reason":"netns_teardown","devices":["eth1"],"took_us":7}"#,
            ),
            (
                ActivityKind::Failed {
                    action: FailedAction::Repair,
                    error: "e".into(),
                    device: Some("eth1".into()),
                },
                r#"{"type":"failed","action":"repair","error":"e","device":"eth1"}"#,
            ),
            (
                ActivityKind::ReturnStuck {
                    devices: vec![],
                    reason: StuckReason::NameTaken,
                    error: "e".into(),
                },
                r#"{"type":"return_stuck","devices":[],"reason":"name_taken","error":"e"}"#,
            ),
        ];
        for (kind, json) in kinds {
            assert_eq!(serde_json::to_string(&kind).unwrap(), json);
            assert_eq!(serde_json::from_str::<ActivityKind>(json).unwrap(), kind);
        }
        assert!(
            serde_json::from_str::<ActivityKind>(r#"{"type":"failed","action":"bogus","error":""}"#).is_err()
        );
    }
}
