//! A drop-in switch from upstream dranet: `dranet run` takes the arguments of upstream's
//! DaemonSet and Helm chart (`--v=4 --hostname-override=$(NODE_NAME)`, every flag of upstream's
//! `cmd/dranet`) and starts: kubelet registers it, the runtime connects, `/healthz` answers on
//! `--bind-address=:PORT` (Go's every-interface form), ResourceSlices go out. Root: the daemon
//! loads its probes and watches the node's links.

use std::time::Duration;

use anyhow::{Context, Result};
use dranet_sim::node::{Node, NodeOptions, free_port, http_get};
use dranet_sim::root_or_skip;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dranet_run_starts_with_upstreams_daemonset_and_chart_args() -> Result<()> {
    root_or_skip!("dranet_run_starts_with_upstreams_daemonset_and_chart_args");
    let port = free_port()?;
    // install.yaml's args (`/dranet` is the image's binary there) and every flag of
    // upstream's chart (deployments/helm/dranet/templates/daemonset.yaml), as it renders them.
    let args: Vec<String> = [
        "--v=4",
        "--hostname-override=sim-node",
        &format!("--bind-address=:{port}"),
        "--filter=",
        "--db-path=/var/run/dranet/dranet.db",
        "--inventory-min-poll-interval=2s",
        "--inventory-max-poll-interval=1m",
        "--inventory-poll-burst=5",
        "--move-ib-interfaces=false",
        "--cloud-provider-hint=NONE",
        "--profile-provider=none",
        "--webhook-url=",
        "--feature-gates=PersistentResourceSliceAttributes=true,DRAListTypeAttributes=false",
        "--logtostderr",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut node = Node::start(NodeOptions {
        node_args: Some(args),
        ..NodeOptions::default()
    })
    .await
    .context("dranet run with upstream's arguments did not start")?;
    let addr = format!("127.0.0.1:{port}");
    // Healthy once the engine runs (the NRI connection counts for /readyz only).
    let start = std::time::Instant::now();
    let mut last = http_get(&addr, "/healthz").await?;
    while last.0 != 200 && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = http_get(&addr, "/healthz").await?;
    }
    assert_eq!((last.0, last.1.trim()), (200, "ok"), "/healthz on :{port}");
    // The pool is named after --hostname-override.
    let slices = node.dir.join("slices");
    let start = std::time::Instant::now();
    loop {
        let found = std::fs::read_dir(&slices)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("sim-node-dra.net-"));
        if found {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no slice in {}",
            slices.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(node.daemon_running());
    node.stop()?;
    Ok(())
}
