//! The real daemon at idle: `dranet run` (probes on) between the kubelet simulator (registered,
//! with a health stream open as kubelet keeps one) and the NRI runtime harness (connected), run
//! in a private netns (`ip netns exec`) that holds `n` veth devices, all published. Its VmRSS
//! once a second over a window, the context switches of all its threads (its wake-ups), and
//! where the resident memory is: `/proc/PID/smaps` by kind of mapping, the eBPF maps' locked
//! memory (`/proc/PID/fdinfo`), its threads by name.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::slices::DirPublisher;
use dranet_sim::kernel::PodNetns;
use dranet_sim::node::{Node, NodeOptions};

const NODE: &str = "bench-node";
const VETH_ONLY: &str = r#""dra.net/type" in attributes && attributes["dra.net/type"].StringValue == "veth""#;

/// Where the daemon's resident memory is (KiB).
#[derive(Debug, Default, Clone)]
pub struct Breakdown {
    pub rss: u64,
    /// The main arena (`[heap]`, brk).
    pub main_heap: u64,
    /// glibc's other arenas (anonymous, read-write, the arena's reserve right above).
    pub arenas: u64,
    /// Thread stacks (anonymous, read-write, a guard page right below; the main `[stack]`).
    pub stacks: u64,
    /// Mapped eBPF maps (the ring buffer's pages).
    pub bpf_mapped: u64,
    /// The binary and the libraries (file-backed).
    pub files: u64,
    /// Any other anonymous mapping (big allocations malloc mmaps on their own, ...).
    pub other_anon: u64,
    /// Locked memory of the eBPF maps (`memlock` of each map fd; kernel memory, not RSS).
    pub bpf_memlock: u64,
    pub bpf_maps: usize,
    /// Threads by name (`comm`).
    pub threads: BTreeMap<String, usize>,
    /// Largest anonymous mappings not classified above (start, KiB).
    pub biggest_other: Vec<(String, u64)>,
}

impl Breakdown {
    pub fn summary(&self) -> String {
        let threads: Vec<String> = self.threads.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "RSS {} KiB = main heap {} + arenas {} + stacks {} + eBPF maps mapped {} + files {} + other anon {}; eBPF memlock {} KiB in {} maps (kernel memory); threads: {}",
            self.rss,
            self.main_heap,
            self.arenas,
            self.stacks,
            self.bpf_mapped,
            self.files,
            self.other_anon,
            self.bpf_memlock,
            self.bpf_maps,
            threads.join(", ")
        )
    }
}

struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    path: String,
    rss: u64,
}

fn mappings(pid: u32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let Some(first) = f.next() else { continue };
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            let perms = f.next().unwrap_or_default().to_owned();
            let path = f.nth(3).unwrap_or_default().to_owned();
            out.push(Mapping {
                start,
                end,
                perms,
                path,
                rss: 0,
            });
        } else if first == "Rss:"
            && let Some(m) = out.last_mut()
        {
            m.rss = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    Ok(out)
}

/// The daemon's memory, by kind.
pub fn breakdown(pid: u32) -> Result<Breakdown> {
    let maps = mappings(pid)?;
    let mut b = Breakdown::default();
    let mut others = Vec::new();
    for (i, m) in maps.iter().enumerate() {
        b.rss += m.rss;
        let below = i
            .checked_sub(1)
            .and_then(|j| maps.get(j))
            .filter(|p| p.end == m.start);
        let above = maps.get(i + 1).filter(|n| n.start == m.end);
        if m.path == "[heap]" {
            b.main_heap += m.rss;
        } else if m.path == "[stack]" {
            b.stacks += m.rss;
        } else if m.path.contains("bpf") {
            b.bpf_mapped += m.rss;
        } else if m.path.starts_with('/') {
            b.files += m.rss;
        } else if m.path.is_empty() && m.perms.starts_with("rw") {
            let guard_below =
                below.is_some_and(|p| p.perms.starts_with("---") && p.end - p.start <= 64 << 10);
            let reserve_above = above.is_some_and(|n| n.perms.starts_with("---") && n.path.is_empty());
            if guard_below {
                b.stacks += m.rss;
            } else if reserve_above {
                b.arenas += m.rss;
            } else {
                b.other_anon += m.rss;
                others.push((
                    format!("{:x} ({} KiB mapped)", m.start, (m.end - m.start) >> 10),
                    m.rss,
                ));
            }
        } else {
            b.other_anon += m.rss;
        }
    }
    others.sort_by_key(|(_, r)| std::cmp::Reverse(*r));
    others.truncate(4);
    b.biggest_other = others;
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
        let Ok(s) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        if !s.contains("map_type:") {
            continue;
        }
        b.bpf_maps += 1;
        b.bpf_memlock += s
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
            >> 10;
    }
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        *b.threads.entry(comm.trim().to_owned()).or_insert(0) += 1;
    }
    Ok(b)
}

fn status_field(path: &Path, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{key} in {}", path.display()))
}

/// Voluntary + involuntary context switches over every thread of `pid`.
fn switches(pid: u32) -> Result<u64> {
    let mut sum = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let st = t.path().join("status");
        // A thread that left between the listing and the read counts no more.
        let (Ok(v), Ok(n)) = (
            status_field(&st, "voluntary_ctxt_switches:"),
            status_field(&st, "nonvoluntary_ctxt_switches:"),
        ) else {
            continue;
        };
        sum += v + n;
    }
    Ok(sum)
}

pub struct Figures {
    pub devices: usize,
    /// VmRSS once a second over the window, MiB.
    pub rss_mib: Vec<f64>,
    /// Wake-ups (context switches of all threads) per second, one figure per second.
    pub wakeups: Vec<f64>,
    pub window: Duration,
    pub breakdown: Breakdown,
    /// Seconds from the daemon's start to every device published.
    pub published_s: f64,
}

/// `dranet run` on a node of `devices` veth devices; measured over `window` once it is idle.
pub async fn run(devices: usize, window: Duration) -> Result<Figures> {
    let ns: PodNetns = crate::inventory1k::netns_with(devices)?;
    ns.ip(&["link", "set", "lo", "up"])?;
    let t = Instant::now();
    let node = Node::start(NodeOptions {
        netns: Some(ns.name.clone()),
        node_args: Some(
            [
                "--node-name",
                NODE,
                "--filter",
                VETH_ONLY,
                "--bind-address",
                "127.0.0.1:0",
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
        ..NodeOptions::default()
    })
    .await?;
    let pid = node.daemon_pid().context("no daemon")?;
    // kubelet keeps a health stream open (NodeWatchResources) to every DRA plugin.
    let mut stream = dranet_sim::fixtures::health_stream(&node).await?;
    // Read what the daemon sends, as kubelet does.
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    let slices = DirPublisher::new(node.dir.join("slices"), "dra.net", NODE);
    loop {
        let n: usize = slices
            .read_all()
            .unwrap_or_default()
            .iter()
            .map(|s| s.spec.devices.len())
            .sum();
        if n == devices {
            break;
        }
        if t.elapsed() > Duration::from_secs(90) {
            bail!("{n} of {devices} devices published after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let published_s = t.elapsed().as_secs_f64();
    // Settled: fds and threads held still (the blocking pool's threads gone, the heap trimmed),
    // then 2 s more for the last debounced scan.
    node.daemon_idle_rss_kib().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = Path::new("/proc").join(pid.to_string()).join("status");
    let (mut rss_mib, mut wakeups) = (Vec::new(), Vec::new());
    let mut prev = switches(pid)?;
    for _ in 0..window.as_secs().max(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        #[allow(clippy::cast_precision_loss)]
        rss_mib.push(status_field(&status, "VmRSS:")? as f64 / 1024.0);
        let now = switches(pid)?;
        #[allow(clippy::cast_precision_loss)]
        wakeups.push(now.saturating_sub(prev) as f64);
        prev = now;
    }
    let breakdown = breakdown(pid)?;
    reader.abort();
    drop(node);
    drop(ns);
    Ok(Figures {
        devices,
        rss_mib,
        wakeups,
        window,
        breakdown,
        published_s,
    })
}
