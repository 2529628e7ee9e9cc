//! Inventory: scan + ResourceSlice build for 256 veth devices in a private netns. Baseline: the
//! bare rtnetlink link dump of the same netns (the kernel's part of any scan).

use std::time::Instant;

use anyhow::{Context, Result};
use dranet::inventory::{NetnsTarget, ScanOptions};
use dranet_sim::kernel::{PodNetns, unique};

use crate::stats::Row;

pub async fn row(rounds: usize) -> Result<Row> {
    let ns = PodNetns::create(&unique("dranet-bench-inv-"))?;
    // 128 veth pairs = 256 devices, created in one `ip -batch`.
    let mut batch = String::new();
    for i in 0..128 {
        batch.push_str(&format!("link add inva{i} type veth peer name invb{i}\n"));
    }
    let file = std::env::temp_dir().join(unique("dranet-bench-inv-batch-"));
    std::fs::write(&file, batch)?;
    let path = file.display().to_string();
    ns.ip(&["-batch", &path]).context("creating 256 veth devices")?;
    let _ = std::fs::remove_file(&file);
    let opts = ScanOptions {
        netns: NetnsTarget::Path(ns.path.clone()),
        filter: None,
        ..ScanOptions::default()
    };
    let (mut samples, mut base) = (Vec::new(), Vec::new());
    let mut count = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let devices = dranet::inventory::scan(&opts)?;
        let slices = dranet::slices::build_slices("dra.net", "bench-node", 1, None, &devices);
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        count = devices.len();
        assert!(slices.len() >= 2, "256 devices need at least two slices of 128");
        let t = Instant::now();
        let nl = dranet::sys::netns::Netns::open_path(&ns.path)?;
        let link = dranet::sys::link::Netlink::in_netns(&nl).await?;
        let links = link.links().await?;
        base.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(links.len() >= 256);
    }
    let row = Row::latency(
        format!("inventory scan+slices ({count} devices)"),
        "ms",
        &samples,
        Some(&base),
    );
    let p99 = crate::stats::pct(&samples, 99.0);
    Ok(row
        .goal("p99 ≤ 50 ms", p99 <= 50.0)
        .note("baseline: bare rtnetlink link dump of the same netns"))
}
