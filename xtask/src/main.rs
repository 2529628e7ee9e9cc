//! `cargo xtask <job>`: jobs that need a special toolchain, root or a VM.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod build_ebpf;
mod demo;
mod e2e;
mod image;
mod runtimes;
mod soak;
mod vm;

#[derive(Parser)]
#[command(name = "xtask", about = "dranet development jobs")]
struct Cli {
    #[command(subcommand)]
    job: Job,
}

#[derive(Subcommand)]
enum Job {
    /// Benchmarks (root): rescue reaction and latency, attach latency, watcher overhead,
    /// footprint; a table plus target/bench/results.json.
    Bench(bench::Options),
    /// Build the eBPF programs (dranet-ebpf) for bpfel-unknown-none with Debian's rustc 1.96.
    BuildEbpf(build_ebpf::Options),
    /// A real runtime's end-to-end suite alone: `--runtime containerd` runs
    /// dranet-sim/tests/containerd.rs against Debian's containerd 1.7 and 2.x; ends with
    /// `N passed, M failed`.
    E2e(e2e::Options),
    /// The dranet image without Docker: an OCI archive in target/image/ with deploy/Dockerfile's
    /// content (its runtime stage read; base from Debian packages); deterministic.
    Image(image::Options),
    /// Set-up on a fresh machine, then dranet's main job: one pod life cycle in a runtime's order.
    Demo(demo::Options),
    /// The model-based life-cycle soak against the real daemon (root): `--lifecycles N --seed S`.
    Soak(soak::Options),
    /// Boot Debian kernels (6.1, 7.3) under qemu TCG and run the kernel-matrix cases in them.
    VmTest(vm::Options),
    /// Install the toolchain (Debian packages, bpf-linker); idempotent.
    InstallToolchain,
    /// Fetch containerd of Debian trixie (1.7) and sid (2.x) into target/runtimes/ (private apt,
    /// signed index, no system-wide install); idempotent. Prints the exact versions.
    Runtimes(runtimes::Options),
    /// Everything the tests need (toolchain, eBPF object), then the whole test suite (needs root).
    Test {
        /// Extra arguments for `cargo test`.
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.job {
        Job::Bench(opts) => bench::run_bench(&opts),
        Job::BuildEbpf(opts) => build_ebpf::run(&opts).map(|_| ()),
        Job::Demo(opts) => demo::run_demo(&opts),
        Job::E2e(opts) => e2e::run(&opts),
        Job::Image(opts) => image::run_image(&opts),
        Job::Soak(opts) => soak::run_soak(&opts),
        Job::VmTest(opts) => vm::run_vm_test(&opts),
        Job::InstallToolchain => install_toolchain(),
        Job::Runtimes(opts) => runtimes::fetch(&opts).map(|_| ()),
        Job::Test { args } => test(&args),
    }
}

/// The workspace root (the xtask crate lives in `<root>/xtask`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs a command, failing with its command line if it does not exit 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawning {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn install_toolchain() -> Result<()> {
    run(Command::new("bash").arg(root().join("scripts/install-toolchain.sh")))
}

fn test(args: &[String]) -> Result<()> {
    install_toolchain()?;
    build_ebpf::run(&build_ebpf::Options::default())?;
    runtimes::fetch(&runtimes::Options::default())?;
    // The image test (dranet-sim/tests/containerd_image.rs) runs the image's base and config with
    // the binary under test: a dev build of the image is enough.
    image::run_image(&image::Options {
        dev: true,
        ..image::Options::default()
    })?;
    run(Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["test", "--workspace", "--exclude", "dranet-ebpf", "--locked"])
        .args(args))
}
