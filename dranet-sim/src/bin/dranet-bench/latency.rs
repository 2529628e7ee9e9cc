//! Rescue and attach latency: dranet's engine against the baseline, alternating rounds, on N
//! veth devices reused across rounds (each round has a fresh pod netns).
use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::clock::MonoTime;
use dranet::config::NetworkConfig;
use dranet::plan::{ClaimRef, DevicePlan, PodPlan};
use dranet::rescue::{Engine, EngineOptions, PodRef};
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::stop_sandbox;
use dranet_sim::kernel::{PodNetns, Veth, sh, unique};
use nix::mount::{MntFlags, MsFlags};
use rtnetlink::Handle;

use crate::baseline::{self, Dev};
use crate::listener::Listener;

/// Host MTU of the devices, and the MTU the pod config gives them (so the restore has work).
pub const HOST_MTU: u32 = 1400;
pub const POD_MTU: u32 = 9000;
const WAIT: Duration = Duration::from_secs(5);

/// A state dir on its own tmpfs, as `/run/dranet` is in production; pins and the tmpfs are
/// unmounted on drop.
pub struct StateDir(pub PathBuf);

impl StateDir {
    pub fn new() -> Result<Self> {
        Self::new_sized("16m")
    }

    /// With a tmpfs of `size` (mount's `size=`).
    pub fn new_sized(size: &str) -> Result<Self> {
        let dir = PathBuf::from("/run").join(unique("dranet-bench-"));
        std::fs::create_dir_all(&dir)?;
        let me = Self(dir);
        nix::mount::mount(
            Some("tmpfs"),
            &me.0,
            Some("tmpfs"),
            MsFlags::empty(),
            Some(format!("size={size},mode=0700").as_str()),
        )
        .context("mounting the state tmpfs")?;
        Ok(me)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if let Ok(rd) = std::fs::read_dir(self.0.join("pins")) {
            for e in rd.flatten() {
                let _ = nix::mount::umount2(&e.path(), MntFlags::MNT_DETACH);
            }
        }
        let _ = nix::mount::umount2(&self.0, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// N veth pairs in the host: `a` (MTU 1400, UP) is the device, `b` its peer (stays home).
pub struct Devices {
    _veths: Vec<Veth>,
    pub devs: Vec<Dev>,
}

impl Devices {
    pub fn create(n: usize) -> Result<Self> {
        let mut veths = Vec::new();
        let mut devs = Vec::new();
        for i in 0..n {
            let v = Veth::create(&unique("drb"), &unique("drc"))?;
            sh(&["ip", "link", "set", &v.a, "mtu", &HOST_MTU.to_string(), "up"])?;
            sh(&["ip", "link", "set", &v.b, "up"])?;
            devs.push(Dev {
                host: v.a.clone(),
                pod: format!("net{i}"),
                index: Veth::ifindex(&v.a)?,
            });
            veths.push(v);
        }
        Ok(Self { _veths: veths, devs })
    }

    pub fn names(&self) -> Vec<String> {
        self.devs.iter().map(|d| d.host.clone()).collect()
    }

    /// Every device home under its name and index, UP, MTU 1400 (read from sysfs).
    pub fn check_home(&self) -> Result<()> {
        self.devs.iter().try_for_each(crate::fleet::check_home)
    }

    pub fn plan(&self, uid: &str) -> PodPlan {
        let devices = self
            .devs
            .iter()
            .map(|d| {
                let mut config = NetworkConfig::default();
                config.interface.name = Some(d.pod.clone());
                config.interface.mtu = Some(i32::try_from(POD_MTU).unwrap_or(i32::MAX));
                DevicePlan {
                    device: d.host.clone(),
                    pool: "bench".into(),
                    request: "nic".into(),
                    claim: ClaimRef {
                        namespace: "default".into(),
                        name: format!("claim-{uid}"),
                        uid: format!("claim-{uid}"),
                    },
                    host_ifname: Some(d.host.clone()),
                    pci_address: None,
                    permanent_mac: None,
                    rdma_device: None,
                    config,
                    char_devices: vec![],
                }
            })
            .collect();
        PodPlan {
            pod_uid: uid.into(),
            pod_namespace: "default".into(),
            pod_name: "bench".into(),
            devices,
        }
    }
}

/// The sandbox (its id is the pod UID) of the bench's pod `uid`.
pub fn pod(uid: &str) -> Result<PodRef<'static>, dranet::ids::IdError> {
    PodRef::parse(uid, uid, "default", "bench")
}

/// Everything a round needs.
pub struct Ctx {
    pub engine: Engine,
    pub listener: Listener,
    pub host: Handle,
    pub host_ns: File,
    _state: StateDir,
    events: tokio::task::JoinHandle<()>,
}

impl Ctx {
    /// The engine with the watcher (probes loaded) and its event loop, as the daemon runs them.
    pub async fn start() -> Result<Self> {
        let state = StateDir::new()?;
        let watcher = Watcher::start(WatcherOptions::default()).await?;
        let sub = watcher.subscribe();
        let opts = EngineOptions {
            state_dir: state.0.clone(),
            ..EngineOptions::default()
        };
        let engine = Engine::new(opts, Some(watcher)).await?;
        let runner = engine.clone();
        let events = tokio::spawn(async move { runner.run_events(sub).await });
        Ok(Self {
            engine,
            listener: Listener::start()?,
            host: baseline::host_handle()?,
            host_ns: File::open("/proc/self/ns/net")?,
            _state: state,
            events,
        })
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        self.events.abort();
    }
}

/// Samples of one N, in µs.
#[derive(Default)]
pub struct Figures {
    pub rescue: Vec<f64>,
    pub rescue_base: Vec<f64>,
    /// umount2 return → the engine's first device move.
    pub reaction: Vec<f64>,
    /// probe event → the engine's first device move (inside dranet).
    pub reaction_from_event: Vec<f64>,
    pub attach: Vec<f64>,
    pub attach_base: Vec<f64>,
}

#[allow(clippy::cast_precision_loss, clippy::cast_possible_wrap)]
fn us(from: MonoTime, to: MonoTime) -> f64 {
    to.offset_ns(from) as f64 / 1000.0
}

impl Ctx {
    async fn forget(&self, uid: &str) -> Result<()> {
        self.engine
            .forget_sandbox(dranet::rescue::SandboxRef::parse(uid, uid, None)?)
            .await?;
        self.engine.remove_claim(&format!("claim-{uid}"))?;
        Ok(())
    }

    /// CRI-O order with dranet: attach, then umount2 + unlink; time until the listener sees every
    /// device home, and the engine's own first-move timestamp.
    pub async fn rescue_sample(&self, d: &Devices, f: &mut Figures) -> Result<()> {
        let mut ns = PodNetns::create(&unique("drbench-r-"))?;
        let uid = unique("bench-r-");
        self.engine.set_plan(d.plan(&uid))?;
        self.engine.attach_pod(pod(&uid)?, &ns.path).await?;
        // Let the attach's own link events pass through the watcher first.
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.listener.drain();
        let t0 = ns.remove_crio_style_timed()?;
        let names = d.names();
        let done = tokio::task::block_in_place(|| self.listener.wait_home(&names, HOST_MTU, t0, WAIT))?;
        let start = Instant::now();
        let timing = loop {
            // Its netns is gone: the sandbox's record goes once its devices are home.
            let done_rec = !self
                .engine
                .checkpoint()
                .pods
                .contains_key(&dranet::state::pod_key(&uid, &uid));
            match self.engine.last_rescue() {
                Some(t) if t.pod_uid == uid && done_rec => break t,
                _ if start.elapsed() > WAIT => bail!("the engine recorded no rescue of {uid}"),
                _ => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let first = timing.first_move_ns.context("rescue moved nothing")?;
        f.rescue.push(us(t0, done));
        f.reaction.push(us(t0, first));
        f.reaction_from_event.push(us(timing.event_ns, first));
        self.forget(&uid).await?;
        d.check_home()
    }

    /// The same teardown with the baseline doing the moves right after umount2 returns.
    pub async fn rescue_baseline(&self, d: &Devices, f: &mut Figures) -> Result<()> {
        let mut ns = PodNetns::create(&unique("drbench-b-"))?;
        let fd = ns.open()?;
        baseline::attach(&self.host, &fd, &d.devs, POD_MTU).await?;
        let pod_nl = baseline::handle_in(&fd)?;
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.listener.drain();
        let t0 = ns.remove_crio_style_timed()?;
        baseline::detach(&pod_nl, &self.host, &self.host_ns, &d.devs, HOST_MTU).await?;
        let names = d.names();
        let done = tokio::task::block_in_place(|| self.listener.wait_home(&names, HOST_MTU, t0, WAIT))?;
        f.rescue_base.push(us(t0, done));
        drop(pod_nl);
        drop(fd);
        d.check_home()
    }

    /// `Engine::attach_pod` (what the NRI RunPodSandbox hook calls), timed; then detach.
    pub async fn attach_sample(&self, d: &Devices, f: &mut Figures) -> Result<()> {
        let ns = PodNetns::create(&unique("drbench-a-"))?;
        let uid = unique("bench-a-");
        self.engine.set_plan(d.plan(&uid))?;
        let t = Instant::now();
        self.engine.attach_pod(pod(&uid)?, &ns.path).await?;
        let took = t.elapsed();
        stop_sandbox(&self.engine, &uid, &ns.path).await?;
        f.attach.push(took.as_secs_f64() * 1e6);
        self.forget(&uid).await?;
        drop(ns);
        d.check_home()
    }

    /// The baseline attach: open the netns, a socket inside it, the same moves.
    pub async fn attach_baseline(&self, d: &Devices, f: &mut Figures) -> Result<()> {
        let ns = PodNetns::create(&unique("drbench-c-"))?;
        let t = Instant::now();
        let fd = File::open(&ns.path)?;
        baseline::attach(&self.host, &fd, &d.devs, POD_MTU).await?;
        let took = t.elapsed();
        let pod_nl = baseline::handle_in(&fd)?;
        baseline::detach(&pod_nl, &self.host, &self.host_ns, &d.devs, HOST_MTU).await?;
        f.attach_base.push(took.as_secs_f64() * 1e6);
        drop(pod_nl);
        drop(fd);
        drop(ns);
        d.check_home()
    }
}

/// `rounds` alternating sample/baseline rounds of each kind for one N (plus 2 warm-up rounds).
pub async fn run(cx: &Ctx, n: usize, rounds: usize) -> Result<Figures> {
    let d = Devices::create(n)?;
    let mut warm = Figures::default();
    for _ in 0..2 {
        cx.rescue_sample(&d, &mut warm).await?;
        cx.rescue_baseline(&d, &mut warm).await?;
        cx.attach_sample(&d, &mut warm).await?;
        cx.attach_baseline(&d, &mut warm).await?;
    }
    let mut f = Figures::default();
    for r in 0..rounds {
        if r % 2 == 0 {
            cx.rescue_sample(&d, &mut f).await?;
            cx.rescue_baseline(&d, &mut f).await?;
            cx.attach_sample(&d, &mut f).await?;
            cx.attach_baseline(&d, &mut f).await?;
        } else {
            cx.rescue_baseline(&d, &mut f).await?;
            cx.rescue_sample(&d, &mut f).await?;
            cx.attach_baseline(&d, &mut f).await?;
            cx.attach_sample(&d, &mut f).await?;
        }
    }
    Ok(f)
}
