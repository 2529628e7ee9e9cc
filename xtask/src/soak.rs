//! `cargo xtask soak [--lifecycles N] [--seed S] [--max-pods P] [--verbose]`: the model-based
//! life-cycle soak (`dranet_sim::soak`) against the real daemon, built in release mode. Needs
//! root. Prints the seed and `N passed, M failed`; a failing seed replays the same steps.
use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::{build_ebpf, root, run};

#[derive(Args, Debug)]
pub struct Options {
    /// Pod life cycles to complete.
    #[arg(long, default_value_t = 1000)]
    pub lifecycles: usize,
    /// Seed of every choice (default: from the clock; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Pods alive at once, at most.
    #[arg(long, default_value_t = 3)]
    pub max_pods: usize,
    /// Print every step.
    #[arg(long, short)]
    pub verbose: bool,
}

pub fn run_soak(opts: &Options) -> Result<()> {
    crate::install_toolchain()?;
    build_ebpf::run(&build_ebpf::Options::default())?;
    run(Command::new(env!("CARGO")).current_dir(root()).args([
        "build",
        "--locked",
        "--release",
        "-p",
        "dranet",
        "-p",
        "dranet-sim",
        "--bin",
        "dranet",
        "--bin",
        "dranet-soak",
    ]))?;
    if !crate::demo::nix_is_root() {
        bail!("the soak needs root (network namespaces, veth pairs, eBPF)");
    }
    let mut cmd = Command::new(root().join("target/release/dranet-soak"));
    cmd.arg("--lifecycles")
        .arg(opts.lifecycles.to_string())
        .arg("--max-pods")
        .arg(opts.max_pods.to_string());
    if let Some(s) = opts.seed {
        cmd.arg("--seed").arg(s.to_string());
    }
    if opts.verbose {
        cmd.arg("--verbose");
    }
    run(&mut cmd)
}
