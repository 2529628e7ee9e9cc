//! Many veth pairs at once, created and deleted with one `ip -batch` each (hundreds of `ip`
//! processes would take seconds): the devices of the scale sections.
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dranet_sim::kernel::{dranet_bin, sh, unique, unique_tag_of};

use crate::baseline::Dev;
use crate::latency::HOST_MTU;

/// `n` veth pairs in the host: `a` (MTU 1400, UP) is the device, `b` its peer (stays home, UP).
/// Both ends are deleted on drop, wherever the kernel has them.
pub struct Fleet {
    pub devs: Vec<Dev>,
    peers: Vec<String>,
}

/// Runs `ip [-n ns] -batch` on `lines`.
pub fn ip_batch(netns: Option<&str>, lines: &str) -> Result<()> {
    let file = std::env::temp_dir().join(unique("drbench-batch-"));
    std::fs::write(&file, lines)?;
    let path = file.display().to_string();
    let mut args = vec!["ip"];
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["-force", "-batch", &path]);
    let r = sh(&args);
    let _ = std::fs::remove_file(&file);
    r.map(drop)
}

impl Fleet {
    pub fn create(n: usize) -> Result<Self> {
        let mut me = Self {
            devs: Vec::with_capacity(n),
            peers: Vec::with_capacity(n),
        };
        let mut add = String::new();
        let mut set = String::new();
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            let (a, b) = (unique("drb"), unique("drc"));
            add.push_str(&format!("link add {a} mtu {HOST_MTU} type veth peer name {b}\n"));
            set.push_str(&format!("link set {a} up\nlink set {b} up\n"));
            names.push(a);
            me.peers.push(b);
        }
        // The guard is armed before the kernel has them: a failure half-way still cleans up.
        ip_batch(None, &add).context("creating the veth pairs")?;
        ip_batch(None, &set).context("setting the veth pairs up")?;
        for (i, a) in names.into_iter().enumerate() {
            let index = ifindex(&a)?;
            me.devs.push(Dev {
                host: a,
                pod: format!("net{}", i % 2),
                index,
            });
        }
        Ok(me)
    }

    pub fn names(&self) -> Vec<String> {
        self.devs.iter().map(|d| d.host.clone()).collect()
    }

    /// Every device home under its name and index, UP, MTU 1400 (read from sysfs).
    pub fn check_home(&self) -> Result<()> {
        for d in &self.devs {
            check_home(d)?;
        }
        Ok(())
    }
}

fn ifindex(name: &str) -> Result<u32> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
        .with_context(|| format!("{name} not in the host netns"))?;
    Ok(s.trim().parse()?)
}

/// One device home under its name and index, UP, MTU 1400 (sysfs).
pub fn check_home(d: &Dev) -> Result<()> {
    let dir = PathBuf::from("/sys/class/net").join(&d.host);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_owned());
    let index: u32 = read("ifindex")
        .with_context(|| format!("{} not home", d.host))?
        .parse()?;
    let mtu: u32 = read("mtu")?.parse()?;
    let flags = u32::from_str_radix(read("flags")?.trim_start_matches("0x"), 16)?;
    if index != d.index || mtu != HOST_MTU || flags & 1 == 0 {
        bail!(
            "{} home but index {index} (want {}), mtu {mtu}, flags {flags:#x}",
            d.host,
            d.index
        );
    }
    Ok(())
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // Deleting either end deletes both; a device still in a pod netns goes with its peer.
        let mut del = String::new();
        for p in &self.peers {
            del.push_str(&format!("link del {p}\n"));
        }
        let _ = ip_batch(None, &del);
    }
}

/// What [`sweep_stale`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Pids of `dranet run` daemons whose node was left (their devices brought home first).
    pub daemons: Vec<u32>,
    pub links: Vec<String>,
    pub netns: Vec<String>,
}

/// Removes what killed bench runs left behind: a `Fleet`'s or `PodNetns`' guard does not run
/// when the process is killed, and CI runs killed mid-bench once left 640 veths in the host.
/// Only the bench's own objects are touched: host links named `drb*`/`drc*` and
/// `/run/netns/drbench-*`, each named by [`unique`] after the pid of the bench that made it; an
/// object whose name carries the tag of a live `dranet-bench` process (this one included) is kept.
///
/// First the `dranet run` daemons such a run left (see [`orphaned_daemons`]): while one runs, its
/// pins keep the pod netns of its devices alive, so the veths in them would outlive the sweep.
pub fn sweep_stale() -> Result<Swept> {
    let live = live_bench_tags()?;
    let ours = |rest: &str| live.iter().any(|t| rest.starts_with(t.as_str()));
    let mut swept = Swept::default();
    for o in orphaned_daemons()? {
        stop_orphan(&o)?;
        swept.daemons.push(o.pid);
    }
    // The bench's own shape only: a veth, named by `unique` (lower-case base 36 and digits).
    let tag = |r: &str| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_lowercase());
    for name in host_veths()? {
        let rest = name.strip_prefix("drb").or_else(|| name.strip_prefix("drc"));
        if rest.is_some_and(|r| tag(r) && !ours(r)) {
            swept.links.push(name);
        }
    }
    let netns_dir = std::path::Path::new("/run/netns");
    if netns_dir.is_dir() {
        for e in std::fs::read_dir(netns_dir)? {
            let name = e?.file_name().to_string_lossy().into_owned();
            // drbench-<tag>-<pid base36><seq>: the tag may hold dashes, the unique part cannot.
            let rest = name.strip_prefix("drbench-").and_then(|r| r.rsplit('-').next());
            if rest.is_some_and(|r| tag(r) && !ours(r)) {
                swept.netns.push(name);
            }
        }
    }
    if !swept.links.is_empty() {
        // Deleting one end of a pair deletes the other, so the batch meets names already gone:
        // -force goes on past them (and then fails). What counts is that none is left.
        let del: String = swept.links.iter().map(|l| format!("link del {l}\n")).collect();
        let _ = ip_batch(None, &del);
        let left: Vec<&String> = swept
            .links
            .iter()
            .filter(|l| std::path::Path::new("/sys/class/net").join(l).exists())
            .collect();
        if !left.is_empty() {
            bail!("stale bench links could not be deleted: {left:?}");
        }
    }
    for n in &swept.netns {
        let path = netns_dir.join(n);
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(swept)
}

/// A `dranet run` started by a [`dranet_sim::node::Node`] whose process is gone.
#[derive(Debug)]
struct Orphan {
    pid: u32,
    /// Its `--state-dir`, inside the node's directory `<tmp>/dranet-node-<pid tag><seq>`.
    state_dir: PathBuf,
}

/// The `dranet run` daemons whose node's process is gone. A `Node` names its directory
/// `<tmp>/dranet-node-<tag>` after its own pid and is the daemon's parent; when it is killed, its
/// daemon goes on (reparented to init or a subreaper), holding its pins. Only a daemon whose
/// `--state-dir` lies in such a directory, and whose parent is not the process the name carries,
/// counts: a node's live daemon, or one with any other state dir (a real node's `/run/dranet`),
/// is never touched.
fn orphaned_daemons() -> Result<Vec<Orphan>> {
    let tmp = std::env::temp_dir();
    let mut found = Vec::new();
    for pid in pids_of("dranet")? {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.get(1) != Some(&&b"run"[..]) {
            continue;
        }
        let Some(state_dir) = args
            .windows(2)
            .find(|w| w[0] == b"--state-dir")
            .map(|w| PathBuf::from(String::from_utf8_lossy(w[1]).into_owned()))
        else {
            continue;
        };
        let Some(node_dir) = state_dir.parent() else {
            continue;
        };
        let Some(rest) = node_dir
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("dranet-node-"))
        else {
            continue;
        };
        if node_dir.parent() != Some(tmp.as_path()) {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let Some(ppid) = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if ppid != 1 && rest.starts_with(&unique_tag_of(ppid)) {
            continue;
        }
        found.push(Orphan { pid, state_dir });
    }
    Ok(found)
}

/// Stops an orphaned daemon (SIGKILL: nobody is left to answer its hooks), brings the devices of
/// its pins home (`dranet release-all`), and removes its node's directory.
fn stop_orphan(o: &Orphan) -> Result<()> {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(o.pid)?);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running(o.pid) {
        if std::time::Instant::now() > until {
            bail!("the orphaned dranet {} did not stop", o.pid);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = std::process::Command::new(dranet_bin()?)
        .arg("release-all")
        .arg("--state-dir")
        .arg(&o.state_dir)
        .args(["--lock-wait-seconds", "5"])
        .output()?;
    if !out.status.success() {
        bail!(
            "dranet release-all --state-dir {} (the orphaned dranet {}): {}",
            o.state_dir.display(),
            o.pid,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if let Some(node_dir) = o.state_dir.parent() {
        std::fs::remove_dir_all(node_dir).with_context(|| format!("removing {}", node_dir.display()))?;
    }
    Ok(())
}

/// The names of the host's veth links (`ip -d -o link`: one line per link, the kind among its
/// words; the name is the second word, `name@peer:`).
fn host_veths() -> Result<Vec<String>> {
    let out = sh(&["ip", "-d", "-o", "link", "show"])?;
    Ok(out
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "veth"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|w| {
            w.trim_end_matches(':')
                .split('@')
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect())
}

/// The [`unique`] tags of every running `dranet-bench`.
fn live_bench_tags() -> Result<Vec<String>> {
    let mut tags = vec![unique_tag_of(std::process::id())];
    tags.extend(pids_of("dranet-bench")?.into_iter().map(unique_tag_of));
    Ok(tags)
}

/// The processes whose command name (`/proc/PID/comm`) is `comm`.
fn pids_of(comm: &str) -> Result<Vec<u32>> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc")? {
        let Ok(pid) = e?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if c.trim_end() == comm {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Whether `pid` runs: not gone, and not a zombie its parent has yet to reap.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::{Command, Stdio};

    use dranet_sim::kernel::{PodNetns, Veth, require_root, unique_tag_of};

    use super::*;

    /// Above any pid_max (2^22): never a live process.
    const DEAD_PID: u32 = (1 << 22) + 1;

    /// The sweeps of two tests must not stop the same orphan at once.
    static ONE_SWEEP: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// For a sweep test: `None` without root (outside CI; under `CI=true` it fails), else the
    /// turn to sweep, held for the test.
    fn sweep_turn(test: &str) -> Result<Option<std::sync::MutexGuard<'static, ()>>> {
        if !require_root(test)? {
            return Ok(None);
        }
        Ok(Some(
            ONE_SWEEP
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }

    #[test]
    fn the_sweep_removes_a_dead_benchs_objects_and_keeps_a_live_ones() -> Result<()> {
        let Some(_turn) = sweep_turn("the_sweep_removes_a_dead_benchs_objects_and_keeps_a_live_ones")? else {
            return Ok(());
        };
        let dead = unique_tag_of(DEAD_PID);
        // Guards for both, so a failing sweep leaves nothing either.
        let stale = Veth::create(&format!("drb{dead}0"), &format!("drc{dead}0"))?;
        let stale_ns = PodNetns::create(&format!("drbench-x-y-{dead}0"))?;
        let live = Veth::create(&unique("drb"), &unique("drc"))?;
        let live_ns = PodNetns::create(&unique("drbench-x-"))?;
        // Named like a dead bench's, but not a veth: not the bench's, kept.
        let bridge = Bridge::create(&format!("drb{dead}1"))?;
        let swept = sweep_stale()?;
        let here = |n: &str| std::path::Path::new("/sys/class/net").join(n).exists();
        assert!(!here(&stale.a) && !here(&stale.b), "{swept:?}");
        assert!(swept.links.contains(&stale.a), "{swept:?}");
        assert_eq!(
            swept.netns.iter().filter(|n| **n == stale_ns.name).count(),
            1,
            "{swept:?}"
        );
        assert!(!stale_ns.path.exists());
        assert!(here(&live.a) && here(&live.b), "{swept:?}");
        assert!(live_ns.path.exists());
        assert!(!swept.links.contains(&live.a) && !swept.netns.contains(&live_ns.name));
        assert!(here(&bridge.0) && !swept.links.contains(&bridge.0), "{swept:?}");
        Ok(())
    }

    /// A killed bench's node left its `dranet run` behind (reparented, still running): the sweep
    /// stops it and removes its node's directory. A live node's daemon (this process's) stays.
    #[test]
    fn the_sweep_stops_a_dead_nodes_daemon_and_keeps_a_live_ones() -> Result<()> {
        let Some(_turn) = sweep_turn("the_sweep_stops_a_dead_nodes_daemon_and_keeps_a_live_ones")? else {
            return Ok(());
        };
        let tmp = std::env::temp_dir();
        let dead_dir = Dir(tmp.join(format!("dranet-node-{}0", unique_tag_of(DEAD_PID))));
        let live_dir = Dir(tmp.join(unique("dranet-node-")));
        let bin = dranet_bin()?;
        let args = |d: &Path| -> Vec<std::ffi::OsString> {
            let mut a: Vec<std::ffi::OsString> =
                ["run", "--node-name", "sweep-test", "--filter", "", "--no-probes"]
                    .map(Into::into)
                    .to_vec();
            for (flag, sub) in [
                ("--state-dir", "state"),
                ("--kubelet-root-dir", "kubelet"),
                ("--nri-socket", "nri.sock"),
                ("--slices-dir", "slices"),
                ("--claims-dir", "claims"),
            ] {
                a.push(flag.into());
                a.push(d.join(sub).into());
            }
            a.extend(["--bind-address", "127.0.0.1:0"].map(Into::into));
            a
        };
        // Started by a shell that exits at once: the daemon lives on without it, as when the
        // bench that started it is killed.
        let out = Command::new("sh")
            .arg("-c")
            .arg(r#""$0" "$@" >/dev/null 2>&1 & echo $!"#)
            .arg(&bin)
            .args(args(&dead_dir.0))
            .output()?;
        let orphan: u32 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
        let _orphan = Killed(orphan);
        let live = Command::new(&bin)
            .args(args(&live_dir.0))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let mut live = Child(live);
        // Both up: each has made its state dir.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !(dead_dir.0.join("state").is_dir() && live_dir.0.join("state").is_dir()) {
            assert!(std::time::Instant::now() < until, "the daemons did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let swept = sweep_stale()?;
        assert!(swept.daemons.contains(&orphan), "{swept:?}");
        assert!(!swept.daemons.contains(&live.0.id()), "{swept:?}");
        assert!(!running(orphan), "the orphan still runs");
        assert!(!dead_dir.0.exists(), "the dead node's directory is left");
        assert!(live.0.try_wait()?.is_none(), "the live node's daemon was stopped");
        assert!(live_dir.0.join("state").is_dir());
        live.0.kill()?;
        Ok(())
    }

    struct Killed(u32);

    impl Drop for Killed {
        fn drop(&mut self) {
            if running(self.0) {
                let _ = sh(&["kill", "-9", &self.0.to_string()]);
            }
        }
    }

    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Removed last (declared first): after the daemons are gone.
    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    struct Bridge(String);

    impl Bridge {
        fn create(name: &str) -> Result<Self> {
            sh(&["ip", "link", "add", name, "type", "bridge"])?;
            Ok(Self(name.to_owned()))
        }
    }

    impl Drop for Bridge {
        fn drop(&mut self) {
            let _ = sh(&["ip", "link", "del", &self.0]);
        }
    }
}
