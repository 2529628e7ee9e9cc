//! Hostile clients against the real `dranet run` binary, as root, on the real kernel (issue 19):
//!
//! * **fd flood**: the daemon under a 256-fd limit (soft and hard), 2,000 idle TCP connections
//!   and a slowloris client on its metrics port. Meanwhile a RunPodSandbox with a device and a
//!   CRI-O-order rescue succeed, `/healthz` answers 200, `events.sock` accepts and feeds, and
//!   the daemon uses little CPU;
//! * **Synchronize flood**: 100 parts of 3 MiB with `more = true` are refused past the plugin's
//!   limit, and the daemon's memory stays bounded;
//! * **hostile names**: interface names with `%` (a kernel name template) are refused.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use dranet::nri::pb::nri as pb;
use dranet::nri::plugin::PLUGIN_SERVICE;
use dranet::nri::ttrpc::code;
use dranet_sim::fixtures::{TestPod, nic_device, wait_for};
use dranet_sim::kernel::host_has;
use dranet_sim::nic::Nic;
use dranet_sim::node::{Node, NodeOptions, sandbox};
use dranet_sim::nri_runtime::{Flavor, RuntimeConfig};
use dranet_sim::root_or_skip;
use prost::Message;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

/// The TCP port the process listens on (the daemon binds `127.0.0.1:0`): its listening
/// sockets in `/proc/<pid>/net/tcp`, matched by inode against its fds.
fn listening_port(pid: u32) -> Result<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|t| {
            t.to_string_lossy()
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))?;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
            let port = f[1].rsplit(':').next().context("local address")?;
            return Ok(u16::from_str_radix(port, 16)?);
        }
    }
    bail!("pid {pid} listens on no TCP port")
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ensure!(hz > 0, "CLK_TCK");
    #[expect(
        clippy::cast_precision_loss,
        reason = "tick counts of a test are far below 2^52"
    )]
    Ok(ticks as f64 / hz as f64)
}

/// The test process holds thousands of client sockets: its own soft limit up to the hard one.
/// (With libc, not the daemon's helper, so that this file also builds against older trees.)
fn raise_own_fd_limit(want: u64) -> Result<()> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid, writable rlimit.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut l) };
    ensure!(got == 0, "getrlimit");
    ensure!(
        l.rlim_max >= want,
        "the test needs {want} fds, the hard limit is {}",
        l.rlim_max
    );
    l.rlim_cur = l.rlim_max;
    // SAFETY: `l` is a valid rlimit.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const l) };
    ensure!(set == 0, "setrlimit");
    Ok(())
}

async fn healthz(port: u16) -> Result<String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await?;
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: dranet\r\nConnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    c.read_to_string(&mut out).await?;
    Ok(out)
}

/// `/healthz` answered 200 within `timeout` (retrying a refused, reset or 503 answer).
async fn healthz_ok(port: u16, timeout: Duration) -> Result<Duration> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < timeout {
        match tokio::time::timeout(Duration::from_secs(2), healthz(port)).await {
            Ok(Ok(r)) if r.starts_with("HTTP/1.1 200 ") => return Ok(start.elapsed()),
            Ok(Ok(r)) => last = r,
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "no answer in 2 s".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("/healthz never answered 200 within {timeout:?}; last: {last:?}")
}

/// Opens up to `n` idle connections (each attempt bounded, so a full backlog cannot stall the
/// test) and keeps them.
async fn flood(port: u16, n: usize) -> Vec<TcpStream> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        tasks.spawn(async move {
            tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(("127.0.0.1", port)))
                .await
                .ok()
                .and_then(Result::ok)
        });
    }
    let mut conns = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok(Some(c)) = r {
            conns.push(c);
        }
    }
    conns
}

/// A slowloris client: one byte of a request header every second, until the server closes
/// the connection or `stop` fires. Returns how long the server let it hang on.
async fn slowloris(port: u16, stop: tokio::sync::watch::Receiver<bool>) -> Option<Duration> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let start = Instant::now();
    let header = b"GET /metrics HTTP/1.1\r\nHost: dranet\r\nX-Slow: "
        .iter()
        .chain(std::iter::repeat(&b'a'));
    for b in header {
        if *stop.borrow() {
            return None;
        }
        if c.write_all(&[*b]).await.is_err() {
            return Some(start.elapsed());
        }
        let mut buf = [0u8; 512];
        // End of file, a reset or an answer (408): the server let go.
        if tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf))
            .await
            .is_ok()
        {
            return Some(start.elapsed());
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_flood_leaves_hooks_rescue_health_and_events_working() -> Result<()> {
    root_or_skip!("fd flood");
    raise_own_fd_limit(4096)?;
    let nic = Nic::create()?;
    let node = Node::start(NodeOptions {
        runtime: RuntimeConfig {
            flavor: Flavor::Crio,
            ..RuntimeConfig::default()
        },
        nofile_limit: Some(256),
        ..NodeOptions::default()
    })
    .await?;
    let pid = node.daemon_pid().context("daemon pid")?;
    let port = listening_port(pid)?;
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .context("limits")?;
    ensure!(
        nofile.split_whitespace().filter(|w| *w == "256").count() == 2,
        "daemon limit: {nofile}"
    );

    // The flood: 2,000 idle connections and a slowloris client.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let slow = tokio::spawn(slowloris(port, stop_rx));
    let flood_start = Instant::now();
    let idle = flood(port, 2000).await;
    eprintln!(
        "flood: {} of 2000 connections open after {:?}",
        idle.len(),
        flood_start.elapsed()
    );
    ensure!(
        idle.len() > 256,
        "the flood did not get past the fd limit: {}",
        idle.len()
    );
    let cpu0 = (cpu_seconds(pid)?, Instant::now());

    // Events socket: a `dranet trace` client connects and is fed.
    let events = node.state_dir().join("events.sock");
    let trace = tokio::time::timeout(Duration::from_secs(5), UnixStream::connect(&events))
        .await
        .context("events.sock: no accept in 5 s")?
        .with_context(|| format!("connecting {}", events.display()))?;
    let mut trace = BufReader::new(trace).lines();

    // A pod with the device: Prepare over the kubelet socket, RunPodSandbox over NRI.
    let mut p = TestPod::new("flood-pod-")?;
    p.write_claim(&node, &[nic_device(&nic, json!({"interface": {"name": "net0"}}))])?;
    node.prepare(&p.claim).await.context("Prepare during the flood")?;
    node.runtime
        .run_pod_sandbox(&p.sandbox)
        .await
        .context("RunPodSandbox during the flood")?;
    ensure!(!host_has(&nic.name), "{} still in the host", nic.name);
    ensure!(p.has("net0"), "net0 not in the pod");
    let fed = tokio::time::timeout(Duration::from_secs(5), trace.next_line())
        .await
        .context("events.sock fed nothing within 5 s of RunPodSandbox")??
        .context("events.sock closed")?;
    ensure!(fed.contains(&p.uid), "unexpected activity line: {fed}");

    // /healthz answers, through the flood.
    let took = healthz_ok(port, Duration::from_secs(15)).await?;
    eprintln!("/healthz 200 after {took:?}");

    // CRI-O order: the netns is unmounted and unlinked first; the device comes home at once.
    p.ns.remove_crio_style()?;
    let took = wait_for(
        &format!("{} home after the netns teardown", nic.name),
        Duration::from_secs(5),
        || host_has(&nic.name),
    )
    .await?;
    eprintln!("rescue during the flood: home after {took:?}");
    p.stop_and_remove(&node).await?;

    // CPU over the flood: an accept loop spinning on EMFILE burns a whole core.
    let window = Duration::from_secs(5);
    tokio::time::sleep(
        window
            .saturating_sub(cpu0.1.elapsed())
            .max(Duration::from_secs(1)),
    )
    .await;
    let cpu1 = cpu_seconds(pid)?;
    let wall = cpu0.1.elapsed().as_secs_f64();
    let share = (cpu1 - cpu0.0) / wall;
    eprintln!(
        "daemon CPU during the flood: {:.1} % of one core over {wall:.1} s",
        share * 100.0
    );
    ensure!(
        share < 0.20,
        "daemon used {:.0} % of a core during the flood",
        share * 100.0
    );

    // The slowloris client was dropped (the header timeout is 2 s).
    let _ = stop_tx.send(true);
    let held = tokio::time::timeout(Duration::from_secs(10), slow).await??;
    ensure!(
        held.is_some_and(|d| d < Duration::from_secs(10)),
        "slowloris client still connected: {held:?}"
    );
    drop(idle);
    node.unprepare(&p.claim).await?;
    ensure!(node.pins().is_empty(), "pins left: {:?}", node.pins());
    Ok(())
}

/// 3 MiB of pods (large annotations), the way a runtime splits a big Synchronize.
fn sync_part(tag: usize, more: bool) -> Bytes {
    let pods = (0..96)
        .map(|i| {
            let mut p = sandbox(&format!("sync-{tag}-{i}"), Path::new("/run/netns/none"));
            p.annotations.insert("big".into(), "x".repeat(32 << 10));
            p
        })
        .collect();
    let req = pb::SynchronizeRequest {
        pods,
        containers: Vec::new(),
        more,
    };
    Bytes::from(req.encode_to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronize_flood_is_refused_past_the_cap_with_bounded_memory() -> Result<()> {
    root_or_skip!("Synchronize flood");
    let node = Node::start(NodeOptions::default()).await?;
    let rss0 = node.daemon_rss_kib()?;
    let part = sync_part(0, true);
    ensure!(part.len() > 3 << 20, "part of {} bytes", part.len());
    let (mut refused, mut first_refusal, mut peak) = (0, None, rss0);
    for i in 0..100 {
        match node
            .runtime
            .call_raw(PLUGIN_SERVICE, "Synchronize", part.clone())
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some(code::RESOURCE_EXHAUSTED) => {
                refused += 1;
                first_refusal.get_or_insert(i);
                if refused == 1 {
                    eprintln!("part {i} refused: {e:?}");
                }
            }
            Err(e) => bail!("part {i}: {e:?}"),
        }
        peak = peak.max(node.daemon_rss_kib()?);
    }
    let growth = peak.saturating_sub(rss0);
    eprintln!(
        "Synchronize flood: {refused} of 100 parts refused, first at part {first_refusal:?}; RSS {rss0} KiB, peak +{growth} KiB"
    );
    let first = first_refusal.context("no part was refused: Synchronize buffering is unbounded")?;
    ensure!(
        first <= 8,
        "first refusal only at part {first} (> 24 MiB buffered)"
    );
    ensure!(
        refused == 100 - first,
        "every part after the overflow must be refused"
    );
    ensure!(growth < 64 << 10, "RSS grew by {growth} KiB");
    // The last part ends the refused synchronization; the next one is served again.
    let last = node
        .runtime
        .call_raw(PLUGIN_SERVICE, "Synchronize", sync_part(1, false))
        .await;
    ensure!(
        last.as_ref()
            .err()
            .and_then(dranet_sim::nri_runtime::RuntimeError::code)
            == Some(code::RESOURCE_EXHAUSTED),
        "the last part of an overflowed synchronization: {last:?}"
    );
    let fresh = pb::SynchronizeRequest::default().encode_to_vec();
    node.runtime
        .call_raw(PLUGIN_SERVICE, "Synchronize", fresh.into())
        .await
        .context("a fresh Synchronize after the overflow")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interface_names_with_percent_are_refused() -> Result<()> {
    // The kernel's rule, enforced where every name reaches the kernel (attach, sysctls).
    for bad in ["eth%d", "%", "net%1"] {
        ensure!(
            dranet::sys::link::validate_ifname(bad).is_err(),
            "validate_ifname accepts {bad:?}"
        );
    }
    dranet::sys::link::validate_ifname("net0")?;
    root_or_skip!("hostile names");
    // A claim asking for `eth%d` fails Prepare, saying why, and nothing moves.
    let nic = Nic::create()?;
    let node = Node::start(NodeOptions::default()).await?;
    let p = TestPod::new("pct-pod-")?;
    p.write_claim(
        &node,
        &[nic_device(&nic, json!({"interface": {"name": "eth%d"}}))],
    )?;
    let err = node
        .prepare(&p.claim)
        .await
        .err()
        .context("Prepare accepted interface name eth%d")?;
    let msg = format!("{err:#}");
    ensure!(msg.contains("eth%d") && msg.contains('%'), "unclear error: {msg}");
    ensure!(host_has(&nic.name), "{} left the host", nic.name);
    Ok(())
}
