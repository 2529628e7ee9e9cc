//! Big checkpoints: attach latency (`Engine::attach_pod` of 2 devices, then detach) with
//! `records` sandbox records (and as many plans) in the checkpoint, against the same attach with
//! an empty checkpoint; two engines on their own tmpfs state dirs, rounds alternating. The
//! records are copies of a real one (2 devices with their full snapshots: sysctls, offloads).
//! And the checkpoint write itself at that size against an empty one.
use std::time::Instant;

use anyhow::{Context, Result};
use dranet::rescue::{Engine, EngineOptions, SandboxRef};
use dranet::state::{Checkpoint, Store, Writer, pod_key};
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::stop_sandbox;
use dranet_sim::kernel::{PodNetns, unique};

use crate::latency::{Devices, StateDir, pod};

#[derive(Default)]
pub struct Figures {
    pub attach_empty: Vec<f64>,
    pub attach_full: Vec<f64>,
    pub save_full: Vec<f64>,
    pub save_empty: Vec<f64>,
    pub bytes: usize,
    pub records: usize,
}

struct Side {
    engine: Engine,
    _state: StateDir,
}

impl Side {
    async fn new(state: StateDir) -> Result<Self> {
        let watcher = Watcher::start(WatcherOptions::default()).await?;
        let opts = EngineOptions {
            state_dir: state.0.clone(),
            ..EngineOptions::default()
        };
        Ok(Self {
            engine: Engine::new(opts, Some(watcher)).await?,
            _state: state,
        })
    }

    /// One attach of the devices into a fresh netns, timed (µs); then detach and forget.
    async fn attach(&self, d: &Devices) -> Result<f64> {
        let ns = PodNetns::create(&unique("drbench-k-"))?;
        let uid = unique("bench-k-");
        self.engine.set_plan(d.plan(&uid))?;
        let t = Instant::now();
        self.engine.attach_pod(pod(&uid)?, &ns.path).await?;
        let took = t.elapsed().as_secs_f64() * 1e6;
        stop_sandbox(&self.engine, &uid, &ns.path).await?;
        self.forget(&uid).await?;
        drop(ns);
        d.check_home()?;
        Ok(took)
    }

    async fn forget(&self, uid: &str) -> Result<()> {
        self.engine
            .forget_sandbox(SandboxRef::parse(uid, uid, None)?)
            .await?;
        self.engine.remove_claim(&format!("claim-{uid}"))?;
        Ok(())
    }
}

/// `records` copies of a real attached record (and of its plan), each its own pod and netns.
/// The copies' pins are named in `pins`, the pins dir of the state dir they are loaded from (a
/// record whose pin is anywhere else is refused at load).
async fn big_checkpoint(
    side: &Side,
    d: &Devices,
    records: usize,
    pins: &std::path::Path,
) -> Result<Checkpoint> {
    let ns = PodNetns::create(&unique("drbench-k-"))?;
    let uid = unique("bench-t-");
    side.engine.set_plan(d.plan(&uid))?;
    side.engine.attach_pod(pod(&uid)?, &ns.path).await?;
    let cp = side.engine.checkpoint();
    let rec = cp.record(&pod_key(&uid, &uid)).context("no record")?.clone();
    let plan = cp.plans.get(&uid).context("no plan")?.clone();
    stop_sandbox(&side.engine, &uid, &ns.path).await?;
    side.forget(&uid).await?;
    drop(ns);
    let mut big = Checkpoint {
        version: dranet::state::FORMAT_VERSION,
        ..Checkpoint::default()
    };
    for i in 0..records {
        let u = format!("{}-{i:04}", unique("filler-"));
        let mut r = rec.clone();
        r.pod_uid.clone_from(&u);
        r.sandbox_id.clone_from(&u);
        r.name = format!("filler-{i}");
        // Identities no netns has: nothing ever matches them.
        r.netns.cookie = dranet::sys::netns::NetnsCookie::from_raw(u64::MAX - i as u64);
        r.netns.inode = u64::MAX - i as u64;
        r.netns_path = format!("/run/netns/filler-{i}").into();
        r.pin = r.pin.as_ref().map(|_| pins.join(&u));
        // Devices no node has (names, MACs): no attach ever finds them busy.
        for (j, dev) in r.devices.iter_mut().enumerate() {
            dev.device = format!("filler-{i}-{j}");
            dev.snapshot.name = format!("fl{i}x{j}");
            dev.permanent_mac = Some(format!("02:fe:{:02x}:{:02x}:00:{j:02x}", i / 256, i % 256));
            if let Some(at) = dev.at.as_mut() {
                at.netns = r.netns;
            }
        }
        let mut p = plan.clone();
        p.pod_uid.clone_from(&u);
        for (j, dp) in p.devices.iter_mut().enumerate() {
            dp.claim.uid = format!("claim-{u}");
            dp.device = format!("filler-{i}-{j}");
            dp.host_ifname = Some(format!("fl{i}x{j}"));
            dp.permanent_mac = Some(format!("02:fe:{:02x}:{:02x}:00:{j:02x}", i / 256, i % 256));
        }
        big.pods.insert(pod_key(&u, &u), r.into());
        big.plans.insert(u, p);
    }
    Ok(big)
}

pub async fn run(rounds: usize, records: usize) -> Result<Figures> {
    let d = Devices::create(2)?;
    let empty = Side::new(StateDir::new()?).await?;
    let state = StateDir::new_sized("256m")?;
    let store = Store::open(&state.0)?;
    let big = big_checkpoint(&empty, &d, records, &store.pins_dir()).await?;
    store.save(&big)?;
    drop(store);
    let full = Side::new(state).await?;
    let loaded = full.engine.checkpoint().pods.len();
    if loaded < records {
        anyhow::bail!("the engine kept {loaded} of the {records} records it loaded");
    }
    let mut f = Figures {
        records,
        bytes: serde_json::to_vec(&big)?.len(),
        ..Figures::default()
    };
    for _ in 0..2 {
        empty.attach(&d).await?;
        full.attach(&d).await?;
    }
    for r in 0..rounds {
        if r % 2 == 0 {
            f.attach_empty.push(empty.attach(&d).await?);
            f.attach_full.push(full.attach(&d).await?);
        } else {
            f.attach_full.push(full.attach(&d).await?);
            f.attach_empty.push(empty.attach(&d).await?);
        }
    }
    // The write itself as the engine does it (its writer: one record changed since the last
    // save, staged, then awaited on disk), on its own tmpfs.
    for (cp, out) in [
        (&big, &mut f.save_full),
        (&none_with_one(&big)?, &mut f.save_empty),
    ] {
        let dir = StateDir::new_sized("256m")?;
        let writer = Writer::start(Store::open(&dir.0)?)?;
        let mut cp = cp.clone();
        let key = cp.pods.keys().next().cloned().context("no record")?;
        for r in 0..=rounds {
            if let Some(rec) = cp.pods.get_mut(&key) {
                rec.name = format!("changed-{r}");
            }
            let t = Instant::now();
            let generation = writer.stage(&cp)?;
            writer.durable(generation).await?;
            // The first save encodes every record: not what an update costs.
            if r > 0 {
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    Ok(f)
}

/// A checkpoint with only the first record of `big` (and its plan).
fn none_with_one(big: &Checkpoint) -> Result<Checkpoint> {
    let (k, r) = big.pods.iter().next().context("no record")?;
    let mut cp = Checkpoint {
        version: dranet::state::FORMAT_VERSION,
        ..Checkpoint::default()
    };
    if let Some(p) = big.plans.get(&r.pod_uid) {
        cp.plans.insert(r.pod_uid.clone(), p.clone());
    }
    cp.pods.insert(k.clone(), r.clone());
    Ok(cp)
}
