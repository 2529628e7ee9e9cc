//! Profiles and provider configs at Prepare, against a local webhook (HTTP on 127.0.0.1 or a
//! unix socket) that answers upstream's protocol: `/health`, `/GetDeviceConfig`,
//! `/GetProfileConfig`, `/ReleaseProfileConfig`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::cloud::fake::{Req, Resp, Server};
use crate::cloud::{CloudOptions, CloudTiming, Hint, NodeProviders, ProfileChoice, Provider};
use crate::inventory::{AttrValue, Device, SharedInventory};
use crate::plan::ClaimRef;
use crate::test_support::RecordingSink;

fn inventory() -> SharedInventory {
    let attrs = |mac: &str, pci: &str| {
        BTreeMap::from([
            ("dra.net/mac".to_owned(), AttrValue::String(mac.into())),
            ("dra.net/pciAddress".to_owned(), AttrValue::String(pci.into())),
        ])
    };
    SharedInventory::new(vec![
        Device {
            name: "pci-0000-17-00-0".into(),
            ifname: Some("ens1".into()),
            pci_address: Some("0000:17:00.0".into()),
            attributes: attrs("b8:3f:d2:00:00:01", "0000:17:00.0").into(),
            ..Device::default()
        },
        Device {
            name: "pci-0000-17-00-1".into(),
            ifname: Some("ens2".into()),
            pci_address: Some("0000:17:00.1".into()),
            attributes: attrs("b8:3f:d2:00:00:02", "0000:17:00.1").into(),
            ..Device::default()
        },
    ])
}

fn claim(uid: &str, devices: &[&str], params: serde_json::Value) -> ResourceClaim {
    let results: Vec<serde_json::Value> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| json!({"request": format!("nic{i}"), "driver": "dra.net", "pool": "node-a", "device": d}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("c-{uid}"), "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {"devices": {"results": results, "config": [
                {"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": params}}
            ]}},
            "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": "pod-1"}]
        }
    }))
    .unwrap()
}

fn cref(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "ns".into(),
        name: format!("c-{uid}"),
        uid: uid.into(),
    }
}

fn timing() -> CloudTiming {
    CloudTiming {
        request: Duration::from_millis(500),
        webhook: Duration::from_millis(500),
        probe_for: Duration::from_millis(500),
        fetch_for: Duration::from_millis(500),
        retry_every: Duration::from_millis(100),
    }
}

/// The node's providers with the webhook at `url` (as the profile provider, and as the cloud
/// provider when `cloud`), set up as `dranet run` does.
async fn providers(url: &str, cloud: bool) -> NodeProviders {
    let slots = NodeProviders::default();
    let opts = CloudOptions {
        hint: if cloud {
            Hint::Provider(Provider::Webhook)
        } else {
            Hint::None
        },
        webhook_url: Some(url.to_owned()),
        timing: timing(),
        ..CloudOptions::default()
    };
    crate::cloud::run_providers(opts, ProfileChoice::Webhook, slots.clone(), || {}).await;
    slots
}

fn preparer(claims: &MemoryClaimSource, p: Option<NodeProviders>) -> (Preparer, Arc<RecordingSink>) {
    let rec = Arc::new(RecordingSink::default());
    let mut prep = Preparer::new(
        "dra.net",
        "node-a",
        Arc::new(claims.clone()),
        Arc::new(inventory()),
        rec.clone(),
    );
    if let Some(p) = p {
        prep = prep.with_providers(Arc::new(p));
    }
    (prep, rec)
}

/// An IPAM webhook: one address per claim and device, from a /24 per device.
fn ipam(r: &Req) -> Resp {
    match r.path.as_str() {
        "/health" => Resp::ok(r#"{"cloudProvider":false,"profileProvider":true}"#),
        "/GetProfileConfig" => {
            let body = r.json();
            let pci = body["device"]["pci_address"].as_str().unwrap_or_default();
            let host = if pci.ends_with(".0") { 10 } else { 20 };
            Resp::ok(format!(
                r#"{{"interface":{{"addresses":["10.9.{host}.5/24"],"name":"ipam0"}},"routes":[{{"destination":"10.9.0.0/16","gateway":"10.9.{host}.1"}}]}}"#
            ))
        }
        "/ReleaseProfileConfig" => Resp::ok(""),
        _ => Resp::status(404),
    }
}

async fn wait_for(srv: &Server, path: &str, n: usize) -> Vec<Req> {
    for _ in 0..50 {
        let got: Vec<Req> = srv.requests().into_iter().filter(|r| r.path == path).collect();
        if got.len() >= n {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{path} was not called {n} time(s): {:?}", srv.paths());
}

#[tokio::test]
async fn without_a_profile_provider_a_profile_fails_with_its_path() {
    let claims = MemoryClaimSource::new();
    claims.insert(claim("u1", &["pci-0000-17-00-0"], json!({"profile": "ipam-a"})));
    let (p, rec) = preparer(&claims, None);
    let e = p.prepare(&cref("u1")).await.unwrap_err();
    let PrepareError::Config { source, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(source.field_errors()[0].path, "profile", "{e}");
    let e = crate::telemetry::chain(&e).to_string();
    assert!(e.contains("no profile provider"), "{e}");
    assert!(rec.plans().is_empty(), "never silently ignored");
}

#[tokio::test]
async fn a_profile_is_resolved_by_the_webhook_merged_under_the_claim_and_released() {
    let sock = std::env::temp_dir().join(format!("dranet-ipam-{}.sock", std::process::id()));
    let srv = Server::unix(&sock, ipam).await;
    let claims = MemoryClaimSource::new();
    claims.insert(claim(
        "u1",
        &["pci-0000-17-00-0"],
        json!({"profile": "ipam-a", "interface": {"name": "net1"}}),
    ));
    let (p, rec) = preparer(&claims, Some(providers(&srv.url, false).await));
    p.prepare(&cref("u1")).await.unwrap();
    let cfg = rec.plans()["pod-1"].devices[0].config.clone();
    assert_eq!(cfg.interface.name.as_deref(), Some("net1"), "the claim wins");
    assert_eq!(cfg.interface.addresses, ["10.9.10.5/24"], "the profile's address");
    assert_eq!(cfg.routes[0].gateway, "10.9.10.1");
    // The request: the device by its name, MAC and PCI address, the claim, the merged config.
    let sent = wait_for(&srv, "/GetProfileConfig", 1).await;
    assert_eq!(
        sent[0].json(),
        json!({
            "device": {"mac_address": "b8:3f:d2:00:00:01", "pci_address": "0000:17:00.0", "name": "pci-0000-17-00-0"},
            "claim_uid": "u1",
            "config": {"profile": "ipam-a", "interface": {"name": "net1"}}
        })
    );
    assert_eq!(sent[0].header("Content-Type"), Some("application/json"));
    // A repeated Prepare keeps the address: nothing taken twice.
    p.prepare(&cref("u1")).await.unwrap();
    assert_eq!(wait_for(&srv, "/GetProfileConfig", 1).await.len(), 1);
    // Unprepare gives it back, with the config it was prepared with.
    p.unprepare("u1").unwrap();
    let released = wait_for(&srv, "/ReleaseProfileConfig", 1).await;
    assert_eq!(released[0].json()["claim_uid"], "u1");
    assert_eq!(
        released[0].json()["config"]["interface"]["addresses"],
        json!(["10.9.10.5/24"])
    );
    let _ = std::fs::remove_file(&sock);
}

#[tokio::test]
async fn a_failing_or_slow_webhook_fails_prepare_with_its_answer() {
    let srv = Server::http(|r: &Req| match r.path.as_str() {
        "/health" => Resp::ok(r#"{"cloudProvider":false,"profileProvider":true}"#),
        "/GetProfileConfig" if r.json()["claim_uid"] == "slow" => Resp::ok("{}").slow(Duration::from_secs(3)),
        "/GetProfileConfig" => Resp {
            status: 500,
            ..Resp::ok("pool ipam-a exhausted")
        },
        _ => Resp::status(404),
    })
    .await;
    let claims = MemoryClaimSource::new();
    claims.insert(claim("u1", &["pci-0000-17-00-0"], json!({"profile": "ipam-a"})));
    claims.insert(claim("slow", &["pci-0000-17-00-0"], json!({"profile": "ipam-a"})));
    let (p, _) = preparer(&claims, Some(providers(&srv.url, false).await));
    let e = p.prepare(&cref("u1")).await.unwrap_err();
    assert!(matches!(e, PrepareError::Profile { .. }), "{e}");
    assert!(e.to_string().contains("HTTP 500: pool ipam-a exhausted"), "{e}");
    let t = std::time::Instant::now();
    let e = p.prepare(&cref("slow")).await.unwrap_err();
    assert!(e.to_string().contains("no answer within"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_failure_after_the_profile_gives_it_back() {
    let srv = Server::http(ipam).await;
    let claims = MemoryClaimSource::new();
    // The second device is not in the inventory: the claim fails after the first got an address.
    claims.insert(claim(
        "u1",
        &["pci-0000-17-00-0", "pci-0000-99-00-0"],
        json!({"profile": "ipam-a"}),
    ));
    let (p, rec) = preparer(&claims, Some(providers(&srv.url, false).await));
    let e = p.prepare(&cref("u1")).await.unwrap_err();
    assert!(matches!(e, PrepareError::UnknownDevice { .. }), "{e}");
    let released = wait_for(&srv, "/ReleaseProfileConfig", 1).await;
    assert_eq!(released[0].json()["device"]["name"], "pci-0000-17-00-0");
    assert!(rec.plans().is_empty());
}

#[tokio::test]
async fn a_profile_answer_that_breaks_a_rule_fails_and_is_given_back() {
    let srv = Server::http(|r: &Req| match r.path.as_str() {
        "/health" => Resp::ok(r#"{"profileProvider":true}"#),
        "/GetProfileConfig" => Resp::ok(r#"{"interface":{"mtu":10}}"#),
        "/ReleaseProfileConfig" => Resp::ok(""),
        _ => Resp::status(404),
    })
    .await;
    let claims = MemoryClaimSource::new();
    claims.insert(claim("u1", &["pci-0000-17-00-0"], json!({"profile": "jumbo"})));
    let (p, _) = preparer(&claims, Some(providers(&srv.url, false).await));
    let e = p.prepare(&cref("u1")).await.unwrap_err();
    let PrepareError::Config { source, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(source.field_errors()[0].path, "interface.mtu", "{e}");
    wait_for(&srv, "/ReleaseProfileConfig", 1).await;
}

/// Upstream's order: the claim over the profile over the cloud's device config.
#[tokio::test]
async fn claim_over_profile_over_cloud_config() {
    let srv = Server::http(|r: &Req| match r.path.as_str() {
        "/health" => Resp::ok(r#"{"cloudProvider":true,"profileProvider":true}"#),
        "/GetDeviceAttributes" => Resp::ok("{}"),
        "/GetDeviceConfig" => Resp::ok(
            r#"{"interface":{"name":"cloud0","mtu":8896,"addresses":["10.1.0.2/24"]},"routes":[{"destination":"0.0.0.0/0","gateway":"10.1.0.1","table":100}]}"#,
        ),
        "/GetProfileConfig" => Resp::ok(r#"{"interface":{"name":"prof0","addresses":["10.2.0.2/24"],"arpIgnore":1}}"#),
        _ => Resp::status(404),
    })
    .await;
    let claims = MemoryClaimSource::new();
    claims.insert(claim(
        "u1",
        &["pci-0000-17-00-1"],
        json!({"profile": "p", "interface": {"name": "user0"}}),
    ));
    let prov = providers(&srv.url, true).await;
    assert!(
        prov.cloud.get().is_some(),
        "the webhook is the cloud provider too"
    );
    let (p, rec) = preparer(&claims, Some(prov));
    p.prepare(&cref("u1")).await.unwrap();
    let cfg = rec.plans()["pod-1"].devices[0].config.clone();
    assert_eq!(cfg.interface.name.as_deref(), Some("user0"));
    assert_eq!(cfg.interface.mtu, Some(8896), "from the cloud");
    assert_eq!(cfg.interface.arp_ignore, Some(1), "from the profile");
    assert_eq!(cfg.interface.addresses, ["10.2.0.2/24", "10.1.0.2/24"]);
    assert_eq!(cfg.routes.len(), 1);
    // The profile saw the claim's config merged over the cloud's.
    let sent = wait_for(&srv, "/GetProfileConfig", 1).await;
    assert_eq!(sent[0].json()["config"]["interface"]["mtu"], 8896);
    assert_eq!(sent[0].json()["config"]["interface"]["name"], "user0");
}
