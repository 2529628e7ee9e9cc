//! Build script: locates the eBPF object built by `cargo xtask build-ebpf` (embedded into the
//! binary) and compiles the protobuf APIs with protox (no `protoc` needed).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// gRPC services (tonic client + server code) and their messages.
const GRPC_PROTOS: &[&str] = &[];
/// Message-only protos (NRI and the ttrpc envelope: dranet implements ttrpc itself).
const MESSAGE_PROTOS: &[&str] = &[];

fn main() -> Result<()> {
    ebpf_object()?;
    protos()
}

fn ebpf_object() -> Result<()> {
    println!("cargo:rerun-if-env-changed=DRANET_EBPF_OBJECT");
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
             at a built object)\n",
            obj.display()
        );
    }
    println!("cargo:rustc-env=DRANET_EBPF_OBJECT={}", obj.display());
    Ok(())
}

fn protos() -> Result<()> {
    let proto_dir = Path::new("proto");
    println!("cargo:rerun-if-changed=proto");
    if !GRPC_PROTOS.is_empty() {
        let fds = protox::compile(GRPC_PROTOS, [proto_dir]).context("compiling gRPC protos")?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .compile_fds(fds)
            .context("generating gRPC code")?;
    }
    if !MESSAGE_PROTOS.is_empty() {
        let fds = protox::compile(MESSAGE_PROTOS, [proto_dir]).context("compiling message protos")?;
        prost_build::Config::new()
            .bytes(["."])
            .compile_fds(fds)
            .context("generating message code")?;
    }
    Ok(())
}
