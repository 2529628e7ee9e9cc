// Over 500 lines: one local metadata server per cloud and its failure cases.
//! Each cloud against a local server on 127.0.0.1 that answers like its metadata service (the
//! paths, headers and JSON layouts upstream reads, from recorded answers), and the failure
//! cases: no server, slow, 404, malformed. A failure is no cloud attributes, never an error.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::fake::{Req, Resp, Server, closed_port_url};
use super::*;
use crate::test_support::TempDir;

fn timing() -> CloudTiming {
    CloudTiming {
        request: Duration::from_millis(300),
        webhook: Duration::from_millis(300),
        probe_for: Duration::from_millis(400),
        fetch_for: Duration::from_millis(600),
        retry_every: Duration::from_millis(100),
    }
}

fn opts(url: &str, hint: Hint) -> CloudOptions {
    CloudOptions {
        hint,
        metadata_endpoint: Some(url.to_owned()),
        timing: timing(),
        ..CloudOptions::default()
    }
}

fn s(v: &str) -> AttrValue {
    AttrValue::String(v.to_owned())
}

fn ids(mac: &str, pci: &str, name: &str) -> DeviceIds {
    DeviceIds {
        mac: mac.into(),
        pci_address: pci.into(),
        name: name.into(),
    }
}

// ---- GCE ----

/// `instance/network-interfaces/?recursive=true&alt=json` of an a3 VM (upstream's recorded
/// answer, trimmed to two NICs).
const GCE_NICS: &str = r#"[{"accessConfigs":[{"externalIp":"35.225.164.134","type":"ONE_TO_ONE_NAT"}],"dnsServers":["169.254.169.254"],"forwardedIps":[],"gateway":"10.128.0.1","ip":"10.128.0.70","ipAliases":["10.24.3.0/24"],"mac":"42:01:0a:80:00:46","mtu":1460,"network":"projects/628944397724/networks/default","subnetmask":"255.255.240.0","targetInstanceIps":[]},{"accessConfigs":[{"externalIp":"","type":"ONE_TO_ONE_NAT"}],"dnsServers":["169.254.169.254"],"forwardedIps":[],"gateway":"192.168.1.1","ip":"192.168.1.2","ipAliases":[],"mac":"42:01:c0:a8:01:02","mtu":8244,"network":"projects/628944397724/networks/aojea-dra-net-1","subnetmask":"255.255.255.0","targetInstanceIps":[]}]"#;

fn gce(nics: &'static str, physical_host: Option<&'static str>) -> impl Fn(&Req) -> Resp {
    move |r: &Req| {
        let resp = if r.header("Metadata-Flavor") != Some("Google") {
            Resp::status(403)
        } else {
            match r.path.as_str() {
                "/" => Resp::ok("computeMetadata/\n"),
                "/computeMetadata/v1/instance/name" => Resp::ok("gke-a3-node-1\n"),
                "/computeMetadata/v1/instance/machine-type" => {
                    Resp::ok("projects/628944397724/machineTypes/a3-highgpu-8g")
                }
                "/computeMetadata/v1/instance/network-interfaces/?recursive=true&alt=json" => Resp::ok(nics),
                "/computeMetadata/v1/instance/attributes/physical_host" => match physical_host {
                    Some(h) => Resp::ok(h),
                    None => Resp::status(404),
                },
                _ => Resp::status(404),
            }
        };
        resp.with_header("Metadata-Flavor", "Google")
    }
}

#[tokio::test]
async fn gce_is_detected_and_its_attributes_are_upstreams() {
    let srv = Server::http(gce(GCE_NICS, Some("/CCCCCCC/BBBBBB/AAAA"))).await;
    let i = discover(&opts(&srv.url, Hint::Detect)).await.expect("GCE");
    assert_eq!(i.provider(), Provider::Gce);
    let a = i
        .device_attributes(&ids("42:01:0a:80:00:46", "0000:00:04.0", "eth0"))
        .await;
    assert_eq!(
        a,
        BTreeMap::from([
            ("gce.dra.net/block".to_owned(), s("CCCCCCC")),
            ("gce.dra.net/host".to_owned(), s("AAAA")),
            ("gce.dra.net/ipAliases".to_owned(), s("10.24.3.0/24")),
            ("gce.dra.net/machineType".to_owned(), s("a3-highgpu-8g")),
            ("gce.dra.net/networkName".to_owned(), s("default")),
            (
                "gce.dra.net/networkProjectNumber".to_owned(),
                AttrValue::Int(628_944_397_724)
            ),
            ("gce.dra.net/subBlock".to_owned(), s("BBBBBB")),
        ])
    );
    // A NIC without aliases; a device the metadata does not list gets the node's attributes.
    let b = i.device_attributes(&ids("42:01:c0:a8:01:02", "", "eth1")).await;
    assert_eq!(b["gce.dra.net/networkName"], s("aojea-dra-net-1"));
    assert!(!b.contains_key("gce.dra.net/ipAliases"));
    let c = i.device_attributes(&ids("02:00:00:00:00:01", "", "dummy0")).await;
    assert_eq!(c.len(), 4, "{c:?}");
    // Every metadata read carried the flavor header (the other clouds' probes came too).
    let reads: Vec<Req> = srv
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/computeMetadata/"))
        .collect();
    assert_eq!(reads.len(), 4, "name, machine type, interfaces, physical host");
    assert!(
        reads
            .iter()
            .all(|r| r.header("Metadata-Flavor") == Some("Google"))
    );
}

#[tokio::test]
async fn gce_without_physical_host_and_with_a_foreign_network_path() {
    let nics = r#"[{"mac":"42:01:0a:80:00:46","network":"projects/my-project/networks/default"}]"#;
    let srv = Server::http(gce(nics, None)).await;
    let i = discover(&opts(&srv.url, Hint::Provider(Provider::Gce)))
        .await
        .expect("GCE");
    let node = i.device_attributes(&ids("", "", "eth9")).await;
    assert_eq!(
        node,
        BTreeMap::from([("gce.dra.net/machineType".to_owned(), s("a3-highgpu-8g"))])
    );
    // Upstream drops every attribute of a device whose network path does not parse.
    assert!(
        i.device_attributes(&ids("42:01:0a:80:00:46", "", "eth0"))
            .await
            .is_empty()
    );
}

// ---- AWS ----

/// An instance identity document (recorded layout).
const AWS_DOCUMENT: &str = r#"{
  "accountId" : "123456789012",
  "architecture" : "x86_64",
  "availabilityZone" : "us-west-2a",
  "billingProducts" : null,
  "devpayProductCodes" : null,
  "marketplaceProductCodes" : null,
  "imageId" : "ami-0abcdef1234567890",
  "instanceId" : "i-1234567890abcdef0",
  "instanceType" : "trn1.32xlarge",
  "kernelId" : null,
  "pendingTime" : "2026-01-01T00:00:00Z",
  "privateIp" : "10.0.1.5",
  "ramdiskId" : null,
  "region" : "us-west-2",
  "version" : "2017-09-30"
}"#;

/// IMDSv2 only: the document needs the token.
fn aws(document: &'static str) -> impl Fn(&Req) -> Resp {
    move |r: &Req| match (r.method.as_str(), r.path.as_str()) {
        ("PUT", "/latest/api/token") if r.header("X-aws-ec2-metadata-token-ttl-seconds") == Some("21600") => {
            Resp::ok("AQAEAFake-Token==")
        }
        ("GET", "/latest/dynamic/instance-identity/document")
            if r.header("X-aws-ec2-metadata-token") == Some("AQAEAFake-Token==") =>
        {
            Resp::ok(document)
        }
        ("GET", "/latest/dynamic/instance-identity/document") => Resp::status(401),
        _ => Resp::status(404),
    }
}

fn efa_sysfs(tmp: &TempDir, product: &str, efa: &str, other: &str) {
    let dmi = tmp.path().join("devices/virtual/dmi/id");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(dmi.join("product_name"), format!("{product}\n")).unwrap();
    for (addr, driver) in [(efa, "efa"), (other, "ena")] {
        std::fs::create_dir_all(tmp.path().join("bus/pci/drivers").join(driver)).unwrap();
        let dev = tmp.path().join("bus/pci/devices").join(addr);
        std::fs::create_dir_all(&dev).unwrap();
        std::os::unix::fs::symlink(format!("../../drivers/{driver}"), dev.join("driver")).unwrap();
    }
}

#[tokio::test]
async fn aws_neuron_efa_devices_get_their_device_groups() {
    let tmp = TempDir::new("cloud-aws");
    efa_sysfs(&tmp, "trn1.32xlarge", "0000:10:1a.0", "0000:00:05.0");
    let srv = Server::http(aws(AWS_DOCUMENT)).await;
    let mut o = opts(&srv.url, Hint::Detect);
    o.sysfs = tmp.path().to_path_buf();
    let i = discover(&o).await.expect("AWS");
    assert_eq!(i.provider(), Provider::Aws);
    let a = i.device_attributes(&ids("", "0000:10:1a.0", "")).await;
    let want = neuron::device_groups("trn1.32xlarge", "0000:10:1a.0").unwrap();
    assert_eq!(a.len(), 4);
    for (k, v) in want {
        assert_eq!(a[&k], s(&v), "{k}");
    }
    assert_eq!(a["resource.aws.com/devicegroup1_id"], s("0000:10:1a.0"));
    // Not bound to efa, or not a PCI device: nothing.
    assert!(
        i.device_attributes(&ids("", "0000:00:05.0", "eth0"))
            .await
            .is_empty()
    );
    assert!(
        i.device_attributes(&ids("aa:bb:cc:dd:ee:ff", "", "veth1"))
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn aws_other_instances_publish_nothing_and_imdsv1_works() {
    let tmp = TempDir::new("cloud-aws-p5");
    efa_sysfs(&tmp, "p5.48xlarge", "0000:10:1a.0", "0000:00:05.0");
    let doc = r#"{"instanceType":"p5.48xlarge","region":"us-east-1"}"#;
    // IMDSv1: the token request is refused, the document answers without one.
    let srv = Server::http(move |r: &Req| match (r.method.as_str(), r.path.as_str()) {
        ("PUT", _) => Resp::status(403),
        ("GET", "/latest/dynamic/instance-identity/document") => Resp::ok(doc),
        _ => Resp::status(404),
    })
    .await;
    let mut o = opts(&srv.url, Hint::Provider(Provider::Aws));
    o.sysfs = tmp.path().to_path_buf();
    let i = discover(&o).await.expect("AWS");
    assert!(i.device_attributes(&ids("", "0000:10:1a.0", "")).await.is_empty());
}

// ---- Azure ----

/// `/metadata/instance/compute` of an ND H100 v5 VM (recorded layout, trimmed).
const AZURE_COMPUTE: &str = r#"{"azEnvironment":"AzurePublicCloud","isHostCompatibilityLayerVm":"false","location":"eastus","name":"aks-gpu-12345678-vmss_0","offer":"","osType":"Linux","placementGroupId":"a1b2c3d4-e5f6-4789-abcd-ef0123456789","plan":{"name":"","product":"","publisher":""},"platformFaultDomain":"0","platformUpdateDomain":"0","provider":"Microsoft.Compute","resourceGroupName":"MC_rg_cluster_eastus","sku":"","tags":"","vmId":"02aab8a4-74ef-476e-8182-f6d2ba4166a6","vmScaleSetName":"aks-gpu-12345678-vmss","vmSize":"Standard_ND96isr_H100_v5","interconnectGroupId":"ig-7","interconnectSubgroupId":""}"#;

/// `/metadata/instance/network` with two NICs (recorded layout).
const AZURE_NETWORK: &str = r#"{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.4","publicIpAddress":""}],"subnet":[{"address":"10.0.0.0","prefix":"24"}]},"ipv6":{"ipAddress":[]},"macAddress":"6045BDA7E0F1"},{"ipv4":{"ipAddress":[{"privateIpAddress":"10.9.255.4","publicIpAddress":""}],"subnet":[{"address":"10.9.255.0","prefix":"24"}]},"ipv6":{"ipAddress":[]},"macAddress":"6045BDA7E0F2"}]}"#;

fn azure(r: &Req) -> Resp {
    if r.header("Metadata") != Some("true") {
        return Resp::status(400);
    }
    match r.path.as_str() {
        "/metadata/instance?api-version=2025-11-11&format=text" => Resp::ok("compute/\nnetwork/\n"),
        "/metadata/instance/compute?api-version=2025-11-11&format=json" => Resp::ok(AZURE_COMPUTE),
        "/metadata/instance/network?api-version=2025-11-11&format=json" => Resp::ok(AZURE_NETWORK),
        _ => Resp::status(404),
    }
}

#[tokio::test]
async fn azure_node_attributes_on_every_device() {
    let srv = Server::http(azure).await;
    let i = discover(&opts(&srv.url, Hint::Detect)).await.expect("Azure");
    assert_eq!(i.provider(), Provider::Azure);
    let a = i.device_attributes(&ids("", "", "eth1")).await;
    assert_eq!(
        a,
        BTreeMap::from([
            ("azure.dra.net/interconnectGroupId".to_owned(), s("ig-7")),
            (
                "azure.dra.net/placementGroupId".to_owned(),
                s("a1b2c3d4-e5f6-4789-abcd-ef0123456789")
            ),
            ("azure.dra.net/vmSize".to_owned(), s("Standard_ND96isr_H100_v5")),
        ])
    );
    // Per-NIC policy routing for Prepare: the second NIC, table 101.
    let CloudInstance::Azure(az) = &i else {
        panic!("not Azure")
    };
    let cfg = az
        .device_config(&ids("60:45:bd:a7:e0:f2", "", "pci-0001-00-00-0"))
        .unwrap();
    assert_eq!(cfg.rules.len(), 1);
    assert_eq!(
        (cfg.rules[0].source.as_str(), cfg.rules[0].table),
        ("10.9.255.0/24", 101)
    );
    assert_eq!(
        (
            cfg.routes[0].destination.as_str(),
            cfg.routes[0].gateway.as_str(),
            cfg.routes[0].table
        ),
        ("0.0.0.0/0", "10.9.255.1", 101)
    );
    assert!(az.device_config(&ids("02:00:00:00:00:09", "", "eth9")).is_none());
}

// ---- OKE ----

fn oke(host: &'static str) -> impl Fn(&Req) -> Resp {
    move |r: &Req| {
        if r.header("Authorization") != Some("Bearer Oracle") {
            return Resp::status(401);
        }
        match r.path.as_str() {
            "/opc/v2/instance/" => {
                Resp::ok(r#"{"id":"ocid1.instance.oc1.iad.abc","shape":"BM.GPU.GB200.4"}"#)
            }
            "/opc/v2/host/" => Resp::ok(host),
            _ => Resp::status(404),
        }
    }
}

/// `/opc/v2/host/` of a GB200 host with RDMA topology data (recorded layout).
const OKE_GB200: &str = r#"{"id":"ocid1.computebaremetalhost.oc1.iad.anuwcljrhost","networkBlockId":"ocid1.computenetworkblock.oc1.iad.anuwcljrtop","rackId":"ocid1.computerack.oc1.iad.anuwcljrrack1234","rdmaTopologyData":{"customerGpuMemoryFabric":"ocid1.computegpumemoryfabric.oc1.iad.anuwcljrfabric","customerHPCIslandId":"ocid1.computehpcisland.oc1.iad.anuwcljrisland","customerHostId":"ocid1.computebaremetalhost.oc1.iad.anuwcljrhost","customerLocalBlock":"ocid1.computelocalblock.oc1.iad.anuwcljrlocal","customerNetworkBlock":"ocid1.computenetworkblock.oc1.iad.anuwcljrnetwork"}}"#;

#[tokio::test]
async fn oke_topology_from_rdma_topology_data_or_the_host() {
    let srv = Server::http(oke(OKE_GB200)).await;
    let i = discover(&opts(&srv.url, Hint::Detect)).await.expect("OKE");
    assert_eq!(i.provider(), Provider::Oke);
    assert_eq!(
        i.device_attributes(&ids("", "", "rdma0")).await,
        BTreeMap::from([
            ("oke.dra.net/gpuMemoryFabricId".to_owned(), s("anuwcljrfabric")),
            ("oke.dra.net/hpcIslandId".to_owned(), s("anuwcljrisland")),
            ("oke.dra.net/localBlockId".to_owned(), s("anuwcljrlocal")),
            ("oke.dra.net/networkBlockId".to_owned(), s("anuwcljrnetwork")),
            (
                "oke.dra.net/rackId".to_owned(),
                s("ocid1.computerack.oc1.iad.anuwcljrrack1234")
            ),
        ])
    );
    // H100: no rdmaTopologyData, the host's own ids as given.
    let srv = Server::http(oke(r#"{"networkBlockId":"nb-1","rackId":"rack-9"}"#)).await;
    let i = discover(&opts(&srv.url, Hint::Provider(Provider::Oke)))
        .await
        .expect("OKE");
    assert_eq!(
        i.device_attributes(&ids("", "", "rdma0")).await,
        BTreeMap::from([
            ("oke.dra.net/networkBlockId".to_owned(), s("nb-1")),
            ("oke.dra.net/rackId".to_owned(), s("rack-9")),
        ])
    );
}

// ---- Alibaba ----

fn alibaba(r: &Req) -> Resp {
    match (r.method.as_str(), r.path.as_str()) {
        ("PUT", "/latest/api/token")
            if r.header("X-aliyun-ecs-metadata-token-ttl-seconds") == Some("21600") =>
        {
            Resp::ok("ecs-token-123")
        }
        ("GET", p) if r.header("X-aliyun-ecs-metadata-token") == Some("ecs-token-123") => match p {
            "/latest/meta-data/instance-id" => Resp::ok("i-bp67acfmxazb4ph***"),
            "/latest/meta-data/instance/instance-type" => Resp::ok("ecs.ebmgn8v.48xlarge"),
            _ => Resp::status(404),
        },
        _ => Resp::status(403),
    }
}

#[tokio::test]
async fn alibaba_instance_type_everywhere_and_erdma_on_erdma_devices() {
    let tmp = TempDir::new("cloud-alibaba");
    let ib = tmp.path().join("class/infiniband/erdma_0");
    std::fs::create_dir_all(&ib).unwrap();
    std::os::unix::fs::symlink("../../../0000:00:06.0", ib.join("device")).unwrap();
    let srv = Server::http(alibaba).await;
    let mut o = opts(&srv.url, Hint::Detect);
    o.sysfs = tmp.path().to_path_buf();
    let i = discover(&o).await.expect("Alibaba");
    assert_eq!(i.provider(), Provider::Alibaba);
    assert_eq!(
        i.device_attributes(&ids("", "0000:00:06.0", "")).await,
        BTreeMap::from([
            ("alibaba.dra.net/erdma".to_owned(), AttrValue::Bool(true)),
            (
                "alibaba.dra.net/instanceType".to_owned(),
                s("ecs.ebmgn8v.48xlarge")
            ),
        ])
    );
    assert_eq!(
        i.device_attributes(&ids("", "0000:00:05.0", "eth0")).await.len(),
        1
    );
}

// ---- webhook as the cloud provider ----

#[tokio::test]
async fn webhook_attributes_and_device_config() {
    let srv = Server::http(|r: &Req| match r.path.as_str() {
        "/health" => Resp::ok(r#"{"cloudProvider":true,"profileProvider":false}"#),
        "/GetDeviceAttributes" => {
            let name = r.json()["name"].as_str().unwrap_or_default().to_owned();
            Resp::ok(format!(
                r#"{{"example.com/rail":{{"int":3}},"example.com/name":{{"string":"{name}"}}}}"#
            ))
        }
        "/GetDeviceConfig" => Resp::ok(r#"{"interface":{"mtu":8896}}"#),
        _ => Resp::status(404),
    })
    .await;
    let mut o = opts("http://127.0.0.1:1", Hint::Provider(Provider::Webhook));
    o.webhook_url = Some(srv.url.clone());
    let i = discover(&o).await.expect("webhook");
    let a = i
        .device_attributes(&ids("aa:bb:cc:dd:ee:ff", "0000:00:05.0", "eth1"))
        .await;
    assert_eq!(a["example.com/rail"], AttrValue::Int(3));
    assert_eq!(a["example.com/name"], s("eth1"));
    let sent = srv
        .requests()
        .into_iter()
        .find(|r| r.path == "/GetDeviceAttributes")
        .unwrap();
    assert_eq!(
        sent.json(),
        serde_json::json!({"mac_address": "aa:bb:cc:dd:ee:ff", "pci_address": "0000:00:05.0", "name": "eth1"})
    );
    let CloudInstance::Webhook(w) = &i else {
        panic!("not the webhook")
    };
    let cfg = w.device_config(&ids("", "", "pci-0000-00-05-0")).await.unwrap();
    assert_eq!(cfg.unwrap().interface.mtu, Some(8896));
    // Without the profile capability, profile calls are refused without a request.
    assert!(matches!(
        w.profile_config(&ids("", "", "d"), "uid", &crate::config::NetworkConfig::default())
            .await,
        Err(CloudError::NotImplemented(_))
    ));
}

// ---- failures: no cloud attributes, a bounded wait, never an error ----

#[tokio::test]
async fn no_metadata_server_is_no_cloud() {
    let url = closed_port_url().await;
    let t = Instant::now();
    assert!(discover(&opts(&url, Hint::Detect)).await.is_none());
    for p in [Provider::Gce, Provider::Aws, Provider::Azure, Provider::Oke] {
        assert!(discover(&opts(&url, Hint::Provider(p))).await.is_none(), "{p}");
    }
    // As upstream, Alibaba without its instance type is still Alibaba (the eRDMA attribute
    // comes from sysfs): here with no eRDMA device, no attributes.
    let tmp = TempDir::new("cloud-alibaba-none");
    let mut o = opts(&url, Hint::Provider(Provider::Alibaba));
    o.sysfs = tmp.path().to_path_buf();
    let i = discover(&o).await.expect("Alibaba by hint");
    assert!(
        i.device_attributes(&ids("", "0000:00:06.0", "eth0"))
            .await
            .is_empty()
    );
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

#[tokio::test]
async fn a_slow_metadata_server_is_no_cloud_within_the_deadline() {
    let srv = Server::http(|r: &Req| gce(GCE_NICS, None)(r).slow(Duration::from_secs(5))).await;
    let t = Instant::now();
    assert!(discover(&opts(&srv.url, Hint::Detect)).await.is_none());
    assert!(
        discover(&opts(&srv.url, Hint::Provider(Provider::Gce)))
            .await
            .is_none()
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

#[tokio::test]
async fn not_found_everywhere_is_no_cloud() {
    let srv = Server::http(|_: &Req| Resp::status(404)).await;
    assert!(discover(&opts(&srv.url, Hint::Detect)).await.is_none());
    for p in [Provider::Gce, Provider::Aws, Provider::Azure, Provider::Oke] {
        assert!(
            discover(&opts(&srv.url, Hint::Provider(p))).await.is_none(),
            "{p}"
        );
    }
    // GCE was asked with its header, and retried within the deadline.
    assert!(
        srv.paths()
            .iter()
            .any(|p| p == "/computeMetadata/v1/instance/name")
    );
}

#[tokio::test]
async fn malformed_answers_are_no_cloud_at_once() {
    let srv = Server::http(gce("{not json", None)).await;
    let t = Instant::now();
    assert!(
        discover(&opts(&srv.url, Hint::Provider(Provider::Gce)))
            .await
            .is_none()
    );
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "a malformed answer is final"
    );
    let srv = Server::http(|r: &Req| {
        if r.path.starts_with("/metadata/instance/compute") {
            Resp::ok(r#"{"vmSize": 42}"#)
        } else {
            azure(r)
        }
    })
    .await;
    assert!(discover(&opts(&srv.url, Hint::Detect)).await.is_none());
    let srv = Server::http(oke(
        r#"{"rdmaTopologyData":{"customerHPCIslandId":"not-an-ocid"}}"#,
    ))
    .await;
    assert!(
        discover(&opts(&srv.url, Hint::Provider(Provider::Oke)))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn hints_as_upstream() {
    assert_eq!(parse_hint(None).unwrap(), Hint::Detect);
    assert_eq!(parse_hint(Some("")).unwrap(), Hint::Detect);
    assert_eq!(parse_hint(Some("NONE")).unwrap(), Hint::None);
    assert_eq!(parse_hint(Some("none")).unwrap(), Hint::None);
    assert_eq!(
        parse_hint(Some("AZURE")).unwrap(),
        Hint::Provider(Provider::Azure)
    );
    assert_eq!(
        parse_hint(Some("webhook")).unwrap(),
        Hint::Provider(Provider::Webhook)
    );
    assert!(matches!(parse_hint(Some("gce")), Err(CloudError::UnknownHint(_))));
    // NONE asks nobody; a GCE_METADATA_HOST makes GCE without probing.
    let srv = Server::http(gce(GCE_NICS, None)).await;
    assert!(discover(&opts(&srv.url, Hint::None)).await.is_none());
    assert!(srv.requests().is_empty());
    let o = CloudOptions {
        gce_metadata_host: Some(srv.url.trim_start_matches("http://").to_owned()),
        timing: timing(),
        ..CloudOptions::default()
    };
    assert_eq!(discover(&o).await.map(|i| i.provider()), Some(Provider::Gce));
    assert!(!srv.paths().contains(&"/".to_owned()), "no probe");
}

/// The daemon's background job: the cloud slot fills and the scan is asked for again; with no
/// cloud it finishes and leaves the slot empty.
#[tokio::test]
async fn run_providers_fills_the_slot_and_asks_for_a_rescan() {
    let srv = Server::http(azure).await;
    let slots = NodeProviders::default();
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let a = asked.clone();
    run_providers(
        opts(&srv.url, Hint::Detect),
        ProfileChoice::Cloud,
        slots.clone(),
        move || {
            a.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        },
    )
    .await;
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(slots.cloud.get().map(|i| i.provider()), Some(Provider::Azure));
    let attrs = tokio::task::spawn_blocking({
        let c = slots.cloud.clone();
        move || c.attributes(&ids("", "", "eth1"))
    })
    .await
    .unwrap();
    assert_eq!(attrs["azure.dra.net/vmSize"], s("Standard_ND96isr_H100_v5"));
    assert!(slots.profiles.webhook().is_none());

    let none = NodeProviders::default();
    let url = closed_port_url().await;
    run_providers(
        opts(&url, Hint::Detect),
        ProfileChoice::Cloud,
        none.clone(),
        || panic!("no cloud: no rescan"),
    )
    .await;
    assert!(none.cloud.get().is_none());
}
