//! kubelet's side of the Container Runtime Interface (runtime.v1 over gRPC on a unix socket),
//! for driving a real containerd as kubelet drives it: the pod sandbox config kubelet sends (pod
//! metadata with its UID and attempt, labels, the pod network namespace, a cgroup parent), the
//! container config of a pod's container, and the calls in kubelet's order. The `.proto`
//! (`proto/cri/v1/api.proto`) is our own subset with the public field numbers. Test support only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tonic::transport::Channel;

/// Generated CRI client code (see `build.rs`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/runtime.v1.rs"));
}

use pb::image_service_client::ImageServiceClient;
use pb::runtime_service_client::RuntimeServiceClient;

/// The pod a sandbox is for: kubelet's PodSandboxMetadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// 0 for the first sandbox of the pod, +1 for each re-creation.
    pub attempt: u32,
}

/// A CRI client on one runtime socket.
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// Where pod log directories go (kubelet's `/var/log/pods`).
    pub log_root: PathBuf,
    /// The cgroup parent of every pod (kubelet's `kubepods/besteffort`), cgroupfs style.
    pub cgroup_root: String,
}

/// kubelet's labels on a sandbox.
fn pod_labels(p: &PodIdentity) -> HashMap<String, String> {
    HashMap::from([
        ("io.kubernetes.pod.name".to_owned(), p.name.clone()),
        ("io.kubernetes.pod.namespace".to_owned(), p.namespace.clone()),
        ("io.kubernetes.pod.uid".to_owned(), p.uid.clone()),
    ])
}

/// The namespace options kubelet sends for a pod without host namespaces: network and IPC of the
/// pod, PID per container.
#[must_use]
pub fn pod_namespaces() -> pb::NamespaceOption {
    pb::NamespaceOption {
        network: pb::NamespaceMode::Pod.into(),
        pid: pb::NamespaceMode::Container.into(),
        ipc: pb::NamespaceMode::Pod.into(),
        target_id: String::new(),
    }
}

impl Cri {
    /// Connects to the runtime's gRPC socket.
    pub async fn connect(socket: &Path, log_root: PathBuf, cgroup_root: String) -> Result<Self> {
        let ch = crate::kubelet::uds_channel(socket).await?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(ch.clone()),
            images: ImageServiceClient::new(ch),
            log_root,
            cgroup_root,
        })
    }

    /// The sandbox config kubelet builds for `p`.
    #[must_use]
    pub fn sandbox_config(&self, p: &PodIdentity) -> pb::PodSandboxConfig {
        pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: p.name.clone(),
                uid: p.uid.clone(),
                namespace: p.namespace.clone(),
                attempt: p.attempt,
            }),
            hostname: p.name.clone(),
            log_directory: self.pod_log_dir(p).display().to_string(),
            labels: pod_labels(p),
            annotations: HashMap::from([("kubernetes.io/config.source".to_owned(), "api".to_owned())]),
            linux: Some(pb::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/pod{}", self.cgroup_root, p.uid),
                security_context: Some(pb::LinuxSandboxSecurityContext {
                    namespace_options: Some(pod_namespaces()),
                    ..Default::default()
                }),
                sysctls: HashMap::new(),
            }),
        }
    }

    /// Version (kubelet's first call).
    pub async fn version(&self) -> Result<pb::VersionResponse> {
        Ok(self
            .runtime
            .clone()
            .version(pb::VersionRequest { version: "v1".into() })
            .await
            .context("CRI Version")?
            .into_inner())
    }

    /// The pod's log directory (kubelet's `/var/log/pods/<ns>_<name>_<uid>`).
    #[must_use]
    pub fn pod_log_dir(&self, p: &PodIdentity) -> PathBuf {
        self.log_root
            .join(format!("{}_{}_{}", p.namespace, p.name, p.uid))
    }

    /// RunPodSandbox; the sandbox id. kubelet makes the pod's log directory first.
    pub async fn run_pod_sandbox(&self, p: &PodIdentity) -> Result<String> {
        std::fs::create_dir_all(self.pod_log_dir(p))?;
        Ok(self
            .runtime
            .clone()
            .run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(self.sandbox_config(p)),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("RunPodSandbox {}/{} (attempt {})", p.namespace, p.name, p.attempt))?
            .into_inner()
            .pod_sandbox_id)
    }

    /// CreateContainer `name` from `image` in the sandbox, then StartContainer; the container id.
    pub async fn create_and_start(
        &self,
        sandbox_id: &str,
        p: &PodIdentity,
        name: &str,
        image: &str,
    ) -> Result<String> {
        // kubelet makes the container's log directory before CreateContainer.
        std::fs::create_dir_all(self.pod_log_dir(p).join(name))?;
        let config = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(pb::ImageSpec {
                image: image.to_owned(),
                user_specified_image: image.to_owned(),
                ..Default::default()
            }),
            log_path: format!("{name}/0.log"),
            labels: {
                let mut l = pod_labels(p);
                l.insert("io.kubernetes.container.name".into(), name.into());
                l
            },
            linux: Some(pb::LinuxContainerConfig {
                security_context: Some(pb::LinuxContainerSecurityContext {
                    namespace_options: Some(pod_namespaces()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let id = self
            .runtime
            .clone()
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
                config: Some(config),
                sandbox_config: Some(self.sandbox_config(p)),
            })
            .await
            .with_context(|| format!("CreateContainer {name}"))?
            .into_inner()
            .container_id;
        self.runtime
            .clone()
            .start_container(pb::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .with_context(|| format!("StartContainer {name}"))?;
        Ok(id)
    }

    /// RunPodSandbox of a sandbox config built by the caller (e.g. a DaemonSet pod's, with host
    /// namespaces); the sandbox id. The pod's log directory is made first, as kubelet does.
    pub async fn run_pod_sandbox_config(&self, config: pb::PodSandboxConfig) -> Result<String> {
        std::fs::create_dir_all(&config.log_directory)?;
        Ok(self
            .runtime
            .clone()
            .run_pod_sandbox(pb::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .context("RunPodSandbox")?
            .into_inner()
            .pod_sandbox_id)
    }

    /// CreateContainer of a container config built by the caller, then StartContainer; the
    /// container id. The container's log directory is made first.
    pub async fn create_and_start_config(
        &self,
        sandbox_id: &str,
        config: pb::ContainerConfig,
        sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String> {
        let log = Path::new(&sandbox_config.log_directory).join(&config.log_path);
        if let Some(d) = log.parent() {
            std::fs::create_dir_all(d)?;
        }
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let id = self
            .runtime
            .clone()
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            })
            .await
            .with_context(|| format!("CreateContainer {name}"))?
            .into_inner()
            .container_id;
        self.runtime
            .clone()
            .start_container(pb::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .with_context(|| format!("StartContainer {name}"))?;
        Ok(id)
    }

    /// StopContainer with kubelet's grace period (seconds).
    pub async fn stop_container(&self, id: &str, grace: i64) -> Result<()> {
        self.runtime
            .clone()
            .stop_container(pb::StopContainerRequest {
                container_id: id.to_owned(),
                timeout: grace,
            })
            .await
            .context("StopContainer")?;
        Ok(())
    }

    /// RemoveContainer.
    pub async fn remove_container(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .remove_container(pb::RemoveContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .context("RemoveContainer")?;
        Ok(())
    }

    /// StopPodSandbox.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .stop_pod_sandbox(pb::StopPodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .context("StopPodSandbox")?;
        Ok(())
    }

    /// RemovePodSandbox.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        self.runtime
            .clone()
            .remove_pod_sandbox(pb::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_owned(),
            })
            .await
            .context("RemovePodSandbox")?;
        Ok(())
    }

    /// PodSandboxStatus (verbose: with the runtime's info map).
    pub async fn pod_sandbox_status(&self, id: &str) -> Result<pb::PodSandboxStatusResponse> {
        Ok(self
            .runtime
            .clone()
            .pod_sandbox_status(pb::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: true,
            })
            .await
            .context("PodSandboxStatus")?
            .into_inner())
    }

    /// The pod network namespace path of a sandbox, from the runtime spec in its verbose status
    /// info (`None` when the runtime reports none).
    pub async fn netns_path(&self, id: &str) -> Result<Option<String>> {
        let st = self.pod_sandbox_status(id).await?;
        Ok(netns_from_info(&st.info))
    }

    /// ListPodSandbox, all of them.
    pub async fn list_pod_sandboxes(&self) -> Result<Vec<pb::PodSandbox>> {
        Ok(self
            .runtime
            .clone()
            .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
            .await
            .context("ListPodSandbox")?
            .into_inner()
            .items)
    }

    /// ImageStatus: whether the runtime has `image`.
    pub async fn has_image(&self, image: &str) -> Result<bool> {
        Ok(self
            .images
            .clone()
            .image_status(pb::ImageStatusRequest {
                image: Some(pb::ImageSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .context("ImageStatus")?
            .into_inner()
            .image
            .is_some())
    }

    /// ListImages: every tag the runtime knows.
    pub async fn image_tags(&self) -> Result<Vec<String>> {
        Ok(self
            .images
            .clone()
            .list_images(pb::ListImagesRequest { filter: None })
            .await
            .context("ListImages")?
            .into_inner()
            .images
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .collect())
    }
}

/// The network namespace path in a verbose sandbox status: containerd puts the sandbox's OCI
/// runtime spec under `info["info"].runtimeSpec`.
#[must_use]
pub fn netns_from_info(info: &HashMap<String, String>) -> Option<String> {
    info.values()
        .filter_map(|v| serde_json::from_str::<serde_json::Value>(v).ok())
        .find_map(|v| {
            v["runtimeSpec"]["linux"]["namespaces"]
                .as_array()?
                .iter()
                .find(|n| n["type"] == "network")?["path"]
                .as_str()
                .map(str::to_owned)
        })
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_from_containerd_info() {
        let info = HashMap::from([(
            "info".to_owned(),
            r#"{"pid":1,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/x/netns/cni-1"}]}}}"#.to_owned(),
        )]);
        assert_eq!(netns_from_info(&info).as_deref(), Some("/x/netns/cni-1"));
        assert_eq!(netns_from_info(&HashMap::new()), None);
    }

    #[test]
    fn the_field_numbers_are_kubelets() {
        use prost::Message;
        // PodSandboxMetadata{name=1, uid=2, namespace=3, attempt=4}
        let m = pb::PodSandboxMetadata {
            name: "a".into(),
            uid: "b".into(),
            namespace: "c".into(),
            attempt: 1,
        };
        assert_eq!(
            m.encode_to_vec(),
            [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c', 0x20, 1]
        );
        // RunPodSandboxRequest{config=1}; PodSandboxConfig{linux=8}; LinuxPodSandboxConfig
        // {security_context=2}; LinuxSandboxSecurityContext{namespace_options=1};
        // NamespaceOption{network=1, pid=2, ipc=3}: NODE network = 2.
        let r = pb::NamespaceOption {
            network: pb::NamespaceMode::Node.into(),
            pid: pb::NamespaceMode::Container.into(),
            ipc: 0,
            target_id: String::new(),
        };
        assert_eq!(r.encode_to_vec(), [0x08, 2, 0x10, 1]);
        // StopContainerRequest{container_id=1, timeout=2}
        let s = pb::StopContainerRequest {
            container_id: "x".into(),
            timeout: 30,
        };
        assert_eq!(s.encode_to_vec(), [0x0a, 1, b'x', 0x10, 30]);
    }
}
