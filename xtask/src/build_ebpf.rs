//! `cargo xtask build-ebpf`: builds `dranet-ebpf` for `bpfel-unknown-none`.
//!
//! User space builds with the rustup toolchain; the eBPF side needs `-Z build-std=core` with
//! library sources of exactly the compiler's version, which only Debian's rustc-web 1.96 +
//! rust-web-src provide here, linked by bpf-linker built against the same LLVM 22.
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::root;

#[derive(clap::Args, Default)]
pub struct Options {
    /// Build the debug profile (default: release).
    #[arg(long)]
    pub debug: bool,
    /// Print the cargo command instead of running it.
    #[arg(long)]
    pub print_cmd: bool,
}

/// Where the object lands (also where `dranet/build.rs` looks for it).
pub fn object_path(debug: bool) -> PathBuf {
    let profile = if debug { "debug" } else { "release" };
    root()
        .join("target/ebpf/bpfel-unknown-none")
        .join(profile)
        .join("dranet-ebpf")
}

pub fn run(opts: &Options) -> Result<PathBuf> {
    let rustc = PathBuf::from(std::env::var("DRANET_BPF_RUSTC").unwrap_or_else(|_| "/usr/bin/rustc".into()));
    let cargo = PathBuf::from(std::env::var("DRANET_BPF_CARGO").unwrap_or_else(|_| "/usr/bin/cargo".into()));
    if !rustc.exists() || !cargo.exists() {
        bail!(
            "{} or {} missing: run `cargo xtask install-toolchain` (scripts/install-toolchain.sh)",
            rustc.display(),
            cargo.display()
        );
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let linker_root = std::env::var("BPF_LINKER_ROOT").unwrap_or_else(|_| format!("{home}/.cargo"));
    let path = format!("{linker_root}/bin:{}", std::env::var("PATH").unwrap_or_default());
    let flags = [
        "--cfg=bpf_target_arch=\"x86_64\"",
        "-Cdebuginfo=2",
        "-Clink-arg=--btf",
    ]
    .join("\x1f");
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(root())
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env("PATH", path)
        .env("RUSTC", &rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .env("CARGO_TARGET_DIR", root().join("target/ebpf"))
        .args([
            "build",
            "--package",
            "dranet-ebpf",
            "--bins",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ]);
    if !opts.debug {
        cmd.arg("--release");
    }
    if opts.print_cmd {
        println!("{cmd:?}");
        return Ok(object_path(opts.debug));
    }
    crate::run(&mut cmd)
        .context("building dranet-ebpf (is the toolchain installed? `cargo xtask install-toolchain`)")?;
    let obj = object_path(opts.debug);
    if !obj.exists() {
        bail!("build succeeded but {} is missing", obj.display());
    }
    eprintln!("eBPF object: {}", obj.display());
    Ok(obj)
}
