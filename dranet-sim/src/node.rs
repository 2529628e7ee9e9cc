//! Node simulator: the real `dranet run` binary between a simulated kubelet (registration +
//! DRA gRPC over unix sockets, claims from local files) and a simulated runtime (the NRI
//! harness), with real pod netns and veth pairs standing in for NICs. Test support only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dranet::nri::pb::nri as pb;
use serde_json::json;

use crate::kernel::{dranet_bin, unique};
use crate::kubelet::{Claim, KubeletSim, RegisteredPlugin};
use crate::nri_runtime::{NriRuntime, RuntimeConfig};

/// How long a daemon start may take (registration, the runtime's handshake, "dranet ready").
/// Well under a second on this machine; the qemu TCG kernel matrix runs the same start with a
/// start-up reconcile of several devices 20–50× slower.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How to run the node.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub runtime: RuntimeConfig,
    /// Load the eBPF probes in the daemon.
    pub probes: bool,
    /// Extra `dranet run` arguments.
    pub extra_args: Vec<String>,
    /// Kube mode: `--kubeconfig` this file (an API server, e.g. [`crate::apiserver::ApiServer`])
    /// instead of `--claims-dir` / `--slices-dir` (embedded mode, the default).
    pub kubeconfig: Option<PathBuf>,
    /// `--bind-address` of `/healthz`, `/readyz`, `/metrics` (default `127.0.0.1:0`).
    pub bind_address: String,
    /// Replaces the node-identity arguments (`--node-name sim-node --filter "" --bind-address
    /// <bind_address>`), e.g. with upstream dranet's spelling of them.
    pub node_args: Option<Vec<String>>,
    /// Run the daemon with this soft *and* hard `RLIMIT_NOFILE` (it raises its soft limit to
    /// the hard one, so both are set).
    pub nofile_limit: Option<u64>,
    /// The daemon's stderr goes to `<dir>/daemon.log` (appended across restarts; read it with
    /// [`Node::log`]) instead of the test's.
    pub capture_log: bool,
    /// Run the daemon in this named netns (`ip netns exec <name>`: its links and its own sysfs
    /// are the node's; the unix sockets of kubelet and the runtime are reached by path as ever).
    /// The daemon's pid is still [`Node::daemon_pid`] (`ip` execs it).
    pub netns: Option<String>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            runtime: RuntimeConfig::default(),
            probes: true,
            extra_args: Vec::new(),
            kubeconfig: None,
            bind_address: "127.0.0.1:0".to_owned(),
            node_args: None,
            nofile_limit: None,
            capture_log: false,
            netns: None,
        }
    }
}

/// A running simulated node.
pub struct Node {
    pub dir: PathBuf,
    pub runtime: NriRuntime,
    pub kubelet: KubeletSim,
    pub plugin: Option<RegisteredPlugin>,
    opts: NodeOptions,
    child: Option<Child>,
    sessions: u64,
}

/// How long the daemon's thread count must hold still for [`Node::daemon_idle_rss_kib`].
pub const IDLE_FOR: Duration = Duration::from_millis(1500);

impl Node {
    /// Starts the runtime harness, then `dranet run`, registers it with the kubelet simulator
    /// and waits until the runtime saw it register.
    pub async fn start(opts: NodeOptions) -> Result<Self> {
        let dir = std::env::temp_dir().join(unique("dranet-node-"));
        std::fs::create_dir_all(dir.join("claims"))?;
        let runtime = NriRuntime::start(dir.join("nri.sock"), opts.runtime.clone())?;
        let kubelet = KubeletSim::new(dir.join("kubelet"));
        let mut node = Self {
            dir,
            runtime,
            kubelet,
            plugin: None,
            opts,
            child: None,
            sessions: 0,
        };
        node.spawn().await?;
        Ok(node)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    async fn spawn(&mut self) -> Result<()> {
        let bin = dranet_bin()?;
        let sessions_before = self.runtime.sessions();
        // kubelet reacts to the *creation* of a registration socket: forget a killed daemon's
        // stale one, so we wait for the new process to create its own.
        if let Ok(rd) = std::fs::read_dir(self.kubelet.registry_dir()) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let mut cmd = match &self.opts.netns {
            None => Command::new(&bin),
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
        };
        // As the image runs it (deploy/Dockerfile); a caller's own GLIBC_TUNABLES wins.
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            cmd.env("GLIBC_TUNABLES", dranet::sys::os::MALLOC_TUNABLES);
        }
        let node_args = self.opts.node_args.clone().unwrap_or_else(|| {
            [
                "--node-name",
                "sim-node",
                "--filter",
                "",
                "--bind-address",
                &self.opts.bind_address,
            ]
            .map(str::to_owned)
            .to_vec()
        });
        // No cloud detection: tests never reach off the machine. First, so a caller's own hint
        // (a later one) wins.
        cmd.arg("run")
            .arg("--cloud-provider-hint=NONE")
            .args(node_args)
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--kubelet-root-dir")
            .arg(self.dir.join("kubelet"))
            .arg("--nri-socket")
            .arg(self.dir.join("nri.sock"));
        match &self.opts.kubeconfig {
            None => {
                cmd.arg("--slices-dir")
                    .arg(self.dir.join("slices"))
                    .arg("--claims-dir")
                    .arg(self.dir.join("claims"));
            }
            Some(kc) => {
                cmd.arg("--kubeconfig").arg(kc);
                // Nothing from the environment may pick another place or route: the API server
                // is the one in the kubeconfig, reached directly.
                for v in [
                    "DRANET_SLICES_DIR",
                    "DRANET_CLAIMS_DIR",
                    "HTTPS_PROXY",
                    "https_proxy",
                    "HTTP_PROXY",
                    "http_proxy",
                ] {
                    cmd.env_remove(v);
                }
            }
        }
        cmd.args(&self.opts.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("DRANET_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if self.opts.capture_log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.join("daemon.log"))?;
            cmd.stderr(f);
        }
        if !self.opts.probes {
            cmd.arg("--no-probes");
        }
        if let Some(n) = self.opts.nofile_limit {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: the closure runs in the child between fork and exec; it only calls
            // setrlimit (async-signal-safe) on a value it owns and allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    // SAFETY: `lim` is a valid rlimit for the duration of the call.
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        // Awaited (within START_TIMEOUT) once kubelet and the runtime have seen the daemon.
        let ready = tokio::spawn(crate::fixtures::until_ready(stdout, 3 * START_TIMEOUT));
        self.child = Some(child);
        self.plugin = Some(self.kubelet.register_when_ready(START_TIMEOUT).await?);
        // One more handshake than the runtime has seen so far (a runtime restart in between
        // counts too).
        self.sessions = self.sessions.max(sessions_before) + 1;
        self.runtime.wait_ready(self.sessions, START_TIMEOUT).await?;
        if !tokio::time::timeout(START_TIMEOUT, ready)
            .await
            .context("daemon never printed ready")???
        {
            bail!("the daemon exited before it was ready");
        }
        Ok(())
    }

    /// The runtime restarts: it drops the plugin's connection; the plugin reconnects, registers
    /// again and gets a Synchronize of what [`NriRuntime::set_state`] says the runtime has.
    pub async fn restart_runtime(&mut self) -> Result<()> {
        let before = self.runtime.sessions();
        self.runtime.disconnect();
        self.runtime
            .wait_ready(before + 1, Duration::from_secs(20))
            .await?;
        self.sessions = before + 1;
        Ok(())
    }

    /// Whether the daemon process is running (not killed or stopped by the test).
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILLs the daemon (no cleanup of any kind).
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        self.plugin = None;
        Ok(())
    }

    /// SIGTERM, wait for the graceful exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id())?);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
            c.wait()?;
        }
        self.plugin = None;
        Ok(())
    }

    /// SIGSTOPs the daemon: a stall (its sockets stay open, nothing answers, so the runtime's
    /// next request times out and the runtime drops it). [`Node::resume`] ends it.
    pub fn pause(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// SIGCONTs a daemon stalled by [`Node::pause`], then waits until it completed a new
    /// handshake with the runtime (it reconnects when the runtime dropped it meanwhile).
    pub async fn resume(&mut self) -> Result<()> {
        let before = self.runtime.sessions();
        self.signal(nix::sys::signal::Signal::SIGCONT)?;
        self.runtime
            .wait_ready(before + 1, START_TIMEOUT)
            .await
            .context("the daemon did not reconnect after SIGCONT")?;
        self.sessions = before + 1;
        Ok(())
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let c = self.child.as_ref().context("the daemon is not running")?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(c.id())?), sig)?;
        Ok(())
    }

    /// Starts the daemon again (after [`Node::kill`] or [`Node::stop`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn().await
    }

    /// Writes an allocated ResourceClaim for `pod_uid` with `devices` (slice device name, config)
    /// where the daemon reads claims (`--claims-dir`), as the scheduler would have allocated it.
    pub fn write_claim(
        &self,
        claim: &Claim,
        pod_uid: &str,
        devices: &[(String, serde_json::Value)],
    ) -> Result<()> {
        let obj = claim_object(claim, pod_uid, devices);
        let dir = self.dir.join("claims").join(&claim.namespace);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join(format!("{}.json", claim.name)),
            serde_json::to_vec_pretty(&obj)?,
        )?;
        Ok(())
    }

    /// Where the daemon writes its Kubernetes events in embedded mode (no API server), one JSON
    /// object per line.
    #[must_use]
    pub fn events_path(&self) -> PathBuf {
        self.dir.join("claims/status/events.jsonl")
    }

    /// The events the daemon wrote so far (embedded mode), empty when none.
    #[must_use]
    pub fn events(&self) -> String {
        std::fs::read_to_string(self.events_path()).unwrap_or_default()
    }

    /// Where the daemon writes a claim's device status in embedded mode (no API server).
    pub fn claim_status_path(&self, claim: &Claim) -> PathBuf {
        self.dir
            .join("claims/status")
            .join(&claim.namespace)
            .join(format!("{}.json", claim.name))
    }

    /// The claim's device status the daemon applied (its server-side apply body), waiting up to
    /// `timeout` for it: the daemon writes it in the background after RunPodSandbox.
    pub async fn claim_status(&self, claim: &Claim, timeout: Duration) -> Result<serde_json::Value> {
        let path = self.claim_status_path(claim);
        let start = std::time::Instant::now();
        loop {
            if let Ok(b) = std::fs::read(&path) {
                return Ok(serde_json::from_slice(&b)?);
            }
            if start.elapsed() > timeout {
                bail!("no claim status at {} after {timeout:?}", path.display());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// NodePrepareResources for one claim; fails on a per-claim error.
    pub async fn prepare(&self, claim: &Claim) -> Result<()> {
        let plugin = self.plugin.as_ref().context("daemon not registered")?;
        let r = plugin.prepare(std::slice::from_ref(claim)).await?;
        let res = r.get(&claim.uid).context("no result for the claim")?;
        if !res.error.is_empty() {
            bail!("prepare {}: {}", claim.name, res.error);
        }
        Ok(())
    }

    /// NodeUnprepareResources for one claim.
    pub async fn unprepare(&self, claim: &Claim) -> Result<()> {
        let plugin = self.plugin.as_ref().context("daemon not registered")?;
        let r = plugin.unprepare(std::slice::from_ref(claim)).await?;
        if let Some(e) = r.get(&claim.uid).filter(|e| !e.is_empty()) {
            bail!("unprepare {}: {e}", claim.name);
        }
        Ok(())
    }

    /// Open file descriptors of the daemon.
    pub fn daemon_fds(&self) -> Result<usize> {
        let pid = self.child.as_ref().context("daemon not running")?.id();
        Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
    }

    /// The daemon's fd count once it is quiet: the same count five times 100 ms apart (or, if it
    /// never holds still within 3 s, the lowest count seen). Between operations the daemon
    /// briefly holds extra fds (a netlink socket of an operation, a pod netns, a connection the
    /// peer closed but the server has not reaped yet); a snapshot at such a moment is not a leak.
    pub async fn daemon_fds_settled(&self) -> Result<usize> {
        let start = std::time::Instant::now();
        let (mut last, mut same, mut lowest) = (self.daemon_fds()?, 1, usize::MAX);
        while same < 5 && start.elapsed() < Duration::from_secs(3) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = self.daemon_fds()?;
            lowest = lowest.min(n);
            same = if n == last { same + 1 } else { 1 };
            last = n;
        }
        Ok(if same >= 5 { last } else { lowest })
    }

    /// The daemon's thread count (`Threads:` of `/proc/PID/status`).
    pub fn daemon_threads(&self) -> Result<usize> {
        self.daemon_status_field("Threads:")
    }

    /// A number from the daemon's `/proc/PID/status` (`field` with its colon; a `kB` unit is
    /// dropped).
    fn daemon_status_field<T: std::str::FromStr>(&self, field: &str) -> Result<T> {
        let pid = self.child.as_ref().context("daemon not running")?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("{field} in /proc/{pid}/status"))
    }

    /// The daemon's RSS (KiB) once it is idle after a burst: its fds settled
    /// ([`Node::daemon_fds_settled`]), then its thread count unchanged for [`IDLE_FOR`] (or, if it
    /// never holds still within 8 s, whatever it is then). A burst's blocking-pool threads leave
    /// 1 s after their last job and a heap trim follows them 250 ms later; a reading before that
    /// measures the burst's transient, not what the daemon keeps.
    pub async fn daemon_idle_rss_kib(&self) -> Result<u64> {
        self.daemon_fds_settled().await?;
        let start = std::time::Instant::now();
        let (mut last, mut since) = (self.daemon_threads()?, std::time::Instant::now());
        while since.elapsed() < IDLE_FOR && start.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = self.daemon_threads()?;
            if n != last {
                (last, since) = (n, std::time::Instant::now());
            }
        }
        self.daemon_rss_kib()
    }

    /// What the daemon's fds point at, by kind (`socket`, `anon_inode:[eventfd]`, a path...),
    /// with counts: printed when a soak finds more fds than it started with.
    pub fn daemon_fd_kinds(&self) -> Result<std::collections::BTreeMap<String, usize>> {
        let pid = self.child.as_ref().context("daemon not running")?.id();
        let mut kinds = std::collections::BTreeMap::new();
        for e in std::fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
            let Ok(t) = std::fs::read_link(e.path()) else {
                continue;
            };
            let t = t.to_string_lossy().into_owned();
            // `socket:[1234]` / `net:[4026...]`: the kind, not the inode.
            let kind = match t.split_once(":[") {
                Some((k, _)) if !t.starts_with("anon_inode") => k.to_string(),
                _ => t,
            };
            *kinds.entry(kind).or_insert(0) += 1;
        }
        Ok(kinds)
    }

    /// Pod network namespaces the daemon holds open by fd (a netlink socket's netns is not
    /// visible here; pins are checked separately).
    pub fn daemon_netns_fds(&self) -> Result<usize> {
        let pid = self.child.as_ref().context("daemon not running")?.id();
        // The daemon's own (host) netns handle does not count.
        let host = std::fs::read_link(format!("/proc/{pid}/ns/net"))?;
        Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter(|t| t.to_string_lossy().starts_with("net:[") && *t != host)
            .count())
    }

    /// Resident memory of the daemon, KiB.
    pub fn daemon_rss_kib(&self) -> Result<u64> {
        self.daemon_status_field("VmRSS:")
    }

    /// The daemon's process id, while it runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the daemon process is still running (not exited).
    pub fn daemon_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// What the daemon logged so far ([`NodeOptions::capture_log`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// Waits until the daemon's published ResourceSlices (`--slices-dir`, embedded mode) list a
    /// device for host link `ifname` with MAC `mac`: the scheduler allocates only what a slice
    /// publishes, so a NIC that just appeared (and whose MAC was set right after, as udev does)
    /// is prepared only once dranet has seen it as it is.
    pub async fn wait_published(&self, ifname: &str, mac: &str, within: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if self.published(ifname, mac) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("{ifname} (MAC {mac}) is not in a published ResourceSlice after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn published(&self, ifname: &str, mac: &str) -> bool {
        let Ok(dir) = std::fs::read_dir(self.dir.join("slices")) else {
            return false;
        };
        let attr = |d: &serde_json::Value, k: &str| {
            d["attributes"][k]["string"].as_str().map(str::to_ascii_lowercase)
        };
        dir.flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .any(|s| {
                s["spec"]["devices"].as_array().is_some_and(|devs| {
                    devs.iter().any(|d| {
                        attr(d, "dra.net/ifName").as_deref() == Some(&ifname.to_ascii_lowercase())
                            && attr(d, "dra.net/mac").as_deref() == Some(&mac.to_ascii_lowercase())
                    })
                })
            })
    }

    /// Pins currently held in the state dir.
    pub fn pins(&self) -> Vec<PathBuf> {
        dranet::sys::netns::Pin::list(&self.state_dir().join("pins")).unwrap_or_default()
    }

    /// Loses the daemon's state as a wiped or corrupt `--state-dir` would: every pin is
    /// unmounted (the pod netns stay alive through the runtime's own bind mounts) and the
    /// directory removed. The daemon must not be running ([`Node::kill`] first).
    pub fn wipe_state(&self) -> Result<()> {
        if self.child.is_some() {
            bail!("wipe_state while the daemon runs");
        }
        for pin in self.pins() {
            // A pin file that is no mount point (EINVAL) has nothing to unmount; one still
            // mounted makes the removal below fail with EBUSY.
            let _ = nix::mount::umount2(&pin, nix::mount::MntFlags::MNT_DETACH);
        }
        match std::fs::remove_dir_all(self.state_dir()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The daemon's checkpoint as it is on disk now (read as JSON, so any format shows): the
    /// single `state.json` of formats 1 and 2, else the record files of format 3
    /// (`checkpoint/plan_*.json`, `checkpoint/pod_*.json`) gathered into one document of the same
    /// shape (`plans` by pod UID, `pods` by `<pod-uid>/<sandbox-id>`).
    pub fn checkpoint(&self) -> Result<serde_json::Value> {
        match std::fs::read(self.state_dir().join("state.json")) {
            Ok(b) => return Ok(serde_json::from_slice(&b)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let dir = self.state_dir().join("checkpoint");
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(json!({})),
            Err(e) => return Err(e.into()),
        };
        let mut plans = serde_json::Map::new();
        let mut pods = serde_json::Map::new();
        for e in entries {
            let name = e?.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".json") {
                continue;
            }
            let b = match std::fs::read(dir.join(&name)) {
                Ok(b) => b,
                // Removed by a save since the listing.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            let v: serde_json::Value = serde_json::from_slice(&b)?;
            if let Some(plan) = v.get("plan") {
                let uid = plan["pod_uid"].as_str().unwrap_or_default().to_owned();
                plans.insert(uid, plan.clone());
            } else if let Some(pod) = v.get("pod") {
                let key = format!(
                    "{}/{}",
                    pod["pod_uid"].as_str().unwrap_or_default(),
                    pod["sandbox_id"].as_str().unwrap_or_default()
                );
                pods.insert(key, pod.clone());
            }
        }
        Ok(json!({"version": 3, "plans": plans, "pods": pods}))
    }

    /// The sandbox records of the checkpoint: (pod UID, sandbox id or "" when the format has
    /// none).
    pub fn records(&self) -> Result<Vec<(String, String)>> {
        let cp = self.checkpoint()?;
        Ok(cp["pods"]
            .as_object()
            .map(|m| {
                m.values()
                    .map(|r| {
                        (
                            r["pod_uid"].as_str().unwrap_or_default().to_owned(),
                            r["sandbox_id"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Runs `dranet <args>` against this node's state dir (`--state-dir` appended).
    pub fn cli(&self, args: &[&str]) -> Result<std::process::Output> {
        Ok(Command::new(dranet_bin()?)
            .args(args)
            .arg("--state-dir")
            .arg(self.state_dir())
            .output()?)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.kill();
        // Bring anything still out home and drop the pins before removing the directory.
        if let Ok(bin) = dranet_bin() {
            let _ = Command::new(bin)
                .arg("release-all")
                .arg("--state-dir")
                .arg(self.state_dir())
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The ResourceClaim [`Node::write_claim`] writes: allocated on `sim-node` to `devices` (slice
/// device name, opaque config), one request `nic<i>` each, reserved for the pod `pod_uid`.
#[must_use]
pub fn claim_object(
    claim: &Claim,
    pod_uid: &str,
    devices: &[(String, serde_json::Value)],
) -> serde_json::Value {
    let results: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(i, (d, _))| {
            json!({"request": format!("nic{i}"), "driver": "dra.net", "pool": "sim-node", "device": d})
        })
        .collect();
    let config: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(i, (_, c))| {
            json!({
                "source": "FromClaim",
                "requests": [format!("nic{i}")],
                "opaque": {"driver": "dra.net", "parameters": c}
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {
            "allocation": {"devices": {"results": results, "config": config}},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{pod_uid}"), "uid": pod_uid}]
        }
    })
}

/// A pod sandbox as the runtime reports it (sandbox id `sb-<uid>`).
#[must_use]
pub fn sandbox(uid: &str, netns: &Path) -> pb::PodSandbox {
    sandbox_with_id(uid, &format!("sb-{uid}"), netns)
}

/// A runtime-style sandbox id (64 hex digits), unique on this machine: the process id and a
/// counter.
#[must_use]
pub fn sandbox_id() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{:032x}{n:032x}", std::process::id())
}

/// A sandbox of pod `uid` with the runtime's id `id`: kubelet re-creates a pod's sandbox under
/// the same UID with a new id.
#[must_use]
pub fn sandbox_with_id(uid: &str, id: &str, netns: &Path) -> pb::PodSandbox {
    pb::PodSandbox {
        id: id.into(),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        namespace: "default".into(),
        linux: Some(pb::LinuxPodSandbox {
            namespaces: vec![pb::LinuxNamespace {
                r#type: "network".into(),
                path: netns.display().to_string(),
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `GET path` from the daemon's HTTP endpoint at `addr`: the status code and the body.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .context("no answer within 5 s")??;
    let text = String::from_utf8_lossy(&buf);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

/// A free TCP port on 127.0.0.1 (bound and released: good enough for a test that binds it
/// right after).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
