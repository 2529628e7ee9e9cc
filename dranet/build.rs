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
    ebpf_object()?;
    protos()
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
