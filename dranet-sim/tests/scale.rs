//! Scale on the real kernel: many pods torn down at once.

use std::time::Duration;

use anyhow::{Context, Result};
use dranet::watch::{Watcher, WatcherOptions};
use dranet_sim::fixtures::{StateDir, device_plan, pod_plan, pod_ref, wait_for, watched_engine};
use dranet_sim::kernel::{PodNetns, host_has, unique};
use dranet_sim::nic::{Nic, assert_same, view};
use dranet_sim::root_or_skip;
use nix::mount::MntFlags;

/// Eight pods torn down at the same instant, CRI-O style, each teardown triggering its rescue
/// exactly once (the umount2 only: no unlink follows): every device comes home restored.
/// Concurrent rescues used to share one host rtnetlink socket, and the kernel refuses a second
/// dump on a socket whose dump still runs (EBUSY): a rescue failed its pass and, with no second
/// trigger, its device stayed in the dying pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_pods_rescued_at_once_each_triggered_once() -> Result<()> {
    root_or_skip!("eight_pods_rescued_at_once_each_triggered_once");
    const PODS: usize = 8;
    let state = StateDir::new("drain8");
    let nics: Vec<Nic> = (0..PODS).map(|_| Nic::create()).collect::<Result<_>>()?;
    let before: Vec<_> = nics.iter().map(|n| view(&n.name, None)).collect::<Result<_>>()?;
    let watcher = Watcher::start(WatcherOptions::default()).await?;
    let (e, events) = watched_engine(&state, watcher).await?;
    let mut pods = Vec::new();
    for nic in &nics {
        let uid = unique("pod-drain-");
        let ns = PodNetns::create(&unique("dranet-drain-"))?;
        e.set_plan(pod_plan(
            &uid,
            vec![device_plan(nic, "net1", &uid, Default::default())],
        ))?;
        e.attach_pod(pod_ref(&uid), &ns.path).await?;
        pods.push((uid, ns));
    }
    // All at once: one thread per pod, released together, each only unmounting (one trigger).
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(PODS));
    let threads: Vec<_> = pods
        .iter()
        .map(|(_, ns)| {
            let (path, b) = (ns.path.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                nix::mount::umount2(&path, MntFlags::MNT_DETACH)
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("umount thread panicked"))??;
    }
    for (nic, b) in nics.iter().zip(&before) {
        wait_for(&format!("{} home", nic.name), Duration::from_secs(10), || {
            host_has(&nic.name)
        })
        .await?;
        let mut last = Ok(());
        for _ in 0..200 {
            last = assert_same(b, &view(&nic.name, None)?);
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        last?;
    }
    // Each rescue is counted once its pin is released, right after the last restore.
    wait_for("every rescue counted", Duration::from_secs(5), || {
        e.counters().rescued_by_teardown == PODS as u64
    })
    .await
    .with_context(|| format!("{:?}", e.counters()))?;
    assert_eq!(
        e.counters().returned_by_reconcile + e.counters().repaired_devices,
        0
    );
    // The files are left for the guards (umounted already).
    for (_, ns) in &pods {
        let _ = std::fs::remove_file(&ns.path);
    }
    drop(events);
    Ok(())
}
