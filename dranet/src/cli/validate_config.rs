//! `dranet validate-config`: checks an opaque device config (the `parameters` of a claim or
//! class config for driver `dra.net`) with the same rules as Prepare. Prints `ok` (or, with
//! `--print`, the normalised config with defaults applied) and exits 0, or prints every error
//! with its JSON path, one per line, and exits 1.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, ConfigError};

/// Arguments of `dranet validate-config`.
#[derive(clap::Args, Debug, Clone)]
pub struct ValidateConfigArgs {
    /// JSON file with the config, or `-` for stdin.
    #[arg(value_name = "FILE", default_value = "-")]
    pub file: PathBuf,
    /// Also apply the rules for devices without a netdev (RDMA-only).
    #[arg(long)]
    pub rdma_only: bool,
    /// On success, print the normalised config (defaults applied) instead of `ok`.
    #[arg(long)]
    pub print: bool,
}

/// Runs the subcommand.
#[must_use]
pub fn main(args: &ValidateConfigArgs) -> ExitCode {
    let raw = if args.file.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::stdin().read_to_end(&mut v).map(|_| v)
    } else {
        std::fs::read(&args.file)
    };
    let raw = match raw {
        Ok(r) => r,
        Err(e) => {
            eprintln!("reading {}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    for n in notes(&raw) {
        eprintln!("{n}");
    }
    match check(&raw, args.rdma_only) {
        Ok(normalised) => {
            println!("{}", if args.print { normalised.as_str() } else { "ok" });
            ExitCode::SUCCESS
        }
        Err(lines) => {
            // Errors are the answer here, so they go to stdout, like `ok`.
            for l in lines {
                println!("{l}");
            }
            ExitCode::FAILURE
        }
    }
}

/// What the rules cannot say here, one line each on stderr: a `profile` is resolved at Prepare
/// by the node's profile provider, which this command does not know.
#[must_use]
pub fn notes(raw: &[u8]) -> Vec<String> {
    let profile = serde_json::from_slice::<serde_json::Value>(raw)
        .ok()
        .and_then(|v| v.get("profile").and_then(|p| p.as_str().map(str::to_owned)))
        .filter(|p| !p.is_empty());
    profile
        .map(|p| {
            format!(
                "profile: {p:?} is resolved at Prepare by the node's profile provider (dranet run --profile-provider, --webhook-url); Prepare fails on a node without one"
            )
        })
        .into_iter()
        .collect()
}

/// The normalised JSON, or the error lines.
pub fn check(raw: &[u8], rdma_only: bool) -> Result<String, Vec<String>> {
    let lines = |e: ConfigError| match &e {
        ConfigError::Decode { errors } | ConfigError::Invalid { errors } => {
            errors.iter().map(ToString::to_string).collect()
        }
        ConfigError::Json { .. } => vec![crate::telemetry::chain(&e).to_string()],
    };
    let cfg = config::parse_and_validate(raw).map_err(lines)?;
    if rdma_only {
        config::validate_rdma_only(&cfg).map_err(lines)?;
    }
    serde_json::to_string_pretty(&cfg).map_err(|e| vec![e.to_string()])
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn reports_each_error_on_its_own_line() {
        let errs = check(br#"{"interface": {"mtu": 1, "name": "a/b"}}"#, false).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("interface.mtu:")));
        let ok = check(br#"{"interface": {"vrf": {"name": "v"}}}"#, false).unwrap();
        assert!(ok.contains("\"table\""), "defaults applied: {ok}");
        assert!(check(br#"{"interface": {"name": "x"}}"#, true).is_err());
        assert!(check(br#"{"interface": {"name": "x"}}"#, false).is_ok());
        let errs = check(br#"{"interface": {"mtu": "x", "bogus": 1}}"#, false).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("interface.bogus: unknown field `bogus`"),
            "{errs:?}"
        );
        assert!(errs[1].starts_with("interface.mtu: invalid type"), "{errs:?}");
    }

    #[test]
    fn a_profile_is_noted_never_ignored_silently() {
        let raw = br#"{"profile": "ipam-a"}"#;
        assert!(check(raw, false).is_ok());
        let n = super::notes(raw);
        assert_eq!(n.len(), 1);
        assert!(
            n[0].starts_with("profile: \"ipam-a\" is resolved at Prepare"),
            "{n:?}"
        );
        assert!(super::notes(br#"{"interface": {}}"#).is_empty());
    }
}
