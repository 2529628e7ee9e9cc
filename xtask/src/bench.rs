//! `cargo xtask bench [--quick] [--json]`: builds `dranet-bench` (dranet-sim) and runs it as
//! root. It prints the table (or the JSON with `--json`) and writes
//! `<target>/bench/results.json`: per metric the samples' p50/p99, the baseline's p50/p99, the
//! ratio and the goal.
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::{build_ebpf, root, run};

#[derive(Args, Debug)]
pub struct Options {
    /// Few rounds: under 60 s once built (the full run takes a few minutes, >= 50 rounds per
    /// latency figure).
    #[arg(long)]
    pub quick: bool,
    /// Print the JSON results instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Build the bench in the debug profile (default: release, as shipped).
    #[arg(long)]
    pub debug: bool,
    /// Rounds per latency figure (overrides the default).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Only some parts (comma-separated): rescue, overhead, footprint, inventory, dra, drain, hol,
    /// inventory1k, checkpoint, loaded, churn.
    #[arg(long)]
    pub only: Option<String>,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

pub fn run_bench(opts: &Options) -> Result<()> {
    if !crate::demo::nix_is_root() {
        bail!("the benchmarks need root (network namespaces, veth pairs, eBPF)");
    }
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(root())
        // The scale sections run the real daemon next to the bench binary.
        .args([
            "build",
            "--locked",
            "-p",
            "dranet-sim",
            "--bin",
            "dranet-bench",
            "-p",
            "dranet",
            "--bin",
            "dranet",
        ]);
    if !opts.debug {
        build.arg("--release");
    }
    // The eBPF object: the one given, else build it.
    if std::env::var_os("DRANET_EBPF_OBJECT").is_none() {
        let obj = build_ebpf::run(&build_ebpf::Options::default())?;
        build.env("DRANET_EBPF_OBJECT", obj);
    }
    // `cargo xtask` runs us with this package's CARGO_PKG_* / CARGO_MANIFEST_* set; build scripts
    // that watch them (ring) would then rebuild everything that a plain `cargo build` built.
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str()
            && [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_CRATE_",
                "CARGO_BIN_",
                "CARGO_PRIMARY_",
            ]
            .iter()
            .any(|p| k.starts_with(p))
        {
            build.env_remove(k);
        }
    }
    run(&mut build)?;
    let target = target_dir();
    let bin = target
        .join(if opts.debug { "debug" } else { "release" })
        .join("dranet-bench");
    let mut cmd = Command::new(bin);
    cmd.arg("--out").arg(target.join("bench/results.json"));
    if opts.quick {
        cmd.arg("--quick");
    }
    if opts.json {
        cmd.arg("--json");
    }
    if let Some(r) = opts.rounds {
        cmd.arg("--rounds").arg(r.to_string());
    }
    if let Some(o) = &opts.only {
        cmd.arg("--only").arg(o);
    }
    run(&mut cmd)
}
