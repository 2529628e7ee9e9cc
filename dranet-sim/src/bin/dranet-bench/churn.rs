//! Many pods on one connection: `pods` pods (1 veth device each) started, then stopped, through
//! the daemon's one NRI connection with 8 hooks in flight (RunPodSandbox; then StopPodSandbox,
//! the netns removed, RemovePodSandbox: containerd order); claims prepared before and
//! unprepared after the timed part. Baseline: the same attaches and detaches by direct
//! rtnetlink, 8 at a time, each pod's netns removed and let go after its detach. Also the
//! daemon's RSS after all pods are gone against before (after a warm-up of 8 pods, so first-use
//! allocations are not counted as growth), both read with the daemon idle: its burst threads
//! gone and the watcher's grace for dead netns paths over.
use std::fs::File;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dranet_sim::kernel::{PodNetns, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::node::{Node, NodeOptions, sandbox};
use futures::StreamExt;
use rtnetlink::Handle;
use serde_json::json;

use crate::baseline::{self, Dev};
use crate::fleet::{Fleet, check_home};
use crate::latency::{HOST_MTU, POD_MTU};

const IN_FLIGHT: usize = 8;

#[derive(Default)]
pub struct Figures {
    /// Pods started and stopped per second.
    pub rate: Vec<f64>,
    pub base_rate: Vec<f64>,
    /// Daemon VmRSS (KiB) before and after each round.
    pub rss_before: Vec<u64>,
    pub rss_after: Vec<u64>,
    pub slowest_hook_ms: f64,
    pub hook_errors: Vec<String>,
}

struct Pod {
    uid: String,
    ns: PodNetns,
    claim: Claim,
    dev: Dev,
}

pub struct Ctx {
    node: Node,
    host: Handle,
    host_ns: File,
    fleet: Fleet,
}

impl Ctx {
    pub async fn start(pods: usize) -> Result<Self> {
        let fleet = Fleet::create(pods)?;
        let node = Node::start(NodeOptions::default()).await?;
        Ok(Self {
            node,
            host: baseline::host_handle()?,
            host_ns: File::open("/proc/self/ns/net")?,
            fleet,
        })
    }

    async fn pods(&self, devs: &[Dev]) -> Result<Vec<Pod>> {
        let mut pods = Vec::new();
        for d in devs {
            let uid = unique("churn-");
            let claim = Claim::new("default", &format!("claim-{uid}"), &format!("cuid-{uid}"));
            self.node.write_claim(
                &claim,
                &uid,
                &[(
                    dranet::inventory::netdev_device_name(&d.host),
                    json!({"interface": {"name": "net0", "mtu": POD_MTU}}),
                )],
            )?;
            pods.push(Pod {
                ns: PodNetns::create(&unique("drbench-u-"))?,
                uid,
                claim,
                dev: d.clone(),
            });
        }
        let plugin = self.node.plugin.as_ref().context("daemon not registered")?;
        let claims: Vec<Claim> = pods.iter().map(|p| p.claim.clone()).collect();
        plugin.prepare_all(&claims, 16).await?;
        Ok(pods)
    }

    /// Starts then stops `devs.len()` pods; returns pods per second.
    async fn dranet_round(&self, devs: &[Dev], f: &mut Figures) -> Result<f64> {
        let pods = self.pods(devs).await?;
        let rt = &self.node.runtime;
        let t = Instant::now();
        let started: Vec<(Duration, Result<(), String>)> = futures::stream::iter(pods.iter())
            .map(|p| async move {
                let t = Instant::now();
                let r = rt.run_pod_sandbox(&sandbox(&p.uid, &p.ns.path)).await;
                (t.elapsed(), r.map_err(|e| crate::drain::chain(&e)))
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let start_phase = t.elapsed();
        let stopped: Vec<Vec<(Duration, Result<(), String>)>> = futures::stream::iter(pods.iter())
            .map(|p| async move {
                let sb = sandbox(&p.uid, &p.ns.path);
                let t = Instant::now();
                let stop = rt.stop_pod_sandbox(&sb).await;
                let stop = (t.elapsed(), stop.map_err(|e| crate::drain::chain(&e)));
                let path = p.ns.path.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
                    let _ = std::fs::remove_file(&path);
                })
                .await;
                let t = Instant::now();
                let rm = rt.remove_pod_sandbox(&sb).await;
                vec![stop, (t.elapsed(), rm.map_err(|e| crate::drain::chain(&e)))]
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let took = t.elapsed();
        eprintln!(
            "  dranet: {} pods started in {start_phase:.2?}, stopped in {:.2?}",
            pods.len(),
            took.saturating_sub(start_phase)
        );
        for (d, r) in started.iter().chain(stopped.iter().flatten()) {
            f.slowest_hook_ms = f.slowest_hook_ms.max(d.as_secs_f64() * 1e3);
            if let Err(e) = r {
                f.hook_errors.push(e.clone());
            }
        }
        let plugin = self.node.plugin.as_ref().context("daemon not registered")?;
        for chunk in pods.chunks(16) {
            let claims: Vec<Claim> = chunk.iter().map(|p| p.claim.clone()).collect();
            plugin.unprepare(&claims).await?;
        }
        for p in &pods {
            check_home(&p.dev)?;
        }
        #[allow(clippy::cast_precision_loss)]
        Ok(pods.len() as f64 / took.as_secs_f64())
    }

    /// The same attaches and detaches by the baseline, 8 at a time.
    async fn baseline_round(&self, devs: &[Dev]) -> Result<f64> {
        let mut netns = Vec::new();
        for _ in devs {
            let ns = PodNetns::create(&unique("drbench-v-"))?;
            let fd = ns.open()?;
            netns.push((ns, fd));
        }
        let t = Instant::now();
        let host = &self.host;
        let attached: Vec<Result<()>> =
            futures::stream::iter(netns.iter().zip(devs))
                .map(|((_, fd), d)| async move {
                    baseline::attach(host, fd, std::slice::from_ref(d), POD_MTU).await
                })
                .buffer_unordered(IN_FLIGHT)
                .collect()
                .await;
        let start_phase = t.elapsed();
        for r in attached {
            r?;
        }
        let host_ns = &self.host_ns;
        // Each pod's netns goes when its pod does, as in dranet's round (where the runtime
        // removes it and dranet releases its pin): the kernel's teardown of it (`cleanup_net`,
        // which takes RTNL) is part of stopping pods, so the baseline keeps no reference past
        // its own detach.
        let detached: Vec<Result<()>> = futures::stream::iter(netns.into_iter().zip(devs))
            .map(|((mut ns, fd), d)| async move {
                let pod = baseline::handle_in(&fd)?;
                baseline::detach(&pod, host, host_ns, std::slice::from_ref(d), HOST_MTU).await?;
                drop(pod);
                drop(fd);
                let _ = tokio::task::spawn_blocking(move || ns.remove_crio_style()).await;
                Ok(())
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        let took = t.elapsed();
        eprintln!(
            "  baseline: {} pods started in {start_phase:.2?}, stopped in {:.2?}",
            devs.len(),
            took.saturating_sub(start_phase)
        );
        for r in detached {
            r?;
        }
        for d in devs {
            check_home(d)?;
        }
        #[allow(clippy::cast_precision_loss)]
        Ok(devs.len() as f64 / took.as_secs_f64())
    }

    /// The daemon's RSS once it is idle (nothing in flight, the burst's threads gone), KiB.
    async fn rss(&self) -> Result<u64> {
        self.node.daemon_idle_rss_kib().await
    }

    /// The daemon's RSS after a round whose dranet part ended at `ended`: once it is idle, and
    /// no sooner than the watcher's grace for the dead netns's paths
    /// ([`dranet::watch::DEAD_PATHS_KEPT`]: they still label late events until then, and go
    /// after). In the rounds where the baseline runs second its 6–7 s count toward that.
    async fn rss_after(&self, ended: Instant) -> Result<u64> {
        let due = ended + dranet::watch::DEAD_PATHS_KEPT + Duration::from_millis(500);
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        self.rss().await
    }
}

pub async fn run(cx: &Ctx, rounds: usize) -> Result<Figures> {
    let mut f = Figures::default();
    let all = &cx.fleet.devs;
    // Warm-up: first-use allocations (thread pools, caches, the first pod netlink).
    cx.dranet_round(&all[..IN_FLIGHT.min(all.len())], &mut Figures::default())
        .await?;
    cx.baseline_round(&all[..IN_FLIGHT.min(all.len())]).await?;
    for r in 0..rounds {
        eprintln!("churn, {} pods, round {}/{rounds} ...", all.len(), r + 1);
        let before = cx.rss().await?;
        let (rate, base, ended) = if r % 2 == 0 {
            let a = cx.dranet_round(all, &mut f).await?;
            let ended = Instant::now();
            (a, cx.baseline_round(all).await?, ended)
        } else {
            let b = cx.baseline_round(all).await?;
            (cx.dranet_round(all, &mut f).await?, b, Instant::now())
        };
        f.rate.push(rate);
        f.base_rate.push(base);
        f.rss_before.push(before);
        f.rss_after.push(cx.rss_after(ended).await?);
    }
    Ok(f)
}
