// Over 500 lines: Prepare/Unprepare scenarios against one fake claim source; each test is short, they share its fixtures.

use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::config::NetworkConfig;
use crate::inventory::{Device, SharedInventory};
use crate::plan::{ClaimPlan, ClaimRef, DevicePlan};
use crate::test_support::RecordingSink;

fn inventory() -> SharedInventory {
    SharedInventory::new(vec![
        Device {
            name: "eth1".into(),
            ifname: Some("eth1".into()),
            mac: Some("02:00:00:00:00:01".into()),
            ..Device::default()
        },
        Device {
            name: "eth2".into(),
            ifname: Some("eth2".into()),
            addresses: vec!["10.5.0.2/24".into(), "fd05::2/64".into()],
            routes: vec![
                crate::config::RouteConfig {
                    destination: "10.6.0.0/16".into(),
                    gateway: "10.5.0.1".into(),
                    ..Default::default()
                },
                crate::config::RouteConfig {
                    destination: "10.7.0.0/16".into(),
                    gateway: "10.5.0.1".into(),
                    ..Default::default()
                },
            ],
            ..Device::default()
        },
        Device {
            name: "vf0".into(),
            ifname: Some("vf0".into()),
            pf_mtu: Some(1500),
            ..Device::default()
        },
        Device {
            name: "pci-0000-30-00-0".into(),
            pci_address: Some("0000:30:00.0".into()),
            rdma_device: Some("erdma_0".into()),
            ..Device::default()
        },
    ])
}

fn claim(
    name: &str,
    uid: &str,
    pod_uid: &str,
    results: serde_json::Value,
    config: serde_json::Value,
) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results, "config": config}},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": pod_uid}]
        }
    }))
    .unwrap()
}

fn cref(name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

fn setup() -> (Preparer, MemoryClaimSource, Arc<RecordingSink>) {
    setup_with(Arc::new(inventory()))
}

/// A preparer on `devices`, an in-memory claim source and a recording sink.
fn setup_with(devices: Arc<dyn DeviceLookup>) -> (Preparer, MemoryClaimSource, Arc<RecordingSink>) {
    let claims = MemoryClaimSource::new();
    let rec = Arc::new(RecordingSink::default());
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims.clone()),
        devices,
        rec.clone(),
    );
    (p, claims, rec)
}

#[tokio::test]
async fn prepare_applies_config_and_merges_claims_of_a_pod() {
    let (p, claims, rec) = setup();
    claims.insert(claim(
        "c1",
        "u1",
        "pod-1",
        json!([
            {"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"},
            {"request": "gpu", "driver": "gpu.example.com", "pool": "elsewhere", "device": "gpu0"}
        ]),
        json!([
            {"source": "FromClass", "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 1400}}}},
            {"source": "FromClaim", "requests": ["nic"], "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "net1", "mtu": 9000}}}},
            {"source": "FromClaim", "opaque": {"driver": "gpu.example.com", "parameters": {"whatever": true}}}
        ]),
    ));
    claims.insert(claim(
        "c2",
        "u2",
        "pod-1",
        json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "eth2"}]),
        json!([]),
    ));
    let devs = p.prepare(&cref("c1", "u1")).await.unwrap();
    assert_eq!(devs.len(), 1, "the GPU result belongs to another driver");
    assert_eq!(devs[0].device, "eth1");
    assert_eq!(devs[0].pool, "node-a");
    assert_eq!(devs[0].request, "nic");
    p.prepare(&cref("c2", "u2")).await.unwrap();
    // Idempotent.
    p.prepare(&cref("c2", "u2")).await.unwrap();

    let plans = rec.plans();
    let plan = &plans["pod-1"];
    assert_eq!(plan.pod_name, "pod-a");
    assert_eq!(plan.pod_namespace, "ns");
    assert_eq!(plan.devices.len(), 2);
    let eth1 = plan.devices.iter().find(|d| d.device == "eth1").unwrap();
    assert_eq!(eth1.config.interface.name.as_deref(), Some("net1"));
    assert_eq!(
        eth1.config.interface.mtu,
        Some(9000),
        "claim config beats class config"
    );
    assert_eq!(eth1.pod_ifname(), Some("net1"));
    assert_eq!(eth1.host_ifname.as_deref(), Some("eth1"));
    assert_eq!(eth1.permanent_mac.as_deref(), Some("02:00:00:00:00:01"));
    assert_eq!(eth1.claim.uid, "u1");
    let eth2 = plan.devices.iter().find(|d| d.device == "eth2").unwrap();
    assert_eq!(
        eth2.config.interface.addresses,
        ["10.5.0.2/24", "fd05::2/64"],
        "host addresses move along"
    );
    assert_eq!(eth2.config.routes.len(), 2, "host routes copied");
    assert!(eth1.config.interface.addresses.is_empty());
    drop(plans);

    p.unprepare("u1").unwrap();
    p.unprepare("u1").unwrap();
    assert_eq!(rec.removed(), ["u1", "u1"]);
}

#[tokio::test]
async fn per_claim_errors() {
    let (p, claims, _rec) = setup();
    let err = p.prepare(&cref("missing", "u0")).await.unwrap_err();
    assert!(
        matches!(err, PrepareError::Claim(ClaimError::NotFound { .. })),
        "{err}"
    );

    claims.insert(claim(
        "bad",
        "u3",
        "pod-2",
        json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}]),
        json!([{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"interface": {"mtu": 10}}}}]),
    ));
    let err = crate::telemetry::chain(&p.prepare(&cref("bad", "u3")).await.unwrap_err()).to_string();
    assert!(err.contains("interface.mtu: must be at least 68"), "{err}");

    let err = p.prepare(&cref("bad", "other-uid")).await.unwrap_err();
    assert!(matches!(err, PrepareError::UidMismatch { .. }), "{err}");

    claims.insert(claim(
        "pool",
        "u4",
        "pod-2",
        json!([{"request": "nic", "driver": "dra.net", "pool": "node-b", "device": "eth1"}]),
        json!([]),
    ));
    let err = p.prepare(&cref("pool", "u4")).await.unwrap_err().to_string();
    assert!(err.contains("pool node-b, not this node's pool node-a"), "{err}");

    claims.insert(claim(
        "nodev",
        "u5",
        "pod-2",
        json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth9"}]),
        json!([]),
    ));
    let err = p.prepare(&cref("nodev", "u5")).await.unwrap_err().to_string();
    assert!(err.contains("device eth9 not found"), "{err}");

    claims.insert(claim(
        "rdma",
        "u6",
        "pod-2",
        json!([{"request": "ib", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-30-00-0"}]),
        json!([{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "ib0"}}}}]),
    ));
    let err = crate::telemetry::chain(&p.prepare(&cref("rdma", "u6")).await.unwrap_err()).to_string();
    assert!(err.contains("not supported for RDMA-only devices"), "{err}");

    let mut unalloc = claim("un", "u7", "pod-2", json!([]), json!([]));
    unalloc.status.allocation = None;
    claims.insert(unalloc);
    let err = p.prepare(&cref("un", "u7")).await.unwrap_err();
    assert!(matches!(err, PrepareError::NotAllocated { .. }), "{err}");

    let mut two = claim("two", "u8", "pod-2", json!([]), json!([]));
    two.status.reserved_for.push(two.status.reserved_for[0].clone());
    claims.insert(two);
    let err = p.prepare(&cref("two", "u8")).await.unwrap_err().to_string();
    assert!(err.contains("one pod per claim"), "{err}");

    let mut nopod = claim("np", "u9", "pod-2", json!([]), json!([]));
    nopod.status.reserved_for[0].resource = "jobs".into();
    nopod.status.reserved_for[0].api_group = "batch".into();
    claims.insert(nopod);
    let err = p.prepare(&cref("np", "u9")).await.unwrap_err().to_string();
    assert!(err.contains("core pod"), "{err}");

    let mut nobody = claim("nb", "u10", "pod-2", json!([]), json!([]));
    nobody.status.reserved_for.clear();
    claims.insert(nobody);
    assert!(p.prepare(&cref("nb", "u10")).await.unwrap().is_empty());
}

/// A lease source for the merge logic: answers with a fixed lease or a NAK and records the
/// interfaces asked for (the real client runs against dnsmasq in dranet-sim/tests/dhcp.rs).
struct Leases {
    lease: Option<crate::dhcp::Lease>,
    asked: Mutex<Vec<String>>,
}

impl LeaseSource for Leases {
    fn lease<'a>(
        &'a self,
        ifname: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<crate::dhcp::Lease, crate::dhcp::DhcpError>> {
        self.asked.lock().unwrap().push(ifname.to_owned());
        let r = self.lease.clone().ok_or(crate::dhcp::DhcpError::Nak {
            server: "10.5.0.1".parse().unwrap(),
            message: Some("wrong network".into()),
        });
        Box::pin(async move { r })
    }
}

#[tokio::test]
async fn host_state_merge_vf_mtu_and_dhcp() {
    use crate::dhcp::{ClasslessRoute, Lease};
    let inv = inventory();
    let mk = |device: &str, params: serde_json::Value| {
        claim(
            "c",
            "u",
            "p",
            json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": device}]),
            json!([{"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": params}}]),
        )
    };
    let lease = Lease {
        address: "10.5.0.77".parse().unwrap(),
        prefix_len: 24,
        server: Some("10.5.0.1".parse().unwrap()),
        routes: vec![
            ClasslessRoute {
                destination: "10.6.0.0".parse().unwrap(),
                prefix_len: 16,
                router: "10.5.0.254".parse().unwrap(),
            },
            ClasslessRoute {
                destination: "0.0.0.0".parse().unwrap(),
                prefix_len: 0,
                router: "10.5.0.1".parse().unwrap(),
            },
        ],
        routers: vec!["10.5.0.9".parse().unwrap()],
        lease_secs: Some(3600),
    };
    let leases = Leases {
        lease: Some(lease),
        asked: Mutex::new(Vec::new()),
    };
    let nak = Leases {
        lease: None,
        asked: Mutex::new(Vec::new()),
    };
    let plan_with = |rc: ResourceClaim, l: &'static str| {
        let inv = inv.clone();
        let leases: &Leases = if l == "nak" { &nak } else { &leases };
        async move { plan_claim("dra.net", "node-a", &cref("c", "u"), &rc, &inv, leases, &[]).await }
    };
    // User addresses win; a user route with the same destination and table replaces the host's.
    let rc = mk(
        "eth2",
        json!({"interface": {"addresses": ["192.0.2.1/24"]},
               "routes": [{"destination": "10.6.0.0/16", "gateway": "192.0.2.254"}]}),
    );
    let p = plan_with(rc, "ok").await.unwrap().unwrap();
    let cfg = &p.plans[0].config;
    assert_eq!(cfg.interface.addresses, ["192.0.2.1/24"]);
    let routes = |cfg: &NetworkConfig| -> Vec<(String, String)> {
        cfg.routes
            .iter()
            .map(|r| (r.destination.clone(), r.gateway.clone()))
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    assert_eq!(
        routes(cfg),
        pairs(&[("10.6.0.0/16", "192.0.2.254"), ("10.7.0.0/16", "10.5.0.1")])
    );

    assert!(
        plan_with(mk("vf0", json!({"interface": {"mtu": 1500}})), "ok")
            .await
            .is_ok()
    );
    // The VF check comes first: no lease is taken for a claim that fails it.
    let err = plan_with(mk("vf0", json!({"interface": {"mtu": 9000, "dhcp": true}})), "ok")
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("VF MTU 9000 exceeds the PF MTU 1500"), "{err}");
    assert!(leases.asked.lock().unwrap().is_empty());

    // dhcp: the lease replaces the host addresses (not copied), its option-121 routes come
    // before the host's and win on the same destination; a user route still wins over both.
    let p = plan_with(
        mk(
            "eth2",
            json!({"interface": {"dhcp": true},
                   "routes": [{"destination": "0.0.0.0/0", "gateway": "10.5.0.100"}]}),
        ),
        "ok",
    )
    .await
    .unwrap()
    .unwrap();
    let cfg = &p.plans[0].config;
    assert_eq!(cfg.interface.addresses, ["10.5.0.77/24"]);
    assert_eq!(
        routes(cfg),
        pairs(&[
            ("0.0.0.0/0", "10.5.0.100"),
            ("10.6.0.0/16", "10.5.0.254"),
            ("10.7.0.0/16", "10.5.0.1")
        ])
    );
    assert_eq!(*leases.asked.lock().unwrap(), ["eth2"]);
    // dhcp: false → no lease, host addresses as before.
    let p = plan_with(mk("eth2", json!({"interface": {"dhcp": false}})), "ok")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.plans[0].config.interface.addresses,
        ["10.5.0.2/24", "fd05::2/64"]
    );
    assert_eq!(leases.asked.lock().unwrap().len(), 1);

    // A failed lease is a prepare error naming the device and the interface.
    let err = plan_with(mk("eth1", json!({"interface": {"dhcp": true}})), "nak")
        .await
        .err()
        .unwrap();
    assert!(matches!(err, PrepareError::Dhcp { .. }), "{err}");
    let err = crate::telemetry::chain(&err).to_string();
    assert!(
        err.contains("device eth1: failed to get configuration via DHCP for eth1: DHCPNAK from server 10.5.0.1: wrong network"),
        "{err}"
    );
    assert_eq!(*nak.asked.lock().unwrap(), ["eth1"]);
    // dhcp with static addresses is refused by validation before any lease (as upstream).
    let err = plan_with(
        mk(
            "eth1",
            json!({"interface": {"dhcp": true, "addresses": ["10.0.0.1/24"]}}),
        ),
        "nak",
    )
    .await
    .err()
    .unwrap();
    let err = crate::telemetry::chain(&err).to_string();
    assert!(err.contains("dhcp and addresses are mutually exclusive"), "{err}");
    assert_eq!(nak.asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_repeated_prepare_keeps_the_dhcp_lease() {
    let leases = Arc::new(Leases {
        lease: Some(crate::dhcp::Lease {
            address: "10.5.0.77".parse().unwrap(),
            prefix_len: 24,
            server: None,
            routes: vec![],
            routers: vec![],
            lease_secs: None,
        }),
        asked: Mutex::new(Vec::new()),
    });
    let (p, claims, rec) = setup();
    let p = p.with_leases(leases.clone());
    claims.insert(claim(
        "c1",
        "u1",
        "pod-1",
        json!([
            {"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"},
            {"request": "nic2", "driver": "dra.net", "pool": "node-a", "device": "eth2"}
        ]),
        json!([{"source": "FromClaim", "requests": ["nic"],
                "opaque": {"driver": "dra.net", "parameters": {"interface": {"dhcp": true}}}}]),
    ));
    p.prepare(&cref("c1", "u1")).await.unwrap();
    let first = rec.plans()["pod-1"].clone();
    assert_eq!(first.devices[0].config.interface.addresses, ["10.5.0.77/24"]);
    assert_eq!(
        first.devices[1].config.interface.addresses,
        ["10.5.0.2/24", "fd05::2/64"]
    );
    p.prepare(&cref("c1", "u1")).await.unwrap();
    assert_eq!(rec.plans()["pod-1"], first);
    assert_eq!(
        *leases.asked.lock().unwrap(),
        ["eth1"],
        "one lease, not one per Prepare"
    );
    // Nor after a restart: the preparer keeps no copy, the store (the checkpoint) has the lease.
    let restarted = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims.clone()),
        Arc::new(inventory()),
        rec.clone(),
    )
    .with_leases(leases.clone());
    restarted.prepare(&cref("c1", "u1")).await.unwrap();
    assert_eq!(rec.plans()["pod-1"], first);
    assert_eq!(
        leases.asked.lock().unwrap().len(),
        1,
        "the lease survives a restart"
    );
    // Once unprepared, a new Prepare asks again.
    p.unprepare("u1").unwrap();
    p.prepare(&cref("c1", "u1")).await.unwrap();
    assert_eq!(leases.asked.lock().unwrap().len(), 2);
}

/// The plan store (the engine's checkpoint) is the only copy of the plans: a preparer started
/// after a restart merges a pod's next claim with what the store kept.
#[tokio::test]
async fn a_restarted_preparer_merges_with_the_stored_plans() {
    let (p, claims, rec) = setup();
    claims.insert(claim(
        "c1",
        "u1",
        "pod-1",
        json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}]),
        json!([]),
    ));
    p.prepare(&cref("c1", "u1")).await.unwrap();
    drop(p);

    // "Restart": a new preparer on the same store prepares a second claim of the pod.
    let p2 = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims.clone()),
        Arc::new(inventory()),
        rec.clone(),
    );
    claims.insert(claim(
        "c2",
        "u2",
        "pod-1",
        json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth2"}]),
        json!([]),
    ));
    p2.prepare(&cref("c2", "u2")).await.unwrap();
    let plans = rec.plans();
    let devs: Vec<&str> = plans["pod-1"].devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(devs, ["eth1", "eth2"]);
    drop(plans);
    // Unprepare of the first claim leaves the second.
    p2.unprepare("u1").unwrap();
    let devs: Vec<String> = rec.plans()["pod-1"]
        .devices
        .iter()
        .map(|d| d.device.clone())
        .collect();
    assert_eq!(devs, ["eth2"]);
}

#[tokio::test]
async fn pci_device_without_netdev_or_rdma_is_an_error() {
    let inv = SharedInventory::new(vec![Device {
        name: "pci-0000-10-00-0".into(),
        pci_address: Some("0000:10:00.0".into()),
        ..Device::default()
    }]);
    let (p, claims, _) = setup_with(Arc::new(inv));
    claims.insert(claim(
        "c",
        "u",
        "pod",
        json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-10-00-0"}]),
        json!([]),
    ));
    let err = p.prepare(&cref("c", "u")).await.unwrap_err().to_string();
    assert!(err.contains("no network interface"), "{err}");
}

#[test]
fn config_selection() {
    let cfgs: Vec<claim::DeviceAllocationConfiguration> = serde_json::from_value(json!([
        {"source": "FromClaim", "requests": ["a"], "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "a0"}}}},
        {"source": "FromClass", "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "cls"}}}},
        {"source": "FromClaim", "requests": ["b"], "opaque": {"driver": "other", "parameters": {"interface": {"name": "zz"}}}}
    ]))
    .unwrap();
    let name = |req: &str| device_config("dra.net", req, &cfgs).unwrap().interface.name;
    assert_eq!(name("a").as_deref(), Some("a0"));
    assert_eq!(
        name("a/sub").as_deref(),
        Some("a0"),
        "subrequest matches its parent"
    );
    assert_eq!(name("b").as_deref(), Some("cls"));
    assert!(
        device_config("dra.net", "x", &[])
            .unwrap()
            .interface
            .name
            .is_none()
    );
    let bad: Vec<claim::DeviceAllocationConfiguration> = serde_json::from_value(json!([
        {"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"nope": 1}}}
    ]))
    .unwrap();
    assert!(device_config("dra.net", "x", &bad).is_err());
}

#[tokio::test]
async fn kube_claim_source_gets_and_decodes() {
    use crate::slices::kube_mock::{client, status};
    let (client, log) = client(|req| match req.uri.as_str() {
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1" => (
            200,
            json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
                "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dra.net"}}]}},
                "status": {
                    "allocation": {"devices": {
                        "results": [{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}],
                        "config": [{"source": "FromClaim", "requests": ["nic"],
                                    "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "net1"}}}}]
                    }},
                    "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "pod-1"}]
                }
            }),
        ),
        _ => (404, status(404, "NotFound")),
    });
    let src = KubeClaimSource::new(client);
    let rc = src.get("ns", "c1").await.unwrap();
    assert_eq!(rc.metadata.uid, "u1");
    let alloc = rc.status.allocation.as_ref().unwrap();
    assert_eq!(alloc.devices.results[0].device, "eth1");
    assert_eq!(alloc.devices.config[0].source, "FromClaim");
    assert_eq!(
        alloc.devices.config[0].opaque.as_ref().unwrap().parameters["interface"]["name"],
        "net1"
    );
    assert_eq!(rc.status.reserved_for[0].uid, "pod-1");
    let err = src.get("ns", "nope").await.unwrap_err();
    assert!(matches!(err, ClaimError::NotFound { .. }), "{err}");
    assert_eq!(log.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn missing_device_triggers_one_rescan() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let scans = Arc::new(AtomicUsize::new(0));
    let s2 = scans.clone();
    let lookup = RescanOnMiss::new(SharedInventory::default(), move || {
        s2.fetch_add(1, Ordering::SeqCst);
        Ok(vec![Device {
            name: "late0".into(),
            ifname: Some("late0".into()),
            ..Device::default()
        }])
    });
    let (p, claims, _) = setup_with(Arc::new(lookup));
    claims.insert(claim(
        "c",
        "u",
        "pod",
        json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "late0"}]),
        json!([]),
    ));
    let devs = p.prepare(&cref("c", "u")).await.unwrap();
    assert_eq!(devs[0].device, "late0");
    assert_eq!(scans.load(Ordering::SeqCst), 1);
    // Now known: no further scan.
    p.prepare(&cref("c", "u")).await.unwrap();
    assert_eq!(scans.load(Ordering::SeqCst), 1);
    // Still missing after the rescan: an error, after exactly one more scan.
    claims.insert(claim(
        "d",
        "v",
        "pod",
        json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "never"}]),
        json!([]),
    ));
    let err = p.prepare(&cref("d", "v")).await.unwrap_err();
    assert!(matches!(err, PrepareError::UnknownDevice { .. }), "{err}");
    assert_eq!(scans.load(Ordering::SeqCst), 2);
}

/// A node drained and refilled: every Prepare of the new pods misses the devices that came home
/// a moment ago. Their rescans must share one scan, not run one each (16 concurrent full scans
/// of a 500-link host held 100-230 MB of decoded link messages at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_share_one_rescan() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let scans = Arc::new(AtomicUsize::new(0));
    let s2 = scans.clone();
    let lookup = Arc::new(RescanOnMiss::new(SharedInventory::default(), move || {
        s2.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(100));
        Ok(vec![Device {
            name: "late0".into(),
            ifname: Some("late0".into()),
            ..Device::default()
        }])
    }));
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let l = lookup.clone();
            tokio::spawn(async move {
                l.refresh().await;
                l.device("late0").is_some()
            })
        })
        .collect();
    for w in waiters {
        assert!(w.await.unwrap(), "every waiter sees the device after its refresh");
    }
    // The first miss scans; misses that came while it ran need a scan started after them: at
    // most one more.
    let n = scans.load(Ordering::SeqCst);
    assert!((1..=2).contains(&n), "{n} scans for 16 concurrent misses");
    // A miss after all that scans again (the device may have gone since).
    lookup.refresh().await;
    assert_eq!(scans.load(Ordering::SeqCst), n + 1);
}

/// Devices in pods are kept for the slices (`held`); a rescan on a miss sees only the host, so
/// it merges its devices in instead of replacing the list.
#[tokio::test]
async fn a_rescan_on_a_miss_keeps_entries_it_did_not_see() {
    let inv = SharedInventory::new(vec![Device {
        name: "inpod0".into(),
        held: true,
        ..Device::default()
    }]);
    let lookup = RescanOnMiss::new(inv.clone(), || {
        Ok(vec![Device {
            name: "home0".into(),
            ..Device::default()
        }])
    });
    lookup.refresh().await;
    let names: Vec<String> = inv.snapshot().into_iter().map(|d| d.name).collect();
    assert_eq!(names, ["home0", "inpod0"]);
}

/// Issue 38 squatter bug 1: a device whose host name another link holds is published as it
/// was (held, [`Device::squatted`]); Prepare plans neither the device nor that link, and says
/// why. A miss rescans once first (the name may be the device's again by now).
#[tokio::test]
async fn a_device_whose_name_another_link_holds_is_not_prepared_and_says_why() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let inv = SharedInventory::new(vec![Device {
        name: "drn1".into(),
        ifname: Some("drn1".into()),
        mac: Some("02:d7:00:00:00:01".into()),
        held: true,
        squatted: Some("its host name drn1 is held by another link".into()),
        ..Device::default()
    }]);
    let scans = Arc::new(AtomicUsize::new(0));
    let s2 = scans.clone();
    // The daemon's rescan drops the squatter (`Held::drop_impostors`): it sees nothing else.
    let lookup = RescanOnMiss::new(inv, move || {
        s2.fetch_add(1, Ordering::SeqCst);
        Ok(Vec::new())
    });
    let (p, claims, rec) = setup_with(Arc::new(lookup));
    claims.insert(claim(
        "c",
        "u",
        "pod",
        json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": "drn1"}]),
        json!([]),
    ));
    let err = p.prepare(&cref("c", "u")).await.unwrap_err();
    assert!(matches!(err, PrepareError::NameTaken { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("drn1") && msg.contains("held by another link"),
        "{msg}"
    );
    assert_eq!(scans.load(Ordering::SeqCst), 1);
    assert!(rec.plans().is_empty());
}

#[tokio::test]
async fn claim_without_our_devices_stores_no_plan() {
    let (p, claims, rec) = setup();
    claims.insert(claim(
        "gpu",
        "ug",
        "pod-g",
        json!([{"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu0"}]),
        json!([]),
    ));
    assert!(p.prepare(&cref("gpu", "ug")).await.unwrap().is_empty());
    assert!(rec.plans().is_empty());
}

/// A sink that refuses the first `fail` plans.
struct Flaky {
    fail: Mutex<usize>,
    inner: RecordingSink,
}

impl PlanSink for Flaky {
    fn claim_devices(&self, claim_uid: &str) -> Vec<DevicePlan> {
        self.inner.claim_devices(claim_uid)
    }
    fn set_claim(&self, claim: ClaimPlan) -> Result<(), String> {
        let mut f = self.fail.lock().unwrap();
        if *f > 0 {
            *f -= 1;
            return Err("checkpoint full".into());
        }
        self.inner.set_claim(claim)
    }
    fn remove_claim(&self, claim_uid: &str) -> Result<Vec<DevicePlan>, String> {
        self.inner.remove_claim(claim_uid)
    }
}

#[tokio::test]
async fn sink_failure_is_a_claim_error_and_is_rolled_back() {
    let claims = MemoryClaimSource::new();
    let sink = Arc::new(Flaky {
        fail: Mutex::new(1),
        inner: RecordingSink::default(),
    });
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims.clone()),
        Arc::new(inventory()),
        sink.clone(),
    );
    for (name, uid, dev) in [("c1", "u1", "eth1"), ("c2", "u2", "eth2")] {
        claims.insert(claim(
            name,
            uid,
            "pod-1",
            json!([{"request": "r", "driver": "dra.net", "pool": "node-a", "device": dev}]),
            json!([]),
        ));
    }
    let err = p.prepare(&cref("c1", "u1")).await.unwrap_err().to_string();
    assert!(err.contains("checkpoint full"), "{err}");
    p.prepare(&cref("c2", "u2")).await.unwrap();
    let plans = sink.inner.plans();
    let devs: Vec<&str> = plans["pod-1"].devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(devs, ["eth2"], "the failed claim's device was not merged");
}

#[tokio::test]
async fn scenario_claim_get_found_vanished_failing_and_hung() {
    use crate::slices::kube_mock::{Step, scenario, status};
    use std::time::{Duration, Instant};
    const C: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";
    let found = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dra.net"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}],
                "config": [{"source": "FromClaim", "requests": ["nic"],
                            "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "net1"}}}}]
            }},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "pod-1"}]
        }
    });
    let forbidden = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": "resourceclaims.resource.k8s.io \"c1\" is forbidden: User \"system:serviceaccount:kube-system:dranet\" cannot get resource \"resourceclaims\" in API group \"resource.k8s.io\" in the namespace \"ns\""
    });
    let (client, verifier) = scenario(
        vec![
            Step::get(&format!("{C}/c1")).reply(200, found.clone()),
            Step::get(&format!("{C}/gone")).reply(404, status(404, "NotFound")),
            // A failing server is asked again (backoff) within the claim's deadline.
            Step::get(&format!("{C}/c1")).reply(500, status(500, "etcdserver: leader changed")),
            Step::get(&format!("{C}/c1")).reply(503, status(503, "ServiceUnavailable")),
            Step::get(&format!("{C}/c1")).reply(200, found),
            // A 403 is final at once: asking again will not grant the permission.
            Step::get(&format!("{C}/c1")).reply(403, forbidden),
            Step::get(&format!("{C}/c1")).hang(),
        ],
        Duration::from_secs(5),
    );
    let timeout = Duration::from_millis(300);
    let ready = crate::ready::Readiness::new();
    let src = KubeClaimSource::new(client.clone())
        .with_timeout(timeout)
        .with_readiness(ready.clone());
    let patient = KubeClaimSource::new(client).with_timeout(Duration::from_secs(3));
    let bound = |f| tokio::time::timeout(Duration::from_secs(10), f);
    let ok = bound(src.get("ns", "c1")).await.unwrap();
    let gone = bound(src.get("ns", "gone")).await.unwrap();
    let retried = bound(patient.get("ns", "c1")).await.unwrap();
    assert!(ready.is_met(crate::ready::CLAIMS));
    let refused = bound(src.get("ns", "c1")).await.unwrap();
    let why = ready.ready().unwrap_err();
    let t0 = Instant::now();
    let hung = bound(src.get("ns", "c1")).await.unwrap();
    let hung_took = t0.elapsed();
    verifier.done().await;

    let rc = ok.unwrap();
    assert_eq!(rc.metadata.uid, "u1");
    assert_eq!(rc.status.reserved_for[0].uid, "pod-1");
    let e = gone.unwrap_err();
    assert!(matches!(e, ClaimError::NotFound { .. }), "{e:?}");
    assert_eq!(e.to_string(), "ResourceClaim ns/gone not found");
    assert_eq!(retried.unwrap().metadata.uid, "u1");
    let e = refused.unwrap_err();
    assert!(matches!(e, ClaimError::Kube { .. }), "{e:?}");
    assert!(
        why.contains(
            "claims: ResourceClaims not readable: 403 Forbidden: cannot get resourceclaims.resource.k8s.io"
        ),
        "{why}"
    );
    let e = hung.unwrap_err();
    assert!(matches!(e, ClaimError::Timeout { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "getting ResourceClaim ns/c1: no answer from the API server within 300ms"
    );
    assert!(hung_took < Duration::from_secs(3), "{hung_took:?}");
}

#[tokio::test]
async fn claim_get_against_a_failing_server_retries_until_its_deadline() {
    use crate::slices::kube_mock::{client, status};
    use std::time::{Duration, Instant};
    let (client, log) = client(|_| (500, status(500, "etcdserver: request timed out")));
    let src = KubeClaimSource::new(client).with_timeout(Duration::from_millis(1500));
    let t0 = Instant::now();
    let e = src.get("ns", "c1").await.unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, ClaimError::Kube { .. }), "{e:?}");
    let n = log.lock().unwrap().len();
    // 100 ms doubling, jittered: 4 to 5 attempts fit in 1.5 s; never past the deadline.
    assert!((3..=6).contains(&n), "{n} attempts");
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(took > Duration::from_millis(500), "{took:?}");
}

#[tokio::test]
async fn scenario_prepare_through_the_api_server_and_a_hung_get_stores_no_plan() {
    use crate::slices::kube_mock::{Step, scenario, status};
    use std::time::Duration;
    const C: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";
    let alloc = |uid: &str, pod: &str| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c1", "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "dra.net"}}]}},
            "status": {
                "allocation": {"devices": {
                    "results": [{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}],
                    "config": [{"source": "FromClaim", "requests": ["nic"],
                                "opaque": {"driver": "dra.net", "parameters": {"interface": {"name": "net1", "mtu": 9000}}}}]
                }},
                "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": pod}]
            }
        })
    };
    let (client, verifier) = scenario(
        vec![
            Step::get(&format!("{C}/c1")).reply(200, alloc("u1", "pod-1")),
            Step::get(&format!("{C}/c2")).hang(),
            Step::get(&format!("{C}/c3")).reply(404, status(404, "NotFound")),
        ],
        Duration::from_secs(5),
    );
    let rec = Arc::new(RecordingSink::default());
    let src = KubeClaimSource::new(client).with_timeout(Duration::from_millis(300));
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(src),
        Arc::new(inventory()),
        rec.clone(),
    );
    let (c1, c2, c3) = (cref("c1", "u1"), cref("c2", "u2"), cref("c3", "u3"));
    let t = Duration::from_secs(10);
    let ok = tokio::time::timeout(t, p.prepare(&c1)).await.unwrap();
    let hung = tokio::time::timeout(t, p.prepare(&c2)).await.unwrap();
    let gone = tokio::time::timeout(t, p.prepare(&c3)).await.unwrap();
    verifier.done().await;

    let devs = ok.unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].device, "eth1");
    let plans = rec.plans();
    assert_eq!(
        plans.len(),
        1,
        "only the claim the API server answered has a plan"
    );
    let plan = &plans["pod-1"];
    assert_eq!(plan.devices.len(), 1);
    assert_eq!(plan.devices[0].pod_ifname(), Some("net1"));
    assert_eq!(plan.devices[0].claim.uid, "u1");
    assert_eq!(plan.devices[0].host_ifname.as_deref(), Some("eth1"));
    let e = hung.unwrap_err().to_string();
    assert!(e.contains("no answer from the API server within 300ms"), "{e}");
    let e = gone.unwrap_err().to_string();
    assert!(e.contains("ResourceClaim ns/c3 not found"), "{e}");
}

/// A claim source whose GETs only answer once `n` of them are in flight at once: a Prepare that
/// fetches claims one at a time never gets an answer.
struct InFlightSource {
    inner: MemoryClaimSource,
    barrier: tokio::sync::Barrier,
}

impl ClaimSource for InFlightSource {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<ResourceClaim, ClaimError>> {
        Box::pin(async move {
            self.barrier.wait().await;
            self.inner.get(namespace, name).await
        })
    }
}

#[tokio::test]
async fn claims_of_one_call_are_fetched_concurrently_and_answered_in_order() {
    let inner = MemoryClaimSource::new();
    for (name, uid, dev) in [("c1", "u1", "eth1"), ("c2", "u2", "eth2"), ("c3", "u3", "vf0")] {
        inner.insert(claim(
            name,
            uid,
            "pod-1",
            json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": dev}]),
            json!([]),
        ));
    }
    let rec = Arc::new(RecordingSink::default());
    let p = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(InFlightSource {
            inner,
            barrier: tokio::sync::Barrier::new(3),
        }),
        Arc::new(inventory()),
        rec.clone(),
    );
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        super::server::prepare_all(&p, vec![cref("c3", "u3"), cref("c1", "u1"), cref("c2", "u2")]),
    )
    .await
    .expect("the three GETs were never in flight together: claims are fetched one at a time");
    let uids: Vec<&str> = out.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(uids, ["u3", "u1", "u2"], "answers follow the request's order");
    for (uid, res) in &out {
        let devs = res.as_ref().unwrap_or_else(|e| panic!("{uid}: {e}"));
        assert_eq!(devs.len(), 1, "{uid}");
    }
    let plans = rec.plans();
    let mut devices: Vec<&str> = plans["pod-1"].devices.iter().map(|d| d.device.as_str()).collect();
    devices.sort_unstable();
    assert_eq!(
        devices,
        ["eth1", "eth2", "vf0"],
        "the merged plan holds every claim's device"
    );
}

#[test]
fn more_claims_than_the_concurrency_bound_are_all_answered() {
    const { assert!(super::server::PREPARE_CONCURRENCY >= 8) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (p, claims, rec) = setup();
    let n = super::server::PREPARE_CONCURRENCY * 2 + 3;
    let mut refs = Vec::new();
    for i in 0..n {
        let (name, uid) = (format!("c{i}"), format!("u{i}"));
        // Every claim on the same device of another pod: the answers are what is compared.
        claims.insert(claim(
            &name,
            &uid,
            &format!("pod-{i}"),
            json!([{"request": "nic", "driver": "dra.net", "pool": "node-a", "device": "eth1"}]),
            json!([]),
        ));
        refs.push(cref(&name, &uid));
    }
    refs.push(cref("missing", "u-missing"));
    let out = rt.block_on(super::server::prepare_all(&p, refs));
    assert_eq!(out.len(), n + 1);
    for (i, (uid, res)) in out.iter().take(n).enumerate() {
        assert_eq!(uid, &format!("u{i}"));
        assert!(res.is_ok(), "{uid}: {res:?}");
    }
    let (uid, res) = &out[n];
    assert_eq!(uid, "u-missing");
    assert!(res.as_ref().is_err_and(|e| e.contains("not found")), "{res:?}");
    assert_eq!(rec.plans().len(), n);
}
