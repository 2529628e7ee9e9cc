// Over 500 lines: the engine's shared state and its one action entry point; attach, detach, reconcile, adopt and sweep live in their own files.
//! The rescue engine: one owner per pod for every device move, whoever asks for it.
//!
//! Inputs: NRI hooks ([`Engine::attach_pod`], [`Engine::detach_sandbox`],
//! [`Engine::forget_sandbox`], [`Engine::synchronize`]), the watcher's lifecycle events
//! ([`Engine::run_events`], decided by [`decide`]) and the start-up reconcile
//! ([`Engine::reconcile`]). Every action takes the pod's lock, re-reads the checkpoint and is
//! idempotent, so a StopPodSandbox racing a probe-triggered rescue just finds the work done.
//!
//! **A pod is a sandbox in a netns, not a UID.** Records are per sandbox
//! ([`crate::state::pod_key`]); the lock is per pod UID, so the sandboxes of one pod (kubelet
//! re-creates a sandbox under the same UID) are handled one at a time. A hook for one sandbox
//! never touches another's devices; RunPodSandbox of a new sandbox first brings the devices home
//! from the older one.
//!
//! Data path: probe event → [`decide::decide`] → [`Engine::rescue`] → `link::detach` through the pin
//! (`netns::Pin`) → snapshot restored → pin released → checkpoint.
//!
//! **Pins survive a driver restart.** A pin is a bind mount of the pod netns under
//! `<state-dir>/pins/<sandbox-id>` (tmpfs; [`crate::state::PodRecord::pin_name`]), not just an fd: if dranet is killed while a runtime tears
//! the pod down, the netns — and our devices in it — stay reachable, and the restarted driver
//! re-opens the pin, sees the runtime's path gone and brings the devices home. An fd-only pin
//! would die with the process and leave the kernel to return physical NICs DOWN and renamed
//! (and to orphan exclusive-mode RDMA links). On uninstall, `dranet release-all` brings every
//! device home and removes the pins; a pin left behind by hand only keeps an empty netns alive.

pub mod activity;
mod adopt;
mod attach;
pub mod decide;
mod detach;
#[cfg(test)]
mod engine_tests;
mod kernel;
mod lane;
mod owner;
mod rebuild;
mod reconcile;
mod sandbox;
mod vanished;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tracing::{debug, info, warn};

use crate::clock::MonoTime;
use crate::plan::{ClaimPlan, DevicePlan, PodPlan};
use crate::state::{
    Checkpoint, Durability, LoadSource, PodPhase, RecordKey, ReturnReason, StateError, StateLock, Store,
    Transition, Writer,
};
use crate::sys::link::{LinkError, PodSocket};
use crate::sys::netns::{Netns, NetnsError, Pin};
use crate::sys::rdma::{KernelRdma, RdmaOps};
use crate::watch::{Subscription, Watcher};
use kernel::{Kernel, SysKernel};

pub use crate::telemetry::metrics::RescueMetrics;
use crate::telemetry::metrics::rescue as metrics;
pub use crate::telemetry::metrics::rescue::Counters;
pub use adopt::{AdoptOutcome, Allocated, parent_pci_address};
pub use attach::PodRef;
pub use decide::{Action, RescueTrigger, decide};
pub use detach::StuckReason;
pub use owner::Owner;
pub use reconcile::ReconcileReport;
pub use sandbox::{SWEEP_EVERY, SandboxInfo, SandboxRef, SyncReport};

/// Errors of the rescue engine.
#[derive(Debug, thiserror::Error)]
pub enum RescueError {
    #[error("pod {pod}: netns {path}")]
    Netns {
        pod: Owner,
        path: PathBuf,
        #[source]
        source: NetnsError,
    },
    #[error("pod {pod}: pin")]
    Pin {
        pod: Owner,
        #[source]
        source: NetnsError,
    },
    /// A pin no record claims (the start-up rebuild): released or looked into.
    #[error("pin {pin} (no record claims it)")]
    StrayPin {
        pin: PathBuf,
        #[source]
        source: NetnsError,
    },
    /// Netlink in the netns of a pin no record claims (the start-up rebuild).
    #[error("pin {pin} (no record claims it): netlink in its netns")]
    StrayPinNetlink {
        pin: PathBuf,
        #[source]
        source: LinkError,
    },
    #[error("pod {pod}: device {device}")]
    Link {
        pod: Owner,
        device: String,
        #[source]
        source: LinkError,
    },
    #[error("pod {pod}: netlink in the pod netns")]
    PodNetlink {
        pod: Owner,
        #[source]
        source: LinkError,
    },
    #[error("pod {pod}: device {device} has no host interface name in its plan")]
    NoInterface { pod: Owner, device: String },
    #[error("pod {pod}: netns {path} is the host's own network namespace; refusing to move devices")]
    HostNetns { pod: Owner, path: PathBuf },
    #[error("pod {pod}: device {device} is already attached to pod {other}")]
    DeviceBusy {
        pod: Owner,
        device: String,
        other: Owner,
    },
    #[error("pod {pod}: {failed} of {total} devices could not be brought home; will retry: {first}")]
    Incomplete {
        pod: Owner,
        failed: usize,
        total: usize,
        first: String,
        /// Why the first cause failed, as the stuck report labels it.
        stuck: StuckReason,
    },
    #[error("pod {pod}: RDMA device {device}")]
    Rdma {
        pod: Owner,
        device: String,
        #[source]
        source: crate::sys::rdma::RdmaError,
    },
    #[error("pod {pod}: device {device}: PCI rebind")]
    Pci {
        pod: Owner,
        device: String,
        #[source]
        source: crate::pci::PciError,
    },
    #[error("checkpoint")]
    State(#[from] StateError),
    #[error(transparent)]
    Id(#[from] crate::ids::IdError),
    #[error("host netns")]
    Host(#[source] NetnsError),
    #[error("host netlink")]
    HostNetlink(#[source] LinkError),
    #[error("pod {pod}: device {device}: {what} did not finish within {after:?}; not waiting for it")]
    Timeout {
        pod: Owner,
        device: String,
        what: &'static str,
        after: std::time::Duration,
    },
    #[error("{what}: the blocking task failed")]
    Task { what: &'static str },
    #[error("inventory of a pinned netns")]
    Inventory(#[source] crate::inventory::InventoryError),
    /// `dranet release-all` asked this daemon to bring every device home: no new attach.
    #[error(
        "pod {pod}: dranet is being uninstalled (release-all brought every device home): no device is attached"
    )]
    Uninstalling { pod: Owner },
}

impl RescueError {
    /// The device the error is about, when it names one.
    #[must_use]
    pub fn device(&self) -> Option<&str> {
        match self {
            Self::Link { device, .. }
            | Self::NoInterface { device, .. }
            | Self::DeviceBusy { device, .. }
            | Self::Rdma { device, .. }
            | Self::Timeout { device, .. }
            | Self::Pci { device, .. } => Some(device),
            _ => None,
        }
    }
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// State dir (checkpoint + pins), on tmpfs: `/run/dranet`.
    pub state_dir: PathBuf,
    /// Last resort for physical devices missing everywhere: PCI unbind/rebind via sysfs.
    pub pci_rebind: bool,
    /// sysfs root (tests may point it elsewhere for the rebind path).
    pub sysfs: PathBuf,
    /// Crash tests only: sleep this long after moving device N of an attach (the test SIGKILLs
    /// the process in that window).
    #[doc(hidden)]
    pub pause_after_device: Option<(usize, std::time::Duration)>,
    /// How long to wait for another process to let go of the state dir's lock.
    pub lock_wait: std::time::Duration,
    /// Bound on each kernel operation on a device (its move and restore over rtnetlink, its
    /// RDMA move): past it the operation counts as failed and the pod's lock is released (the
    /// operation itself may still finish later; detach finds the device by its identity).
    pub kernel_timeout: std::time::Duration,
    /// The inventory's CEL filter (`--filter`): a link in a pin no record claims is taken as
    /// ours only if the inventory would publish it under this filter (see `rebuild`).
    pub device_filter: String,
    /// Tests only: the RDMA subsystem (default: the kernel's, over NETLINK_RDMA).
    #[doc(hidden)]
    pub rdma: Option<Arc<dyn RdmaOps>>,
}

/// Default [`EngineOptions::kernel_timeout`].
pub const KERNEL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/run/dranet"),
            pci_rebind: false,
            sysfs: PathBuf::from("/sys"),
            pause_after_device: None,
            lock_wait: std::time::Duration::from_secs(10),
            kernel_timeout: KERNEL_TIMEOUT,
            device_filter: crate::inventory::DEFAULT_FILTER.to_owned(),
            rdma: None,
        }
    }
}

/// A pod whose netns holds our devices, as the running process holds it.
struct Live {
    pin: Pin,
    /// An rtnetlink socket inside the pod netns, opened at attach and kept idle for a fast
    /// detach (a connection is made on it then: no thread hop into the netns).
    socket: Option<PodSocket>,
}

struct Inner {
    opts: EngineOptions,
    store: Store,
    cp: Mutex<Checkpoint>,
    /// Saves the checkpoint off the async workers. Declared before `_lock`: it writes what is
    /// still staged when the engine goes, and only then is the lock released.
    writer: Writer,
    _lock: StateLock,
    /// Where the checkpoint came from at start.
    load_source: LoadSource,
    rdma: Arc<dyn RdmaOps>,
    /// Every link and netns operation ([`kernel`]: the kernel itself, or the unit tests' fake).
    kernel: Arc<dyn Kernel>,
    /// The per-pod locks ([`Engine::own`]).
    locks: Mutex<HashMap<Owner, Arc<tokio::sync::Mutex<()>>>>,
    /// Pinned netns of the sandboxes holding devices, by record key.
    live: Mutex<HashMap<RecordKey, Live>>,
    host: Netns,
    /// RDMA netns mode of the host; `None` without RDMA.
    rdma_mode: Option<crate::sys::rdma::NetnsMode>,
    watcher: Option<Watcher>,
    metrics: RescueMetrics,
    activity: tokio::sync::broadcast::Sender<activity::Activity>,
    last_rescue: Mutex<Option<RescueTiming>>,
    /// Device returns in flight and attaches first ([`lane`]).
    lane: lane::Lane,
    /// Set by [`Engine::stop_attaching`] (`dranet release-all` beside the daemon): every attach
    /// is refused from then on.
    attaching_stopped: std::sync::atomic::AtomicBool,
    /// Set by [`Engine::report_vanished_with_acks`]: a reporter confirms every vanished
    /// device's report ([`Engine::vanish_reported`]), so a `Gone` device is saved
    /// `vanish_unreported` before its report and its record waits for the confirmation.
    vanish_acks: std::sync::atomic::AtomicBool,
    /// Reports of vanished devices this process sent and the reporter has not confirmed yet
    /// (record key, device): a reconcile meanwhile does not send them again.
    vanish_sent: Mutex<std::collections::HashSet<(RecordKey, String)>>,
}

/// Timestamps (CLOCK_MONOTONIC ns, the clock of [`crate::watch::mono_now`] and of the probes)
/// of the latest probe-triggered rescue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RescueTiming {
    pub pod_uid: String,
    pub trigger: RescueTrigger,
    /// When the teardown signal happened (the probe's event time).
    pub event_ns: MonoTime,
    /// When the engine started bringing its first device home (`None`: nothing was out).
    pub first_move_ns: Option<MonoTime>,
    /// When every device was home (or the rescue gave up).
    pub done_ns: MonoTime,
    pub ok: bool,
}

/// What [`Engine::attach_pod`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum AttachOutcome {
    /// No devices are planned for this pod: not ours.
    NotOurs,
    /// Already attached to this netns (the runtime retried).
    AlreadyAttached,
    /// Devices moved in, by pod-side name.
    Attached { devices: Vec<String> },
}

/// What [`Engine::detach_sandbox`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum DetachOutcome {
    NotOurs,
    /// Nothing to do: the devices came home earlier (e.g. rescued at netns teardown).
    AlreadyReturned {
        reason: ReturnReason,
    },
    /// Devices brought home now, by host name.
    Returned {
        devices: Vec<String>,
        name_busy: Vec<String>,
    },
}

/// Passes of a probe-triggered rescue before it waits for the next trigger (20 ms doubling to
/// 2 s: about 15 s in all).
const RESCUE_ATTEMPTS: u32 = 12;

/// The engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    /// Takes the state dir (its lock, waiting up to [`EngineOptions::lock_wait`]), loads the
    /// checkpoint (a record file that does not load is moved aside and its `.prev` used, else the
    /// record is left out: never an error) and opens the host handles. Call
    /// [`Engine::reconcile`] next: it also rebuilds records from pins no record claims.
    pub async fn new(opts: EngineOptions, watcher: Option<Watcher>) -> Result<Self, RescueError> {
        Self::with_kernel(opts, watcher, Arc::new(SysKernel)).await
    }

    /// [`Engine::new`] over the link and netns operations of `kernel`.
    async fn with_kernel(
        opts: EngineOptions,
        watcher: Option<Watcher>,
        kernel: Arc<dyn Kernel>,
    ) -> Result<Self, RescueError> {
        let store = Store::open(&opts.state_dir)?;
        let lock = StateLock::acquire(store.dir(), opts.lock_wait).await?;
        let s = store.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            s.remove_stale_temp_files();
            s.load_or_recover()
        })
        .await
        .map_err(|_| RescueError::Task {
            what: "loading the checkpoint",
        })?;
        let writer = Writer::start(store.clone())?;
        let host = kernel.host_netns().map_err(RescueError::Host)?;
        // The host rtnetlink works here; operations open their own sockets (the kernel runs one
        // dump at a time per socket: concurrent rescues sharing one failed with EBUSY).
        drop(kernel.host_netlink().await.map_err(RescueError::HostNetlink)?);
        let rdma: Arc<dyn RdmaOps> = opts.rdma.clone().unwrap_or_else(|| Arc::new(KernelRdma));
        let ops = rdma.clone();
        let mode = tokio::time::timeout(
            opts.kernel_timeout,
            tokio::task::spawn_blocking(move || ops.host_mode()),
        )
        .await;
        let rdma_mode = match mode {
            Ok(Ok(Ok(m))) => m,
            Ok(Ok(Err(e))) => {
                warn!(error = %crate::telemetry::chain(&e), "cannot read the RDMA netns mode; RDMA links will not be moved");
                None
            }
            Ok(Err(_)) | Err(_) => {
                warn!("reading the RDMA netns mode failed or hung; RDMA links will not be moved");
                None
            }
        };
        info!(?rdma_mode, "RDMA netns mode");
        Ok(Self {
            inner: Arc::new(Inner {
                opts,
                store,
                cp: Mutex::new(loaded.cp),
                writer,
                _lock: lock,
                load_source: loaded.source,
                rdma,
                kernel,
                locks: Mutex::new(HashMap::new()),
                live: Mutex::new(HashMap::new()),
                host,
                rdma_mode,
                watcher,
                metrics: RescueMetrics::default(),
                activity: tokio::sync::broadcast::channel(1024).0,
                last_rescue: Mutex::new(None),
                lane: lane::Lane::new(),
                attaching_stopped: std::sync::atomic::AtomicBool::new(false),
                vanish_acks: std::sync::atomic::AtomicBool::new(false),
                vanish_sent: Mutex::default(),
            }),
        })
    }

    /// Where the checkpoint came from when the engine started.
    #[must_use]
    pub fn load_source(&self) -> &LoadSource {
        &self.inner.load_source
    }

    /// A copy of the checkpoint as it stands.
    #[must_use]
    pub fn checkpoint(&self) -> Checkpoint {
        self.cp().clone()
    }

    /// Runs `f` on the checkpoint under its lock, without a copy. Keep `f` short: the event
    /// path waits for this lock.
    pub fn with_checkpoint<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> R {
        f(&self.cp())
    }

    /// A copy of one sandbox's record.
    #[must_use]
    pub fn pod_record(&self, key: &str) -> Option<crate::state::PodRecord> {
        self.cp().record(key).cloned()
    }

    #[must_use]
    pub fn counters(&self) -> Counters {
        self.inner.metrics.counters()
    }

    /// Subscribes to the activity feed (hooks, rescues, returns).
    #[must_use]
    pub fn activity(&self) -> tokio::sync::broadcast::Receiver<activity::Activity> {
        self.inner.activity.subscribe()
    }

    /// Records one activity of `owner` (no-op without subscribers).
    pub fn record(&self, owner: impl Into<Owner>, kind: activity::ActivityKind) {
        if self.inner.activity.receiver_count() == 0 {
            return;
        }
        let owner = owner.into();
        let pod_uid = owner.uid_str();
        let (pod, netns_path) = {
            let cp = self.cp();
            let latest = cp
                .records_of(pod_uid)
                .max_by_key(|r| r.phase == PodPhase::Attached);
            match (latest, cp.plans.get(pod_uid)) {
                (Some(r), _) => (
                    format!("{}/{}", r.namespace, r.name),
                    Some(r.netns_path.display().to_string()),
                ),
                (None, Some(p)) => (format!("{}/{}", p.pod_namespace, p.pod_name), None),
                (None, None) => (String::new(), None),
            }
        };
        let _ = self.inner.activity.send(activity::Activity {
            at: crate::watch::mono_now(),
            pod_uid: pod_uid.to_owned(),
            pod,
            netns_path,
            kind,
        });
    }

    /// Timestamps of the latest probe-triggered rescue (benchmarks, `dranet trace`).
    #[must_use]
    pub fn last_rescue(&self) -> Option<RescueTiming> {
        lock(&self.inner.last_rescue).clone()
    }

    /// The engine's Prometheus metrics.
    #[must_use]
    pub fn metrics(&self) -> &RescueMetrics {
        &self.inner.metrics
    }

    #[must_use]
    pub fn state_dir(&self) -> &Path {
        self.inner.store.dir()
    }

    /// Stores the devices of one claim of a pod (NodePrepareResources), replacing what that claim
    /// had; the pod's plan is the union of its claims ([`crate::plan::set_claim`]). The save is
    /// staged ([`Engine::durable`] waits for it); if it cannot be staged, nothing changed.
    pub fn set_claim(&self, claim: ClaimPlan) -> Result<(), RescueError> {
        let emptied = {
            let mut cp = self.cp();
            let before = crate::plan::entries_of(&cp.plans, &claim.claim_uid, Some(&claim.pod_uid));
            let emptied = crate::plan::set_claim(&mut cp.plans, claim);
            if let Err(e) = self.inner.writer.stage(&cp) {
                crate::plan::put_back(&mut cp.plans, before);
                return Err(e.into());
            }
            emptied
        };
        for uid in emptied {
            self.prune_plan_lock(&uid);
        }
        Ok(())
    }

    /// Stores a whole pod plan: each of its claims as by [`Engine::set_claim`] (tests, benches and
    /// tools that plan a pod at once).
    pub fn set_plan(&self, plan: PodPlan) -> Result<(), RescueError> {
        let mut claims: Vec<ClaimPlan> = Vec::new();
        for d in plan.devices {
            match claims.iter_mut().find(|c| c.claim_uid == d.claim.uid) {
                Some(c) => c.devices.push(d),
                None => claims.push(ClaimPlan {
                    pod_uid: plan.pod_uid.clone(),
                    pod_namespace: plan.pod_namespace.clone(),
                    pod_name: plan.pod_name.clone(),
                    claim_uid: d.claim.uid.clone(),
                    devices: vec![d],
                }),
            }
        }
        claims.into_iter().try_for_each(|c| self.set_claim(c))
    }

    /// The devices stored for claim `claim_uid`.
    #[must_use]
    pub fn claim_devices(&self, claim_uid: &str) -> Vec<DevicePlan> {
        crate::plan::claim_devices(&self.cp().plans, claim_uid)
    }

    /// Waits until every change made so far is on disk.
    pub async fn durable(&self) -> Result<(), RescueError> {
        let generation = self.inner.writer.staged();
        self.inner.writer.durable(generation).await?;
        Ok(())
    }

    /// Forgets the plans of a claim (NodeUnprepareResources) and returns them. Devices already in
    /// a pod stay tracked until they are home. The save is staged ([`Engine::durable`]); if it
    /// cannot be staged, nothing changed.
    pub fn remove_claim(&self, claim_uid: &str) -> Result<Vec<DevicePlan>, RescueError> {
        let (removed, emptied) = {
            let mut cp = self.cp();
            let before = crate::plan::entries_of(&cp.plans, claim_uid, None);
            let (removed, emptied) = crate::plan::remove_claim(&mut cp.plans, claim_uid);
            if removed.is_empty() {
                return Ok(removed);
            }
            if let Err(e) = self.inner.writer.stage(&cp) {
                crate::plan::put_back(&mut cp.plans, before);
                return Err(e.into());
            }
            (removed, emptied)
        };
        for uid in emptied {
            self.prune_plan_lock(&uid);
        }
        Ok(removed)
    }

    /// Forgets the plans of several claims (one NodeUnprepareResources call) as one change: one
    /// staged save, so one directory `fsync` however many claims. Returns each claim's devices, in
    /// the order of `claim_uids`. If the change cannot be staged, nothing changed.
    pub fn remove_claims(&self, claim_uids: &[String]) -> Result<Vec<Vec<DevicePlan>>, RescueError> {
        let (removed, emptied) = {
            let mut cp = self.cp();
            let before: Vec<_> = claim_uids
                .iter()
                .flat_map(|uid| crate::plan::entries_of(&cp.plans, uid, None))
                .collect();
            let mut removed = Vec::with_capacity(claim_uids.len());
            let mut emptied = Vec::new();
            for uid in claim_uids {
                let (r, e) = crate::plan::remove_claim(&mut cp.plans, uid);
                removed.push(r);
                emptied.extend(e);
            }
            if removed.iter().all(Vec::is_empty) {
                return Ok(removed);
            }
            if let Err(e) = self.inner.writer.stage(&cp) {
                // Every entry was taken before the first removal: a pod two claims touched gets
                // its value from before both.
                crate::plan::put_back(&mut cp.plans, before);
                return Err(e.into());
            }
            (removed, emptied)
        };
        for uid in emptied {
            self.prune_plan_lock(&uid);
        }
        Ok(removed)
    }

    /// How many checkpoint changes have been staged since start (each is one save of the writer,
    /// unless saves pile up and are coalesced). Tests and benches count changes with it.
    #[must_use]
    pub fn staged_changes(&self) -> u64 {
        self.inner.writer.staged()
    }

    /// The devices planned for a pod.
    #[must_use]
    pub fn plan(&self, pod_uid: &str) -> Option<Vec<DevicePlan>> {
        self.cp().plans.get(pod_uid).map(|p| p.devices.clone())
    }

    /// Sandboxes (owner, record key) that may still hold devices.
    #[must_use]
    pub fn sandboxes_with_devices_out(&self) -> Vec<(Owner, RecordKey)> {
        self.cp()
            .pods
            .values()
            .filter(|p| p.has_devices_out())
            .map(|p| (Owner::of(p), p.key()))
            .collect()
    }

    /// Consumes the watcher's events until the stream ends, acting on each decision at once.
    ///
    /// With the watcher's reactor ([`crate::watch::Reactor`]) the loop runs there, beside the
    /// ring-buffer reader, and so do rescues: a probe event reaches the first device move
    /// without waiting for an async worker. Every other action runs on the caller's runtime.
    pub async fn run_events(&self, sub: Subscription) {
        let here = tokio::runtime::Handle::current();
        let reactor = self.inner.watcher.as_ref().and_then(Watcher::reactor).cloned();
        match reactor {
            Some(rt) => {
                let me = self.clone();
                // Aborted with this future (the caller's task).
                let mut on_reactor = crate::watch::reactor::AbortOnDrop(
                    rt.spawn(async move { me.event_loop(sub, here).await }),
                );
                let _ = (&mut on_reactor.0).await;
            }
            None => self.event_loop(sub, here).await,
        }
    }

    /// [`Engine::run_events`] on the current runtime; actions other than rescues go to `others`.
    async fn event_loop(&self, mut sub: Subscription, others: tokio::runtime::Handle) {
        while let Some(ev) = sub.recv().await {
            let actions = decide(&self.cp(), &ev);
            for action in actions {
                debug!(?action, event = ev.kind_name(), "decision");
                let me = self.clone();
                if matches!(action, Action::Rescue { .. }) {
                    tokio::spawn(async move { me.act(action).await });
                } else {
                    others.spawn(async move { me.act(action).await });
                }
            }
        }
    }

    /// Carries out one decision.
    pub async fn act(&self, action: Action) {
        match action {
            Action::Rescue {
                owner,
                key,
                trigger,
                at,
            } => self.rescue(&owner, &key, trigger, at).await,
            Action::Repair {
                owner,
                key,
                device,
                ifindex,
            } => {
                if let Err(e) = self.repair(&owner, &key, &device, ifindex).await {
                    warn!(pod = %owner, record = %key, device, error = %crate::telemetry::chain(&e), "repair failed");
                    self.record(
                        &owner,
                        activity::ActivityKind::Failed {
                            action: activity::FailedAction::Repair,
                            error: crate::telemetry::chain(&e).to_string(),
                            device: Some(device),
                        },
                    );
                }
            }
            Action::Moved {
                owner,
                key,
                device,
                to,
            } => {
                if let Err(e) = self.moved(&owner, &key, &device, to).await {
                    warn!(pod = %owner, record = %key, device, error = %crate::telemetry::chain(&e), "recording a device move failed");
                }
            }
            Action::Rename { owner, key, device } => {
                if let Err(e) = self.rename_home(&owner, &key, &device).await {
                    warn!(pod = %owner, record = %key, device, error = %crate::telemetry::chain(&e), "giving a device its name back failed");
                }
            }
            Action::Forget { owner, key } => {
                {
                    let _owner = self.own(&owner).await;
                    if let Err(e) = self.drop_if_torn_down(&key).await {
                        warn!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), "cannot drop the record");
                    }
                }
                self.prune_lock(&owner);
            }
            Action::Reconcile => {
                self.inner.metrics.lost_events.inc();
                if let Err(e) = self.reconcile().await {
                    warn!(error = %crate::telemetry::chain(&e), "reconcile after lost events failed");
                }
            }
        }
    }

    /// A probe saw the sandbox's netns being torn down: every device home now, retried with
    /// backoff (the kernel or a busy RTNL can fail a pass) until home or the record is gone.
    async fn rescue(&self, owner: &Owner, key: &RecordKey, trigger: RescueTrigger, at: MonoTime) {
        info!(pod = %owner, record = %key, %trigger, "netns teardown started: bringing devices home");
        self.record(owner, activity::ActivityKind::RescueStarted { trigger });
        let mut delay = std::time::Duration::from_millis(20);
        for attempt in 1..=RESCUE_ATTEMPTS {
            let mut first_move = None;
            let res = {
                let _owner = self.own(owner).await;
                self.detach_timed(key, ReturnReason::NetnsTeardown, &mut first_move)
                    .await
            };
            // A second trigger of the same teardown (unlink after umount) finds the work
            // done and moves nothing: only the rescue that moved devices is recorded.
            if first_move.is_some() {
                self.record_rescue(owner.uid_str(), trigger, at, first_move, res.is_ok());
            }
            match res {
                Ok(DetachOutcome::Returned { .. }) => {
                    let took = crate::watch::mono_now().since(at);
                    self.inner.metrics.rescue_latency.observe(took.as_secs_f64());
                    self.inner
                        .metrics
                        .returns
                        .get_or_create(&metrics::TriggerLabel {
                            trigger: trigger.label().to_owned(),
                        })
                        .inc();
                    info!(pod = %owner, record = %key, %trigger, took_us = took.as_micros(), attempt, "rescued");
                    return;
                }
                Ok(_) => return,
                Err(e) if attempt == RESCUE_ATTEMPTS => {
                    warn!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), attempt, "rescue incomplete; giving up until the next trigger or reconcile");
                    let (stuck, why) = match &e {
                        RescueError::Incomplete { first, stuck, .. } => (*stuck, first.clone()),
                        other => (StuckReason::of(other), crate::telemetry::chain(other).to_string()),
                    };
                    let _owner = self.own(owner).await;
                    self.report_stuck(owner, key, stuck, &why).await;
                }
                Err(e) => {
                    debug!(pod = %owner, record = %key, error = %crate::telemetry::chain(&e), attempt, ?delay, "rescue incomplete; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(2));
                }
            }
        }
    }

    fn record_rescue(
        &self,
        uid: &str,
        trigger: RescueTrigger,
        at: MonoTime,
        first_move: Option<MonoTime>,
        ok: bool,
    ) {
        if let Some(t) = first_move {
            self.inner
                .metrics
                .rescue_reaction
                .observe(t.since(at).as_secs_f64());
        }
        *lock(&self.inner.last_rescue) = Some(RescueTiming {
            pod_uid: uid.to_owned(),
            trigger,
            event_ns: at,
            first_move_ns: first_move,
            done_ns: crate::watch::mono_now(),
            ok,
        });
    }

    fn cp(&self) -> MutexGuard<'_, Checkpoint> {
        lock(&self.inner.cp)
    }

    /// The per-pod owner lock (one owner for every sandbox of a pod UID; one for the records
    /// rebuilt from pins that no pod names yet: [`Owner::Unnamed`]).
    async fn own(&self, owner: impl Into<Owner>) -> tokio::sync::OwnedMutexGuard<()> {
        let m = lock(&self.inner.locks).entry(owner.into()).or_default().clone();
        m.lock_owned().await
    }

    /// Drops the lock of a pod that has no record and no plan left (the unnamed records' lock:
    /// no unnamed record left), once nobody holds or waits for it (the map's own reference is
    /// the only one: a waiter holds a clone, taken under the map's lock).
    fn prune_lock(&self, owner: impl Into<Owner>) {
        let owner = &owner.into();
        // An unnamed record's pod UID is empty on disk: `records_of("")` are those records.
        let uid = owner.uid_str();
        if self.cp().records_of(uid).next().is_some() || self.cp().plans.contains_key(uid) {
            return;
        }
        let mut locks = lock(&self.inner.locks);
        if locks.get(owner).is_some_and(|m| Arc::strong_count(m) == 1) {
            locks.remove(owner);
            crate::heap::shrink_sparse(&mut locks);
        }
    }

    /// [`Engine::prune_lock`] of the pod whose plan (keyed by the claim's pod UID, as the DRA
    /// request named it) emptied: a string that is no pod UID never had a lock.
    fn prune_plan_lock(&self, uid: &str) {
        if let Ok(uid) = crate::ids::pod_uid(uid) {
            self.prune_lock(Owner::Pod(uid));
        }
    }

    /// Number of per-pod locks held in memory (tests: the map is pruned with the records).
    #[must_use]
    pub fn lock_count(&self) -> usize {
        lock(&self.inner.locks).len()
    }

    /// Applies one record transition ([`Transition`]: the state module's vocabulary) to the
    /// record `key` and saves it as `durability` says (awaited: by the writer thread, no async
    /// worker blocks on `fsync`). A record (or device) that is gone, or one a new record would
    /// take the place of, is an error, and then nothing changed. The engine's only way to change
    /// its records.
    async fn transition(
        &self,
        key: &RecordKey,
        t: Transition,
        durability: Durability,
    ) -> Result<(), RescueError> {
        let generation = {
            let mut cp = self.cp();
            cp.apply(key, t)?;
            self.inner.writer.stage(&cp)?
        };
        if durability == Durability::Awaited {
            self.inner.writer.durable(generation).await?;
        }
        Ok(())
    }

    /// Runs one blocking kernel operation of device `device` of pod `pod` on the blocking pool,
    /// bounded by [`EngineOptions::kernel_timeout`]. Past the bound the caller goes on (and
    /// releases the pod's lock); the thread finishes whenever the kernel answers.
    pub(super) async fn blocking_op<T: Send + 'static>(
        &self,
        pod: impl Into<Owner>,
        device: &str,
        what: &'static str,
        op: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, RescueError> {
        let pod = pod.into();
        let after = self.inner.opts.kernel_timeout;
        match tokio::time::timeout(after, tokio::task::spawn_blocking(op)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(RescueError::Task { what }),
            Err(_) => {
                warn!(pod = %pod, device, what, ?after, "kernel operation timed out");
                Err(RescueError::Timeout {
                    pod,
                    device: device.to_owned(),
                    what,
                    after,
                })
            }
        }
    }

    /// A host rtnetlink socket of its own (the kernel runs one dump at a time per socket).
    pub(super) async fn host_netlink(&self) -> Result<crate::sys::link::Netlink, RescueError> {
        self.inner
            .kernel
            .host_netlink()
            .await
            .map_err(RescueError::HostNetlink)
    }

    /// Bounds one rtnetlink operation by [`EngineOptions::kernel_timeout`] (a reply the kernel
    /// never sends, a request stuck behind RTNL).
    pub(super) async fn link_op<T>(
        &self,
        what: &'static str,
        op: impl std::future::Future<Output = Result<T, LinkError>>,
    ) -> Result<T, LinkError> {
        let after = self.inner.opts.kernel_timeout;
        tokio::time::timeout(after, op)
            .await
            .unwrap_or_else(|_| Err(LinkError::Timeout { what, after }))
    }
}

/// Locks a std mutex, recovering the data if a holder panicked (the data is always consistent
/// between statements here).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
