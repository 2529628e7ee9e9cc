//! Adoption at the runtime's Synchronize: every running sandbox dranet has no record of whose pod
//! holds devices of this driver is handed to [`Engine::adopt`], which looks for those devices in
//! the sandbox's netns by kernel identity, then pins and records what it finds (see
//! `rescue/adopt.rs`). This covers pods started by upstream dranet before a switch, and a lost or
//! corrupt checkpoint.
//!
//! Where a pod's devices come from, node-local first:
//! 1. the engine's plan of the pod (the checkpoint still has its Prepare);
//! 2. otherwise the node's allocated claims ([`crate::dra::ClaimSource::list`], this driver's
//!    results in this node's pool, reserved for the pod: [`devices_by_pod`]), with the
//!    identities of the devices this node published before this start ([`PublishedDevices`]).
//!
//! The second needs the kubelet side, which starts after the runtime side (so after the first
//! Synchronize): it arrives through an [`AllocationsCell`] set late and waited for, bounded.
//! Everything runs in the background: Synchronize answers the runtime within its 2 s budget
//! whatever the API server does.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::dra::{ClaimError, ClaimSource, devices_by_pod};
use crate::plan::DevicePlan;
use crate::rescue::{AdoptOutcome, Allocated, Engine, SandboxInfo};
use crate::slices::PublishedDevices;

/// How long an adoption run may wait for the claims (the kubelet side coming up, the API server
/// answering) before it gives up on the sandboxes that have no plan.
pub const ADOPTION_DEADLINE: Duration = Duration::from_secs(300);

/// The devices allocated to this node's pods, as adoption looks for them: the node's claims
/// joined with the identities this node published.
pub struct NodeAllocations {
    claims: Arc<dyn ClaimSource>,
    driver: String,
    pool: String,
    published: PublishedDevices,
}

impl NodeAllocations {
    /// Claims from `claims`; this driver's results in pool `pool` (the node's name); device
    /// identities from `published`.
    #[must_use]
    pub fn new(
        claims: Arc<dyn ClaimSource>,
        driver: impl Into<String>,
        pool: impl Into<String>,
        published: PublishedDevices,
    ) -> Self {
        Self {
            claims,
            driver: driver.into(),
            pool: pool.into(),
            published,
        }
    }

    /// Pod UID → the devices of this driver on this node its claims hold.
    pub async fn by_pod(&self) -> Result<BTreeMap<String, Vec<Allocated>>, ClaimError> {
        let claims = self.claims.list().await?;
        Ok(devices_by_pod(&claims, &self.driver, &self.pool)
            .into_iter()
            .map(|(uid, devices)| (uid, devices.into_iter().map(|d| self.allocated(d)).collect()))
            .collect())
    }

    fn allocated(&self, device: String) -> Allocated {
        let p = self.published.get(&device).cloned().unwrap_or_default();
        Allocated {
            device,
            host_ifname: p.if_name,
            pci_address: p.pci_address,
            rdma_device: p.rdma_device,
        }
    }
}

/// Where [`NodeAllocations`] arrive once the kubelet side is up.
#[derive(Clone)]
pub struct AllocationsCell {
    tx: Arc<watch::Sender<Option<Arc<NodeAllocations>>>>,
}

impl Default for AllocationsCell {
    fn default() -> Self {
        Self {
            tx: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl AllocationsCell {
    /// Sets (or replaces) the allocations; waiting runs go on.
    pub fn set(&self, allocations: NodeAllocations) {
        self.tx.send_replace(Some(Arc::new(allocations)));
    }

    /// The allocations, waiting for them until `deadline`.
    pub async fn wait(&self, deadline: tokio::time::Instant) -> Option<Arc<NodeAllocations>> {
        let mut rx = self.tx.subscribe();
        match tokio::time::timeout_at(deadline, rx.wait_for(Option::is_some)).await {
            Ok(Ok(v)) => v.clone(),
            _ => None,
        }
    }
}

/// The devices of a plan, as adoption looks for them.
#[must_use]
pub fn from_plan(plan: &[DevicePlan]) -> Vec<Allocated> {
    plan.iter()
        .map(|d| Allocated {
            device: d.device.clone(),
            host_ifname: d.host_ifname.clone(),
            pci_address: d.pci_address.clone(),
            rdma_device: d.rdma_device.clone(),
        })
        .collect()
}

/// Where a sandbox's devices were learnt from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The engine's plan of the pod.
    Plan,
    /// The node's allocated claims and the slices published before this start.
    Claims,
}

/// What adoption did for one sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SandboxAdoption {
    pub pod_uid: String,
    pub sandbox: String,
    pub from: Source,
    /// The engine's answer, or its error.
    pub outcome: Result<AdoptOutcome, String>,
    /// Each device not found, with why.
    pub unidentified: Vec<(String, String)>,
}

/// Why `device` was not found in the sandbox's netns.
fn why_unidentified(device: &Allocated, from: Source) -> String {
    match (&device.pci_address, from) {
        (Some(pci), _) => format!("no link in the sandbox's netns has PCI function {pci} as parent"),
        (None, Source::Plan) => {
            "no PCI address in its plan: no kernel identity to find it by (a virtual device, e.g. a veth)"
                .to_owned()
        }
        (None, Source::Claims) => "no PCI address in the slices this node published before this start: no \
                                  kernel identity to find it by (a virtual device, e.g. a veth, or a device \
                                  this node never published)"
            .to_owned(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

/// Adoption counters.
#[derive(Clone, Default)]
pub struct AdoptionMetrics {
    sandboxes: Family<OutcomeLabels, Counter>,
    devices: Counter,
}

impl AdoptionMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "dranet_adoption_sandboxes",
            "Running sandboxes with no record whose pod holds devices of this driver, by outcome (adopted, nothing_found, failed)",
            self.sandboxes.clone(),
        );
        r.register(
            "dranet_adopted_devices",
            "Devices found in a running sandbox's netns by kernel identity and adopted",
            self.devices.clone(),
        );
    }

    fn count(&self, outcome: &str) {
        self.sandboxes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }
}

/// Runs adoption for the sandboxes of a Synchronize, in the background.
#[derive(Clone)]
pub struct Adopter {
    engine: Engine,
    cell: AllocationsCell,
    deadline: Duration,
    metrics: AdoptionMetrics,
    /// One run at a time (a reconnect's Synchronize during a run waits, then finds the work
    /// done).
    running: Arc<tokio::sync::Mutex<()>>,
    last: Arc<Mutex<Vec<SandboxAdoption>>>,
    runs: Arc<watch::Sender<u64>>,
    /// Attaches the devices of a planned sandbox that holds none of them (it ran while dranet
    /// was away: [`crate::pod::late`]).
    late: Option<crate::pod::late::LateAttacher>,
}

impl Adopter {
    #[must_use]
    pub fn new(engine: Engine, cell: AllocationsCell) -> Self {
        Self {
            engine,
            cell,
            deadline: ADOPTION_DEADLINE,
            metrics: AdoptionMetrics::default(),
            running: Arc::default(),
            last: Arc::default(),
            runs: Arc::new(watch::Sender::new(0)),
            late: None,
        }
    }

    /// A sandbox with a plan and none of its devices in its netns gets them through `late`.
    #[must_use]
    pub fn with_late(mut self, late: crate::pod::late::LateAttacher) -> Self {
        self.late = Some(late);
        self
    }

    /// Gives up on sandboxes without a plan after `deadline` instead of [`ADOPTION_DEADLINE`].
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    #[must_use]
    pub fn metrics(&self) -> &AdoptionMetrics {
        &self.metrics
    }

    /// Counts finished runs (tests wait on it).
    #[must_use]
    pub fn runs(&self) -> watch::Receiver<u64> {
        self.runs.subscribe()
    }

    /// What the last finished run did, sandbox by sandbox (only sandboxes whose pod holds
    /// devices of this driver).
    #[must_use]
    pub fn last(&self) -> Vec<SandboxAdoption> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sandboxes worth a look: with a netns that is still there and no record (their ids were
    /// checked at the boundary: [`SandboxInfo::parse`]).
    fn candidates(&self, running: &[SandboxInfo]) -> Vec<SandboxInfo> {
        let cp = self.engine.checkpoint();
        running
            .iter()
            .filter(|s| {
                s.netns.as_deref().is_some_and(std::path::Path::exists) && !cp.pods.contains_key(&s.key())
            })
            .cloned()
            .collect()
    }

    /// Starts a run over `running` in the background and returns at once.
    pub fn spawn(&self, running: &[SandboxInfo]) {
        let candidates = self.candidates(running);
        if candidates.is_empty() {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let report = me.run(candidates).await;
            *me.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = report;
            me.runs.send_modify(|n| *n += 1);
        });
    }

    /// Adopts what it can of `candidates`: those with a plan at once, the others once the
    /// node's claims are known (bounded by the deadline).
    async fn run(&self, candidates: Vec<SandboxInfo>) -> Vec<SandboxAdoption> {
        let _one = self.running.lock().await;
        let deadline = tokio::time::Instant::now() + self.deadline;
        let mut report = Vec::new();
        let mut without_plan = Vec::new();
        for sb in candidates {
            match self.engine.plan(&sb.uid).filter(|p| !p.is_empty()) {
                Some(plan) => {
                    let adopted = self.adopt(&sb, &from_plan(&plan), Source::Plan).await;
                    let nothing = matches!(adopted.outcome, Ok(AdoptOutcome::NothingFound { .. }));
                    report.push(adopted);
                    // Prepared, and none of its devices in its netns: the runtime ran it while
                    // dranet was away. Attach them now (they are in the host).
                    if let (true, Some(late)) = (nothing, &self.late) {
                        let _ = late.attach(&sb, crate::pod::late::Trigger::Synchronize).await;
                    }
                }
                None => without_plan.push(sb),
            }
        }
        if without_plan.is_empty() {
            return report;
        }
        let Some(by_pod) = self.claims(deadline).await else {
            warn!(
                sandboxes = without_plan.len(),
                "adoption: the node's claims are not known; running sandboxes without a plan are not adopted (the next Synchronize tries again)"
            );
            return report;
        };
        for sb in without_plan {
            match by_pod.get(sb.uid.as_str()) {
                Some(devices) => report.push(self.adopt(&sb, devices, Source::Claims).await),
                None => debug!(
                    pod = %sb.uid,
                    sandbox = %sb.sandbox,
                    "adoption: holds no device of this driver"
                ),
            }
        }
        report
    }

    /// The node's allocations by pod: waits for the kubelet side, then lists the claims, retried
    /// with backoff; `None` once `deadline` passes.
    async fn claims(&self, deadline: tokio::time::Instant) -> Option<BTreeMap<String, Vec<Allocated>>> {
        let Some(allocations) = self.cell.wait(deadline).await else {
            warn!(after = ?self.deadline, "adoption: the kubelet side never came up with the node's claims");
            return None;
        };
        let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        loop {
            match tokio::time::timeout_at(deadline, allocations.by_pod()).await {
                Ok(Ok(m)) => return Some(m),
                Ok(Err(e)) => {
                    let wait = backoff.next_delay();
                    warn!(error = %crate::telemetry::chain(&e), retry_in = ?wait, "adoption: cannot list the node's claims");
                    if matches!(e, ClaimError::ListUnsupported)
                        || tokio::time::Instant::now() + wait >= deadline
                    {
                        return None;
                    }
                    tokio::time::sleep(wait).await;
                }
                Err(_) => {
                    warn!(after = ?self.deadline, "adoption: no answer listing the node's claims");
                    return None;
                }
            }
        }
    }

    /// One sandbox: the engine's adoption, counted and logged with why each device missing was
    /// not found.
    async fn adopt(&self, sb: &SandboxInfo, devices: &[Allocated], from: Source) -> SandboxAdoption {
        let outcome = self.engine.adopt(sb, devices).await;
        let unidentified: Vec<(String, String)> = match &outcome {
            Ok(AdoptOutcome::NothingFound { unidentified } | AdoptOutcome::Adopted { unidentified, .. }) => {
                unidentified
                    .iter()
                    .map(|name| {
                        let why = devices
                            .iter()
                            .find(|d| d.device == *name)
                            .map_or_else(|| "unknown".to_owned(), |d| why_unidentified(d, from));
                        (name.clone(), why)
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        let why: Vec<String> = unidentified.iter().map(|(d, w)| format!("{d}: {w}")).collect();
        match &outcome {
            Ok(AdoptOutcome::Known) => {}
            Ok(AdoptOutcome::Adopted { devices, .. }) => {
                self.metrics.count("adopted");
                self.metrics.devices.inc_by(devices.len() as u64);
                info!(pod = %sb.uid, sandbox = %sb.sandbox, ?from, ?devices, unidentified = ?why,
                      "adoption: running sandbox adopted; its devices come home at teardown");
            }
            Ok(AdoptOutcome::NothingFound { .. }) if from == Source::Plan && self.late.is_some() => {
                self.metrics.count("nothing_found");
                info!(
                    pod = %sb.uid,
                    sandbox = %sb.sandbox,
                    "adoption: none of the pod's devices is in its netns: the sandbox ran while dranet was away; attaching them now"
                );
            }
            Ok(AdoptOutcome::NothingFound { .. }) => {
                self.metrics.count("nothing_found");
                warn!(pod = %sb.uid, sandbox = %sb.sandbox, ?from, unidentified = ?why,
                      "adoption: none of the pod's devices found in its netns by kernel identity: not adopted, not protected");
            }
            Err(e) => {
                self.metrics.count("failed");
                warn!(pod = %sb.uid, sandbox = %sb.sandbox, ?from, error = %crate::telemetry::chain(&e), "adoption failed");
            }
        }
        SandboxAdoption {
            pod_uid: sb.uid.to_string(),
            sandbox: sb.sandbox.to_string(),
            from,
            outcome: outcome.map_err(|e| crate::telemetry::chain(&e).to_string()),
            unidentified,
        }
    }
}
