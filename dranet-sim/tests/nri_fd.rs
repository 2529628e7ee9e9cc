//! A runtime-launched plugin: the connection comes pre-connected in `NRI_PLUGIN_SOCKET`. In a
//! test binary of its own because it sets a process-wide environment variable.

use std::os::fd::IntoRawFd;
use std::sync::Arc;
use std::time::Duration;

use dranet::nri::hooks::{ContainerInfo, HookError, LinuxDevice, Outcome, Pod, PodHooks};
use dranet::nri::{NriMetrics, PluginConfig};
use dranet_sim::fixtures::StateDir;
use dranet_sim::nri_runtime::{NriRuntime, RuntimeConfig};
use tokio::sync::watch;

struct Quiet;

impl PodHooks for Quiet {
    async fn run_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
        Ok(Outcome::Noop)
    }
    async fn stop_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
        Ok(Outcome::Noop)
    }
    async fn remove_pod_sandbox(&self, _pod: Pod) -> Result<Outcome, HookError> {
        Ok(Outcome::Noop)
    }
    async fn create_container(&self, _pod: Pod, _c: ContainerInfo) -> Result<Vec<LinuxDevice>, HookError> {
        Ok(Vec::new())
    }
    async fn synchronize(&self, _pods: Vec<Pod>, _containers: Vec<ContainerInfo>) {}
    async fn shutdown(&self) {}
}

/// Waits (bounded, 5 s) for the plugin to have counted `n` registrations, and asserts it did.
async fn wait_registrations(m: &NriMetrics, n: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while m.registrations() < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.registrations(), n);
}

#[test]
fn inherited_socket_then_dial_after_loss() {
    let dir = StateDir::create("nri-fd").unwrap();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = theirs.into_raw_fd();
    // SAFETY: set before any other thread of this test binary exists (a plain #[test], no
    // runtime yet, and the only test in this binary).
    unsafe {
        std::env::set_var("NRI_PLUGIN_SOCKET", fd.to_string());
        std::env::set_var("NRI_PLUGIN_IDX", "42");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let socket = dir.path().join("nri.sock");
        let sim = NriRuntime::start(&socket, RuntimeConfig::default()).unwrap();
        ours.set_nonblocking(true).unwrap();
        sim.attach(tokio::net::UnixStream::from_std(ours).unwrap());
        let metrics = NriMetrics::default();
        let cfg = PluginConfig {
            socket,
            metrics: metrics.clone(),
            ..PluginConfig::default()
        };
        let (stop, stop_rx) = watch::channel(false);
        let plugin = tokio::spawn(dranet::nri::run(cfg, Arc::new(Quiet), stop_rx));
        let reg = sim.wait_ready(1, Duration::from_secs(5)).await.unwrap();
        assert_eq!((reg.name.as_str(), reg.index.as_str()), ("dranet", "42"));
        // The runtime sees the plugin ready when it replies to RegisterPlugin; the plugin counts
        // its registration only once that reply has arrived. Dropping the connection in between
        // fails the plugin's first handshake (it then registers once, not twice): this race was
        // the cause of this test's rare failures. Wait for the plugin's side first.
        wait_registrations(&metrics, 1).await;
        // The inherited connection is lost: the plugin dials the socket instead.
        sim.disconnect();
        sim.wait_ready(2, Duration::from_secs(5)).await.unwrap();
        // The plugin counts a registration once its side of the handshake has finished, which
        // can be just after the runtime sees it ready: wait for the count, bounded.
        wait_registrations(&metrics, 2).await;
        stop.send(true).unwrap();
        assert!(plugin.await.unwrap().is_ok());
    });
}
