//! Compiles the node simulator's CRI client (`proto/cri/v1/api.proto`, package `runtime.v1`) with
//! protox (no `protoc` needed) and tonic: the subset of k8s.io/cri-api kubelet's side uses.
use std::path::Path;

use anyhow::{Context, Result};

fn main() -> Result<()> {
    println!("cargo:rerun-if-changed=proto");
    let dir = Path::new("proto");
    let fds = protox::compile(["cri/v1/api.proto"], [dir]).context("compiling the CRI proto")?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)
        .context("generating the CRI client")?;
    Ok(())
}
