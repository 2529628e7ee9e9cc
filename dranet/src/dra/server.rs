//! The kubelet plugin over unix sockets: the registration service on
//! `<kubelet-root>/plugins_registry/<driver>-reg.sock` and the DRA node service (v1 and v1beta1)
//! plus the device health stream (`v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth`) on
//! `<kubelet-root>/plugins/<driver>/dra.sock`. Per-claim failures go into the per-claim
//! `error` field; the RPC itself succeeds.
//!
//! Both servers take any `:authority`, as grpc-go servers do: gRPC C-core clients (grpcio) send
//! the socket path, which h2 alone would refuse ([`crate::grpc_authority`]).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::{Request, Response, Status};

use super::health::{HEALTH_SERVICE_V1, HEALTH_SERVICE_V1ALPHA1, HealthHub, HealthService};
use super::prepare::{PreparedDevice, Preparer};
use super::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use super::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::proto::{health_v1, health_v1alpha1, v1, v1beta1};
use crate::grpc_authority::AuthorityRewrite;
use crate::listen::Incoming;
use crate::plan::ClaimRef;

/// `PluginInfo.type` of DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// Services offered, in this order, and why (kubelet `pkg/kubelet/cm/dra/plugin`):
///
/// * Prepare/Unprepare: `validateSupportedServices` (1.34 to master) walks **our** list and
///   takes the first entry that is in its `servicesSupportedByKubelet` (`v1.DRAPlugin`,
///   `v1beta1.DRAPlugin`); entries it does not know, such as any health service, are skipped,
///   never an error. So the node services come first, best first, and nothing placed after
///   them can change that choice.
/// * Health: kubelet 1.34 and 1.35 open `v1alpha1` whatever the list says; later kubelets pick
///   the health service with `pickHealthService`, which walks **kubelet's own** preference list
///   (master: `v1` then `v1alpha1`, kept "for three releases of transition") and looks each
///   name up in ours. Master therefore takes `v1` even when `v1alpha1` is listed first
///   (its unit test "both-picks-v1"), and a kubelet that knows only `v1alpha1` finds it
///   wherever it is. The order of the two health entries thus decides nothing in the kubelets
///   we know of; we list `v1` first, best first as for the node services, so that a kubelet
///   which walked our list instead would still take the newest version it knows.
///
/// Both health services are served from the same [`HealthHub`].
pub const SUPPORTED_VERSIONS: [&str; 4] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    HEALTH_SERVICE_V1,
    HEALTH_SERVICE_V1ALPHA1,
];

/// Connections served at once on each socket (kubelet keeps one or two); more are closed at
/// once. Accept errors back off and never end the server ([`crate::listen`]).
const MAX_CONNECTIONS: usize = 32;

/// Errors of the plugin servers.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the sockets go.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// `--kubelet-root-dir` (`/var/lib/kubelet`).
    pub kubelet_root: PathBuf,
    pub driver: String,
}

impl PluginConfig {
    #[must_use]
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_root
            .join("plugins_registry")
            .join(format!("{}-reg.sock", self.driver))
    }

    #[must_use]
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_root.join("plugins").join(&self.driver)
    }

    #[must_use]
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }
}

/// A running plugin; [`KubeletPlugin::stop`] stops the servers and removes the sockets.
pub struct KubeletPlugin {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<Result<(), tonic::transport::Error>>>,
    sockets: Vec<PathBuf>,
    status: watch::Receiver<Option<RegistrationStatus>>,
}

impl KubeletPlugin {
    /// [`KubeletPlugin::start_with_health`] with a hub that knows no devices (an empty list).
    pub async fn start(cfg: &PluginConfig, preparer: Arc<Preparer>) -> Result<Self, DraError> {
        Self::start_with_health(cfg, preparer, HealthHub::new(String::new())).await
    }

    /// Binds both sockets (DRA first, so the endpoint exists when kubelet sees the registration
    /// socket) and serves them; device health comes from `health`.
    pub async fn start_with_health(
        cfg: &PluginConfig,
        preparer: Arc<Preparer>,
        health: HealthHub,
    ) -> Result<Self, DraError> {
        let dra_path = cfg.dra_socket();
        let reg_path = cfg.registration_socket();
        make_dir(&cfg.plugin_dir())?;
        if let Some(parent) = reg_path.parent() {
            make_dir(parent)?;
        }
        let (stop, stop_rx) = watch::channel(false);
        let (status_tx, status) = watch::channel(None);

        let dra = bind(&dra_path)?;
        let mut rx = stop_rx.clone();
        let health = HealthService {
            hub: health,
            stop: stop_rx.clone(),
        };
        let dra_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(V1(preparer.clone())))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(V1beta1(
                    preparer,
                )))
                .add_service(
                    health_v1::dra_resource_health_server::DraResourceHealthServer::new(health.clone()),
                )
                .add_service(
                    health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(health),
                )
                .serve_with_incoming_shutdown(
                    futures::StreamExt::map(Incoming::new(dra, "dra", MAX_CONNECTIONS).into_stream(), |c| {
                        c.map(AuthorityRewrite::new)
                    }),
                    async move {
                        let _ = rx.wait_for(|s| *s).await;
                    },
                ),
        );

        let reg = match bind(&reg_path) {
            Ok(l) => l,
            Err(e) => {
                // Do not leave the DRA server running without a way to stop it.
                let _ = stop.send(true);
                let _ = dra_task.await;
                let _ = std::fs::remove_file(&dra_path);
                return Err(e);
            }
        };
        let registrar = Registrar {
            info: PluginInfo {
                r#type: PLUGIN_TYPE.to_owned(),
                name: cfg.driver.clone(),
                endpoint: dra_path.display().to_string(),
                supported_versions: SUPPORTED_VERSIONS.iter().map(|s| (*s).to_owned()).collect(),
            },
            status: status_tx,
        };
        let mut rx = stop_rx;
        let reg_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(registrar))
                .serve_with_incoming_shutdown(
                    futures::StreamExt::map(
                        Incoming::new(reg, "registration", MAX_CONNECTIONS).into_stream(),
                        |c| c.map(AuthorityRewrite::new),
                    ),
                    async move {
                        let _ = rx.wait_for(|s| *s).await;
                    },
                ),
        );
        tracing::debug!(registration = %reg_path.display(), dra = %dra_path.display(), "kubelet plugin serving");
        Ok(Self {
            stop,
            tasks: vec![dra_task, reg_task],
            sockets: vec![reg_path, dra_path],
            status,
        })
    }

    /// The last registration status kubelet reported.
    #[must_use]
    pub fn registration(&self) -> watch::Receiver<Option<RegistrationStatus>> {
        self.status.clone()
    }

    /// Calls `f` each time kubelet reports a successful registration. kubelet deletes the
    /// node's ResourceSlices when it starts, so the driver re-publishes from here
    /// (`RescanHandle::request_republish`).
    pub fn on_registered(&self, f: impl Fn() + Send + 'static) -> JoinHandle<()> {
        let mut rx = self.status.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let ok = rx
                    .borrow_and_update()
                    .as_ref()
                    .is_some_and(|s| s.plugin_registered);
                if ok {
                    f();
                }
            }
        })
    }

    /// Stops serving and removes the sockets (registration first, so kubelet deregisters).
    pub async fn stop(mut self) {
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            match t.await {
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::telemetry::chain(&e), "kubelet plugin server ended with an error")
                }
                Err(e) => {
                    tracing::warn!(error = %crate::telemetry::chain(&e), "kubelet plugin server task failed")
                }
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Creates `dir` (and missing parents) with mode 0750; an existing directory (kubelet's own
/// `plugins_registry`, say) keeps its mode.
fn make_dir(dir: &Path) -> Result<(), DraError> {
    if dir.is_dir() {
        return Ok(());
    }
    let io = |what: &'static str| {
        move |source| DraError::Io {
            what,
            path: dir.to_path_buf(),
            source,
        }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
        .map_err(io("creating"))?;
    // The umask may have cleared bits of 0750.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750)).map_err(io("chmod 0750"))
}

/// Removes a stale socket and binds a fresh one.
fn bind(path: &Path) -> Result<UnixListener, DraError> {
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(DraError::Io {
                what: "removing stale socket",
                path: path.to_path_buf(),
                source,
            });
        }
    }
    UnixListener::bind(path).map_err(|source| DraError::Io {
        what: "binding",
        path: path.to_path_buf(),
        source,
    })
}

struct Registrar {
    info: PluginInfo,
    status: watch::Sender<Option<RegistrationStatus>>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let st = req.into_inner();
        let registered = st.plugin_registered;
        let error = st.error.clone();
        self.status.send_replace(Some(st));
        if registered {
            tracing::info!(driver = %self.info.name, "registered with kubelet");
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            tracing::error!(driver = %self.info.name, %error, "kubelet rejected the registration");
            Err(Status::internal(format!("plugin registration failed: {error}")))
        }
    }
}

/// Claims of one NodePrepareResources call prepared at once. Each waits on the API server (a
/// GET of up to [`crate::dra::claim::KubeClaimSource`]'s timeout) and possibly on a DHCP lease;
/// one at a time, a pod of 16 claims on a slow API server would cost 16 round trips, and 16
/// timeouts on a hung one, past kubelet's deadline for the whole call.
pub(super) const PREPARE_CONCURRENCY: usize = 16;

/// Runs Prepare for every claim, at most [`PREPARE_CONCURRENCY`] at once; one result per claim
/// UID, in the request's order. Two claims of one pod may finish in either order: the merged
/// pod plan is handed over under the preparer's lock.
pub(super) async fn prepare_all(
    p: &Preparer,
    claims: Vec<ClaimRef>,
) -> Vec<(String, Result<Vec<PreparedDevice>, String>)> {
    use futures::StreamExt;
    let start = std::time::Instant::now();
    let out: Vec<(String, Result<Vec<PreparedDevice>, String>)> = futures::stream::iter(claims)
        .map(|c| async move {
            let res = p.prepare(&c).await.map_err(|e| {
                tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, error = %crate::telemetry::chain(&e), "prepare failed");
                // As upstream: a Warning on the claim (in the background, never failing the RPC).
                let r = p.reporter();
                r.event(r.make_event(
                    crate::report::ObjectRef::claim(&c.namespace, &c.name, &c.uid),
                    crate::report::EventReason::ClaimPrepareFailed,
                    format!(
                        "failed to prepare claim {}/{}: {}",
                        c.namespace,
                        c.name,
                        crate::telemetry::chain(&e)
                    ),
                ));
                crate::telemetry::chain(&e).to_string()
            });
            (c.uid, res)
        })
        .buffered(PREPARE_CONCURRENCY)
        .collect()
        .await;
    if let Some(m) = p.metrics() {
        let ok = out.iter().all(|(_, r)| r.is_ok());
        m.observe(crate::telemetry::metrics::dra::PREPARE, ok, start.elapsed());
    }
    out
}

fn unprepare_all(p: &Preparer, uids: Vec<String>) -> Vec<(String, String)> {
    let start = std::time::Instant::now();
    // One change of the plan store for the whole call (one checkpoint save, one fsync).
    let results = p.unprepare_all(&uids);
    let out: Vec<(String, String)> = uids
        .into_iter()
        .zip(results)
        .map(|(uid, r)| {
            let err = r
                .err()
                .map(|e| crate::telemetry::chain(&e).to_string())
                .unwrap_or_default();
            (uid, err)
        })
        .collect();
    if let Some(m) = p.metrics() {
        let ok = out.iter().all(|(_, e)| e.is_empty());
        m.observe(crate::telemetry::metrics::dra::UNPREPARE, ok, start.elapsed());
    }
    out
}

/// Prepared device → the version's response message.
trait FromPrepared {
    fn from_prepared(d: PreparedDevice) -> Self;
}

impl FromPrepared for v1::Device {
    fn from_prepared(d: PreparedDevice) -> Self {
        Self {
            request_names: vec![d.request],
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: Vec::new(),
            share_id: d.share_id,
        }
    }
}

impl FromPrepared for v1beta1::Device {
    fn from_prepared(d: PreparedDevice) -> Self {
        Self {
            request_names: vec![d.request],
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: Vec::new(),
        }
    }
}

macro_rules! dra_service {
    ($ty:ident, $m:ident) => {
        struct $ty(Arc<Preparer>);

        #[tonic::async_trait]
        impl $m::dra_plugin_server::DraPlugin for $ty {
            async fn node_prepare_resources(
                &self,
                req: Request<$m::NodePrepareResourcesRequest>,
            ) -> Result<Response<$m::NodePrepareResourcesResponse>, Status> {
                let claims = req
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef {
                        namespace: c.namespace,
                        name: c.name,
                        uid: c.uid,
                    })
                    .collect();
                let results = prepare_all(&self.0, claims).await;
                let claims = results
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r {
                            Ok(devs) => $m::NodePrepareResourceResponse {
                                devices: devs.into_iter().map(FromPrepared::from_prepared).collect(),
                                error: String::new(),
                            },
                            Err(error) => $m::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, resp)
                    })
                    .collect();
                Ok(Response::new($m::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                req: Request<$m::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$m::NodeUnprepareResourcesResponse>, Status> {
                let uids = req.into_inner().claims.into_iter().map(|c| c.uid).collect();
                let claims = unprepare_all(&self.0, uids)
                    .into_iter()
                    .map(|(uid, error)| (uid, $m::NodeUnprepareResourceResponse { error }))
                    .collect();
                Ok(Response::new($m::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_service!(V1, v1);
dra_service!(V1beta1, v1beta1);
