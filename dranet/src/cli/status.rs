//! `dranet status`: what the checkpoint says — pods, pins, devices and where they are.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::state::Store;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// State dir of the daemon.
    #[arg(long, default_value = "/run/dranet")]
    pub state_dir: PathBuf,
    /// Print the whole checkpoint as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: &StatusArgs) -> ExitCode {
    let store = match Store::open(&args.state_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dranet status: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cp = match store.load() {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("dranet status: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cp).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!("planned pods: {}", cp.plans.len());
    for p in cp.pods.values() {
        let pinned = p.pin.as_deref().is_some_and(crate::netns::is_pinned);
        println!(
            "pod {}/{} ({}) sandbox {} {:?} netns {} pin {}",
            p.namespace,
            p.name,
            p.pod_uid,
            if p.sandbox_id.is_empty() {
                "(unknown)"
            } else {
                p.sandbox_id.as_str()
            },
            p.phase,
            p.netns,
            if pinned { "held" } else { "none" }
        );
        for d in &p.devices {
            println!(
                "  {} host {} pod {} {:?}{}",
                d.device,
                d.snapshot.name,
                d.pod_ifname,
                d.state,
                d.temp_name
                    .as_deref()
                    .map(|t| format!(" (as {t})"))
                    .unwrap_or_default()
            );
        }
    }
    ExitCode::SUCCESS
}
