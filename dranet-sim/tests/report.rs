//! Claim status and events from the real hooks (root): RunPodSandbox on the real kernel applies
//! the claim's device status through the reporter without waiting for it (a sink that hangs or
//! fails never fails or slows the hook), a failed attach is a Warning on the pod, and a
//! CRI-O-order rescue is a Normal `NetworkDeviceRescued` on the pod.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on setup failure, like the tests"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use dranet::config::NetworkConfig;
use dranet::dra::{KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer};
use dranet::inventory::SharedInventory;
use dranet::nri::hooks::{Outcome, Pod, PodHooks};
use dranet::plan::DevicePlan;
use dranet::pod::Driver;
use dranet::report::{ClaimStatusApply, Event, ReportError, Reporter, Sink};
use dranet::rescue::Engine;
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::{
    AbortOnDrop, NoSink, StateDir, engine, host_device_plan, pod_plan, wait_for, watched_engine,
};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::kubelet::{Claim, KubeletSim};
use dranet_sim::nic::Nic;
use dranet_sim::root_or_skip;
use futures::future::BoxFuture;

/// Records what it is given, then hangs or fails.
#[derive(Default)]
struct Recording {
    applies: Mutex<Vec<ClaimStatusApply>>,
    events: Mutex<Vec<Event>>,
    hang: bool,
}

impl Recording {
    fn answer(&self) -> BoxFuture<'static, Result<(), ReportError>> {
        if self.hang {
            Box::pin(futures::future::pending())
        } else {
            Box::pin(async {
                Err(ReportError::BadName {
                    name: "the API server said no".into(),
                })
            })
        }
    }
}

impl Sink for Recording {
    fn apply_claim_status<'a>(
        &'a self,
        apply: &'a ClaimStatusApply,
    ) -> BoxFuture<'a, Result<(), ReportError>> {
        self.applies.lock().unwrap().push(apply.clone());
        self.answer()
    }
    fn event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), ReportError>> {
        self.events.lock().unwrap().push(event.clone());
        self.answer()
    }
}

/// The stand-in NIC `host_if` as `net1` with one address, in pod `uid`.
fn device(host_if: &str, uid: &str) -> DevicePlan {
    let mut config = NetworkConfig::default();
    config.interface.addresses = vec!["192.168.79.2/24".into()];
    host_device_plan(host_if, "net1", uid, config)
}

fn pod(uid: &str, ns: &PodNetns) -> Pod {
    Pod {
        uid: uid.to_owned(),
        namespace: "default".into(),
        name: "p".into(),
        id: format!("sandbox-{uid}"),
        netns: Some(ns.path.clone()),
        ..Pod::default()
    }
}

async fn setup(tag: &str, watcher: Option<Watcher>) -> Result<(StateDir, Engine)> {
    let state = StateDir::new(&format!("report-{tag}"));
    let engine = engine(&state, watcher).await?;
    Ok((state, engine))
}

#[tokio::test]
async fn run_pod_sandbox_applies_status_without_waiting_for_the_api() -> Result<()> {
    root_or_skip!("run_pod_sandbox_applies_status_without_waiting_for_the_api");
    for hang in [true, false] {
        let (_state, engine) = setup("status", None).await?;
        let ns = PodNetns::create(&unique("dnrep"))?;
        let nic = Nic::create()?;
        let uid = unique("pod-rep-");
        engine.set_plan(pod_plan(&uid, vec![device(&nic.name, &uid)]))?;
        let sink = Arc::new(Recording {
            hang,
            ..Recording::default()
        });
        let reporter =
            Reporter::new(sink.clone(), "dra.net", "node-a").with_timeout(Duration::from_millis(300));
        let driver = Driver::new(engine.clone()).with_reporter(reporter.clone());
        let start = Instant::now();
        let out = driver.run_pod_sandbox(pod(&uid, &ns)).await;
        let took = start.elapsed();
        assert!(matches!(out, Ok(Outcome::Applied)), "hang={hang}: {out:?}");
        assert!(
            took < Duration::from_millis(1500),
            "hang={hang}: the hook took {took:?}"
        );
        wait_for("the status apply", Duration::from_secs(5), || {
            !sink.applies.lock().unwrap().is_empty()
        })
        .await?;
        let applies = sink.applies.lock().unwrap().clone();
        assert_eq!(applies.len(), 1, "{applies:?}");
        let a = &applies[0];
        assert_eq!(a.metadata.name, format!("claim-{uid}"));
        assert_eq!(a.metadata.namespace, "default");
        let d = &a.status.devices[0];
        assert_eq!(
            (d.driver.as_str(), d.pool.as_str(), d.device.as_str()),
            ("dra.net", "node-a", nic.name.as_str())
        );
        let nd = d.network_data.as_ref().unwrap();
        assert_eq!(nd.interface_name, "net1");
        assert_eq!(nd.ips, ["192.168.79.2/24"]);
        // The MAC the device has in the pod, read from the kernel.
        let mac = ns.ip(&["-j", "link", "show", "dev", "net1"])?;
        assert!(
            mac.contains(&nd.hardware_address) && !nd.hardware_address.is_empty(),
            "{mac} vs {nd:?}"
        );
        let conds: Vec<_> = d
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.reason.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            conds,
            [
                ("Ready", "NetworkDeviceReady", "True"),
                ("NetworkReady", "NetworkReady", "True")
            ]
        );
        // A slow or failing API is given up on; nothing is left running.
        wait_for("the report given up", Duration::from_secs(5), || {
            reporter.in_flight() == 0
        })
        .await?;
        let stopped = driver.stop_pod_sandbox(pod(&uid, &ns)).await;
        assert!(
            matches!(stopped, Ok(Outcome::Applied)),
            "hang={hang}: {stopped:?}"
        );
        assert!(host_has(&nic.name));
    }
    Ok(())
}

#[tokio::test]
async fn a_failed_attach_is_a_warning_on_the_pod() -> Result<()> {
    root_or_skip!("a_failed_attach_is_a_warning_on_the_pod");
    let (_state, engine) = setup("fail", None).await?;
    let ns = PodNetns::create(&unique("dnrepf"))?;
    let uid = unique("pod-repf-");
    let missing = unique("nonic");
    engine.set_plan(pod_plan(&uid, vec![device(&missing, &uid)]))?;
    let sink = Arc::new(Recording {
        hang: true,
        ..Recording::default()
    });
    let driver = Driver::new(engine.clone()).with_reporter(Reporter::new(sink.clone(), "dra.net", "node-a"));
    let out = driver.run_pod_sandbox(pod(&uid, &ns)).await;
    assert!(out.is_err(), "{out:?}");
    wait_for("the event", Duration::from_secs(5), || {
        !sink.events.lock().unwrap().is_empty()
    })
    .await?;
    let ev = sink.events.lock().unwrap()[0].clone();
    assert_eq!(ev.reason, "NetworkDeviceAttachFailed");
    assert_eq!(ev.type_, "Warning");
    assert_eq!(ev.involved_object.kind, "Pod");
    assert_eq!(ev.involved_object.uid, uid);
    assert_eq!(ev.metadata.namespace, "default");
    assert!(
        ev.message.starts_with(&format!(
            "failed to attach network device {missing} to pod default/p: "
        )),
        "{}",
        ev.message
    );
    assert!(
        sink.applies.lock().unwrap().is_empty(),
        "no status for a failed attach"
    );
    Ok(())
}

#[tokio::test]
async fn a_rescue_is_a_normal_event_on_the_pod() -> Result<()> {
    root_or_skip!("a_rescue_is_a_normal_event_on_the_pod");
    let state = StateDir::new("report-rescue");
    let (engine, _events) = watched_engine(&state, Watcher::start(WatcherOptions::default()).await?).await?;
    let sink = Arc::new(Recording {
        hang: false,
        ..Recording::default()
    });
    let reporter = Reporter::new(sink.clone(), "dra.net", "node-a");
    let _rescues = AbortOnDrop::spawn(dranet::report::rescue_events(
        reporter.clone(),
        engine.activity(),
        |_| None,
    ));
    let mut ns = PodNetns::create(&unique("dnrepr"))?;
    let nic = Nic::create()?;
    let uid = unique("pod-repr-");
    engine.set_plan(pod_plan(&uid, vec![device(&nic.name, &uid)]))?;
    let driver = Driver::new(engine.clone()).with_reporter(reporter);
    driver.run_pod_sandbox(pod(&uid, &ns)).await?;
    ns.remove_crio_style()?;
    wait_for("the rescue event", Duration::from_secs(5), || {
        sink.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.reason == "NetworkDeviceRescued")
    })
    .await?;
    let ev = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .find(|e| e.reason == "NetworkDeviceRescued")
        .cloned()
        .unwrap();
    assert_eq!(ev.type_, "Normal");
    assert_eq!(
        (
            ev.involved_object.namespace.as_str(),
            ev.involved_object.name.as_str(),
            ev.involved_object.uid.as_str()
        ),
        ("default", "p", uid.as_str())
    );
    assert!(ev.message.contains(&nic.name), "{}", ev.message);
    assert!(host_has(&nic.name));
    // The late StopPodSandbox is a no-op and sends no second rescue event.
    driver.stop_pod_sandbox(pod(&uid, &ns)).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let n = sink
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.reason == "NetworkDeviceRescued")
        .count();
    assert_eq!(n, 1);
    Ok(())
}

#[tokio::test]
async fn a_failed_prepare_is_a_warning_on_the_claim_and_the_rpc_does_not_wait() {
    let guard = StateDir::create("report-prep").unwrap();
    let dir = guard.path();
    let cfg = PluginConfig {
        kubelet_root: dir.join("kubelet"),
        driver: "dra.net".into(),
    };
    // The API never answers the event: the RPC must still return at once.
    let sink = Arc::new(Recording {
        hang: true,
        ..Recording::default()
    });
    let preparer = Arc::new(
        Preparer::new(
            "dra.net",
            "node-a",
            Arc::new(MemoryClaimSource::new()),
            Arc::new(SharedInventory::new(Vec::new())),
            Arc::new(NoSink),
        )
        .with_reporter(Reporter::new(sink.clone(), "dra.net", "node-a")),
    );
    let plugin = KubeletPlugin::start(&cfg, preparer).await.unwrap();
    let kubelet = KubeletSim::new(&cfg.kubelet_root);
    let reg = kubelet.register_when_ready(Duration::from_secs(5)).await.unwrap();
    let claim = Claim::new("ns", "missing", "uid-missing");
    let start = Instant::now();
    let res = reg.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert!(res["uid-missing"].error.contains("not found"), "{res:?}");
    wait_for("the event", Duration::from_secs(5), || {
        !sink.events.lock().unwrap().is_empty()
    })
    .await
    .unwrap();
    let ev = sink.events.lock().unwrap()[0].clone();
    assert_eq!(ev.reason, "ClaimPrepareFailed");
    assert_eq!(ev.type_, "Warning");
    assert_eq!(
        (
            ev.involved_object.kind.as_str(),
            ev.involved_object.api_version.as_str(),
            ev.involved_object.namespace.as_str(),
            ev.involved_object.name.as_str(),
            ev.involved_object.uid.as_str()
        ),
        (
            "ResourceClaim",
            "resource.k8s.io/v1",
            "ns",
            "missing",
            "uid-missing"
        )
    );
    assert!(
        ev.message.starts_with("failed to prepare claim ns/missing: "),
        "{}",
        ev.message
    );
    plugin.stop().await;
}
