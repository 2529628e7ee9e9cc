//! `dranet release-all`: bring every device home and remove every pin (uninstall, or an operator
//! clearing a node).
//!
//! Beside a running `dranet run` (the DaemonSet pod always holds the state dir) it asks that
//! daemon over its root-only control socket (`<state-dir>/control.sock`): the daemon stops
//! attaching (every later attach is refused) and brings every device home, and its report is
//! printed here. Without a daemon it takes the state dir's lock itself (waiting
//! `--lock-wait-seconds` for one that is stopping) and does the same. A checkpoint that does not
//! load is no obstacle: the devices are found through the pins.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::rescue::{Engine, EngineOptions};

#[derive(Args, Debug)]
pub struct ReleaseAllArgs {
    /// State dir of the daemon (checkpoint + pins).
    #[arg(long, default_value = "/run/dranet")]
    pub state_dir: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Do not ask a running daemon (over `<state-dir>/control.sock`): take the state dir's lock
    /// here, waiting `--lock-wait-seconds` for a daemon that is stopping.
    #[arg(long)]
    pub no_daemon: bool,
    /// Seconds to wait for a running dranet to let go of the state dir (with `--no-daemon`, or
    /// when no daemon answers on the control socket).
    #[arg(long, env = "DRANET_LOCK_WAIT_SECONDS", default_value_t = 10)]
    pub lock_wait_seconds: u64,
    /// The daemon's `--filter`: which links of a pin without a record are ours (only used when
    /// the checkpoint does not have the pin's record).
    #[arg(long, env = "DRANET_FILTER", default_value = crate::inventory::DEFAULT_FILTER)]
    pub filter: String,
}

pub fn main(args: &ReleaseAllArgs) -> ExitCode {
    super::init_logging(false, "info");
    // A typo must not create a state dir (and report "nothing to release").
    if let Err(why) = super::existing_state_dir(&args.state_dir) {
        eprintln!("dranet release-all: {why}");
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dranet release-all: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        let asked = if args.no_daemon {
            Ok(None)
        } else {
            ask_daemon(&args.state_dir).await
        };
        match asked {
            Ok(Some(answer)) => return print_answer(&answer, args.json),
            Ok(None) => {}
            Err(e) => {
                eprintln!("dranet release-all: the running daemon did not answer: {e}");
                return ExitCode::FAILURE;
            }
        }
        let opts = EngineOptions {
            state_dir: args.state_dir.clone(),
            lock_wait: std::time::Duration::from_secs(args.lock_wait_seconds),
            device_filter: args.filter.clone(),
            ..EngineOptions::default()
        };
        let engine = match Engine::new(opts, None).await {
            Ok(e) => e,
            Err(e) => {
                eprintln!("dranet release-all: {}", crate::telemetry::chain(&e));
                return ExitCode::FAILURE;
            }
        };
        match engine.release_all().await {
            Ok(report) => print_report(&serde_json::to_value(&report).unwrap_or_default(), args.json),
            Err(e) => {
                eprintln!("dranet release-all: {}", crate::telemetry::chain(&e));
                ExitCode::FAILURE
            }
        }
    })
}

/// How long the daemon may take to bring every device home.
const DAEMON_ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(300);

/// Asks the daemon running with `state_dir` to release everything; `Ok(None)` when none listens
/// there (no control socket, or nobody behind it).
async fn ask_daemon(state_dir: &std::path::Path) -> Result<Option<serde_json::Value>, String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let sock = state_dir.join(super::run::CONTROL_SOCKET);
    let Ok(mut conn) = tokio::net::UnixStream::connect(&sock).await else {
        return Ok(None);
    };
    eprintln!(
        "dranet release-all: asking the running daemon ({}) to stop attaching and bring every device home",
        sock.display()
    );
    conn.write_all(format!("{}\n", super::run::RELEASE_ALL_REQUEST).as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut line = String::new();
    let mut r = tokio::io::BufReader::new(conn.take(1 << 20));
    match tokio::time::timeout(DAEMON_ANSWER_WITHIN, r.read_line(&mut line)).await {
        Ok(Ok(n)) if n > 0 => serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| format!("unreadable answer ({e}): {line}")),
        Ok(Ok(_)) => Err("the daemon closed the connection without an answer".to_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {DAEMON_ANSWER_WITHIN:?}")),
    }
}

fn print_answer(answer: &serde_json::Value, json: bool) -> ExitCode {
    if answer["ok"] == true {
        print_report(&answer["report"], json)
    } else {
        eprintln!(
            "dranet release-all: the daemon refused: {}",
            answer["error"].as_str().unwrap_or("(no reason)")
        );
        ExitCode::FAILURE
    }
}

fn print_report(report: &serde_json::Value, json: bool) -> ExitCode {
    let n = |k: &str| report[k].as_array().map_or(0, Vec::len);
    if json {
        println!("{report}");
    } else {
        println!(
            "returned {} pod(s), failed {}, stray pins released {}, rebuilt from pins {}",
            n("returned"),
            n("failed"),
            report["stray_pins"].as_u64().unwrap_or(0),
            n("rebuilt")
        );
        for p in report["failed"].as_array().into_iter().flatten() {
            println!("  not all devices home: pod {}", p.as_str().unwrap_or_default());
        }
    }
    if n("failed") == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
