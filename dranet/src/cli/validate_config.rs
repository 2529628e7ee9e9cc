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
    /// The config, as JSON or YAML, or `-` for stdin. A whole ResourceClaim,
    /// ResourceClaimTemplate or DeviceClass (YAML or JSON) also works: each opaque config of
    /// driver `--driver-name` in it is checked.
    #[arg(value_name = "FILE", default_value = "-")]
    pub file: PathBuf,
    /// Also apply the rules for devices without a netdev (RDMA-only).
    #[arg(long)]
    pub rdma_only: bool,
    /// On success, print the normalised config (defaults applied) instead of `ok`.
    #[arg(long)]
    pub print: bool,
    /// The driver whose opaque configs are checked in a whole object.
    #[arg(long, default_value = "dra.net")]
    pub driver_name: String,
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
    let configs = match configs_in(&raw, &args.driver_name) {
        Ok(c) => c,
        Err(why) => {
            println!("{why}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = false;
    for (at, raw) in &configs {
        for n in notes(raw) {
            eprintln!("{n}");
        }
        let prefix = at.as_deref().map(|a| format!("{a}: ")).unwrap_or_default();
        match check(raw, args.rdma_only) {
            Ok(normalised) if args.print => println!("{prefix}{normalised}"),
            Ok(_) => println!("{prefix}ok"),
            Err(lines) => {
                failed = true;
                // Errors are the answer here, so they go to stdout, like `ok`.
                for l in lines {
                    println!("{prefix}{l}");
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// One config found: where (`None`: the whole input), and its JSON.
pub type Found = (Option<String>, Vec<u8>);

/// The configs to check in `raw`, as JSON bytes, each with where it was found (`None`: `raw` is
/// one config). `raw` is JSON or YAML; a Kubernetes object (it has `kind`) yields the
/// `opaque.parameters` of every config entry for `driver` (ResourceClaim `spec.devices.config`,
/// ResourceClaimTemplate `spec.spec.devices.config`, DeviceClass `spec.config`).
///
/// # Errors
/// A line saying why nothing can be checked: neither JSON nor YAML, or an object with no
/// config for `driver`.
pub fn configs_in(raw: &[u8], driver: &str) -> Result<Vec<Found>, String> {
    let value: serde_json::Value = match serde_json::from_slice(raw) {
        Ok(v) => v,
        Err(json) => {
            let text =
                std::str::from_utf8(raw).map_err(|e| format!("not JSON ({json}) and not UTF-8 text: {e}"))?;
            let looks_json = text.trim_start().starts_with('{');
            match serde_saphyr::from_str::<serde_json::Value>(text) {
                // A JSON object with an error is reported as JSON (the JSON error is the useful
                // one); anything else that YAML reads is YAML.
                Ok(v) if !looks_json => v,
                Ok(_) => return Ok(vec![(None, raw.to_vec())]),
                Err(yaml) => {
                    if looks_json {
                        return Ok(vec![(None, raw.to_vec())]);
                    }
                    return Err(format!("neither JSON ({json}) nor YAML ({yaml})"));
                }
            }
        }
    };
    let Some(kind) = value.get("kind").and_then(|k| k.as_str()) else {
        return Ok(vec![(
            None,
            serde_json::to_vec(&value).map_err(|e| e.to_string())?,
        )]);
    };
    let (path, entries) = match kind {
        "ResourceClaim" => ("spec.devices.config", value.pointer("/spec/devices/config")),
        "ResourceClaimTemplate" => (
            "spec.spec.devices.config",
            value.pointer("/spec/spec/devices/config"),
        ),
        "DeviceClass" => ("spec.config", value.pointer("/spec/config")),
        other => {
            return Err(format!(
                "a {other} carries no device config (ResourceClaim, ResourceClaimTemplate or DeviceClass do)"
            ));
        }
    };
    let mut out = Vec::new();
    for (i, entry) in entries
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(opaque) = entry.get("opaque") else {
            continue;
        };
        if opaque.get("driver").and_then(|d| d.as_str()) != Some(driver) {
            continue;
        }
        let params = opaque
            .get("parameters")
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let bytes = serde_json::to_vec(&params).map_err(|e| e.to_string())?;
        out.push((Some(format!("{path}[{i}].opaque.parameters")), bytes));
    }
    if out.is_empty() {
        return Err(format!(
            "{kind}: no opaque config for driver {driver:?} in {path}"
        ));
    }
    Ok(out)
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
    fn yaml_and_whole_claims_are_read() {
        let yaml = b"interface:\n  name: net1\n  mtu: 9000\n";
        let c = super::configs_in(yaml, "dra.net").unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0, None);
        assert!(
            check(&c[0].1, false).is_ok(),
            "{:?}",
            String::from_utf8_lossy(&c[0].1)
        );
        let bad = super::configs_in(b"interface:\n  mtu: 1\n", "dra.net").unwrap();
        assert!(check(&bad[0].1, false).unwrap_err()[0].starts_with("interface.mtu:"));
        let claim = br#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests: [{name: nic, exactly: {deviceClassName: dra.net}}]
    config:
    - opaque: {driver: other.example.com, parameters: {x: 1}}
    - requests: [nic]
      opaque:
        driver: dra.net
        parameters:
          interface: {name: "a/b"}
"#;
        let c = super::configs_in(claim, "dra.net").unwrap();
        assert_eq!(c.len(), 1, "only dra.net's config");
        assert_eq!(
            c[0].0.as_deref(),
            Some("spec.devices.config[1].opaque.parameters")
        );
        assert!(check(&c[0].1, false).is_err());
        assert!(
            super::configs_in(claim, "nobody")
                .unwrap_err()
                .contains("no opaque config")
        );
        assert!(
            super::configs_in(b"kind: Pod\n", "dra.net")
                .unwrap_err()
                .contains("carries no device config")
        );
        // A JSON object with a syntax error is reported as JSON, by check.
        let broken = super::configs_in(br#"{"interface": "#, "dra.net").unwrap();
        assert_eq!(broken[0].1, br#"{"interface": "#.to_vec());
        assert!(check(&broken[0].1, false).is_err());
        assert!(super::configs_in(b"\t: [", "dra.net").is_err());
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
