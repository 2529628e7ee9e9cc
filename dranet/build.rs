//! Build script: locates the eBPF object built by `cargo xtask build-ebpf` (embedded into the
//! binary with the default feature `ebpf`) and compiles the protobuf APIs with protox (no `protoc` needed).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// gRPC services (tonic client + server code): every `.proto` under `proto/grpc/`.
const GRPC_DIR: &str = "proto/grpc";
/// Message-only protos (NRI and the ttrpc envelope: dranet implements ttrpc itself): every
/// `.proto` under `proto/msg/`.
const MESSAGE_DIR: &str = "proto/msg";

fn protos_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "proto") {
                out.push(p.strip_prefix(dir).context("proto path")?.to_path_buf());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn main() -> Result<()> {
    revision();
    ebpf_object()?;
    protos()
}

/// `DRANET_REVISION` and `DRANET_RUSTC` for the binary (`dranet --version`, the start-up line,
/// `dranet_build_info`): the revision is `$DRANET_REVISION` when set (a Docker build without
/// `.git` passes it as a build argument), else `git rev-parse --short=12 HEAD`, else `unknown`.
/// The script reruns when HEAD or the branch it names moves, so the revision stays right.
fn revision() {
    println!("cargo:rerun-if-env-changed=DRANET_REVISION");
    let from_env = std::env::var("DRANET_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty());
    let rev = from_env.unwrap_or_else(|| git_revision().unwrap_or_else(|| "unknown".to_owned()));
    println!("cargo:rustc-env=DRANET_REVISION={}", rev.trim());
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc = command_output(std::process::Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=DRANET_RUSTC={rustc}");
}

fn command_output(cmd: &mut std::process::Command) -> Option<String> {
    let out = cmd.output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_owned())
}

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    command_output(std::process::Command::new("git").arg("-C").arg(dir).args(args))
}

fn git_revision() -> Option<String> {
    let rev = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Rerun when HEAD moves: HEAD itself (a checkout), the branch it names (a commit), and
    // packed-refs (a branch packed away). Only existing files: a missing one reruns every build.
    let git_dir = git(&["rev-parse", "--absolute-git-dir"]);
    let common =
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]).or_else(|| git_dir.clone());
    let mut watch = Vec::new();
    if let Some(d) = &git_dir {
        watch.push(Path::new(d).join("HEAD"));
    }
    if let Some(c) = &common {
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch.push(Path::new(c).join(branch));
        }
        watch.push(Path::new(c).join("packed-refs"));
    }
    for p in watch.iter().filter(|p| p.is_file()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Some(rev)
}

fn ebpf_object() -> Result<()> {
    println!("cargo:rerun-if-env-changed=DRANET_EBPF_OBJECT");
    if std::env::var_os("CARGO_FEATURE_EBPF").is_none() {
        // A user-space-only build: nothing to embed (`sys::probes::object()` is `None`).
        return Ok(());
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().context("workspace root")?;
    let obj = match std::env::var_os("DRANET_EBPF_OBJECT") {
        Some(p) => PathBuf::from(p),
        None => root.join("target/ebpf/bpfel-unknown-none/release/dranet-ebpf"),
    };
    println!("cargo:rerun-if-changed={}", obj.display());
    if !obj.is_file() {
        bail!(
            "\n\n  dranet embeds its eBPF object, and {} does not exist.\n  \
             Build it first with:\n\n      cargo xtask build-ebpf\n\n  \
             (the toolchain it needs: `cargo xtask install-toolchain`; or point DRANET_EBPF_OBJECT \
             at a built object; or build without it: --no-default-features --features bundled-pci-ids)\n",
            obj.display()
        );
    }
    println!("cargo:rustc-env=DRANET_EBPF_OBJECT={}", obj.display());
    Ok(())
}

fn protos() -> Result<()> {
    println!("cargo:rerun-if-changed=proto");
    let grpc_dir = Path::new(GRPC_DIR);
    let grpc = protos_under(grpc_dir)?;
    if !grpc.is_empty() {
        let fds = protox::compile(&grpc, [grpc_dir]).context("compiling gRPC protos")?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .compile_fds(fds)
            .context("generating gRPC code")?;
    }
    let msg_dir = Path::new(MESSAGE_DIR);
    let msg = protos_under(msg_dir)?;
    if !msg.is_empty() {
        let fds = protox::compile(&msg, [msg_dir]).context("compiling message protos")?;
        prost_build::Config::new()
            .bytes(["."])
            .compile_fds(fds)
            .context("generating message code")?;
    }
    Ok(())
}
