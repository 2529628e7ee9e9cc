//! `cargo xtask demo --runtime crio|containerd`: set-up on a fresh machine, then one pod network
//! life cycle on the real kernel, watched by `dranet trace`.
//!
//! The teardown follows the runtime's order: CRI-O unmounts and unlinks the pod netns bind mount
//! before StopPodSandbox; containerd calls StopPodSandbox first.
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};

use crate::{build_ebpf, root, run};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Runtime {
    Crio,
    Containerd,
}

#[derive(Args, Debug)]
pub struct Options {
    /// Which runtime's teardown order to play.
    #[arg(long, value_enum, default_value = "crio")]
    pub runtime: Runtime,
}

/// Removes what the demo created, also when it fails half-way.
struct Cleanup {
    netns: String,
    host_if: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .stderr(Stdio::null())
            .status();
    }
}

fn ip(args: &[&str]) -> Result<()> {
    run(Command::new("ip").args(args))
}

pub fn run_demo(opts: &Options) -> Result<()> {
    crate::install_toolchain()?;
    build_ebpf::run(&build_ebpf::Options::default())?;
    run(Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["build", "--locked", "-p", "dranet"]))?;
    if !nix_is_root() {
        bail!("the demo needs root (network namespaces, veth pairs, eBPF)");
    }
    let tag = std::process::id() % 100_000;
    let cleanup = Cleanup {
        netns: format!("dranet-demo-{tag}"),
        host_if: format!("dnd{tag}a"),
    };
    let pod_if = format!("dnd{tag}b");
    ip(&["netns", "add", &cleanup.netns])?;
    ip(&[
        "link",
        "add",
        &cleanup.host_if,
        "type",
        "veth",
        "peer",
        "name",
        &pod_if,
    ])?;

    let bin = root().join("target/debug/dranet");
    let mut trace = Command::new(&bin)
        .args(["trace", "--duration", "4"])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut out = BufReader::new(trace.stdout.take().context("trace stdout")?);
    // Wait for the probe report: from then on the watcher is live.
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            bail!("dranet trace ended early:\n{text}");
        }
        text.push_str(&line);
        if line.contains("t(µs)") {
            break;
        }
    }
    print!("{text}");
    let path = format!("/run/netns/{}", cleanup.netns);
    println!(
        "-- pod {} gets {pod_if}; teardown in {:?} order",
        cleanup.netns, opts.runtime
    );
    ip(&["link", "set", &pod_if, "netns", &cleanup.netns])?;
    match opts.runtime {
        Runtime::Crio => {
            // CRI-O: the netns bind mount goes first (StopPodSandbox comes later).
            run(Command::new("umount").arg(&path))?;
            std::fs::remove_file(&path).with_context(|| format!("unlinking {path}"))?;
        }
        Runtime::Containerd => {
            // containerd: StopPodSandbox first (devices leave the pod), then the netns.
            ip(&["-n", &cleanup.netns, "link", "set", &pod_if, "netns", "1"])?;
            run(Command::new("umount").arg(&path))?;
            std::fs::remove_file(&path).with_context(|| format!("unlinking {path}"))?;
        }
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest)?;
    print!("{rest}");
    let status = trace.wait()?;
    if !status.success() {
        bail!("dranet trace failed: {status}");
    }
    drop(cleanup);
    Ok(())
}

pub fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}
