// Over 500 lines: the start-up wiring of both sides of `dranet run` in start-up order (runtime first, then kubelet), each phase a function.
//! The kubelet (DRA + ResourceSlices) and runtime (NRI) sides of `dranet run`.
//!
//! The runtime side comes first and needs nothing from the cluster. The kubelet side never
//! waits for the API server either: the DRA plugin serves kubelet at once (a claim read that
//! fails is that claim's error, retried within its deadline), the ResourceSlices are published
//! in the background and retried with backoff, and `/readyz` says what is missing.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::run::RunArgs;
use super::run_api::{ApiMode, LateSink, api_mode, kube_client_retrying};
use crate::dra::claim::ClaimSource;
use crate::dra::health::Located;
use crate::dra::{HealthHub, KubeClaimSource, KubeletPlugin, PluginConfig, Preparer};
use crate::inventory::{Device, DeviceList, ScanOptions, SharedInventory};
use crate::ready::Readiness;
use crate::report::Reporter;
use crate::rescue::Engine;
use crate::shared::Shared;
use crate::slices::{Publisher, RescanHandle, SliceController, link_events, publish_loop};

/// Running sides, stopped on shutdown.
pub struct Sides {
    pub readiness: Readiness,
    plugin: Option<KubeletPlugin>,
    pub(super) nri_stop: Option<tokio::sync::watch::Sender<bool>>,
    pub(super) nri_task: Option<tokio::task::JoinHandle<()>>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(super) slices_stop: Option<tokio::sync::watch::Sender<bool>>,
    /// Claim status and events (the API server, or files in embedded mode).
    pub(super) reporter: Reporter,
    /// The node's allocations for adoption, set once the kubelet side is up.
    pub(super) allocations: crate::adoption::AllocationsCell,
    /// The engine's activity since before the start-up reconcile, for the rescue-event
    /// reporter and device health (taken when they start; dropped without a kubelet side).
    startup_activity: Option<StartupActivity>,
}

type ActivityRx = tokio::sync::broadcast::Receiver<crate::rescue::activity::Activity>;

/// The engine's activity feed, subscribed before the start-up reconcile, so that what it finds
/// (a device vanished while dranet was down, a return that keeps failing) reaches the
/// rescue-event reporter (the pod's event, the claim's status) and device health (kubelet's
/// health stream) once they start, instead of going to no subscriber.
pub struct StartupActivity {
    reporter: ActivityRx,
    health: ActivityRx,
}

impl StartupActivity {
    /// Subscribes both; call before [`Engine::reconcile`].
    #[must_use]
    pub fn subscribe(engine: &Engine) -> Self {
        Self {
            reporter: engine.activity(),
            health: engine.activity(),
        }
    }
}

impl Sides {
    pub async fn stop(self) {
        if let Some(tx) = self.slices_stop {
            let _ = tx.send(true);
        }
        if let Some(tx) = self.nri_stop {
            let _ = tx.send(true);
        }
        if let Some(t) = self.nri_task {
            // Hooks in flight finish; the plugin returns when the connection is closed.
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        if let Some(p) = self.plugin {
            p.stop().await;
        }
        for t in self.tasks {
            t.abort();
        }
    }
}

/// Where slices go: the API server, or a directory (`--slices-dir`).
#[derive(Clone)]
enum AnyPublisher {
    Dir(crate::slices::DirPublisher),
    Kube(crate::slices::KubePublisher),
}

impl AnyPublisher {
    fn existing_slices<'a>(
        &'a self,
    ) -> BoxFuture<'a, Result<Vec<serde_json::Value>, crate::slices::SliceError>> {
        match self {
            Self::Dir(p) => p.existing_slices(),
            Self::Kube(p) => p.existing_slices(),
        }
    }
}

impl Publisher for AnyPublisher {
    fn existing_generation<'a>(&'a self) -> BoxFuture<'a, Result<i64, crate::slices::SliceError>> {
        match self {
            Self::Dir(p) => p.existing_generation(),
            Self::Kube(p) => p.existing_generation(),
        }
    }

    fn owner<'a>(
        &'a self,
    ) -> BoxFuture<'a, Result<Option<crate::slices::OwnerReference>, crate::slices::SliceError>> {
        match self {
            Self::Dir(p) => p.owner(),
            Self::Kube(p) => p.owner(),
        }
    }

    fn publish<'a>(
        &'a self,
        slices: &'a [crate::slices::ResourceSlice],
    ) -> BoxFuture<'a, Result<(), crate::slices::SliceError>> {
        match self {
            Self::Dir(p) => p.publish(slices),
            Self::Kube(p) => p.publish(slices),
        }
    }
}

/// The runtime side running, the kubelet side's pieces ready to start.
pub struct RuntimeSide {
    sides: Sides,
    late: Arc<LateSink>,
    slice_metrics: crate::slices::SliceMetrics,
    dra_metrics: crate::dra::DraMetrics,
}

/// Registers every metric and starts the runtime (NRI) side: nothing here touches the API
/// server.
pub async fn start_runtime(
    args: &RunArgs,
    engine: &Engine,
    registry: &mut Registry,
    readiness: &Readiness,
    startup_activity: StartupActivity,
) -> anyhow::Result<RuntimeSide> {
    let late = Arc::new(LateSink::default());
    let reporter = if args.no_dra {
        Reporter::disabled()
    } else {
        Reporter::new(late.clone(), args.driver_name.clone(), args.node_name.clone())
    };
    let mut sides = Sides {
        readiness: readiness.clone(),
        plugin: None,
        nri_stop: None,
        nri_task: None,
        tasks: Vec::new(),
        slices_stop: None,
        reporter,
        allocations: crate::adoption::AllocationsCell::default(),
        startup_activity: (!args.no_dra).then_some(startup_activity),
    };
    let slice_metrics = crate::slices::SliceMetrics::default();
    let dra_metrics = crate::dra::DraMetrics::default();
    if !args.no_dra {
        slice_metrics.register(registry);
        dra_metrics.register(registry);
    }
    super::run_nri::start(args, engine, registry, &mut sides).await?;
    Ok(RuntimeSide {
        sides,
        late,
        slice_metrics,
        dra_metrics,
    })
}

/// Starts the kubelet side (inventory, slices, DRA plugin). In kube mode nothing here waits for
/// the API server; only a client that cannot be built from its configuration (an unreadable
/// kubeconfig or service-account token) holds it back, retried with backoff, while the runtime
/// side already protects the devices.
pub async fn start_kubelet(args: &RunArgs, engine: &Engine, runtime: RuntimeSide) -> anyhow::Result<Sides> {
    let RuntimeSide {
        mut sides,
        late,
        slice_metrics,
        dra_metrics,
    } = runtime;
    if args.no_dra {
        return Ok(sides);
    }
    let readiness = sides.readiness.clone();
    readiness.expect(
        crate::ready::KUBELET,
        "kubelet has not registered the DRA plugin yet",
    );
    let mode = api_mode(args);
    let kube = match &mode {
        ApiMode::Embedded { .. } => None,
        ApiMode::Kube => Some(kube_client_retrying(args, &readiness).await),
    };
    start_kubelet_side(
        args,
        engine,
        &mut sides,
        mode,
        kube,
        late,
        (slice_metrics, dra_metrics),
    )
    .await?;
    Ok(sides)
}

/// The kubelet side in start-up order: the first inventory scan (Prepare needs it), the API
/// endpoints, the inventory's tasks (publish loop, link events, health, cloud), then the DRA
/// plugin.
async fn start_kubelet_side(
    args: &RunArgs,
    engine: &Engine,
    sides: &mut Sides,
    mode: ApiMode,
    kube: Option<kube::Client>,
    late: Arc<LateSink>,
    (slice_metrics, dra_metrics): (crate::slices::SliceMetrics, crate::dra::DraMetrics),
) -> anyhow::Result<()> {
    let readiness = sides.readiness.clone();
    let inventory = SharedInventory::new(Vec::new());
    // Cloud attributes and profiles: found in the background (see `start_inventory_tasks`).
    let providers = crate::cloud::NodeProviders::default();
    let scan_opts = scan_options(args, &providers)?;
    let health = HealthHub::with_options(
        args.node_name.clone(),
        crate::dra::health::HealthOptions {
            gone_grace: Duration::from_secs(args.health_gone_grace_seconds),
            ..crate::dra::health::HealthOptions::default()
        },
    );
    // Devices in pods keep their last published attributes, across restarts too.
    let held = Arc::new(std::sync::Mutex::new(crate::inventory::HeldAttributes::load(
        engine.state_dir(),
    )));
    // The first scan fills the inventory for Prepare; publishing is the loop's job (its first
    // round scans and publishes at once, then retries with backoff until the API server takes
    // the slices).
    let devices = match scan(&scan_opts, engine, &held, &health).await {
        Ok(d) => d,
        Err(e) => {
            warn!(error = %crate::telemetry::chain(e.as_ref()), "first inventory scan failed; the publish loop scans again");
            Vec::new()
        }
    };
    info!(devices = devices.len(), "inventory");
    let devices: DeviceList = Arc::new(devices);
    inventory.replace(devices.clone());
    let in_cluster = matches!(mode, ApiMode::Kube);
    let (publisher, claims, sink) = api_endpoints(args, &mode, kube, &readiness)?;
    late.set(sink);
    let adoption = adoption_input(args, sides, publisher.clone(), claims.clone());
    let slices = SliceController::new(publisher, args.driver_name.clone(), args.node_name.clone())
        .with_metrics(slice_metrics)
        .with_readiness(readiness);
    let rescan = start_inventory_tasks(
        args,
        engine,
        sides,
        InventoryParts {
            inventory: inventory.clone(),
            scan_opts: scan_opts.clone(),
            held,
            health: health.clone(),
            providers: providers.clone(),
            devices,
            slices,
            adoption,
            in_cluster,
        },
    );
    let preparer = Preparer::new(
        args.driver_name.clone(),
        args.node_name.clone(),
        claims,
        // A device missing from the last scan (it came home from a pod a moment ago, or
        // appeared since) triggers a rescan on the blocking pool, shared by concurrent misses.
        // Links that hold a held device's name but not its identity are not that device.
        Arc::new(crate::dra::RescanOnMiss::new(inventory, {
            let engine = engine.clone();
            move || {
                let mut devs = crate::inventory::scan(&scan_opts)?;
                engine
                    .with_checkpoint(crate::inventory::Held::from_checkpoint)
                    .drop_impostors(&mut devs);
                Ok(devs)
            }
        })),
        Arc::new(engine.clone()),
    )
    .with_reporter(sides.reporter.clone())
    .with_providers(Arc::new(providers))
    .with_metrics(dra_metrics);
    start_plugin(args, sides, Arc::new(preparer), health, rescan).await
}

/// What the inventory scans with: the device filter, sysfs, the cloud's attributes, upstream's
/// gates.
fn scan_options(args: &RunArgs, providers: &crate::cloud::NodeProviders) -> anyhow::Result<Arc<ScanOptions>> {
    let filter = crate::inventory::Filter::compile(&args.filter).context("--filter")?;
    let pci_ids = crate::inventory::PciIds::load_default();
    if pci_ids.source() == &crate::inventory::PciIdsSource::None {
        tracing::warn!(
            searched = ?crate::inventory::PCI_IDS_PATHS,
            "no pci.ids database: dra.net/pciVendor and dra.net/pciDevice are published as \"unknown\"; \
             install pci.ids (the image has it), set PCIDB_PATH, or build with --features bundled-pci-ids"
        );
    } else {
        tracing::info!(source = %pci_ids.source(), "PCI names from this pci.ids");
    }
    Ok(Arc::new(ScanOptions {
        pci_ids,
        extra: Some(Arc::new(providers.cloud.clone())),
        sysfs: crate::inventory::Sysfs::new(&args.sysfs),
        filter,
        move_ib_interfaces: args.upstream.move_ib_interfaces(),
        numa_list: args.upstream.gate("DRAListTypeAttributes"),
        netns: crate::inventory::NetnsTarget::Current,
        keep_uplinks: false,
    }))
}

/// Where slices go, claims come from and events are reported.
type Endpoints = (AnyPublisher, Arc<dyn ClaimSource>, Arc<dyn crate::report::Sink>);

/// The [`Endpoints`]: the API server, or directories (embedded mode).
fn api_endpoints(
    args: &RunArgs,
    mode: &ApiMode,
    kube: Option<kube::Client>,
    readiness: &Readiness,
) -> anyhow::Result<Endpoints> {
    Ok(match (mode, kube) {
        (ApiMode::Embedded { slices, claims }, _) => (
            AnyPublisher::Dir(crate::slices::DirPublisher::new(
                slices,
                &args.driver_name,
                &args.node_name,
            )),
            Arc::new(crate::dra::FileClaimSource::new(claims.clone())),
            Arc::new(crate::report::FileSink::new(claims.join("status"))),
        ),
        (ApiMode::Kube, Some(client)) => (
            AnyPublisher::Kube(crate::slices::KubePublisher::new(
                client.clone(),
                &args.driver_name,
                &args.node_name,
            )),
            Arc::new(KubeClaimSource::new(client.clone()).with_readiness(readiness.clone())),
            Arc::new(crate::report::KubeSink::new(client, args.driver_name.clone())),
        ),
        (ApiMode::Kube, None) => anyhow::bail!("kube mode without an API client"),
    })
}

/// What the inventory's tasks share.
struct InventoryParts<A> {
    inventory: SharedInventory,
    scan_opts: Arc<ScanOptions>,
    held: Arc<std::sync::Mutex<crate::inventory::HeldAttributes>>,
    health: HealthHub,
    providers: crate::cloud::NodeProviders,
    /// The first scan's devices.
    devices: DeviceList,
    slices: SliceController<AnyPublisher>,
    /// Runs before the first publish.
    adoption: A,
    /// A cluster (kubeconfig or in-cluster config), not embedded mode: only then is the cloud
    /// detected.
    in_cluster: bool,
}

/// Starts the publish loop (after adoption's input), the link-event listener, health following
/// the engine, the cloud providers and the rescue-event reporter. Rescans are driven by link
/// events (debounced by the loop's minimum interval), by the engine bringing devices home, and by
/// kubelet (re)registering us (forced re-publish: a restarted kubelet may have wiped the node's
/// slices); a slow periodic rescan backs them. Returns the loop's handle.
fn start_inventory_tasks<A>(
    args: &RunArgs,
    engine: &Engine,
    sides: &mut Sides,
    parts: InventoryParts<A>,
) -> RescanHandle
where
    A: std::future::Future<Output = ()> + Send + 'static,
{
    let InventoryParts {
        inventory,
        scan_opts,
        held,
        health,
        providers,
        devices,
        slices,
        adoption,
        in_cluster,
    } = parts;
    let rescan = RescanHandle::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    sides.slices_stop = Some(stop_tx);
    let last = Arc::new(std::sync::Mutex::new(devices));
    let (eng, opts, hub) = (engine.clone(), scan_opts, health.clone());
    let scan_fn = move || {
        let devs = crate::inventory::scan(&opts)?;
        let located = eng.with_checkpoint(|cp| Located::of(cp, None));
        hub.observe_scan_located(devs.iter().map(|d| d.name.as_str()), located);
        let mut last = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let devs = keep_devices_in_pods(devs, &eng, &held, &last);
        // An unchanged scan is the last list itself: nothing of it is allocated again.
        if *devs != **last {
            *last = Arc::new(devs);
        }
        let devs: DeviceList = last.clone();
        Ok(devs)
    };
    let publishing = publish_loop(
        scan_fn,
        inventory,
        slices,
        rescan.clone(),
        args.upstream.loop_timing(),
        stop_rx.clone(),
    );
    sides.tasks.push(tokio::spawn(async move {
        adoption.await;
        publishing.await;
    }));
    let (r, stop) = (rescan.clone(), stop_rx);
    sides.tasks.push(tokio::spawn(async move {
        if let Err(e) = link_events(r, stop).await {
            warn!(error = %crate::telemetry::chain(&e), "no link events: inventory relies on periodic rescans");
        }
    }));
    let (activity_reporter, activity_health) = match sides.startup_activity.take() {
        Some(a) => (a.reporter, a.health),
        None => (engine.activity(), engine.activity()),
    };
    let r = rescan.clone();
    sides
        .tasks
        .push(tokio::spawn(crate::dra::health::follow_engine_from(
            health,
            engine.clone(),
            activity_health,
            move || r.request_rescan(),
        )));
    // The cloud's metadata is read off the start path; its attributes join at the next scan.
    let r = rescan.clone();
    let mut cloud = args
        .upstream
        .cloud_options(&args.sysfs, args.cloud_metadata_endpoint.clone());
    if !in_cluster && cloud.hint == crate::cloud::Hint::Detect {
        // A node without a cluster has no cloud to find, and nothing may leave the machine
        // unless a cluster (or an operator) says so: embedded mode detects no cloud.
        info!("embedded mode: no cloud detection (pass --cloud-provider-hint to read a cloud's metadata)");
        cloud.hint = crate::cloud::Hint::None;
    }
    sides.tasks.push(tokio::spawn(crate::cloud::run_providers(
        cloud,
        args.upstream.profile_choice(),
        providers,
        move || r.request_rescan(),
    )));
    let (plans, confirms) = (engine.clone(), engine.clone());
    sides
        .tasks
        .push(tokio::spawn(crate::report::rescue_events_confirmed(
            sides.reporter.clone(),
            activity_reporter,
            move |uid| plans.plan(uid),
            move |a: &crate::rescue::activity::Activity| {
                let (e, uid) = (confirms.clone(), a.pod_uid.clone());
                let what = match &a.kind {
                    crate::rescue::activity::ActivityKind::Vanished { device, record, .. } => {
                        Some((record.clone(), device.clone()))
                    }
                    _ => None,
                };
                async move {
                    if let Some((record, device)) = what {
                        e.vanish_reported(&uid, &record, &device).await;
                    }
                }
            },
        )));
    rescan
}

/// Serves the DRA plugin to kubelet; kubelet (re)registering forces a re-publish of the slices
/// and sets the KUBELET readiness condition.
async fn start_plugin(
    args: &RunArgs,
    sides: &mut Sides,
    preparer: Arc<Preparer>,
    health: HealthHub,
    republish: RescanHandle,
) -> anyhow::Result<()> {
    let readiness = sides.readiness.clone();
    let cfg = PluginConfig {
        kubelet_root: args.kubelet_root_dir.clone(),
        driver: args.driver_name.clone(),
    };
    let plugin = KubeletPlugin::start_with_health(&cfg, preparer, health).await?;
    info!(registration = %cfg.registration_socket().display(), dra = %cfg.dra_socket().display(), "kubelet plugin serving");
    sides
        .tasks
        .push(plugin.on_registered(move || republish.request_republish()));
    let mut status = plugin.registration();
    sides.tasks.push(tokio::spawn(async move {
        loop {
            let registered = status.borrow().as_ref().is_some_and(|s| s.plugin_registered);
            if registered {
                readiness.set_met(crate::ready::KUBELET);
            } else {
                readiness.set_unmet(crate::ready::KUBELET, "kubelet has not registered the DRA plugin");
            }
            if status.changed().await.is_err() {
                break;
            }
        }
    }));
    sides.plugin = Some(plugin);
    Ok(())
}

/// Reads what this node published before this start (bounded), then gives adoption the node's
/// allocations: claims from `claims`, device identities from those slices. Runs before the
/// publish loop's first publish, which replaces them, and never holds up kubelet's side.
fn adoption_input(
    args: &RunArgs,
    sides: &Sides,
    publisher: AnyPublisher,
    claims: Arc<dyn ClaimSource>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (driver, node) = (args.driver_name.clone(), args.node_name.clone());
    let cell = sides.allocations.clone();
    async move {
        let published = crate::slices::PublishedDevices::read(
            publisher.existing_slices(),
            &driver,
            &node,
            crate::slices::PUBLISHED_READ_TIMEOUT,
        )
        .await;
        cell.set(crate::adoption::NodeAllocations::new(
            claims, driver, node, published,
        ));
    }
}

/// Devices that are in a pod right now (gone from the host netns) keep their last published
/// attributes, so a running pod's device does not vanish from the pool or lose attributes
/// (see [`crate::inventory::HeldAttributes`]).
fn keep_devices_in_pods(
    devs: Vec<Device>,
    engine: &Engine,
    held: &std::sync::Mutex<crate::inventory::HeldAttributes>,
    last: &[Shared<Device>],
) -> Vec<Shared<Device>> {
    let which = engine.with_checkpoint(crate::inventory::Held::from_checkpoint);
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .apply(devs, &which, last)
}

/// The first scan, before the loop runs.
async fn scan(
    opts: &Arc<ScanOptions>,
    engine: &Engine,
    held: &std::sync::Mutex<crate::inventory::HeldAttributes>,
    health: &HealthHub,
) -> anyhow::Result<Vec<Shared<Device>>> {
    let o = opts.clone();
    let devs = tokio::task::spawn_blocking(move || crate::inventory::scan(&o)).await??;
    let located = engine.with_checkpoint(|cp| Located::of(cp, None));
    health.observe_scan_located(devs.iter().map(|d| d.name.as_str()), located);
    Ok(keep_devices_in_pods(devs, engine, held, &[]))
}
