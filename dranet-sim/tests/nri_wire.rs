//! dranet's NRI plugin against the simulated runtime, over a real unix socket. No kernel state is
//! touched: the hooks are a recording fake.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions (which clippy.toml already allows) unwrap too"
)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dranet::nri::hooks::{ContainerInfo, DeviceKind, HookError, LinuxDevice, Outcome, Pod, PodHooks};
use dranet::nri::mux::Split;
use dranet::nri::pb::nri as pb;
use dranet::nri::plugin::PLUGIN_SERVICE;
use dranet::nri::ttrpc::code;
use dranet::nri::{NriMetrics, PluginConfig};
use dranet_sim::fixtures::StateDir;
use dranet_sim::nri_runtime::{Dialect, Flavor, NriRuntime, RuntimeConfig, SyncMode, SyncRecord};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Run(Pod),
    RunDone(String),
    Stop(Pod),
    Remove(Pod),
    Create(Pod, ContainerInfo),
    Sync(Vec<Pod>, Vec<ContainerInfo>),
    Shutdown,
}

#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    fail_run: Mutex<Option<&'static str>>,
    fail_stop: Mutex<bool>,
    delay_run: Mutex<Option<Duration>>,
    devices: Mutex<Vec<LinuxDevice>>,
}

impl Recorder {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    fn push(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }
}

impl PodHooks for Recorder {
    async fn run_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.push(Call::Run(pod.clone()));
        let delay = *self.delay_run.lock().unwrap();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
            self.push(Call::RunDone(pod.uid.clone()));
        }
        match *self.fail_run.lock().unwrap() {
            Some("reject") => Err(HookError::Rejected {
                pod: pod.uid,
                reason: "hostNetwork".into(),
            }),
            Some(_) => Err(HookError::Failed {
                pod: pod.uid,
                action: "attach",
                source: "boom".into(),
            }),
            None => Ok(Outcome::Applied),
        }
    }
    async fn stop_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.push(Call::Stop(pod.clone()));
        if *self.fail_stop.lock().unwrap() {
            return Err(HookError::Failed {
                pod: pod.uid,
                action: "detach",
                source: "busy".into(),
            });
        }
        Ok(Outcome::Applied)
    }
    async fn remove_pod_sandbox(&self, pod: Pod) -> Result<Outcome, HookError> {
        self.push(Call::Remove(pod));
        Ok(Outcome::Noop)
    }
    async fn create_container(&self, pod: Pod, c: ContainerInfo) -> Result<Vec<LinuxDevice>, HookError> {
        self.push(Call::Create(pod, c));
        Ok(self.devices.lock().unwrap().clone())
    }
    async fn synchronize(&self, pods: Vec<Pod>, containers: Vec<ContainerInfo>) {
        self.push(Call::Sync(pods, containers));
    }
    async fn shutdown(&self) {
        self.push(Call::Shutdown);
    }
}

/// A runtime socket in a fresh temporary directory (removed on drop) and the plugin task.
struct Harness {
    rt: NriRuntime,
    hooks: Arc<Recorder>,
    metrics: NriMetrics,
    stop: watch::Sender<bool>,
    plugin: Option<JoinHandle<Result<(), dranet::nri::NriError>>>,
    _dir: StateDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(p) = self.plugin.take() {
            p.abort();
        }
    }
}

const WAIT: Duration = Duration::from_secs(5);

async fn harness(rcfg: RuntimeConfig, index: &str) -> Harness {
    let dir = StateDir::create("nri").unwrap();
    let socket = dir.path().join("nri.sock");
    let rt = NriRuntime::start(&socket, rcfg).unwrap();
    let hooks = Arc::new(Recorder::default());
    let metrics = NriMetrics::default();
    let cfg = PluginConfig {
        socket,
        name: "dranet".into(),
        index: index.into(),
        metrics: metrics.clone(),
        ..PluginConfig::default()
    };
    let (stop, stop_rx) = watch::channel(false);
    let plugin = Some(tokio::spawn(dranet::nri::run(cfg, hooks.clone(), stop_rx)));
    rt.wait_ready(1, WAIT).await.unwrap();
    // The runtime counts the handshake when it replies to RegisterPlugin; the plugin only when
    // that reply has arrived. A test that drops the connection in between would make the
    // plugin's first handshake fail (and not count): wait for the plugin's side too.
    assert_eq!(
        registrations_reach(&metrics, 1).await,
        1,
        "the plugin finished its handshake"
    );
    Harness {
        rt,
        hooks,
        metrics,
        stop,
        plugin,
        _dir: dir,
    }
}

fn sandbox(uid: &str, netns: &str) -> pb::PodSandbox {
    pb::PodSandbox {
        id: format!("sb-{uid}"),
        name: format!("pod-{uid}"),
        uid: uid.into(),
        namespace: "default".into(),
        linux: Some(pb::LinuxPodSandbox {
            namespaces: vec![
                pb::LinuxNamespace {
                    r#type: "ipc".into(),
                    path: String::new(),
                },
                pb::LinuxNamespace {
                    r#type: "network".into(),
                    path: netns.into(),
                },
            ],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container(id: &str, pod: &pb::PodSandbox) -> pb::Container {
    pb::Container {
        id: id.into(),
        pod_sandbox_id: pod.id.clone(),
        name: format!("c-{id}"),
        ..Default::default()
    }
}

fn dev(path: &str, minor: i64) -> LinuxDevice {
    LinuxDevice {
        path: path.into(),
        kind: DeviceKind::Char,
        major: 231,
        minor,
        file_mode: Some(0o666),
        uid: Some(0),
        gid: Some(0),
    }
}

#[tokio::test]
async fn registration_bytes_and_event_mask() {
    let h = harness(RuntimeConfig::default(), "10").await;
    let reg = h.rt.wait_ready(1, WAIT).await.unwrap();
    assert_eq!(
        (
            reg.name.as_str(),
            reg.index.as_str(),
            reg.nri_version.as_str(),
            reg.events
        ),
        ("dranet", "10", "v0.12.0", 0xF)
    );
    // protocols.md §1.2, byte for byte: the first frame the plugin sends, with the NRI version
    // (field 3) the example leaves out (containerd logs "NRI version unknown" without it).
    let mut want = vec![
        0, 0, 0, 2, 0, 0, 0, 0x55, 0, 0, 0, 0x4b, 0, 0, 0, 1, 1, 0, 0x0a, 0x1c,
    ];
    want.extend_from_slice(b"nri.pkg.api.v1alpha1.Runtime");
    want.extend_from_slice(&[0x12, 0x0e]);
    want.extend_from_slice(b"RegisterPlugin");
    want.extend_from_slice(&[0x1a, 0x15, 0x0a, 0x06]);
    want.extend_from_slice(b"dranet");
    want.extend_from_slice(&[0x12, 0x02]);
    want.extend_from_slice(b"10");
    want.extend_from_slice(&[0x1a, 0x07]);
    want.extend_from_slice(b"v0.12.0");
    want.extend_from_slice(&[0x20, 0x80, 0xe4, 0x97, 0xd0, 0x12]);
    let got = h.rt.received_bytes();
    assert!(got.len() >= want.len(), "only {} bytes", got.len());
    assert_eq!(&got[..want.len()], &want[..]);
    assert_eq!(
        h.rt.methods()[..2],
        ["Configure".to_string(), "Synchronize".to_string()]
    );
    assert_eq!(registrations_reach(&h.metrics, 1).await, 1);
}

async fn pod_lifecycle(dialect: Dialect) -> (Vec<Call>, Vec<String>) {
    let h = harness(
        RuntimeConfig {
            dialect,
            ..Default::default()
        },
        "00",
    )
    .await;
    let p = sandbox("u1", "/var/run/netns/cni-1");
    h.rt.run_pod_sandbox(&p).await.unwrap();
    h.rt.stop_pod_sandbox(&p).await.unwrap();
    h.rt.remove_pod_sandbox(&sandbox("u1", "")).await.unwrap();
    h.rt.shutdown().await.unwrap();
    (h.hooks.calls(), h.rt.methods())
}

fn pod(uid: &str, netns: Option<&str>) -> Pod {
    Pod::from(&sandbox(uid, netns.unwrap_or("")))
}

/// One pod's life in `dialect`: the hooks see the same calls; the wire carries `methods`
/// after the two set-up calls.
async fn assert_pod_lifecycle(dialect: Dialect, methods: [&str; 4]) {
    let (calls, seen) = pod_lifecycle(dialect).await;
    let p = pod("u1", Some("/var/run/netns/cni-1"));
    assert_eq!(p.netns, Some(PathBuf::from("/var/run/netns/cni-1")));
    assert_eq!(
        calls,
        vec![
            Call::Sync(vec![], vec![]),
            Call::Run(p.clone()),
            Call::Stop(p),
            Call::Remove(pod("u1", None)),
            Call::Shutdown
        ]
    );
    assert_eq!(seen[2..], methods);
}

#[tokio::test]
async fn dedicated_dialect() {
    assert_pod_lifecycle(
        Dialect::Dedicated,
        ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox", "Shutdown"],
    )
    .await;
}

#[tokio::test]
async fn state_change_dialect() {
    assert_pod_lifecycle(
        Dialect::StateChange,
        ["StateChange", "StateChange", "StateChange", "Shutdown"],
    )
    .await;
}

#[tokio::test]
async fn state_change_ignores_other_events() {
    let h = harness(RuntimeConfig::default(), "00").await;
    h.rt.state_change(pb::Event::StartContainer, &sandbox("u9", "/x"))
        .await
        .unwrap();
    h.rt.state_change(pb::Event::RunPodSandbox, &sandbox("u9", "/x"))
        .await
        .unwrap();
    assert_eq!(h.hooks.calls()[1..], [Call::Run(pod("u9", Some("/x")))]);
}

/// [`harness`] whose runtime reports `pods`, plugin index `00`.
async fn harness_with_pods(pods: Vec<pb::PodSandbox>) -> Harness {
    harness(
        RuntimeConfig {
            pods,
            ..Default::default()
        },
        "00",
    )
    .await
}

fn many_pods(n: usize, annotation_bytes: usize) -> (Vec<pb::PodSandbox>, Vec<pb::Container>) {
    let pods: Vec<_> = (0..n)
        .map(|i| {
            let mut p = sandbox(&format!("u{i}"), &format!("/var/run/netns/cni-{i}"));
            p.annotations = HashMap::from([("big".to_string(), "x".repeat(annotation_bytes))]);
            p
        })
        .collect();
    let ctrs = pods
        .iter()
        .map(|p| container(&format!("c{}", p.uid), p))
        .collect();
    (pods, ctrs)
}

#[tokio::test]
async fn synchronize_in_chunks() {
    let (pods, containers) = many_pods(250, 100);
    let rcfg = RuntimeConfig {
        sync: SyncMode::Chunks(100),
        pods: pods.clone(),
        containers,
        ..Default::default()
    };
    let h = harness(rcfg, "00").await;
    let recs = |pods, more, reply| SyncRecord {
        pods,
        containers: pods,
        more,
        reply_more: Some(reply),
    };
    assert_eq!(
        h.rt.syncs(),
        vec![
            recs(100, true, true),
            recs(100, true, true),
            recs(50, false, false)
        ]
    );
    let calls = h.hooks.calls();
    assert_eq!(calls.len(), 1, "synchronize runs once, on the last chunk");
    let Call::Sync(got, ctrs) = &calls[0] else {
        panic!("{calls:?}")
    };
    assert_eq!(got.len(), 250);
    assert_eq!(ctrs.len(), 250);
    assert_eq!(got[249].uid, "u249");
    assert_eq!(got[7].netns, Some(PathBuf::from("/var/run/netns/cni-7")));
    assert_eq!(ctrs[3].pod_sandbox_id, "sb-u3");
}

#[tokio::test]
async fn oversized_synchronize_is_refused_then_chunked() {
    // ~5 MiB: over ttrpc's 4 MiB limit, so the plugin answers ResourceExhausted and the runtime
    // resends in chunks (Go framing: one 4096-byte frame, then the rest).
    let (pods, _) = many_pods(500, 10_000);
    let h = harness_with_pods(pods).await;
    let syncs = h.rt.syncs();
    assert_eq!(
        syncs[0],
        SyncRecord {
            pods: 500,
            containers: 0,
            more: false,
            reply_more: None
        }
    );
    assert_eq!(syncs.len(), 6);
    assert!(syncs[1..5].iter().all(|s| s.more && s.reply_more == Some(true)));
    assert_eq!(syncs[5].reply_more, Some(false));
    let Call::Sync(got, _) = &h.hooks.calls()[0] else {
        panic!()
    };
    assert_eq!(got.len(), 500, "the refused message is not counted twice");
}

async fn big_messages_roundtrip(split: Split) {
    let h = harness(
        RuntimeConfig {
            split,
            ..Default::default()
        },
        "00",
    )
    .await;
    let devices: Vec<_> = (0..300)
        .map(|i| dev(&format!("/dev/infiniband/uverbs{i}"), i))
        .collect();
    *h.hooks.devices.lock().unwrap() = devices.clone();
    let mut p = sandbox("u1", "/var/run/netns/cni-1");
    p.annotations = HashMap::from([("blob".to_string(), "y".repeat(20_000))]);
    for i in 0..5 {
        let adj =
            h.rt.create_container(&p, &container(&format!("c{i}"), &p))
                .await
                .unwrap()
                .unwrap();
        let got = adj.linux.unwrap().devices;
        assert_eq!(got.len(), 300);
        assert_eq!(got[299].path, "/dev/infiniband/uverbs299");
        assert_eq!(
            (got[299].r#type.as_str(), got[299].major, got[299].minor),
            ("c", 231, 299)
        );
    }
    h.rt.run_pod_sandbox(&p).await.unwrap();
    let calls = h.hooks.calls();
    let Call::Run(seen) = calls.last().unwrap() else {
        panic!()
    };
    assert_eq!(seen.annotations["blob"].len(), 20_000);
    // The responses are > 10 KiB each; the strict (Go-like) reader would have dropped us.
    let max = h.rt.max_frame_in();
    assert!(max > 4000 && max <= 4096, "largest frame from the plugin: {max}");
    assert!(h.rt.errors().is_empty(), "{:?}", h.rt.errors());
}

#[tokio::test]
async fn go_split_frames() {
    big_messages_roundtrip(Split::Go).await;
}

#[tokio::test]
async fn random_split_frames() {
    big_messages_roundtrip(Split::Random {
        seed: 0x5eed,
        max: 997,
    })
    .await;
    big_messages_roundtrip(Split::Pattern(vec![1, 2, 3, 10, 4096])).await;
}

#[tokio::test]
async fn unknown_method_is_unimplemented() {
    let h = harness(RuntimeConfig::default(), "00").await;
    for (svc, method) in [
        (PLUGIN_SERVICE, "UpdateContainer"),
        (PLUGIN_SERVICE, "Nope"),
        ("x.Other", "Configure"),
    ] {
        let e = h.rt.call_raw(svc, method, Bytes::new()).await.unwrap_err();
        assert_eq!(e.code(), Some(code::UNIMPLEMENTED), "{svc}/{method}");
    }
    // Still connected afterwards.
    h.rt.run_pod_sandbox(&sandbox("u2", "/n")).await.unwrap();
    assert_eq!(h.rt.sessions(), 1);
}

#[tokio::test]
async fn reconnects_after_disconnect() {
    let (pods, _) = many_pods(3, 10);
    let h = harness_with_pods(pods).await;
    h.rt.set_state(vec![sandbox("after", "/n2")], vec![]);
    let t0 = std::time::Instant::now();
    h.rt.disconnect();
    h.rt.wait_ready(2, WAIT).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    assert_eq!(registrations_reach(&h.metrics, 2).await, 2);
    h.rt.run_pod_sandbox(&sandbox("u3", "/n3")).await.unwrap();
    let calls = h.hooks.calls();
    let syncs: Vec<usize> = calls
        .iter()
        .filter_map(|c| {
            if let Call::Sync(p, _) = c {
                Some(p.len())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(syncs, vec![3, 1], "synchronized again after reconnecting");
    assert_eq!(calls.last(), Some(&Call::Run(pod("u3", Some("/n3")))));
    // A second drop is survived as well.
    h.rt.disconnect();
    h.rt.wait_ready(3, WAIT).await.unwrap();
}

#[tokio::test]
async fn plugin_stops_on_shutdown_signal() {
    let mut h = harness(RuntimeConfig::default(), "00").await;
    h.stop.send(true).unwrap();
    let r = tokio::time::timeout(WAIT, h.plugin.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

/// A rolling update's SIGTERM lands while a hook runs: the hook is answered before the plugin
/// closes its connection (closing under it made containerd 2.1.9 log "closing plugin 00-dranet,
/// failed to handle CreateContainer request: ttrpc: closed" and run the request without dranet).
#[tokio::test]
async fn shutdown_answers_the_hook_in_flight_before_closing() {
    let mut h = harness(RuntimeConfig::default(), "00").await;
    *h.hooks.delay_run.lock().unwrap() = Some(Duration::from_millis(300));
    let sb = sandbox("u1", "/n");
    let stop = async {
        let t = std::time::Instant::now();
        while !h.hooks.calls().iter().any(|c| matches!(c, Call::Run(_))) {
            assert!(t.elapsed() < WAIT, "the hook never started");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        h.stop.send(true).unwrap();
    };
    let (answered, ()) = tokio::join!(tokio::time::timeout(WAIT, h.rt.run_pod_sandbox(&sb)), stop);
    let answered = answered.unwrap();
    assert!(
        answered.is_ok(),
        "the hook in flight lost its answer: {answered:?}"
    );
    assert!(h.hooks.calls().contains(&Call::RunDone("u1".into())));
    let r = tokio::time::timeout(WAIT, h.plugin.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

/// The SIGTERM lands right after a pod's RunPodSandbox was answered: the pod's CreateContainer,
/// which follows within tens of milliseconds, is still answered (the connection closes once no
/// request came for a while), then the plugin stops.
#[tokio::test]
async fn shutdown_answers_the_request_that_follows_right_after() {
    let mut h = harness(RuntimeConfig::default(), "00").await;
    let p = sandbox("u1", "/n");
    h.rt.run_pod_sandbox(&p).await.unwrap();
    h.stop.send(true).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = h.rt.create_container(&p, &container("c0", &p)).await;
    assert!(
        r.is_ok(),
        "the CreateContainer after the signal was not answered: {r:?}"
    );
    let r = tokio::time::timeout(WAIT, h.plugin.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn hook_errors() {
    let h = harness(RuntimeConfig::default(), "00").await;
    *h.hooks.fail_run.lock().unwrap() = Some("fail");
    let e = h.rt.run_pod_sandbox(&sandbox("u1", "/n")).await.unwrap_err();
    assert_eq!(e.code(), Some(code::UNKNOWN));
    assert!(e.to_string().contains("plugin call failed"));
    *h.hooks.fail_run.lock().unwrap() = Some("reject");
    let e = h.rt.run_pod_sandbox(&sandbox("u2", "")).await.unwrap_err();
    assert_eq!(e.code(), Some(code::FAILED_PRECONDITION));
    // The old dialect reports the same error.
    let e =
        h.rt.state_change(pb::Event::RunPodSandbox, &sandbox("u3", ""))
            .await
            .unwrap_err();
    assert_eq!(e.code(), Some(code::FAILED_PRECONDITION));
    // Stop failures are logged and counted, never returned.
    *h.hooks.fail_stop.lock().unwrap() = true;
    h.rt.stop_pod_sandbox(&sandbox("u1", "/n")).await.unwrap();
    assert_eq!(h.metrics.hook_errors("RunPodSandbox"), 3);
    assert_eq!(h.metrics.hook_calls("StopPodSandbox"), 1);
    assert_eq!(h.metrics.hook_errors("StopPodSandbox"), 1);
    assert_eq!(h.rt.sessions(), 1, "errors do not cost the connection");
}

#[tokio::test]
async fn create_container_dedups_devices() {
    let h = harness(RuntimeConfig::default(), "00").await;
    let p = sandbox("u1", "/n");
    assert_eq!(
        h.rt.create_container(&p, &container("c0", &p)).await.unwrap(),
        None,
        "no devices, no adjustment"
    );
    *h.hooks.devices.lock().unwrap() = vec![
        dev("/dev/infiniband/rdma_cm", 255),
        dev("/dev/infiniband/uverbs0", 192),
        dev("/dev/infiniband/rdma_cm", 255),
    ];
    let adj =
        h.rt.create_container(&p, &container("c1", &p))
            .await
            .unwrap()
            .unwrap();
    let paths: Vec<_> = adj
        .linux
        .unwrap()
        .devices
        .into_iter()
        .map(|d| (d.path, d.minor, d.file_mode.map(|m| m.value)))
        .collect();
    assert_eq!(
        paths,
        vec![
            ("/dev/infiniband/rdma_cm".to_string(), 255, Some(0o666)),
            ("/dev/infiniband/uverbs0".to_string(), 192, Some(0o666))
        ]
    );
    let calls = h.hooks.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::Create(
            pod("u1", Some("/n")),
            ContainerInfo {
                id: "c1".into(),
                pod_sandbox_id: "sb-u1".into(),
                name: "c-c1".into()
            }
        ))
    );
}

#[tokio::test]
async fn slow_hook_times_out_but_is_not_cancelled() {
    let rcfg = RuntimeConfig {
        request_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let h = harness(rcfg, "00").await;
    *h.hooks.delay_run.lock().unwrap() = Some(Duration::from_millis(800));
    let e = h.rt.run_pod_sandbox(&sandbox("slow", "/n")).await.unwrap_err();
    assert!(
        e.code() == Some(code::DEADLINE_EXCEEDED) || e.code().is_none(),
        "{e:?}"
    );
    assert_eq!(
        h.rt.errors().len(),
        1,
        "the runtime drops a plugin that timed out"
    );
    h.rt.wait_ready(2, WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        h.hooks.calls().contains(&Call::RunDone("slow".into())),
        "{:?}",
        h.hooks.calls()
    );
}

#[tokio::test]
async fn plugin_waits_for_a_late_runtime() {
    let dir = StateDir::create("nri-late").unwrap();
    let socket = dir.path().join("nri.sock");
    let hooks = Arc::new(Recorder::default());
    let metrics = NriMetrics::default();
    let cfg = PluginConfig {
        socket: socket.clone(),
        metrics: metrics.clone(),
        ..PluginConfig::default()
    };
    let (stop, stop_rx) = watch::channel(false);
    let plugin = tokio::spawn(dranet::nri::run(cfg, hooks.clone(), stop_rx));
    // No socket yet: the plugin retries (100, 200, 400 ms …).
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(metrics.registrations(), 0);
    let rt = NriRuntime::start(&socket, RuntimeConfig::default()).unwrap();
    rt.wait_ready(1, WAIT).await.unwrap();
    assert_eq!(registrations_reach(&metrics, 1).await, 1);
    stop.send(true).unwrap();
    assert!(tokio::time::timeout(WAIT, plugin).await.unwrap().unwrap().is_ok());
    drop(rt);
}

#[tokio::test]
async fn remove_carries_the_netns_path_per_flavor() {
    let p = sandbox("u1", "/var/run/netns/cni-1");
    let h = harness(
        RuntimeConfig {
            flavor: Flavor::Containerd,
            ..Default::default()
        },
        "00",
    )
    .await;
    h.rt.remove_pod_sandbox(&p).await.unwrap();
    assert_eq!(h.hooks.calls().last(), Some(&Call::Remove(pod("u1", None))));
    let h = harness(
        RuntimeConfig {
            flavor: Flavor::Crio,
            dialect: Dialect::StateChange,
            ..Default::default()
        },
        "00",
    )
    .await;
    h.rt.remove_pod_sandbox(&p).await.unwrap();
    assert_eq!(
        h.hooks.calls().last(),
        Some(&Call::Remove(pod("u1", Some("/var/run/netns/cni-1"))))
    );
}

/// The plugin counts a registration once its side of the handshake has finished, which can be
/// just after the runtime sees it ready: waits (bounded) for the count to reach `n`.
async fn registrations_reach(m: &dranet::nri::NriMetrics, n: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while m.registrations() < n && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    m.registrations()
}
