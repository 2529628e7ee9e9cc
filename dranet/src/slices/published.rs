//! What this node published before this start: the identities of the devices in this driver's
//! slices of this node's pool (`dra.net/pciAddress`, `dra.net/ifName`, `dra.net/rdmaDevice`),
//! read once at start, before the first publish replaces them. Adoption needs them for devices
//! that are in pods (so absent from the host scan) when no plan names them: after a lost
//! checkpoint, and after a switch from upstream dranet, whose slices carry the same attributes.
//!
//! Slices are written by drivers and cluster admins, never by tenants; still every value is
//! checked for its shape (a PCI address, an interface name) before it is used.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use serde_json::Value;
use tracing::{info, warn};

use super::SliceError;
use crate::inventory::{attr, is_pci_address};

/// How long the start-up read of the node's slices may take before adoption goes on with plans
/// only.
pub const PUBLISHED_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The identity of one published device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedDevice {
    pub pci_address: Option<String>,
    pub if_name: Option<String>,
    pub rdma_device: Option<String>,
}

/// Published devices by slice device name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedDevices {
    devices: BTreeMap<String, PublishedDevice>,
}

/// A string attribute of a device (`{"string": "…"}`), if it has one.
fn string_attr<'a>(device: &'a Value, name: &str) -> Option<&'a str> {
    device
        .get("attributes")?
        .get(name)?
        .get("string")?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// An RDMA device name: 1 to 63 bytes (`IB_DEVICE_NAME_MAX`), printable, no `/`.
fn is_rdma_name(s: &str) -> bool {
    (1..64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

impl PublishedDevices {
    /// The devices of the slices of `driver` in pool `pool` among `slices` (JSON as the API
    /// server or `--slices-dir` holds them). Where stale slices name a device twice, the highest
    /// pool generation wins.
    #[must_use]
    pub fn from_slices(slices: &[Value], driver: &str, pool: &str) -> Self {
        let mut ours: Vec<&Value> = slices
            .iter()
            .filter(|s| {
                s.pointer("/spec/driver").and_then(Value::as_str) == Some(driver)
                    && s.pointer("/spec/pool/name").and_then(Value::as_str) == Some(pool)
            })
            .collect();
        ours.sort_by_key(|s| {
            s.pointer("/spec/pool/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        });
        let mut devices = BTreeMap::new();
        for s in ours {
            let Some(list) = s.pointer("/spec/devices").and_then(Value::as_array) else {
                continue;
            };
            for d in list {
                let Some(name) = d.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
                    continue;
                };
                let identity = PublishedDevice {
                    pci_address: string_attr(d, attr::PCI_ADDRESS)
                        .filter(|a| is_pci_address(a))
                        .map(str::to_owned),
                    if_name: string_attr(d, attr::IF_NAME)
                        .filter(|n| crate::ids::is_ifname(n))
                        .map(str::to_owned),
                    rdma_device: string_attr(d, attr::RDMA_DEVICE)
                        .filter(|n| is_rdma_name(n))
                        .map(str::to_owned),
                };
                devices.insert(name.to_owned(), identity);
            }
        }
        Self { devices }
    }

    /// Reads the node's slices through `read` (bounded by `timeout`) before anything replaces
    /// them. A failure or a timeout is logged and gives no devices: adoption then works from the
    /// engine's plans only.
    pub async fn read(
        read: impl Future<Output = Result<Vec<Value>, SliceError>>,
        driver: &str,
        pool: &str,
        timeout: Duration,
    ) -> Self {
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(slices)) => {
                let me = Self::from_slices(&slices, driver, pool);
                info!(
                    slices = slices.len(),
                    devices = me.len(),
                    "devices this node published before this start (for adoption)"
                );
                me
            }
            Ok(Err(e)) => {
                warn!(error = %crate::telemetry::chain(&e), "cannot read the slices this node published before this start: adoption works from the checkpoint's plans only");
                Self::default()
            }
            Err(_) => {
                warn!(after = ?timeout, "no answer reading the slices this node published before this start: adoption works from the checkpoint's plans only");
                Self::default()
            }
        }
    }

    #[must_use]
    pub fn get(&self, device: &str) -> Option<&PublishedDevice> {
        self.devices.get(device)
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(driver: &str, pool: &str, generation: i64, devices: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{pool}-{driver}-x")},
            "spec": {"driver": driver, "nodeName": pool,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}
        })
    }

    #[test]
    fn identities_of_this_drivers_devices_in_this_pool() {
        let slices = vec![
            // As upstream dranet publishes them (other attributes and capacity besides).
            slice(
                "dra.net",
                "node-a",
                3,
                json!([
                    {"name": "eth1", "attributes": {
                        "dra.net/pciAddress": {"string": "0000:00:04.0"},
                        "dra.net/ifName": {"string": "eth1"},
                        "dra.net/numaNode": {"int": 0},
                        "dra.net/sriov": {"bool": false}},
                     "capacity": {"dra.net/bandwidth": {"value": "10G"}}},
                    {"name": "pci-0000-3b-00-1", "attributes": {
                        "dra.net/pciAddress": {"string": "0000:3b:00.1"},
                        "dra.net/rdmaDevice": {"string": "mlx5_1"}}},
                    {"name": "net-abc", "attributes": {"dra.net/ifName": {"string": "very.long:name"}}},
                    {"name": "veth0", "attributes": {"dra.net/ifName": {"string": "veth0"}}},
                    {"name": "bad", "attributes": {
                        "dra.net/pciAddress": {"string": "../../etc"},
                        "dra.net/ifName": {"string": "a/b"}}}
                ]),
            ),
            // An older generation names eth1 differently: the newer wins.
            slice(
                "dra.net",
                "node-a",
                1,
                json!([{"name": "eth1", "attributes": {"dra.net/pciAddress": {"string": "0000:00:09.0"}}}]),
            ),
            slice(
                "dra.net",
                "node-b",
                9,
                json!([{"name": "eth7", "attributes": {"dra.net/pciAddress": {"string": "0000:00:07.0"}}}]),
            ),
            slice(
                "gpu.example.com",
                "node-a",
                9,
                json!([{"name": "gpu0", "attributes": {"dra.net/pciAddress": {"string": "0000:00:08.0"}}}]),
            ),
            json!({"spec": "not a slice"}),
        ];
        let p = PublishedDevices::from_slices(&slices, "dra.net", "node-a");
        assert_eq!(p.len(), 5);
        assert_eq!(
            p.get("eth1"),
            Some(&PublishedDevice {
                pci_address: Some("0000:00:04.0".into()),
                if_name: Some("eth1".into()),
                rdma_device: None,
            })
        );
        assert_eq!(
            p.get("pci-0000-3b-00-1"),
            Some(&PublishedDevice {
                pci_address: Some("0000:3b:00.1".into()),
                if_name: None,
                rdma_device: Some("mlx5_1".into()),
            })
        );
        // A veth has no PCI address: no kernel identity to adopt it by.
        assert_eq!(p.get("veth0").and_then(|d| d.pci_address.clone()), None);
        // Values of the wrong shape are dropped.
        assert_eq!(p.get("bad"), Some(&PublishedDevice::default()));
        assert_eq!(p.get("net-abc"), Some(&PublishedDevice::default()));
        assert_eq!(p.get("eth7"), None);
        assert_eq!(p.get("gpu0"), None);
    }

    #[tokio::test]
    async fn a_failed_or_hung_read_gives_nothing() {
        let failed = PublishedDevices::read(
            async {
                Err(SliceError::Timeout {
                    what: "listing".into(),
                    after: Duration::from_secs(1),
                })
            },
            "dra.net",
            "node-a",
            Duration::from_secs(1),
        )
        .await;
        assert!(failed.is_empty());
        let hung = PublishedDevices::read(
            futures::future::pending(),
            "dra.net",
            "node-a",
            Duration::from_millis(20),
        )
        .await;
        assert!(hung.is_empty());
        let ok = PublishedDevices::read(
            async {
                Ok(vec![slice(
                    "dra.net",
                    "node-a",
                    1,
                    json!([{"name": "eth1", "attributes": {"dra.net/pciAddress": {"string": "0000:00:04.0"}}}]),
                )])
            },
            "dra.net",
            "node-a",
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(ok.len(), 1);
    }

    #[test]
    fn what_a_dir_publisher_wrote_reads_back() {
        let dir = std::env::temp_dir().join(format!("dranet-published-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let p = crate::slices::DirPublisher::new(&dir, "dra.net", "node-a");
        let mut dev = crate::inventory::Device {
            name: "eth1".into(),
            ..crate::inventory::Device::default()
        };
        dev.attributes.insert(
            attr::PCI_ADDRESS.into(),
            crate::inventory::AttrValue::String("0000:00:04.0".into()),
        );
        dev.attributes.insert(
            attr::IF_NAME.into(),
            crate::inventory::AttrValue::String("eth1".into()),
        );
        let slices = crate::slices::build_slices("dra.net", "node-a", 4, None, &[dev]);
        futures::executor::block_on(crate::slices::Publisher::publish(&p, &slices)).unwrap();
        let read = futures::executor::block_on(p.existing_slices()).unwrap();
        let got = PublishedDevices::from_slices(&read, "dra.net", "node-a");
        assert_eq!(
            got.get("eth1").and_then(|d| d.pci_address.as_deref()),
            Some("0000:00:04.0")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
