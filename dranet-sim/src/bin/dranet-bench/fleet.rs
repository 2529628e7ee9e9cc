//! Many veth pairs at once, created and deleted with one `ip -batch` each (hundreds of `ip`
//! processes would take seconds): the devices of the scale sections.
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use dranet_sim::kernel::{sh, unique, unique_tag_of};

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
    pub links: Vec<String>,
    pub netns: Vec<String>,
}

/// Removes what killed bench runs left behind: a `Fleet`'s or `PodNetns`' guard does not run
/// when the process is killed, and CI runs killed mid-bench once left 640 veths in the host.
/// Only the bench's own objects are touched: host links named `drb*`/`drc*` and
/// `/run/netns/drbench-*`, each named by [`unique`] after the pid of the bench that made it; an
/// object whose name carries the tag of a live `dranet-bench` process (this one included) is kept.
pub fn sweep_stale() -> Result<Swept> {
    let live = live_bench_tags()?;
    let ours = |rest: &str| live.iter().any(|t| rest.starts_with(t.as_str()));
    let mut swept = Swept::default();
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
    for e in std::fs::read_dir("/proc")? {
        let Ok(pid) = e?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == "dranet-bench" {
            tags.push(unique_tag_of(pid));
        }
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use dranet_sim::kernel::{PodNetns, Veth, require_root, unique_tag_of};

    use super::*;

    /// Above any pid_max (2^22): never a live process.
    const DEAD_PID: u32 = (1 << 22) + 1;

    #[test]
    fn the_sweep_removes_a_dead_benchs_objects_and_keeps_a_live_ones() -> Result<()> {
        if !require_root("the_sweep_removes_a_dead_benchs_objects_and_keeps_a_live_ones")? {
            return Ok(());
        }
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
