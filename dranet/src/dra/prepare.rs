// Over 500 lines: the Prepare pipeline (claim → results → config → plan) reads top to bottom; its phases are functions here, one file keeps the order visible.
//! NodePrepareResources / NodeUnprepareResources logic, independent of the gRPC version:
//! fetch the claim, take this driver's results in this node's pool, pick and validate the opaque
//! config per request, look the devices up in the inventory, and hand the claim's devices to the [`PlanSink`], which merges them into the pod's plan.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::claim::{ClaimError, ClaimSource, DeviceAllocationConfiguration, ResourceClaim};
use crate::config::{self, ConfigError, NetworkConfig};
use crate::dhcp::{DhcpError, Lease};
use crate::sys::bpf::{BpfError, Unpinned};
use crate::sys::ethtool::{Dev, EthtoolError, Features};
use futures::future::BoxFuture;

use super::profiles::{NoProviders, Providers};
use crate::inventory::{Device, DeviceIds, InventoryError, SharedInventory};
use crate::plan::{ClaimPlan, ClaimRef, DevicePlan};
use crate::shared::Shared;

/// The plan store Prepare writes to: the rescue engine, which checkpoints the plans (the NRI
/// hooks attach what it holds). It is the one owner of the plans and of their per-pod merge
/// ([`crate::plan::set_claim`]); Prepare keeps no copy.
pub trait PlanSink: Send + Sync + 'static {
    /// The devices stored now for claim `claim_uid` (a repeated Prepare keeps their DHCP leases,
    /// also across a restart).
    fn claim_devices(&self, claim_uid: &str) -> Vec<DevicePlan>;
    /// Stores the devices of one claim of a pod, replacing what that claim had. On error nothing
    /// changed.
    fn set_claim(&self, claim: ClaimPlan) -> Result<(), String>;
    /// Forgets the devices of one claim and returns them. On error nothing changed.
    fn remove_claim(&self, claim_uid: &str) -> Result<Vec<DevicePlan>, String>;
    /// Forgets the devices of several claims (one NodeUnprepareResources call) and returns each
    /// claim's, in order. A store that checkpoints makes it one change (the engine: one save, one
    /// `fsync`); the default forgets them one by one.
    fn remove_claims(&self, claim_uids: &[String]) -> Vec<Result<Vec<DevicePlan>, String>> {
        claim_uids.iter().map(|uid| self.remove_claim(uid)).collect()
    }
    /// Waits until every plan handed over so far is durable (the default: nothing to wait for).
    /// Prepare answers kubelet only after this: kubelet never prepares a claim twice.
    fn durable<'a>(&'a self) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// Finds inventory devices by slice device name.
pub trait DeviceLookup: Send + Sync + 'static {
    fn device(&self, name: &str) -> Option<Device>;

    /// Called when an allocated device is missing, before giving up: a lookup backed by a
    /// periodic scan rescans here (a device released and re-claimed before the next scan,
    /// google/dranet#253). The default does nothing.
    fn refresh<'a>(&'a self) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// Why device `name`, published but not found, is not to be prepared now (another link
    /// holds its host name: [`crate::inventory::Device::squatted`]). The default knows none.
    fn unavailable(&self, _name: &str) -> Option<String> {
        None
    }

    /// The offload features and private flags of host interface `ifname`, which a config's
    /// `ethtool` block is checked against. The default asks the kernel (ethtool netlink in the
    /// driver's netns, the host's).
    fn offloads(&self, ifname: &str) -> Result<Offloads, EthtoolError> {
        crate::sys::link::host_offloads(&Dev::Name(ifname.to_owned()))
    }

    /// `interface.disableEbpfPrograms: true` (upstream Prepare step 11): removes the bpffs pins
    /// of the links that target host interface `ifname` and returns them. The default walks
    /// `/sys/fs/bpf` in the driver's (host) netns on the blocking pool (a directory walk).
    fn unpin_ebpf<'a>(&'a self, ifname: &'a str) -> BoxFuture<'a, Result<Vec<Unpinned>, BpfError>> {
        let ifname = ifname.to_owned();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                crate::sys::bpf::unpin_links(crate::sys::bpf::bpffs_root(), &ifname)
            })
            .await
            .map_err(|e| BpfError::Syscall {
                what: "unpin task",
                source: std::io::Error::other(e.to_string()),
            })?
        })
    }
}

/// A device's ethtool state: features and private flags.
pub type Offloads = (Features, BTreeMap<String, bool>);

/// A [`SharedInventory`] that rescans once when a device is missing.
///
/// Misses come in storms: a drained node refilled prepares every new pod's claims at once, and
/// each misses the devices that came home a moment before the publisher's debounced rescan.
/// Rescans are therefore single-flight: a miss waits for a scan that *started after it* (its
/// device may have come home while an earlier scan ran) and shares it with every miss that came
/// while that one waited. At most one scan runs at a time, and a storm of N misses costs at
/// most two.
pub struct RescanOnMiss {
    inventory: SharedInventory,
    scan: Arc<dyn Fn() -> Result<Vec<Device>, InventoryError> + Send + Sync>,
    /// Scans started so far (numbered from 1).
    started: std::sync::atomic::AtomicU64,
    /// The number of the last scan that succeeded; held while a scan runs.
    done: tokio::sync::Mutex<u64>,
}

impl RescanOnMiss {
    /// `scan` is blocking (it runs on the blocking pool) and sees the host. Its devices replace
    /// those of the same name; entries it did not see (devices in pods, kept for the slices)
    /// stay.
    pub fn new(
        inventory: SharedInventory,
        scan: impl Fn() -> Result<Vec<Device>, InventoryError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            inventory,
            scan: Arc::new(scan),
            started: std::sync::atomic::AtomicU64::new(0),
            done: tokio::sync::Mutex::new(0),
        }
    }

    fn merge(&self, scanned: Vec<Device>) {
        let seen: std::collections::BTreeSet<&str> = scanned.iter().map(|d| d.name.as_str()).collect();
        let mut all: Vec<Shared<Device>> = self
            .inventory
            .current()
            .iter()
            .filter(|d| !seen.contains(d.name.as_str()))
            .cloned()
            .collect();
        all.extend(scanned.into_iter().map(Shared::new));
        all.sort_by(|a, b| a.name.cmp(&b.name));
        self.inventory.replace(Arc::new(all));
    }
}

impl DeviceLookup for RescanOnMiss {
    fn device(&self, name: &str) -> Option<Device> {
        self.inventory.get(name)
    }

    fn unavailable(&self, name: &str) -> Option<String> {
        self.inventory.squatted(name)
    }

    fn refresh<'a>(&'a self) -> BoxFuture<'a, ()> {
        use std::sync::atomic::Ordering;
        Box::pin(async move {
            // Scans numbered up to `before` may have started before this miss.
            let before = self.started.load(Ordering::SeqCst);
            let mut done = self.done.lock().await;
            if *done > before {
                return;
            }
            let number = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            let scan = self.scan.clone();
            match tokio::task::spawn_blocking(move || scan()).await {
                Ok(Ok(devices)) => {
                    self.merge(devices);
                    *done = number;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::telemetry::chain(&e), "rescan for a missing device failed")
                }
                Err(e) => tracing::warn!(error = %crate::telemetry::chain(&e), "rescan task failed"),
            }
        })
    }
}

/// Obtains a DHCPv4 lease on a host interface for `interface.dhcp: true` (upstream Prepare
/// step 7). The driver uses [`crate::dhcp::Client::host`]; tests may point it at a test netns.
pub trait LeaseSource: Send + Sync + 'static {
    fn lease<'a>(&'a self, ifname: &'a str) -> BoxFuture<'a, Result<Lease, DhcpError>>;
}

impl LeaseSource for crate::dhcp::Client {
    fn lease<'a>(&'a self, ifname: &'a str) -> BoxFuture<'a, Result<Lease, DhcpError>> {
        Box::pin(crate::dhcp::Client::lease(self, ifname))
    }
}

impl DeviceLookup for SharedInventory {
    fn device(&self, name: &str) -> Option<Device> {
        self.get(name)
    }

    fn unavailable(&self, name: &str) -> Option<String> {
        self.squatted(name)
    }
}

/// Why one claim could not be prepared (goes into the per-claim `error` field).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("ResourceClaim {namespace}/{name} has UID {found}, kubelet asked for {wanted}")]
    UidMismatch {
        namespace: String,
        name: String,
        found: String,
        wanted: String,
    },
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated { namespace: String, name: String },
    #[error("driver only supports one pod per claim, {count} consumers reserved")]
    TooManyConsumers { count: usize },
    #[error("claim consumer must be a core pod, got {api_group}/{resource}")]
    NotAPod { api_group: String, resource: String },
    #[error("device {device} (request {request}) is allocated from pool {pool}, not this node's pool {node}")]
    WrongPool {
        device: String,
        request: String,
        pool: String,
        node: String,
    },
    #[error("device {device} not found in the node inventory")]
    UnknownDevice { device: String },
    #[error(
        "device {device} not prepared: {why}; it is known by its kernel identity, not its name, and is prepared once the name is its own again"
    )]
    NameTaken { device: String, why: String },
    #[error("device {device} has no network interface and no RDMA device on the host")]
    NoInterface { device: String },
    #[error("invalid configuration for device {device} (request {request})")]
    Config {
        device: String,
        request: String,
        #[source]
        source: ConfigError,
    },
    #[error("device {device}: VF MTU {mtu} exceeds the PF MTU {pf_mtu}")]
    VfMtu { device: String, mtu: i32, pf_mtu: u32 },
    #[error("device {device}: failed to get configuration via DHCP for {ifname}")]
    Dhcp {
        device: String,
        ifname: String,
        #[source]
        source: Box<DhcpError>,
    },
    #[error("invalid configuration for device {device} (request {request}): {}", problems.join("; "))]
    Ethtool {
        device: String,
        request: String,
        /// `ethtool.features.<name>: why` / `ethtool.privateFlags.<name>: why`.
        problems: Vec<String>,
    },
    #[error("device {device}: reading the ethtool features of {ifname}")]
    EthtoolQuery {
        device: String,
        ifname: String,
        #[source]
        source: EthtoolError,
    },
    #[error("device {device}: unpinning the eBPF links of {ifname} (disableEbpfPrograms)")]
    Ebpf {
        device: String,
        ifname: String,
        #[source]
        source: BpfError,
    },
    #[error("storing the plan of pod {pod_uid}: {detail}")]
    Sink { pod_uid: String, detail: String },
    #[error("forgetting the plan of claim {claim_uid}: {detail}")]
    Forget { claim_uid: String, detail: String },
    #[error("device {device} (request {request}): failed to get profile config: {why}")]
    Profile {
        device: String,
        request: String,
        why: String,
    },
}

/// One prepared device, as the response lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDevice {
    pub request: String,
    pub pool: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// Prepares and unprepares claims for one driver on one node.
pub struct Preparer {
    driver: String,
    node: String,
    claims: Arc<dyn ClaimSource>,
    devices: Arc<dyn DeviceLookup>,
    leases: Arc<dyn LeaseSource>,
    sink: Arc<dyn PlanSink>,
    metrics: Option<super::DraMetrics>,
    reporter: crate::report::Reporter,
    providers: Arc<dyn Providers>,
}

impl Preparer {
    pub fn new(
        driver: impl Into<String>,
        node: impl Into<String>,
        claims: Arc<dyn ClaimSource>,
        devices: Arc<dyn DeviceLookup>,
        sink: Arc<dyn PlanSink>,
    ) -> Self {
        Self {
            driver: driver.into(),
            node: node.into(),
            claims,
            devices,
            leases: Arc::new(crate::dhcp::Client::host()),
            sink,
            metrics: None,
            reporter: crate::report::Reporter::disabled(),
            providers: Arc::new(NoProviders),
        }
    }

    /// Takes cloud device configs and resolves profiles with `providers` (default: none, so
    /// a claim with a `profile` fails).
    #[must_use]
    pub fn with_providers(mut self, providers: Arc<dyn Providers>) -> Self {
        self.providers = providers;
        self
    }

    /// Takes `interface.dhcp` leases from `leases` instead of the host netns.
    #[must_use]
    pub fn with_leases(mut self, leases: Arc<dyn LeaseSource>) -> Self {
        self.leases = leases;
        self
    }

    /// Reports failed prepares as `ClaimPrepareFailed` events on the claim.
    #[must_use]
    pub fn with_reporter(mut self, reporter: crate::report::Reporter) -> Self {
        self.reporter = reporter;
        self
    }

    #[must_use]
    pub fn reporter(&self) -> &crate::report::Reporter {
        &self.reporter
    }

    /// Records request counts and latency in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: super::DraMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    #[must_use]
    pub fn metrics(&self) -> Option<&super::DraMetrics> {
        self.metrics.as_ref()
    }

    #[must_use]
    pub fn driver(&self) -> &str {
        &self.driver
    }

    /// Prepares one claim; idempotent (a repeat replaces the claim's devices with the same).
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        let rc = self.claims.get(&claim.namespace, &claim.name).await?;
        let missing = rc.status.allocation.as_ref().is_some_and(|a| {
            a.devices
                .results
                .iter()
                .any(|r| r.driver == self.driver && self.devices.device(&r.device).is_none())
        });
        if missing {
            self.devices.refresh().await;
        }
        // A repeated Prepare of a claim already prepared keeps its DHCP leases (the device may
        // already be in the pod, where the host cannot ask for one again).
        let previous = self.sink.claim_devices(&claim.uid);
        let ctx = PlanContext {
            driver: &self.driver,
            node: &self.node,
            devices: self.devices.as_ref(),
            leases: self.leases.as_ref(),
            providers: self.providers.as_ref(),
        };
        let Some(planned) = plan_claim_in(&ctx, claim, &rc, &previous).await? else {
            return Ok(Vec::new());
        };
        let prepared = planned
            .plans
            .iter()
            .map(|p| PreparedDevice {
                request: p.request.clone(),
                pool: p.pool.clone(),
                device: p.device.clone(),
                share_id: planned.share_ids.get(&p.device).cloned().flatten(),
            })
            .collect();
        let taken = planned.plans.clone();
        let stored = self.sink.set_claim(ClaimPlan {
            pod_uid: planned.pod_uid.clone(),
            pod_namespace: claim.namespace.clone(),
            pod_name: planned.pod_name,
            claim_uid: claim.uid.clone(),
            devices: planned.plans,
        });
        if let Err(detail) = stored {
            // Nothing was stored: what the profiles took is given back.
            self.release_profiles(&claim.uid, &taken);
            return Err(PrepareError::Sink {
                pod_uid: planned.pod_uid,
                detail,
            });
        }
        // kubelet gets its answer once the plan is on disk (saved off the async workers).
        self.sink.durable().await.map_err(|detail| PrepareError::Sink {
            pod_uid: planned.pod_uid,
            detail,
        })?;
        Ok(prepared)
    }

    /// Unprepares one claim; unknown claims succeed (idempotent).
    pub fn unprepare(&self, claim_uid: &str) -> Result<(), PrepareError> {
        let released = self
            .sink
            .remove_claim(claim_uid)
            .map_err(|detail| PrepareError::Forget {
                claim_uid: claim_uid.to_owned(),
                detail,
            })?;
        self.release_profiles(claim_uid, &released);
        Ok(())
    }

    /// Unprepares the claims of one NodeUnprepareResources call as one change of the plan store
    /// ([`PlanSink::remove_claims`]); each claim's result, in order. Unknown claims succeed.
    pub fn unprepare_all(&self, claim_uids: &[String]) -> Vec<Result<(), PrepareError>> {
        let results = self.sink.remove_claims(claim_uids);
        claim_uids
            .iter()
            .zip(results)
            .map(|(uid, r)| {
                let released = r.map_err(|detail| PrepareError::Forget {
                    claim_uid: uid.clone(),
                    detail,
                })?;
                self.release_profiles(uid, &released);
                Ok(())
            })
            .collect()
    }
}

impl Preparer {
    /// Gives back, in the background, what the profiles of `plans` took (upstream releases at
    /// Unprepare and only logs a failure).
    fn release_profiles(&self, claim_uid: &str, plans: &[DevicePlan]) {
        let mut todo: Vec<(DeviceIds, NetworkConfig)> = plans
            .iter()
            .filter(|p| p.config.profile.as_deref().is_some_and(|s| !s.is_empty()))
            .map(|p| {
                let ids = match self.devices.device(&p.device) {
                    Some(d) => super::profiles::prepare_ids(&d),
                    None => DeviceIds {
                        name: p.device.clone(),
                        pci_address: p.pci_address.clone().unwrap_or_default(),
                        ..DeviceIds::default()
                    },
                };
                (ids, p.config.clone())
            })
            .collect();
        if todo.is_empty() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(claim = claim_uid, "no runtime: profiles not released");
            return;
        };
        let providers = self.providers.clone();
        let claim = claim_uid.to_owned();
        rt.spawn(async move {
            for (ids, cfg) in todo.drain(..) {
                match providers.release(&ids, &claim, &cfg).await {
                    Ok(()) => tracing::info!(claim = %claim, device = %ids.name, "profile released"),
                    Err(e) => tracing::warn!(claim = %claim, device = %ids.name, error = %crate::telemetry::chain(&e), "releasing the profile failed"),
                }
            }
        });
    }
}

/// What planning a claim needs besides the claim.
pub struct PlanContext<'a> {
    pub driver: &'a str,
    pub node: &'a str,
    pub devices: &'a dyn DeviceLookup,
    pub leases: &'a dyn LeaseSource,
    pub providers: &'a dyn Providers,
}

/// The plans of one claim and the pod they belong to.
pub struct PlannedClaim {
    pub pod_uid: String,
    pub pod_name: String,
    pub plans: Vec<DevicePlan>,
    share_ids: HashMap<String, Option<String>>,
}

/// Prepare without the plan store: pure but for the DHCP leases of `interface.dhcp: true`
/// devices, taken from `leases` — unless `previous` (the plans of an earlier Prepare of this
/// claim) already has the device prepared with DHCP: that config is kept as it was.
/// `Ok(None)` when the claim is reserved for nobody (no-op, as upstream).
pub async fn plan_claim(
    driver: &str,
    node: &str,
    claim: &ClaimRef,
    rc: &ResourceClaim,
    devices: &dyn DeviceLookup,
    leases: &dyn LeaseSource,
    previous: &[DevicePlan],
) -> Result<Option<PlannedClaim>, PrepareError> {
    let ctx = PlanContext {
        driver,
        node,
        devices,
        leases,
        providers: &NoProviders,
    };
    plan_claim_in(&ctx, claim, rc, previous).await
}

/// [`plan_claim`] with the providers of `ctx`: a profile taken for a device is given back if
/// the claim fails after it.
pub async fn plan_claim_in(
    ctx: &PlanContext<'_>,
    claim: &ClaimRef,
    rc: &ResourceClaim,
    previous: &[DevicePlan],
) -> Result<Option<PlannedClaim>, PrepareError> {
    let mut taken: Vec<(DeviceIds, NetworkConfig)> = Vec::new();
    let res = plan_devices(ctx, claim, rc, previous, &mut taken).await;
    if res.is_err() {
        for (ids, cfg) in &taken {
            if let Err(e) = ctx.providers.release(ids, &claim.uid, cfg).await {
                tracing::warn!(claim = %claim.uid, device = %ids.name, error = %crate::telemetry::chain(&e), "releasing the profile of a failed Prepare");
            }
        }
    }
    res
}

/// Phase 1: the claim is the one asked for, allocated, and reserved for exactly one pod (`None`:
/// reserved for nobody yet, nothing to plan).
fn allocation_for_a_pod<'r>(
    claim: &ClaimRef,
    rc: &'r ResourceClaim,
) -> Result<
    Option<(
        &'r super::claim::AllocationResult,
        &'r super::claim::ConsumerReference,
    )>,
    PrepareError,
> {
    if rc.metadata.uid != claim.uid {
        return Err(PrepareError::UidMismatch {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            found: rc.metadata.uid.clone(),
            wanted: claim.uid.clone(),
        });
    }
    let Some(alloc) = &rc.status.allocation else {
        return Err(PrepareError::NotAllocated {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        });
    };
    let consumer = match rc.status.reserved_for.as_slice() {
        [] => return Ok(None),
        [one] => one,
        more => return Err(PrepareError::TooManyConsumers { count: more.len() }),
    };
    if !consumer.api_group.is_empty() || consumer.resource != "pods" {
        return Err(PrepareError::NotAPod {
            api_group: consumer.api_group.clone(),
            resource: consumer.resource.clone(),
        });
    }
    Ok(Some((alloc, consumer)))
}

/// Phases 2 and 3: every result of this driver planned ([`plan_result`]), with its share id.
async fn plan_devices(
    ctx: &PlanContext<'_>,
    claim: &ClaimRef,
    rc: &ResourceClaim,
    previous: &[DevicePlan],
    taken: &mut Vec<(DeviceIds, NetworkConfig)>,
) -> Result<Option<PlannedClaim>, PrepareError> {
    let Some((alloc, consumer)) = allocation_for_a_pod(claim, rc)? else {
        return Ok(None);
    };
    let mut plans = Vec::new();
    let mut share_ids = HashMap::new();
    for r in alloc.devices.results.iter().filter(|r| r.driver == ctx.driver) {
        plans.push(plan_result(ctx, claim, r, &alloc.devices.config, previous, taken).await?);
        share_ids.insert(r.device.clone(), r.share_id.clone());
    }
    Ok(Some(PlannedClaim {
        pod_uid: consumer.uid.clone(),
        pod_name: consumer.name.clone(),
        plans,
        share_ids,
    }))
}

/// Phase 3: one allocated device: its pool, its config (profile resolved, validated), the
/// device, and for a netdev the VF MTU check, the DHCP lease, the host state, offloads and eBPF
/// unpinning. A repeated Prepare keeps what a profile or a lease gave the first time.
async fn plan_result(
    ctx: &PlanContext<'_>,
    claim: &ClaimRef,
    r: &super::claim::DeviceRequestAllocationResult,
    configs: &[DeviceAllocationConfiguration],
    previous: &[DevicePlan],
    taken: &mut Vec<(DeviceIds, NetworkConfig)>,
) -> Result<DevicePlan, PrepareError> {
    let (driver, node, devices, leases) = (ctx.driver, ctx.node, ctx.devices, ctx.leases);
    if r.pool != node {
        return Err(PrepareError::WrongPool {
            device: r.device.clone(),
            request: r.request.clone(),
            pool: r.pool.clone(),
            node: node.to_owned(),
        });
    }
    let config_err = |source| PrepareError::Config {
        device: r.device.clone(),
        request: r.request.clone(),
        source,
    };
    let cfg = device_config(driver, &r.request, configs).map_err(config_err)?;
    let dev = devices.device(&r.device).ok_or_else(|| {
        let device = r.device.clone();
        match devices.unavailable(&r.device) {
            Some(why) => PrepareError::NameTaken { device, why },
            None => PrepareError::UnknownDevice { device },
        }
    })?;
    // A repeated Prepare keeps what the profile gave (it is not taken twice).
    let profiled_before = previous.iter().find(|p| {
        p.device == r.device
            && p.request == r.request
            && cfg.profile.as_deref().is_some_and(|s| !s.is_empty())
            && p.config.profile == cfg.profile
    });
    if let Some(p) = profiled_before {
        return Ok(p.clone());
    }
    let (cfg, profiled) = super::profiles::resolve(ctx.providers, &dev, &claim.uid, cfg)
        .await
        .map_err(|e| match e {
            super::profiles::ResolveError::Config(source) => config_err(source),
            super::profiles::ResolveError::Profile(why) => PrepareError::Profile {
                device: r.device.clone(),
                request: r.request.clone(),
                why,
            },
        })?;
    if profiled {
        taken.push((super::profiles::prepare_ids(&dev), cfg.clone()));
    }
    let cfg = if dev.ifname.is_none() {
        if dev.rdma_device.is_none() {
            return Err(PrepareError::NoInterface {
                device: r.device.clone(),
            });
        }
        config::validate_rdma_only(&cfg).map_err(config_err)?;
        cfg
    } else {
        check_vf_mtu(&r.device, &cfg, &dev)?;
        let leased_before = previous.iter().find(|p| {
            cfg.interface.dhcp == Some(true)
                && p.device == r.device
                && p.request == r.request
                && p.host_ifname == dev.ifname
                && p.config.interface.dhcp == Some(true)
        });
        if let Some(p) = leased_before {
            return Ok(p.clone());
        }
        let lease = match (cfg.interface.dhcp, &dev.ifname) {
            (Some(true), Some(ifname)) => {
                Some(leases.lease(ifname).await.map_err(|source| PrepareError::Dhcp {
                    device: r.device.clone(),
                    ifname: ifname.clone(),
                    source: Box::new(source),
                })?)
            }
            _ => None,
        };
        let cfg = with_host_state(cfg, &dev, lease.as_ref());
        let cfg = with_offloads(&r.device, &r.request, cfg, dev.ifname.as_deref(), devices)?;
        unpin_ebpf(&r.device, &cfg, dev.ifname.as_deref(), devices).await?;
        cfg
    };
    Ok(DevicePlan {
        device: r.device.clone(),
        pool: r.pool.clone(),
        request: r.request.clone(),
        claim: claim.clone(),
        host_ifname: dev.ifname.clone(),
        pci_address: dev.pci_address.clone(),
        permanent_mac: dev.mac.clone(),
        rdma_device: dev.rdma_device.clone(),
        config: cfg,
        char_devices: dev.char_devices.clone(),
    })
}

/// Upstream step 6: an SR-IOV VF's MTU may not exceed its PF's.
fn check_vf_mtu(device: &str, cfg: &NetworkConfig, dev: &Device) -> Result<(), PrepareError> {
    if let (Some(mtu), Some(pf_mtu)) = (cfg.interface.mtu, dev.pf_mtu)
        && u32::try_from(mtu).is_ok_and(|m| m > pf_mtu)
    {
        return Err(PrepareError::VfMtu {
            device: device.to_owned(),
            mtu,
            pf_mtu,
        });
    }
    Ok(())
}

/// Netdev-specific prepare steps (upstream `prepareResourceClaim`): with a DHCP `lease`
/// (`interface.dhcp: true`; validation keeps static addresses out) its address is appended and
/// its option-121 routes appended unless the config already has one for the same
/// (destination, table); without one and without configured addresses the host's global
/// addresses move along. Host routes through the device are appended the same way; host rules
/// for those routes' tables (not with a VRF) and permanent neighbours are appended too.
fn with_host_state(mut cfg: NetworkConfig, dev: &Device, lease: Option<&Lease>) -> NetworkConfig {
    if let Some(lease) = lease {
        cfg.interface.addresses.push(lease.cidr());
        for r in lease.route_configs() {
            let dup = cfg
                .routes
                .iter()
                .any(|c| c.destination == r.destination && c.table == r.table);
            if !dup {
                cfg.routes.push(r);
            }
        }
    } else if cfg.interface.addresses.is_empty() {
        cfg.interface.addresses.clone_from(&dev.addresses);
    }
    for r in &dev.routes {
        // A preferred source the pod's device will not have (the config gave it other
        // addresses) makes the kernel refuse the route: such host routes do not apply.
        if !r.source.is_empty()
            && !cfg
                .interface
                .addresses
                .iter()
                .any(|a| a.split('/').next() == Some(r.source.as_str()))
        {
            continue;
        }
        let dup = cfg
            .routes
            .iter()
            .any(|c| c.destination == r.destination && c.table == r.table);
        if !dup {
            cfg.routes.push(r.clone());
        }
    }
    // Rules are not supported with a VRF (its table takes all the routes).
    if cfg.interface.vrf.is_none() {
        for r in &dev.rules {
            if !cfg.rules.contains(r) {
                cfg.rules.push(r.clone());
            }
        }
    }
    for n in &dev.neighbors {
        if !cfg.neighbors.iter().any(|c| c.destination == n.destination) {
            cfg.neighbors.push(n.clone());
        }
    }
    cfg
}

/// Checks the config's `ethtool` block against the host NIC (upstream does this at Prepare
/// too): every feature must be a kernel feature name of the device or an ethtool(8) alias, and
/// not a fixed one asked to change; every private flag must be one of the driver's. The
/// features are rewritten to the kernel names they stand for.
fn with_offloads(
    device: &str,
    request: &str,
    mut cfg: NetworkConfig,
    ifname: Option<&str>,
    devices: &dyn DeviceLookup,
) -> Result<NetworkConfig, PrepareError> {
    let (Some(eth), Some(ifname)) = (cfg.ethtool.as_mut(), ifname) else {
        return Ok(cfg);
    };
    if eth.features.is_empty() && eth.private_flags.is_empty() {
        return Ok(cfg);
    }
    let (features, flags) = devices
        .offloads(ifname)
        .map_err(|source| PrepareError::EthtoolQuery {
            device: device.to_owned(),
            ifname: ifname.to_owned(),
            source,
        })?;
    match crate::sys::link::resolve_offloads(&features, &flags, &eth.features, &eth.private_flags) {
        Ok((f, _)) => {
            eth.features = f;
            Ok(cfg)
        }
        Err(problems) => Err(PrepareError::Ethtool {
            device: device.to_owned(),
            request: request.to_owned(),
            problems: problems
                .into_iter()
                .map(|(field, why)| format!("ethtool.{field}: {why}"))
                .collect(),
        }),
    }
}

/// Upstream step 11, last (nothing else can fail the device after it): with
/// `disableEbpfPrograms: true`, the bpffs pins of the host device's links go now, the
/// programs themselves are detached inside the pod at attach time ([`crate::sys::bpf`]).
async fn unpin_ebpf(
    device: &str,
    cfg: &NetworkConfig,
    ifname: Option<&str>,
    devices: &dyn DeviceLookup,
) -> Result<(), PrepareError> {
    let (Some(true), Some(ifname)) = (cfg.interface.disable_ebpf_programs, ifname) else {
        return Ok(());
    };
    let unpinned = devices
        .unpin_ebpf(ifname)
        .await
        .map_err(|source| PrepareError::Ebpf {
            device: device.to_owned(),
            ifname: ifname.to_owned(),
            source,
        })?;
    if !unpinned.is_empty() {
        let list: Vec<String> = unpinned.iter().map(ToString::to_string).collect();
        tracing::info!(device, ifname, unpinned = ?list, "disableEbpfPrograms: bpf links unpinned");
    }
    Ok(())
}

/// Which opaque config applies to `request`: entries for this driver whose `requests` is empty
/// or names the request, class configs before claim configs; the most specific one (the last
/// in that order) wins. Upstream takes the first matching entry of the list; the API server
/// lists class entries first, so a claim that sets its own config gets it here, not the
/// class default.
pub fn device_config(
    driver: &str,
    request: &str,
    configs: &[DeviceAllocationConfiguration],
) -> Result<NetworkConfig, ConfigError> {
    let matching = |c: &&DeviceAllocationConfiguration| {
        c.opaque.as_ref().is_some_and(|o| o.driver == driver)
            && (c.requests.is_empty()
                || c.requests
                    .iter()
                    .any(|r| r == request || request.split('/').next() == Some(r.as_str())))
    };
    let chosen = configs
        .iter()
        .filter(|c| c.source == "FromClass")
        .chain(configs.iter().filter(|c| c.source != "FromClass"))
        .rfind(matching);
    let Some(opaque) = chosen.and_then(|c| c.opaque.as_ref()) else {
        return Ok(NetworkConfig::default());
    };
    if opaque.parameters.is_null() {
        return Ok(NetworkConfig::default());
    }
    let raw = opaque.parameters.to_string();
    config::parse_and_validate(raw.as_bytes())
}
