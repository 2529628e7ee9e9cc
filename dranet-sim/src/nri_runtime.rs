//! A container runtime's side of NRI, for tests: serves an NRI socket the way containerd and
//! CRI-O (through containerd/nri `pkg/adaptation`) do.
//!
//! Per connection: a mux trunk whose writer behaves like Go's (a message over 4096 bytes goes out
//! as a 4096-byte frame and then the rest; [`Split`] also allows arbitrary cuts) and whose reader,
//! by default, fails the trunk on a frame over 4096 bytes as the Go ttrpc reader does. The
//! Runtime service (conn 2) answers RegisterPlugin; then the runtime calls Configure and
//! Synchronize (whole, or in chunks with `more`), checks the answers, and the plugin is ready for
//! the test's [`NriRuntime::run_pod_sandbox`] & co. Every call has the runtimes' 2 s timeout; a
//! timeout or a closed connection makes the runtime drop the plugin, like the real ones. With
//! [`RuntimeConfig::validator`] enabled, CreateContainer goes through NRI's default validator
//! ([`crate::nri_validator`]) as in containerd ≥ 2.2 and CRI-O with NRI ≥ v0.10.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dranet::nri::mux::{
    GO_FRAME_LIMIT, Mux, MuxHandle, MuxOptions, MuxStats, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, Split,
};
use dranet::nri::pb::nri as pb;
use dranet::nri::plugin::{PLUGIN_SERVICE, RUNTIME_SERVICE, event_bit};
use dranet::nri::ttrpc::{self, CallResult, Client, Service, TtrpcError, code};

use crate::nri_validator::{DefaultValidatorConfig, PluginInstance, rejection, validate_required_plugins};
use prost::Message;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// All valid event bits.
pub const VALID_EVENTS: i32 = (1 << (pb::Event::Last as i32 - 1)) - 1;

/// Which NRI API generation the simulated runtime speaks for pod events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// NRI ≥ 0.12: dedicated RunPodSandbox/StopPodSandbox/RemovePodSandbox RPCs, falling back
    /// to StateChange when the plugin answers Unimplemented.
    Dedicated,
    /// Older NRI (containerd ≤ 2.2, CRI-O ≤ 1.35): pod events only through StateChange.
    StateChange,
}

/// Which runtime's habits to imitate where they differ on the wire (protocols.md §1.10). The
/// order of kernel work around the hooks (CRI-O removes the netns *before* StopPodSandbox,
/// containerd after) is the test's to reproduce; this only shapes what the messages carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// RemovePodSandbox carries no network namespace path.
    Containerd,
    /// RemovePodSandbox still carries the (by then dead) path.
    Crio,
}

/// How the initial Synchronize is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// One message; if the plugin answers ResourceExhausted, resend in chunks of 100 pods.
    Auto,
    /// Chunks of this many pods (and containers) each, `more = true` on all but the last.
    Chunks(usize),
}

/// Settings of the simulated runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub dialect: Dialect,
    pub flavor: Flavor,
    /// How our messages are cut into mux frames.
    pub split: Split,
    /// Fail the trunk on a received frame over 4096 bytes (as a Go peer does).
    pub strict_frames: bool,
    pub sync: SyncMode,
    pub request_timeout: Duration,
    pub registration_timeout: Duration,
    pub runtime_name: String,
    pub runtime_version: String,
    /// Pods and containers reported by Synchronize.
    pub pods: Vec<pb::PodSandbox>,
    pub containers: Vec<pb::Container>,
    /// NRI's builtin default validator (off, as in both runtimes by default).
    pub validator: DefaultValidatorConfig,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            dialect: Dialect::Dedicated,
            flavor: Flavor::Containerd,
            split: Split::Go,
            strict_frames: true,
            sync: SyncMode::Auto,
            request_timeout: default_request_timeout(),
            registration_timeout: Duration::from_secs(5),
            runtime_name: "sim-runtime".into(),
            runtime_version: "0.0.0".into(),
            pods: Vec::new(),
            containers: Vec::new(),
            validator: DefaultValidatorConfig::default(),
        }
    }
}

/// The runtime's request timeout: 2 s, the default of CRI-O and containerd, unless
/// `DRANET_SIM_REQUEST_TIMEOUT_MS` says otherwise. The kernel matrix's guests set it
/// (`xtask/vm/guest-test.sh`): under qemu TCG on a loaded host every kernel call is ~10× slower
/// than on the host, so a 4-device RunPodSandbox there took 2.4 s and the harness gave up on it
/// (its clock, not the kernel under test; the case passes within 2 s on the host).
#[must_use]
pub fn default_request_timeout() -> Duration {
    std::env::var("DRANET_SIM_REQUEST_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(2), Duration::from_millis)
}

/// Errors of the simulated runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("no plugin is connected")]
    NoPlugin,
    #[error("plugin call failed")]
    Rpc(#[from] TtrpcError),
    #[error("timed out waiting for {0}")]
    Wait(&'static str),
    #[error("socket error")]
    Io(#[from] std::io::Error),
    /// A validator refused CreateContainer; the text is the runtime's.
    #[error("{0}")]
    Refused(String),
}

impl RuntimeError {
    /// The status code the plugin answered with, if any.
    #[must_use]
    pub fn code(&self) -> Option<i32> {
        match self {
            RuntimeError::Rpc(e) => e.code(),
            _ => None,
        }
    }
}

/// A registered plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredPlugin {
    pub name: String,
    pub index: String,
    /// The NRI version the plugin registered with (containerd logs "NRI version unknown" for an
    /// empty one).
    pub nri_version: String,
    /// The Configure answer, as sent (0 would mean all events).
    pub events: i32,
}

/// One Synchronize message and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRecord {
    pub pods: usize,
    pub containers: usize,
    pub more: bool,
    /// `None` when the plugin answered with an error status (e.g. ResourceExhausted).
    pub reply_more: Option<bool>,
}

struct Session {
    client: Arc<Client>,
    trunk: MuxHandle,
    plugin: RegisteredPlugin,
    /// Effective subscription (0 from the plugin means all events).
    events: i32,
    tap: Arc<Mutex<Vec<u8>>>,
}

#[derive(Default)]
struct Log {
    methods: Vec<String>,
    syncs: Vec<SyncRecord>,
    errors: Vec<String>,
    refusals: Vec<String>,
    max_frame_in: u64,
}

struct Inner {
    cfg: Mutex<RuntimeConfig>,
    current: Mutex<Option<Arc<Session>>>,
    ready: watch::Sender<u64>,
    log: Mutex<Log>,
}

/// The simulated runtime: owns the listening socket (removed on drop). Everything else is on
/// [`RuntimeHandle`], which it dereferences to.
pub struct NriRuntime {
    handle: RuntimeHandle,
    path: PathBuf,
    accept: JoinHandle<()>,
}

/// A shared handle on the runtime: what kubelet calls it through (e.g. from a task of its own
/// while the test restarts dranet).
#[derive(Clone)]
pub struct RuntimeHandle {
    inner: Arc<Inner>,
}

impl std::ops::Deref for NriRuntime {
    type Target = RuntimeHandle;
    fn deref(&self) -> &RuntimeHandle {
        &self.handle
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl NriRuntime {
    /// Listens on `socket` (a stale file is replaced) and accepts plugins.
    ///
    /// # Errors
    /// Binding the socket fails.
    pub fn start(socket: impl AsRef<Path>, cfg: RuntimeConfig) -> Result<Self, RuntimeError> {
        let path = socket.as_ref().to_path_buf();
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let inner = Arc::new(Inner {
            cfg: Mutex::new(cfg),
            current: Mutex::new(None),
            ready: watch::channel(0).0,
            log: Mutex::default(),
        });
        let accept = tokio::spawn(accept_loop(listener, inner.clone()));
        Ok(Self {
            handle: RuntimeHandle { inner },
            path,
            accept,
        })
    }

    /// A shared handle on this runtime.
    #[must_use]
    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }

    /// The socket path.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.path
    }
}

impl RuntimeHandle {
    /// Serves an already connected stream, as a runtime does for a plugin it launched itself
    /// (the other end goes to the plugin in `NRI_PLUGIN_SOCKET`).
    pub fn attach(&self, stream: UnixStream) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            if let Err(why) = handshake(stream, &inner).await {
                lock(&inner.log).errors.push(why);
            }
        });
    }

    /// Waits until `n` plugin sessions in all have completed the handshake.
    ///
    /// # Errors
    /// [`RuntimeError::Wait`] after `timeout`.
    pub async fn wait_ready(&self, n: u64, timeout: Duration) -> Result<RegisteredPlugin, RuntimeError> {
        let mut rx = self.inner.ready.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|v| *v >= n))
            .await
            .map_err(|_| RuntimeError::Wait("plugin registration"))?
            .map_err(|_| RuntimeError::Wait("plugin registration"))?;
        self.session().map(|s| s.plugin.clone())
    }

    /// Number of completed handshakes so far.
    #[must_use]
    pub fn sessions(&self) -> u64 {
        *self.inner.ready.borrow()
    }

    fn session(&self) -> Result<Arc<Session>, RuntimeError> {
        lock(&self.inner.current).clone().ok_or(RuntimeError::NoPlugin)
    }

    /// Which runtime's wire habits to imitate from now on.
    pub fn set_flavor(&self, flavor: Flavor) {
        lock(&self.inner.cfg).flavor = flavor;
    }

    /// The plugin request timeout from the next request on (a timeout is fatal: the runtime drops
    /// the plugin and carries on without it, as containerd and CRI-O do).
    pub fn set_request_timeout(&self, t: Duration) {
        lock(&self.inner.cfg).request_timeout = t;
    }

    /// NRI's default validator from the next CreateContainer on (the runtime restarted with
    /// another config).
    pub fn set_validator(&self, v: DefaultValidatorConfig) {
        lock(&self.inner.cfg).validator = v;
    }

    /// CreateContainer requests the validator refused so far, with the runtime's error text.
    #[must_use]
    pub fn refusals(&self) -> Vec<String> {
        lock(&self.inner.log).refusals.clone()
    }

    /// Pods and containers for the next Synchronize (e.g. after a reconnect).
    pub fn set_state(&self, pods: Vec<pb::PodSandbox>, containers: Vec<pb::Container>) {
        let mut c = lock(&self.inner.cfg);
        c.pods = pods;
        c.containers = containers;
    }

    /// Every bytes the current plugin connection sent us, frame headers included.
    #[must_use]
    pub fn received_bytes(&self) -> Vec<u8> {
        self.session().map(|s| lock(&s.tap).clone()).unwrap_or_default()
    }

    /// Largest frame payload received from any plugin connection so far.
    #[must_use]
    pub fn max_frame_in(&self) -> u64 {
        let cur = self.session().map(|s| stat(&s.trunk.stats())).unwrap_or(0);
        cur.max(lock(&self.inner.log).max_frame_in)
    }

    /// Plugin methods called so far, in order.
    #[must_use]
    pub fn methods(&self) -> Vec<String> {
        lock(&self.inner.log).methods.clone()
    }

    /// Synchronize messages sent so far.
    #[must_use]
    pub fn syncs(&self) -> Vec<SyncRecord> {
        lock(&self.inner.log).syncs.clone()
    }

    /// Protocol errors that made the runtime drop a plugin.
    #[must_use]
    pub fn errors(&self) -> Vec<String> {
        lock(&self.inner.log).errors.clone()
    }

    /// Closes the plugin connection (the plugin should reconnect).
    pub fn disconnect(&self) {
        if let Some(s) = lock(&self.inner.current).take() {
            s.trunk.close();
        }
    }

    /// Calls any Plugin-side method with a raw payload.
    ///
    /// # Errors
    /// The call fails or no plugin is connected.
    pub async fn call_raw(&self, service: &str, method: &str, payload: Bytes) -> Result<Bytes, RuntimeError> {
        let s = self.session()?;
        self.call(&s, service, method, payload).await
    }

    async fn call(
        &self,
        s: &Session,
        service: &str,
        method: &str,
        payload: Bytes,
    ) -> Result<Bytes, RuntimeError> {
        lock(&self.inner.log).methods.push(method.to_string());
        let timeout = lock(&self.inner.cfg).request_timeout;
        let r = s.client.call(service, method, payload, timeout).await;
        if let Err(e) = &r
            && is_fatal(e)
        {
            // Fatal for the runtimes: they close the plugin and carry on without it.
            lock(&self.inner.log).errors.push(format!("{method}: {e}"));
            self.disconnect();
        }
        Ok(r?)
    }

    async fn pod_event(
        &self,
        event: pb::Event,
        method: &str,
        pod: &pb::PodSandbox,
    ) -> Result<(), RuntimeError> {
        let s = self.session()?;
        if s.events & event_bit(event) == 0 {
            return Ok(());
        }
        let dialect = lock(&self.inner.cfg).dialect;
        if dialect == Dialect::Dedicated {
            // Every pod request message is `{PodSandbox pod = 1}`.
            let req = pb::RunPodSandboxRequest {
                pod: Some(pod.clone()),
            };
            match self
                .call(&s, PLUGIN_SERVICE, method, req.encode_to_vec().into())
                .await
            {
                Err(e) if e.code() == Some(code::UNIMPLEMENTED) => {}
                other => return other.map(drop),
            }
        }
        self.send_state_change(&s, event, pod).await
    }

    /// NRI RunPodSandbox (containerd: after CNI setup; an error fails the sandbox).
    ///
    /// # Errors
    /// The plugin's error status, a timeout, or no plugin.
    pub async fn run_pod_sandbox(&self, pod: &pb::PodSandbox) -> Result<(), RuntimeError> {
        self.pod_event(pb::Event::RunPodSandbox, "RunPodSandbox", pod)
            .await
    }

    /// NRI StopPodSandbox.
    ///
    /// # Errors
    /// As [`NriRuntime::run_pod_sandbox`].
    pub async fn stop_pod_sandbox(&self, pod: &pb::PodSandbox) -> Result<(), RuntimeError> {
        self.pod_event(pb::Event::StopPodSandbox, "StopPodSandbox", pod)
            .await
    }

    /// NRI RemovePodSandbox. With [`Flavor::Containerd`] the network namespace path is blanked,
    /// as containerd sends none on remove; [`Flavor::Crio`] sends the pod as given (CRI-O keeps
    /// the old, dead path).
    ///
    /// # Errors
    /// As [`NriRuntime::run_pod_sandbox`].
    pub async fn remove_pod_sandbox(&self, pod: &pb::PodSandbox) -> Result<(), RuntimeError> {
        let flavor = lock(&self.inner.cfg).flavor;
        let mut pod = pod.clone();
        if flavor == Flavor::Containerd
            && let Some(l) = pod.linux.as_mut()
        {
            for ns in l.namespaces.iter_mut().filter(|n| n.r#type == "network") {
                ns.path.clear();
            }
        }
        self.pod_event(pb::Event::RemovePodSandbox, "RemovePodSandbox", &pod)
            .await
    }

    /// The old dialect directly: a StateChange event for a pod.
    ///
    /// # Errors
    /// As [`NriRuntime::run_pod_sandbox`].
    pub async fn state_change(&self, event: pb::Event, pod: &pb::PodSandbox) -> Result<(), RuntimeError> {
        let s = self.session()?;
        self.send_state_change(&s, event, pod).await
    }

    async fn send_state_change(
        &self,
        s: &Session,
        event: pb::Event,
        pod: &pb::PodSandbox,
    ) -> Result<(), RuntimeError> {
        let ev = pb::StateChangeEvent {
            event: event as i32,
            pod: Some(pod.clone()),
            container: None,
        };
        self.call(s, PLUGIN_SERVICE, "StateChange", ev.encode_to_vec().into())
            .await
            .map(drop)
    }

    /// NRI CreateContainer: the plugin's adjustment (`None` if not subscribed or none given).
    ///
    /// With the default validator enabled, as the real runtimes: no plugin, or a plugin dropped
    /// on this request (timeout, closed), is no error by itself; the validator then refuses the
    /// container if a required plugin was not in the runtime's list when the request began.
    ///
    /// # Errors
    /// As [`NriRuntime::run_pod_sandbox`]; [`RuntimeError::Refused`] when the validator refuses.
    pub async fn create_container(
        &self,
        pod: &pb::PodSandbox,
        container: &pb::Container,
    ) -> Result<Option<pb::ContainerAdjustment>, RuntimeError> {
        let validator = lock(&self.inner.cfg).validator.clone();
        if !validator.enable {
            let s = self.session()?;
            return self.create_container_call(&s, pod, container).await;
        }
        // The runtime's plugin list when the request begins: the builtin validator, and the
        // plugin if connected, each recorded before it is called (pkg/adaptation CreateContainer).
        let mut present = vec![PluginInstance::validator()];
        let mut adjust = None;
        if let Ok(s) = self.session() {
            present.push(PluginInstance {
                name: s.plugin.name.clone(),
                index: s.plugin.index.clone(),
            });
            match self.create_container_call(&s, pod, container).await {
                Ok(a) => adjust = a,
                // Fatal: the runtime dropped the plugin (`call` did) and goes on without it.
                Err(RuntimeError::Rpc(e)) if is_fatal(&e) => {}
                Err(e) => return Err(e),
            }
        }
        if let Err(reason) = validate_required_plugins(&validator, pod, container, &present) {
            let msg = rejection(&PluginInstance::validator(), &reason);
            lock(&self.inner.log).refusals.push(msg.clone());
            return Err(RuntimeError::Refused(msg));
        }
        Ok(adjust)
    }

    async fn create_container_call(
        &self,
        s: &Session,
        pod: &pb::PodSandbox,
        container: &pb::Container,
    ) -> Result<Option<pb::ContainerAdjustment>, RuntimeError> {
        if s.events & event_bit(pb::Event::CreateContainer) == 0 {
            return Ok(None);
        }
        let req = pb::CreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        let out = self
            .call(s, PLUGIN_SERVICE, "CreateContainer", req.encode_to_vec().into())
            .await?;
        let resp = pb::CreateContainerResponse::decode(out).map_err(|source| TtrpcError::Decode {
            what: "CreateContainerResponse",
            source,
        })?;
        Ok(resp.adjust)
    }

    /// NRI Shutdown (the runtime is going down).
    ///
    /// # Errors
    /// As [`NriRuntime::run_pod_sandbox`].
    pub async fn shutdown(&self) -> Result<(), RuntimeError> {
        let s = self.session()?;
        self.call(
            &s,
            PLUGIN_SERVICE,
            "Shutdown",
            pb::Empty {}.encode_to_vec().into(),
        )
        .await
        .map(drop)
    }
}

impl Drop for NriRuntime {
    fn drop(&mut self) {
        self.accept.abort();
        self.disconnect();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Errors after which containerd/CRI-O drop the plugin connection.
fn is_fatal(e: &TtrpcError) -> bool {
    matches!(
        e,
        TtrpcError::Timeout { .. } | TtrpcError::Closed | TtrpcError::Mux(_)
    ) || e.code() == Some(code::DEADLINE_EXCEEDED)
}

fn stat(s: &MuxStats) -> u64 {
    s.max_frame_in.load(std::sync::atomic::Ordering::Relaxed)
}

async fn accept_loop(listener: UnixListener, inner: Arc<Inner>) {
    while let Ok((stream, _)) = listener.accept().await {
        let inner = inner.clone();
        tokio::spawn(async move {
            if let Err(why) = handshake(stream, &inner).await {
                lock(&inner.log).errors.push(why);
            }
        });
    }
}

/// The Runtime service: RegisterPlugin (validated like `pkg/adaptation`) and UpdateContainers.
struct RuntimeService {
    registered: mpsc::UnboundedSender<(String, String, String)>,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
}

impl Service for RuntimeService {
    async fn call(self: Arc<Self>, service: String, method: String, payload: Bytes) -> CallResult {
        match (service.as_str(), method.as_str()) {
            (RUNTIME_SERVICE, "RegisterPlugin") => {
                let req = pb::RegisterPluginRequest::decode(payload)
                    .map_err(|e| ttrpc::status(code::INVALID_ARGUMENT, e.to_string()))?;
                let idx_ok = req.plugin_idx.len() == 2 && req.plugin_idx.bytes().all(|b| b.is_ascii_digit());
                if !valid_name(&req.plugin_name) || !idx_ok {
                    return Err(ttrpc::status(
                        code::INVALID_ARGUMENT,
                        "invalid plugin name or index",
                    ));
                }
                let _ = self
                    .registered
                    .send((req.plugin_name, req.plugin_idx, req.nri_version));
                Ok(pb::Empty {}.encode_to_vec().into())
            }
            (RUNTIME_SERVICE, "UpdateContainers") => Ok(pb::UpdateContainersResponse { failed: Vec::new() }
                .encode_to_vec()
                .into()),
            _ => Err(ttrpc::unimplemented(&service, &method)),
        }
    }
}

async fn handshake(stream: UnixStream, inner: &Arc<Inner>) -> Result<(), String> {
    let cfg = lock(&inner.cfg).clone();
    let tap = Arc::new(Mutex::new(Vec::new()));
    let opts = MuxOptions {
        split: cfg.split.clone(),
        max_frame_in: cfg.strict_frames.then_some(GO_FRAME_LIMIT),
        tap: Some(tap.clone()),
    };
    let mut mux = Mux::new(stream, opts);
    let plugin_conn = mux.open(PLUGIN_SERVICE_CONN);
    let runtime_conn = mux.open(RUNTIME_SERVICE_CONN);
    let trunk = mux.start();
    let (reg_tx, mut reg_rx) = mpsc::unbounded_channel();
    let server = tokio::spawn(ttrpc::serve(
        runtime_conn,
        Arc::new(RuntimeService { registered: reg_tx }),
    ));
    let client = Arc::new(Client::new(plugin_conn));
    let (name, index, nri_version) = tokio::time::timeout(cfg.registration_timeout, reg_rx.recv())
        .await
        .map_err(|_| "plugin did not register in time".to_string())?
        .ok_or("connection closed before registration")?;
    let t = cfg.request_timeout;
    let conf = pb::ConfigureRequest {
        config: String::new(),
        runtime_name: cfg.runtime_name.clone(),
        runtime_version: cfg.runtime_version.clone(),
        registration_timeout: i64::try_from(cfg.registration_timeout.as_millis()).unwrap_or(i64::MAX),
        request_timeout: i64::try_from(t.as_millis()).unwrap_or(i64::MAX),
        nri_version: "v0.12.0".into(),
    };
    lock(&inner.log).methods.push("Configure".into());
    let resp: pb::ConfigureResponse = client
        .call_msg(PLUGIN_SERVICE, "Configure", &conf, t)
        .await
        .map_err(|e| format!("Configure: {e}"))?;
    if resp.events & !VALID_EVENTS != 0 {
        return Err(format!("Configure: invalid event mask {:#x}", resp.events));
    }
    let events = if resp.events == 0 {
        VALID_EVENTS
    } else {
        resp.events
    };
    synchronize(inner, &client, &cfg).await?;
    let session = Arc::new(Session {
        client,
        trunk,
        plugin: RegisteredPlugin {
            name,
            index,
            nri_version,
            events: resp.events,
        },
        events,
        tap,
    });
    let old = lock(&inner.current).replace(session.clone());
    if let Some(old) = old {
        old.trunk.close();
    }
    inner.ready.send_modify(|n| *n += 1);
    // Keep the Runtime service up for the life of the trunk; remember its frame stats after.
    session.trunk.closed().await;
    server.abort();
    let max = stat(&session.trunk.stats());
    let mut log = lock(&inner.log);
    log.max_frame_in = log.max_frame_in.max(max);
    drop(log);
    let mut cur = lock(&inner.current);
    if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, &session)) {
        *cur = None;
    }
    drop(cur);
    Ok(())
}

async fn sync_call(
    inner: &Inner,
    client: &Client,
    req: &pb::SynchronizeRequest,
    t: Duration,
) -> Result<pb::SynchronizeResponse, TtrpcError> {
    lock(&inner.log).methods.push("Synchronize".into());
    let r = client
        .call_msg::<_, pb::SynchronizeResponse>(PLUGIN_SERVICE, "Synchronize", req, t)
        .await;
    lock(&inner.log).syncs.push(SyncRecord {
        pods: req.pods.len(),
        containers: req.containers.len(),
        more: req.more,
        reply_more: r.as_ref().ok().map(|x| x.more),
    });
    r
}

async fn synchronize(inner: &Inner, client: &Client, cfg: &RuntimeConfig) -> Result<(), String> {
    let t = cfg.request_timeout;
    let chunk = match cfg.sync {
        SyncMode::Auto => {
            let req = pb::SynchronizeRequest {
                pods: cfg.pods.clone(),
                containers: cfg.containers.clone(),
                more: false,
            };
            match sync_call(inner, client, &req, t).await {
                Ok(r) => return check_sync_reply(&r, false),
                Err(e) if e.code() == Some(code::RESOURCE_EXHAUSTED) => 100,
                Err(e) => return Err(format!("Synchronize: {e}")),
            }
        }
        SyncMode::Chunks(n) => n.max(1),
    };
    let pods: Vec<_> = cfg.pods.chunks(chunk).collect();
    let ctrs: Vec<_> = cfg.containers.chunks(chunk).collect();
    let n = pods.len().max(ctrs.len()).max(1);
    for i in 0..n {
        let more = i + 1 < n;
        let req = pb::SynchronizeRequest {
            pods: pods.get(i).map(|p| p.to_vec()).unwrap_or_default(),
            containers: ctrs.get(i).map(|c| c.to_vec()).unwrap_or_default(),
            more,
        };
        let r = sync_call(inner, client, &req, t)
            .await
            .map_err(|e| format!("Synchronize: {e}"))?;
        check_sync_reply(&r, more)?;
    }
    Ok(())
}

fn check_sync_reply(r: &pb::SynchronizeResponse, more: bool) -> Result<(), String> {
    if r.more != more || (more && !r.update.is_empty()) {
        return Err("plugin does not handle split sync requests".into());
    }
    Ok(())
}
