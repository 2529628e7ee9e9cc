//! `cargo xtask demo --runtime crio|containerd|containerd-sim [--devices N]`: set-up on a fresh
//! machine, then one pod life cycle around the real `dranet run`, watched by `dranet trace`,
//! ending in a verdict from independent `ip -j` reads.
//!
//! - `crio` (the default, the README's first command): a simulated node (kubelet and runtime
//!   played by dranet-sim) in CRI-O's teardown order: the pod netns bind mount is unmounted and
//!   unlinked before StopPodSandbox.
//! - `containerd`: the real runtime, Debian's containerd 2.x (`cargo xtask runtimes` fetches it
//!   first), with its own sockets, NRI socket and CNI bridge; kubelet's side over CRI (DRA Prepare,
//!   RunPodSandbox, the container, StopPodSandbox, RemovePodSandbox).
//! - `containerd-sim`: the simulated node in containerd's order (StopPodSandbox first).
use std::process::Command;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};

use crate::{build_ebpf, root, run};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Runtime {
    /// Simulated node, CRI-O's order.
    Crio,
    /// Debian's containerd 2.x, real, over CRI.
    Containerd,
    /// Simulated node, containerd's order.
    ContainerdSim,
}

#[derive(Args, Debug)]
pub struct Options {
    /// crio (simulated, CRI-O's order), containerd (the real one) or containerd-sim (simulated,
    /// containerd's order).
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
        Runtime::Containerd => {
            crate::runtimes::fetch(&crate::runtimes::Options::default())?;
            "containerd"
        }
        Runtime::ContainerdSim => "containerd-sim",
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
