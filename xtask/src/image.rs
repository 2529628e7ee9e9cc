//! `cargo xtask image`: the dranet image users deploy, built without Docker or a registry, as an
//! OCI image archive (`target/image/dranet-<version>.oci.tar`, for `ctr images import` or `skopeo
//! copy oci-archive:`).
//!
//! What goes in is read from `deploy/Dockerfile`'s runtime stage, so the two cannot drift: the
//! Debian release of its `FROM debian:<release>-slim`, the packages of its `apt-get install`, the
//! destination of its `COPY` of the binary, its `ENV`, `ENTRYPOINT`, `CMD` (and `USER`,
//! `WORKDIR`, `LABEL` if it gets any). The binary is built the way its build stage builds it:
//! `cargo xtask build-ebpf`, then `cargo build --release --locked -p dranet` (glibc, dynamically
//! linked, on this machine's Debian release, which must be the Dockerfile's).
//!
//! The base (`debian:bookworm-slim` cannot be pulled here) is made from Debian packages fetched
//! through a private apt configuration (`target/image/apt/`: the system's mirror URIs, apt's
//! check of the release's signed `InRelease`; nothing installed on the machine): `base-files`,
//! `base-passwd`, the Dockerfile's packages, and `libc6` and `libgcc-s1` (what the binary links),
//! each with the closure of its `Depends`/`Pre-Depends` (first installable alternative), unpacked
//! with `dpkg-deb -x`, laid out merged-/usr as bookworm is (`/bin`, `/sbin`, `/lib`, `/lib64` are
//! links into `/usr`), without documentation, manual pages and translations (the slim image's
//! dpkg excludes, copyright files kept). `/etc/passwd` and `/etc/group` are base-passwd's master
//! files, as its postinst installs them. What differs from the Docker build: no maintainer
//! script runs; packages only maintainer scripts need (debconf, perl-base) and the slim image's
//! other essential packages (bash, coreutils, apt, dpkg, …) are not in it, so `kubectl exec` has
//! no shell (run `dranet …` or `ip …` directly). The image carries the labels
//! `org.opencontainers.image.version` and `.revision` (the Docker build sets none).
//!
//! Two layers, as the Dockerfile has (base, then the binary); every tar entry has mtime 0 and
//! owner 0 and the config no date: the same packages and binary give the same digest.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use dranet_oci::{ImageSpec, Layer, Node, Tree};
use serde_json::{Value, json};

use crate::vm::apt;
use crate::{build_ebpf, root, run};

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// The image reference (default: the manifest's, `ghcr.io/dranet-rs/dranet:<version>`).
    #[arg(long)]
    pub reference: Option<String>,
    /// The version label and file name (default: the workspace version).
    #[arg(long)]
    pub version: Option<String>,
    /// Use a dev (debug) build of the binary instead of the release build the Dockerfile makes
    /// (faster; the test suite's copy of the image).
    #[arg(long)]
    pub dev: bool,
    /// Output path (default: `target/image/dranet-<version>[-dev].oci.tar`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What the Dockerfile's runtime stage says.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RuntimeStage {
    /// The Debian release of the base (`bookworm` for `debian:bookworm-slim`).
    pub release: String,
    pub packages: Vec<String>,
    /// Where `COPY --from=build …/dranet <dest>` puts the binary.
    pub binary_dest: String,
    pub env: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub user: String,
    pub workdir: String,
    pub labels: Vec<(String, String)>,
}

/// Joins the Dockerfile's continuation lines and drops comments.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            cur.push_str(body);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur);
    }
    out
}

fn json_list(s: &str) -> Result<Vec<String>> {
    let v: Vec<String> = serde_json::from_str(s.trim()).with_context(|| format!("not a JSON list: {s}"))?;
    Ok(v)
}

/// Parses the last stage of a Dockerfile (the image's runtime stage).
pub fn runtime_stage(dockerfile: &str) -> Result<RuntimeStage> {
    let all = instructions(dockerfile);
    let from = all
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .context("no FROM")?;
    let mut st = RuntimeStage::default();
    let base = all[from]["FROM ".len()..].split_whitespace().next().unwrap_or("");
    st.release = base
        .strip_prefix("debian:")
        .and_then(|t| t.strip_suffix("-slim"))
        .with_context(|| format!("the runtime stage is not FROM debian:<release>-slim: {base}"))?
        .to_owned();
    for i in &all[from + 1..] {
        let (word, rest) = i.split_once(' ').unwrap_or((i, ""));
        let rest = rest.trim();
        match word {
            "RUN" => {
                for cmd in rest.split("&&") {
                    let w: Vec<&str> = cmd.split_whitespace().collect();
                    if let Some(at) = w.iter().position(|x| *x == "install")
                        && w.first() == Some(&"apt-get")
                    {
                        st.packages.extend(
                            w[at + 1..]
                                .iter()
                                .filter(|x| !x.starts_with('-'))
                                .map(|x| (*x).to_owned()),
                        );
                    }
                }
            }
            "COPY" => {
                let w: Vec<&str> = rest.split_whitespace().collect();
                if w.iter().any(|x| x.starts_with("--from=")) && w.iter().any(|x| x.ends_with("/dranet")) {
                    st.binary_dest = (*w.last().unwrap_or(&"")).to_owned();
                }
            }
            "ENV" => {
                let (k, v) = rest.split_once('=').context("ENV without =")?;
                st.env
                    .push((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()));
            }
            "LABEL" => {
                let (k, v) = rest.split_once('=').context("LABEL without =")?;
                st.labels
                    .push((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()));
            }
            "ENTRYPOINT" => st.entrypoint = json_list(rest)?,
            "CMD" => st.cmd = json_list(rest)?,
            "USER" => rest.clone_into(&mut st.user),
            "WORKDIR" => rest.clone_into(&mut st.workdir),
            other => bail!(
                "deploy/Dockerfile: `{other}` in the runtime stage is not understood here (xtask/src/image.rs)"
            ),
        }
    }
    if st.binary_dest.is_empty() || st.entrypoint.is_empty() {
        bail!("the runtime stage has no COPY of the binary or no ENTRYPOINT");
    }
    Ok(st)
}

/// Packages no maintainer script runs for here, so nothing needs them (debconf's questions,
/// perl for debconf).
const NOT_NEEDED: [&str; 4] = ["debconf", "debconf-2.0", "cdebconf", "perl-base"];

/// The base packages besides the Dockerfile's: the file system layout, the users, what the
/// binary links (glibc, libgcc_s).
const BASE: [&str; 4] = ["base-files", "base-passwd", "libc6", "libgcc-s1"];

/// The names of a `Depends:`-style field, one per group: the first alternative `exists` says is a
/// real package.
fn pick_alternatives(field: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    field
        .split(',')
        .filter_map(|group| {
            let alts: Vec<String> = group
                .split('|')
                .filter_map(|d| d.split_whitespace().next())
                .map(|n| n.split(':').next().unwrap_or(n).to_owned())
                .filter(|n| !n.is_empty())
                .collect();
            if alts.iter().any(|a| NOT_NEEDED.contains(&a.as_str())) {
                return None;
            }
            alts.iter().find(|a| exists(a)).cloned()
        })
        .collect()
}

fn field(show: &str, name: &str) -> String {
    let mut out = Vec::new();
    for l in show.lines() {
        if let Some(v) = l.strip_prefix(name).and_then(|r| r.strip_prefix(':')) {
            out.push(v.trim().to_owned());
        }
        if l.is_empty() {
            break;
        }
    }
    out.join(", ")
}

/// Maps a path of an unpacked package into the merged-/usr layout, leaving out what the slim
/// image's dpkg excludes.
pub fn slim_path(p: &str) -> Option<String> {
    for dropped in [
        "usr/share/man",
        "usr/share/info",
        "usr/share/groff",
        "usr/share/lintian",
        "usr/share/linda",
        "usr/share/locale",
    ] {
        if p == dropped || p.starts_with(&format!("{dropped}/")) {
            return None;
        }
    }
    if let Some(rest) = p.strip_prefix("usr/share/doc/") {
        // The package's directory and its copyright file only.
        let keep = !rest.contains('/') || rest.ends_with("/copyright");
        if !keep {
            return None;
        }
    }
    for top in ["bin", "sbin", "lib", "lib64"] {
        if p == top {
            return Some(format!("usr/{top}"));
        }
        if let Some(rest) = p.strip_prefix(&format!("{top}/")) {
            return Some(format!("usr/{top}/{rest}"));
        }
    }
    Some(p.to_owned())
}

/// The Debian packages of the base with their exact versions, resolved in `a`.
fn closure(a: &apt::PrivateApt, roots: &[String]) -> Result<Vec<(String, String)>> {
    // One `apt-cache show` per name: its record, or None for a virtual or unknown name.
    let shows: std::cell::RefCell<std::collections::BTreeMap<String, Option<String>>> = Default::default();
    let show = |p: &str| -> Option<String> {
        if let Some(s) = shows.borrow().get(p) {
            return s.clone();
        }
        let s = a.show(p).ok().filter(|s| s.contains("\nVersion:"));
        shows.borrow_mut().insert(p.to_owned(), s.clone());
        s
    };
    let mut out: Vec<(String, String)> = Vec::new();
    let mut todo: Vec<String> = roots.to_vec();
    while let Some(p) = todo.pop() {
        if out.iter().any(|(n, _)| *n == p) {
            continue;
        }
        let s = show(&p).with_context(|| format!("no package {p} in the image's Debian release"))?;
        let version = field(&s, "Version");
        let deps = format!("{}, {}", field(&s, "Pre-Depends"), field(&s, "Depends"));
        let exists = |n: &str| out.iter().any(|(k, _)| k == n) || show(n).is_some();
        todo.extend(pick_alternatives(&deps, &exists));
        out.push((p, version));
    }
    out.sort();
    Ok(out)
}

/// The base tree: the packages unpacked (cached per package file under `target/image/pkgs/`),
/// merged-/usr, slim.
fn base_tree(release: &str, packages: &[String]) -> Result<(Tree, Vec<(String, String)>)> {
    let dir = root().join("target/image");
    let m = apt::system_mirrors()?;
    let mut sources = vec![
        (m.archive.as_str(), release.to_owned()),
        (m.archive.as_str(), format!("{release}-updates")),
    ];
    if !m.security.is_empty() {
        sources.push((m.security.as_str(), format!("{release}-security")));
    }
    let entries: Vec<(&str, &str)> = sources.iter().map(|(u, s)| (*u, s.as_str())).collect();
    let a = apt::PrivateApt::new(dir.join(format!("apt-{release}")), &apt::sources_list(&entries))?;
    a.update()?;
    let mut roots: Vec<String> = BASE.iter().map(|s| (*s).to_owned()).collect();
    roots.extend(packages.iter().cloned());
    let pkgs = closure(&a, &roots)?;
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs)?;
    let mut tree = Tree::default();
    for (name, version) in &pkgs {
        let file_version = version.replace(':', "%3a");
        let deb = debs.join(format!("{name}_{file_version}_amd64.deb"));
        let deb_all = debs.join(format!("{name}_{file_version}_all.deb"));
        let deb = if deb_all.exists() { deb_all } else { deb };
        if !deb.exists() {
            a.download(&[format!("{name}={version}")], &debs).or_else(|_| {
                // download() looks for `<arg>_*.deb`: with `=version` in the argument it never
                // finds the file, which is there all the same.
                Ok::<_, anyhow::Error>(Vec::new())
            })?;
        }
        let deb = [
            debs.join(format!("{name}_{file_version}_amd64.deb")),
            debs.join(format!("{name}_{file_version}_all.deb")),
        ]
        .into_iter()
        .find(|d| d.exists())
        .with_context(|| format!("{name} {version} was not downloaded into {}", debs.display()))?;
        let unpacked = dir.join("pkgs").join(deb.file_stem().unwrap_or_default());
        if !unpacked.join(".unpacked").exists() {
            let _ = std::fs::remove_dir_all(&unpacked);
            std::fs::create_dir_all(&unpacked)?;
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            std::fs::write(unpacked.join(".unpacked"), b"")?;
        }
        tree.add_dir(&unpacked, &|p| (p != ".unpacked").then(|| slim_path(p)).flatten())?;
    }
    // Merged /usr, as bookworm's base image.
    for top in ["bin", "sbin", "lib", "lib64"] {
        tree.insert(
            top,
            Node::Symlink {
                target: format!("usr/{top}"),
            },
        );
    }
    // base-passwd's postinst copies its master files; no script runs here.
    for (master, to) in [("passwd", "etc/passwd"), ("group", "etc/group")] {
        let from = format!("usr/share/base-passwd/{master}.master");
        match tree.nodes.get(&from).cloned() {
            Some(Node::File { data, .. }) => tree.file(to, 0o644, data),
            _ => bail!("base-passwd has no {from}"),
        }
    }
    for (d, mode) in [
        ("tmp", 0o1777),
        ("var/tmp", 0o1777),
        ("root", 0o700),
        ("run", 0o755),
    ] {
        tree.insert(d, Node::Dir { mode });
    }
    Ok((tree, pkgs))
}

/// The shared libraries `bin` needs (its `DT_NEEDED`, from `readelf -d`).
fn needed_libs(bin: &Path) -> Result<Vec<String>> {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(bin)
        .output()
        .context("readelf (binutils)")?;
    if !out.status.success() {
        bail!(
            "readelf -d {}: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split_once('[').and_then(|(_, r)| r.split_once(']')))
        .map(|(lib, _)| lib.to_owned())
        .collect())
}

fn git_revision() -> String {
    std::env::var("DRANET_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .current_dir(root())
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The image's runtime config from the Dockerfile's stage, with the version labels.
pub fn image_config(st: &RuntimeStage, version: &str, revision: &str) -> Value {
    let mut env = vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()];
    env.extend(st.env.iter().map(|(k, v)| format!("{k}={v}")));
    let mut labels = serde_json::Map::new();
    for (k, v) in &st.labels {
        labels.insert(k.clone(), json!(v));
    }
    labels.insert("org.opencontainers.image.version".into(), json!(version));
    labels.insert("org.opencontainers.image.revision".into(), json!(revision));
    let mut c = json!({
        "Entrypoint": st.entrypoint,
        "Cmd": st.cmd,
        "Env": env,
        "Labels": labels,
    });
    if !st.user.is_empty() {
        c["User"] = json!(st.user);
    }
    if !st.workdir.is_empty() {
        c["WorkingDir"] = json!(st.workdir);
    }
    c
}

/// The layer holding the binary at the Dockerfile's COPY destination.
pub fn binary_layer(dest: &str, bin: &[u8]) -> Result<Layer> {
    let mut t = Tree::default();
    t.file(dest.trim_start_matches('/'), 0o755, bin.to_vec());
    Ok(Layer::from_tar(
        &t.to_tar()?,
        &format!("COPY dranet {dest} (cargo xtask image)"),
    ))
}

pub fn run_image(opts: &Options) -> Result<()> {
    let st = runtime_stage(&std::fs::read_to_string(root().join("deploy/Dockerfile"))?)?;
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    if !os.contains(&format!("VERSION_CODENAME={}", st.release)) {
        bail!(
            "the image's base is Debian {} (deploy/Dockerfile) and the binary links this machine's glibc: build it on {}",
            st.release,
            st.release
        );
    }
    build_ebpf::run(&build_ebpf::Options::default())?;
    let mut build = Command::new(env!("CARGO"));
    build
        .current_dir(root())
        .args(["build", "--locked", "-p", "dranet", "--bin", "dranet"]);
    if !opts.dev {
        build.arg("--release");
    }
    run(&mut build)?;
    let bin = root()
        .join("target")
        .join(if opts.dev { "debug" } else { "release" })
        .join("dranet");
    let version = opts
        .version
        .clone()
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    let reference = opts
        .reference
        .clone()
        .unwrap_or_else(|| format!("ghcr.io/dranet-rs/dranet:{version}"));
    let (tree, pkgs) = base_tree(&st.release, &st.packages)?;
    for lib in needed_libs(&bin)? {
        let found = ["usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib"]
            .iter()
            .any(|d| tree.nodes.contains_key(&format!("{d}/{lib}")));
        if !found {
            bail!("the binary needs {lib}, which no package of the base provides");
        }
    }
    let base = Layer::from_tar(
        &tree.to_tar()?,
        &format!(
            "debian:{}-slim equivalent (cargo xtask image): {}",
            st.release,
            pkgs.iter()
                .map(|(n, v)| format!("{n}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    let top = binary_layer(&st.binary_dest, &std::fs::read(&bin)?)?;
    let archive = dranet_oci::image_archive(&ImageSpec {
        reference: &reference,
        layers: vec![base, top],
        config: image_config(&st, &version, &git_revision()),
    })?;
    let out = opts.out.clone().unwrap_or_else(|| {
        root().join("target/image").join(format!(
            "dranet-{version}{}.oci.tar",
            if opts.dev { "-dev" } else { "" }
        ))
    });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = out.with_extension("tmp");
    std::fs::write(&tmp, &archive.bytes)?;
    std::fs::rename(&tmp, &out)?;
    println!(
        "image: {reference} ({} packages of Debian {}, {} binary) -> {}",
        pkgs.len(),
        st.release,
        if opts.dev { "dev" } else { "release" },
        out.display()
    );
    println!(
        "image: manifest {} ({:.1} MiB)",
        archive.manifest_digest,
        archive.bytes.len() as f64 / 1_048_576.0
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dockerfiles_runtime_stage_is_read() {
        let st = runtime_stage(&std::fs::read_to_string(root().join("deploy/Dockerfile")).unwrap()).unwrap();
        assert_eq!(st.release, "bookworm");
        assert_eq!(st.packages, ["iproute2", "pci.ids"]);
        assert_eq!(st.binary_dest, "/usr/local/bin/dranet");
        assert_eq!(st.entrypoint, ["/usr/local/bin/dranet"]);
        assert_eq!(st.cmd, ["run"]);
        assert!(
            st.env
                .iter()
                .any(|(k, v)| k == "GLIBC_TUNABLES" && v.contains("tcache_count=0")),
            "{:?}",
            st.env
        );
        let c = image_config(&st, "0.1.0", "abc");
        assert_eq!(c["Entrypoint"][0], "/usr/local/bin/dranet");
        assert_eq!(c["Labels"]["org.opencontainers.image.version"], "0.1.0");
        assert!(c.get("User").is_none());
    }

    #[test]
    fn an_unknown_instruction_is_refused_not_ignored() {
        let df = "FROM debian:bookworm-slim\nCOPY --from=build /x/dranet /usr/bin/dranet\nHEALTHCHECK CMD x\nENTRYPOINT [\"/usr/bin/dranet\"]\n";
        assert!(runtime_stage(df).is_err());
        assert!(runtime_stage("FROM alpine\nENTRYPOINT [\"x\"]\n").is_err());
    }

    #[test]
    fn alternatives_pick_the_first_real_package_and_skip_maintainer_script_needs() {
        let exists = |n: &str| n != "virtual-thing";
        assert_eq!(
            pick_alternatives(
                "debconf (>= 0.5) | debconf-2.0, libc6 (>= 2.34), virtual-thing | real-thing, libcap2:any",
                &exists
            ),
            ["libc6", "real-thing", "libcap2"]
        );
    }

    #[test]
    fn paths_are_merged_usr_and_slim() {
        assert_eq!(
            slim_path("lib/x86_64-linux-gnu/libc.so.6").as_deref(),
            Some("usr/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(slim_path("lib64").as_deref(), Some("usr/lib64"));
        assert_eq!(slim_path("bin/ip").as_deref(), Some("usr/bin/ip"));
        assert_eq!(slim_path("usr/share/man/man8/ip.8.gz"), None);
        assert_eq!(slim_path("usr/share/doc/iproute2/changelog.gz"), None);
        assert_eq!(
            slim_path("usr/share/doc/iproute2/copyright").as_deref(),
            Some("usr/share/doc/iproute2/copyright")
        );
        assert_eq!(
            slim_path("usr/share/misc/pci.ids").as_deref(),
            Some("usr/share/misc/pci.ids")
        );
        assert_eq!(slim_path("library").as_deref(), Some("library"));
    }

    #[test]
    fn the_binary_layer_is_deterministic() {
        let a = binary_layer("/usr/local/bin/dranet", b"elf").unwrap();
        let b = binary_layer("/usr/local/bin/dranet", b"elf").unwrap();
        assert_eq!(a.blob, b.blob);
        assert_eq!(a.diff_id, b.diff_id);
    }
}
