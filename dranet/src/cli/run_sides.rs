//! The kubelet (DRA + ResourceSlices) and runtime (NRI) sides of `dranet run`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures::future::BoxFuture;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::run::RunArgs;
use crate::dra::claim::{ClaimError, ClaimSource, ResourceClaim};
use crate::dra::{HealthHub, KubeClaimSource, KubeletPlugin, PluginConfig, Preparer};
use crate::inventory::{Device, ScanOptions, SharedInventory};
use crate::report::Reporter;
use crate::rescue::Engine;
use crate::slices::{LoopTiming, Publisher, RescanHandle, SliceController, link_events, publish_loop};

/// Readiness of the sides, for `/healthz`.
#[derive(Default)]
pub struct Readiness {
    pub dra_registered: AtomicBool,
    pub nri_connected: AtomicBool,
    pub dra_enabled: bool,
    pub nri_enabled: bool,
}

impl Readiness {
    pub fn check(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if self.dra_enabled && !self.dra_registered.load(Ordering::Relaxed) {
            missing.push("kubelet has not registered the DRA plugin");
        }
        if self.nri_enabled && !self.nri_connected.load(Ordering::Relaxed) {
            missing.push("not connected to the runtime's NRI socket");
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }
}

/// Running sides, stopped on shutdown.
pub struct Sides {
    pub readiness: Arc<Readiness>,
    plugin: Option<KubeletPlugin>,
    pub(super) nri_stop: Option<tokio::sync::watch::Sender<bool>>,
    pub(super) nri_task: Option<tokio::task::JoinHandle<()>>,
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    pub(super) slices_stop: Option<tokio::sync::watch::Sender<bool>>,
    /// Claim status and events (the API server, or files in embedded mode).
    pub(super) reporter: Reporter,
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
enum AnyPublisher {
    Dir(crate::slices::DirPublisher),
    Kube(crate::slices::KubePublisher),
}

impl Publisher for AnyPublisher {
    fn existing_generation<'a>(&'a self) -> BoxFuture<'a, Result<i64, crate::slices::SliceError>> {
        match self {
            Self::Dir(p) => p.existing_generation(),
            Self::Kube(p) => p.existing_generation(),
        }
    }

    fn owner<'a>(&'a self) -> BoxFuture<'a, Option<crate::slices::OwnerReference>> {
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

/// Device lookup for Prepare: a device missing from the last scan (it came home from a pod a
/// moment ago, or appeared since) triggers one immediate rescan instead of a failed claim.
struct RescanOnMiss {
    inventory: SharedInventory,
    opts: Arc<ScanOptions>,
}

impl crate::dra::DeviceLookup for RescanOnMiss {
    fn device(&self, name: &str) -> Option<Device> {
        if let Some(d) = self.inventory.get(name) {
            return Some(d);
        }
        let scanned = tokio::task::block_in_place(|| crate::inventory::scan(&self.opts));
        match scanned {
            Ok(devs) => {
                let found = devs.iter().find(|d| d.name == name).cloned();
                if found.is_some() {
                    let mut all = self.inventory.snapshot();
                    all.retain(|d| !devs.iter().any(|n| n.name == d.name));
                    all.extend(devs);
                    all.sort_by(|a, b| a.name.cmp(&b.name));
                    self.inventory.replace(all);
                }
                found
            }
            Err(e) => {
                warn!(error = %e, "inventory rescan");
                None
            }
        }
    }
}

/// `--claims-dir`: ResourceClaims read from `<dir>/<namespace>/<name>.json` (no API server: the
/// node simulator and the demo write them there, as the scheduler would have allocated them).
struct FileClaimSource {
    dir: PathBuf,
}

impl ClaimSource for FileClaimSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
            let not_found = || ClaimError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            if !safe(namespace) || !safe(name) {
                return Err(not_found());
            }
            let path = self.dir.join(namespace).join(format!("{name}.json"));
            let bytes = tokio::fs::read(&path).await.map_err(|_| not_found())?;
            serde_json::from_slice(&bytes).map_err(|source| ClaimError::Decode {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })
        })
    }
}

/// Starts inventory + slices, the kubelet plugin and the NRI plugin.
pub async fn start(args: &RunArgs, engine: &Engine, registry: &mut Registry) -> anyhow::Result<Sides> {
    let readiness = Arc::new(Readiness {
        dra_enabled: !args.no_dra,
        nri_enabled: !args.no_nri,
        ..Readiness::default()
    });
    let mut sides = Sides {
        readiness: readiness.clone(),
        plugin: None,
        nri_stop: None,
        nri_task: None,
        tasks: Vec::new(),
        slices_stop: None,
        reporter: Reporter::disabled(),
    };
    let inventory = SharedInventory::new(Vec::new());
    if !args.no_dra {
        // Embedded default: with no kubeconfig and no in-cluster environment, slices go to a
        // local directory and claims come from local files (runs and demos without a cluster).
        let (kube, slices_dir, claims_dir) = if args.slices_dir.is_some() && args.claims_dir.is_some() {
            (None, args.slices_dir.clone(), args.claims_dir.clone())
        } else {
            match kube_client(args).await {
                Ok(c) => (Some(c), args.slices_dir.clone(), args.claims_dir.clone()),
                Err(e) if args.kubeconfig.is_none() => {
                    let slices = args
                        .slices_dir
                        .clone()
                        .unwrap_or_else(|| args.state_dir.join("slices"));
                    let claims = args
                        .claims_dir
                        .clone()
                        .unwrap_or_else(|| args.state_dir.join("claims"));
                    warn!(error = %e, slices = %slices.display(), claims = %claims.display(),
                        "no cluster: embedded mode (ResourceSlices to files, ResourceClaims from files)");
                    (None, Some(slices), Some(claims))
                }
                Err(e) => return Err(e),
            }
        };
        let filter = crate::inventory::Filter::compile(&args.filter).context("--filter")?;
        let scan_opts = Arc::new(ScanOptions {
            sysfs: crate::inventory::Sysfs::new(&args.sysfs),
            filter,
            ..ScanOptions::default()
        });
        let health = HealthHub::with_options(
            args.node_name.clone(),
            crate::dra::health::HealthOptions {
                gone_grace: Duration::from_secs(args.health_gone_grace_seconds),
                ..crate::dra::health::HealthOptions::default()
            },
        );
        let devices = scan(&scan_opts, engine, &BTreeMap::new(), &health).await?;
        info!(devices = devices.len(), "inventory");
        inventory.replace(devices.clone());
        let publisher = match (&slices_dir, &kube) {
            (Some(dir), _) => AnyPublisher::Dir(crate::slices::DirPublisher::new(
                dir,
                &args.driver_name,
                &args.node_name,
            )),
            (None, Some(client)) => AnyPublisher::Kube(crate::slices::KubePublisher::new(
                client.clone(),
                &args.driver_name,
                &args.node_name,
            )),
            (None, None) => anyhow::bail!("no place to publish ResourceSlices"),
        };
        let slice_metrics = crate::slices::SliceMetrics::default();
        slice_metrics.register(registry);
        let mut slices = SliceController::new(publisher, args.driver_name.clone(), args.node_name.clone())
            .with_metrics(slice_metrics);
        slices
            .update(&devices)
            .await
            .context("publishing ResourceSlices")?;
        // Rescans are driven by link events (debounced by the loop's minimum interval), by the
        // engine bringing devices home, and by kubelet (re)registering us (forced re-publish: a
        // restarted kubelet may have wiped the node's slices); a slow periodic rescan backs them.
        let rescan = RescanHandle::new();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        sides.slices_stop = Some(stop_tx);
        let last = Arc::new(std::sync::Mutex::new(
            devices
                .into_iter()
                .map(|d| (d.name.clone(), d))
                .collect::<BTreeMap<String, Device>>(),
        ));
        let (eng, opts, hub) = (engine.clone(), scan_opts.clone(), health.clone());
        let scan_fn = move || {
            let devs = crate::inventory::scan(&opts)?;
            hub.observe_scan(devs.iter().map(|d| d.name.as_str()), &eng.checkpoint());
            let mut last = last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let devs = keep_devices_in_pods(devs, &eng, &last);
            *last = devs.iter().map(|d| (d.name.clone(), d.clone())).collect();
            Ok(devs)
        };
        sides.tasks.push(tokio::spawn(publish_loop(
            scan_fn,
            inventory.clone(),
            slices,
            rescan.clone(),
            LoopTiming {
                min_interval: Duration::from_millis(500),
                ..LoopTiming::default()
            },
            stop_rx.clone(),
        )));
        let (r, stop) = (rescan.clone(), stop_rx.clone());
        sides.tasks.push(tokio::spawn(async move {
            if let Err(e) = link_events(r, stop).await {
                warn!(error = %e, "no link events: inventory relies on periodic rescans");
            }
        }));
        let r = rescan.clone();
        sides.tasks.push(tokio::spawn(crate::dra::health::follow_engine(
            health.clone(),
            engine.clone(),
            move || r.request_rescan(),
        )));
        let republish = rescan.clone();
        // Reports go where the claims come from: next to the claim files, or the API server.
        let (claims, sink): (Arc<dyn ClaimSource>, Arc<dyn crate::report::Sink>) = match (&claims_dir, kube) {
            (Some(dir), _) => (
                Arc::new(FileClaimSource { dir: dir.clone() }),
                Arc::new(crate::report::FileSink::new(dir.join("status"))),
            ),
            (None, Some(client)) => (
                Arc::new(KubeClaimSource::new(client.clone())),
                Arc::new(crate::report::KubeSink::new(client, args.driver_name.clone())),
            ),
            (None, None) => anyhow::bail!("no source of ResourceClaims"),
        };
        sides.reporter = Reporter::new(sink, args.driver_name.clone(), args.node_name.clone());
        sides.tasks.push(tokio::spawn(crate::report::rescue_events(
            sides.reporter.clone(),
            engine.activity(),
        )));
        let preparer = Arc::new(
            Preparer::new(
                args.driver_name.clone(),
                args.node_name.clone(),
                claims,
                Arc::new(RescanOnMiss {
                    inventory: inventory.clone(),
                    opts: scan_opts.clone(),
                }),
                Arc::new(engine.clone()),
            )
            .with_reporter(sides.reporter.clone()),
        );
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
        let r = readiness.clone();
        sides.tasks.push(tokio::spawn(async move {
            loop {
                let registered = status.borrow().as_ref().is_some_and(|s| s.plugin_registered);
                r.dra_registered.store(registered, Ordering::Relaxed);
                if status.changed().await.is_err() {
                    break;
                }
            }
        }));
        sides.plugin = Some(plugin);
    }
    super::run_nri::start(args, engine, registry, &mut sides).await?;
    Ok(sides)
}

async fn kube_client(args: &RunArgs) -> anyhow::Result<kube::Client> {
    let cfg = match &args.kubeconfig {
        Some(p) => {
            let kc =
                kube::config::Kubeconfig::read_from(p).with_context(|| format!("reading {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(kube::Client::try_from(cfg)?)
}

/// Devices that are in a pod right now (gone from the host netns) keep their last published
/// entry, so a running pod's device does not vanish from the pool.
fn keep_devices_in_pods(
    mut devs: Vec<Device>,
    engine: &Engine,
    last: &BTreeMap<String, Device>,
) -> Vec<Device> {
    let cp = engine.checkpoint();
    for rec in cp.pods.values().filter(|p| p.has_devices_out()) {
        for d in &rec.devices {
            if !devs.iter().any(|x| x.name == d.device)
                && let Some(prev) = last.get(&d.device)
            {
                devs.push(prev.clone());
            }
        }
    }
    devs.sort_by(|a, b| a.name.cmp(&b.name));
    devs
}

/// The first scan, before the loop runs.
async fn scan(
    opts: &Arc<ScanOptions>,
    engine: &Engine,
    last: &BTreeMap<String, Device>,
    health: &HealthHub,
) -> anyhow::Result<Vec<Device>> {
    let o = opts.clone();
    let devs = tokio::task::spawn_blocking(move || crate::inventory::scan(&o)).await??;
    health.observe_scan(devs.iter().map(|d| d.name.as_str()), &engine.checkpoint());
    Ok(keep_devices_in_pods(devs, engine, last))
}
