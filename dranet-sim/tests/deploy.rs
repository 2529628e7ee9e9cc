//! What ships under deploy/ and what builds the image, read as a cluster and `docker build` would
//! read them; no root, no cluster, no Docker.
//!
//! * The DaemonSet (`deploy/daemonset.yaml`, and the chart rendered with its defaults,
//!   `deploy/helm/rendered/default.yaml`): a node without an optional kernel path (BTF, tracefs,
//!   bpffs) still starts the pod, the probes ask `/healthz` (startup, liveness) and `/readyz`
//!   (readiness) on the port dranet binds, and an update never runs two dranet pods on a node.
//!   (scripts/helm_check.py checks the chart's other renderings: bind addresses, values.)
//! * `deploy/Dockerfile` against `scripts/install-toolchain.sh`: the same Debian release, the
//!   script's own build steps, nothing sourced that the script does not write, bpf-linker on
//!   PATH where the script puts it, runtime packages the script installs (so CI installs them on
//!   that release at every run), and, on a host of that release, every package known to apt.

#![expect(
    clippy::expect_used,
    reason = "test helpers panic on a manifest they cannot read, like the tests"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// The DaemonSet of a manifest file (one or several YAML documents).
fn daemonset(rel: &str) -> Value {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read(rel)).unwrap_or_else(|e| panic!("parsing {rel}: {e}"));
    docs.into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap_or_else(|| panic!("{rel}: no DaemonSet"))
}

/// The DaemonSets that ship: the plain manifest and the chart with its default values.
const MANIFESTS: [&str; 2] = ["deploy/daemonset.yaml", "deploy/helm/rendered/default.yaml"];

/// hostPaths dranet cannot work without and kubelet always has (it creates them at start): a
/// type check there turns a wrong kubelet root dir into a clear pod event.
const MANDATORY: [&str; 2] = ["/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry"];

/// Kernel paths a node may lack (no BTF, no tracing, no debugfs).
const OPTIONAL_KERNEL: [&str; 3] = ["/sys/kernel/btf", "/sys/kernel/tracing", "/sys/kernel/debug"];

fn host_paths(ds: &Value) -> Vec<(String, String)> {
    ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let hp = v.get("hostPath")?;
            Some((
                hp["path"].as_str().unwrap_or_default().to_owned(),
                hp["type"].as_str().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

#[test]
fn a_node_without_an_optional_kernel_path_still_starts_dranet() {
    for rel in MANIFESTS {
        let ds = daemonset(rel);
        let paths = host_paths(&ds);
        assert!(!paths.is_empty(), "{rel}: no hostPath volume");
        for (path, ty) in &paths {
            // Under /sys and /proc nothing can be created: a type check (Directory, and even
            // DirectoryOrCreate) makes a node without the path refuse the pod.
            assert!(
                !(path.starts_with("/sys/") || path.starts_with("/proc/")) || ty.is_empty(),
                "{rel}: hostPath {path} has type {ty:?}: a node without it could not start dranet"
            );
            // containerd and CRI-O mkdir a missing hostPath source whatever its type, which
            // sysfs refuses: an optional kernel path cannot be a hostPath at all. The container's
            // own /sys has /sys/kernel/btf, and dranet mounts tracefs itself.
            assert!(
                !OPTIONAL_KERNEL
                    .iter()
                    .any(|k| path == k || path.starts_with(&format!("{k}/"))),
                "{rel}: hostPath {path}: a node without it could not start dranet"
            );
            assert!(
                ty != "Directory" || MANDATORY.contains(&path.as_str()),
                "{rel}: hostPath {path} is type Directory; only {MANDATORY:?} are mandatory"
            );
        }
        for m in MANDATORY {
            assert!(
                paths.iter().any(|(p, t)| p == m && t == "Directory"),
                "{rel}: kubelet's {m} is not a type Directory hostPath (a wrong kubelet root dir would go unnoticed)"
            );
        }
    }
}

/// The port of the container's `--bind-address=` argument (`:PORT`, `HOST:PORT`, `[V6]:PORT`)
/// and its host when it is one address.
fn bind_address(ds: &Value) -> (u64, Option<String>) {
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args");
    let addr = args
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|a| a.strip_prefix("--bind-address="))
        .next_back()
        .expect("a --bind-address argument");
    let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = (!["", "0.0.0.0", "::"].contains(&host)).then(|| host.to_owned());
    (port.parse().expect("port"), host)
}

#[test]
fn liveness_asks_healthz_and_readiness_asks_readyz_where_dranet_listens() {
    for rel in MANIFESTS {
        let ds = daemonset(rel);
        let ctr = &ds["spec"]["template"]["spec"]["containers"][0];
        let (port, host) = bind_address(&ds);
        // A runtime with NRI off gives a running, not ready pod: /readyz may fail forever, so
        // nothing that restarts the container may ask it.
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            let get = &ctr[probe]["httpGet"];
            assert_eq!(get["path"], path, "{rel}: {probe}");
            assert_eq!(
                get["port"].as_u64(),
                Some(port),
                "{rel}: {probe} port is not --bind-address's"
            );
            assert_eq!(
                get["host"].as_str().map(str::to_owned),
                host,
                "{rel}: {probe} host is not --bind-address's"
            );
        }
        assert_eq!(
            ctr["ports"][0]["containerPort"].as_u64(),
            Some(port),
            "{rel}: containerPort"
        );
        // The first /healthz waits for the eBPF load and the reconcile: give it minutes.
        let startup = &ctr["startupProbe"];
        let budget = startup["periodSeconds"].as_u64().unwrap_or(10)
            * startup["failureThreshold"].as_u64().unwrap_or(3);
        assert!(budget >= 120, "{rel}: startup probe budget {budget} s");
    }
}

#[test]
fn an_update_never_runs_two_dranet_pods_on_a_node() {
    for rel in MANIFESTS {
        let ds = daemonset(rel);
        let s = &ds["spec"]["updateStrategy"];
        assert_eq!(s["type"], "RollingUpdate", "{rel}");
        // Both pods would take <state-dir>/lock: the old one must be gone first.
        assert!(
            [Value::from(0), Value::from("0"), Value::from("0%")].contains(&s["rollingUpdate"]["maxSurge"]),
            "{rel}: updateStrategy {s}: maxSurge must be 0"
        );
        assert_eq!(s["rollingUpdate"]["maxUnavailable"], 1, "{rel}");
    }
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push(
                std::mem::take(&mut cur)
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
    }
    out
}

/// The Debian packages of `apt-get install` commands in a RUN line.
fn apt_installs(run: &str) -> Vec<String> {
    run.split("&&")
        .filter(|c| c.contains("apt-get install"))
        .flat_map(|c| {
            c.split_whitespace()
                .skip_while(|w| *w != "install")
                .skip(1)
                .filter(|w| !w.starts_with('-'))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `packages=(...)` array of scripts/install-toolchain.sh.
fn script_packages(script: &str) -> Vec<String> {
    let start = script
        .find("\npackages=(")
        .expect("install-toolchain.sh: no packages=( array")
        + "\npackages=(".len();
    let end = start + script[start..].find(')').expect("packages=( not closed");
    script[start..end].split_whitespace().map(str::to_owned).collect()
}

/// `debian:RELEASE[-slim]` of a FROM instruction.
fn debian_release(from: &str) -> String {
    let image = from.split_whitespace().nth(1).expect("FROM IMAGE");
    let tag = image
        .strip_prefix("debian:")
        .unwrap_or_else(|| panic!("{from}: not a Debian image"));
    tag.trim_end_matches("-slim").to_owned()
}

#[test]
fn the_dockerfile_builds_with_what_the_toolchain_script_installs() {
    let script = read("scripts/install-toolchain.sh");
    let ins = instructions(&read("deploy/Dockerfile"));
    let froms: Vec<&String> = ins.iter().filter(|i| i.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "a build and a runtime stage: {froms:?}");
    let release = debian_release(froms[0]);
    // The release the script is written for, which CI runs it on.
    assert!(
        script.contains(&release),
        "deploy/Dockerfile builds FROM debian:{release}, which scripts/install-toolchain.sh never names"
    );
    assert_eq!(
        debian_release(froms[1]),
        release,
        "the runtime stage is another release than the build"
    );
    assert!(
        froms[1].contains("-slim"),
        "the runtime stage is not a slim image: {}",
        froms[1]
    );

    let build: Vec<&String> = ins
        .iter()
        .skip_while(|i| !std::ptr::eq(*i, froms[0]))
        .take_while(|i| !std::ptr::eq(*i, froms[1]))
        .collect();
    let runtime: Vec<&String> = ins.iter().skip_while(|i| !std::ptr::eq(*i, froms[1])).collect();
    assert!(
        !build.iter().any(|i| i.starts_with("USER ")),
        "the build stage must run as root: the script writes bpf-linker under /root/.cargo"
    );

    // The script's steps, in order, as .ci/run takes them.
    let step = build
        .iter()
        .find(|i| i.starts_with("RUN ") && i.contains("scripts/install-toolchain.sh"))
        .expect("no RUN of scripts/install-toolchain.sh in the build stage");
    let order = [
        "bash scripts/install-toolchain.sh",
        "cargo xtask build-ebpf",
        "cargo build --release --locked -p dranet",
    ];
    let at: Vec<Option<usize>> = order.iter().map(|s| step.find(s)).collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "the build RUN is not {order:?} in that order: {step}"
    );
    // Nothing sourced that the script does not write (it writes no env file: Debian's cargo and
    // rustc are in /usr/bin).
    for run in build.iter().filter(|i| i.starts_with("RUN ")) {
        for cmd in run.trim_start_matches("RUN ").split("&&") {
            let mut w = cmd.split_whitespace();
            if let (Some("." | "source"), Some(file)) = (w.next(), w.next()) {
                let file = file.trim_matches('"');
                assert!(
                    script.contains(file.trim_start_matches("$HOME/")),
                    "deploy/Dockerfile sources {file}, which scripts/install-toolchain.sh does not create"
                );
            }
        }
    }
    // bpf-linker lands in $BPF_LINKER_ROOT/bin: that directory must be on PATH.
    let root = script
        .split("BPF_LINKER_ROOT=${BPF_LINKER_ROOT:-")
        .nth(1)
        .and_then(|r| r.split('}').next())
        .expect("install-toolchain.sh: no BPF_LINKER_ROOT default");
    let bin = format!("{}/bin", root.replace("$HOME", "/root"));
    assert!(
        build
            .iter()
            .any(|i| i.starts_with("ENV PATH=") && i.split(['=', ':']).any(|p| p == bin)),
        "the build stage does not put {bin} (bpf-linker) on PATH"
    );
    // The binary the runtime stage copies is the one the build made.
    assert!(
        build.iter().any(|i| *i == "WORKDIR /src")
            && runtime
                .iter()
                .any(|i| i.starts_with("COPY --from=build /src/target/release/dranet ")),
        "the runtime stage does not copy /src/target/release/dranet from the build stage"
    );

    // Packages: the runtime stage's are among the script's, which CI installs on this release at
    // every run; on a host of that release, each one apt knows.
    let from_script = script_packages(&script);
    let runtime_pkgs: Vec<String> = runtime
        .iter()
        .filter(|i| i.starts_with("RUN "))
        .flat_map(|r| apt_installs(r))
        .collect();
    let build_pkgs: Vec<String> = build
        .iter()
        .filter(|i| i.starts_with("RUN "))
        .flat_map(|r| apt_installs(r))
        .collect();
    assert!(
        !runtime_pkgs.is_empty(),
        "no apt-get install in the runtime stage"
    );
    for p in &runtime_pkgs {
        assert!(
            from_script.contains(p),
            "the runtime stage installs {p}, which scripts/install-toolchain.sh does not (so CI never checks it exists in {release})"
        );
    }
    let host = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let codename = host
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned());
    if codename.as_deref() != Some(release.as_str()) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs scripts/install-toolchain.sh on {codename:?}, the image builds on {release}"
        );
        eprintln!("host is {codename:?}, not {release}: apt look-ups skipped");
        return;
    }
    let all: Vec<&String> = from_script
        .iter()
        .chain(&runtime_pkgs)
        .chain(&build_pkgs)
        .collect();
    let known = apt_known(&all);
    for p in all {
        assert!(
            known.contains(p),
            "{release} has no package {p} (apt-cache policy {p})"
        );
    }
}

/// The packages of `names` that apt has a version of (a candidate, or installed), in one
/// `apt-cache policy` call: it lists each known package as `NAME:` with `Installed:` and
/// `Candidate:` lines, and leaves unknown ones out.
fn apt_known(names: &[&String]) -> Vec<String> {
    let out = Command::new("apt-cache")
        .arg("policy")
        .args(names)
        .output()
        .expect("apt-cache");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut known = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if !line.starts_with(' ') {
            current = line.strip_suffix(':').map(str::to_owned);
        } else if let (Some(name), Some((key, value))) = (&current, line.trim().split_once(": "))
            && (key == "Installed" || key == "Candidate")
            && value != "(none)"
            && !known.contains(name)
        {
            known.push(name.clone());
        }
    }
    known
}

#[test]
fn the_build_context_leaves_out_build_output_and_keeps_the_sources() {
    let ignore = read(".dockerignore");
    let patterns: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            patterns.contains(&must),
            ".dockerignore does not leave out {must}"
        );
    }
    // What the build reads: the workspace, the script, cargo's config (the xtask alias).
    for keep in [
        "Cargo.toml",
        "Cargo.lock",
        ".cargo",
        "scripts",
        "dranet",
        "dranet-common",
        "dranet-ebpf",
        "dranet-sim",
        "xtask",
    ] {
        assert!(
            !patterns
                .iter()
                .any(|p| p.trim_end_matches('/') == keep || p.trim_end_matches("/**") == keep || *p == "*"),
            ".dockerignore leaves out {keep}, which the image build needs"
        );
    }
}
