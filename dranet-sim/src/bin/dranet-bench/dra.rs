//! DRA Prepare: NodePrepareResources + NodeUnprepareResources over the plugin's unix socket, as
//! kubelet calls them (tonic client, v1), for pods of 1 and 16 claims. The daemon's stack behind
//! the socket: strict config validation, inventory lookup of real veth devices in the host
//! netns (the `ethtool` block is checked against their offloads, read from the kernel), and the
//! rescue engine's plan store (the engine itself, as `dranet run` wires it), checkpointed to a
//! tmpfs state dir. Baseline: the same calls with an
//! empty claim list on the same channel (socket + HTTP/2 + protobuf, no dranet work).
//!
//! A last figure gives every claim GET an API server's round trip ([`API_RTT`]): the 16 claims
//! of a pod are fetched at once, so the call should cost about one round trip, not 16. Its
//! baseline: the empty call plus one round trip's sleep; its goal allows the work measured
//! without round trips plus one round trip more.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use dranet::dra::{
    ClaimError, ClaimSource, KubeletPlugin, MemoryClaimSource, PluginConfig, Preparer, ResourceClaim,
};
use dranet::inventory::{Device, SharedInventory};
use dranet::rescue::{Engine, EngineOptions};
use dranet_sim::kernel::{Veth, sh, unique};
use dranet_sim::kubelet::{Claim, KubeletSim, RegisteredPlugin};
use serde_json::json;

use crate::latency::StateDir;
use crate::stats::Row;

/// Claims from memory, each GET answered after `delay_us` (an API server's round trip).
#[derive(Clone)]
struct SlowSource {
    inner: MemoryClaimSource,
    delay_us: Arc<AtomicU64>,
}

impl ClaimSource for SlowSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            let d = self.delay_us.load(Ordering::Relaxed);
            if d > 0 {
                tokio::time::sleep(Duration::from_micros(d)).await;
            }
            self.inner.get(namespace, name).await
        })
    }
}

/// What the last figure adds to every claim GET.
pub const API_RTT: Duration = Duration::from_millis(5);

/// A kubelet root removed on drop.
struct Root(std::path::PathBuf);

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MAX_CLAIMS: usize = 16;

fn claim(i: usize, round: usize, ifname: &str) -> Result<ResourceClaim> {
    let pod = format!("pod-{round}");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("c{i}"), "namespace": "bench", "uid": format!("uid-{round}-{i}")},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "dra.net", "pool": "bench-node", "device": ifname}],
                "config": [{"source": "FromClaim", "requests": ["nic"],
                    "opaque": {"driver": "dra.net", "parameters": {
                        "interface": {"name": format!("net{i}"), "addresses": [format!("10.77.{i}.2/24")], "mtu": 1400},
                        "routes": [{"destination": "10.78.0.0/16", "gateway": format!("10.77.{i}.1")}],
                        "ethtool": {"features": {"tcp-segmentation-offload": false}}}}}]
            }},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": pod}]
        }
    }))?)
}

pub async fn rows(rounds: usize) -> Result<Vec<Row>> {
    let state = StateDir::new()?;
    let engine = Engine::new(
        EngineOptions {
            state_dir: state.0.clone(),
            ..EngineOptions::default()
        },
        None,
    )
    .await?;
    let mut veths = Vec::new();
    let mut devices = Vec::new();
    for _ in 0..MAX_CLAIMS {
        let v = Veth::create(&unique("drp"), &unique("drq"))?;
        sh(&["ip", "link", "set", &v.a, "up"])?;
        devices.push(Device {
            name: v.a.clone(),
            ifname: Some(v.a.clone()),
            ..Device::default()
        });
        veths.push(v);
    }
    let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    let root = Root(std::env::temp_dir().join(unique("dranet-bench-kubelet-")));
    let cfg = PluginConfig {
        kubelet_root: root.0.clone(),
        driver: "dra.net".into(),
    };
    let claims = MemoryClaimSource::new();
    let source = SlowSource {
        inner: claims.clone(),
        delay_us: Arc::new(AtomicU64::new(0)),
    };
    let preparer = Arc::new(Preparer::new(
        "dra.net",
        "bench-node",
        Arc::new(source.clone()),
        Arc::new(SharedInventory::new(devices)),
        Arc::new(engine.clone()),
    ));
    let plugin = KubeletPlugin::start(&cfg, preparer).await?;
    let kubelet = KubeletSim::new(&root.0);
    let sock = kubelet
        .wait_for_registration_socket(Duration::from_secs(5))
        .await?;
    let reg = kubelet.register(&sock).await?;

    let mut out = Vec::new();
    let mut round = 0;
    // p99 of the 16 claims without a round trip (the CPU part of the call), for the last goal.
    let mut work_p99 = 0.0;
    for (n, rtt) in [
        (1, Duration::ZERO),
        (MAX_CLAIMS, Duration::ZERO),
        (MAX_CLAIMS, API_RTT),
    ] {
        eprintln!("dra prepare, {n} claims, API round trip {rtt:?} ...");
        #[allow(clippy::cast_possible_truncation)]
        source.delay_us.store(rtt.as_micros() as u64, Ordering::Relaxed);
        let (mut prep, mut unprep, mut base) = (Vec::new(), Vec::new(), Vec::new());
        // One warm-up round, not recorded.
        for r in 0..=rounds {
            round += 1;
            let mut list = Vec::new();
            for (i, ifname) in names.iter().take(n).enumerate() {
                claims.insert(claim(i, round, ifname)?);
                list.push(Claim::new("bench", &format!("c{i}"), &format!("uid-{round}-{i}")));
            }
            let t = Instant::now();
            let res = reg.prepare(&list).await?;
            let p = t.elapsed();
            check(&res, n)?;
            let t = Instant::now();
            let un = reg.unprepare(&list).await?;
            let u = t.elapsed();
            if un.values().any(|e| !e.is_empty()) || un.len() != n {
                bail!("unprepare failed: {un:?}");
            }
            let t = Instant::now();
            empty_round_trip(&reg).await?;
            if !rtt.is_zero() {
                tokio::time::sleep(rtt).await;
            }
            let b = t.elapsed();
            if r > 0 {
                prep.push(p.as_secs_f64() * 1e6);
                unprep.push(u.as_secs_f64() * 1e6);
                base.push(b.as_secs_f64() * 1e6);
            }
        }
        if !engine.checkpoint().plans.is_empty() {
            bail!("plans left after unprepare");
        }
        let per_claim = |r: &Row| r.p99.unwrap_or(0.0) - r.baseline_p99.unwrap_or(0.0);
        if !rtt.is_zero() {
            let r = Row::latency(
                format!("dra prepare {n} claims, API rtt {} ms", rtt.as_millis()),
                "us",
                &prep,
                Some(&base),
            );
            // Fetched at once, the round trips overlap: at most one more round trip than the
            // floor (empty call + one round trip + the work measured without them). One at a
            // time would add 15 of them.
            let rtt_us = rtt.as_secs_f64() * 1e6;
            let limit = r.baseline_p99.unwrap_or(0.0) + work_p99 + rtt_us;
            let pass = r.p99.unwrap_or(f64::MAX) <= limit;
            out.push(
                r.goal("p99 <= base p99 + no-rtt p99 + 1 rtt", pass)
                    .note(format!(
                        "limit {limit:.0} us; base: empty call + one {} ms round trip; one GET at a time would add {} ms",
                        rtt.as_millis(),
                        rtt.as_millis() * (n as u128 - 1)
                    )),
            );
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let claims_f = n as f64;
        let r = Row::latency(format!("dra prepare {n} claims"), "us", &prep, Some(&base));
        work_p99 = r.p99.unwrap_or(0.0);
        let own = per_claim(&r) / claims_f;
        out.push(r.goal("p99 - base p99 <= 1 ms per claim", own <= 1000.0).note(format!(
            "{own:.0} us per claim above the transport; tonic client over the unix socket, v1; validation, host offloads read, plan checkpointed"
        )));
        let r = Row::latency(format!("dra unprepare {n} claims"), "us", &unprep, Some(&base));
        let own = per_claim(&r) / claims_f;
        out.push(
            r.goal("p99 - base p99 <= 1 ms per claim", own <= 1000.0)
                .note(format!(
                    "{own:.0} us per claim above the transport; plan removed, checkpointed"
                )),
        );
    }
    plugin.stop().await;
    drop(veths);
    drop(state);
    Ok(out)
}

fn check(
    res: &std::collections::BTreeMap<String, dranet_sim::kubelet::PrepareResult>,
    n: usize,
) -> Result<()> {
    if res.len() != n {
        bail!("prepare answered {} of {n} claims", res.len());
    }
    for (uid, r) in res {
        if !r.error.is_empty() || r.devices.len() != 1 {
            bail!("prepare of {uid}: {r:?}");
        }
    }
    Ok(())
}

async fn empty_round_trip(reg: &RegisteredPlugin) -> Result<()> {
    let res = reg.prepare(&[]).await.context("empty NodePrepareResources")?;
    if !res.is_empty() {
        bail!("empty prepare answered {res:?}");
    }
    Ok(())
}
