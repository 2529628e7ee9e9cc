//! A real containerd for the tests: Debian's containerd of trixie (1.7) and of sid (2.x), unpacked
//! by `cargo xtask runtimes` under `target/runtimes/containerd-<version>/` (never installed), run
//! one per test with everything of its own: root, state and temp dirs, gRPC and ttrpc sockets, an
//! NRI socket (NRI enabled, its plugin request timeout left at the runtime's default), CNI config
//! and bin dir, the pod netns mounts under its state dir. The pod network is a bridge with a
//! unique name and no address on the host (`isGateway: false`, no masquerade): pod addresses
//! live only in the pod netns containerd creates, so nothing can leave the machine.
//!
//! [`Containerd`] stops the daemon by its PID and, also when a test fails (drop guard), kills the
//! shims it started and their processes, unmounts every mount under its directory, deletes its
//! bridge, its CNI cache and IPAM entries and its cgroups. Test support only.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::kernel::unique;

/// The Debian suites whose containerd the suite runs (as `cargo xtask runtimes` fetches them).
pub const SUITES: [&str; 2] = ["trixie", "sid"];

/// How long containerd may take to answer on its socket after a start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a SIGTERMed containerd may take to exit before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(
        "no containerd of Debian {suite} under {dir} (run `cargo xtask runtimes`, which `cargo xtask test` does)"
    )]
    Missing { suite: String, dir: String },
    #[error("{0} (CI=true: refusing to skip)")]
    RequiredInCi(String),
    #[error("containerd {version} did not answer on {socket} within {timeout:?}; its log:\n{log}")]
    NoAnswer {
        version: String,
        socket: String,
        timeout: Duration,
        log: String,
    },
    #[error("containerd {version} exited at start ({status}); its log:\n{log}")]
    Exited {
        version: String,
        status: String,
        log: String,
    },
    #[error("{cmd} failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("no {what} in {text:?}")]
    Parse { what: String, text: String },
    #[error("signal: {0}")]
    Signal(#[from] nix::Error),
}

type Result<T> = std::result::Result<T, ContainerdError>;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> ContainerdError {
    let what = what.to_string();
    move |e| ContainerdError::Io(what, e)
}

/// One unpacked containerd package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// The Debian suite it comes from (`trixie`, `sid`).
    pub suite: String,
    /// The Debian package version, e.g. `1.7.24~ds1-6+deb13u1`.
    pub version: String,
    /// Where the package is unpacked (`usr/bin/containerd` under it).
    pub dir: PathBuf,
}

impl Runtime {
    /// The upstream version without Debian's suffixes (`1.7.24`, `2.1.9`).
    #[must_use]
    pub fn upstream(&self) -> &str {
        self.version
            .split(['~', '+', '-'])
            .next()
            .unwrap_or(&self.version)
    }

    /// The major version (1 or 2): it decides the config dialect (version 2 or 3).
    #[must_use]
    pub fn major(&self) -> u32 {
        self.upstream()
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    #[must_use]
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("usr/bin").join(name)
    }
}

/// `target/runtimes/` of this build: `DRANET_RUNTIMES_DIR`, else found from the test binary
/// (`target/<profile>/deps/<test>`) or a program in `target/<profile>/`.
#[must_use]
pub fn runtimes_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DRANET_RUNTIMES_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent();
    while let Some(d) = dir {
        if d.file_name().is_some_and(|n| n == "target") {
            return d.join("runtimes");
        }
        dir = d.parent();
    }
    PathBuf::from("target/runtimes")
}

/// The containerd of `suite` as `cargo xtask runtimes` left it in `base` (its `<suite>.version`
/// record, the unpacked dir's stamp holding the same version, the binary).
pub fn find(base: &Path, suite: &str) -> Result<Runtime> {
    let missing = || ContainerdError::Missing {
        suite: suite.to_owned(),
        dir: base.display().to_string(),
    };
    let version = std::fs::read_to_string(base.join(format!("{suite}.version")))
        .map_err(|_| missing())?
        .trim()
        .to_owned();
    let dir = base.join(format!("containerd-{version}"));
    let stamp = std::fs::read_to_string(dir.join(".unpacked")).map_err(|_| missing())?;
    if stamp.trim() != version || !dir.join("usr/bin/containerd").exists() {
        return Err(missing());
    }
    Ok(Runtime {
        suite: suite.to_owned(),
        version,
        dir,
    })
}

/// One suite's containerd for a root test: `Ok(None)` (skipped, and said so) when it is missing
/// outside CI; under `CI=true` a missing runtime is an error.
pub fn require(test: &str, suite: &str) -> Result<Option<Runtime>> {
    match find(&runtimes_dir(), suite) {
        Ok(r) => Ok(Some(r)),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            Err(ContainerdError::RequiredInCi(format!("{test}: {e}")))
        }
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            Ok(None)
        }
    }
}

/// Every suite's containerd for a root test: `Ok(None)` (skipped, and said so) when one is
/// missing outside CI; under `CI=true` a missing runtime is an error.
pub fn require_all(test: &str) -> Result<Option<Vec<Runtime>>> {
    let base = runtimes_dir();
    let mut out = Vec::new();
    for suite in SUITES {
        match find(&base, suite) {
            Ok(r) => out.push(r),
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                return Err(ContainerdError::RequiredInCi(format!("{test}: {e}")));
            }
            Err(e) => {
                eprintln!("skipping {test}: {e}");
                return Ok(None);
            }
        }
    }
    Ok(Some(out))
}

/// The directories and names of one containerd instance.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
    /// The bridge of its CNI network (≤ 15 characters).
    pub bridge: String,
    /// The CNI network name (also the prefix of its libcni cache entries).
    pub network: String,
    /// The pod subnet (only ever inside pod netns).
    pub subnet: String,
    /// The image containerd uses for sandboxes.
    pub sandbox_image: String,
    /// The cgroup (cgroupfs path) under which the CRI client puts every pod.
    pub cgroup: String,
    /// containerd's `restrict_oom_score_adj`: on where this process cannot lower an OOM score
    /// (no `CAP_SYS_RESOURCE`, as in some VMs and containers), which the sandbox's -998 needs.
    pub restrict_oom_score_adj: bool,
}

impl Layout {
    fn new(dir: PathBuf, tag: &str, subnet_octet: u8) -> Self {
        Self {
            dir,
            bridge: format!("dcb{tag}"),
            network: format!("dranet-test-{tag}"),
            subnet: format!("10.254.{subnet_octet}.0/24"),
            sandbox_image: SANDBOX_IMAGE.to_owned(),
            cgroup: format!("/dranet-ctrd-{tag}"),
            restrict_oom_score_adj: !has_cap_sys_resource(),
        }
    }
    /// The cgroup parent of the pods (cgroupfs style).
    #[must_use]
    pub fn cgroup_parent(&self) -> String {
        self.cgroup.clone()
    }
    #[must_use]
    pub fn address(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    #[must_use]
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri/nri.sock")
    }
    #[must_use]
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    #[must_use]
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("cni/net.d")
    }
    #[must_use]
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    #[must_use]
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    #[must_use]
    pub fn log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
}

/// Whether this process has `CAP_SYS_RESOURCE` (bit 24 of `CapEff` in `/proc/self/status`).
#[must_use]
pub fn has_cap_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// The sandbox ("pause") image reference the fixture configures; the CRI suite imports an image
/// under this name.
pub const SANDBOX_IMAGE: &str = "dranet.test/pause:1";

/// Where Debian's containernetworking-plugins put bridge, host-local and loopback.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

fn toml_str(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// The config file for `major` (1: config version 2, `io.containerd.grpc.v1.cri`; 2 and later:
/// version 3, `io.containerd.cri.v1.*`). NRI is enabled on a private socket with the runtime's
/// default timeouts; the netns mounts go under the state dir; no registry configuration.
#[must_use]
pub fn config_text(major: u32, l: &Layout) -> String {
    config_text_with(major, l, "")
}

/// [`config_text`] with `nri_extra` (TOML: keys or sub-tables such as `default_validator`)
/// written right after the NRI plugin's keys.
#[must_use]
pub fn config_text_with(major: u32, l: &Layout, nri_extra: &str) -> String {
    let d = &l.dir;
    let common = format!(
        "root = {root}\nstate = {state}\ntemp = {temp}\n\n[grpc]\n  address = {grpc}\n\n[ttrpc]\n  address = {ttrpc}\n\n[debug]\n  level = \"info\"\n\n",
        root = toml_str(&l.root()),
        state = toml_str(&l.state()),
        temp = toml_str(&d.join("tmp")),
        grpc = toml_str(&l.address()),
        ttrpc = toml_str(&d.join("containerd.sock.ttrpc")),
    );
    let nri = format!(
        "  disable = false\n  socket_path = {sock}\n  plugin_path = {pp}\n  plugin_config_path = {pc}\n{nri_extra}",
        sock = toml_str(&l.nri_socket()),
        pp = toml_str(&d.join("nri/plugins")),
        pc = toml_str(&d.join("nri/conf.d")),
    );
    let opt = toml_str(&d.join("opt"));
    let conf_dir = toml_str(&l.cni_conf_dir());
    let image = format!("{:?}", l.sandbox_image);
    let restrict = l.restrict_oom_score_adj;
    if major <= 1 {
        format!(
            "version = 2\n{common}[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt}\n\n\
             [plugins.\"io.containerd.nri.v1.nri\"]\n{nri}\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = {image}\n  netns_mounts_under_state_dir = true\n  restrict_oom_score_adj = {restrict}\n  enable_cdi = false\n  disable_tcp_service = true\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n\n\
             [plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"{CNI_BIN_DIR}\"\n  conf_dir = {conf_dir}\n  max_conf_num = 1\n"
        )
    } else {
        format!(
            "version = 3\n{common}[plugins.'io.containerd.internal.v1.opt']\n  path = {opt}\n\n\
             [plugins.'io.containerd.nri.v1.nri']\n{nri}\n\
             [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = {image}\n\n\
             [plugins.'io.containerd.cri.v1.runtime']\n  netns_mounts_under_state_dir = true\n  restrict_oom_score_adj = {restrict}\n  enable_cdi = false\n\n\
             [plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = [\"{CNI_BIN_DIR}\"]\n  conf_dir = {conf_dir}\n  max_conf_num = 1\n\n\
             [plugins.'io.containerd.grpc.v1.cri']\n  disable_tcp_service = true\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n"
        )
    }
}

/// The CNI network: a bridge of the fixture's own without an address on the host, host-local
/// addresses in a subnet that exists only inside pod netns, its IPAM data in the fixture's dir.
#[must_use]
pub fn cni_conflist(l: &Layout) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": l.network,
        "plugins": [{
            "type": "bridge",
            "bridge": l.bridge,
            "isGateway": false,
            "isDefaultGateway": false,
            "ipMasq": false,
            "hairpinMode": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": l.subnet}]],
                "dataDir": l.dir.join("cni/ipam").display().to_string(),
            }
        }]
    })
    .to_string()
}

/// A running (or stopped) containerd with its own everything; cleaned up at drop.
pub struct Containerd {
    pub runtime: Runtime,
    pub layout: Layout,
    child: Option<Child>,
    /// How many times it was started.
    pub starts: u32,
}

static SUBNET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Containerd {
    /// Writes its config and CNI network, starts it and waits until it answers.
    pub async fn start(runtime: &Runtime) -> Result<Self> {
        Self::start_with(runtime, "").await
    }

    /// [`Containerd::start`] with `nri_extra` added to its NRI config ([`config_text_with`]).
    pub async fn start_with(runtime: &Runtime, nri_extra: &str) -> Result<Self> {
        let tag = unique("");
        let dir = std::env::temp_dir().join(format!("dranet-ctrd-{tag}"));
        let octet = SUBNET.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let layout = Layout::new(dir, &tag, octet);
        for sub in [
            "root",
            "state",
            "tmp",
            "opt",
            "nri/plugins",
            "nri/conf.d",
            "cni/net.d",
            "cni/ipam",
        ] {
            let p = layout.dir.join(sub);
            std::fs::create_dir_all(&p).map_err(io(format!("creating {}", p.display())))?;
        }
        std::fs::write(
            layout.config(),
            config_text_with(runtime.major(), &layout, nri_extra),
        )
        .map_err(io("writing config.toml"))?;
        std::fs::write(
            layout.cni_conf_dir().join("10-dranet-test.conflist"),
            cni_conflist(&layout),
        )
        .map_err(io("writing the CNI config"))?;
        let mut c = Self {
            runtime: runtime.clone(),
            layout,
            child: None,
            starts: 0,
        };
        c.spawn().await?;
        Ok(c)
    }

    async fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.layout.log())
            .map_err(io("opening containerd.log"))?;
        let log2 = log.try_clone().map_err(io("containerd.log"))?;
        // The package's shim and ctr first; runc from the machine (/usr/sbin).
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.runtime.dir.join("usr/bin").display()
        );
        let child = Command::new(self.runtime.bin("containerd"))
            .arg("--config")
            .arg(self.layout.config())
            .env("PATH", path)
            .env_remove("CONTAINERD_ADDRESS")
            .env_remove("CONTAINERD_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(io(format!(
                "spawning {}",
                self.runtime.bin("containerd").display()
            )))?;
        self.child = Some(child);
        self.starts += 1;
        let start = Instant::now();
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(ContainerdError::Exited {
                    version: self.runtime.version.clone(),
                    status: status.to_string(),
                    log: self.log_text(),
                });
            }
            if self.layout.address().exists() && self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(ContainerdError::NoAnswer {
                    version: self.runtime.version.clone(),
                    socket: self.layout.address().display().to_string(),
                    timeout: START_TIMEOUT,
                    log: self.log_text(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The daemon's PID while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`]; waits for the exit. The shims and the pods
    /// stay (as when the service restarts).
    pub async fn stop(&mut self) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        let pid = Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
        let _ = kill(pid, Signal::SIGTERM);
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = c.try_wait() {
                return Ok(());
            }
            if start.elapsed() > STOP_TIMEOUT {
                let _ = c.kill();
                let _ = c.wait();
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops and starts the daemon on the same root and state (pods keep running in their
    /// shims).
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.spawn().await
    }

    /// Runs the package's `ctr` against this daemon; its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(self.runtime.bin("ctr"))
            .arg("--address")
            .arg(self.layout.address())
            .args(args)
            .output()
            .map_err(io("spawning ctr"))?;
        if !out.status.success() {
            return Err(ContainerdError::Command {
                cmd: format!("ctr {}", args.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The version the running daemon reports (`ctr version`, its Server section).
    pub fn server_version(&self) -> Result<String> {
        let text = self.ctr(&["version"])?;
        parse_server_version(&text).ok_or_else(|| ContainerdError::Parse {
            what: "server version".into(),
            text,
        })
    }

    /// Everything containerd logged so far (all its starts).
    #[must_use]
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.layout.log()) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Waits up to `timeout` for a log line containing `needle`; returns that line.
    pub async fn wait_log(&self, needle: &str, timeout: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            if let Some(l) = self.log_text().lines().find(|l| l.contains(needle)) {
                return Some(l.to_owned());
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills everything this instance started and removes what it made: the daemon, its shims
    /// and their processes, mounts under its dir, its bridge, CNI cache entries, the dir.
    fn cleanup(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        kill_shims(&self.layout.address());
        unmount_under(&self.layout.dir);
        remove_cgroups(&self.layout.cgroup);
        let _ = Command::new("ip")
            .args(["link", "del", &self.layout.bridge])
            .stderr(Stdio::null())
            .status();
        if let Ok(rd) = std::fs::read_dir("/var/lib/cni/results") {
            for e in rd.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", self.layout.network))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        if std::env::var_os("DRANET_KEEP_CONTAINERD").is_none() {
            let _ = std::fs::remove_dir_all(&self.layout.dir);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// The `Version:` under `Server:` in `ctr version`'s output.
#[must_use]
pub fn parse_server_version(text: &str) -> Option<String> {
    let server = text.split("Server:").nth(1)?;
    server
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
}

/// The parent PID of `pid` (from `/proc/<pid>/stat`).
fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The comm field may hold spaces and parentheses: the state and ppid follow the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGKILLs the shims started for the daemon at `address` (their command line names it) and
/// every process below them (the sandboxes and containers).
fn kill_shims(address: &Path) {
    let addr = address.display().to_string();
    let pids = all_pids();
    let shims: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first()
                    .is_some_and(|a0| a0.ends_with(b"containerd-shim-runc-v2"))
                    && args.contains(&addr.as_bytes())
            })
        })
        .collect();
    if shims.is_empty() {
        return;
    }
    // Descendants first, then the shims (a shim would reap and report its children).
    let mut doomed: Vec<u32> = Vec::new();
    let mut frontier = shims.clone();
    while let Some(p) = frontier.pop() {
        for c in pids.iter().copied().filter(|c| ppid(*c) == Some(p)) {
            if !doomed.contains(&c) {
                doomed.push(c);
                frontier.push(c);
            }
        }
    }
    doomed.extend(shims);
    for p in doomed {
        if let Ok(p) = i32::try_from(p) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
    std::thread::sleep(Duration::from_millis(100));
}

/// Removes the cgroup `cg` (with everything below it) from every hierarchy: cgroup v2 at
/// `/sys/fs/cgroup/<cg>`, v1 and hybrid at `/sys/fs/cgroup/<controller>/<cg>`.
fn remove_cgroups(cg: &str) {
    let rel = cg.trim_start_matches('/');
    if rel.is_empty() {
        return;
    }
    let base = Path::new("/sys/fs/cgroup");
    let mut tops = vec![base.join(rel)];
    if let Ok(rd) = std::fs::read_dir(base) {
        tops.extend(
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path().join(rel)),
        );
    }
    for top in tops.into_iter().filter(|t| t.is_dir()) {
        let mut dirs = vec![top.clone()];
        let mut i = 0;
        while i < dirs.len() {
            if let Ok(rd) = std::fs::read_dir(&dirs[i]) {
                let subs: Vec<PathBuf> = rd
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect();
                dirs.extend(subs);
            }
            i += 1;
        }
        for d in dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Unmounts (lazily) every mount point under `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let b = p.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(v) = p.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(PathBuf::from("/tmp/dranet-ctrd-x1"), "x1", 7)
    }

    #[test]
    fn versions_and_dialects() {
        let r = Runtime {
            suite: "trixie".into(),
            version: "1.7.24~ds1-6+deb13u1".into(),
            dir: PathBuf::from("/x"),
        };
        assert_eq!(r.upstream(), "1.7.24");
        assert_eq!(r.major(), 1);
        let r = Runtime {
            version: "2.1.9+ds1-5".into(),
            ..r
        };
        assert_eq!(r.upstream(), "2.1.9");
        assert_eq!(r.major(), 2);
    }

    #[test]
    fn configs_name_only_private_paths() {
        let l = layout();
        for major in [1, 2] {
            let c = config_text(major, &l);
            assert!(c.contains("disable = false"), "{c}");
            assert!(c.contains("/tmp/dranet-ctrd-x1/nri/nri.sock"), "{c}");
            assert!(c.contains("netns_mounts_under_state_dir = true"), "{c}");
            assert!(!c.contains("/var/run/nri"), "{c}");
            assert!(!c.contains("/run/containerd"), "{c}");
            assert!(!c.contains("/etc/"), "{c}");
            assert!(!c.contains("plugin_request_timeout"), "runtime default: {c}");
            assert!(!c.contains("registry"), "no registry config: {c}");
        }
        assert!(config_text(1, &l).starts_with("version = 2\n"));
        assert!(config_text(1, &l).contains("[plugins.\"io.containerd.grpc.v1.cri\".cni]"));
        assert!(config_text(2, &l).starts_with("version = 3\n"));
        assert!(config_text(2, &l).contains("[plugins.'io.containerd.cri.v1.runtime'.cni]"));
    }

    #[test]
    fn cni_network_has_no_gateway_on_the_host() {
        let v: serde_json::Value = serde_json::from_str(&cni_conflist(&layout())).unwrap();
        let br = &v["plugins"][0];
        assert_eq!(br["type"], "bridge");
        assert_eq!(br["bridge"], "dcbx1");
        assert_eq!(br["isGateway"], false);
        assert_eq!(br["ipMasq"], false);
        assert_eq!(br["ipam"]["ranges"][0][0]["subnet"], "10.254.7.0/24");
        assert_eq!(br["ipam"]["dataDir"], "/tmp/dranet-ctrd-x1/cni/ipam");
    }

    #[test]
    fn server_version_of_ctr_output() {
        let text = "Client:\n  Version:  1.7.24~ds1\n  Revision: 1.7.24~ds1-6+deb13u1\n  Go version: go1.23\n\nServer:\n  Version:  1.7.24~ds1\n  Revision: 1.7.24~ds1-6+deb13u1\n  UUID: 1234\n";
        assert_eq!(parse_server_version(text).as_deref(), Some("1.7.24~ds1"));
        assert_eq!(parse_server_version("Client:\n Version: 1\n"), None);
    }

    #[test]
    fn mount_paths_unescape() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }

    #[test]
    fn missing_runtime_names_the_job() {
        let e = find(Path::new("/nonexistent-runtimes"), "sid").unwrap_err();
        assert!(e.to_string().contains("cargo xtask runtimes"), "{e}");
    }
}
