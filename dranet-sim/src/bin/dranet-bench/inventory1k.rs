//! 1,024 devices: `inventory::scan` + `slices::build_slices` of 1,024 veth devices in a private
//! netns (baseline: the bare rtnetlink link dump of it); then the real daemon run inside that
//! netns (`ip netns exec`, so sysfs is the netns's too) publishing them to a slices dir: 8
//! slices of 128, its idle RSS, and what one renamed device costs (rescans, daemon CPU, rename →
//! new name published).
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::inventory::{NetnsTarget, ScanOptions};
use dranet::slices::DirPublisher;
use dranet_sim::kernel::{PodNetns, dranet_bin, unique};

use crate::drain::cpu_ms;
use crate::fleet::ip_batch;
use crate::latency::StateDir;
use crate::stats::{Row, pct};

pub const DEVICES: usize = 1024;
const NODE: &str = "bench-node";
const VETH_ONLY: &str = r#""dra.net/type" in attributes && attributes["dra.net/type"].StringValue == "veth""#;

/// A private netns holding `n` veth devices (`n / 2` pairs, DOWN): `ia<i>` and `ib<i>`.
pub fn netns_with(n: usize) -> Result<PodNetns> {
    let ns = PodNetns::create(&unique("drbench-inv-"))?;
    let mut batch = String::new();
    for i in 0..n / 2 {
        batch.push_str(&format!("link add ia{i} type veth peer name ib{i}\n"));
    }
    ip_batch(Some(&ns.name), &batch).with_context(|| format!("creating {n} veth devices"))?;
    Ok(ns)
}

pub struct Figures {
    pub scan_ms: Vec<f64>,
    pub dump_ms: Vec<f64>,
    pub devices: usize,
    pub slices: Vec<usize>,
    pub rss_mib: Vec<f64>,
    pub daemon_slices: Vec<usize>,
    pub rename: Rename,
}

/// One renamed device.
#[derive(Default)]
pub struct Rename {
    pub scans: u64,
    pub cpu_ms: f64,
    pub to_published_ms: f64,
    pub scan_ms: f64,
}

pub async fn run(rounds: usize, idle: Duration) -> Result<Figures> {
    let ns = netns_with(DEVICES)?;
    // As the daemon below: the veth devices only (a PCI NIC of the host shows through sysfs).
    let opts = ScanOptions {
        netns: NetnsTarget::Path(ns.path.clone()),
        filter: Some(dranet::inventory::Filter::compile(VETH_ONLY)?.context("the filter")?),
        ..ScanOptions::default()
    };
    let (mut scan_ms, mut dump_ms) = (Vec::new(), Vec::new());
    let (mut devices, mut slices) = (0, Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let devs = dranet::inventory::scan(&opts)?;
        let built = dranet::slices::build_slices("dra.net", NODE, 1, None, &devs);
        scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
        devices = devs.len();
        slices = built.iter().map(|s| s.spec.devices.len()).collect();
        let t = Instant::now();
        let nl = dranet::sys::netns::Netns::open_path(&ns.path)?;
        let link = dranet::sys::link::Netlink::in_netns(&nl).await?;
        let links = link.links().await?;
        dump_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if links.len() < DEVICES {
            bail!("the dump saw {} links", links.len());
        }
    }
    let daemon = Daemon::start(&ns).await?;
    let daemon_slices = daemon.wait_slices(DEVICES, Duration::from_secs(60)).await?;
    daemon.wait_quiet(Duration::from_secs(20)).await?;
    let mut rss_mib = Vec::new();
    for _ in 0..idle.as_secs().max(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        #[allow(clippy::cast_precision_loss)]
        rss_mib.push(daemon.rss_kib()? as f64 / 1024.0);
    }
    let rename = daemon.rename(&ns, "ia0", "iz0").await?;
    Ok(Figures {
        scan_ms,
        dump_ms,
        devices,
        slices,
        rss_mib,
        daemon_slices,
        rename,
    })
}

/// `dranet run` inside the netns: no NRI, no kubelet (slices go to a directory), probes on.
struct Daemon {
    child: Child,
    dir: PathBuf,
    port: u16,
    netns: PathBuf,
    _state: StateDir,
}

impl Daemon {
    async fn start(ns: &PodNetns) -> Result<Self> {
        ns.ip(&["link", "set", "lo", "up"])?;
        let dir = std::env::temp_dir().join(unique("drbench-inv-node-"));
        std::fs::create_dir_all(dir.join("claims"))?;
        let state = StateDir::new()?;
        let port = dranet_sim::node::free_port()?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .arg(dranet_bin()?)
            .args(["run", "--node-name", NODE, "--no-nri"])
            // The veth devices only: the host's PCI NIC shows through sysfs as a device with no
            // netdev here, and would make a ninth slice.
            .args(["--filter", VETH_ONLY])
            .args(["--cloud-provider-hint", "NONE", "--profile-provider", "none"])
            .arg("--bind-address")
            .arg(format!("127.0.0.1:{port}"));
        dranet_sim::fixtures::embedded_dirs(&mut cmd, &dir, &state.0);
        let mut child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning dranet run in the netns")?;
        let stdout = child.stdout.take().context("daemon stdout")?;
        let me = Self {
            child,
            dir,
            port,
            netns: ns.path.clone(),
            _state: state,
        };
        if !dranet_sim::fixtures::until_ready(stdout, Duration::from_secs(90)).await? {
            bail!("the daemon exited before it was ready");
        }
        Ok(me)
    }

    fn pid(&self) -> u32 {
        // `ip netns exec` execs the daemon: same pid.
        self.child.id()
    }

    fn rss_kib(&self) -> Result<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("VmRSS")
    }

    fn slices(&self) -> Vec<dranet::slices::ResourceSlice> {
        DirPublisher::new(self.dir.join("slices"), "dra.net", NODE)
            .read_all()
            .unwrap_or_default()
    }

    /// Waits until the slices hold `n` devices; their sizes.
    async fn wait_slices(&self, n: usize, timeout: Duration) -> Result<Vec<usize>> {
        let start = Instant::now();
        loop {
            let sizes: Vec<usize> = self.slices().iter().map(|s| s.spec.devices.len()).collect();
            if sizes.iter().sum::<usize>() == n {
                return Ok(sizes);
            }
            if start.elapsed() > timeout {
                bail!("slices hold {sizes:?} devices after {timeout:?}, want {n}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET /metrics` from inside the netns (a thread joins it to connect).
    fn metrics(&self) -> Result<String> {
        let (ns, port) = (self.netns.clone(), self.port);
        std::thread::spawn(move || -> Result<String> {
            let f = std::fs::File::open(&ns)?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)?;
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("metrics thread panicked"))?
    }

    fn metric(&self, name: &str) -> Result<f64> {
        let text = self.metrics()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("{name} not in /metrics"))
    }

    /// Waits until no scan happened for 3 s (the start-up scans are over).
    async fn wait_quiet(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut last = self.metric("dranet_inventory_scans_total")?;
        let mut since = Instant::now();
        while since.elapsed() < Duration::from_secs(3) {
            if start.elapsed() > timeout {
                bail!("the daemon kept scanning for {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.metric("dranet_inventory_scans_total")?;
            if now != last {
                last = now;
                since = Instant::now();
            }
        }
        Ok(())
    }

    /// Renames `from` to `to` in the netns; waits until the new name is published and the
    /// rescans are over (3 s with none).
    async fn rename(&self, ns: &PodNetns, from: &str, to: &str) -> Result<Rename> {
        let scans0 = self.metric("dranet_inventory_scans_total")?;
        let secs0 = self.metric("dranet_inventory_scan_seconds_sum")?;
        let cpu0 = cpu_ms(self.pid())?;
        let t = Instant::now();
        ns.ip(&["link", "set", from, "name", to])?;
        let want = dranet::inventory::netdev_device_name(to);
        let published = loop {
            if self
                .slices()
                .iter()
                .any(|s| s.spec.devices.iter().any(|d| d.name == want))
            {
                break t.elapsed();
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("{to} not published 30 s after the rename");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        self.wait_quiet(Duration::from_secs(30)).await?;
        let scans = self.metric("dranet_inventory_scans_total")? - scans0;
        let secs = self.metric("dranet_inventory_scan_seconds_sum")? - secs0;
        // The daemon idles in between: its CPU over the window is the rename's.
        let cpu = cpu_ms(self.pid())? - cpu0;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(Rename {
            scans: scans as u64,
            cpu_ms: cpu,
            to_published_ms: published.as_secs_f64() * 1e3,
            scan_ms: if scans > 0.0 { secs / scans * 1e3 } else { 0.0 },
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn rows(f: &Figures) -> Vec<Row> {
    let mut rows = Vec::new();
    let r = Row::latency(
        format!("inventory scan+slices ({} devices)", f.devices),
        "ms",
        &f.scan_ms,
        Some(&f.dump_ms),
    );
    let p99 = pct(&f.scan_ms, 99.0);
    let eight = f.slices.len() == 8 && f.slices.iter().all(|n| *n == 128);
    rows.push(
        r.goal("p99 <= 50 ms, 8 slices of 128", p99 <= 50.0 && eight)
            .note(format!(
                "private netns, 512 veth pairs; slices {:?}; baseline: bare rtnetlink link dump of the netns",
                f.slices
            )),
    );
    let rss = Row::latency(
        format!("idle RSS, {} devices published (MiB)", f.devices),
        "MiB",
        &f.rss_mib,
        None,
    );
    let daemon_eight = f.daemon_slices.len() == 8 && f.daemon_slices.iter().all(|n| *n == 128);
    let pass = rss.p99.unwrap_or(f64::MAX) <= 32.0 && daemon_eight;
    rows.push(rss.goal("<= 32 MiB, 8 slices of 128", pass).note(format!(
        "dranet run inside the netns (ip netns exec), probes on, slices to a directory: {:?}",
        f.daemon_slices
    )));
    let rn = &f.rename;
    let one = Row {
        metric: "inventory: one device renamed".into(),
        unit: "ms",
        samples: 1,
        p50: Some(rn.to_published_ms),
        p99: Some(rn.to_published_ms),
        baseline_p50: None,
        baseline_p99: None,
        ratio: None,
        goal: String::new(),
        pass: None,
        note: String::new(),
    };
    rows.push(one.goal("exactly 1 rescan", rn.scans == 1).note(format!(
        "rename -> new name published {:.0} ms (150 ms debounce included); {} rescan(s), {:.1} ms each; daemon CPU {:.0} ms",
        rn.to_published_ms, rn.scans, rn.scan_ms, rn.cpu_ms
    )));
    rows
}
