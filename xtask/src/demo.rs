//! `cargo xtask demo --runtime crio|containerd [--devices N]`: set-up on a fresh machine, then one
//! pod life cycle on a simulated node around the real `dranet run` (kubelet and runtime played by
//! dranet-sim), watched by `dranet trace`, ending in a verdict from independent `ip -j` reads.
//!
//! The teardown follows the runtime's order: CRI-O unmounts and unlinks the pod netns bind mount
//! before StopPodSandbox; containerd calls StopPodSandbox first.
use std::process::Command;

use anyhow::{Result, bail};
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
    /// How many veth pairs stand in for the pod's NICs.
    #[arg(long, default_value_t = 2)]
    pub devices: usize,
}

pub fn run_demo(opts: &Options) -> Result<()> {
    crate::install_toolchain()?;
    build_ebpf::run(&build_ebpf::Options::default())?;
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--locked",
        "-p",
        "dranet",
        "-p",
        "dranet-sim",
        "--bin",
        "dranet",
        "--bin",
        "dranet-demo",
    ]))?;
    if !nix_is_root() {
        bail!("the demo needs root (network namespaces, veth pairs, eBPF)");
    }
    let runtime = match opts.runtime {
        Runtime::Crio => "crio",
        Runtime::Containerd => "containerd",
    };
    run(Command::new(root().join("target/debug/dranet-demo"))
        .args(["--runtime", runtime, "--devices"])
        .arg(opts.devices.to_string()))
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
