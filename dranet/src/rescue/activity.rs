//! The engine's activity feed: hook calls, rescue decisions and returns, timestamped with the
//! watcher's clock (CLOCK_MONOTONIC) so `dranet trace` can put them on one timeline with the
//! kernel events. Served as JSON lines on `<state-dir>/events.sock` (root only) by `dranet run`.

use serde::{Deserialize, Serialize};

/// One thing the daemon did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// CLOCK_MONOTONIC, ns.
    pub at: u64,
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
    RescueStarted { trigger: String },
    /// Every device of the pod is home.
    Returned {
        reason: String,
        devices: Vec<String>,
        took_us: u64,
    },
    /// A return or attach failed (will be retried where possible).
    Failed {
        action: String,
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
        reason: String,
        error: String,
    },
}
