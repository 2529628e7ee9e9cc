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

/// Read only (it takes no lock: it works beside a running daemon). A checkpoint that does not
/// load is reported, and what loads shown instead: each record from its file or its `.prev`.
pub fn main(args: &StatusArgs) -> ExitCode {
    if let Err(why) = super::existing_state_dir(&args.state_dir) {
        eprintln!("dranet status: {why}");
        return ExitCode::FAILURE;
    }
    let store = match Store::open(&args.state_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dranet status: {}", crate::telemetry::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let cp = match store.load() {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("dranet status: {}", crate::telemetry::chain(&e));
            match store.load_prev() {
                Ok(Some(cp)) => {
                    eprintln!(
                        "dranet status: showing what loads, each record from its file or its .prev (one save behind)"
                    );
                    cp
                }
                other => {
                    if let Err(e) = other {
                        eprintln!("dranet status: {}", crate::telemetry::chain(&e));
                    }
                    eprintln!(
                        "dranet status: no checkpoint loads; the daemon rebuilds records from these pins:"
                    );
                    for p in crate::sys::netns::Pin::list(&store.pins_dir()).unwrap_or_default() {
                        eprintln!("  {}", p.display());
                    }
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cp).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!("planned pods: {}", cp.plans.len());
    for p in cp.pods.values() {
        let pinned = p.pin.as_deref().is_some_and(crate::sys::netns::is_pinned);
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
        if let Some(r) = &p.recovered {
            println!(
                "  rebuilt from its pin ({}): host state before the attach unknown",
                r.reason
            );
        }
        for d in &p.devices {
            println!(
                "  {} host {} pod {} {:?}{}{}",
                d.device,
                d.snapshot.name,
                d.pod_ifname,
                d.state,
                d.temp_name
                    .as_deref()
                    .map(|t| format!(" (as {t})"))
                    .unwrap_or_default(),
                if d.rebuilt { " (rebuilt: not restored)" } else { "" }
            );
            if let Some(e) = &d.return_error {
                println!("    not home: {e}");
            }
        }
    }
    ExitCode::SUCCESS
}
