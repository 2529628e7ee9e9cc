// Over 500 lines: every upstream flag with how it maps (a table with its parser).
//! Upstream dranet's flags (kubernetes-sigs/dranet `cmd/dranet/app.go` and klog's), accepted by
//! `dranet run` so that an upstream DaemonSet's arguments start it. Each is honoured where it
//! means something here, or accepted with a one-line warning that says why it is not needed.

use std::time::Duration;

use clap::Args;

use crate::slices::LoopTiming;

/// Errors in upstream flags' values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UpstreamFlagError {
    #[error("{flag}: {value:?} is not a duration (e.g. 500ms, 2s, 1m, 1h30m)")]
    Duration { flag: &'static str, value: String },
    #[error("--feature-gates: {item:?} is not Name=true or Name=false")]
    FeatureGate { item: String },
    #[error("--bind-address: {value:?} is not HOST:PORT or :PORT")]
    BindAddress { value: String },
    #[error("{flag}: {why}")]
    Provider { flag: &'static str, why: String },
}

/// Upstream's flags. Go's flag package spells a boolean `--flag` or `--flag=false`.
#[derive(Args, Debug, Clone, Default)]
#[command(next_help_heading = "Upstream dranet flags (accepted for a drop-in switch)")]
pub struct UpstreamArgs {
    /// klog verbosity: 0-3 info, 4-5 dranet's debug logs, 6-7 all debug, 8+ trace (RUST_LOG
    /// applies when this is not given).
    #[arg(long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u8>,
    /// Upstream's bbolt checkpoint: not used (dranet's: <state-dir>/checkpoint/, a file per record).
    #[arg(long, value_name = "PATH")]
    pub db_path: Option<String>,
    /// Minimum time between two inventory scans (Go duration; default here 500ms).
    #[arg(long, value_name = "DURATION")]
    pub inventory_min_poll_interval: Option<String>,
    /// Rescan period without link events (Go duration; default 1m, as upstream).
    #[arg(long, value_name = "DURATION")]
    pub inventory_max_poll_interval: Option<String>,
    /// Upstream's scan burst: not needed (scans are debounced and rate-limited).
    #[arg(long, value_name = "N")]
    pub inventory_poll_burst: Option<u32>,
    /// Publish IPoIB netdevs with their PCI device and move them into pods (false: the device is
    /// published RDMA-only, as upstream).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub move_ib_interfaces: Option<bool>,
    /// Upstream feature gates, `Name=true,Other=false`.
    #[arg(long, value_name = "GATES")]
    pub feature_gates: Option<String>,
    /// Cloud provider whose instance metadata adds attributes: AWS, GCE, AZURE, OKE, ALIBABA,
    /// webhook or NONE; not given: detected in the background.
    #[arg(long, value_name = "PROVIDER")]
    pub cloud_provider_hint: Option<String>,
    /// Who resolves a claim's `profile`: cloud (the cloud provider's, when it has profiles:
    /// the webhook), webhook, none. Default cloud.
    #[arg(long, value_name = "PROVIDER")]
    pub profile_provider: Option<String>,
    /// BYODP webhook: http://HOST[:PORT][/PATH] or unix:///PATH (for the webhook cloud or
    /// profile provider).
    #[arg(long, value_name = "URL")]
    pub webhook_url: Option<String>,
    /// klog flags: logs go to stderr (text, or JSON with --log-format=json).
    #[arg(long = "logtostderr", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub logtostderr: Option<bool>,
    #[arg(long = "alsologtostderr", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub alsologtostderr: Option<bool>,
    #[arg(long = "log_dir", value_name = "DIR", hide = true)]
    pub log_dir: Option<String>,
    #[arg(long = "log_file", value_name = "FILE", hide = true)]
    pub log_file: Option<String>,
    #[arg(long = "log_file_max_size", value_name = "MB", hide = true)]
    pub log_file_max_size: Option<String>,
    #[arg(long = "skip_headers", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub skip_headers: Option<bool>,
    #[arg(long = "skip_log_headers", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub skip_log_headers: Option<bool>,
    #[arg(long = "add_dir_header", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub add_dir_header: Option<bool>,
    #[arg(long = "one_output", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", hide = true)]
    pub one_output: Option<bool>,
    #[arg(long = "stderrthreshold", value_name = "SEVERITY", hide = true)]
    pub stderrthreshold: Option<String>,
    #[arg(long = "vmodule", value_name = "PATTERNS", hide = true)]
    pub vmodule: Option<String>,
    #[arg(long = "log_backtrace_at", value_name = "FILE:LINE", hide = true)]
    pub log_backtrace_at: Option<String>,
}

/// Upstream's feature gates and what dranet does about each.
const GATES: &[(&str, &str)] = &[
    (
        "DRAListTypeAttributes",
        "resource.kubernetes.io/numaNode is published as an int list (the device's node, then the equally near nodes of its socket); the API server and scheduler need the gate too, or the slices are refused",
    ),
    (
        "PersistentResourceSliceAttributes",
        "always on here: a device in a pod keeps its last published attributes, across restarts too (<state-dir>/published-devices.json)",
    ),
];

/// The minimum scan interval when `--inventory-min-poll-interval` is not given.
pub const DEFAULT_MIN_SCAN_INTERVAL: Duration = Duration::from_millis(500);

impl UpstreamArgs {
    /// `--move-ib-interfaces` (default true).
    #[must_use]
    pub fn move_ib_interfaces(&self) -> bool {
        self.move_ib_interfaces.unwrap_or(true)
    }

    /// Whether upstream feature gate `name` is on (all are off by default, as upstream). Call
    /// [`Self::check`] first: gates that do not parse count as off here.
    #[must_use]
    pub fn gate(&self, name: &str) -> bool {
        gate_on(self.feature_gates.as_deref(), name)
    }

    /// The publish loop's timing, with the poll-interval flags applied. Call [`Self::check`]
    /// first: a value that does not parse falls back to the default here.
    #[must_use]
    pub fn loop_timing(&self) -> LoopTiming {
        let d = LoopTiming {
            min_interval: DEFAULT_MIN_SCAN_INTERVAL,
            ..LoopTiming::default()
        };
        LoopTiming {
            min_interval: self
                .inventory_min_poll_interval
                .as_deref()
                .and_then(parse_go_duration)
                .unwrap_or(d.min_interval),
            max_interval: self
                .inventory_max_poll_interval
                .as_deref()
                .and_then(parse_go_duration)
                .unwrap_or(d.max_interval),
            ..d
        }
    }

    /// The log filter `--v` asks for, if given.
    #[must_use]
    pub fn log_filter(&self) -> Option<&'static str> {
        self.verbosity.map(|v| match v {
            0..=3 => "info",
            4..=5 => "info,dranet=debug",
            6..=7 => "debug",
            _ => "trace",
        })
    }

    /// Checks the values that must parse.
    pub fn check(&self) -> Result<(), UpstreamFlagError> {
        for (flag, v) in [
            ("--inventory-min-poll-interval", &self.inventory_min_poll_interval),
            ("--inventory-max-poll-interval", &self.inventory_max_poll_interval),
        ] {
            if let Some(v) = v {
                parse_go_duration(v).ok_or_else(|| UpstreamFlagError::Duration {
                    flag,
                    value: v.clone(),
                })?;
            }
        }
        if let Some(g) = &self.feature_gates {
            parse_feature_gates(g)?;
        }
        let profiles =
            crate::cloud::parse_profile_provider(self.profile_provider.as_deref()).map_err(|why| {
                UpstreamFlagError::Provider {
                    flag: "--profile-provider",
                    why,
                }
            })?;
        if profiles == crate::cloud::ProfileChoice::Webhook && self.webhook().is_none() {
            return Err(UpstreamFlagError::Provider {
                flag: "--profile-provider",
                why: "--webhook-url is required when using the webhook profile provider".to_owned(),
            });
        }
        if let Some(url) = self.webhook() {
            crate::cloud::Endpoint::parse(url).map_err(|e| UpstreamFlagError::Provider {
                flag: "--webhook-url",
                why: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// `--webhook-url`, unless empty (upstream's chart renders `--webhook-url=`).
    #[must_use]
    pub fn webhook(&self) -> Option<&str> {
        self.webhook_url.as_deref().filter(|u| !u.is_empty())
    }

    /// `--profile-provider` (call [`Self::check`] first: a bad value reads as none here).
    #[must_use]
    pub fn profile_choice(&self) -> crate::cloud::ProfileChoice {
        crate::cloud::parse_profile_provider(self.profile_provider.as_deref())
            .unwrap_or(crate::cloud::ProfileChoice::None)
    }

    /// How to find the cloud: the hint (an unknown one means none, as upstream, which logs it
    /// and runs without), the webhook, `GCE_METADATA_HOST`.
    #[must_use]
    pub fn cloud_options(
        &self,
        sysfs: &std::path::Path,
        metadata_endpoint: Option<String>,
    ) -> crate::cloud::CloudOptions {
        crate::cloud::CloudOptions {
            hint: crate::cloud::parse_hint(self.cloud_provider_hint.as_deref())
                .unwrap_or(crate::cloud::Hint::None),
            webhook_url: self.webhook().map(str::to_owned),
            metadata_endpoint,
            gce_metadata_host: std::env::var("GCE_METADATA_HOST").ok().filter(|h| !h.is_empty()),
            sysfs: sysfs.to_owned(),
            timing: crate::cloud::CloudTiming::default(),
        }
    }

    /// One line per upstream flag given that changes nothing here, or a gate not honoured.
    #[must_use]
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut not_needed = |given: bool, flag: &str, why: &str| {
            if given {
                out.push(format!("{flag}: accepted, not needed: {why}"));
            }
        };
        not_needed(
            self.db_path.is_some(),
            "--db-path",
            "dranet's checkpoint is <state-dir>/checkpoint/, a file per record (with the netns pins)",
        );
        not_needed(
            self.inventory_poll_burst.is_some(),
            "--inventory-poll-burst",
            "scans are debounced (150 ms of quiet, at most 1 s) and at least --inventory-min-poll-interval apart",
        );
        let klog = [
            self.logtostderr.is_some(),
            self.alsologtostderr.is_some(),
            self.log_dir.is_some(),
            self.log_file.is_some(),
            self.log_file_max_size.is_some(),
            self.skip_headers.is_some(),
            self.skip_log_headers.is_some(),
            self.add_dir_header.is_some(),
            self.one_output.is_some(),
            self.stderrthreshold.is_some(),
            self.vmodule.is_some(),
            self.log_backtrace_at.is_some(),
        ];
        not_needed(
            klog.iter().any(|g| *g),
            "klog flags",
            "logs go to stderr as text or JSON (--log-format); --v sets the level",
        );
        if let Some(Err(e)) = self
            .cloud_provider_hint
            .as_deref()
            .map(|h| crate::cloud::parse_hint(Some(h)))
        {
            out.push(format!(
                "--cloud-provider-hint: {e}: running without cloud attributes"
            ));
        }
        if self.cloud_provider_hint.as_deref() == Some("webhook") && self.webhook().is_none() {
            out.push(
                "--cloud-provider-hint webhook: --webhook-url is required: running without cloud attributes"
                    .to_owned(),
            );
        }
        if let Some(Ok(gates)) = self.feature_gates.as_deref().map(parse_feature_gates) {
            for (name, on) in gates {
                match GATES.iter().find(|(n, _)| *n == name) {
                    Some((n, what)) => out.push(format!("--feature-gates {n}={on}: {what}")),
                    None => out.push(format!(
                        "--feature-gates {name}={on}: unknown gate, ignored (upstream knows {})",
                        GATES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }
        out
    }
}

/// Whether gate `name` is on in a `--feature-gates` value (the last mention wins).
#[must_use]
pub fn gate_on(gates: Option<&str>, name: &str) -> bool {
    gates
        .and_then(|g| parse_feature_gates(g).ok())
        .and_then(|v| v.into_iter().rev().find(|(n, _)| n == name))
        .is_some_and(|(_, on)| on)
}

/// `Name=true,Other=false` (spaces around items allowed, as component-base's parser).
pub fn parse_feature_gates(s: &str) -> Result<Vec<(String, bool)>, UpstreamFlagError> {
    s.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| {
            let bad = || UpstreamFlagError::FeatureGate {
                item: item.to_owned(),
            };
            let (k, v) = item.split_once('=').ok_or_else(bad)?;
            let on = v.trim().parse::<bool>().map_err(|_| bad())?;
            let k = k.trim();
            if k.is_empty() {
                return Err(bad());
            }
            Ok((k.to_owned(), on))
        })
        .collect()
}

/// A Go `time.ParseDuration` string: `[0-9.]+(ns|us|µs|ms|s|m|h)` repeated, or `0`; no sign.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        if n == 0 {
            return None;
        }
        let num: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += num * unit;
        rest = &rest[u..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// `--bind-address` as a socket address to bind: Go's `:PORT` (every interface) becomes
/// `[::]:PORT` (dual stack), other forms are kept.
pub fn bind_addresses(addr: &str) -> Result<Vec<String>, UpstreamFlagError> {
    match addr.strip_prefix(':') {
        Some(port) if port.parse::<u16>().is_ok() => {
            // Every interface, as Go: IPv6 (dual stack) where the node has it, else IPv4.
            Ok(vec![format!("[::]:{port}"), format!("0.0.0.0:{port}")])
        }
        Some(_) => Err(UpstreamFlagError::BindAddress {
            value: addr.to_owned(),
        }),
        None if addr
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok()) =>
        {
            Ok(vec![addr.to_owned()])
        }
        None => Err(UpstreamFlagError::BindAddress {
            value: addr.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for (s, ms) in [
            ("2s", 2000),
            ("500ms", 500),
            ("1m", 60_000),
            ("1h30m", 5_400_000),
            ("1.5s", 1500),
            ("0", 0),
        ] {
            assert_eq!(parse_go_duration(s), Some(Duration::from_millis(ms)), "{s}");
        }
        for s in ["", "2", "s", "-1s", "2x", "1..5s"] {
            assert!(parse_go_duration(s).is_none(), "{s}");
        }
    }

    #[test]
    fn feature_gates_parse_and_unknown_ones_are_notes() {
        assert_eq!(
            parse_feature_gates("DRAListTypeAttributes=true, Foo=false"),
            Ok(vec![
                ("DRAListTypeAttributes".into(), true),
                ("Foo".into(), false)
            ])
        );
        assert!(parse_feature_gates("Foo").is_err());
        assert!(gate_on(
            Some("DRAListTypeAttributes=true"),
            "DRAListTypeAttributes"
        ));
        assert!(!gate_on(
            Some("DRAListTypeAttributes=true,DRAListTypeAttributes=false"),
            "DRAListTypeAttributes"
        ));
        assert!(!gate_on(None, "DRAListTypeAttributes"));
        assert!(!gate_on(Some("bad"), "DRAListTypeAttributes"));
        assert!(parse_feature_gates("Foo=maybe").is_err());
        let a = UpstreamArgs {
            feature_gates: Some("PersistentResourceSliceAttributes=true,Bogus=true".into()),
            db_path: Some("/var/run/dranet/dranet.db".into()),
            ..UpstreamArgs::default()
        };
        let notes = a.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("--db-path: accepted, not needed")),
            "{notes:?}"
        );
        assert!(
            notes.iter().any(|n| n.contains("Bogus=true: unknown gate")),
            "{notes:?}"
        );
        assert!(
            notes
                .iter()
                .any(|n| n.starts_with("--feature-gates PersistentResourceSliceAttributes=true: always on")),
            "{notes:?}"
        );
    }

    #[test]
    fn upstreams_daemonset_command_line_is_dranet_run() {
        use clap::Parser;
        let argv = |a: &[&str]| crate::cli::upstream_argv(a.iter().map(std::ffi::OsString::from).collect());
        for line in [
            &["dranet", "/dranet", "--v=4", "--hostname-override=node-a"][..],
            &["dranet", "--v=4", "--hostname-override=node-a"],
            &["dranet", "run", "--v=4", "--hostname-override=node-a"],
        ] {
            let cli = crate::cli::Cli::try_parse_from(argv(line)).unwrap();
            let crate::cli::Command::Run(r) = cli.command else {
                panic!("{line:?} is not `run`");
            };
            assert_eq!(r.node_name, "node-a");
            assert_eq!(r.upstream.verbosity, Some(4));
        }
        assert_eq!(argv(&["dranet", "--help"]).len(), 2);
        let cli = crate::cli::Cli::try_parse_from(argv(&[
            "dranet",
            "run",
            "--node-name=n",
            "--move-ib-interfaces",
            "--logtostderr",
        ]))
        .unwrap();
        let crate::cli::Command::Run(r) = cli.command else {
            panic!("not run");
        };
        assert!(r.upstream.move_ib_interfaces());
        assert!(
            crate::cli::Cli::try_parse_from([
                "dranet",
                "run",
                "--node-name=n",
                "--move-ib-interfaces",
                "false"
            ])
            .is_err(),
            "a Go bool flag takes its value after '=' only"
        );
    }

    #[test]
    fn provider_flags_as_upstream() {
        let a = |hint: Option<&str>, profiles: Option<&str>, url: Option<&str>| UpstreamArgs {
            cloud_provider_hint: hint.map(str::to_owned),
            profile_provider: profiles.map(str::to_owned),
            webhook_url: url.map(str::to_owned),
            ..UpstreamArgs::default()
        };
        assert!(a(None, None, None).check().is_ok());
        assert!(
            a(Some("NONE"), Some("none"), Some("")).check().is_ok(),
            "upstream's chart"
        );
        assert_eq!(
            a(None, None, None).profile_choice(),
            crate::cloud::ProfileChoice::Cloud
        );
        // Fatal upstream, a flag error here: an unknown profile provider, the webhook one
        // without a URL; and a URL this client cannot use.
        assert!(a(None, Some("ipam"), None).check().is_err());
        assert!(a(None, Some("webhook"), None).check().is_err());
        assert!(a(None, Some("webhook"), Some("https://x")).check().is_err());
        assert!(
            a(None, Some("webhook"), Some("unix:///run/ipam.sock"))
                .check()
                .is_ok()
        );
        // An unknown hint is logged and ignored, as upstream.
        let bad = a(Some("gcp"), None, None);
        assert!(bad.check().is_ok());
        assert!(
            bad.notes()
                .iter()
                .any(|n| n.contains("unknown cloud provider hint")),
            "{:?}",
            bad.notes()
        );
        assert_eq!(
            bad.cloud_options(std::path::Path::new("/sys"), None).hint,
            crate::cloud::Hint::None
        );
        assert_eq!(
            a(Some("OKE"), None, None)
                .cloud_options(std::path::Path::new("/sys"), None)
                .hint,
            crate::cloud::Hint::Provider(crate::cloud::Provider::Oke)
        );
    }

    #[test]
    fn bind_address_forms() {
        assert_eq!(
            bind_addresses(":9177"),
            Ok(vec!["[::]:9177".to_owned(), "0.0.0.0:9177".to_owned()])
        );
        assert_eq!(bind_addresses("127.0.0.1:0"), Ok(vec!["127.0.0.1:0".to_owned()]));
        assert_eq!(bind_addresses("[::1]:80"), Ok(vec!["[::1]:80".to_owned()]));
        assert!(bind_addresses(":x").is_err());
        assert!(bind_addresses("9177").is_err());
    }

    #[test]
    fn verbosity_maps_to_a_filter_and_intervals_to_the_loop() {
        let a = UpstreamArgs {
            verbosity: Some(4),
            inventory_min_poll_interval: Some("2s".into()),
            inventory_max_poll_interval: Some("30s".into()),
            ..UpstreamArgs::default()
        };
        assert_eq!(a.log_filter(), Some("info,dranet=debug"));
        let t = a.loop_timing();
        assert_eq!(t.min_interval, Duration::from_secs(2));
        assert_eq!(t.max_interval, Duration::from_secs(30));
        assert_eq!(
            UpstreamArgs::default().loop_timing().min_interval,
            DEFAULT_MIN_SCAN_INTERVAL
        );
        assert!(UpstreamArgs::default().move_ib_interfaces());
    }
}
