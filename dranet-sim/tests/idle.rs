//! An idle node costs the daemon almost nothing: with the runtime (NRI) and kubelet connected,
//! the probes loaded and the node's devices published, `dranet run` arms no timer that fires
//! more than about once a second. Counted as the kernel counts a thread's wake-ups: the
//! voluntary and involuntary context switches of every thread of the daemon over a window.
//!
//! What may still wake it on an idle node, by design: the DRA health stream's re-send to kubelet
//! (every 10 s of silence: kubelet marks a device's health unknown after 30 s without one), the
//! inventory's slow rescan (`--inventory-max-poll-interval`, an operator's setting), the sweep of
//! returned records (every 10 s, and only while there are any).

use std::time::Duration;

use anyhow::{Context, Result};
use dranet_sim::node::{Node, NodeOptions};
use dranet_sim::root_or_skip;

/// Voluntary + involuntary context switches over every thread of `pid`.
fn switches(pid: u32) -> Result<u64> {
    let mut sum = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
        let st = std::fs::read_to_string(t.path().join("status"))?;
        for key in ["voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"] {
            sum += st
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .with_context(|| format!("{key} of {}", t.path().display()))?;
        }
    }
    Ok(sum)
}

/// The window the wake-ups are counted over.
const WINDOW: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_daemon_wakes_at_most_once_a_second() -> Result<()> {
    root_or_skip!("an_idle_daemon_wakes_at_most_once_a_second");
    let node = Node::start(NodeOptions::default()).await?;
    let pid = node.daemon_pid().context("no daemon")?;
    // Settle: the first scans and publishes, the blocking pool's threads leaving (1 s after their
    // last job), the health stream's first list.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = switches(pid)?;
    tokio::time::sleep(WINDOW).await;
    let after = switches(pid)?;
    #[allow(clippy::cast_precision_loss)]
    let per_s = after.saturating_sub(before) as f64 / WINDOW.as_secs_f64();
    eprintln!("idle daemon: {per_s:.2} wake-ups/s over {WINDOW:?}");
    assert!(
        per_s <= 1.0,
        "an idle daemon woke {per_s:.2} times a second (goal: at most 1)"
    );
    Ok(())
}
