//! Crash-test child: runs the rescue engine, attaches one pod, prints `attached` and waits to be
//! killed. `engine-child STATE_DIR NETNS_PATH POD_UID PAUSE_AFTER_DEVICE|- PLAN_JSON`.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use dranet::plan::PodPlan;
use dranet::rescue::{Engine, EngineOptions, PodRef};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, state, netns, uid, pause, plan] = args.as_slice() else {
        anyhow::bail!("usage: engine-child STATE_DIR NETNS_PATH POD_UID PAUSE_AFTER_DEVICE|- PLAN_JSON");
    };
    let plan: PodPlan = serde_json::from_str(plan).context("plan")?;
    let pause_after_device = match pause.as_str() {
        "-" => None,
        n => Some((n.parse()?, Duration::from_secs(60))),
    };
    let opts = EngineOptions {
        state_dir: PathBuf::from(state),
        pause_after_device,
        ..EngineOptions::default()
    };
    let engine = Engine::new(opts, None).await?;
    engine.set_plan(plan)?;
    if pause_after_device.is_some() {
        // Tell the test the attach is under way; it kills us during the pause.
        println!("attaching");
    }
    let out = engine
        .attach_pod(
            PodRef::parse(uid, uid, "default", "crash")?,
            &PathBuf::from(netns),
        )
        .await?;
    println!("attached {out:?}");
    tokio::time::sleep(Duration::from_secs(3600)).await;
    Ok(())
}
