//! The runtime's pod hooks (NRI) on top of the rescue engine: RunPodSandbox attaches,
//! StopPodSandbox / RemovePodSandbox detach (a no-op when the engine already rescued the
//! sandbox), CreateContainer injects the RDMA character devices, Synchronize returns devices of
//! sandboxes the runtime no longer knows, then adopts in the background the running sandboxes it
//! has no record of ([`crate::adoption`]). Every hook is about one *sandbox* (pod UID + sandbox
//! id): kubelet re-creates sandboxes under the same pod UID, and the old one's Stop or Remove
//! must not touch the new one's devices. Every hook is counted under upstream dranet's metric
//! names.
//!
//! After an attach the claims' device status (conditions, `networkData`) is applied, and a
//! failed attach is a Warning event on the pod, both through [`Reporter`]: spawned, never
//! awaited inside the hook's 2 s budget.

use std::collections::HashSet;
use std::time::Instant;

use tracing::info;

use crate::adoption::Adopter;
use crate::nri::hooks::{
    ContainerInfo, DeviceKind, HookError, LinuxDevice, Outcome, Pod, PodHook, PodHooks, Teardown,
};
use crate::pod::inflight::{InFlight, Waited};
use crate::pod::late::{CREATE_CONTAINER_BUDGET, LateAttacher};
use crate::report::{EventReason, ObjectRef, Reporter};
use crate::rescue::activity::ActivityKind;
use crate::rescue::{AttachOutcome, DetachOutcome, Engine, PodRef, RescueError, SandboxInfo, SandboxRef};
use crate::state::ReturnReason;

/// The driver's NRI side.
#[derive(Clone)]
pub struct Driver {
    engine: Engine,
    reporter: Reporter,
    adopter: Option<Adopter>,
    late: LateAttacher,
    /// Attaches still running after their RunPodSandbox answered ([`crate::pod::inflight`]).
    inflight: InFlight,
    run_budget: std::time::Duration,
}

impl Driver {
    #[must_use]
    pub fn new(engine: Engine) -> Self {
        Self {
            late: LateAttacher::new(engine.clone(), Reporter::disabled()),
            engine,
            reporter: Reporter::disabled(),
            adopter: None,
            inflight: InFlight::default(),
            run_budget: RUN_POD_SANDBOX_BUDGET,
        }
    }

    /// How long RunPodSandbox waits for its attach before answering (default
    /// [`RUN_POD_SANDBOX_BUDGET`]; tests shorten it).
    #[must_use]
    pub fn with_run_budget(mut self, budget: std::time::Duration) -> Self {
        self.run_budget = budget;
        self
    }

    /// Attaches late through `late` (shared with the adopter: one set of counters).
    #[must_use]
    pub fn with_late(mut self, late: LateAttacher) -> Self {
        self.late = late;
        self
    }

    /// After each Synchronize, adopts the running sandboxes with no record through `adopter`
    /// (in the background).
    #[must_use]
    pub fn with_adoption(mut self, adopter: Adopter) -> Self {
        self.adopter = Some(adopter);
        self
    }

    /// Reports claim status and events through `reporter`.
    #[must_use]
    pub fn with_reporter(mut self, reporter: Reporter) -> Self {
        self.late = LateAttacher::new(self.engine.clone(), reporter.clone());
        self.reporter = reporter;
        self
    }

    #[must_use]
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    async fn detach(&self, pod: &Pod, which: Teardown) -> Result<Outcome, HookError> {
        let start = Instant::now();
        let hook = which.hook();
        // The ids are checked here, once: the engine carries them typed.
        let sb =
            SandboxRef::parse(&pod.uid, &pod.id, pod.netns.as_deref()).map_err(|e| HookError::Failed {
                pod: pod.uid.clone(),
                action: hook.name(),
                source: Box::new(e),
            })?;
        self.engine.record(&sb.uid, ActivityKind::Hook { name: hook });
        let res = match which {
            Teardown::Remove => self.engine.forget_sandbox(sb).await,
            Teardown::Stop => self.engine.detach_sandbox(sb, ReturnReason::Hook).await,
        };
        match res {
            Ok(DetachOutcome::Returned { devices, name_busy }) => {
                info!(
                    pod = pod.uid,
                    sandbox = pod.id,
                    %hook,
                    ?devices,
                    ?name_busy,
                    took_us = start.elapsed().as_micros(),
                    "devices returned"
                );
                Ok(Outcome::Applied)
            }
            Ok(DetachOutcome::AlreadyReturned { reason }) => {
                info!(pod = pod.uid, %hook, ?reason, "devices already home");
                Ok(Outcome::Noop)
            }
            Ok(DetachOutcome::NotOurs) => Ok(Outcome::Noop),
            Err(e) => {
                // Logged once, with its causes, by the NRI service that answers the hook.
                info!(pod = pod.uid, %hook, "devices not all home; the engine retries");
                Err(HookError::Failed {
                    pod: pod.uid.clone(),
                    action: hook.name(),
                    source: Box::new(e),
                })
            }
        }
    }

    async fn attach(&self, pod: &Pod) -> Result<Outcome, HookError> {
        let Some(netns) = pod.netns.as_deref() else {
            if self.engine.plan(&pod.uid).is_some_and(|p| !p.is_empty()) {
                return Err(HookError::Rejected {
                    pod: pod.uid.clone(),
                    reason: "devices are allocated to a pod without its own network namespace (hostNetwork)"
                        .into(),
                });
            }
            return Ok(Outcome::Noop);
        };
        let start = Instant::now();
        // The ids are checked here, once: the engine carries them typed.
        let pod_ref =
            PodRef::parse(&pod.uid, &pod.id, &pod.namespace, &pod.name).map_err(|e| HookError::Failed {
                pod: pod.uid.clone(),
                action: "attach",
                source: Box::new(e),
            })?;
        let r = self.engine.attach_pod(pod_ref, netns).await;
        match r {
            Ok(AttachOutcome::Attached { devices }) => {
                info!(
                    pod = pod.uid,
                    ?devices,
                    took_us = start.elapsed().as_micros(),
                    "RunPodSandbox: attached"
                );
                self.report_status(&pod.uid, &pod.id);
                Ok(Outcome::Applied)
            }
            Ok(AttachOutcome::AlreadyAttached | AttachOutcome::NotOurs) => Ok(Outcome::Noop),
            Err(e) => {
                self.report_attach_failure(pod, &e);
                Err(HookError::Failed {
                    pod: pod.uid.clone(),
                    action: "attach",
                    source: Box::new(e),
                })
            }
        }
    }

    /// Applies the claims' device status of a sandbox just attached (in the background).
    fn report_status(&self, uid: &str, sandbox: &str) {
        report_claims(&self.engine, &self.reporter, uid, sandbox);
    }

    /// Upstream's Warning on the pod: `RDMADeviceAttachFailed` for the RDMA link,
    /// `NetworkDeviceAttachFailed` otherwise.
    fn report_attach_failure(&self, pod: &Pod, e: &RescueError) {
        let (reason, what) = if matches!(e, RescueError::Rdma { .. }) {
            (EventReason::RdmaDeviceAttachFailed, "RDMA device")
        } else {
            (EventReason::NetworkDeviceAttachFailed, "network device")
        };
        let device = e.device().unwrap_or("(all devices)");
        let ev = self.reporter.make_event(
            ObjectRef::pod(&pod.namespace, &pod.name, &pod.uid),
            reason,
            format!(
                "failed to attach {what} {device} to pod {}/{}: {}",
                pod.namespace,
                pod.name,
                crate::telemetry::chain(&e)
            ),
        );
        self.reporter.event(ev);
    }

    /// The RDMA character devices of the pod's devices, deduplicated by path.
    fn char_devices(&self, pod: &Pod) -> Vec<LinuxDevice> {
        let Some(plan) = self.engine.plan(&pod.uid) else {
            return Vec::new();
        };
        let mut seen = HashSet::new();
        plan.iter()
            .flat_map(|d| d.char_devices.iter())
            .filter(|c| seen.insert(c.path.clone()))
            .map(|c| LinuxDevice {
                path: c.path.clone(),
                kind: if c.kind == "b" {
                    DeviceKind::Block
                } else {
                    DeviceKind::Char
                },
                major: c.major,
                minor: c.minor,
                file_mode: Some(0o666),
                uid: Some(0),
                gid: Some(0),
            })
            .collect()
    }
}

/// Applies the claims' device status of a sandbox just attached, through `reporter` (in the
/// background).
pub(crate) fn report_claims(engine: &Engine, reporter: &Reporter, uid: &str, sandbox: &str) {
    let key = crate::state::pod_key(uid, sandbox);
    let (Some(plans), Some(rec)) = (engine.plan(uid), engine.pod_record(&key)) else {
        return;
    };
    for apply in crate::report::claim_statuses(reporter.driver(), &plans, &rec.devices) {
        reporter.claim_status(apply);
    }
}

/// How long RunPodSandbox waits for its attach before answering (the runtimes give a plugin 2 s
/// per request, and close a plugin that takes longer).
pub const RUN_POD_SANDBOX_BUDGET: std::time::Duration = std::time::Duration::from_millis(1500);

/// How long the Synchronize hook waits for its work before answering (the runtimes give a plugin
/// 2 s per request).
pub const SYNCHRONIZE_BUDGET: std::time::Duration = std::time::Duration::from_millis(1500);

/// The runtime's sandbox `p`, its ids checked (the NRI boundary).
fn sandbox_info(p: Pod) -> Result<SandboxInfo, crate::ids::IdError> {
    SandboxInfo::parse(&p.uid, &p.id, p.netns, p.namespace, p.name)
}

/// The sandboxes of a Synchronize, their ids checked (the NRI boundary). A sandbox whose ids
/// are not ids is left out here, with a warning: nothing is named after it, and no record can
/// be of it (a record's ids are checked when it is made and when it is loaded).
fn running_sandboxes(pods: Vec<Pod>) -> Vec<SandboxInfo> {
    pods.into_iter()
        .filter_map(|p| {
            sandbox_info(p)
                .map_err(
                    |e| tracing::warn!(error = %e, "Synchronize: a sandbox with invalid ids is left out"),
                )
                .ok()
        })
        .collect()
}

impl PodHooks for Driver {
    async fn run_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        // The feed names pods by checked UID; an invalid one fails in the attach (the hook's
        // error), unless the sandbox has no netns of its own.
        if let Ok(uid) = crate::ids::pod_uid(&pod.uid) {
            self.engine.record(
                uid,
                ActivityKind::Hook {
                    name: PodHook::RunPodSandbox,
                },
            );
        }
        // In a task of its own, answered within the budget: past the runtime's 2 s the runtime
        // closes dranet's connection and runs this sandbox, and every request until dranet is
        // back, without it. An attach past the budget goes on; the sandbox has no container yet,
        // and its first CreateContainer waits for the attach (crate::pod::inflight).
        let ticket = self.inflight.begin(crate::state::pod_key(&pod.uid, &pod.id));
        let (me, p) = (self.clone(), pod.clone());
        let work = tokio::spawn(async move {
            let r = me.attach(&p).await;
            ticket.end(match &r {
                Ok(_) => Ok(()),
                Err(e) => Err(crate::telemetry::chain(e).to_string()),
            });
            r
        });
        match tokio::time::timeout(self.run_budget, work).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(HookError::Failed {
                pod: pod.uid.clone(),
                action: "attach",
                source: format!("the attach task stopped: {join}").into(),
            }),
            Err(_) => {
                tracing::warn!(
                    pod = %format!("{}/{}", pod.namespace, pod.name),
                    pod_uid = pod.uid,
                    sandbox = pod.id,
                    budget = ?self.run_budget,
                    "RunPodSandbox: the attach is still running; answering the runtime now (its request timeout is 2 s); the sandbox's containers wait for the devices"
                );
                Ok(Outcome::Applied)
            }
        }
    }

    async fn stop_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.detach(&pod, Teardown::Stop).await
    }

    async fn remove_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.detach(&pod, Teardown::Remove).await
    }

    async fn create_container(
        &self,
        pod: Pod,
        container: ContainerInfo,
    ) -> Result<Vec<LinuxDevice>, HookError> {
        // An attach that outlived its RunPodSandbox: the container waits for it.
        let key = crate::state::pod_key(&pod.uid, &pod.id);
        match self.inflight.wait(&key, CREATE_CONTAINER_BUDGET).await {
            Waited::NoneRunning | Waited::Ended(Ok(())) => {}
            Waited::Ended(Err(why)) => {
                return Err(HookError::Failed {
                    pod: pod.uid.clone(),
                    action: "attach before the container",
                    source: format!(
                        "container {}: the pod's devices could not be attached: {why}",
                        container.name
                    )
                    .into(),
                });
            }
            Waited::StillRunning => {
                return Err(HookError::Failed {
                    pod: pod.uid.clone(),
                    action: "attach before the container",
                    source: format!(
                        "container {}: the pod's devices are still being attached after {CREATE_CONTAINER_BUDGET:?}: the container waits for them (kubelet retries)",
                        container.name
                    )
                    .into(),
                });
            }
        }
        // A sandbox the runtime ran while dranet was away: its devices first, so the container
        // starts with them (crate::pod::late).
        if self.late.pending(&pod.uid, &pod.id, pod.netns.as_deref()) {
            let devices = self.char_devices(&pod);
            let uid = pod.uid.clone();
            let sb = sandbox_info(pod).map_err(|e| HookError::Failed {
                pod: uid.clone(),
                action: "late attach before the container",
                source: Box::new(e),
            })?;
            if let Err(why) = self.late.attach_before_container(sb).await {
                return Err(HookError::Failed {
                    pod: uid,
                    action: "late attach before the container",
                    source: format!("container {}: {why}", container.name).into(),
                });
            }
            return Ok(devices);
        }
        Ok(self.char_devices(&pod))
    }

    async fn synchronize(&self, pods: Vec<Pod>, _containers: Vec<ContainerInfo>) {
        let running = running_sandboxes(pods);
        let (engine, adopter) = (self.engine.clone(), self.adopter.clone());
        // In a task of its own, answered within SYNCHRONIZE_BUDGET: after a long absence many
        // vanished sandboxes' devices may come home one after another (≈ 25 ms each under
        // RTNL), and a Synchronize past the runtime's 2 s costs the connection (and the
        // reconnection's Synchronize would start over). The work goes on; each pod's lock keeps
        // its later hooks after it.
        let work = tokio::spawn(async move {
            let report = engine.synchronize(&running).await;
            if report != crate::rescue::SyncReport::default() {
                info!(?report, "Synchronize: sandboxes the runtime no longer has");
            }
            // Never awaited here: the claims may take the kubelet side and the API server.
            if let Some(a) = &adopter {
                a.spawn(&running);
            }
        });
        if tokio::time::timeout(SYNCHRONIZE_BUDGET, work).await.is_err() {
            info!(
                budget = ?SYNCHRONIZE_BUDGET,
                "Synchronize: devices of vanished sandboxes still on their way home; the runtime gets its answer, the work goes on"
            );
        }
    }

    async fn shutdown(&self) {
        info!("the runtime is shutting down; pins keep pod netns reachable until we reconnect");
    }

    fn answered_late(&self, pod: Pod, took: std::time::Duration) {
        if let Ok(sb) = sandbox_info(pod) {
            self.late.answered_late(&sb, took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronize_leaves_out_the_sandboxes_whose_ids_are_not_ids() {
        let pod = |uid: &str, id: &str| Pod {
            uid: uid.into(),
            id: id.into(),
            netns: Some("/run/netns/x".into()),
            ..Pod::default()
        };
        let running = running_sandboxes(vec![
            pod("uid-1", "sb-1"),
            pod("../../etc", "sb-2"),
            pod("uid-3", "a/b"),
            pod("", "sb-4"),
            pod("uid-5", ""),
            pod("uid-6", "sb-6"),
        ]);
        let keys: Vec<String> = running.iter().map(|s| s.key().to_string()).collect();
        assert_eq!(keys, ["uid-1/sb-1", "uid-6/sb-6"]);
    }
}
