//! A child process running the watcher (probes loaded) and the engine's event loop, nothing else:
//! the "dranet running" side of the watcher overhead. (The idle footprint of the real daemon is
//! `idle.rs`.)
use std::io::{BufRead, BufReader};
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
