//! What the NRI plugin asks of the driver: the pod hooks, in plain Rust types.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;

use super::pb::nri as pb;

/// An NRI call dranet answers: the pod hooks, CreateContainer, and the plugin's Synchronize and
/// Shutdown. The runtime names them by method (the ttrpc method and `StateChange`'s event); they
/// are parsed once, at the service, and carried as this type: the name is only the metric label
/// (upstream dranet's `method`) and what logs and the activity feed show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PodHook {
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    CreateContainer,
    Synchronize,
    Shutdown,
}

impl PodHook {
    /// Every call, in the order the runtime makes them.
    pub const ALL: [Self; 6] = [
        Self::Synchronize,
        Self::RunPodSandbox,
        Self::CreateContainer,
        Self::StopPodSandbox,
        Self::RemovePodSandbox,
        Self::Shutdown,
    ];

    /// The NRI method name (also the `method` label of the hook metrics).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::RunPodSandbox => "RunPodSandbox",
            Self::StopPodSandbox => "StopPodSandbox",
            Self::RemovePodSandbox => "RemovePodSandbox",
            Self::CreateContainer => "CreateContainer",
            Self::Synchronize => "Synchronize",
            Self::Shutdown => "Shutdown",
        }
    }

    /// The call a ttrpc method names (`None`: not one of these, e.g. `Configure`).
    #[must_use]
    pub fn from_method(method: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == method)
    }
}

impl std::fmt::Display for PodHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The two hooks that end a sandbox: Stop returns its devices, Remove also forgets its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Teardown {
    Stop,
    Remove,
}

impl Teardown {
    #[must_use]
    pub const fn hook(self) -> PodHook {
        match self {
            Self::Stop => PodHook::StopPodSandbox,
            Self::Remove => PodHook::RemovePodSandbox,
        }
    }
}

/// A pod as the runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    /// Kubernetes pod UID.
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The runtime's sandbox id.
    pub id: String,
    /// Path of the pod's network namespace; `None` for a hostNetwork pod (or when the runtime
    /// sends none, as containerd does on RemovePodSandbox).
    pub netns: Option<PathBuf>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A container as the runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerInfo {
    pub id: String,
    pub pod_sandbox_id: String,
    pub name: String,
}

/// Device node type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    Char,
    Block,
}

/// A device node to inject into a container (`adjust.linux.devices`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LinuxDevice {
    pub path: String,
    pub kind: DeviceKind,
    pub major: i64,
    pub minor: i64,
    pub file_mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// What a hook did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It changed something (devices attached or returned).
    Applied,
    /// Nothing to do for this pod.
    Noop,
}

/// A hook failure.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The hook tried and failed.
    #[error("pod {pod}: {action} failed")]
    Failed {
        pod: String,
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The pod cannot be served as asked (e.g. devices for a hostNetwork pod).
    #[error("pod {pod} rejected: {reason}")]
    Rejected { pod: String, reason: String },
}

/// The driver's side of NRI.
pub trait PodHooks: Send + Sync + 'static {
    /// The sandbox exists (netns set up, CNI done): attach the pod's devices. An error fails the
    /// sandbox.
    fn run_pod_sandbox(&self, pod: Pod) -> impl Future<Output = Result<Outcome, HookError>> + Send;
    /// The sandbox is stopping: return the devices (best effort; errors are only logged).
    fn stop_pod_sandbox(&self, pod: Pod) -> impl Future<Output = Result<Outcome, HookError>> + Send;
    /// The sandbox is removed (best effort; errors are only logged).
    fn remove_pod_sandbox(&self, pod: Pod) -> impl Future<Output = Result<Outcome, HookError>> + Send;
    /// A container is created: the device nodes to inject.
    fn create_container(
        &self,
        pod: Pod,
        c: ContainerInfo,
    ) -> impl Future<Output = Result<Vec<LinuxDevice>, HookError>> + Send;
    /// After (re)registration: every pod and container the runtime knows.
    fn synchronize(&self, pods: Vec<Pod>, containers: Vec<ContainerInfo>) -> impl Future<Output = ()> + Send;
    /// The runtime is going down.
    fn shutdown(&self) -> impl Future<Output = ()> + Send;
    /// [`PodHooks::run_pod_sandbox`] attached the pod's devices, but the runtime had given up on
    /// the call first (its request timeout passed, or it closed the connection): it ran the
    /// sandbox without waiting, and its containers may have started before the devices were
    /// there. Tell the operator.
    fn answered_late(&self, _pod: Pod, _took: std::time::Duration) {}
}

impl From<&pb::PodSandbox> for Pod {
    fn from(p: &pb::PodSandbox) -> Self {
        let netns = p
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.iter().find(|n| n.r#type == "network"))
            .filter(|n| !n.path.is_empty())
            .map(|n| PathBuf::from(&n.path));
        Pod {
            uid: p.uid.clone(),
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            id: p.id.clone(),
            netns,
            labels: p.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            annotations: p
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }
}

impl From<&pb::Container> for ContainerInfo {
    fn from(c: &pb::Container) -> Self {
        ContainerInfo {
            id: c.id.clone(),
            pod_sandbox_id: c.pod_sandbox_id.clone(),
            name: c.name.clone(),
        }
    }
}

impl From<&LinuxDevice> for pb::LinuxDevice {
    fn from(d: &LinuxDevice) -> Self {
        pb::LinuxDevice {
            path: d.path.clone(),
            r#type: match d.kind {
                DeviceKind::Char => "c".into(),
                DeviceKind::Block => "b".into(),
            },
            major: d.major,
            minor: d.minor,
            file_mode: d.file_mode.map(|value| pb::OptionalFileMode { value }),
            uid: d.uid.map(|value| pb::OptionalUInt32 { value }),
            gid: d.gid.map(|value| pb::OptionalUInt32 { value }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(ns: &[(&str, &str)]) -> pb::PodSandbox {
        pb::PodSandbox {
            id: "sb1".into(),
            uid: "u1".into(),
            name: "p".into(),
            namespace: "default".into(),
            labels: [("a".to_string(), "b".to_string())].into_iter().collect(),
            linux: Some(pb::LinuxPodSandbox {
                namespaces: ns
                    .iter()
                    .map(|(t, p)| pb::LinuxNamespace {
                        r#type: (*t).into(),
                        path: (*p).into(),
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pod_takes_the_network_namespace_path() {
        let p = Pod::from(&sandbox(&[("ipc", "/x"), ("network", "/var/run/netns/cni-1")]));
        assert_eq!(p.netns, Some(PathBuf::from("/var/run/netns/cni-1")));
        assert_eq!(
            (p.uid.as_str(), p.id.as_str(), p.labels["a"].as_str()),
            ("u1", "sb1", "b")
        );
        assert_eq!(Pod::from(&sandbox(&[("network", "")])).netns, None);
        assert_eq!(Pod::from(&sandbox(&[("ipc", "/x")])).netns, None);
        assert_eq!(Pod::from(&pb::PodSandbox::default()).netns, None);
    }

    #[test]
    fn device_to_proto() {
        let d = LinuxDevice {
            path: "/dev/infiniband/uverbs0".into(),
            kind: DeviceKind::Char,
            major: 231,
            minor: 192,
            file_mode: Some(0o666),
            uid: None,
            gid: Some(0),
        };
        let p = pb::LinuxDevice::from(&d);
        assert_eq!((p.r#type.as_str(), p.major, p.minor), ("c", 231, 192));
        assert_eq!(p.file_mode.map(|m| m.value), Some(0o666));
        assert!(p.uid.is_none());
        assert_eq!(p.gid.map(|g| g.value), Some(0));
    }

    /// The hook is parsed from its method name once; the name is the metric label and the
    /// activity feed's wire form, as before it had a type.
    #[test]
    fn pod_hooks_parse_from_their_method_and_keep_their_wire_names() {
        for h in PodHook::ALL {
            assert_eq!(PodHook::from_method(h.name()), Some(h));
            assert_eq!(h.to_string(), h.name());
            assert_eq!(serde_json::to_string(&h).unwrap(), format!("\"{}\"", h.name()));
        }
        assert_eq!(PodHook::from_method("Configure"), None);
        assert_eq!(PodHook::from_method("StateChange"), None);
        assert_eq!(PodHook::from_method("removePodSandbox"), None);
        assert_eq!(Teardown::Stop.hook(), PodHook::StopPodSandbox);
        assert_eq!(Teardown::Remove.hook(), PodHook::RemovePodSandbox);
        let a = crate::rescue::activity::ActivityKind::Hook {
            name: PodHook::StopPodSandbox,
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"type":"hook","name":"StopPodSandbox"}"#
        );
    }
}
