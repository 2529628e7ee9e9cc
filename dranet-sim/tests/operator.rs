//! What an operator meets first, with the real binary: a runtime with NRI off, a typo in a flag
//! or a path, a node without a cluster.
//!
//! * NRI off (containerd 1.7's default): dranet stays live (`/healthz` 200, so the DaemonSet's
//!   liveness probe does not restart-loop it), is not ready (`/readyz` 503 naming the socket and
//!   how to enable NRI), and says so at once in a WARN, then not again for minutes.
//! * Bad input fails at once, before anything starts: a `--filter` that does not compile, an
//!   explicit `--kubeconfig` that does not exist, `status` / `release-all` on a missing state
//!   dir (which `release-all` must not create).
//! * Embedded mode (no kubeconfig, not in a cluster) connects nowhere off the machine: the
//!   daemon runs under `strace -f -e trace=connect` and every IP address it dials is loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dranet_sim::kernel::dranet_bin;
use dranet_sim::node::{free_port, http_get};
use dranet_sim::root_or_skip;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<Self> {
        let d = std::env::temp_dir().join(format!("dranet-operator-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(Self(d))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed (SIGTERM, then SIGKILL) on drop.
struct Daemon(Child);

impl Daemon {
    fn stop(&mut self, pid: i32) {
        // SAFETY: kill(2) on a pid this test started; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let pid = i32::try_from(self.0.id()).unwrap_or(0);
            self.stop(pid);
        }
    }
}

/// The arguments of an embedded-mode daemon in `dir` (no cluster, no runtime at `nri.sock`).
fn embedded_args(dir: &Path, port: u16) -> Vec<String> {
    let p = |s: &str| dir.join(s).display().to_string();
    vec![
        "run".into(),
        "--node-name=operator-node".into(),
        "--filter=".into(),
        format!("--bind-address=127.0.0.1:{port}"),
        format!("--state-dir={}", p("state")),
        format!("--kubelet-root-dir={}", p("kubelet")),
        format!("--nri-socket={}", p("no-runtime/nri.sock")),
        format!("--slices-dir={}", p("slices")),
        format!("--claims-dir={}", p("claims")),
        "--no-probes".into(),
    ]
}

async fn wait_status(addr: &str, path: &str, code: u16, within: Duration) -> Result<String> {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < within {
        match http_get(addr, path).await {
            Ok((c, body)) if c == code => return Ok(body),
            other => last = Some(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{path} did not answer {code} within {within:?}; last: {last:?}")
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

const UNREACHABLE: &str = "cannot reach the runtime's NRI socket";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_without_nri_leaves_dranet_live_not_ready_and_says_why() -> Result<()> {
    root_or_skip!("a_runtime_without_nri_leaves_dranet_live_not_ready_and_says_why");
    let dir = TempDir::new("nri-off")?;
    let port = free_port()?;
    let log = dir.0.join("stderr.log");
    let child = Command::new(dranet_bin()?)
        .args(embedded_args(&dir.0, port))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let mut daemon = Daemon(child);
    let addr = format!("127.0.0.1:{port}");
    let health = wait_status(&addr, "/healthz", 200, Duration::from_secs(20)).await?;
    assert_eq!(health.trim(), "ok");
    let ready = wait_status(&addr, "/readyz", 503, Duration::from_secs(5)).await?;
    let socket = dir.0.join("no-runtime/nri.sock").display().to_string();
    for want in ["nri: ", socket.as_str(), "is NRI enabled"] {
        assert!(ready.contains(want), "/readyz lacks {want:?}: {ready}");
    }
    // The WARN is there at once (by the time /healthz answers, the first attempt has failed).
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(&log)?;
        if count(&text, UNREACHABLE) >= 1 {
            let line = text.lines().find(|l| l.contains(UNREACHABLE)).unwrap_or_default();
            assert!(line.contains("WARN"), "not a WARN: {line}");
            assert!(
                line.contains(&socket),
                "the WARN does not name the socket: {line}"
            );
            assert!(line.contains("enable_nri"), "the WARN does not say how: {line}");
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "no WARN about NRI in 5 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ... and not again while the daemon retries (backoff up to 5 s, WARN every 5 min).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let text = std::fs::read_to_string(&log)?;
    assert_eq!(
        count(&text, UNREACHABLE),
        1,
        "the WARN is not rate-limited:\n{text}"
    );
    assert_eq!(
        http_get(&addr, "/healthz").await?.0,
        200,
        "still live after retries"
    );
    let pid = i32::try_from(daemon.0.id())?;
    daemon.stop(pid);
    Ok(())
}

/// Runs `dranet <args>` to its end (at most `within`), returning (exit code, stderr, elapsed).
fn run_to_end(args: &[String], within: Duration) -> Result<(Option<i32>, String, Duration)> {
    // Built (if need be) before the clock starts.
    let bin = dranet_bin()?;
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    loop {
        if let Some(st) = child.try_wait()? {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                std::io::Read::read_to_string(&mut e, &mut err)?;
            }
            return Ok((st.code(), err, start.elapsed()));
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            bail!("dranet {args:?} still running after {within:?}: the error was not caught early");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_input_fails_before_anything_starts() -> Result<()> {
    let dir = TempDir::new("early")?;
    let port = free_port()?;
    let mut bad_filter = embedded_args(&dir.0, port);
    bad_filter.push("--filter=attributes[".into());
    let (code, err, took) = run_to_end(&bad_filter, Duration::from_secs(10))?;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--filter"), "{err}");
    for started in ["probe", "start-up reconcile", "serving /healthz"] {
        assert!(
            !err.contains(started),
            "{started:?} ran before the filter was checked:\n{err}"
        );
    }
    eprintln!("bad --filter refused in {took:?}");
    assert!(
        !dir.0.join("state").exists(),
        "the state dir was made before the filter was checked"
    );

    let mut bad_kubeconfig = embedded_args(&dir.0, port);
    bad_kubeconfig.retain(|a| !a.starts_with("--slices-dir") && !a.starts_with("--claims-dir"));
    bad_kubeconfig.push(format!(
        "--kubeconfig={}",
        dir.0.join("typo/kubeconfig").display()
    ));
    let (code, err, _) = run_to_end(&bad_kubeconfig, Duration::from_secs(10))?;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--kubeconfig"), "{err}");

    let typo = dir.0.join("typo-state");
    let (code, err, _) = run_to_end(
        &["status".into(), format!("--state-dir={}", typo.display())],
        Duration::from_secs(10),
    )?;
    assert_eq!(code, Some(1), "status on a missing state dir exits 1: {err}");
    assert!(err.contains("no such directory"), "{err}");
    let (code, err, _) = run_to_end(
        &["release-all".into(), format!("--state-dir={}", typo.display())],
        Duration::from_secs(10),
    )?;
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no such directory"), "{err}");
    assert!(!typo.exists(), "release-all created the mistyped state dir");
    Ok(())
}

/// IPv4 and IPv6 addresses that `strace` prints for a `connect(2)` of an IP socket.
fn dialled_addresses(trace: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in trace.lines().filter(|l| l.contains("connect(")) {
        for (open, close) in [("inet_addr(\"", "\")"), ("inet_pton(AF_INET6, \"", "\"")] {
            if let Some(i) = line.find(open) {
                let rest = &line[i + open.len()..];
                if let Some(j) = rest.find(close) {
                    out.push(rest[..j].to_owned());
                }
            }
        }
    }
    out
}

fn loopback(a: &str) -> bool {
    a.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback() || ip.is_unspecified())
}

#[test]
fn strace_addresses_are_read() {
    let t = r#"12 connect(9, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("169.254.169.254")}, 16) = -1 ENETUNREACH
13 connect(10, {sa_family=AF_INET6, sin6_port=htons(80), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "::1", &sin6_addr), sin6_scope_id=0}, 28) = 0
14 connect(11, {sa_family=AF_UNIX, sun_path="/x/nri.sock"}, 110) = -1 ENOENT"#;
    assert_eq!(dialled_addresses(t), ["169.254.169.254", "::1"]);
    assert!(!loopback("169.254.169.254"));
    assert!(loopback("::1") && loopback("127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_connects_nowhere_off_the_machine() -> Result<()> {
    root_or_skip!("embedded_mode_connects_nowhere_off_the_machine");
    let strace = Path::new("/usr/bin/strace");
    if !strace.exists() {
        ensure!(
            std::env::var("CI").as_deref() != Ok("true"),
            "strace is missing (scripts/install-toolchain.sh installs it)"
        );
        eprintln!("SKIP: no strace");
        return Ok(());
    }
    let dir = TempDir::new("offline")?;
    let port = free_port()?;
    let trace = dir.0.join("connect.trace");
    // As the demo's daemon runs (no kubeconfig, no hint): strace follows every thread.
    let child = Command::new(strace)
        .args(["-f", "-qq", "-e", "trace=connect", "-o"])
        .arg(&trace)
        .arg(dranet_bin()?)
        .args(embedded_args(&dir.0, port))
        .env("RUST_LOG", "info")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", &dir.0)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.0.join("stderr.log"))?)
        .spawn()?;
    let mut daemon = Daemon(child);
    let addr = format!("127.0.0.1:{port}");
    wait_status(&addr, "/healthz", 200, Duration::from_secs(30)).await?;
    // The kubelet side (inventory, cloud providers) is up once the first slices are written;
    // detection would dial at once. Give it a few seconds more.
    let slices = dir.0.join("slices");
    let start = Instant::now();
    while std::fs::read_dir(&slices).map_or(0, Iterator::count) == 0 {
        ensure!(start.elapsed() < Duration::from_secs(20), "no slices written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    // Stop dranet itself (strace's child), so strace writes the trace out and exits.
    let strace_pid = daemon.0.id();
    let children = std::fs::read_to_string(format!("/proc/{strace_pid}/task/{strace_pid}/children"))
        .context("strace's children")?;
    let pid: i32 = children
        .split_whitespace()
        .next()
        .context("strace has no child")?
        .parse()?;
    daemon.stop(pid);
    let text = std::fs::read_to_string(&trace)?;
    ensure!(
        text.contains("AF_UNIX"),
        "the trace saw no connect at all (not even the NRI socket's): is strace following threads?\n{text}"
    );
    let off: Vec<String> = dialled_addresses(&text)
        .into_iter()
        .filter(|a| !loopback(a))
        .collect();
    assert!(
        off.is_empty(),
        "embedded mode dialled off the machine: {off:?}\n{}",
        text.lines()
            .filter(|l| l.contains("inet"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// A SIGTERM at any moment of start-up ends the daemon cleanly (exit 0, pins kept): from the
/// start of `run` on, the signal is held for the next wait, never lost between two waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_during_start_up_is_never_lost() -> Result<()> {
    root_or_skip!("a_sigterm_during_start_up_is_never_lost");
    let bin = dranet_bin()?;
    for delay_ms in [300u64, 1200] {
        let dir = TempDir::new(&format!("term-{delay_ms}"))?;
        let port = free_port()?;
        let child = Command::new(&bin)
            .args(embedded_args(&dir.0, port))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.0.join("stderr.log"))?)
            .spawn()?;
        let mut daemon = Daemon(child);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let pid = i32::try_from(daemon.0.id())?;
        // SAFETY: kill(2) on a pid this test started; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(st) = daemon.0.try_wait()? {
                break st;
            }
            ensure!(
                Instant::now() < until,
                "SIGTERM {delay_ms} ms into start-up was lost: still running 20 s later\n{}",
                std::fs::read_to_string(dir.0.join("stderr.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Before the daemon listens (the first milliseconds of the process) the default action
        // ends it; from `run` on, it stops cleanly.
        eprintln!("SIGTERM at {delay_ms} ms: {status:?}");
        assert!(
            status.success() || status.code().is_none(),
            "SIGTERM at {delay_ms} ms: {status:?}"
        );
    }
    Ok(())
}
