//! A kubelet stand-in for tests: finds the plugin's registration socket the way the plugin
//! watcher does (any socket in `<root>/plugins_registry/` not starting with `.`), calls GetInfo
//! and NotifyRegistrationStatus, then calls NodePrepareResources / NodeUnprepareResources on the
//! advertised endpoint (v1 or v1beta1), all gRPC over unix sockets. Also kubelet's retry of a
//! container the runtime refused to create ([`create_container_with_retries`]). Test support only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::dra::proto::pluginregistration::registration_client::RegistrationClient;
use dranet::dra::proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};
use dranet::dra::proto::{v1, v1beta1};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::nri_runtime::{RuntimeError, RuntimeHandle};
use dranet::nri::pb::nri as pb;

/// kubelet's `defaultClientCallTimeout` for DRA calls.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The DRA services this kubelet speaks (as kubelet ≥ 1.34).
pub const KUBELET_SUPPORTED: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// A claim as kubelet names it.
#[derive(Clone, Debug)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Claim {
    #[must_use]
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

/// One device of a prepare response, version-independent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// One claim's prepare result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrepareResult {
    pub devices: Vec<PreparedDevice>,
    pub error: String,
}

/// The DRA API version to call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraVersion {
    V1,
    V1beta1,
}

/// Opens a gRPC channel over a unix socket.
pub async fn uds_channel(path: &Path) -> Result<Channel> {
    let path = path.to_path_buf();
    let ch = Endpoint::try_from("http://[::]:0")?
        .connect_timeout(Duration::from_secs(5))
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move {
                let s = tokio::net::UnixStream::connect(p).await?;
                Ok::<_, std::io::Error>(TokioIo::new(s))
            }
        }))
        .await
        .context("connecting over the unix socket")?;
    Ok(ch)
}

/// The kubelet simulator, rooted at a kubelet root dir.
#[derive(Clone, Debug)]
pub struct KubeletSim {
    pub root: PathBuf,
    /// Where a containerized plugin sees `root` (its `--kubelet-root-dir`, e.g.
    /// `/var/lib/kubelet`): an endpoint it advertises under that path is dialled under `root`.
    pub plugin_root: Option<PathBuf>,
}

impl KubeletSim {
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            plugin_root: None,
        }
    }

    #[must_use]
    pub fn registry_dir(&self) -> PathBuf {
        self.root.join("plugins_registry")
    }

    /// Waits up to `timeout` for a live registration socket, then registers the plugin behind
    /// it, as kubelet does.
    pub async fn register_when_ready(&self, timeout: Duration) -> Result<RegisteredPlugin> {
        let sock = self.wait_for_registration_socket(timeout).await?;
        self.register(&sock).await
    }

    /// Waits until a registration socket appears and returns its path.
    pub async fn wait_for_registration_socket(&self, timeout: Duration) -> Result<PathBuf> {
        let start = Instant::now();
        loop {
            if let Ok(rd) = std::fs::read_dir(self.registry_dir()) {
                for e in rd.flatten() {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    let is_sock = e
                        .file_type()
                        .is_ok_and(|t| std::os::unix::fs::FileTypeExt::is_socket(&t));
                    // A socket file a killed plugin left behind refuses connections until the
                    // restarted plugin binds it again: only a live one counts (kubelet, which
                    // reacts to the create event of the new socket, never sees the old one).
                    if is_sock
                        && !name.starts_with('.')
                        && std::os::unix::net::UnixStream::connect(e.path()).is_ok()
                    {
                        return Ok(e.path());
                    }
                }
            }
            if start.elapsed() > timeout {
                bail!(
                    "no registration socket in {} after {timeout:?}",
                    self.registry_dir().display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// GetInfo + validation + NotifyRegistrationStatus, as kubelet's plugin manager does.
    pub async fn register(&self, reg_socket: &Path) -> Result<RegisteredPlugin> {
        let mut client = RegistrationClient::new(uds_channel(reg_socket).await?);
        let info = client.get_info(InfoRequest {}).await?.into_inner();
        let verdict = validate(&info);
        let status = RegistrationStatus {
            plugin_registered: verdict.is_ok(),
            error: verdict
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default(),
        };
        let notified = client.notify_registration_status(status).await;
        let version = verdict?;
        notified.context("NotifyRegistrationStatus")?;
        let endpoint = Path::new(&info.endpoint);
        let endpoint = match self
            .plugin_root
            .as_deref()
            .and_then(|r| endpoint.strip_prefix(r).ok())
        {
            Some(rel) => self.root.join(rel),
            None => endpoint.to_path_buf(),
        };
        let channel = uds_channel(&endpoint).await?;
        Ok(RegisteredPlugin {
            info,
            version,
            channel,
        })
    }

    /// Reports a failed registration (as kubelet does for a bad plugin); returns the plugin's
    /// answer.
    pub async fn reject(&self, reg_socket: &Path, error: &str) -> Result<()> {
        let mut client = RegistrationClient::new(uds_channel(reg_socket).await?);
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: error.to_owned(),
            })
            .await?;
        Ok(())
    }
}

fn validate(info: &PluginInfo) -> Result<DraVersion> {
    if info.r#type != "DRAPlugin" {
        bail!("unexpected plugin type {:?}", info.r#type);
    }
    if info.name.is_empty() || info.endpoint.is_empty() {
        bail!("plugin name and endpoint must be set");
    }
    let first = info
        .supported_versions
        .iter()
        .find(|v| KUBELET_SUPPORTED.contains(&v.as_str()))
        .context("none of the plugin's versions is supported")?;
    Ok(if first == "v1.DRAPlugin" {
        DraVersion::V1
    } else {
        DraVersion::V1beta1
    })
}

/// A registered plugin with an open channel to its DRA endpoint.
pub struct RegisteredPlugin {
    pub info: PluginInfo,
    /// The version kubelet picked (the first supported entry of the plugin's list).
    pub version: DraVersion,
    channel: Channel,
}

impl RegisteredPlugin {
    /// NodePrepareResources with the negotiated version.
    pub async fn prepare(&self, claims: &[Claim]) -> Result<BTreeMap<String, PrepareResult>> {
        self.prepare_with(self.version, claims).await
    }

    pub async fn unprepare(&self, claims: &[Claim]) -> Result<BTreeMap<String, String>> {
        self.unprepare_with(self.version, claims).await
    }

    /// Prepares `claims`, `per_call` claims per NodePrepareResources call (kubelet sends a pod's
    /// claims together); fails on the first claim that reports an error.
    pub async fn prepare_all(&self, claims: &[Claim], per_call: usize) -> Result<()> {
        for chunk in claims.chunks(per_call.max(1)) {
            let res = self.prepare(chunk).await?;
            for c in chunk {
                let r = res.get(&c.uid).context("no prepare result")?;
                if !r.error.is_empty() {
                    bail!("prepare {}: {}", c.name, r.error);
                }
            }
        }
        Ok(())
    }

    /// NodePrepareResources with an explicit version.
    pub async fn prepare_with(
        &self,
        version: DraVersion,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, PrepareResult>> {
        let req = v1::NodePrepareResourcesRequest {
            claims: v1_claims(claims),
        };
        let resp = match version {
            DraVersion::V1 => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                c.node_prepare_resources(req).await?.into_inner()
            }
            // The v1beta1 messages are v1's on the wire, less `Device.share_id`.
            DraVersion::V1beta1 => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let resp = c
                    .node_prepare_resources(recode::<_, v1beta1::NodePrepareResourcesRequest>(&req)?)
                    .await?
                    .into_inner();
                recode(&resp)?
            }
        };
        Ok(resp
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| PreparedDevice {
                        request_names: d.request_names,
                        pool: d.pool_name,
                        device: d.device_name,
                        share_id: d.share_id,
                    })
                    .collect();
                (
                    uid,
                    PrepareResult {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect())
    }

    /// NodeUnprepareResources with an explicit version; claim UID → error ("" = ok).
    pub async fn unprepare_with(
        &self,
        version: DraVersion,
        claims: &[Claim],
    ) -> Result<BTreeMap<String, String>> {
        let req = v1::NodeUnprepareResourcesRequest {
            claims: v1_claims(claims),
        };
        let resp = match version {
            DraVersion::V1 => {
                let mut c = v1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                c.node_unprepare_resources(req).await?.into_inner()
            }
            DraVersion::V1beta1 => {
                let mut c = v1beta1::dra_plugin_client::DraPluginClient::new(self.channel.clone());
                let resp = c
                    .node_unprepare_resources(recode::<_, v1beta1::NodeUnprepareResourcesRequest>(&req)?)
                    .await?
                    .into_inner();
                recode(&resp)?
            }
        };
        Ok(resp.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect())
    }
}

fn v1_claims(claims: &[Claim]) -> Vec<v1::Claim> {
    claims
        .iter()
        .map(|c| v1::Claim {
            namespace: c.namespace.clone(),
            uid: c.uid.clone(),
            name: c.name.clone(),
        })
        .collect()
}

/// A message as another version's message with the same fields and numbers.
fn recode<A: prost::Message, B: prost::Message + Default>(m: &A) -> Result<B> {
    Ok(B::decode(m.encode_to_vec().as_slice())?)
}

/// kubelet's pod worker after a sync that failed, a CreateContainerError among them: it requeues
/// the pod after `wait.Jitter(backOffPeriod, 0.5)`, `backOffPeriod = 10 s` (`pkg/kubelet/kubelet.go`,
/// `pod_workers.go` `completeWork`), so 10–15 s, the same after every failure. The doubling
/// back-off (10 s up to 300 s) is the container restart back-off (CrashLoopBackOff) of a container
/// that ran and exited; a container that was never created has no such entry. A pod update or a
/// PLEG event may sync the pod sooner. Tests shorten `period`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodSyncBackoff {
    pub period: Duration,
    /// `wait.Jitter`'s factor: the delay is `period * (1 + jitter * r)`, `r` in [0, 1).
    pub jitter: f64,
}

impl PodSyncBackoff {
    /// Real kubelet's.
    pub const KUBELET: Self = Self {
        period: Duration::from_secs(10),
        jitter: 0.5,
    };

    /// The delay before the next sync.
    #[must_use]
    pub fn delay(&self) -> Duration {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 2];
        let r = if ring::rand::SystemRandom::new().fill(&mut b).is_ok() {
            f64::from(u16::from_le_bytes(b)) / 65536.0
        } else {
            0.0
        };
        self.period.mul_f64(1.0 + self.jitter.max(0.0) * r)
    }
}

/// A container kubelet got created after zero or more refusals.
#[derive(Debug, Clone)]
pub struct Created {
    /// When the runtime's CreateContainer returned (the container is created right after).
    pub at: Instant,
    /// Each refused attempt: when, and the runtime's error text.
    pub refused: Vec<(Instant, String)>,
    /// The plugins' adjustment.
    pub adjust: Option<pb::ContainerAdjustment>,
}

/// kubelet creating a container of a running sandbox: CreateContainer, and after each refusal
/// by the runtime's validator ([`RuntimeError::Refused`]) the pod is synced again after
/// `backoff`, in the same sandbox. Any other error returns at once.
///
/// # Errors
/// Another error than a refusal, or still refused after `give_up`.
pub async fn create_container_with_retries(
    rt: &RuntimeHandle,
    pod: &pb::PodSandbox,
    container: &pb::Container,
    backoff: PodSyncBackoff,
    give_up: Duration,
) -> Result<Created> {
    let start = Instant::now();
    let mut refused = Vec::new();
    loop {
        match rt.create_container(pod, container).await {
            Ok(adjust) => {
                return Ok(Created {
                    at: Instant::now(),
                    refused,
                    adjust,
                });
            }
            Err(RuntimeError::Refused(msg)) => refused.push((Instant::now(), msg)),
            Err(e) => return Err(e).context("CreateContainer"),
        }
        if start.elapsed() >= give_up {
            bail!(
                "CreateContainer still refused after {give_up:?} ({} attempts): {:?}",
                refused.len(),
                refused.last().map(|r| &r.1)
            );
        }
        tokio::time::sleep(backoff.delay()).await;
    }
}
