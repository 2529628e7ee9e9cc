//! The NRI plugin: connect, register, serve the Plugin service, reconnect.
//!
//! One session per connection: RegisterPlugin (conn 2, we are the client) → the runtime calls
//! Configure (we answer the event mask [`EVENTS`]) → Synchronize (possibly in chunks with `more`)
//! → pod and container hooks. Both dialects are served: the dedicated RunPodSandbox /
//! StopPodSandbox / RemovePodSandbox RPCs of NRI ≥ 0.12 and the older `StateChange` event; every
//! other method answers `UNIMPLEMENTED`. When the runtime closes the connection we reconnect
//! with backoff (100 ms doubling to 5 s) and register again.

use std::collections::HashSet;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::hooks::{ContainerInfo, HookError, LinuxDevice, Pod, PodHooks};
use super::mux::{Mux, MuxOptions, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::pb::google::rpc::Status;
use super::pb::nri as pb;
use super::ttrpc::{self, CallResult, Client, Service, TtrpcError, code};

/// Fully qualified name of the service the plugin serves.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// Fully qualified name of the service the runtime serves.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// Environment variable with an already connected socket fd (runtime-launched plugins).
pub const ENV_PLUGIN_SOCKET: &str = "NRI_PLUGIN_SOCKET";
/// Environment variable overriding the plugin name (runtime-launched plugins).
pub const ENV_PLUGIN_NAME: &str = "NRI_PLUGIN_NAME";
/// Environment variable overriding the plugin index (runtime-launched plugins).
pub const ENV_PLUGIN_IDX: &str = "NRI_PLUGIN_IDX";

/// The mask bit of an event: `1 << (event - 1)`.
#[must_use]
pub const fn event_bit(e: pb::Event) -> i32 {
    1 << (e as i32 - 1)
}

/// Events dranet subscribes to: RunPodSandbox, StopPodSandbox, RemovePodSandbox,
/// CreateContainer (0xF).
pub const EVENTS: i32 = event_bit(pb::Event::RunPodSandbox)
    | event_bit(pb::Event::StopPodSandbox)
    | event_bit(pb::Event::RemovePodSandbox)
    | event_bit(pb::Event::CreateContainer);

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Errors of the NRI plugin.
#[derive(Debug, thiserror::Error)]
pub enum NriError {
    /// The configuration cannot be registered (the runtime would refuse it).
    #[error("invalid NRI plugin {field}: {value:?}")]
    InvalidConfig { field: &'static str, value: String },
    /// `NRI_PLUGIN_SOCKET` is not a usable fd.
    #[error("unusable {ENV_PLUGIN_SOCKET}={value:?}")]
    InheritedSocket {
        value: String,
        #[source]
        source: std::io::Error,
    },
    /// Dialling the runtime's socket failed.
    #[error("cannot connect to the NRI socket {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// RegisterPlugin failed.
    #[error("RegisterPlugin failed")]
    Register(#[source] TtrpcError),
    /// The runtime did not call Configure in time.
    #[error("no Configure from the runtime within {0:?}")]
    NotConfigured(Duration),
    /// The runtime closed the connection during the handshake.
    #[error("the runtime closed the connection during registration: {0}")]
    ClosedDuringHandshake(String),
}

/// Plugin settings.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// Plugin name (`[a-zA-Z0-9_.+-]+`).
    pub name: String,
    /// Invocation index: two digits; plugins run in ascending order.
    pub index: String,
    /// Time allowed for RegisterPlugin and for the runtime's Configure after it.
    pub registration_timeout: Duration,
    /// Timeout of our calls to the runtime.
    pub request_timeout: Duration,
    /// Where the plugin counts its hook calls (clone one registered with [`NriMetrics::register`]).
    pub metrics: NriMetrics,
}

impl Default for PluginConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/var/run/nri/nri.sock"),
            name: "dranet".into(),
            // The Go dranet registers as index 00: first in the runtime's plugin order.
            index: "00".into(),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            metrics: NriMetrics::default(),
        }
    }
}

/// Label set of the hook metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// NRI method: RunPodSandbox, StopPodSandbox, RemovePodSandbox, CreateContainer,
    /// Synchronize, Shutdown.
    pub hook: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

/// Metrics of the NRI plugin (cheap to clone; clones share the values).
#[derive(Debug, Clone)]
pub struct NriMetrics {
    hook_calls: Family<HookLabels, Counter>,
    hook_errors: Family<HookLabels, Counter>,
    hook_latency: Family<HookLabels, Histogram, fn() -> Histogram>,
    registrations: Counter,
    connection_losses: Counter,
}

impl Default for NriMetrics {
    fn default() -> Self {
        Self {
            hook_calls: Family::default(),
            hook_errors: Family::default(),
            hook_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            registrations: Counter::default(),
            connection_losses: Counter::default(),
        }
    }
}

impl NriMetrics {
    /// Registers every metric (names prefixed `nri_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "nri_hook_calls",
            "NRI hook calls by hook",
            self.hook_calls.clone(),
        );
        registry.register(
            "nri_hook_errors",
            "NRI hook calls that failed, by hook",
            self.hook_errors.clone(),
        );
        registry.register(
            "nri_hook_duration_seconds",
            "Time spent in NRI hooks, by hook",
            self.hook_latency.clone(),
        );
        registry.register(
            "nri_registrations",
            "Successful NRI registrations",
            self.registrations.clone(),
        );
        registry.register(
            "nri_connection_losses",
            "NRI connections lost or failed (each one is retried)",
            self.connection_losses.clone(),
        );
    }

    /// Calls of `hook` so far.
    #[must_use]
    pub fn hook_calls(&self, hook: &'static str) -> u64 {
        self.hook_calls.get_or_create(&HookLabels { hook }).get()
    }

    /// Failed calls of `hook` so far.
    #[must_use]
    pub fn hook_errors(&self, hook: &'static str) -> u64 {
        self.hook_errors.get_or_create(&HookLabels { hook }).get()
    }

    /// Successful registrations so far.
    #[must_use]
    pub fn registrations(&self) -> u64 {
        self.registrations.get()
    }

    fn observe(&self, hook: &'static str, start: Instant, failed: bool) {
        let l = HookLabels { hook };
        self.hook_calls.get_or_create(&l).inc();
        if failed {
            self.hook_errors.get_or_create(&l).inc();
        }
        self.hook_latency
            .get_or_create(&l)
            .observe(start.elapsed().as_secs_f64());
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
}

fn valid_index(s: &str) -> bool {
    s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit())
}

static INHERITED_TAKEN: AtomicBool = AtomicBool::new(false);

/// The connected socket a runtime passes to a plugin it launched (once per process).
fn inherited_socket() -> Result<Option<UnixStream>, NriError> {
    let Ok(value) = std::env::var(ENV_PLUGIN_SOCKET) else {
        return Ok(None);
    };
    if INHERITED_TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(None);
    }
    let bad = |source| NriError::InheritedSocket {
        value: value.clone(),
        source,
    };
    let fd: i32 = value
        .trim()
        .parse()
        .map_err(|_| bad(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    if fd < 0 {
        return Err(bad(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    }
    // SAFETY: the runtime started this process with `fd` open and connected for this plugin;
    // nothing else in the process owns it, and INHERITED_TAKEN makes sure it is wrapped once.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let std_stream = std::os::unix::net::UnixStream::from(owned);
    std_stream.set_nonblocking(true).map_err(bad)?;
    UnixStream::from_std(std_stream).map(Some).map_err(bad)
}

/// Runs the plugin until `shutdown` turns true (or its sender is dropped): connects (or uses
/// the fd in `NRI_PLUGIN_SOCKET`), registers, serves the hooks, and reconnects with backoff
/// whenever the runtime goes away.
///
/// # Errors
/// Only [`NriError::InvalidConfig`] and [`NriError::InheritedSocket`]: connection trouble is
/// retried, not returned.
pub async fn run<H: PodHooks>(
    mut cfg: PluginConfig,
    hooks: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), NriError> {
    if let Ok(n) = std::env::var(ENV_PLUGIN_NAME) {
        cfg.name = n;
    }
    if let Ok(i) = std::env::var(ENV_PLUGIN_IDX) {
        cfg.index = i;
    }
    if !valid_name(&cfg.name) {
        return Err(NriError::InvalidConfig {
            field: "name",
            value: cfg.name,
        });
    }
    if !valid_index(&cfg.index) {
        return Err(NriError::InvalidConfig {
            field: "index",
            value: cfg.index,
        });
    }
    let mut inherited = inherited_socket()?;
    let mut backoff = BACKOFF_START;
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        let stream = match inherited.take() {
            Some(s) => Ok(s),
            None => UnixStream::connect(&cfg.socket)
                .await
                .map_err(|source| NriError::Connect {
                    path: cfg.socket.clone(),
                    source,
                }),
        };
        let end = match stream {
            Ok(s) => session(s, &cfg, &hooks, &mut shutdown).await,
            Err(e) => Err(e),
        };
        match end {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Ok(SessionEnd::Lost(why)) => {
                warn!(reason = %why, "NRI connection lost; reconnecting");
                backoff = BACKOFF_START;
            }
            Err(e) => debug!(error = %e, retry_in = ?backoff, "NRI connection attempt failed"),
        }
        cfg.metrics.connection_losses.inc();
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stopped(&mut shutdown) => return Ok(()),
        }
        backoff = next_backoff(backoff);
    }
}

/// 100 ms, 200 ms, 400 ms, … capped at 5 s.
fn next_backoff(d: Duration) -> Duration {
    (d * 2).min(BACKOFF_MAX)
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    // A dropped sender also means stop: nobody can ask for a clean shutdown any more.
    let _ = rx.wait_for(|v| *v).await;
}

enum SessionEnd {
    Shutdown,
    /// The connection was registered and configured, then lost.
    Lost(String),
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn session<H: PodHooks>(
    stream: UnixStream,
    cfg: &PluginConfig,
    hooks: &Arc<H>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<SessionEnd, NriError> {
    let mut mux = Mux::new(stream, MuxOptions::default());
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
    let trunk = mux.start();
    let (configured_tx, mut configured) = watch::channel(None);
    let svc = Arc::new(PluginService {
        hooks: hooks.clone(),
        metrics: cfg.metrics.clone(),
        sync: Mutex::default(),
        configured: configured_tx,
    });
    let _server = AbortOnDrop(tokio::spawn(ttrpc::serve(plugin_conn, svc)));
    let client = Client::new(runtime_conn);
    let req = pb::RegisterPluginRequest {
        plugin_name: cfg.name.clone(),
        plugin_idx: cfg.index.clone(),
        nri_version: String::new(),
    };
    let handshake = async {
        client
            .call_msg::<_, pb::Empty>(RUNTIME_SERVICE, "RegisterPlugin", &req, cfg.registration_timeout)
            .await
            .map_err(NriError::Register)?;
        tokio::time::timeout(cfg.registration_timeout, configured.wait_for(Option::is_some))
            .await
            .map_err(|_| NriError::NotConfigured(cfg.registration_timeout))?
            .map(|v| v.clone())
            .map_err(|_| NriError::ClosedDuringHandshake("server ended".into()))
    };
    let runtime = tokio::select! {
        r = handshake => r?,
        why = trunk.closed() => return Err(NriError::ClosedDuringHandshake(why)),
        () = stopped(shutdown) => return Ok(SessionEnd::Shutdown),
    };
    cfg.metrics.registrations.inc();
    if let Some((name, version)) = runtime {
        info!(runtime = %name, version = %version, plugin = %cfg.name, index = %cfg.index, "NRI plugin registered");
    }
    tokio::select! {
        why = trunk.closed() => Ok(SessionEnd::Lost(why)),
        () = stopped(shutdown) => {
            trunk.close();
            Ok(SessionEnd::Shutdown)
        }
    }
}

#[derive(Default)]
struct SyncBuf {
    pods: Vec<Pod>,
    containers: Vec<ContainerInfo>,
}

struct PluginService<H> {
    hooks: Arc<H>,
    metrics: NriMetrics,
    sync: Mutex<SyncBuf>,
    /// (runtime name, version) once Configure arrived.
    configured: watch::Sender<Option<(String, String)>>,
}

fn decode<M: Message + Default>(payload: Bytes) -> Result<M, Status> {
    M::decode(payload)
        .map_err(|e| ttrpc::status(code::INVALID_ARGUMENT, format!("cannot decode request: {e}")))
}

fn reply<M: Message>(m: &M) -> CallResult {
    Ok(Bytes::from(m.encode_to_vec()))
}

fn hook_status(e: &HookError) -> Status {
    let c = match e {
        HookError::Failed { .. } => code::UNKNOWN,
        HookError::Rejected { .. } => code::FAILED_PRECONDITION,
    };
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    ttrpc::status(c, msg)
}

/// Keeps the first device per path, in order.
fn dedup_devices(devs: Vec<LinuxDevice>) -> Vec<LinuxDevice> {
    let mut seen = HashSet::new();
    devs.into_iter().filter(|d| seen.insert(d.path.clone())).collect()
}

impl<H: PodHooks> PluginService<H> {
    async fn run_pod(&self, pod: Option<pb::PodSandbox>) -> Result<(), Status> {
        let pod = Pod::from(&pod.unwrap_or_default());
        let start = Instant::now();
        let r = self.hooks.run_pod_sandbox(pod.clone()).await;
        self.metrics.observe("RunPodSandbox", start, r.is_err());
        match r {
            Ok(outcome) => {
                debug!(pod = %pod.uid, ?outcome, "RunPodSandbox");
                Ok(())
            }
            Err(e) => {
                warn!(pod = %pod.uid, error = %hook_status(&e).message, "RunPodSandbox failed");
                Err(hook_status(&e))
            }
        }
    }

    /// Stop and Remove are best effort: errors are logged and counted, the runtime gets OK.
    async fn stop_or_remove(&self, hook: &'static str, pod: Option<pb::PodSandbox>) {
        let pod = Pod::from(&pod.unwrap_or_default());
        let start = Instant::now();
        let r = if hook == "StopPodSandbox" {
            self.hooks.stop_pod_sandbox(pod.clone()).await
        } else {
            self.hooks.remove_pod_sandbox(pod.clone()).await
        };
        self.metrics.observe(hook, start, r.is_err());
        match r {
            Ok(outcome) => debug!(pod = %pod.uid, hook, ?outcome, "pod hook done"),
            Err(e) => {
                warn!(pod = %pod.uid, hook, error = %hook_status(&e).message, "pod hook failed (ignored)")
            }
        }
    }

    async fn create_container(&self, req: pb::CreateContainerRequest) -> CallResult {
        let pod = Pod::from(&req.pod.unwrap_or_default());
        let c = ContainerInfo::from(&req.container.unwrap_or_default());
        let start = Instant::now();
        let r = self.hooks.create_container(pod.clone(), c).await;
        self.metrics.observe("CreateContainer", start, r.is_err());
        let devices = dedup_devices(r.map_err(|e| {
            warn!(pod = %pod.uid, error = %hook_status(&e).message, "CreateContainer failed");
            hook_status(&e)
        })?);
        let adjust = (!devices.is_empty()).then(|| pb::ContainerAdjustment {
            linux: Some(pb::LinuxContainerAdjustment {
                devices: devices.iter().map(pb::LinuxDevice::from).collect(),
                ..Default::default()
            }),
            ..Default::default()
        });
        reply(&pb::CreateContainerResponse {
            adjust,
            update: Vec::new(),
            evict: Vec::new(),
        })
    }

    async fn synchronize(&self, req: pb::SynchronizeRequest) -> CallResult {
        let (pods, containers) = {
            let mut buf = self
                .sync
                .lock()
                .map_err(|_| ttrpc::status(code::INTERNAL, "sync state poisoned"))?;
            buf.pods.extend(req.pods.iter().map(Pod::from));
            buf.containers
                .extend(req.containers.iter().map(ContainerInfo::from));
            if req.more {
                debug!(pods = buf.pods.len(), "Synchronize: chunk buffered");
                return reply(&pb::SynchronizeResponse {
                    update: Vec::new(),
                    more: true,
                });
            }
            let b = std::mem::take(&mut *buf);
            (b.pods, b.containers)
        };
        info!(pods = pods.len(), containers = containers.len(), "Synchronize");
        let start = Instant::now();
        self.hooks.synchronize(pods, containers).await;
        self.metrics.observe("Synchronize", start, false);
        reply(&pb::SynchronizeResponse {
            update: Vec::new(),
            more: false,
        })
    }

    async fn state_change(&self, ev: pb::StateChangeEvent) -> CallResult {
        match pb::Event::try_from(ev.event) {
            Ok(pb::Event::RunPodSandbox) => self.run_pod(ev.pod).await?,
            Ok(pb::Event::StopPodSandbox) => self.stop_or_remove("StopPodSandbox", ev.pod).await,
            Ok(pb::Event::RemovePodSandbox) => self.stop_or_remove("RemovePodSandbox", ev.pod).await,
            other => debug!(event = ?other, "StateChange: not ours"),
        }
        reply(&pb::Empty {})
    }
}

impl<H: PodHooks> Service for PluginService<H> {
    async fn call(self: Arc<Self>, service: String, method: String, payload: Bytes) -> CallResult {
        if service != PLUGIN_SERVICE {
            return Err(ttrpc::unimplemented(&service, &method));
        }
        match method.as_str() {
            "Configure" => {
                let req: pb::ConfigureRequest = decode(payload)?;
                debug!(runtime = %req.runtime_name, version = %req.runtime_version,
                       request_timeout_ms = req.request_timeout, "Configure");
                self.configured
                    .send_replace(Some((req.runtime_name, req.runtime_version)));
                reply(&pb::ConfigureResponse {
                    events: EVENTS,
                    request_timeout: 0,
                })
            }
            "Synchronize" => self.synchronize(decode(payload)?).await,
            "Shutdown" => {
                let start = Instant::now();
                self.hooks.shutdown().await;
                self.metrics.observe("Shutdown", start, false);
                reply(&pb::Empty {})
            }
            "RunPodSandbox" => {
                let req: pb::RunPodSandboxRequest = decode(payload)?;
                self.run_pod(req.pod).await?;
                reply(&pb::RunPodSandboxResponse {})
            }
            "StopPodSandbox" => {
                let req: pb::StopPodSandboxRequest = decode(payload)?;
                self.stop_or_remove("StopPodSandbox", req.pod).await;
                reply(&pb::StopPodSandboxResponse {})
            }
            "RemovePodSandbox" => {
                let req: pb::RemovePodSandboxRequest = decode(payload)?;
                self.stop_or_remove("RemovePodSandbox", req.pod).await;
                reply(&pb::RemovePodSandboxResponse {})
            }
            "CreateContainer" => self.create_container(decode(payload)?).await,
            "StateChange" => self.state_change(decode(payload)?).await,
            _ => Err(ttrpc::unimplemented(&service, &method)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hooks::DeviceKind;
    use super::*;

    #[test]
    fn event_mask_is_0xf() {
        assert_eq!(EVENTS, 0xF);
        assert_eq!(event_bit(pb::Event::CreateContainer), 8);
    }

    #[test]
    fn backoff_doubles_to_five_seconds() {
        let mut d = BACKOFF_START;
        let mut seen = vec![d];
        for _ in 0..8 {
            d = next_backoff(d);
            seen.push(d);
        }
        let ms: Vec<u128> = seen.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn names_and_indexes() {
        assert!(valid_name("dranet") && valid_name("dra.net") && valid_name("a_b+c-1"));
        assert!(!valid_name("") && !valid_name("bad name") && !valid_name("x/y"));
        assert!(valid_index("00") && valid_index("99"));
        assert!(!valid_index("0") && !valid_index("100") && !valid_index("a1"));
        let d = PluginConfig::default();
        assert_eq!((d.name.as_str(), d.index.as_str()), ("dranet", "00"));
        assert_eq!(d.socket, PathBuf::from("/var/run/nri/nri.sock"));
    }

    #[test]
    fn dedup_keeps_first_per_path() {
        let dev = |path: &str, minor| LinuxDevice {
            path: path.into(),
            kind: DeviceKind::Char,
            major: 231,
            minor,
            file_mode: None,
            uid: None,
            gid: None,
        };
        let out = dedup_devices(vec![dev("/a", 1), dev("/b", 2), dev("/a", 3)]);
        assert_eq!(out, vec![dev("/a", 1), dev("/b", 2)]);
    }

    #[test]
    fn hook_error_status_carries_the_chain() {
        let e = HookError::Failed {
            pod: "u1".into(),
            action: "attach",
            source: "no such device".into(),
        };
        let st = hook_status(&e);
        assert_eq!(st.code, code::UNKNOWN);
        assert_eq!(st.message, "pod u1: attach failed: no such device");
        let r = HookError::Rejected {
            pod: "u2".into(),
            reason: "hostNetwork".into(),
        };
        assert_eq!(hook_status(&r).code, code::FAILED_PRECONDITION);
    }

    #[test]
    fn metrics_encode() {
        let m = NriMetrics::default();
        let mut reg = Registry::default();
        m.register(&mut reg);
        m.observe("RunPodSandbox", Instant::now(), true);
        assert_eq!(
            (m.hook_calls("RunPodSandbox"), m.hook_errors("RunPodSandbox")),
            (1, 1)
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("nri_hook_calls_total{hook=\"RunPodSandbox\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("nri_hook_duration_seconds_count{hook=\"RunPodSandbox\"} 1"),
            "{out}"
        );
    }
}
