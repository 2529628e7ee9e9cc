//! The model-based life-cycle soak: a seeded, randomized state machine that drives the real
//! `dranet run` binary through the NRI runtime harness and the kubelet simulator, on real netns
//! and veth pairs standing in for NICs, and checks the node's invariants after every step.
//!
//! **The world model** (what a node really does to dranet):
//! * several pods at once, each with one or two NICs and a claim config (name, address, and
//!   sometimes a tenant-chosen MAC);
//! * both teardown orders (containerd: StopPodSandbox, then the netns goes; CRI-O: the netns goes
//!   1–16 ms before StopPodSandbox, which carries the dead path);
//! * kubelet re-creating a sandbox under the same pod UID (attempt + 1, no new Prepare) and its
//!   container GC removing the old sandbox later, while the new one runs;
//! * a StopPodSandbox that is missing, late (delivered some steps later) or duplicated, and a
//!   RemovePodSandbox without a Stop;
//! * runtime restarts (NRI disconnect, re-register, Synchronize), also containerd's: after it,
//!   the runtime never sends Stop/Remove for the sandboxes it had;
//! * SIGKILL of dranet at random points, also in the middle of an attach, a detach or a rescue,
//!   then down for a few steps while the runtime goes on, then a restart;
//! * tenants: a pod-side rename of the device, an impostor link with the device's pod-side name
//!   and MAC, host links created with the claim's MAC or with the device's original MAC;
//! * tenants changing what a netns move keeps (flags, txqueuelen, group), adding free altnames and
//!   altnames that name a host link, deleting their device in the pod;
//! * a host squatter: while a pod holds a NIC, a new host link takes the NIC's host name. The NIC
//!   then comes home as `dn<ifindex>` (everything else restored), also across a sandbox
//!   re-creation, and the squatter is never renamed, moved or reconfigured; a later step deletes
//!   the squatter, and the NIC must get its own name back;
//! * hostile record fields: while dranet is down after a SIGKILL, an extra record file is written
//!   into its checkpoint whose `pin` (and netns path) is a netns bind mount the soak owns under
//!   `/run/netns`, outside `<state-dir>/pins`. After the restart the record is moved aside as
//!   corrupt (`<file>.corrupt-<time>`), the mount is still there and still the same netns.
//!
//! **The invariants**, checked after every step once the daemon has had time to act (and only
//! while it runs: a dead daemon cannot bring anything home):
//! * every NIC is either in the netns of its pod's current running sandbox, configured as its
//!   claim says (a tenant may have renamed it), or in the host with its original name, MTU, MAC,
//!   addresses (with their broadcast and label) and up state;
//!   (a NIC whose host name a live squatter holds: `dn<ifindex>`, the rest as before);
//! * no other host link was renamed, moved or reconfigured (decoys, squatters, and every link the
//!   host had);
//! * a hostile record is moved aside and its netns mount left alone;
//! * no pin and no checkpoint record of a sandbox the runtime has removed;
//! * the daemon's fds and RSS stay bounded.
//!
//! A failure names the seed and the steps; `--seed S --lifecycles N` replays the same steps (the
//! choices depend only on the seed and the model, never on timing).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::nri::pb::nri as pb;
use dranet::test_support::SplitMix64;
use serde_json::{Value, json};

use crate::kernel::{PodNetns, Veth, sh, unique};
use crate::kubelet::Claim;
use crate::nic::{Nic, link_state, view};
use crate::node::{Node, NodeOptions, sandbox_with_id};
use crate::nri_runtime::{Flavor, RuntimeConfig};

/// How to run the soak.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// Pod life cycles to complete.
    pub lifecycles: usize,
    pub seed: u64,
    /// Pods alive at once, at most.
    pub max_pods: usize,
    /// Stand-in NICs on the node.
    pub nics: usize,
    /// Print every step.
    pub verbose: bool,
}

impl Default for SoakOptions {
    fn default() -> Self {
        Self {
            lifecycles: 1000,
            seed: 1,
            max_pods: 3,
            nics: 4,
            verbose: false,
        }
    }
}

/// What a soak run did.
#[derive(Clone, Debug, Default)]
pub struct SoakSummary {
    pub seed: u64,
    pub passed: usize,
    pub failed: usize,
    pub steps: usize,
    pub kills: usize,
    pub runtime_restarts: usize,
    pub recreations: usize,
    pub tenant_actions: usize,
    /// Issue 38 adversary steps: a tenant sets flags, txqueuelen and group in the pod; adds a
    /// free altname; adds an altname naming a host link (which would block the move home).
    pub tenant_link_state: usize,
    pub tenant_free_altnames: usize,
    pub tenant_colliding_altnames: usize,
    /// Issue 38: a tenant deletes its device in the pod (`ip link del`); it must end cleanly
    /// (record and pin gone with the sandbox), and a fresh NIC takes its place afterwards.
    pub tenant_deleted_devices: usize,
    /// Issue 38: a host link takes a NIC's host name while a pod holds it (host squatter).
    pub host_squatters: usize,
    /// Issue 38: a later step deletes a squatter; the NIC gets its own name back.
    pub squatters_removed: usize,
    /// Issue 38: hostile record files written while dranet was down (pin outside `pins/`).
    pub hostile_records: usize,
    /// Of those, records whose pin is where dranet's would be and one field of a device is
    /// hostile (a pod-side or temporary name with a '/', a PCI address path, 1,025 devices).
    pub hostile_fields: usize,
    /// Issue 38 (#6): a tenant moves its device into a netns of its own and makes a veth of its
    /// own in its place (same name, MAC and ifindex); the device dies with that netns.
    pub nested_impostors: usize,
    pub elapsed: Duration,
    /// The failure, with the seed and the steps that led to it.
    pub failure: Option<String>,
    /// Settled fd count and RSS (KiB) at the first and last footprint check of one process.
    pub fds: (usize, usize),
    pub rss_kib: (u64, u64),
}

impl SoakSummary {
    /// `N passed, M failed` and the figures.
    #[must_use]
    pub fn line(&self) -> String {
        format!(
            "{} passed, {} failed (seed {}, {} steps, {} kills, {} runtime restarts, {} re-created sandboxes, {} tenant actions, {} tenant link-state changes, {} free and {} colliding tenant altnames, {} devices deleted in the pod, {} host squatters, {} squatters removed, {} hostile records ({} by a device field), {} nested netns + impostors, {:.0} s; fds {} -> {}, rss {} -> {} KiB)",
            self.passed,
            self.failed,
            self.seed,
            self.steps,
            self.kills,
            self.runtime_restarts,
            self.recreations,
            self.tenant_actions,
            self.tenant_link_state,
            self.tenant_free_altnames,
            self.tenant_colliding_altnames,
            self.tenant_deleted_devices,
            self.host_squatters,
            self.squatters_removed,
            self.hostile_records,
            self.hostile_fields,
            self.nested_impostors,
            self.elapsed.as_secs_f64(),
            self.fds.0,
            self.fds.1,
            self.rss_kib.0,
            self.rss_kib.1,
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    Containerd,
    Crio,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SbState {
    Running,
    Stopped,
    Removed,
}

struct Sandbox {
    id: String,
    pb: pb::PodSandbox,
    netns: Option<PodNetns>,
    state: SbState,
    /// Recovered by a runtime that restarted like containerd 2.3.4: it sends no more hooks.
    silent: bool,
    /// A netns a tenant made and moved its device into ([`World::nest`]): its processes hold it
    /// until the sandbox goes, so it goes with the sandbox's netns.
    nested: Option<PodNetns>,
}

/// One NIC of a pod, as its claim configures it.
#[derive(Clone, Debug)]
struct NicCfg {
    nic: usize,
    name: String,
    addr: String,
    mac: Option<String>,
}

struct Pod {
    uid: String,
    claim: Claim,
    nics: Vec<NicCfg>,
    sandboxes: Vec<Sandbox>,
    /// Names a tenant gave the devices in the current sandbox, by NIC.
    renamed: HashMap<usize, String>,
    impostor: bool,
}

impl Pod {
    fn current(&self) -> Option<&Sandbox> {
        self.sandboxes.last().filter(|s| s.state == SbState::Running)
    }
}

// The squatter steps (issue 38) found two failures, neither steered around any more: a claim on a
// NIC whose squatter had gone failed RunPodSandbox (Prepare planned the squatter's identity from
// the inventory; fixed in 325e156), and a squatter vanished from the host after its NIC was
// deleted in the pod (the soak itself: a deleted NIC made anew dropped its old `Veth` guard,
// which deletes by name, while the squatter held that name; `renew_deleted` waits for the
// squatter to go).

/// A host link that took a NIC's host name while a pod held the NIC.
struct Squatter {
    /// The name it took (the NIC's host name then).
    name: String,
    /// `None` when the name was not free (the NIC was home): the model keeps the intent.
    veth: Option<(Veth, Value)>,
}

/// A record file written into the checkpoint while dranet was down, whose pin is a netns mount
/// the soak owns.
struct Hostile {
    netns: PodNetns,
    /// The netns file's inode when written (the nsfs inode while mounted).
    ino: u64,
    /// The record file's name in `checkpoint/`.
    file: String,
}

/// A hook delivered late.
struct Pending {
    pod_uid: String,
    sandbox: String,
    stop: bool,
}

/// What a tenant step acts on ([`World::tenant_target`]).
struct TenantTarget {
    ns_name: String,
    /// The device's name in the pod (the claim's, or the one its tenant gave it).
    dev: String,
    nic: usize,
    uid: String,
    /// The real device's link in the pod (`ip -j`), if it is there.
    real: Option<Value>,
}

struct World {
    node: Node,
    nics: Vec<Nic>,
    before: Vec<Value>,
    /// [`link_state`] of each NIC at the start.
    states: Vec<Value>,
    peers: Vec<u32>,
    pods: Vec<Pod>,
    removed: HashSet<String>,
    decoys: Vec<(Veth, Value)>,
    squatters: Vec<Squatter>,
    hostile: Vec<Hostile>,
    /// Host links at the start (ifindex → name, mtu, address, up), other than ours.
    host_links: HashMap<u64, Value>,
    pending: Vec<Pending>,
    /// NICs a tenant deleted in its pod: nowhere until their pod is gone, then made anew.
    deleted: BTreeSet<usize>,
    /// The veths tenants made in a nested device's place, by NIC: their MAC and their peer's
    /// ifindex in the pod. Never in the host.
    impostors: Vec<(usize, String, u64)>,
    /// Steps left with the daemon down.
    down: Option<usize>,
    kill_next: bool,
    steps: Vec<String>,
    rng: SplitMix64,
    summary: SoakSummary,
    seq: u64,
    baseline: Option<(usize, u64)>,
    next_footprint: usize,
}

/// Runs the soak; `Ok` with the summary also when a life cycle failed (then `failure` says why).
pub async fn run(opts: &SoakOptions) -> Result<SoakSummary> {
    let start = Instant::now();
    let nics: Vec<Nic> = (0..opts.nics).map(|_| Nic::create()).collect::<Result<_>>()?;
    let before: Vec<Value> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    let states: Vec<Value> = nics
        .iter()
        .map(|n| link_state(&n.name, None))
        .collect::<Result<_>>()?;
    let peers: Vec<u32> = nics
        .iter()
        .map(|n| crate::kernel::Veth::ifindex(&n.veth.b))
        .collect::<Result<_>>()?;
    let node = Node::start(NodeOptions {
        runtime: RuntimeConfig::default(),
        ..NodeOptions::default()
    })
    .await?;
    let host_links = host_link_table()?;
    let mut w = World {
        node,
        nics,
        before,
        states,
        peers,
        pods: Vec::new(),
        removed: HashSet::new(),
        decoys: Vec::new(),
        squatters: Vec::new(),
        hostile: Vec::new(),
        host_links,
        pending: Vec::new(),
        deleted: BTreeSet::new(),
        impostors: Vec::new(),
        down: None,
        kill_next: false,
        steps: Vec::new(),
        rng: SplitMix64(opts.seed),
        summary: SoakSummary {
            seed: opts.seed,
            ..SoakSummary::default()
        },
        seq: 0,
        baseline: None,
        next_footprint: 5,
    };
    let res = w.run(opts).await;
    w.summary.elapsed = start.elapsed();
    w.summary.steps = w.steps.len();
    if let Err(e) = res {
        w.summary.failed += 1;
        let tail: Vec<&String> = w.steps.iter().rev().take(60).collect();
        let mut msg = format!(
            "soak failed (seed {}, step {} of life cycle {}): {e:#}\nlast steps (newest first; replay with --seed {} --lifecycles {}):\n",
            opts.seed,
            w.steps.len(),
            w.summary.passed + 1,
            opts.seed,
            w.summary.passed + 1
        );
        for s in tail {
            let _ = writeln!(msg, "  {s}");
        }
        w.summary.failure = Some(msg);
    }
    w.cleanup().await;
    Ok(w.summary)
}

impl World {
    fn log(&mut self, verbose: bool, s: String) {
        if verbose {
            eprintln!("[soak] {:>5} {s}", self.steps.len());
        }
        self.steps.push(s);
    }

    fn sandbox_id(&mut self) -> String {
        self.seq += 1;
        format!(
            "{:016x}{:016x}{:032x}",
            std::process::id(),
            self.rng.next_u64(),
            self.seq
        )
    }

    async fn run(&mut self, opts: &SoakOptions) -> Result<()> {
        while self.summary.passed < opts.lifecycles {
            self.step(opts).await?;
            if self.down.is_none() {
                self.settle().await.with_context(|| {
                    format!("after step: {}", self.steps.last().cloned().unwrap_or_default())
                })?;
                if self.summary.passed >= self.next_footprint {
                    self.next_footprint = self.summary.passed + 10;
                    self.footprint().await?;
                }
            }
        }
        // Finish: every pod torn down, the daemon up, nothing left.
        if self.down.is_some() {
            self.restart(opts.verbose).await?;
        }
        while !self.pods.is_empty() {
            let i = self.pods.len() - 1;
            self.teardown(i, opts.verbose, true).await?;
            self.settle().await?;
        }
        self.pending.clear();
        self.settle().await?;
        // The host removes its squatters: a record that waits for a NIC's name (home_name_busy, it
        // may outlive its sandbox) ends once the NIC has its own name back.
        while !self.squatters.is_empty() {
            self.unsquat(opts.verbose).await?;
            self.settle().await?;
        }
        let until = Instant::now() + Duration::from_secs(5);
        let mut recs = self.node.records()?;
        while !recs.is_empty() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            recs = self.node.records()?;
        }
        if !recs.is_empty() {
            bail!("records left after every pod and squatter was removed: {recs:?}");
        }
        if !self.node.pins().is_empty() {
            bail!("pins left after every pod was removed: {:?}", self.node.pins());
        }
        self.footprint().await?;
        Ok(())
    }

    fn owned_nics(&self) -> BTreeSet<usize> {
        self.pods
            .iter()
            .flat_map(|p| p.nics.iter().map(|c| c.nic))
            .collect()
    }

    /// One step, chosen from the model's state alone.
    async fn step(&mut self, opts: &SoakOptions) -> Result<()> {
        let v = opts.verbose;
        if let Some(left) = self.down {
            if left == 0 {
                return self.restart(v).await;
            }
            self.down = Some(left - 1);
        }
        // A NIC home under a temporary name (a squatter holds its name) is not handed out again
        // until the squatter is gone: the model does not judge which of the two the claim means.
        let free: Vec<usize> = (0..self.nics.len())
            .filter(|i| !self.owned_nics().contains(i) && !self.squatted(*i) && !self.deleted.contains(i))
            .collect();
        let running: Vec<usize> = (0..self.pods.len())
            .filter(|i| self.pods[*i].current().is_some())
            .collect();
        let with_old: Vec<usize> = (0..self.pods.len())
            .filter(|i| {
                let p = &self.pods[*i];
                p.sandboxes.len() > 1
                    && p.sandboxes[..p.sandboxes.len() - 1]
                        .iter()
                        .any(|s| s.state == SbState::Stopped)
            })
            .collect();
        // Weighted choice among what the state allows.
        let mut menu: Vec<(u64, u8)> = Vec::new();
        if self.pods.len() < opts.max_pods && !free.is_empty() {
            menu.push((6, 0));
        }
        if !running.is_empty() {
            menu.push((6, 1)); // teardown
            menu.push((2, 2)); // re-create the sandbox
            menu.push((1, 3)); // tenant rename / impostor
            menu.push((1, 4)); // host decoy
            menu.push((1, 9)); // tenant flags, txqueuelen, group, altnames
            menu.push((1, 10)); // tenant deletes its device
            if self.squatters.len() < 2 {
                menu.push((1, 11)); // host squatter takes a NIC's host name
            }
            menu.push((1, 14)); // tenant nests its device, an impostor in its place
        }
        if !self.squatters.is_empty() {
            menu.push((1, 12)); // the squatter is deleted
        }
        if self.down.is_some() {
            menu.push((3, 13)); // hostile record file while dranet is down
        }
        if !with_old.is_empty() {
            menu.push((2, 5)); // GC of an old sandbox
        }
        if !self.pending.is_empty() {
            menu.push((2, 6)); // a late hook arrives
        }
        if self.down.is_none() {
            menu.push((1, 7)); // SIGKILL (now, or during the next hook)
        }
        menu.push((1, 8)); // runtime restart
        let total: u64 = menu.iter().map(|(w, _)| w).sum();
        let mut r = self.rng.below(total);
        let mut choice = 0;
        for (w, c) in &menu {
            if r < *w {
                choice = *c;
                break;
            }
            r -= w;
        }
        match choice {
            0 => {
                let n = if free.len() > 1 && self.rng.pct(35) { 2 } else { 1 };
                let mut chosen = Vec::new();
                let mut f = free.clone();
                for _ in 0..n {
                    let k = usize::try_from(self.rng.below(f.len() as u64)).unwrap_or(0);
                    chosen.push(f.remove(k));
                }
                self.new_pod(&chosen, v).await
            }
            1 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.teardown(i, v, false).await
            }
            2 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                if self.pods[i].nics.iter().any(|c| self.deleted.contains(&c.nic)) {
                    // A device of the pod is gone: a new sandbox cannot get it (its
                    // RunPodSandbox fails until the pod is deleted), so kubelet tears it down.
                    return self.teardown(i, v, false).await;
                }
                self.recreate(i, v).await
            }
            3 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.tenant(i, v)
            }
            4 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.decoy(i, v)
            }
            5 => {
                let i = *self.rng.pick(&with_old).context("no old sandbox")?;
                self.gc(i, v).await
            }
            6 => self.late_hook(v).await,
            9 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.tenant_link_state(i, v)
            }
            10 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.tenant_delete(i, v)
            }
            11 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.squat(i, v)
            }
            12 => self.unsquat(v).await,
            14 => {
                let i = *self.rng.pick(&running).context("no running pod")?;
                self.nest(i, v)
            }
            13 => self.hostile_record(v),
            7 => {
                self.summary.kills += 1;
                if self.rng.pct(60) {
                    self.kill_next = true;
                    self.log(v, "arm: SIGKILL dranet during the next hook or teardown".into());
                    Ok(())
                } else {
                    self.log(v, "SIGKILL dranet (idle)".into());
                    self.kill()
                }
            }
            _ => self.runtime_restart(v).await,
        }
    }

    fn kill(&mut self) -> Result<()> {
        self.node.kill()?;
        self.kill_next = false;
        let down = usize::try_from(self.rng.below(3)).unwrap_or(0);
        self.down = Some(down);
        Ok(())
    }

    async fn restart(&mut self, v: bool) -> Result<()> {
        self.sync_runtime_state();
        self.log(
            v,
            "restart dranet (Synchronize with the runtime's sandboxes)".into(),
        );
        self.node.restart().await.context("restarting dranet")?;
        self.down = None;
        self.baseline = None;
        self.next_footprint = self.summary.passed + 3;
        Ok(())
    }

    /// What Synchronize reports: every sandbox the runtime has (not removed).
    fn sync_runtime_state(&self) {
        let pods = self
            .pods
            .iter()
            .flat_map(|p| p.sandboxes.iter())
            .filter(|s| s.state != SbState::Removed)
            .map(|s| s.pb.clone())
            .collect();
        self.node.runtime.set_state(pods, vec![]);
    }

    /// Calls a runtime hook; when a kill is armed, SIGKILLs dranet while the hook runs.
    async fn hook(&mut self, what: &str, pod: &pb::PodSandbox) -> Result<()> {
        let kill = self.kill_next && self.down.is_none();
        let delay = Duration::from_micros(self.rng.below(4000));
        let pid = self.node.daemon_pid();
        let rt = &self.node.runtime;
        let call = async {
            match what {
                "run" => rt.run_pod_sandbox(pod).await,
                "stop" => rt.stop_pod_sandbox(pod).await,
                _ => rt.remove_pod_sandbox(pod).await,
            }
        };
        let killer = async {
            if let (true, Some(pid)) = (kill, pid) {
                tokio::time::sleep(delay).await;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        };
        let (res, ()) = tokio::join!(call, killer);
        if kill {
            self.kill()?;
            return Ok(());
        }
        match res {
            Ok(()) => Ok(()),
            // No plugin connected (dranet down): the runtime goes on without it.
            Err(_) if self.down.is_some() => Ok(()),
            Err(e) if what != "run" => {
                // Stop and Remove errors are only logged by the runtimes.
                tracing::debug!(error = %e, what, "hook error (ignored by the runtime)");
                Ok(())
            }
            Err(e) => Err(e).with_context(|| format!("RunPodSandbox of {}", pod.id)),
        }
    }

    async fn new_pod(&mut self, nics: &[usize], v: bool) -> Result<()> {
        let uid = unique("soak-");
        let claim = Claim::new("default", &format!("claim-{uid}"), &format!("claim-uid-{uid}"));
        let mut cfgs = Vec::new();
        let mut devices = Vec::new();
        for (k, n) in nics.iter().enumerate() {
            let mac = self.rng.pct(40).then(|| {
                let b = self.rng.next_u64().to_le_bytes();
                format!("02:dd:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3])
            });
            let addr = format!("192.168.{}.{}/24", 100 + n, 2 + self.rng.below(200));
            let name = format!("net{k}");
            let mut iface = json!({"name": name, "addresses": [addr]});
            if let Some(m) = &mac {
                iface["hardwareAddr"] = json!(m);
            }
            devices.push((
                dranet::inventory::netdev_device_name(&self.nics[*n].name),
                json!({ "interface": iface }),
            ));
            cfgs.push(NicCfg {
                nic: *n,
                name,
                addr,
                mac,
            });
        }
        self.log(
            v,
            format!("new pod {uid} with NICs {nics:?}: Prepare, then RunPodSandbox"),
        );
        self.node.write_claim(&claim, &uid, &devices)?;
        if self.down.is_some() {
            // kubelet retries Prepare until the plugin is back.
            self.restart(v).await?;
        }
        self.node.prepare(&claim).await.context("NodePrepareResources")?;
        self.pods.push(Pod {
            uid,
            claim,
            nics: cfgs,
            sandboxes: Vec::new(),
            renamed: HashMap::new(),
            impostor: false,
        });
        let i = self.pods.len() - 1;
        self.run_sandbox(i).await
    }

    /// A new sandbox for pod `i` (its first, or a re-creation with attempt + 1).
    async fn run_sandbox(&mut self, i: usize) -> Result<()> {
        let id = self.sandbox_id();
        let ns = PodNetns::create(&unique("dranet-soak-"))?;
        let sb = sandbox_with_id(&self.pods[i].uid, &id, &ns.path);
        self.pods[i].sandboxes.push(Sandbox {
            id,
            pb: sb.clone(),
            netns: Some(ns),
            state: SbState::Running,
            silent: false,
            nested: None,
        });
        self.pods[i].renamed.clear();
        self.pods[i].impostor = false;
        self.sync_runtime_state();
        self.hook("run", &sb).await
    }

    /// The runtime tears down sandbox `s` of pod `i` in `order`; the Stop hook is delivered now,
    /// never, twice or later.
    async fn stop_sandbox(&mut self, i: usize, s: usize, order: Order, v: bool) -> Result<()> {
        let silent = self.pods[i].sandboxes[s].silent;
        let mode = self.rng.below(10);
        let (deliver, twice, late) = match mode {
            0 => (false, false, false),
            1 => (false, false, true),
            2 => (true, true, false),
            _ => (true, false, false),
        };
        let deliver = deliver && !silent;
        let pb = self.pods[i].sandboxes[s].pb.clone();
        let id = self.pods[i].sandboxes[s].id.clone();
        self.log(
            v,
            format!(
                "stop sandbox {} of {} in {order:?} order (Stop hook: {}{}{})",
                short(&id),
                self.pods[i].uid,
                if silent {
                    "none, silent runtime"
                } else if deliver {
                    "sent"
                } else if late {
                    "late"
                } else {
                    "missing"
                },
                if twice { ", twice" } else { "" },
                if self.kill_next { ", SIGKILL during it" } else { "" },
            ),
        );
        self.pods[i].sandboxes[s].state = SbState::Stopped;
        match order {
            Order::Containerd => {
                if deliver {
                    self.hook("stop", &pb).await?;
                    if twice {
                        self.hook("stop", &pb).await?;
                    }
                }
                let gap = self.rng.below(60);
                tokio::time::sleep(Duration::from_millis(gap)).await;
                self.remove_netns(i, s).await?;
            }
            Order::Crio => {
                self.remove_netns(i, s).await?;
                let gap = 1 + self.rng.below(15);
                tokio::time::sleep(Duration::from_millis(gap)).await;
                if deliver {
                    self.hook("stop", &pb).await?;
                    if twice {
                        self.hook("stop", &pb).await?;
                    }
                }
            }
        }
        if late && !silent {
            self.pending.push(Pending {
                pod_uid: self.pods[i].uid.clone(),
                sandbox: id,
                stop: true,
            });
        }
        self.sync_runtime_state();
        Ok(())
    }

    /// The runtime unmounts and unlinks the sandbox's netns (a kill armed lands in the rescue).
    async fn remove_netns(&mut self, i: usize, s: usize) -> Result<()> {
        let kill = self.kill_next && self.down.is_none();
        if let Some(mut ns) = self.pods[i].sandboxes[s].netns.take() {
            ns.remove_crio_style()?;
        }
        self.pods[i].sandboxes[s].nested = None;
        if kill {
            tokio::time::sleep(Duration::from_micros(self.rng.below(3000))).await;
            self.kill()?;
        }
        Ok(())
    }

    /// RemovePodSandbox of sandbox `s` (containerd sends no netns path, CRI-O the dead one).
    async fn remove_sandbox(&mut self, i: usize, s: usize) -> Result<()> {
        let sb = &mut self.pods[i].sandboxes[s];
        sb.state = SbState::Removed;
        let (pb, silent, id) = (sb.pb.clone(), sb.silent, sb.id.clone());
        self.removed.insert(id);
        self.sync_runtime_state();
        if !silent {
            let flavor = if self.rng.pct(50) {
                Flavor::Containerd
            } else {
                Flavor::Crio
            };
            self.node.runtime.set_flavor(flavor);
            self.hook("remove", &pb).await?;
        }
        Ok(())
    }

    async fn teardown(&mut self, i: usize, v: bool, finishing: bool) -> Result<()> {
        let order = if self.rng.pct(50) {
            Order::Containerd
        } else {
            Order::Crio
        };
        if let Some(s) = self.pods[i]
            .sandboxes
            .iter()
            .position(|s| s.state == SbState::Running)
        {
            if !finishing && self.rng.pct(10) {
                // RemovePodSandbox without a Stop: the runtime removes it outright.
                self.log(
                    v,
                    format!("remove sandbox of {} without a Stop", self.pods[i].uid),
                );
                self.pods[i].sandboxes[s].state = SbState::Stopped;
                self.remove_netns(i, s).await?;
            } else {
                self.stop_sandbox(i, s, order, v).await?;
            }
        }
        // kubelet: NodeUnprepareResources once the pod terminated; the GC removes sandboxes.
        let n = self.pods[i].sandboxes.len();
        for s in 0..n {
            if self.pods[i].sandboxes[s].state == SbState::Stopped {
                if let Some(mut ns) = self.pods[i].sandboxes[s].netns.take() {
                    ns.remove_crio_style()?;
                }
                self.pods[i].sandboxes[s].nested = None;
                self.remove_sandbox(i, s).await?;
            }
        }
        if self.down.is_some() {
            self.restart(v).await?;
        }
        let pod = self.pods.remove(i);
        self.log(v, format!("pod {} done: Unprepare", pod.uid));
        self.node
            .unprepare(&pod.claim)
            .await
            .context("NodeUnprepareResources")?;
        self.pending.retain(|p| p.pod_uid != pod.uid);
        // A fresh NIC is allocated only once a slice publishes it as it is (the scheduler
        // sees only published devices): its MAC is set right after it appears.
        for (name, mac) in self.renew_deleted()? {
            self.node
                .wait_published(&name, &mac, Duration::from_secs(15))
                .await?;
        }
        self.summary.passed += 1;
        Ok(())
    }

    async fn recreate(&mut self, i: usize, v: bool) -> Result<()> {
        self.summary.recreations += 1;
        let order = if self.rng.pct(50) {
            Order::Containerd
        } else {
            Order::Crio
        };
        let s = self.pods[i].sandboxes.len() - 1;
        // kubelet: StopPodSandbox(old), then RunPodSandbox(new) under the same UID, attempt + 1.
        self.stop_sandbox(i, s, order, v).await?;
        self.log(
            v,
            format!(
                "re-create: RunPodSandbox of attempt {} of {}",
                s + 1,
                self.pods[i].uid
            ),
        );
        self.run_sandbox(i).await
    }

    async fn gc(&mut self, i: usize, v: bool) -> Result<()> {
        let n = self.pods[i].sandboxes.len();
        let Some(s) = (0..n - 1).find(|s| self.pods[i].sandboxes[*s].state == SbState::Stopped) else {
            return Ok(());
        };
        self.log(
            v,
            format!(
                "GC: RemovePodSandbox of old sandbox {} of {} while the new one runs",
                short(&self.pods[i].sandboxes[s].id),
                self.pods[i].uid
            ),
        );
        self.remove_sandbox(i, s).await
    }

    async fn late_hook(&mut self, v: bool) -> Result<()> {
        let k = usize::try_from(self.rng.below(self.pending.len() as u64)).unwrap_or(0);
        let p = self.pending.remove(k);
        let Some(pod) = self.pods.iter().find(|x| x.uid == p.pod_uid) else {
            return Ok(());
        };
        let Some(sb) = pod.sandboxes.iter().find(|s| s.id == p.sandbox) else {
            return Ok(());
        };
        let pb = sb.pb.clone();
        self.log(
            v,
            format!("late StopPodSandbox of {} ({})", short(&p.sandbox), p.pod_uid),
        );
        if p.stop {
            self.hook("stop", &pb).await
        } else {
            Ok(())
        }
    }

    async fn runtime_restart(&mut self, v: bool) -> Result<()> {
        self.summary.runtime_restarts += 1;
        let silent = self.rng.pct(50);
        self.log(
            v,
            format!(
                "runtime restart ({})",
                if silent {
                    "containerd 2.3.4: no more Stop/Remove for the sandboxes it had"
                } else {
                    "re-register and Synchronize"
                }
            ),
        );
        if silent {
            for s in self.pods.iter_mut().flat_map(|p| p.sandboxes.iter_mut()) {
                if s.state != SbState::Removed {
                    s.silent = true;
                }
            }
            self.pending.clear();
        }
        self.sync_runtime_state();
        if self.down.is_none() {
            self.node.restart_runtime().await?;
        }
        Ok(())
    }

    /// A tenant with NET_ADMIN in the pod: renames the device, then makes an impostor under its
    /// pod-side name with its MAC.
    fn tenant(&mut self, i: usize, v: bool) -> Result<()> {
        self.summary.tenant_actions += 1;
        let pod = &self.pods[i];
        let Some(sb) = pod.current() else { return Ok(()) };
        let Some(ns) = sb.netns.as_ref() else {
            return Ok(());
        };
        let Some(cfg) = pod.nics.first().cloned() else {
            return Ok(());
        };
        let ns_name = ns.name.clone();
        if !pod.renamed.contains_key(&cfg.nic) {
            let new = format!("t{}", self.rng.below(1000));
            self.log(
                v,
                format!("tenant of {} renames {} to {new} in the pod", pod.uid, cfg.name),
            );
            // The model follows the tenant's intent, not the outcome (the device may not be in
            // the pod after a rolled-back attach), so the steps stay the same for a seed.
            let _ = sh(&["ip", "-n", &ns_name, "link", "set", &cfg.name, "name", &new]);
            self.pods[i].renamed.insert(cfg.nic, new);
            return Ok(());
        }
        if !pod.impostor {
            let mac = cfg.mac.clone().unwrap_or_else(|| self.nics[cfg.nic].mac.clone());
            self.log(
                v,
                format!(
                    "tenant of {} makes an impostor {} with MAC {mac} in the pod",
                    pod.uid, cfg.name
                ),
            );
            let peer = format!("i{}", self.rng.below(100_000));
            // Fails when the device is not there under its name to begin with (rolled back).
            if sh(&[
                "ip", "-n", &ns_name, "link", "add", &cfg.name, "type", "veth", "peer", "name", &peer,
            ])
            .is_ok()
            {
                let _ = sh(&[
                    "ip", "-n", &ns_name, "link", "set", &cfg.name, "address", &mac, "up",
                ]);
            }
            self.pods[i].impostor = true;
        }
        Ok(())
    }

    /// A tenant changes what a netns move keeps: flags, txqueuelen, group; adds a free altname
    /// and one naming a host link (another NIC's peer), which would make the move home fail.
    fn tenant_link_state(&mut self, i: usize, v: bool) -> Result<()> {
        let pod = &self.pods[i];
        let Some(ns) = pod.current().and_then(|s| s.netns.as_ref()) else {
            return Ok(());
        };
        let Some(cfg) = pod.nics.first() else {
            return Ok(());
        };
        let ns_name = ns.name.clone();
        let dev = pod.renamed.get(&cfg.nic).unwrap_or(&cfg.name).clone();
        let host_link = self.nics[(cfg.nic + 1) % self.nics.len()].veth.b.clone();
        let free = format!("ta{}", self.rng.below(1_000_000));
        self.summary.tenant_link_state += 1;
        self.summary.tenant_free_altnames += 1;
        self.summary.tenant_colliding_altnames += 1;
        self.log(
            v,
            format!(
                "tenant of {} sets arp off multicast off promisc on allmulticast on txqueuelen 7 group 9 on {dev}, adds altnames {free} and {host_link}",
                pod.uid
            ),
        );
        // The model follows the intent (the device may not be there under that name).
        let _ = sh(&[
            "ip",
            "-n",
            &ns_name,
            "link",
            "set",
            "dev",
            &dev,
            "arp",
            "off",
            "multicast",
            "off",
            "promisc",
            "on",
            "allmulticast",
            "on",
            "txqueuelen",
            "7",
            "group",
            "9",
        ]);
        let _ = sh(&[
            "ip", "-n", &ns_name, "link", "property", "add", "dev", &dev, "altname", &free,
        ]);
        let _ = sh(&[
            "ip", "-n", &ns_name, "link", "property", "add", "dev", &dev, "altname", &host_link,
        ]);
        Ok(())
    }

    /// The first device of pod `i`'s running sandbox, as its tenant sees it; `None` when the pod
    /// has no running netns or that device was deleted.
    fn tenant_target(&self, i: usize) -> Result<Option<TenantTarget>> {
        let pod = &self.pods[i];
        let Some(ns) = pod.current().and_then(|s| s.netns.as_ref()) else {
            return Ok(None);
        };
        let Some(cfg) = pod.nics.first() else {
            return Ok(None);
        };
        if self.deleted.contains(&cfg.nic) {
            return Ok(None);
        }
        let dev = pod.renamed.get(&cfg.nic).unwrap_or(&cfg.name).clone();
        // Only the real device: the link whose peer is this NIC's (an impostor's is not).
        let peer = u64::from(self.peers[cfg.nic]);
        let real = links_json(Some(&ns.name))?.as_array().and_then(|a| {
            a.iter()
                .find(|l| l["ifname"] == dev.as_str() && l["link_index"].as_u64() == Some(peer))
                .cloned()
        });
        Ok(Some(TenantTarget {
            ns_name: ns.name.clone(),
            dev,
            nic: cfg.nic,
            uid: pod.uid.clone(),
            real,
        }))
    }

    /// A tenant deletes its first device in the pod (`ip link del`: a veth NIC goes with its
    /// peer). dranet must end it cleanly: no record or pin of the sandbox outlives it. The NIC is
    /// made anew once its pod is gone ([`World::renew_deleted`]).
    fn tenant_delete(&mut self, i: usize, v: bool) -> Result<()> {
        let Some(TenantTarget {
            ns_name,
            dev,
            nic,
            uid,
            real,
        }) = self.tenant_target(i)?
        else {
            return Ok(());
        };
        let real = real.is_some();
        self.summary.tenant_deleted_devices += 1;
        self.log(
            v,
            format!("tenant of {uid} deletes {dev} in the pod (present: {real})"),
        );
        if real && sh(&["ip", "-n", &ns_name, "link", "del", "dev", &dev]).is_ok() {
            self.deleted.insert(nic);
        }
        Ok(())
    }

    /// Issue 38 (#6): a tenant moves its first device into a netns of its own and makes a veth of
    /// its own in its place, with the device's name, MAC and (pod) ifindex. That veth must never
    /// come home as the device. The device is in a netns the runtime does not know; it dies with
    /// that netns when the sandbox goes (a veth NIC is deleted with its netns), and dranet must
    /// end its record then, as for a device deleted in the pod; a fresh NIC takes its place.
    fn nest(&mut self, i: usize, v: bool) -> Result<()> {
        let Some(TenantTarget {
            ns_name,
            dev,
            nic,
            uid,
            real,
        }) = self.tenant_target(i)?
        else {
            return Ok(());
        };
        let Some((index, mac)) = real.map(|l| {
            (
                l["ifindex"].as_u64().unwrap_or_default().to_string(),
                l["address"].as_str().unwrap_or_default().to_owned(),
            )
        }) else {
            self.log(v, format!("tenant of {uid} would nest {dev}: not in the pod"));
            return Ok(());
        };
        self.summary.nested_impostors += 1;
        let nested = PodNetns::create(&unique("dranet-nest-"))?;
        if sh(&[
            "ip",
            "-n",
            &ns_name,
            "link",
            "set",
            "dev",
            &dev,
            "netns",
            &nested.name,
        ])
        .is_err()
        {
            self.log(v, format!("tenant of {uid} could not nest {dev}"));
            return Ok(());
        }
        self.deleted.insert(nic);
        let peer = unique("dni");
        let made = sh(&[
            "ip", "-n", &ns_name, "link", "add", &dev, "index", &index, "address", &mac, "type", "veth",
            "peer", "name", &peer,
        ])
        .is_ok();
        self.log(
            v,
            format!(
                "tenant of {uid} moves {dev} (pod ifindex {index}) into its own netns; its impostor {dev} with MAC {mac} at that ifindex: {made}"
            ),
        );
        let peer_index = links_json(Some(&ns_name))?.as_array().and_then(|a| {
            a.iter()
                .find(|l| l["ifname"] == peer.as_str())
                .and_then(|l| l["ifindex"].as_u64())
        });
        if let (true, Some(p)) = (made, peer_index) {
            self.impostors.push((nic, mac, p));
        }
        if let Some(sb) = self.pods[i].sandboxes.last_mut() {
            sb.nested = Some(nested);
        }
        Ok(())
    }

    /// NICs deleted in a pod that is gone now are made anew (a new veth pair, its views);
    /// returns their host names and MACs.
    fn renew_deleted(&mut self) -> Result<Vec<(String, String)>> {
        let owned = self.owned_nics();
        let free: Vec<usize> = self
            .deleted
            .iter()
            .copied()
            // Not while a squatter holds its old name: dropping the old NIC's `Veth` guard deletes
            // links by name, and would delete the squatter.
            .filter(|k| !owned.contains(k) && !self.squatted(*k))
            .collect::<BTreeSet<usize>>()
            .into_iter()
            .collect();
        let mut renewed = Vec::new();
        for k in free {
            let nic = Nic::create()?;
            self.before[k] = view(&nic.name, None)?;
            self.states[k] = link_state(&nic.name, None)?;
            self.peers[k] = crate::kernel::Veth::ifindex(&nic.veth.b)?;
            renewed.push((nic.name.clone(), nic.mac.clone()));
            self.nics[k] = nic;
            self.deleted.remove(&k);
            self.impostors.retain(|(n, ..)| *n != k);
        }
        Ok(renewed)
    }

    /// Whether a live squatter holds NIC `k`'s host name.
    fn squatted(&self, k: usize) -> bool {
        self.squatters
            .iter()
            .any(|s| s.veth.is_some() && s.name == self.nics[k].name)
    }

    /// A host link (a new veth) takes the host name of pod `i`'s first NIC while the pod holds
    /// it. The NIC must come home as `dn<ifindex>`; the squatter is never touched.
    fn squat(&mut self, i: usize, v: bool) -> Result<()> {
        let Some(cfg) = self.pods[i].nics.first() else {
            return Ok(());
        };
        let k = cfg.nic;
        let name = self.nics[k].name.clone();
        if self.deleted.contains(&k) || self.squatters.iter().any(|s| s.name == name) {
            return Ok(());
        }
        self.summary.host_squatters += 1;
        let uid = self.pods[i].uid.clone();
        // Fails when the NIC is home under its name (a rolled-back or not yet done attach): the
        // model keeps the intent, so the steps stay the same for a seed.
        let veth = match Veth::create(&name, &unique("dcq")) {
            Ok(veth) => {
                sh(&["ip", "link", "set", &veth.a, "mtu", "1280", "up"])
                    .with_context(|| format!("squatter {name} was renamed away right after it appeared"))?;
                let seen = view(&veth.a, None)?;
                Some((veth, seen))
            }
            Err(_) => None,
        };
        self.log(
            v,
            format!(
                "host link takes the host name {name} of NIC {k} while pod {uid} holds it (created: {})",
                veth.is_some()
            ),
        );
        self.squatters.push(Squatter { name, veth });
        Ok(())
    }

    /// A squatter is deleted: the NIC it blocked must get its own name back.
    async fn unsquat(&mut self, v: bool) -> Result<()> {
        let k = usize::try_from(self.rng.below(self.squatters.len() as u64)).unwrap_or(0);
        let s = self.squatters.remove(k);
        self.summary.squatters_removed += 1;
        self.log(v, format!("host squatter {} deleted", s.name));
        drop(s);
        // A NIC deleted in a pod that is gone waited for this name: made anew now (with dranet
        // down, at the next pod's end).
        if self.down.is_none() {
            for (name, mac) in self.renew_deleted()? {
                self.node
                    .wait_published(&name, &mac, Duration::from_secs(15))
                    .await?;
            }
        }
        Ok(())
    }

    /// While dranet is down: an extra record file in its checkpoint whose pin and netns path are
    /// a netns bind mount the soak owns (`/run/netns/...`, outside `<state-dir>/pins`). dranet
    /// must move it aside as corrupt at the restart and leave the mount alone.
    fn hostile_record(&mut self, v: bool) -> Result<()> {
        let dir = self.node.state_dir().join("checkpoint");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("pod_") && n.ends_with(".json"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        // A real record as the template (its format is the daemon's own).
        let template = names
            .iter()
            .find_map(|n| serde_json::from_slice::<Value>(&std::fs::read(dir.join(n)).ok()?).ok())
            .filter(|t| t.get("pod").is_some());
        let Some(mut rec) = template else {
            self.log(v, "hostile record: no record to copy, none written".into());
            return Ok(());
        };
        if self.hostile.len() >= 2 {
            let old = self.hostile.remove(0);
            remove_corrupt(&dir, &old.file);
            drop(old);
        }
        let netns = PodNetns::create(&unique("dranet-soak-hn"))?;
        let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&netns.path)?);
        let uid = unique("soak-hostile-");
        let sb = self.sandbox_id();
        let path = netns.path.to_string_lossy().into_owned();
        rec["pod"]["pod_uid"] = json!(uid);
        rec["pod"]["sandbox_id"] = json!(sb);
        rec["pod"]["netns_path"] = json!(path);
        // The pin outside the pins dir (the soak's own netns mount), or a pin where dranet's
        // would be and one hostile field of the template's device (a real NIC's identity):
        // refused by what the field holds alone.
        let pin_here = self.node.state_dir().join("pins").join(&sb);
        let what = match self.rng.below(5) {
            0 => {
                rec["pod"]["pin"] = json!(path);
                "pin outside the pins dir".to_owned()
            }
            k => {
                self.summary.hostile_fields += 1;
                rec["pod"]["pin"] = json!(pin_here.to_string_lossy());
                let dev = &mut rec["pod"]["devices"][0];
                match k {
                    1 => dev["pod_ifname"] = json!("../../etc/x"),
                    2 => dev["temp_name"] = json!("dn1/../eth0"),
                    3 => dev["pci_address"] = json!("../../../../sys/kernel"),
                    _ => {
                        let one = dev.clone();
                        rec["pod"]["devices"] = json!(vec![one; 1025]);
                    }
                }
                [
                    "",
                    "pod-side name ../../etc/x",
                    "temporary name with a '/'",
                    "PCI address ../../../../sys/kernel",
                    "1,025 devices",
                ][usize::try_from(k).unwrap_or(0).min(4)]
                .to_owned()
            }
        };
        let file = dranet::state::pod_file_name(&uid, &sb);
        std::fs::write(dir.join(&file), serde_json::to_vec(&rec)?)
            .with_context(|| format!("writing {file}"))?;
        self.summary.hostile_records += 1;
        self.log(
            v,
            format!("hostile record {file} written while dranet is down: {what}; netns path {path}"),
        );
        self.hostile.push(Hostile { netns, ino, file });
        Ok(())
    }

    /// A host link with the claim's MAC or with the device's original MAC.
    fn decoy(&mut self, i: usize, v: bool) -> Result<()> {
        self.summary.tenant_actions += 1;
        if self.decoys.len() >= 4 {
            let (old, _) = self.decoys.remove(0);
            drop(old);
        }
        let cfg = self.pods[i].nics[0].clone();
        let mac = match (&cfg.mac, self.rng.pct(50)) {
            (Some(m), true) => m.clone(),
            _ => self.nics[cfg.nic].mac.clone(),
        };
        let veth = Veth::create_with_mac(&unique("dcy"), &unique("dcz"), &mac)?;
        sh(&["ip", "link", "set", &veth.a, "mtu", "1280", "up"]).with_context(|| {
            format!(
                "host link {} (MAC {mac}) was renamed away right after it appeared",
                veth.a
            )
        })?;
        self.log(v, format!("host link {} created with MAC {mac}", veth.a));
        let seen = view(&veth.a, None)?;
        self.decoys.push((veth, seen));
        Ok(())
    }

    /// Waits for the invariants to hold (the daemon acts asynchronously), or fails with the last
    /// violation.
    async fn settle(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(12);
        loop {
            match self.check() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
            }
        }
    }

    /// The invariants.
    fn check(&self) -> Result<()> {
        // Where each NIC is.
        let mut spaces: Vec<(Option<String>, Value)> = vec![(None, links_json(None)?)];
        for s in self.pods.iter().flat_map(|p| p.sandboxes.iter()) {
            if let Some(ns) = &s.netns {
                spaces.push((Some(ns.name.clone()), links_json(Some(&ns.name))?));
            }
        }
        for (k, nic) in self.nics.iter().enumerate() {
            if self.deleted.contains(&k) {
                continue;
            }
            let owner = self.pods.iter().find(|p| p.nics.iter().any(|c| c.nic == k));
            let current = owner
                .and_then(|p| p.current())
                .and_then(|s| s.netns.as_ref().map(|n| n.name.clone()));
            let found = spaces.iter().find_map(|(ns, links)| {
                links.as_array()?.iter().find_map(|l| {
                    let mine = match ns {
                        None => l["link"] == nic.veth.b.as_str(),
                        Some(_) => {
                            l["link_index"].as_u64() == Some(u64::from(self.peers[k]))
                                && !l["link_netnsid"].is_null()
                        }
                    };
                    mine.then(|| {
                        (
                            ns.clone(),
                            l["ifname"].as_str().unwrap_or_default().to_owned(),
                            l["ifindex"].as_u64().unwrap_or_default(),
                        )
                    })
                })
            });
            let Some((ns, name, ifindex)) = found else {
                bail!("NIC {} is nowhere (host or any live pod netns)", nic.name);
            };
            match ns {
                None => {
                    let now = view(&name, None)?;
                    // A squatter holds its name: home as `dn<ifindex>`, the rest as before.
                    let mut want = self.before[k].clone();
                    if self.squatted(k) {
                        want["ifname"] = json!(format!("dn{ifindex}"));
                    }
                    if now != want {
                        bail!(
                            "NIC {} is in the host but not restored (squatter: {}):\n want: {want}\n now:  {now}",
                            nic.name,
                            self.squatted(k)
                        );
                    }
                    let now = link_state(&name, None)?;
                    if now != self.states[k] {
                        bail!(
                            "NIC {} is in the host but its link state is not restored:\n before: {}\n now:    {now}",
                            nic.name,
                            self.states[k]
                        );
                    }
                }
                Some(ns) => {
                    if Some(&ns) != current.as_ref() {
                        bail!(
                            "NIC {} is in netns {ns}, which is not its pod's current running sandbox ({current:?})",
                            nic.name
                        );
                    }
                    let (p, cfg) = owner
                        .and_then(|p| p.nics.iter().find(|c| c.nic == k).map(|c| (p, c)))
                        .context("owner")?;
                    let want_name = p.renamed.get(&k).unwrap_or(&cfg.name);
                    // A rename the tenant tried while the device was not in the pod yet (dranet
                    // killed in the RunPodSandbox, the device attached late at Synchronize)
                    // did nothing: the claim's name stands.
                    if &name != want_name && name != cfg.name {
                        bail!("NIC {} is in its pod as {name}, not {want_name}", nic.name);
                    }
                    let v = view(&name, Some(&ns))?;
                    let has_addr = v["addrs"].as_array().is_some_and(|a| {
                        a.iter()
                            .any(|x| x.as_str().is_some_and(|x| x.starts_with(&cfg.addr)))
                    });
                    if !has_addr || v["up"] != true {
                        bail!(
                            "NIC {} in its pod is not configured as its claim says: {v}",
                            nic.name
                        );
                    }
                    if let Some(m) = &cfg.mac
                        && v["address"] != m.as_str()
                    {
                        bail!(
                            "NIC {} in its pod has MAC {}, the claim says {m}",
                            nic.name,
                            v["address"]
                        );
                    }
                }
            }
        }
        // No tenant's impostor in the host: a link with its MAC whose peer is its peer in the pod
        // (decoys take NICs' MACs too, with their peers in the host).
        let host = links_json(None)?;
        for (k, mac, peer) in &self.impostors {
            if let Some(l) = host.as_array().and_then(|a| {
                a.iter().find(|l| {
                    l["address"] == mac.as_str()
                        && !l["link_netnsid"].is_null()
                        && l["link_index"].as_u64() == Some(*peer)
                })
            }) {
                bail!(
                    "the tenant's impostor of NIC {} (MAC {mac}) came to the host: {l}",
                    self.nics[*k].name
                );
            }
        }
        // No other host link renamed, moved or reconfigured.
        for (veth, seen) in &self.decoys {
            let now =
                view(&veth.a, None).with_context(|| format!("host link {} is gone or renamed", veth.a))?;
            if &now != seen {
                bail!(
                    "host link {} was reconfigured:\n before: {seen}\n now:    {now}",
                    veth.a
                );
            }
        }
        for (name, seen) in self
            .squatters
            .iter()
            .filter_map(|s| s.veth.as_ref().map(|(_, seen)| (&s.name, seen)))
        {
            let now = view(name, None)
                .with_context(|| format!("host squatter {name} is gone from the host, renamed or moved"))?;
            if &now != seen {
                bail!("host squatter {name} was reconfigured:\n before: {seen}\n now:    {now}");
            }
        }
        // Hostile records: moved aside as corrupt, their netns mount untouched.
        let dir = self.node.state_dir().join("checkpoint");
        for h in &self.hostile {
            if dir.join(&h.file).exists() {
                bail!("hostile record {} is still in the checkpoint", h.file);
            }
            let aside = std::fs::read_dir(&dir)?.filter_map(|e| e.ok()).any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}.corrupt-", h.file))
            });
            if !aside {
                bail!("hostile record {} was not moved aside as corrupt", h.file);
            }
            let ino = std::fs::metadata(&h.netns.path)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .with_context(|| format!("netns {} of a hostile record", h.netns.path.display()))?;
            let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
            let mounted = mounts
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(h.netns.path.to_string_lossy().as_ref()));
            if ino != h.ino || !mounted {
                bail!(
                    "netns {} named by a hostile record was unmounted or replaced (mounted: {mounted}, inode {} -> {ino})",
                    h.netns.path.display(),
                    h.ino
                );
            }
        }
        let table = host_link_table()?;
        for (idx, was) in &self.host_links {
            if let Some(now) = table.get(idx)
                && now != was
            {
                bail!("host link {idx} changed: {was} -> {now}");
            }
        }
        // No record or pin of a sandbox the runtime removed, but for a record that keeps a NIC
        // home under its temporary name while a squatter holds its own (to rename it back).
        let recs = self.node.records()?;
        let busy = self.name_busy_records()?;
        for (uid, sb) in &recs {
            if self.removed.contains(sb) && !busy.contains(sb) {
                bail!(
                    "record of removed sandbox {} of {uid} still in the checkpoint",
                    short(sb)
                );
            }
        }
        for pin in self.node.pins() {
            let name = pin
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if self.removed.contains(&name) {
                bail!("pin of removed sandbox {} still there", short(&name));
            }
        }
        let live = self
            .pods
            .iter()
            .flat_map(|p| p.sandboxes.iter())
            .filter(|s| s.state != SbState::Removed)
            .count();
        if recs.len() > live + busy.len() {
            bail!(
                "{} records for {live} sandboxes the runtime has: {recs:?}",
                recs.len()
            );
        }
        Ok(())
    }

    /// Sandboxes whose record holds a device `home_name_busy` under a temporary name while a live
    /// squatter holds its own name, every other device of it home or gone.
    fn name_busy_records(&self) -> Result<HashSet<String>> {
        let squatted: HashSet<&str> = self
            .squatters
            .iter()
            .filter(|s| s.veth.is_some())
            .map(|s| s.name.as_str())
            .collect();
        let cp = self.node.checkpoint()?;
        Ok(cp["pods"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
            .filter(|r| {
                let devs = r["devices"].as_array().cloned().unwrap_or_default();
                devs.iter().any(|d| {
                    d["state"] == "home_name_busy"
                        && d["snapshot"]["name"]
                            .as_str()
                            .is_some_and(|n| squatted.contains(n))
                }) && devs
                    .iter()
                    .all(|d| matches!(d["state"].as_str(), Some("home" | "home_name_busy" | "gone")))
            })
            .filter_map(|r| r["sandbox_id"].as_str().map(str::to_owned))
            .collect())
    }

    /// Fds and RSS of the daemon stay bounded (per process: a restart takes a new baseline).
    async fn footprint(&mut self) -> Result<()> {
        if !self.node.is_running() {
            return Ok(());
        }
        let fds = self.node.daemon_fds_settled().await?;
        let rss = self.node.daemon_rss_kib()?;
        match self.baseline {
            None => {
                self.baseline = Some((fds, rss));
                self.summary.fds.0 = fds;
                self.summary.rss_kib.0 = rss;
            }
            Some((f0, r0)) => {
                // Each live pod holds its pin and an rtnetlink socket in its netns.
                let allowance = 2 * self.pods.len() + 8;
                if fds > f0 + allowance {
                    bail!(
                        "daemon fds grew {f0} -> {fds}: {:?}",
                        self.node.daemon_fd_kinds()?
                    );
                }
                if rss > r0 + 24 * 1024 {
                    bail!("daemon RSS grew {r0} -> {rss} KiB");
                }
            }
        }
        self.summary.fds.1 = fds;
        self.summary.rss_kib.1 = rss;
        Ok(())
    }

    async fn cleanup(&mut self) {
        for p in &mut self.pods {
            for s in &mut p.sandboxes {
                if let Some(mut ns) = s.netns.take() {
                    let _ = ns.remove_crio_style();
                }
                s.nested = None;
            }
        }
        self.decoys.clear();
        self.squatters.clear();
        let dir = self.node.state_dir().join("checkpoint");
        for h in self.hostile.drain(..) {
            remove_corrupt(&dir, &h.file);
        }
        let _ = self.node.stop();
    }
}

/// Removes the files a hostile record `file` was moved aside to.
fn remove_corrupt(dir: &std::path::Path, file: &str) {
    let prefix = format!("{file}.corrupt-");
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn short(id: &str) -> &str {
    id.get(id.len().saturating_sub(8)..).unwrap_or(id)
}

/// `ip -j -d link show` of the host (`None`) or of a named netns.
fn links_json(ns: Option<&str>) -> Result<Value> {
    let out = match ns {
        None => sh(&["ip", "-j", "-d", "link", "show"])?,
        Some(n) => sh(&["ip", "-n", n, "-j", "-d", "link", "show"])?,
    };
    Ok(serde_json::from_str(&out)?)
}

/// The host's links other than the test objects of this workspace (names starting `dr`, `dc`,
/// `dn`, `ob`), by ifindex: name, MTU, MAC, admin state.
fn host_link_table() -> Result<HashMap<u64, Value>> {
    let links = links_json(None)?;
    Ok(links
        .as_array()
        .into_iter()
        .flatten()
        .filter(|l| {
            let n = l["ifname"].as_str().unwrap_or_default();
            !(n.starts_with("dr") || n.starts_with("dc") || n.starts_with("dn") || n.starts_with("ob"))
        })
        .filter_map(|l| {
            let up = l["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP"));
            Some((
                l["ifindex"].as_u64()?,
                json!({"name": l["ifname"], "mtu": l["mtu"], "address": l["address"], "up": up}),
            ))
        })
        .collect())
}
