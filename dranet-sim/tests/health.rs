//! Device health (KEP-4680) end to end: real tonic clients over the DRA unix socket call
//! `v1alpha1.DRAResourceHealth/NodeWatchResources` (kubelet 1.34–1.36) and
//! `v1.DRAResourceHealth/NodeWatchResources` (kubelet master) while real kernel events change
//! the devices (root): a veth pair deleted and re-created in a unique netns, and a CRI-O-order
//! rescue by the engine. Streams of both versions at once; a client that goes away leaves no
//! stream behind.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers panic on setup failure, like the tests"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use dranet::config::NetworkConfig;
use dranet::dra::health::follow_engine;
use dranet::dra::proto::health_v1;
use dranet::dra::proto::health_v1alpha1::dra_resource_health_client::DraResourceHealthClient;
use dranet::dra::proto::health_v1alpha1::{
    HealthStatus, NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};
use dranet::dra::{HealthHub, KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer};
use dranet::inventory::{self, NetnsTarget, ScanOptions, SharedInventory};
use dranet::state::Checkpoint;
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::{
    AbortOnDrop, NoSink, StateDir, device_plan, pod_plan, pod_ref, wait_for, watched_engine,
};
use dranet_sim::kernel::{PodNetns, unique};
use dranet_sim::kubelet::uds_channel;
use dranet_sim::nic::Nic;
use dranet_sim::root_or_skip;
use tonic::Streaming;

async fn plugin(dir: &StateDir, hub: HealthHub) -> (PluginConfig, KubeletPlugin) {
    let cfg = PluginConfig {
        kubelet_root: dir.0.join("kubelet"),
        driver: "dra.net".into(),
    };
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(MemoryClaimSource::new()),
        Arc::new(SharedInventory::new(Vec::new())),
        Arc::new(NoSink),
    ));
    let p = KubeletPlugin::start_with_health(&cfg, preparer, hub)
        .await
        .unwrap();
    (cfg, p)
}

async fn watch(cfg: &PluginConfig) -> Streaming<NodeWatchResourcesResponse> {
    let mut c = DraResourceHealthClient::new(uds_channel(&cfg.dra_socket()).await.unwrap());
    c.node_watch_resources(NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The same call as kubelet master makes it: `v1.DRAResourceHealth`.
async fn watch_v1(cfg: &PluginConfig) -> Streaming<health_v1::NodeWatchResourcesResponse> {
    let mut c = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        uds_channel(&cfg.dra_socket()).await.unwrap(),
    );
    c.node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Reads a v1 stream until `ok` holds for its response seen as v1alpha1 (the same fields and
/// numbers: re-encoding is exact).
async fn until_v1(
    what: &str,
    s: &mut Streaming<health_v1::NodeWatchResourcesResponse>,
    ok: impl FnMut(&NodeWatchResourcesResponse) -> bool,
) -> Result<NodeWatchResourcesResponse> {
    use prost::Message;
    let as_v1alpha1 = |r: health_v1::NodeWatchResourcesResponse| {
        Ok(NodeWatchResourcesResponse::decode(r.encode_to_vec().as_slice())?)
    };
    until_as(&format!("{what} (v1)"), s, as_v1alpha1, ok).await
}

/// `device` → (health, message) in one response.
fn of(r: &NodeWatchResourcesResponse, device: &str) -> Option<(HealthStatus, String)> {
    r.devices.iter().find_map(|d| {
        let id = d.device.as_ref()?;
        (id.device_name == device).then(|| {
            assert_eq!(id.pool_name, "node-a");
            assert_eq!(d.health_check_timeout_seconds, 30);
            (
                HealthStatus::try_from(d.health).unwrap_or(HealthStatus::Unknown),
                d.message.clone(),
            )
        })
    })
}

/// Reads the stream until `ok` holds for a response; returns that response.
async fn until(
    what: &str,
    s: &mut Streaming<NodeWatchResourcesResponse>,
    ok: impl FnMut(&NodeWatchResourcesResponse) -> bool,
) -> Result<NodeWatchResourcesResponse> {
    until_as(what, s, Ok, ok).await
}

/// Reads a stream of `M` until `ok` holds for a response (as `conv` makes it v1alpha1), for at
/// most 10 s.
async fn until_as<M>(
    what: &str,
    s: &mut Streaming<M>,
    conv: impl Fn(M) -> Result<NodeWatchResourcesResponse>,
    mut ok: impl FnMut(&NodeWatchResourcesResponse) -> bool,
) -> Result<NodeWatchResourcesResponse> {
    let deadline = Duration::from_secs(10);
    let res = tokio::time::timeout(deadline, async {
        while let Some(r) = s.message().await? {
            let r = conv(r)?;
            if ok(&r) {
                return Ok(r);
            }
        }
        bail!("stream ended waiting for {what}")
    })
    .await;
    match res {
        Ok(r) => r,
        Err(_) => bail!("timed out after {deadline:?} waiting for {what}"),
    }
}

/// Scans `target` every 100 ms into the hub, as the publish loop does after link events.
fn scan_loop(
    hub: HealthHub,
    target: NetnsTarget,
    checkpoint: impl Fn() -> Checkpoint + Send + 'static,
) -> AbortOnDrop {
    AbortOnDrop::spawn(async move {
        loop {
            let t = target.clone();
            let devs = tokio::task::spawn_blocking(move || {
                inventory::scan(&ScanOptions {
                    netns: t,
                    ..ScanOptions::default()
                })
            })
            .await;
            if let Ok(Ok(devs)) = devs {
                hub.observe_scan(devs.iter().map(|d| d.name.as_str()), &checkpoint());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[tokio::test]
async fn health_stream_follows_a_veth_deleted_and_recreated() -> Result<()> {
    root_or_skip!("health_stream_follows_a_veth_deleted_and_recreated");
    let dir = StateDir::create("health")?;
    let ns = PodNetns::create(&unique("dhealth"))?;
    let (va, vb) = (unique("hva"), unique("hvb"));
    ns.ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    let hub = HealthHub::new("node-a");
    let _scan = scan_loop(
        hub.clone(),
        NetnsTarget::Path(ns.path.clone()),
        Checkpoint::default,
    );
    let (cfg, plugin) = plugin(&dir, hub.clone()).await;

    let healthy = |r: &NodeWatchResourcesResponse| {
        [&va, &vb]
            .iter()
            .all(|d| of(r, d).is_some_and(|(h, _)| h == HealthStatus::Healthy))
    };
    let mut s1 = watch(&cfg).await;
    let mut s2 = watch(&cfg).await;
    let mut s3 = watch_v1(&cfg).await;
    let r = until("both ends healthy on stream 1", &mut s1, healthy).await?;
    assert_eq!(of(&r, &va).unwrap().1, "in the host network namespace");
    until("both ends healthy on stream 2", &mut s2, healthy).await?;
    let r = until_v1("both ends healthy on the v1 stream", &mut s3, healthy).await?;
    assert_eq!(of(&r, &vb).unwrap().1, "in the host network namespace");
    assert_eq!(hub.watchers(), 3);

    // Deleting one end deletes both: every stream reports them unhealthy, still listed.
    ns.ip(&["link", "del", &va])?;
    let gone = |r: &NodeWatchResourcesResponse| {
        [&va, &vb].iter().all(|d| {
            of(r, d).is_some_and(|(h, m)| h == HealthStatus::Unhealthy && m.contains("missing from the host"))
        })
    };
    until("both ends unhealthy on stream 1", &mut s1, gone).await?;
    until("both ends unhealthy on stream 2", &mut s2, gone).await?;
    until_v1("both ends unhealthy on the v1 stream", &mut s3, gone).await?;

    // A kubelet stream that goes away leaves nothing behind.
    drop(s2);
    wait_for("the dropped stream released", Duration::from_secs(5), || {
        hub.watchers() == 2
    })
    .await?;

    ns.ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    until("both ends healthy again", &mut s1, healthy).await?;
    until_v1("both ends healthy again on the v1 stream", &mut s3, healthy).await?;
    drop(s3);
    wait_for("the v1 stream released", Duration::from_secs(5), || {
        hub.watchers() == 1
    })
    .await?;

    // Stopping the plugin ends the open stream instead of waiting for kubelet to hang up.
    tokio::time::timeout(Duration::from_secs(5), plugin.stop())
        .await
        .map_err(|_| anyhow::anyhow!("stop hung on an open health stream"))?;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = s1.message().await {}
    })
    .await;
    assert!(end.is_ok(), "the stream did not end with the plugin");
    wait_for("no stream left after stop", Duration::from_secs(5), || {
        hub.watchers() == 0
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn health_stream_drops_a_veth_gone_for_good_after_the_grace() -> Result<()> {
    root_or_skip!("health_stream_drops_a_veth_gone_for_good_after_the_grace");
    let dir = StateDir::create("health-grace")?;
    let ns = PodNetns::create(&unique("dhgrace"))?;
    let (va, vb) = (unique("hga"), unique("hgb"));
    ns.ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    let grace = Duration::from_secs(2);
    let hub = HealthHub::with_options(
        "node-a",
        dranet::dra::health::HealthOptions {
            resend: Duration::from_millis(200),
            gone_grace: grace,
            ..Default::default()
        },
    );
    let _scan = scan_loop(
        hub.clone(),
        NetnsTarget::Path(ns.path.clone()),
        Checkpoint::default,
    );
    let (cfg, plugin) = plugin(&dir, hub.clone()).await;
    let mut s = watch_v1(&cfg).await;
    until_v1("the pair healthy", &mut s, |r| {
        [&va, &vb]
            .iter()
            .all(|d| of(r, d).is_some_and(|(h, _)| h == HealthStatus::Healthy))
    })
    .await?;

    ns.ip(&["link", "del", &va])?;
    let t = Instant::now();
    until_v1("the pair unhealthy", &mut s, |r| {
        [&va, &vb]
            .iter()
            .all(|d| of(r, d).is_some_and(|(h, _)| h == HealthStatus::Unhealthy))
    })
    .await?;
    until_v1("the pair dropped from the list", &mut s, |r| {
        of(r, &va).is_none() && of(r, &vb).is_none()
    })
    .await?;
    let took = t.elapsed();
    assert!(
        took >= grace - Duration::from_millis(1100) && took < grace + Duration::from_secs(3),
        "dropped after {took:?}, grace {grace:?}"
    );

    ns.ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    until_v1("the pair listed and healthy again", &mut s, |r| {
        [&va, &vb]
            .iter()
            .all(|d| of(r, d).is_some_and(|(h, _)| h == HealthStatus::Healthy))
    })
    .await?;
    drop(s);
    plugin.stop().await;
    Ok(())
}

#[tokio::test]
async fn health_stream_follows_a_rescue() -> Result<()> {
    root_or_skip!("health_stream_follows_a_rescue");
    let dir = StateDir::create("health-rescue")?;
    let mut ns = PodNetns::create(&unique("dhresc"))?;
    let nic = Nic::create()?;
    let state = StateDir::new("health-rescue");
    let (engine, _events) = watched_engine(&state, Watcher::start(WatcherOptions::default()).await?).await?;
    let hub = HealthHub::new("node-a");
    let _feed = AbortOnDrop::spawn(follow_engine(hub.clone(), engine.clone(), || {}));
    let eng = engine.clone();
    let _scan = scan_loop(hub.clone(), NetnsTarget::Current, move || eng.checkpoint());
    let (cfg, plugin) = plugin(&dir, hub.clone()).await;
    let mut s = watch(&cfg).await;
    until("the NIC healthy in the host", &mut s, |r| {
        of(r, &nic.name)
            .is_some_and(|(h, m)| h == HealthStatus::Healthy && m == "in the host network namespace")
    })
    .await?;

    let uid = unique("pod-health-");
    engine.set_plan(pod_plan(
        &uid,
        vec![device_plan(&nic, "net1", &uid, NetworkConfig::default())],
    ))?;
    engine.attach_pod(pod_ref(&uid), &ns.path).await?;
    until("the NIC healthy in its pod", &mut s, |r| {
        of(r, &nic.name).is_some_and(|(h, m)| h == HealthStatus::Healthy && m == "attached to pod default/p")
    })
    .await?;

    // CRI-O order: the netns bind mount goes first; the engine brings the NIC home.
    ns.remove_crio_style()?;
    let mut seen = Vec::new();
    until("the NIC healthy in the host after the rescue", &mut s, |r| {
        let h = of(r, &nic.name);
        if let Some(h) = &h {
            seen.push(h.clone());
        }
        h.is_some_and(|(h, m)| h == HealthStatus::Healthy && m == "in the host network namespace")
    })
    .await?;
    // Never reported missing while the engine owned the return (intermediate states may be
    // coalesced: the stream carries the latest list).
    for (h, m) in &seen {
        assert!(
            *h == HealthStatus::Healthy || m.contains("being returned"),
            "unexpected state during the rescue: {h:?} {m}"
        );
    }
    drop(s);
    plugin.stop().await;
    Ok(())
}
