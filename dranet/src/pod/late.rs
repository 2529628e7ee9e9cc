//! Late attach: a sandbox that runs without its devices gets them as soon as dranet learns of it.
//!
//! While dranet's NRI plugin is away (a DaemonSet update, a crash, a stall past the runtime's
//! request timeout) the runtime runs sandboxes without it: a pod whose claims kubelet prepared
//! starts with its devices still in the host. When dranet is back it learns of such a sandbox
//! from the runtime:
//!
//! * at **Synchronize** (every (re)connection lists the running sandboxes): adoption first looks
//!   for the pod's devices in the sandbox's netns ([`crate::adoption`]: a lost checkpoint); found
//!   nowhere there, they are attached now, in the background;
//! * at **CreateContainer** (kubelet creating a container of such a sandbox, or retrying one the
//!   runtime's validator refused while dranet was away): attached *before* the hook answers, so
//!   the container starts with its devices — within [`CREATE_CONTAINER_BUDGET`], under the
//!   runtime's 2 s request timeout; an attach that takes longer goes on in the background and the
//!   hook fails the container, which kubelet retries (then the devices are there).
//!
//! Either way the attach is a normal one ([`Engine::attach_pod`]: kernel identity, snapshot,
//! write-ahead record, pin), and the operator is told: a Warning event on the pod
//! (`NetworkDeviceLateAttach`), the claims' status, `dranet_late_attach_total{trigger}` and a WARN
//! naming the pod and its devices. Containers that started before the devices keep running: dranet
//! never kills a workload; the event says they ran without the devices.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tracing::warn;

use crate::report::{EventReason, ObjectRef, Reporter};
use crate::rescue::{AttachOutcome, Engine, PodRef, RescueError, SandboxInfo};
use crate::state::{PodPhase, pod_key};

/// How long CreateContainer waits for a late attach before it fails the container (kubelet
/// retries it): under the runtimes' default 2 s plugin request timeout, with margin.
pub const CREATE_CONTAINER_BUDGET: Duration = Duration::from_millis(1500);

/// What made dranet attach late.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The runtime's Synchronize listed the sandbox.
    Synchronize,
    /// A CreateContainer of the sandbox.
    CreateContainer,
    /// The sandbox's own RunPodSandbox attached the devices, but the runtime had stopped waiting
    /// for that answer (dranet stalled past the runtime's request timeout, or the connection
    /// closed): the runtime ran the sandbox, and maybe its containers, without them.
    LateAnswer,
}

impl Trigger {
    /// The metric label and log field.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Self::Synchronize => "synchronize",
            Self::CreateContainer => "create_container",
            Self::LateAnswer => "late_answer",
        }
    }
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TriggerLabels {
    trigger: String,
}

/// Late-attach counters.
#[derive(Clone, Default)]
pub struct LateMetrics {
    attached: Family<TriggerLabels, Counter>,
    failed: Family<TriggerLabels, Counter>,
}

impl LateMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "dranet_late_attach",
            "Sandboxes that ran without their devices (created while dranet was away from the runtime, or while it stalled past the runtime's request timeout) whose devices were then attached, by trigger (synchronize, create_container, late_answer)",
            self.attached.clone(),
        );
        r.register(
            "dranet_late_attach_failures",
            "Late attaches that failed, by trigger",
            self.failed.clone(),
        );
    }

    fn count(&self, family: &Family<TriggerLabels, Counter>, t: Trigger) {
        family
            .get_or_create(&TriggerLabels {
                trigger: t.label().to_owned(),
            })
            .inc();
    }

    /// Late attaches so far with trigger `t` (tests).
    #[must_use]
    pub fn attached(&self, t: Trigger) -> u64 {
        self.attached
            .get_or_create(&TriggerLabels {
                trigger: t.label().to_owned(),
            })
            .get()
    }
}

/// Attaches late, and tells the operator.
#[derive(Clone)]
pub struct LateAttacher {
    engine: Engine,
    reporter: Reporter,
    metrics: LateMetrics,
}

impl LateAttacher {
    #[must_use]
    pub fn new(engine: Engine, reporter: Reporter) -> Self {
        Self {
            engine,
            reporter,
            metrics: LateMetrics::default(),
        }
    }

    #[must_use]
    pub fn metrics(&self) -> &LateMetrics {
        &self.metrics
    }

    /// Whether the sandbox runs without its devices as far as the checkpoint knows: its pod has
    /// planned devices, it has a netns that is there, and dranet has no record of it, or only
    /// the write-ahead record of an attach under way (Synchronize's late attach, in the
    /// background, with the devices not moved yet): [`LateAttacher::attach_before_container`]
    /// then waits for it under the pod's lock (the engine finds it attached, or attaches).
    #[must_use]
    pub fn pending(&self, uid: &str, sandbox: &str, netns: Option<&Path>) -> bool {
        netns.is_some_and(Path::exists)
            && self.engine.plan(uid).is_some_and(|p| !p.is_empty())
            && self
                .engine
                .pod_record(&pod_key(uid, sandbox))
                .is_none_or(|r| r.phase == PodPhase::Attaching)
    }

    /// Attaches the pod's devices to the running sandbox `sb`, and reports it.
    ///
    /// # Errors
    /// The engine's, when the attach failed (nothing was left half-done: the engine rolls back).
    pub async fn attach(&self, sb: &SandboxInfo, trigger: Trigger) -> Result<AttachOutcome, RescueError> {
        let Some(netns) = sb.netns.as_deref() else {
            return Ok(AttachOutcome::NotOurs);
        };
        let started = Instant::now();
        let made = crate::sys::netns::made_at(netns);
        let pod = PodRef {
            uid: sb.uid.clone(),
            sandbox: sb.sandbox.clone(),
            namespace: &sb.namespace,
            name: &sb.name,
        };
        let r = self.engine.attach_pod(pod, netns).await;
        let object = ObjectRef::pod(&sb.namespace, &sb.name, &sb.uid);
        match &r {
            Ok(AttachOutcome::Attached { devices }) => {
                self.report_attached(sb, trigger, devices, started.elapsed(), made);
            }
            Ok(AttachOutcome::AlreadyAttached | AttachOutcome::NotOurs) => {}
            Err(e) => {
                self.metrics.count(&self.metrics.failed, trigger);
                warn!(
                    pod = %format!("{}/{}", sb.namespace, sb.name),
                    pod_uid = %sb.uid,
                    sandbox = %sb.sandbox,
                    trigger = trigger.label(),
                    error = %crate::telemetry::chain(e),
                    "late attach failed: the sandbox runs without its devices"
                );
                let ev = self.reporter.make_event(
                    object,
                    EventReason::NetworkDeviceAttachFailed,
                    format!(
                        "late attach (at {trigger}) of the pod's devices failed; the sandbox runs without them: {}",
                        crate::telemetry::chain(e)
                    ),
                );
                self.reporter.event(ev);
            }
        }
        r
    }

    /// The operator is told that `devices` of the sandbox `sb` came late (`took`: the attach, or
    /// the hook that did it): the metric, a WARN naming the pod and its devices, a
    /// `NetworkDeviceLateAttach` Warning event on the pod, the claims' status. Both say how long
    /// the pod ran without its devices: from when its netns was made (`made`: the runtime makes
    /// it as it starts the sandbox, see [`crate::sys::netns::made_at`]) until now.
    fn report_attached(
        &self,
        sb: &SandboxInfo,
        trigger: Trigger,
        devices: &[String],
        took: Duration,
        made: Option<SystemTime>,
    ) {
        self.metrics.count(&self.metrics.attached, trigger);
        let without = made.and_then(|t| SystemTime::now().duration_since(t).ok());
        let without_ms = without.map(|d| d.as_millis());
        let for_how_long = without.map_or_else(
            || " (how long is unknown: the sandbox's netns file could not be read)".to_owned(),
            |d| {
                format!(
                    " for {:.1} s (since its network namespace was made)",
                    d.as_secs_f64()
                )
            },
        );
        let why = match trigger {
            Trigger::LateAnswer => {
                "the runtime stopped waiting for dranet's answer to the pod's RunPodSandbox (a stall past its request timeout, or a closed connection) and ran the sandbox without its devices"
            }
            Trigger::Synchronize | Trigger::CreateContainer => {
                "the sandbox was created while dranet was away from the runtime and ran without its devices"
            }
        };
        warn!(
            pod = %format!("{}/{}", sb.namespace, sb.name),
            pod_uid = %sb.uid,
            sandbox = %sb.sandbox,
            trigger = trigger.label(),
            devices = %devices.join(","),
            took_ms = took.as_millis(),
            without_devices_ms = without_ms,
            "late attach: {why}; the pod ran without them{for_how_long}; they are attached now"
        );
        let object = ObjectRef::pod(&sb.namespace, &sb.name, &sb.uid);
        let ev = self.reporter.make_event(
            object,
            EventReason::NetworkDeviceLateAttach,
            match trigger {
                Trigger::LateAnswer => format!(
                    "devices {} attached late: the container runtime stopped waiting for dranet (its request timeout, or a closed connection) and ran the sandbox without them{for_how_long}; containers that started before now ran without them",
                    devices.join(", ")
                ),
                Trigger::Synchronize | Trigger::CreateContainer => format!(
                    "devices {} attached late (at {trigger}): the pod's sandbox was created while dranet was not connected to the container runtime and ran without them{for_how_long}; containers that started before now ran without them",
                    devices.join(", ")
                ),
            },
        );
        self.reporter.event(ev);
        super::hooks::report_claims(&self.engine, &self.reporter, &sb.uid, &sb.sandbox);
    }

    /// RunPodSandbox attached the devices of `sb` after the runtime stopped waiting for it
    /// ([`Trigger::LateAnswer`]): reported as a late attach (`took`: the hook's time).
    pub fn answered_late(&self, sb: &SandboxInfo, took: Duration) {
        let Some(rec) = self.engine.pod_record(&sb.key()) else {
            return;
        };
        let devices: Vec<String> = rec.devices.iter().map(|d| d.device.clone()).collect();
        let made = sb.netns.as_deref().and_then(crate::sys::netns::made_at);
        self.report_attached(sb, Trigger::LateAnswer, &devices, took, made);
    }

    /// CreateContainer's late attach: waits at most [`CREATE_CONTAINER_BUDGET`]; past it the
    /// attach goes on in the background and this says so.
    ///
    /// # Errors
    /// Why the container must not start yet: the attach failed, or is still running.
    pub async fn attach_before_container(&self, sb: SandboxInfo) -> Result<(), String> {
        let me = self.clone();
        let task = tokio::spawn(async move { me.attach(&sb, Trigger::CreateContainer).await });
        match tokio::time::timeout(CREATE_CONTAINER_BUDGET, task).await {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(e))) => Err(format!(
                "the pod's devices could not be attached: {}",
                crate::telemetry::chain(&e)
            )),
            Ok(Err(join)) => Err(format!("the late attach stopped: {join}")),
            Err(_) => Err(format!(
                "the pod's devices are still being attached after {CREATE_CONTAINER_BUDGET:?}: the container waits for them (kubelet retries)"
            )),
        }
    }
}
