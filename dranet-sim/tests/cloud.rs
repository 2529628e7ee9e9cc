//! Cloud attributes with the real daemon: `dranet run --cloud-provider-hint=GCE` against a slow
//! local metadata server (each answer after 1.5 s). The daemon starts, registers and publishes
//! without waiting for it; the GCE attributes join the slice when the metadata is in. Root:
//! the daemon loads its probes and a veth pair is created in the host netns (and removed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dranet_sim::kernel::{Veth, unique};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::root_or_skip;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A GCE metadata server that answers every read after `delay`; counts its answers.
async fn slow_gce(delay: Duration) -> Result<(String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>)> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", l.local_addr()?);
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).into_owned();
                let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
                let body = match path.as_str() {
                    "/computeMetadata/v1/instance/name" => "sim-vm".to_owned(),
                    "/computeMetadata/v1/instance/machine-type" => {
                        "projects/1/machineTypes/a3-highgpu-8g".to_owned()
                    }
                    "/computeMetadata/v1/instance/network-interfaces/?recursive=true&alt=json" => {
                        "[]".to_owned()
                    }
                    "/computeMetadata/v1/instance/attributes/physical_host" => "/b1/sb2/h3".to_owned(),
                    _ => String::new(),
                };
                tokio::time::sleep(delay).await;
                let status = if body.is_empty() {
                    "404 Not Found"
                } else {
                    "200 OK"
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nMetadata-Flavor: Google\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = c.write_all(resp.as_bytes()).await;
                count.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Ok((url, answered, task))
}

/// The attributes the slice files give device `ifname`, if published.
fn published(dir: &std::path::Path, ifname: &str) -> Option<serde_json::Value> {
    for e in std::fs::read_dir(dir.join("slices")).ok()?.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(slice) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for d in slice["spec"]["devices"].as_array().into_iter().flatten() {
            if d["attributes"]["dra.net/ifName"]["string"] == ifname {
                return Some(d["attributes"].clone());
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gce_attributes_join_the_slice_after_a_start_that_did_not_wait() -> Result<()> {
    root_or_skip!("gce_attributes_join_the_slice_after_a_start_that_did_not_wait");
    let delay = Duration::from_millis(1500);
    let (url, answered, server) = slow_gce(delay).await?;
    let name = unique("cl");
    let veth = Veth::create(&name, &format!("{name}p"))?;
    let mut node = Node::start(NodeOptions {
        extra_args: vec![
            "--cloud-provider-hint=GCE".to_owned(),
            format!("--cloud-metadata-endpoint={url}"),
        ],
        ..NodeOptions::default()
    })
    .await
    .context("dranet run")?;
    // The daemon is ready (registered with kubelet, runtime connected) before the four
    // metadata reads (1.5 s each) are answered.
    let at_ready = answered.load(Ordering::SeqCst);
    assert!(at_ready < 4, "start waited for the metadata ({at_ready} answers)");
    let t = Instant::now();
    let mut first = None;
    let mut with_cloud = None;
    while t.elapsed() < Duration::from_secs(30) {
        if let Some(a) = published(&node.dir, &veth.a) {
            if a.get("gce.dra.net/machineType").is_some() {
                with_cloud = Some(a);
                break;
            }
            first.get_or_insert(a);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = first.context("the device was not published before the metadata came")?;
    assert!(first.get("gce.dra.net/machineType").is_none());
    let a = with_cloud.context("no GCE attributes in the slice after 30 s")?;
    assert_eq!(a["gce.dra.net/machineType"]["string"], "a3-highgpu-8g");
    assert_eq!(a["gce.dra.net/block"]["string"], "b1");
    assert_eq!(a["gce.dra.net/subBlock"]["string"], "sb2");
    assert_eq!(a["gce.dra.net/host"]["string"], "h3");
    assert!(node.daemon_running());
    node.stop()?;
    server.abort();
    drop(veth);
    Ok(())
}
