//! The Plugin service (mux connection 1): Configure, Synchronize (chunked), Shutdown, the pod
//! hooks in both dialects (dedicated RPCs and `StateChange`) and CreateContainer.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::hooks::{ContainerInfo, HookError, LinuxDevice, Outcome, Pod, PodHook, PodHooks, Teardown};
use super::pb::google::rpc::Status;
use super::pb::nri as pb;
use super::plugin::{EVENTS, PLUGIN_SERVICE};
use super::ttrpc::{self, CallResult, Service, code};
use crate::telemetry::metrics::nri::{HookStatus, NriMetrics};

/// Bounds of a Synchronize sent in parts (`more = true`): what is buffered until the last part.
/// A node runs at most a few hundred pods (kubelet's `--max-pods` is 110 by default), each
/// retained in a few hundred bytes plus its labels and annotations; the defaults leave a wide
/// margin and still bound the daemon's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncLimits {
    /// Estimated bytes kept for the buffered pods and containers.
    pub max_bytes: usize,
    pub max_pods: usize,
    pub max_containers: usize,
}

impl Default for SyncLimits {
    fn default() -> Self {
        Self {
            max_bytes: 16 << 20,
            max_pods: 16_384,
            max_containers: 65_536,
        }
    }
}

/// Parts of a Synchronize received so far.
#[derive(Default)]
pub(super) enum SyncBuf {
    #[default]
    Empty,
    Buffering {
        pods: Vec<Pod>,
        containers: Vec<ContainerInfo>,
        bytes: usize,
    },
    /// A part went over the limits: everything was dropped, and every part up to the last one
    /// (`more = false`) is refused, so the hooks never see a partial list of pods (they would
    /// take the missing pods for gone and bring their devices home).
    Overflowed,
}

/// Every pod and container of a synchronization.
type SyncState = (Vec<Pod>, Vec<ContainerInfo>);

/// Per-entry cost of a map or vector element beyond its bytes (pointers, lengths, node slack):
/// an estimate, so that millions of tiny entries cannot hide under a byte count.
const ENTRY_OVERHEAD: usize = 64;

fn pod_cost(p: &pb::PodSandbox) -> usize {
    let netns = p
        .linux
        .as_ref()
        .map_or(0, |l| l.namespaces.iter().map(|n| n.path.len()).sum());
    let map = |m: &std::collections::HashMap<String, String>| {
        m.iter()
            .map(|(k, v)| k.len() + v.len() + ENTRY_OVERHEAD)
            .sum::<usize>()
    };
    std::mem::size_of::<Pod>()
        + p.uid.len()
        + p.namespace.len()
        + p.name.len()
        + p.id.len()
        + netns
        + map(&p.labels)
        + map(&p.annotations)
}

fn container_cost(c: &pb::Container) -> usize {
    std::mem::size_of::<ContainerInfo>() + c.id.len() + c.pod_sandbox_id.len() + c.name.len()
}

pub(super) struct PluginService<H> {
    pub(super) hooks: Arc<H>,
    pub(super) metrics: NriMetrics,
    pub(super) sync: Mutex<SyncBuf>,
    pub(super) sync_limits: SyncLimits,
    /// (runtime name, version) once Configure arrived.
    pub(super) configured: watch::Sender<Option<(String, String)>>,
    /// Set once the connection this service answers on is closed: an answer after that never
    /// reaches the runtime, which went on without it.
    pub(super) gone: Arc<AtomicBool>,
    /// Requests being answered: a shutdown closes the connection once none is.
    pub(super) in_flight: watch::Sender<usize>,
}

/// Counts one request in flight until dropped.
struct Busy<'a>(&'a watch::Sender<usize>);

impl<'a> Busy<'a> {
    fn enter(n: &'a watch::Sender<usize>) -> Self {
        n.send_modify(|v| *v += 1);
        Self(n)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|v| *v = v.saturating_sub(1));
    }
}

/// How long a Stop or Remove hook waits for its work before answering the runtime (which gives a
/// plugin 2 s).
pub const TEARDOWN_HOOK_WAIT: Duration = Duration::from_millis(1500);

fn decode<M: Message + Default>(payload: Bytes) -> Result<M, Status> {
    M::decode(payload)
        .map_err(|e| ttrpc::status(code::INVALID_ARGUMENT, format!("cannot decode request: {e}")))
}

fn reply<M: Message>(m: &M) -> CallResult {
    Ok(Bytes::from(m.encode_to_vec()))
}

/// The `status` label of a Run/Stop/Remove call (upstream's: `success`, `noop`, `failed`).
fn status_of<T>(r: &Result<Outcome, T>) -> HookStatus {
    match r {
        Ok(Outcome::Applied) => HookStatus::Success,
        Ok(Outcome::Noop) => HookStatus::Noop,
        Err(_) => HookStatus::Failed,
    }
}

fn hook_status(e: &HookError) -> Status {
    let c = match e {
        HookError::Failed { .. } => code::UNKNOWN,
        HookError::Rejected { .. } => code::FAILED_PRECONDITION,
    };
    ttrpc::status(c, crate::telemetry::chain(e).to_string())
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
        self.metrics.observe(PodHook::RunPodSandbox, start, status_of(&r));
        match r {
            Ok(outcome) => {
                debug!(pod = %pod.uid, ?outcome, "RunPodSandbox");
                // The runtime stopped waiting before this answer (a stall past its request
                // timeout, or its connection closed): it ran the sandbox without the devices.
                if outcome == Outcome::Applied && self.gone.load(Ordering::Acquire) {
                    self.hooks.answered_late(pod, start.elapsed());
                }
                Ok(())
            }
            Err(e) => {
                warn!(pod = %pod.uid, error = %hook_status(&e).message, "RunPodSandbox failed");
                Err(hook_status(&e))
            }
        }
    }

    /// Stop and Remove are best effort: errors are logged and counted, the runtime gets OK.
    ///
    /// The work runs in a task of its own, and the runtime gets its answer after at most
    /// [`TEARDOWN_HOOK_WAIT`]: in a node drain a pod's devices may be queued behind a hundred
    /// other returns (the kernel moves one device at a time under RTNL, ≈ 25 ms each), and a
    /// hook that outlasts the runtime's 2 s costs the plugin its connection. The return goes on
    /// (it holds the pod's lock, so the pod's next hook still comes after it).
    async fn stop_or_remove(&self, which: Teardown, pod: Option<pb::PodSandbox>) {
        let pod = Pod::from(&pod.unwrap_or_default());
        let start = Instant::now();
        let hook = which.hook();
        let (hooks, metrics, p) = (self.hooks.clone(), self.metrics.clone(), pod.clone());
        let work = tokio::spawn(async move {
            let r = match which {
                Teardown::Stop => hooks.stop_pod_sandbox(p.clone()).await,
                Teardown::Remove => hooks.remove_pod_sandbox(p.clone()).await,
            };
            metrics.observe(hook, start, status_of(&r));
            match r {
                Ok(outcome) => debug!(pod = %p.uid, %hook, ?outcome, "pod hook done"),
                Err(e) => {
                    warn!(pod = %p.uid, %hook, error = %hook_status(&e).message, "pod hook failed (ignored)")
                }
            }
        });
        if tokio::time::timeout(TEARDOWN_HOOK_WAIT, work).await.is_err() {
            info!(
                pod = %pod.uid,
                %hook,
                "devices still on their way home behind other returns: the runtime gets its answer, the return goes on"
            );
        }
    }

    async fn create_container(&self, req: pb::CreateContainerRequest) -> CallResult {
        let pod = Pod::from(&req.pod.unwrap_or_default());
        let c = ContainerInfo::from(&req.container.unwrap_or_default());
        let start = Instant::now();
        let r = self.hooks.create_container(pod.clone(), c).await;
        self.metrics.observe(
            PodHook::CreateContainer,
            start,
            match &r {
                Ok(d) if d.is_empty() => HookStatus::Noop,
                Ok(_) => HookStatus::Success,
                Err(_) => HookStatus::Failed,
            },
        );
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

    /// Adds one part to the buffer; the whole list once the last part is in.
    fn buffer_part(&self, req: &pb::SynchronizeRequest) -> Result<Option<SyncState>, Status> {
        let mut buf = self
            .sync
            .lock()
            .map_err(|_| ttrpc::status(code::INTERNAL, "sync state poisoned"))?;
        let lim = self.sync_limits;
        let (mut pods, mut containers, mut bytes) = match std::mem::take(&mut *buf) {
            SyncBuf::Empty => (Vec::new(), Vec::new(), 0),
            SyncBuf::Buffering {
                pods,
                containers,
                bytes,
            } => (pods, containers, bytes),
            SyncBuf::Overflowed => {
                if req.more {
                    *buf = SyncBuf::Overflowed;
                }
                return Err(ttrpc::status(
                    code::RESOURCE_EXHAUSTED,
                    "Synchronize: an earlier part of this synchronization went over the plugin's \
                     limits and was dropped; the rest is refused up to its last part",
                ));
            }
        };
        bytes += req.pods.iter().map(pod_cost).sum::<usize>()
            + req.containers.iter().map(container_cost).sum::<usize>();
        let (n_pods, n_containers) = (
            pods.len() + req.pods.len(),
            containers.len() + req.containers.len(),
        );
        if bytes > lim.max_bytes || n_pods > lim.max_pods || n_containers > lim.max_containers {
            warn!(
                bytes,
                pods = n_pods,
                containers = n_containers,
                ?lim,
                "Synchronize over the plugin's limits: buffered parts dropped"
            );
            if req.more {
                *buf = SyncBuf::Overflowed;
            }
            return Err(ttrpc::status(
                code::RESOURCE_EXHAUSTED,
                format!(
                    "Synchronize: {n_pods} pods, {n_containers} containers, ~{bytes} bytes exceed the plugin's \
                     limits ({} pods, {} containers, {} bytes); buffered parts dropped",
                    lim.max_pods, lim.max_containers, lim.max_bytes
                ),
            ));
        }
        pods.extend(req.pods.iter().map(Pod::from));
        containers.extend(req.containers.iter().map(ContainerInfo::from));
        if req.more {
            debug!(pods = pods.len(), bytes, "Synchronize: part buffered");
            *buf = SyncBuf::Buffering {
                pods,
                containers,
                bytes,
            };
            return Ok(None);
        }
        Ok(Some((pods, containers)))
    }

    async fn synchronize(&self, req: pb::SynchronizeRequest) -> CallResult {
        let Some((pods, containers)) = self.buffer_part(&req)? else {
            return reply(&pb::SynchronizeResponse {
                update: Vec::new(),
                more: true,
            });
        };
        info!(pods = pods.len(), containers = containers.len(), "Synchronize");
        let start = Instant::now();
        self.hooks.synchronize(pods, containers).await;
        self.metrics
            .observe(PodHook::Synchronize, start, HookStatus::Success);
        reply(&pb::SynchronizeResponse {
            update: Vec::new(),
            more: false,
        })
    }

    async fn state_change(&self, ev: pb::StateChangeEvent) -> CallResult {
        match pb::Event::try_from(ev.event) {
            Ok(pb::Event::RunPodSandbox) => self.run_pod(ev.pod).await?,
            Ok(pb::Event::StopPodSandbox) => self.stop_or_remove(Teardown::Stop, ev.pod).await,
            Ok(pb::Event::RemovePodSandbox) => self.stop_or_remove(Teardown::Remove, ev.pod).await,
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
        // Which dialect the runtime speaks (dedicated pod RPCs or StateChange) shows here.
        debug!(%method, "NRI request");
        let _busy = Busy::enter(&self.in_flight);
        let start = Instant::now();
        let r = self.answer(&service, &method, payload).await;
        // When each request was answered and how long it took: the runtime gives a plugin 2 s,
        // and an upgrade's gap runs from the old daemon's last answer to the new one's first.
        debug!(%method, took_ms = start.elapsed().as_secs_f64() * 1000.0, ok = r.is_ok(), "NRI answer");
        r
    }
}

impl<H: PodHooks> PluginService<H> {
    /// Waits until no request is being answered.
    pub(super) async fn idle(&self) {
        let _ = self.in_flight.subscribe().wait_for(|n| *n == 0).await;
    }

    /// Waits until a request is being answered.
    pub(super) async fn busy(&self) {
        let _ = self.in_flight.subscribe().wait_for(|n| *n > 0).await;
    }

    /// The answer to one request of the Plugin service.
    async fn answer(&self, service: &str, method: &str, payload: Bytes) -> CallResult {
        let hook = match method {
            "Configure" => {
                let req: pb::ConfigureRequest = decode(payload)?;
                debug!(runtime = %req.runtime_name, version = %req.runtime_version,
                       nri_version = %req.nri_version, request_timeout_ms = req.request_timeout,
                       "Configure");
                self.configured
                    .send_replace(Some((req.runtime_name, req.runtime_version)));
                return reply(&pb::ConfigureResponse {
                    events: EVENTS,
                    request_timeout: 0,
                });
            }
            "StateChange" => return self.state_change(decode(payload)?).await,
            m => PodHook::from_method(m),
        };
        match hook {
            Some(PodHook::Synchronize) => self.synchronize(decode(payload)?).await,
            Some(PodHook::Shutdown) => {
                let start = Instant::now();
                self.hooks.shutdown().await;
                self.metrics
                    .observe(PodHook::Shutdown, start, HookStatus::Success);
                reply(&pb::Empty {})
            }
            Some(PodHook::RunPodSandbox) => {
                let req: pb::RunPodSandboxRequest = decode(payload)?;
                self.run_pod(req.pod).await?;
                reply(&pb::RunPodSandboxResponse {})
            }
            Some(PodHook::StopPodSandbox) => {
                let req: pb::StopPodSandboxRequest = decode(payload)?;
                self.stop_or_remove(Teardown::Stop, req.pod).await;
                reply(&pb::StopPodSandboxResponse {})
            }
            Some(PodHook::RemovePodSandbox) => {
                let req: pb::RemovePodSandboxRequest = decode(payload)?;
                self.stop_or_remove(Teardown::Remove, req.pod).await;
                reply(&pb::RemovePodSandboxResponse {})
            }
            Some(PodHook::CreateContainer) => self.create_container(decode(payload)?).await,
            None => Err(ttrpc::unimplemented(service, method)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::hooks::DeviceKind;
    use super::*;

    /// Attaches every pod (Applied) and counts the late answers it is told of.
    #[derive(Default)]
    struct Attaching {
        late: Mutex<Vec<String>>,
    }

    impl PodHooks for Attaching {
        async fn run_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
            Ok(Outcome::Applied)
        }
        async fn stop_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
            Ok(Outcome::Noop)
        }
        async fn remove_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
            Ok(Outcome::Noop)
        }
        async fn create_container(
            &self,
            _pod: Pod,
            _c: ContainerInfo,
        ) -> Result<Vec<LinuxDevice>, HookError> {
            Ok(Vec::new())
        }
        async fn synchronize(&self, _pods: Vec<Pod>, _containers: Vec<ContainerInfo>) {}
        async fn shutdown(&self) {}
        fn answered_late(&self, pod: Pod, _took: Duration) {
            self.late.lock().unwrap().push(pod.uid);
        }
    }

    fn service(gone: bool) -> PluginService<Attaching> {
        PluginService {
            hooks: Arc::new(Attaching::default()),
            metrics: NriMetrics::default(),
            sync: Mutex::default(),
            sync_limits: SyncLimits::default(),
            configured: watch::channel(None).0,
            gone: Arc::new(AtomicBool::new(gone)),
            in_flight: watch::channel(0).0,
        }
    }

    #[tokio::test]
    async fn an_attach_answered_after_the_connection_closed_is_a_late_answer() {
        let pod = |uid: &str| {
            Some(pb::PodSandbox {
                uid: uid.into(),
                ..Default::default()
            })
        };
        let live = service(false);
        live.run_pod(pod("u-live")).await.unwrap();
        assert!(live.hooks.late.lock().unwrap().is_empty());
        let gone = service(true);
        gone.run_pod(pod("u-gone")).await.unwrap();
        assert_eq!(*gone.hooks.late.lock().unwrap(), vec!["u-gone".to_owned()]);
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
}
