//! Command line: one file per subcommand.
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub mod inventory;
pub mod release_all;
pub mod run;
mod run_api;
mod run_nri;
mod run_sides;
pub mod status;
pub mod trace;
pub mod upstream;
pub mod validate_config;

/// dranet: Kubernetes DRA network driver with runtime-independent device return.
///
/// Flags are read as Go's `flag` package (upstream dranet, klog) reads them: a flag given twice
/// takes its last value (`args_override_self`), and `-flag` means `--flag` (see [`go_flags`]).
#[derive(Parser, Debug)]
#[command(name = "dranet", version = crate::telemetry::version::LONG_VERSION, about, long_about = None, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the node daemon (DaemonSet entry point).
    Run(Box<run::RunArgs>),
    /// Show the network-namespace teardown timeline live (probe status, then one line per event).
    Trace(trace::TraceArgs),
    /// Bring every device home and remove every pin (before uninstalling).
    ReleaseAll(release_all::ReleaseAllArgs),
    /// Show the checkpoint: pods, pins, devices and their state.
    Status(status::StatusArgs),
    /// Check an opaque device config (claim `parameters`) with the rules Prepare applies.
    ValidateConfig(validate_config::ValidateConfigArgs),
    /// Scan the node's network devices once; print them (or the ResourceSlices) as JSON.
    Inventory(inventory::InventoryArgs),
}

/// Entry point of the binary.
#[must_use]
pub fn main() -> ExitCode {
    let cli = match parse(std::env::args_os().collect()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Run(args) => run::main(&args),
        Command::Trace(args) => trace::main(&args),
        Command::ReleaseAll(args) => release_all::main(&args),
        Command::Status(args) => status::main(&args),
        Command::ValidateConfig(args) => validate_config::main(&args),
        Command::Inventory(args) => inventory::main(&args),
    }
}

/// `dir` is a directory that holds a daemon's state: it exists, and it is a directory. The
/// commands that read a daemon's state (`status`, `release-all`) check this first, so a typo in
/// `--state-dir` is an error, not an empty node.
///
/// # Errors
/// Why `dir` is not a state dir, naming the flag and the default.
pub fn existing_state_dir(dir: &std::path::Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("--state-dir {}: not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "--state-dir {}: no such directory (no dranet has run with this state dir on this node; the DaemonSet's is /run/dranet)",
            dir.display()
        )),
        Err(e) => Err(format!("--state-dir {}: {e}", dir.display())),
    }
}

/// Parses a command line as the binary does: upstream's forms ([`upstream_argv`]), Go's
/// single-dash flags ([`go_flags`]), the last value of a repeated flag.
///
/// # Errors
/// clap's, for a command line that does not parse (its `exit()` prints it as usual).
pub fn parse(argv: Vec<std::ffi::OsString>) -> Result<Cli, clap::Error> {
    let mut cmd = Cli::command();
    let argv = go_flags(&cmd, upstream_argv(argv));
    let m = cmd.try_get_matches_from_mut(argv)?;
    Cli::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))
}

/// Go's `flag` package takes `-name` for `--name` (`-v=4`, `-hostname-override=n`, `-v 4`), and
/// klog's and upstream's DaemonSets are written that way. An argument of the subcommand that is
/// one dash, then the long name of one of that subcommand's flags (or of an alias), optionally
/// `=value`, becomes that flag; anything else (values, `-h`, `--`, what follows `--`) is kept.
#[must_use]
pub fn go_flags(cmd: &clap::Command, mut argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(sub) = argv
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(|name| cmd.find_subcommand(name))
    else {
        return argv;
    };
    let longs: std::collections::HashSet<&str> = sub
        .get_arguments()
        .flat_map(|a| {
            a.get_long()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default())
        })
        .collect();
    for a in argv.iter_mut().skip(2) {
        let Some(s) = a.to_str() else { continue };
        if s == "--" {
            break;
        }
        let Some(rest) = s.strip_prefix('-').filter(|r| !r.starts_with('-')) else {
            continue;
        };
        let name = rest.split_once('=').map_or(rest, |(n, _)| n);
        if longs.contains(name) {
            *a = format!("--{rest}").into();
        }
    }
    argv
}

/// Upstream's DaemonSet runs `/dranet --v=4 --hostname-override=...` (no subcommand; the
/// binary's path is the first argument when the image has an entrypoint). Such a command line
/// means `dranet run ...`: the upstream path is dropped and `run` put in front of the flags.
#[must_use]
pub fn upstream_argv(mut argv: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if argv.get(1).is_some_and(|a| {
        a.to_str()
            .is_some_and(|s| s == "/dranet" || s.ends_with("/dranet"))
    }) {
        argv.remove(1);
    }
    let flags_first = argv
        .get(1)
        .and_then(|a| a.to_str())
        .is_some_and(|s| s.starts_with('-') && !matches!(s, "--help" | "--version" | "-h" | "-V"));
    if flags_first {
        argv.insert(1, "run".into());
    }
    argv
}

pub use crate::telemetry::log::{init_logging, init_logging_with};

#[cfg(test)]
mod tests {
    use super::{Cli, Command, parse};

    fn run_args(line: &[&str]) -> Box<super::run::RunArgs> {
        let cli: Cli = parse(line.iter().map(std::ffi::OsString::from).collect())
            .unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let Command::Run(r) = cli.command else {
            panic!("{line:?} is not `run`");
        };
        r
    }

    /// Go's flag package: the last of a repeated flag wins (`--v=4 --v=6` is 6), which is what
    /// lets a chart's `extraArgs` override a flag the chart already passes.
    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let r = run_args(&[
            "dranet",
            "run",
            "--v=4",
            "--v=6",
            "--node-name=a",
            "--node-name=b",
        ]);
        assert_eq!(r.upstream.verbosity, Some(6));
        assert_eq!(r.node_name, "b");
        let r = run_args(&[
            "dranet",
            "run",
            "--bind-address=0.0.0.0:9177",
            "--bind-address",
            "127.0.0.1:9177",
        ]);
        assert_eq!(r.bind_address, "127.0.0.1:9177");
        // Booleans too, as upstream's chart and extraArgs may both give them.
        let r = run_args(&[
            "dranet",
            "run",
            "--no-nri",
            "--no-nri",
            "--move-ib-interfaces=false",
            "--move-ib-interfaces=true",
        ]);
        assert!(r.no_nri);
        assert!(r.upstream.move_ib_interfaces());
    }

    /// klog's and Go's single-dash spellings, with or without a subcommand.
    #[test]
    fn go_single_dash_flags_are_long_flags() {
        let r = run_args(&["dranet", "run", "-v=4", "-hostname-override=n1", "-logtostderr"]);
        assert_eq!(r.upstream.verbosity, Some(4));
        assert_eq!(r.node_name, "n1");
        assert_eq!(r.upstream.logtostderr, Some(true));
        let r = run_args(&["dranet", "-v", "5", "-node-name", "n2"]);
        assert_eq!(r.upstream.verbosity, Some(5));
        assert_eq!(r.node_name, "n2");
        let r = run_args(&["/dranet", "/dranet", "-v=2"]);
        assert_eq!(r.upstream.verbosity, Some(2));
        // A value that looks like a flag stays a value of the flag before it only where clap
        // takes it so; an unknown single-dash word is left to clap (an error, as in Go).
        assert!(
            parse(
                ["dranet", "run", "-bogus=1"]
                    .map(std::ffi::OsString::from)
                    .to_vec()
            )
            .is_err()
        );
        // After `--` nothing is rewritten.
        let argv = super::go_flags(
            &<Cli as clap::CommandFactory>::command(),
            ["dranet", "run", "--", "-v=1"]
                .map(std::ffi::OsString::from)
                .to_vec(),
        );
        assert_eq!(argv[3], "-v=1");
    }

    /// No --node-name and no NODE_NAME: the name is left empty here and `run` takes the host
    /// name (as upstream and kubelet), which this machine has.
    #[test]
    fn the_node_name_falls_back_to_the_host_name() {
        if std::env::var_os("NODE_NAME").is_some() {
            return;
        }
        let r = run_args(&["dranet", "run"]);
        assert_eq!(r.node_name, "");
        let h = crate::sys::os::node_hostname().expect("this machine has a host name");
        assert_eq!(h, h.to_lowercase());
        assert_eq!(h.trim(), h);
    }

    #[test]
    fn a_missing_state_dir_is_an_error_naming_the_flag() {
        let e = super::existing_state_dir(std::path::Path::new("/nonexistent/dranet-typo")).unwrap_err();
        assert!(
            e.starts_with("--state-dir /nonexistent/dranet-typo: no such directory"),
            "{e}"
        );
        let e = super::existing_state_dir(std::path::Path::new("/etc/hostname")).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        assert!(super::existing_state_dir(&std::env::temp_dir()).is_ok());
    }
}
