//! `dranet inventory`: scans the node (or a netns) once and prints the devices, or the
//! ResourceSlices that would be published, as JSON. Read-only.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;

use crate::inventory::{self, Filter, NetnsTarget, PciIds, ScanOptions, Sysfs};
use crate::slices::{self, DEFAULT_DRIVER};

/// Arguments of `dranet inventory`.
#[derive(clap::Args, Debug, Clone)]
pub struct InventoryArgs {
    /// sysfs root for the PCI/RDMA parts.
    #[arg(long, default_value = "/sys")]
    pub sysfs: PathBuf,
    /// Scan the netdevs of this netns file instead of the current netns.
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// CEL filter over device attributes (empty: none).
    #[arg(long, default_value = inventory::DEFAULT_FILTER)]
    pub filter: String,
    /// Skip IPoIB netdevs (expose their devices as RDMA-only).
    #[arg(long)]
    pub no_move_ib_interfaces: bool,
    /// Print ResourceSlices instead of devices.
    #[arg(long)]
    pub slices: bool,
    /// Node (pool) name for --slices; default: the host name.
    #[arg(long)]
    pub node: Option<String>,
    #[arg(long, default_value = DEFAULT_DRIVER)]
    pub driver: String,
    /// Upstream feature gates, `Name=true,...` (`DRAListTypeAttributes=true`: the NUMA node as
    /// a list, as `dranet run` would publish it).
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,
    /// Also list the uplinks (the netdevs of the node's default routes and their PCI devices),
    /// which `dranet run` never publishes.
    #[arg(long)]
    pub with_uplinks: bool,
    /// Print every PCI function with its class, IDs, driver and names as `dra.net/pciVendor`
    /// and `dra.net/pciDevice` would read (and where the names come from) instead.
    #[arg(long, conflicts_with = "slices")]
    pub pci: bool,
}

/// Runs the subcommand.
#[must_use]
pub fn main(args: &InventoryArgs) -> ExitCode {
    let filter = match Filter::compile(&args.filter) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}", crate::telemetry::chain(&e));
            return ExitCode::from(2);
        }
    };
    if let Some(Err(e)) = args
        .feature_gates
        .as_deref()
        .map(super::upstream::parse_feature_gates)
    {
        eprintln!("{}", crate::telemetry::chain(&e));
        return ExitCode::from(2);
    }
    if args.pci {
        return print(&pci_functions(&Sysfs::new(&args.sysfs), &PciIds::load_default()));
    }
    let opts = ScanOptions {
        sysfs: Sysfs::new(&args.sysfs),
        netns: args.netns.clone().map_or(NetnsTarget::Current, NetnsTarget::Path),
        move_ib_interfaces: !args.no_move_ib_interfaces,
        pci_ids: PciIds::load_default(),
        filter,
        numa_list: super::upstream::gate_on(args.feature_gates.as_deref(), "DRAListTypeAttributes"),
        extra: None,
        keep_uplinks: args.with_uplinks,
    };
    let devices = match inventory::scan(&opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("inventory scan failed: {}", crate::telemetry::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let out = if args.slices {
        let node = args.node.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default()
        });
        serde_json::to_value(slices::build_slices(&args.driver, &node, 1, None, &devices))
    } else {
        Ok(serde_json::Value::Array(
            devices
                .iter()
                .map(|d| {
                    json!({
                        "name": d.name,
                        "attributes": d.attributes,
                        "ifName": d.ifname,
                        "pciAddress": d.pci_address,
                        "rdmaDevice": d.rdma_device,
                        "charDevices": d.char_devices,
                    })
                })
                .collect(),
        ))
    };
    match out {
        Ok(v) => print(&v),
        Err(e) => {
            eprintln!("{}", crate::telemetry::chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Every PCI function: address, class, IDs, driver, names as upstream renders them.
fn pci_functions(sysfs: &Sysfs, ids: &PciIds) -> serde_json::Value {
    let dir = sysfs.root().join("bus/pci/devices");
    let mut addrs: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    addrs.sort();
    let list: Vec<serde_json::Value> = addrs
        .iter()
        .filter_map(|a| {
            let info = sysfs.pci_info(a)?;
            let class = std::fs::read_to_string(dir.join(a).join("class")).unwrap_or_default();
            let (vendor, device) = ids.attributes(&info.vendor_id, &info.device_id);
            Some(json!({
                "address": a,
                "class": class.trim(),
                "vendorId": info.vendor_id,
                "deviceId": info.device_id,
                "driver": info.driver,
                "pciVendor": vendor,
                "pciDevice": device,
            }))
        })
        .collect();
    json!({"pciIds": ids.source().to_string(), "functions": list})
}

fn print(v: &serde_json::Value) -> ExitCode {
    match serde_json::to_string_pretty(v) {
        Ok(s) => {
            use std::io::Write as _;
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout(), "{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}", crate::telemetry::chain(&e));
            ExitCode::FAILURE
        }
    }
}
