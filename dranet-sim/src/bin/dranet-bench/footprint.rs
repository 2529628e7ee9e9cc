//! Footprint of an idle dranet (until `dranet run` exists): a child process running the watcher
//! (probes loaded) and the engine's event loop, nothing else. Reads VmRSS and the context
//! switches of all its threads (voluntary + involuntary = wake-ups) over a window.
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dranet::rescue::{Engine, EngineOptions};
use dranet::watch::{Watcher, WatcherOptions};

use crate::latency::StateDir;

/// The child: `dranet-bench --idle-child` runs this and never returns.
pub fn child() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let state = StateDir::new()?;
        // Diagnostics only: DRANET_BENCH_IDLE=no-ebpf / no-inotify drop one source.
        let variant = std::env::var("DRANET_BENCH_IDLE").unwrap_or_default();
        let mut wopts = WatcherOptions::default();
        if variant == "no-ebpf" {
            wopts.ebpf = false;
        }
        if variant == "no-inotify" {
            wopts.netns_dirs = Vec::new();
        }
        let watcher = Watcher::start(wopts).await?;
        let sub = watcher.subscribe();
        let opts = EngineOptions {
            state_dir: state.0.clone(),
            ..EngineOptions::default()
        };
        let engine = Engine::new(opts, Some(watcher)).await?;
        engine.reconcile().await?;
        let runner = engine.clone();
        tokio::spawn(async move { runner.run_events(sub).await });
        println!("ready");
        // Until the parent kills us (then the state tmpfs is left: the parent removes it).
        let _ = tokio::signal::ctrl_c().await;
        drop(state);
        Ok(())
    })
}

fn status_field(path: &Path, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{key} in {}", path.display()))
}

/// Sum of voluntary + involuntary context switches over every thread of `pid`, and the number
/// of threads.
fn switches(pid: u32) -> Result<(u64, usize)> {
    let mut sum = 0;
    let mut n = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let st = t.path().join("status");
        sum += status_field(&st, "voluntary_ctxt_switches:")?;
        sum += status_field(&st, "nonvoluntary_ctxt_switches:")?;
        n += 1;
    }
    Ok((sum, n))
}

pub struct Footprint {
    /// VmRSS samples, MiB (one per second of the window).
    pub rss_mib: Vec<f64>,
    /// Wake-ups per second, per second of the window.
    pub wakeups: Vec<f64>,
    pub threads: usize,
}

/// The idle child process; stopped (SIGINT, then SIGKILL after 5 s) on drop.
pub struct IdleChild {
    child: std::process::Child,
    pub pid: u32,
}

impl IdleChild {
    /// Spawns `dranet-bench --idle-child` and waits for its "ready".
    pub async fn spawn() -> Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .arg("--idle-child")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning the idle child")?;
        let pid = child.id();
        let stdout = child.stdout.take().context("child stdout")?;
        let me = Self { child, pid };
        let ready = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).map(|_| line)
        })
        .await??;
        if ready.trim() != "ready" {
            bail!("idle child did not start: {ready:?}");
        }
        Ok(me)
    }
}

impl Drop for IdleChild {
    fn drop(&mut self) {
        // SIGINT: the child unmounts its state tmpfs on the way out.
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGINT);
        }
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn measure(window: Duration) -> Result<Footprint> {
    let child = IdleChild::spawn().await?;
    let pid = child.pid;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = Path::new("/proc").join(pid.to_string()).join("status");
    let mut rss_mib = Vec::new();
    let mut wakeups = Vec::new();
    let (mut prev, mut threads) = switches(pid)?;
    for _ in 0..window.as_secs().max(1) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        #[allow(clippy::cast_precision_loss)]
        rss_mib.push(status_field(&status, "VmRSS:")? as f64 / 1024.0);
        let (now, n) = switches(pid)?;
        #[allow(clippy::cast_precision_loss)]
        wakeups.push(now.saturating_sub(prev) as f64);
        prev = now;
        threads = n;
    }
    drop(child);
    Ok(Footprint {
        rss_mib,
        wakeups,
        threads,
    })
}
