//! Logs and metrics as a cluster's tooling reads them, with the real binary:
//!
//! * `dranet --version` names the git revision and the compiler;
//! * text logs carry no ANSI escape when stderr is not a terminal (here a pipe);
//! * with `--log-format json` every line the daemon writes, on stderr and stdout (the `dranet
//!   ready` marker), is a JSON object with component-base's `ts`, `v` and `msg`; the start-up
//!   lines name the version and revision and give the configuration as fields;
//! * `/metrics` of the running daemon answers the text format 0.0.4 without `Accept` and
//!   OpenMetrics when asked, with the standard `process_*` families and `dranet_build_info`.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use dranet_sim::kernel::dranet_bin;
use dranet_sim::node::free_port;
use dranet_sim::root_or_skip;
use serde_json::Value;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Result<Self> {
        let d = std::env::temp_dir().join(format!("dranet-telemetry-{tag}-{}", std::process::id()));
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

/// A daemon killed on drop (if still running).
struct Daemon(Child);

impl Daemon {
    /// SIGTERM, then what it wrote on stdout and stderr once it exited (SIGKILL after 10 s).
    fn stop(mut self) -> Result<(Vec<u8>, Vec<u8>)> {
        let pid = i32::try_from(self.0.id())?;
        // SAFETY: kill(2) on a pid this test started; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(10);
        while self.0.try_wait()?.is_none() {
            if Instant::now() > until {
                let _ = self.0.kill();
                let _ = self.0.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        if let Some(mut o) = self.0.stdout.take() {
            o.read_to_end(&mut out)?;
        }
        if let Some(mut e) = self.0.stderr.take() {
            e.read_to_end(&mut err)?;
        }
        Ok((out, err))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// An embedded-mode daemon in `dir` (no cluster, no runtime, no probes, no cloud), its stdout and
/// stderr piped.
fn start(dir: &Path, port: u16, extra: &[&str]) -> Result<Daemon> {
    let p = |s: &str| dir.join(s).display().to_string();
    let child = Command::new(dranet_bin()?)
        .args([
            "run".to_owned(),
            "--node-name=telemetry-node".to_owned(),
            format!("--bind-address=127.0.0.1:{port}"),
            format!("--state-dir={}", p("state")),
            format!("--kubelet-root-dir={}", p("kubelet")),
            format!("--slices-dir={}", p("slices")),
            format!("--claims-dir={}", p("claims")),
            "--no-probes".to_owned(),
            "--no-nri".to_owned(),
            "--cloud-provider-hint=NONE".to_owned(),
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    Ok(Daemon(child))
}

/// `GET /metrics` with `accept` (none if `None`): (`Content-Type`, body).
fn scrape(port: u16, accept: Option<&str>) -> Result<(String, String)> {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    let (head, body) = r.split_once("\r\n\r\n").context("no HTTP header end")?;
    ensure!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let ct = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .context("no Content-Type")?;
    Ok((ct, body.to_owned()))
}

/// Waits for `/metrics` to answer (the endpoint is up).
fn wait_endpoint(port: u16, within: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        match scrape(port, None) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() > within => bail!("/metrics did not answer in {within:?}: {e:#}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

#[test]
fn version_names_the_revision_and_the_compiler() -> Result<()> {
    let out = Command::new(dranet_bin()?).arg("--version").output()?;
    ensure!(out.status.success(), "{out:?}");
    let v = String::from_utf8(out.stdout)?;
    let rest = v
        .trim()
        .strip_prefix(concat!("dranet ", env!("CARGO_PKG_VERSION"), " (revision "))
        .with_context(|| format!("no version and revision: {v}"))?;
    let (rev, rustc) = rest.split_once(", rustc ").with_context(|| v.clone())?;
    ensure!(
        rev == "unknown" || (rev.len() == 12 && rev.bytes().all(|b| b.is_ascii_hexdigit())),
        "revision {rev:?} in {v}"
    );
    ensure!(rustc.ends_with(')') && rustc.starts_with("1."), "{v}");
    Ok(())
}

#[test]
fn text_logs_carry_no_ansi_codes_when_stderr_is_a_pipe() -> Result<()> {
    root_or_skip!("text_logs_carry_no_ansi_codes_when_stderr_is_a_pipe");
    let dir = TempDir::new("text")?;
    let port = free_port()?;
    let daemon = start(&dir.0, port, &[])?;
    wait_endpoint(port, Duration::from_secs(20))?;
    let (out, err) = daemon.stop()?;
    let text = String::from_utf8_lossy(&err);
    ensure!(
        !err.contains(&0x1b) && !out.contains(&0x1b),
        "ANSI escape in the logs:\n{text:?}"
    );
    let starting = text
        .lines()
        .find(|l| l.contains("dranet starting"))
        .with_context(|| format!("no start-up line:\n{text}"))?;
    ensure!(
        starting.contains(concat!("version=", env!("CARGO_PKG_VERSION"))) && starting.contains("revision="),
        "{starting}"
    );
    ensure!(text.contains(" INFO "), "{text}");
    Ok(())
}

fn json_lines(what: &str, bytes: &[u8]) -> Result<Vec<Value>> {
    let text = String::from_utf8(bytes.to_vec())?;
    text.lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).with_context(|| format!("{what} line is not JSON: {l:?}"))?;
            ensure!(
                v["ts"].as_f64().is_some_and(|t| t > 1.6e9) && v["v"].is_u64() && v["msg"].is_string(),
                "{what} line lacks ts/v/msg: {l}"
            );
            Ok(v)
        })
        .collect()
}

#[test]
fn json_mode_writes_only_json_lines_and_metrics_negotiate() -> Result<()> {
    root_or_skip!("json_mode_writes_only_json_lines_and_metrics_negotiate");
    let dir = TempDir::new("json")?;
    let port = free_port()?;
    let mut daemon = start(&dir.0, port, &["--log-format=json"])?;
    // The ready marker on stdout, as a JSON line.
    let stdout = daemon.0.stdout.take().context("stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let ready = rx
        .recv_timeout(Duration::from_secs(30))
        .context("no ready line on stdout in 30 s")?;
    let v: Value =
        serde_json::from_str(&ready).with_context(|| format!("ready line is not JSON: {ready}"))?;
    ensure!(v["msg"] == "dranet ready" && v["v"] == 0, "{ready}");

    let (ct, text) = scrape(port, None)?;
    ensure!(ct == "text/plain; version=0.0.4; charset=utf-8", "{ct}");
    ensure!(!text.contains("# EOF"), "{text}");
    for want in [
        "# TYPE process_cpu_seconds_total counter\n",
        "# TYPE process_resident_memory_bytes gauge\n",
        "# TYPE process_open_fds gauge\n",
        "# TYPE process_max_fds gauge\n",
        "# TYPE process_virtual_memory_bytes gauge\n",
        "# TYPE process_start_time_seconds gauge\n",
        "# TYPE dranet_build_info gauge\n",
        "# TYPE dranet_nri_registrations_total counter\n",
    ] {
        ensure!(text.contains(want), "{want:?} missing:\n{text}");
    }
    let rss: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes ")?.parse().ok())
        .context("no RSS sample")?;
    ensure!(rss > 1e6, "RSS {rss}");
    for l in text.lines() {
        let name = l
            .strip_prefix("# TYPE ")
            .or(l.strip_prefix("# HELP "))
            .unwrap_or(l);
        ensure!(
            name.starts_with("dranet_") || name.starts_with("process_"),
            "not dranet_-prefixed: {l}"
        );
    }
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let (ct, om) = scrape(port, Some(prometheus))?;
    ensure!(
        ct.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ct}"
    );
    ensure!(
        om.ends_with("# EOF\n") && om.contains("# TYPE dranet_build info\n"),
        "{om}"
    );

    let (_, err) = daemon.stop()?;
    let lines = json_lines("stderr", &err)?;
    // The rest of stdout (the reader thread ends at its end of file).
    let mut out = String::new();
    while let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
        out.push_str(&l);
        out.push('\n');
    }
    json_lines("stdout", out.as_bytes())?;
    ensure!(!err.contains(&0x1b), "ANSI escape in JSON logs");
    let find = |msg: &str| {
        lines
            .iter()
            .find(|l| l["msg"] == msg)
            .with_context(|| format!("no {msg:?} line in {lines:#?}"))
    };
    let starting = find("dranet starting")?;
    ensure!(
        starting["version"] == env!("CARGO_PKG_VERSION") && starting["revision"].is_string(),
        "{starting}"
    );
    let config = find("configuration")?;
    ensure!(
        config["node_name"] == "telemetry-node" && config["no_nri"] == true && config["no_probes"] == true,
        "the configuration is not fields: {config}"
    );
    let reconcile = find("start-up reconcile")?;
    ensure!(
        reconcile["adopted"] == 0 && reconcile["checkpoint"].is_string(),
        "{reconcile}"
    );
    Ok(())
}
