//! A node with a real runtime: the `dranet run` binary between the kubelet simulator (plugin
//! registration, DRA gRPC, claims from local files) and a real containerd
//! ([`crate::containerd::Containerd`]) whose NRI socket it connects to. Test support only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::containerd::{Containerd, Runtime, SANDBOX_IMAGE};
use crate::cri::{Cri, PodIdentity};
use crate::fixtures::pod_claim;
use crate::kernel::{dranet_bin, unique};
use crate::kubelet::{Claim, KubeletSim, RegisteredPlugin};

/// How long a daemon start may take (registration with kubelet and containerd, "dranet ready").
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// dranet + kubelet simulator + a real containerd.
pub struct RealNode {
    pub dir: PathBuf,
    pub kubelet: KubeletSim,
    pub plugin: Option<RegisteredPlugin>,
    /// The daemon's metrics port on 127.0.0.1 (the same across restarts).
    pub metrics_port: u16,
    child: Option<Child>,
    /// Declared last: dropped after the daemon (its pins released) is gone.
    pub containerd: Containerd,
}

impl RealNode {
    /// Starts containerd `runtime`, then dranet on its NRI socket, registered with the kubelet
    /// simulator.
    pub async fn start(runtime: &Runtime) -> Result<Self> {
        Self::start_with(runtime, "").await
    }

    /// [`RealNode::start`] with `nri_extra` added to containerd's NRI config
    /// ([`crate::containerd::config_text_with`]).
    pub async fn start_with(runtime: &Runtime, nri_extra: &str) -> Result<Self> {
        let containerd = Containerd::start_with(runtime, nri_extra).await?;
        let dir = std::env::temp_dir().join(unique("dranet-rnode-"));
        std::fs::create_dir_all(dir.join("claims"))?;
        let kubelet = KubeletSim::new(dir.join("kubelet"));
        let mut node = Self {
            dir,
            kubelet,
            plugin: None,
            metrics_port: crate::node::free_port()?,
            child: None,
            containerd,
        };
        node.spawn().await?;
        Ok(node)
    }

    /// The CRI client (kubelet's side) on containerd's socket; the pause image made here is
    /// imported first (`ctr -n k8s.io images import`), as no registry is reachable.
    pub async fn cri(&self) -> Result<Cri> {
        let images = crate::containerd::runtimes_dir().join("images");
        let bin = crate::oci::build_pause(&images)?;
        let archive = self.dir.join("pause.oci.tar");
        std::fs::write(&archive, crate::oci::pause_archive(&bin, SANDBOX_IMAGE)?)?;
        let archive = archive.display().to_string();
        self.containerd
            .ctr(&["-n", "k8s.io", "images", "import", &archive])
            .context("importing the pause image")?;
        let cri = Cri::connect(
            &self.containerd.layout.address(),
            self.dir.join("pods"),
            self.containerd.layout.cgroup_parent(),
        )
        .await?;
        // CRI learns of the imported image from containerd's events: wait until it sees it.
        let start = std::time::Instant::now();
        while !cri.has_image(SANDBOX_IMAGE).await? {
            if start.elapsed() > Duration::from_secs(10) {
                bail!(
                    "CRI never saw the imported {SANDBOX_IMAGE}: {:?}",
                    cri.image_tags().await?
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(cri)
    }

    #[must_use]
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }

    /// The daemon's log (stderr, appended across restarts).
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("daemon.log")
    }

    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    async fn spawn(&mut self) -> Result<()> {
        let bin = dranet_bin()?;
        if let Ok(rd) = std::fs::read_dir(self.kubelet.registry_dir()) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(&bin);
        if std::env::var_os("GLIBC_TUNABLES").is_none() {
            cmd.env("GLIBC_TUNABLES", dranet::sys::os::MALLOC_TUNABLES);
        }
        cmd.args(["run", "--node-name", "sim-node", "--filter", "", "--bind-address"])
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--kubelet-root-dir")
            .arg(self.dir.join("kubelet"))
            .arg("--nri-socket")
            .arg(self.containerd.layout.nri_socket())
            .arg("--slices-dir")
            .arg(self.dir.join("slices"))
            .arg("--claims-dir")
            .arg(self.dir.join("claims"))
            .env(
                "RUST_LOG",
                // The NRI requests at debug: they show the dialect the runtime speaks.
                std::env::var("DRANET_NODE_LOG").unwrap_or_else(|_| "info,dranet::nri::service=debug".into()),
            )
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        let ready = tokio::spawn(crate::fixtures::until_ready(stdout, 2 * START_TIMEOUT));
        self.child = Some(child);
        // A daemon that never registers (seen once in CI with 8 tests side by side) says why in
        // its log.
        let plugin = self
            .kubelet
            .register_when_ready(START_TIMEOUT)
            .await
            .with_context(|| {
                format!(
                    "the daemon did not register with kubelet; its log:\n{}",
                    self.log()
                )
            })?;
        self.plugin = Some(plugin);
        if !tokio::time::timeout(START_TIMEOUT, ready)
            .await
            .context("daemon never printed ready")???
        {
            bail!("the daemon exited before it was ready; its log:\n{}", self.log());
        }
        Ok(())
    }

    /// Waits up to `timeout` for the `n`-th daemon log line containing `needle` (1-based).
    pub async fn wait_log(&self, needle: &str, n: usize, timeout: Duration) -> Result<String> {
        let start = std::time::Instant::now();
        loop {
            if let Some(l) = self.log().lines().filter(|l| l.contains(needle)).nth(n - 1) {
                return Ok(l.to_owned());
            }
            if start.elapsed() > timeout {
                bail!(
                    "no {needle:?} (#{n}) in the daemon's log within {timeout:?}:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs the daemon.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        self.plugin = None;
        Ok(())
    }

    /// SIGTERMs the daemon (as a DaemonSet update stops it) and waits up to 30 s for its exit;
    /// its exit status.
    pub async fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let mut c = self.child.take().context("the daemon is not running")?;
        self.plugin = None;
        signal(&c, Signal::SIGTERM)?;
        let start = std::time::Instant::now();
        loop {
            if let Some(st) = c.try_wait()? {
                return Ok(st);
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = c.kill();
                let _ = c.wait();
                bail!("the daemon did not exit within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGSTOPs the daemon: it stalls (its sockets stay open, nothing answers).
    pub fn pause(&self) -> Result<()> {
        signal(
            self.child.as_ref().context("the daemon is not running")?,
            Signal::SIGSTOP,
        )
    }

    /// SIGCONTs a daemon stalled by [`RealNode::pause`].
    pub fn resume(&self) -> Result<()> {
        signal(
            self.child.as_ref().context("the daemon is not running")?,
            Signal::SIGCONT,
        )
    }

    /// The daemon's `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        let (code, body) =
            crate::node::http_get(&format!("127.0.0.1:{}", self.metrics_port), "/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}: {body}");
        }
        Ok(body)
    }

    /// The events the daemon wrote (embedded mode: `events.jsonl` files under the node's dir).
    #[must_use]
    pub fn events(&self) -> String {
        events_under(&self.dir)
    }

    /// Starts the daemon again (after [`RealNode::kill`] or [`RealNode::terminate`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn().await
    }

    /// Writes an allocated claim for `pod_uid` where the daemon reads claims.
    pub fn write_claim(
        &self,
        claim: &Claim,
        pod_uid: &str,
        devices: &[(String, serde_json::Value)],
    ) -> Result<()> {
        let obj = crate::node::claim_object(claim, pod_uid, devices);
        let dir = self.dir.join("claims").join(&claim.namespace);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join(format!("{}.json", claim.name)),
            serde_json::to_vec_pretty(&obj)?,
        )?;
        Ok(())
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

    /// Where the daemon writes a claim's device status in embedded mode.
    #[must_use]
    pub fn claim_status_path(&self, claim: &Claim) -> PathBuf {
        self.dir
            .join("claims/status")
            .join(&claim.namespace)
            .join(format!("{}.json", claim.name))
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The daemon's netns pins.
    #[must_use]
    pub fn pins(&self) -> Vec<PathBuf> {
        dranet::sys::netns::Pin::list(&self.state_dir().join("pins")).unwrap_or_default()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        let _ = self.kill();
        if let Ok(bin) = dranet_bin() {
            let _ = Command::new(bin)
                .arg("release-all")
                .arg("--state-dir")
                .arg(self.state_dir())
                .output();
        }
        if std::env::var_os("DRANET_KEEP_CONTAINERD").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A pod kubelet runs over CRI: its identity (UID, attempt), its claim, its current sandbox and
/// container, and the sandboxes a re-creation replaced.
pub struct CriPod {
    pub ident: PodIdentity,
    pub claim: Claim,
    pub sandbox: Option<String>,
    pub container: Option<String>,
    /// Sandboxes stopped by a re-creation, not removed yet.
    pub old: Vec<String>,
}

impl CriPod {
    /// A pod `pod-<uid>` in `default`, UID `<tag>…`, claim [`pod_claim`].
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let uid = unique(tag);
        Self {
            ident: PodIdentity {
                name: format!("pod-{uid}"),
                namespace: "default".into(),
                uid: uid.clone(),
                attempt: 0,
            },
            claim: pod_claim(&uid),
            sandbox: None,
            container: None,
            old: Vec::new(),
        }
    }

    /// The claim allocated to `devices`, then NodePrepareResources (kubelet's first step).
    pub async fn prepare(&self, node: &RealNode, devices: &[(String, serde_json::Value)]) -> Result<()> {
        node.write_claim(&self.claim, &self.ident.uid, devices)?;
        node.prepare(&self.claim).await
    }

    /// RunPodSandbox, then CreateContainer + StartContainer of its container `app` (the pause
    /// image again), as kubelet's SyncPod does.
    pub async fn run(&mut self, cri: &Cri) -> Result<()> {
        let id = cri.run_pod_sandbox(&self.ident).await?;
        self.sandbox = Some(id.clone());
        self.container = Some(
            cri.create_and_start(&id, &self.ident, "app", SANDBOX_IMAGE)
                .await?,
        );
        Ok(())
    }

    /// The current sandbox id.
    pub fn sandbox_id(&self) -> Result<&str> {
        self.sandbox.as_deref().context("the pod has no sandbox")
    }

    /// The network namespace path of the current sandbox, as the runtime reports it.
    pub async fn netns(&self, cri: &Cri) -> Result<String> {
        cri.netns_path(self.sandbox_id()?)
            .await?
            .context("the runtime reports no netns for the sandbox")
    }

    /// kubelet's pod kill: StopContainer (grace period 2 s), then StopPodSandbox.
    pub async fn stop(&self, cri: &Cri) -> Result<()> {
        if let Some(c) = &self.container {
            cri.stop_container(c, 2).await?;
        }
        cri.stop_pod_sandbox(self.sandbox_id()?).await
    }

    /// The garbage collector's part: RemoveContainer, then RemovePodSandbox.
    pub async fn remove(&mut self, cri: &Cri) -> Result<()> {
        if let Some(c) = self.container.take() {
            cri.remove_container(&c).await?;
        }
        let id = self.sandbox.take().context("the pod has no sandbox")?;
        cri.remove_pod_sandbox(&id).await
    }

    /// Sandbox re-creation in kubelet's order: StopPodSandbox(old), RunPodSandbox(new) under the
    /// same UID with attempt + 1 (no new Prepare), its container started. The old sandbox stays
    /// until [`CriPod::remove_old`].
    pub async fn recreate(&mut self, cri: &Cri) -> Result<()> {
        self.stop(cri).await?;
        if let Some(c) = self.container.take() {
            cri.remove_container(&c).await?;
        }
        self.old.extend(self.sandbox.take());
        self.ident.attempt += 1;
        self.run(cri).await
    }

    /// The container GC's RemovePodSandbox of the sandboxes a re-creation replaced.
    pub async fn remove_old(&mut self, cri: &Cri) -> Result<()> {
        for id in std::mem::take(&mut self.old) {
            cri.remove_pod_sandbox(&id).await?;
        }
        Ok(())
    }
}

/// Every `events.jsonl` (an embedded-mode daemon's events) under `dir`, concatenated.
#[must_use]
pub fn events_under(dir: &Path) -> String {
    let mut out = String::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n == "events.jsonl") {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

fn signal(c: &Child, sig: Signal) -> Result<()> {
    let pid = i32::try_from(c.id()).context("pid")?;
    kill(Pid::from_raw(pid), sig).with_context(|| format!("{sig} to the daemon"))
}

/// `ip <args>` inside the network namespace at `netns` (a path, not a name under /run/netns).
pub fn ip_in(netns: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .arg("ip")
        .args(args)
        .output()
        .context("spawning nsenter")?;
    if !out.status.success() {
        bail!(
            "ip {args:?} in {netns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether link `name` is in the network namespace at `netns`.
#[must_use]
pub fn netns_has(netns: &str, name: &str) -> bool {
    ip_in(netns, &["link", "show", "dev", name]).is_ok()
}

/// How long devices may take to come home after StopPodSandbox returns.
pub const HOME_WITHIN: Duration = Duration::from_secs(10);

/// A node on `suite`'s containerd (`nri_extra` added to its NRI config) with the CRI client, or
/// `None` (skipped outside CI, said so).
pub async fn node_on(test: &str, suite: &str, nri_extra: &str) -> Result<Option<(RealNode, Cri, Runtime)>> {
    let Some(rt) = crate::containerd::require(test, suite)? else {
        return Ok(None);
    };
    let node = RealNode::start_with(&rt, nri_extra).await?;
    let cri = node.cri().await?;
    Ok(Some((node, cri, rt)))
}

/// The config of device `i` of a pod: interface `net<i>`, address 192.168.<70+i>.2/24.
#[must_use]
pub fn device_config(i: usize) -> serde_json::Value {
    serde_json::json!({"interface": {"name": format!("net{i}"), "addresses": [format!("192.168.{}.2/24", 70 + i)]}})
}

/// Every device of `nics` is in the pod's netns as its claim ([`device_config`]) says, none left
/// in the host.
pub async fn assert_in_pod(cri: &Cri, pod: &CriPod, nics: &[crate::nic::Nic]) -> Result<()> {
    let ns = pod.netns(cri).await?;
    for (i, n) in nics.iter().enumerate() {
        anyhow::ensure!(
            !crate::kernel::host_has(&n.name),
            "{} still in the host after RunPodSandbox",
            n.name
        );
        let v = ip_in(&ns, &["-j", "addr", "show", "dev", &format!("net{i}")])?;
        anyhow::ensure!(
            v.contains(&format!("192.168.{}.2", 70 + i)),
            "net{i} has no address in the pod ({ns}): {v}"
        );
    }
    Ok(())
}

/// Every device of `nics` is home as it was (`before`) within [`HOME_WITHIN`], and no pin is
/// left.
pub async fn assert_home(
    node: &RealNode,
    nics: &[crate::nic::Nic],
    before: &[serde_json::Value],
) -> Result<()> {
    for (n, b) in nics.iter().zip(before) {
        crate::nic::wait_restored(&n.name, b, HOME_WITHIN)
            .await
            .with_context(|| format!("{} not home; daemon log:\n{}", n.name, node.log()))?;
    }
    crate::fixtures::wait_for("pins released", Duration::from_secs(5), || node.pins().is_empty()).await?;
    Ok(())
}

/// The value of sample `name` (with its labels) in a Prometheus text exposition, 0 if absent.
#[must_use]
pub fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// The slowest NRI hook answer of a daemon, from its latency histogram: per method and status,
/// the exact time where one call was made (its `_sum`), else the histogram's bound on the
/// slowest (the smallest bucket holding every call, at most the `_sum`). The slowest over all:
/// (seconds, the labels of its method and status).
#[must_use]
pub fn slowest_hook(metrics: &str) -> (f64, String) {
    const H: &str = "dranet_driver_nri_plugin_requests_latency_seconds";
    let mut worst = (0.0, String::new());
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix(&format!("{H}_count")) else {
            continue;
        };
        let Some((labels, n)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.trim().parse::<f64>() else {
            continue;
        };
        let sum = sample(metrics, &format!("{H}_sum{labels}"));
        let inner = labels.trim_start_matches('{').trim_end_matches('}');
        let bound = metrics
            .lines()
            .filter_map(|b| {
                let rest = b.strip_prefix(&format!("{H}_bucket{{{inner},le=\""))?;
                let (le, v) = rest.split_once("\"} ")?;
                let le: f64 = le.parse().ok()?;
                let v: f64 = v.trim().parse().ok()?;
                (v >= n).then_some(le)
            })
            .fold(f64::INFINITY, f64::min);
        let t = if n <= 1.0 { sum } else { bound.min(sum) };
        if t > worst.0 {
            worst = (t, labels.to_owned());
        }
    }
    worst
}

/// One `NRI answer` line of a daemon's JSON log (`--log-format=json`): when the daemon answered
/// a runtime request, which, how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct NriAnswer {
    /// Seconds since the Unix epoch (the line's `ts`).
    pub ts: f64,
    pub method: String,
    pub took_ms: f64,
    pub ok: bool,
}

/// The `NRI answer` lines (debug, `dranet::nri::service`) of a JSON log, raw or as a CRI
/// container log (`<time> <stream> <tag> <line>`), in order.
#[must_use]
pub fn nri_answers(log: &str) -> Vec<NriAnswer> {
    log.lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l[l.find('{')?..]).ok()?;
            (v["msg"] == "NRI answer").then(|| NriAnswer {
                ts: v["ts"].as_f64().unwrap_or_default(),
                method: v["method"].as_str().unwrap_or_default().to_owned(),
                took_ms: v["took_ms"].as_f64().unwrap_or_default(),
                ok: v["ok"].as_bool().unwrap_or_default(),
            })
        })
        .collect()
}

/// The requests a daemon's JSON log shows received (`NRI request`) and never answered (no
/// `NRI answer` of the same method after it), by method.
#[must_use]
pub fn nri_unanswered(log: &str) -> Vec<String> {
    let mut open: Vec<String> = Vec::new();
    for l in log.lines() {
        let Some(v) = l
            .find('{')
            .and_then(|i| serde_json::from_str::<serde_json::Value>(&l[i..]).ok())
        else {
            continue;
        };
        let method = v["method"].as_str().unwrap_or_default().to_owned();
        if v["msg"] == "NRI request" {
            open.push(method);
        } else if v["msg"] == "NRI answer"
            && let Some(i) = open.iter().position(|m| *m == method)
        {
            open.remove(i);
        }
    }
    open
}
