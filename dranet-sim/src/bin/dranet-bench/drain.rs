//! Node drain: `pods` pods × 2 veth devices attached through the real daemon (`dranet run`
//! between the kubelet simulator and the NRI runtime harness), then torn down at once; and the
//! same moves and restores by the direct-rtnetlink baseline, in the same run.
//!
//! * CRI-O order: one thread unmounts (MNT_DETACH) and unlinks every pod netns bind mount, one
//!   after the other (a few ms for all); each pod's StopPodSandbox goes out 3 ms after its own
//!   unmount, all in parallel over the one NRI connection (then RemovePodSandbox with the dead
//!   path); at most [`HOOKS_IN_FLIGHT`] pods' hooks in flight. Figure: first unmount → last device home (original name, UP, host MTU) as the
//!   independent rtnetlink listener sees it.
//! * containerd order: every StopPodSandbox at once ([`HOOKS_IN_FLIGHT`] in flight); each pod's netns is unmounted 66 ms after
//!   its hook returned (containerd's CNI teardown in between), then RemovePodSandbox (no path).
//!   Figure: first hook sent → last device home.
//! * Baseline: per device one RTM_NEWLINK in the pod (move home + name) and one in the host
//!   (MTU + UP); pods in teardown order, [`HOOKS_IN_FLIGHT`] at a time (as the hooks reach
//!   dranet), each pod's devices one after the other, started at the first unmount (CRI-O
//!   order; for containerd, from live netns), the pod sockets opened beforehand. Each
//!   pod's netns is let go right after its devices are home (its socket and fd closed; in
//!   containerd order also unmounted then), so the kernel tears it down inside the drain, as it
//!   does in dranet's round once the pin is released.
//! * With `newcomer` (the `hol` figure): `HOL_DELAY` into the drain a new pod's RunPodSandbox
//!   with 1 device; in the baseline a bare attach of that device (one RTM_NEWLINK: move +
//!   rename + MTU; UP inside the pod) at the same point of a baseline drain of its own that
//!   returns one pod at a time (the shortest RTNL queue a drain can put ahead of it).
use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dranet::clock::MonoTime;
use dranet::nri::pb::nri as pb;
use dranet_sim::kernel::{PodNetns, unique};
use dranet_sim::kubelet::Claim;
use dranet_sim::node::{Node, NodeOptions, sandbox};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use futures::StreamExt;
use nix::mount::MntFlags;
use rtnetlink::Handle;
use serde_json::json;

use crate::baseline::{self, Dev};
use crate::fleet::{Fleet, check_home};
use crate::latency::{HOST_MTU, POD_MTU};
use crate::listener::Listener;

/// How long after the first unmount the newcomer's RunPodSandbox goes out.
const HOL_DELAY: Duration = Duration::from_millis(150);
/// CRI-O sends StopPodSandbox 0.9–16 ms (median 2.5–3.9) after it removed the netns.
const CRIO_STOP_AFTER: Duration = Duration::from_millis(3);
/// containerd removes the netns 66–718 ms after StopPodSandbox.
const CONTAINERD_UNMOUNT_AFTER: Duration = Duration::from_millis(66);
const WAIT_HOME: Duration = Duration::from_secs(120);
/// Teardown hooks (Stop, then Remove, of one pod) the runtime side has in flight at once. Real
/// runtimes send one plugin call at a time (containerd/nri `pkg/adaptation` holds one lock
/// across them); 8 is already more than any, and stays under dranet's cap of 16 per connection
/// (`nri::ttrpc::MAX_IN_FLIGHT`, past which a request is refused) with the newcomer's hook.
pub const HOOKS_IN_FLIGHT: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Crio,
    Containerd,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Self::Crio => "CRI-O",
            Self::Containerd => "containerd",
        }
    }
}

/// Samples of one teardown order (ms unless noted).
#[derive(Default)]
pub struct Figures {
    pub drain: Vec<f64>,
    pub base: Vec<f64>,
    /// dranet's CPU time (user + system) from the start of the teardown to the last device home.
    pub cpu: Vec<f64>,
    /// The slowest NRI hook of each round (every pod's Stop and Remove, the newcomer's Run).
    pub slowest_hook: Vec<f64>,
    /// Hooks that failed (status and message), all rounds.
    pub hook_errors: Vec<String>,
    /// First to last unmount (CRI-O order), ms.
    pub unmount_span: Vec<f64>,
    /// The newcomer's RunPodSandbox, and the baseline's bare attach.
    pub hol: Vec<f64>,
    pub hol_base: Vec<f64>,
}

/// One pod of a round.
struct Pod {
    uid: String,
    ns: PodNetns,
    claim: Claim,
    devs: [Dev; 2],
}

impl Pod {
    fn sandbox(&self) -> pb::PodSandbox {
        sandbox(&self.uid, &self.ns.path)
    }
}

/// The daemon and what every round shares.
pub struct Ctx {
    node: Node,
    listener: Listener,
    host: Handle,
    host_ns: File,
    fleet: Fleet,
    /// The newcomer's device (not part of the drain).
    extra: Fleet,
}

impl Ctx {
    /// Devices first (the daemon's first scan publishes them), then the daemon.
    pub async fn start(pods: usize, listener: Listener) -> Result<Self> {
        let fleet = Fleet::create(2 * pods)?;
        let extra = Fleet::create(1)?;
        let node = Node::start(NodeOptions {
            runtime: RuntimeConfig::default(),
            ..NodeOptions::default()
        })
        .await?;
        Ok(Self {
            node,
            listener,
            host: baseline::host_handle()?,
            host_ns: File::open("/proc/self/ns/net")?,
            fleet,
            extra,
        })
    }

    fn pid(&self) -> Result<u32> {
        self.node.daemon_pid().context("the daemon is not running")
    }

    /// New netns, claims written and prepared, for every pair of devices.
    async fn pods(&self) -> Result<Vec<Pod>> {
        let mut pods = Vec::new();
        for pair in self.fleet.devs.chunks(2) {
            let uid = unique("drain-");
            let claim = Claim::new("default", &format!("claim-{uid}"), &format!("cuid-{uid}"));
            let devices: Vec<(String, serde_json::Value)> = pair
                .iter()
                .map(|d| {
                    (
                        dranet::inventory::netdev_device_name(&d.host),
                        json!({"interface": {"name": d.pod, "mtu": POD_MTU}}),
                    )
                })
                .collect();
            self.node.write_claim(&claim, &uid, &devices)?;
            pods.push(Pod {
                ns: PodNetns::create(&unique("drbench-d-"))?,
                uid,
                claim,
                devs: [pair[0].clone(), pair[1].clone()],
            });
        }
        let plugin = self.node.plugin.as_ref().context("daemon not registered")?;
        let claims: Vec<Claim> = pods.iter().map(|p| p.claim.clone()).collect();
        plugin.prepare_all(&claims, 16).await?;
        Ok(pods)
    }

    fn newcomer(&self) -> Result<Pod> {
        let uid = unique("drain-new-");
        let claim = Claim::new("default", &format!("claim-{uid}"), &format!("cuid-{uid}"));
        let d = self.extra.devs[0].clone();
        self.node.write_claim(
            &claim,
            &uid,
            &[(
                dranet::inventory::netdev_device_name(&d.host),
                json!({"interface": {"name": "net0", "mtu": POD_MTU}}),
            )],
        )?;
        Ok(Pod {
            ns: PodNetns::create(&unique("drbench-n-"))?,
            uid,
            claim,
            devs: [d.clone(), d],
        })
    }

    /// One round with dranet; returns (drain ms, cpu ms, slowest hook ms, newcomer's hook ms).
    async fn dranet_round(&self, order: Order, newcomer: bool, f: &mut Figures) -> Result<()> {
        self.node.runtime.set_flavor(match order {
            Order::Crio => Flavor::Crio,
            Order::Containerd => Flavor::Containerd,
        });
        let pods = self.pods().await?;
        let nc = if newcomer {
            let p = self.newcomer()?;
            self.node.prepare(&p.claim).await?;
            Some(p)
        } else {
            None
        };
        // Attach: 8 RunPodSandbox in flight.
        let rt = &self.node.runtime;
        let attached: Vec<Result<(), _>> = futures::stream::iter(pods.iter())
            .map(|p| async move { rt.run_pod_sandbox(&p.sandbox()).await })
            .buffer_unordered(8)
            .collect()
            .await;
        for r in attached {
            r.context("RunPodSandbox during set-up")?;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.listener.drain();
        let names = self.fleet.names();
        let cpu0 = cpu_ms(self.pid()?)?;
        let l = self.listener.clone();
        let (t0_tx, t0_rx) = std::sync::mpsc::channel::<MonoTime>();
        let home = tokio::task::spawn_blocking(move || -> Result<MonoTime> {
            let t0 = t0_rx.recv().context("no teardown start")?;
            l.wait_home(&names, HOST_MTU, t0, WAIT_HOME)
        });
        let mut hooks: Vec<(String, Duration, Result<(), String>)> = Vec::new();
        let (t0, span) = match order {
            Order::Crio => self.crio_teardown(&pods, nc.as_ref(), &t0_tx, &mut hooks).await?,
            Order::Containerd => {
                self.containerd_teardown(&pods, nc.as_ref(), &t0_tx, &mut hooks)
                    .await?
            }
        };
        let done = home.await??;
        let cpu1 = cpu_ms(self.pid()?)?;
        f.drain.push(ms(t0, done));
        f.cpu.push(cpu1 - cpu0);
        if let Some(s) = span {
            f.unmount_span.push(s);
        }
        // Remove the newcomer (containerd order: its devices come home by the hook).
        if let Some(nc) = &nc {
            let t = Instant::now();
            let r = rt.stop_pod_sandbox(&nc.sandbox()).await;
            hooks.push(("StopPodSandbox".into(), t.elapsed(), r.map_err(|e| chain(&e))));
            let _ = rt.remove_pod_sandbox(&nc.sandbox()).await;
            self.node.unprepare(&nc.claim).await?;
            check_home(&nc.devs[0])?;
            if let Some((_, took, _)) = hooks.iter().find(|(h, _, _)| h == "RunPodSandbox(newcomer)") {
                f.hol.push(took.as_secs_f64() * 1e3);
            }
        }
        let slowest = hooks
            .iter()
            .map(|(_, d, _)| d.as_secs_f64() * 1e3)
            .fold(0.0, f64::max);
        f.slowest_hook.push(slowest);
        for (h, _, r) in &hooks {
            if let Err(e) = r {
                f.hook_errors.push(format!("{h}: {e}"));
            }
        }
        let plugin = self.node.plugin.as_ref().context("daemon not registered")?;
        let claims: Vec<Claim> = pods.iter().map(|p| p.claim.clone()).collect();
        plugin.unprepare(&claims).await?;
        self.fleet.check_home()
    }

    /// CRI-O: unmount + unlink every netns (one thread, in order), each pod's Stop 3 ms after its
    /// unmount, then its Remove. Returns the first unmount (monotonic time) and the unmount span.
    async fn crio_teardown(
        &self,
        pods: &[Pod],
        nc: Option<&Pod>,
        t0_tx: &std::sync::mpsc::Sender<MonoTime>,
        hooks: &mut Vec<(String, Duration, Result<(), String>)>,
    ) -> Result<(MonoTime, Option<f64>)> {
        let paths: Vec<PathBuf> = pods.iter().map(|p| p.ns.path.clone()).collect();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, MonoTime)>();
        let t0_tx = t0_tx.clone();
        let unmounter = std::thread::spawn(move || -> Result<(MonoTime, MonoTime)> {
            let mut first = None;
            let mut last = MonoTime::default();
            for (i, p) in paths.iter().enumerate() {
                nix::mount::umount2(p, MntFlags::MNT_DETACH).context("umount2")?;
                let t = dranet::watch::mono_now();
                if first.is_none() {
                    first = Some(t);
                    let _ = t0_tx.send(t);
                }
                last = t;
                std::fs::remove_file(p).context("unlink")?;
                let _ = tx.send((i, t));
            }
            Ok((first.unwrap_or_default(), last))
        });
        let rt = &self.node.runtime;
        let slots = &tokio::sync::Semaphore::new(HOOKS_IN_FLIGHT);
        let stops = async {
            let mut pending = futures::stream::FuturesUnordered::new();
            let mut out = Vec::new();
            loop {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some((i, _)) => pending.push(async move {
                            tokio::time::sleep(CRIO_STOP_AFTER).await;
                            let _slot = slots.acquire().await;
                            let sb = pods[i].sandbox();
                            let t = Instant::now();
                            let r = rt.stop_pod_sandbox(&sb).await.map_err(|e| chain(&e));
                            let stop = ("StopPodSandbox".to_owned(), t.elapsed(), r);
                            let t = Instant::now();
                            let r = rt.remove_pod_sandbox(&sb).await.map_err(|e| chain(&e));
                            [stop, ("RemovePodSandbox".to_owned(), t.elapsed(), r)]
                        }),
                        None => break,
                    },
                    Some(r) = pending.next(), if !pending.is_empty() => out.extend(r),
                }
            }
            while let Some(r) = pending.next().await {
                out.extend(r);
            }
            out
        };
        let newcomer = self.newcomer_run(nc);
        let (stops, nc_hook) = tokio::join!(stops, newcomer);
        hooks.extend(stops);
        hooks.extend(nc_hook);
        let (first, last) = unmounter
            .join()
            .map_err(|_| anyhow::anyhow!("unmount thread panicked"))??;
        Ok((first, Some(ms(first, last))))
    }

    /// containerd: every Stop at once; each netns unmounted 66 ms after its hook returned, then
    /// its Remove. Returns the time the first hook went out.
    async fn containerd_teardown(
        &self,
        pods: &[Pod],
        nc: Option<&Pod>,
        t0_tx: &std::sync::mpsc::Sender<MonoTime>,
        hooks: &mut Vec<(String, Duration, Result<(), String>)>,
    ) -> Result<(MonoTime, Option<f64>)> {
        let rt = &self.node.runtime;
        let t0 = dranet::watch::mono_now();
        let _ = t0_tx.send(t0);
        let slots = &tokio::sync::Semaphore::new(HOOKS_IN_FLIGHT);
        let all = futures::future::join_all(pods.iter().map(|p| async move {
            let sb = p.sandbox();
            let slot = slots.acquire().await;
            let t = Instant::now();
            let r = rt.stop_pod_sandbox(&sb).await.map_err(|e| chain(&e));
            let stop = ("StopPodSandbox".to_owned(), t.elapsed(), r);
            drop(slot);
            tokio::time::sleep(CONTAINERD_UNMOUNT_AFTER).await;
            let _slot = slots.acquire().await;
            let path = p.ns.path.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = nix::mount::umount2(&path, MntFlags::MNT_DETACH);
                let _ = std::fs::remove_file(&path);
            })
            .await;
            let t = Instant::now();
            let r = rt.remove_pod_sandbox(&sb).await.map_err(|e| chain(&e));
            [stop, ("RemovePodSandbox".to_owned(), t.elapsed(), r)]
        }));
        let (all, nc_hook) = tokio::join!(all, self.newcomer_run(nc));
        hooks.extend(all.into_iter().flatten());
        hooks.extend(nc_hook);
        Ok((t0, None))
    }

    /// The newcomer's RunPodSandbox, `HOL_DELAY` into the drain.
    async fn newcomer_run(&self, nc: Option<&Pod>) -> Option<(String, Duration, Result<(), String>)> {
        let nc = nc?;
        tokio::time::sleep(HOL_DELAY).await;
        let t = Instant::now();
        let r = self.node.runtime.run_pod_sandbox(&nc.sandbox()).await;
        Some((
            "RunPodSandbox(newcomer)".into(),
            t.elapsed(),
            r.map_err(|e| chain(&e)),
        ))
    }

    /// The same teardown by the baseline.
    ///
    /// `Base::Drain`: pods `HOOKS_IN_FLIGHT` at a time, the drain figure. `Base::Hol`: one pod
    /// after the other, the newcomer's figure only: its bare attach then queues behind the least
    /// RTNL work a drain can put ahead of it (one pod's requests and the kernel's netns
    /// teardowns), not behind 8 pods' moves, more than dranet's return lanes ever queue.
    async fn baseline_round(&self, order: Order, base: Base, newcomer: bool, f: &mut Figures) -> Result<()> {
        let width = match base {
            Base::Drain => HOOKS_IN_FLIGHT,
            Base::Hol => 1,
        };
        let mut netns = Vec::new();
        let mut socks = Vec::new();
        for pair in self.fleet.devs.chunks(2) {
            let ns = PodNetns::create(&unique("drbench-e-"))?;
            let fd = ns.open()?;
            baseline::attach(&self.host, &fd, pair, POD_MTU).await?;
            socks.push(baseline::handle_in(&fd)?);
            netns.push((ns, fd));
        }
        let nc = if newcomer {
            let ns = PodNetns::create(&unique("drbench-f-"))?;
            let fd = ns.open()?;
            Some((ns, fd))
        } else {
            None
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.listener.drain();
        let names = self.fleet.names();
        let l = self.listener.clone();
        let (t0_tx, t0_rx) = std::sync::mpsc::channel::<MonoTime>();
        let home = tokio::task::spawn_blocking(move || -> Result<MonoTime> {
            let t0 = t0_rx.recv().context("no teardown start")?;
            l.wait_home(&names, HOST_MTU, t0, WAIT_HOME)
        });
        let pairs: Vec<&[Dev]> = self.fleet.devs.chunks(2).collect();
        // A pod's netns goes as soon as the baseline has brought its devices home, as in
        // dranet's round (where the runtime removed it and dranet releases its pin after the
        // return): the kernel's teardown of it (`cleanup_net`, which takes RTNL) falls inside the
        // drain for both, not after the baseline's clock stops.
        let paths: Vec<PathBuf> = netns.iter().map(|(ns, _)| ns.path.clone()).collect();
        let held = socks
            .into_iter()
            .zip(netns)
            .zip(pairs.iter().copied())
            .map(|((s, (ns, fd)), pair)| (s, ns, fd, pair));
        let (host, host_ns) = (&self.host, &self.host_ns);
        let t0 = match order {
            Order::Crio => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
                let t0_tx = t0_tx.clone();
                let unmounter = std::thread::spawn(move || -> Result<MonoTime> {
                    let mut first = MonoTime::default();
                    for (i, p) in paths.iter().enumerate() {
                        nix::mount::umount2(p, MntFlags::MNT_DETACH).context("umount2")?;
                        if i == 0 {
                            first = dranet::watch::mono_now();
                            let _ = t0_tx.send(first);
                        }
                        std::fs::remove_file(p).context("unlink")?;
                        let _ = tx.send(i);
                    }
                    Ok(first)
                });
                // Each pod as soon as its netns is unmounted (the thread goes in pod order),
                // `HOOKS_IN_FLIGHT` at a time, as dranet gets them.
                let unmounted =
                    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) });
                let work = async {
                    let done: Vec<Result<()>> = unmounted
                        .zip(futures::stream::iter(held))
                        .map(|(_, (sock, mut ns, fd, pair))| async move {
                            baseline::detach(&sock, host, host_ns, pair, HOST_MTU).await?;
                            // Unmounted and unlinked already: the last references go.
                            ns.removed_elsewhere();
                            drop((sock, fd, ns));
                            Ok(())
                        })
                        .buffer_unordered(width)
                        .collect()
                        .await;
                    done.into_iter().collect::<Result<()>>()
                };
                let (w, hol) = tokio::join!(work, self.baseline_newcomer(nc.as_ref()));
                w?;
                if let (Some(h), Base::Hol) = (hol?, base) {
                    f.hol_base.push(h);
                }
                unmounter
                    .join()
                    .map_err(|_| anyhow::anyhow!("unmount thread panicked"))??
            }
            Order::Containerd => {
                let t0 = dranet::watch::mono_now();
                let _ = t0_tx.send(t0);
                let work = async {
                    let done: Vec<Result<tokio::task::JoinHandle<Result<()>>>> = futures::stream::iter(held)
                        .map(|(sock, mut ns, fd, pair)| async move {
                            baseline::detach(&sock, host, host_ns, pair, HOST_MTU).await?;
                            drop((sock, fd));
                            // The runtime removes the netns after the hook, beside the next
                            // pods' returns (its umount waits for an RCU grace period).
                            Ok(tokio::task::spawn_blocking(move || ns.remove_crio_style()))
                        })
                        .buffer_unordered(width)
                        .collect()
                        .await;
                    for r in done {
                        r?.await??;
                    }
                    anyhow::Ok(())
                };
                let (w, hol) = tokio::join!(work, self.baseline_newcomer(nc.as_ref()));
                w?;
                if let (Some(h), Base::Hol) = (hol?, base) {
                    f.hol_base.push(h);
                }
                t0
            }
        };
        let done = home.await??;
        if base == Base::Drain {
            f.base.push(ms(t0, done));
        }
        if let Some((ns, fd)) = nc {
            let pod = baseline::handle_in(&fd)?;
            baseline::detach(&pod, &self.host, &self.host_ns, &self.extra.devs, HOST_MTU).await?;
            drop(pod);
            drop(fd);
            drop(ns);
            self.extra.check_home()?;
        }
        self.fleet.check_home()
    }

    /// The baseline's newcomer: a bare attach of one device, `HOL_DELAY` into the drain.
    async fn baseline_newcomer(&self, nc: Option<&(PodNetns, File)>) -> Result<Option<f64>> {
        let Some((_, fd)) = nc else { return Ok(None) };
        tokio::time::sleep(HOL_DELAY).await;
        let t = Instant::now();
        baseline::attach(&self.host, fd, &self.extra.devs, POD_MTU).await?;
        Ok(Some(t.elapsed().as_secs_f64() * 1e3))
    }
}

/// Milliseconds from `a` to `b` (CLOCK_MONOTONIC ns).
#[allow(clippy::cast_precision_loss, clippy::cast_possible_wrap)]
fn ms(a: MonoTime, b: MonoTime) -> f64 {
    b.offset_ns(a) as f64 / 1e6
}

/// CPU time (user + system) of process `pid` so far, ms (clock ticks: 10 ms resolution).
pub fn cpu_ms(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("/proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based).
    let ticks: u64 =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    // SAFETY: sysconf reads a constant of the C library; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    #[allow(clippy::cast_precision_loss)]
    Ok(ticks as f64 * 1000.0 / hz as f64)
}

/// `rounds` alternating rounds of dranet and the baseline in each order (plus one warm-up
/// round each); with `newcomer`, the CRI-O order runs `hol_rounds` if that is more: the hol
/// figure is one sample a round, and its p99 over five swung 0.75–1.81 between runs.
pub async fn run(
    cx: &Ctx,
    orders: &[Order],
    rounds: usize,
    hol_rounds: usize,
    warm_up: bool,
    newcomer: bool,
) -> Result<Vec<(Order, Figures)>> {
    let mut out = Vec::new();
    for &order in orders {
        let nc = newcomer && order == Order::Crio;
        let rounds = if nc { rounds.max(hol_rounds) } else { rounds };
        let baseline = async |f: &mut Figures| -> Result<()> {
            cx.baseline_round(order, Base::Drain, nc, f).await?;
            if nc {
                cx.baseline_round(order, Base::Hol, nc, f).await?;
            }
            Ok(())
        };
        if warm_up {
            let mut warm = Figures::default();
            cx.dranet_round(order, nc, &mut warm).await?;
            baseline(&mut warm).await?;
        }
        let mut f = Figures::default();
        for r in 0..rounds {
            eprintln!("drain, {} order, round {}/{rounds} ...", order.name(), r + 1);
            if r % 2 == 0 {
                cx.dranet_round(order, nc, &mut f).await?;
                baseline(&mut f).await?;
            } else {
                baseline(&mut f).await?;
                cx.dranet_round(order, nc, &mut f).await?;
            }
        }
        out.push((order, f));
    }
    Ok(out)
}

/// Which figure a baseline round is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Base {
    Drain,
    Hol,
}

/// An error with its sources, on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
