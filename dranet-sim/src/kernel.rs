//! Kernel test objects for root tests: pod netns created the way runtimes create them, veth pairs
//! standing in for NICs, all removed by guards (also on panic). Test support only.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A short unique tag for test object names: `<pid base36><seq>`.
#[must_use]
pub fn unique(tag: &str) -> String {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{tag}{}{n}", radix36(std::process::id()))
}

/// The tag [`unique`] puts after its prefix in the names of process `pid`'s objects.
#[must_use]
pub fn unique_tag_of(pid: u32) -> String {
    radix36(pid)
}

fn radix36(mut v: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(v % 36) as usize]);
        v /= 36;
        if v == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// True when running as root. Root tests call [`require_root`] first.
#[must_use]
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Root tests: `Ok(true)` to run; `Ok(false)` to skip (printed) outside CI; error under `CI=true`.
pub fn require_root(test: &str) -> Result<bool> {
    if is_root() {
        return Ok(true);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!("{test} needs root (CI=true: refusing to skip)");
    }
    eprintln!("skipping {test}: needs root");
    Ok(false)
}

/// Runs a command, failing with its output if it does not succeed.
pub fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("spawning {args:?}"))?;
    if !out.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A pod netns bind-mounted at `/run/netns/<name>`, created as runtimes do: a thread unshares
/// its netns and the new namespace is bind-mounted onto a file. Dropping it removes it CRI-O
/// style (umount2 MNT_DETACH, then unlink) unless already removed.
pub struct PodNetns {
    pub name: String,
    pub path: PathBuf,
    removed: bool,
}

impl PodNetns {
    /// Creates `/run/netns/<name>`.
    pub fn create(name: &str) -> Result<Self> {
        let dir = Path::new("/run/netns");
        std::fs::create_dir_all(dir)?;
        let path = dir.join(name);
        File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let target = path.clone();
        let res = std::thread::spawn(move || -> Result<()> {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).context("unshare(CLONE_NEWNET)")?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .context("bind mount of the new netns")?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("netns thread panicked"))?;
        if let Err(e) = res {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(Self {
            name: name.to_owned(),
            path,
            removed: false,
        })
    }

    /// Opens the netns file (an fd that pins the netns while open).
    pub fn open(&self) -> Result<File> {
        File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))
    }

    /// Removes the netns the way CRI-O does: `umount2(path, MNT_DETACH)`, then unlink.
    pub fn remove_crio_style(&mut self) -> Result<()> {
        if self.removed {
            return Ok(());
        }
        self.removed = true;
        nix::mount::umount2(&self.path, MntFlags::MNT_DETACH).context("umount2")?;
        std::fs::remove_file(&self.path).context("unlink")?;
        Ok(())
    }

    /// Records that something else (a thread of its own, by path) already unmounted and
    /// unlinked it, so dropping it does nothing more.
    pub fn removed_elsewhere(&mut self) {
        self.removed = true;
    }

    /// [`PodNetns::remove_crio_style`], returning the monotonic time right after `umount2`
    /// returned (before the unlink): the start of a rescue for benchmarks.
    pub fn remove_crio_style_timed(&mut self) -> Result<dranet::clock::MonoTime> {
        if self.removed {
            bail!("{} already removed", self.path.display());
        }
        self.removed = true;
        nix::mount::umount2(&self.path, MntFlags::MNT_DETACH).context("umount2")?;
        let t = dranet::watch::mono_now();
        std::fs::remove_file(&self.path).context("unlink")?;
        Ok(t)
    }

    /// Whether link `name` is in this netns.
    #[must_use]
    pub fn has(&self, name: &str) -> bool {
        self.ip(&["link", "show", "dev", name]).is_ok()
    }

    /// Runs `ip -n <name> ...` inside the netns.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "-n", self.name.as_str()];
        full.extend_from_slice(args);
        sh(&full)
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if !self.removed {
            let _ = nix::mount::umount2(&self.path, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A veth pair in the host netns; both ends are deleted on drop (wherever the kernel has them:
/// deleting either end deletes both).
pub struct Veth {
    pub a: String,
    pub b: String,
}

impl Veth {
    /// Creates `a` <-> `b` (names ≤ 15 bytes).
    pub fn create(a: &str, b: &str) -> Result<Self> {
        sh(&["ip", "link", "add", a, "type", "veth", "peer", "name", b])?;
        Ok(Self {
            a: a.to_owned(),
            b: b.to_owned(),
        })
    }

    /// Creates `a` <-> `b` with `a` carrying `mac` from its first RTM_NEWLINK on (as a CNI that
    /// sets the MAC at creation: Calico's host-side veths all carry `ee:ee:ee:ee:ee:ee`).
    pub fn create_with_mac(a: &str, b: &str, mac: &str) -> Result<Self> {
        sh(&[
            "ip", "link", "add", a, "address", mac, "type", "veth", "peer", "name", b,
        ])?;
        Ok(Self {
            a: a.to_owned(),
            b: b.to_owned(),
        })
    }

    /// ifindex of a host-side device by name.
    pub fn ifindex(name: &str) -> Result<u32> {
        let s = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
            .with_context(|| format!("{name} not in host netns"))?;
        Ok(s.trim().parse()?)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).output();
        let _ = Command::new("ip").args(["link", "del", &self.b]).output();
    }
}

/// Does a device of this name exist in the host netns?
#[must_use]
pub fn host_has(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Identity (cookie, inode) of an open netns file, via dranet's own helper.
pub fn identity(f: &File) -> Result<dranet::sys::netns::NetnsId> {
    Ok(dranet::watch::identify_fd(f.as_fd())?)
}

/// Path of the `dranet` binary next to the running test binary, built on demand (or the one in
/// `DRANET_BIN`). Under cargo
/// (`CARGO` set, as in `cargo test`) it is brought up to date once per process first: `cargo
/// test -p dranet-sim` alone does not rebuild the daemon's binary, and an old one next to the
/// test would run yesterday's daemon against today's tests.
pub fn dranet_bin() -> Result<PathBuf> {
    static FRESH: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    // Another build of the daemon (e.g. an older commit's, to show a test fails there).
    if let Some(bin) = std::env::var_os("DRANET_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe()?;
    let here = exe.parent().context("binary has no directory")?;
    // Only test binaries (target/<profile>/deps/): the demo and the bench run next to the
    // binaries their own build made.
    let profile_dir = here.parent().filter(|_| here.ends_with("deps"));
    if let (Ok(cargo), Some(profile_dir)) = (std::env::var("CARGO"), profile_dir) {
        let release = profile_dir.ends_with("release");
        FRESH
            .get_or_init(|| {
                let mut cmd = Command::new(cargo);
                cmd.args(["build", "--quiet", "-p", "dranet", "--bin", "dranet"]);
                if release {
                    cmd.arg("--release");
                }
                match cmd.status() {
                    Ok(s) if s.success() => Ok(()),
                    Ok(s) => Err(format!("building the dranet binary failed: {s}")),
                    Err(e) => Err(format!("running cargo to build the dranet binary: {e}")),
                }
            })
            .clone()
            .map_err(anyhow::Error::msg)?;
    }
    // A binary in target/<profile>/ has it next to it; a test in target/<profile>/deps/ one up.
    for dir in [Some(here), here.parent()].into_iter().flatten() {
        let bin = dir.join("dranet");
        if bin.is_file() {
            return Ok(bin);
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", "dranet", "--bin", "dranet"])
        .status()?;
    if !status.success() {
        bail!("building the dranet binary failed");
    }
    let bin = here.parent().map(|p| p.join("dranet")).context("no target dir")?;
    if bin.is_file() {
        Ok(bin)
    } else {
        Ok(here.join("dranet"))
    }
}
