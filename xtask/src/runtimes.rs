//! `cargo xtask runtimes`: the real container runtimes the containerd suite drives, fetched
//! without changing the machine's package sources.
//!
//! - `containerd` of Debian trixie (1.7) and of sid (2.x): each through a private apt
//!   configuration under `target/runtimes/apt-<suite>/` (the system's mirror URIs, apt's own
//!   signature check of the suite's signed `InRelease` and the package hashes in its index), then
//!   unpacked with `dpkg-deb -x` into `target/runtimes/containerd-<version>/`. Nothing is
//!   installed system-wide.
//! - `runc` and `containernetworking-plugins` (bridge, host-local, loopback) from the machine's
//!   own release, through plain apt (`scripts/install-toolchain.sh` lists them).
//!
//! Idempotent: a suite whose `containerd-<version>/.unpacked` stamp exists is not looked up again
//! (no network) unless `--refresh`. The test fixture (`dranet_sim::containerd`) finds the unpacked
//! runtimes through the stamps.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::vm::apt;

/// The Debian suites whose containerd the suite runs: (tag, suite).
pub const SUITES: [&str; 2] = ["trixie", "sid"];

/// The stamp inside an unpacked runtime directory; it holds the package version.
pub const STAMP: &str = ".unpacked";

/// What the machine's own release must provide for the runtimes.
pub const HOST_PACKAGES: [&str; 2] = ["runc", "containernetworking-plugins"];

#[derive(clap::Args, Debug, Default)]
pub struct Options {
    /// Look the suites' containerd up again even when one is unpacked already.
    #[arg(long)]
    pub refresh: bool,
}

/// One unpacked containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    pub suite: String,
    /// The Debian package version, e.g. `1.7.24~ds1-6+deb13u1`.
    pub version: String,
    pub dir: PathBuf,
}

/// `target/runtimes/`.
pub fn runtimes_dir() -> PathBuf {
    crate::root().join("target").join("runtimes")
}

/// The directory a package version unpacks into.
pub fn unpack_dir(base: &Path, version: &str) -> PathBuf {
    base.join(format!("containerd-{version}"))
}

/// The `Version:` of an `apt-cache show` record.
pub fn version_field(show: &str) -> Option<String> {
    show.lines()
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The runtimes unpacked under `base`, from their stamps and the per-suite records.
pub fn present(base: &Path, suite: &str) -> Option<Runtime> {
    let version = std::fs::read_to_string(base.join(format!("{suite}.version"))).ok()?;
    let version = version.trim().to_owned();
    let dir = unpack_dir(base, &version);
    let stamped = std::fs::read_to_string(dir.join(STAMP)).ok()?;
    (stamped.trim() == version && dir.join("usr/bin/containerd").exists()).then(|| Runtime {
        suite: suite.to_owned(),
        version,
        dir,
    })
}

/// Fetches (when missing) and unpacks one suite's containerd.
fn fetch_suite(base: &Path, suite: &str, refresh: bool) -> Result<Runtime> {
    if let Some(r) = present(base, suite).filter(|_| !refresh) {
        return Ok(r);
    }
    let m = apt::system_mirrors()?;
    let a = apt::PrivateApt::new(
        base.join(format!("apt-{suite}")),
        &apt::sources_list(&[(m.archive.as_str(), suite)]),
    )?;
    if refresh {
        let _ = std::fs::remove_file(a.dir.join("state/updated"));
    }
    a.update()?;
    let version = version_field(&a.show("containerd")?)
        .with_context(|| format!("containerd in {suite} has no Version"))?;
    let dir = unpack_dir(base, &version);
    if !(dir.join(STAMP).exists() && dir.join("usr/bin/containerd").exists()) {
        let debs_dir = base.join(format!("debs-{suite}"));
        // An older version's .deb would satisfy download()'s "already there" check.
        if let Ok(rd) = std::fs::read_dir(&debs_dir) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.contains(&version.replace(':', "%3a")) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let debs = a.download(&["containerd".to_owned()], &debs_dir)?;
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        for d in &debs {
            crate::run(Command::new("dpkg-deb").arg("-x").arg(d).arg(&dir))?;
        }
        if !dir.join("usr/bin/containerd").exists() {
            bail!("{} has no usr/bin/containerd", dir.display());
        }
        std::fs::write(dir.join(STAMP), &version)?;
    }
    std::fs::write(base.join(format!("{suite}.version")), &version)?;
    Ok(Runtime {
        suite: suite.to_owned(),
        version,
        dir,
    })
}

/// The installed version of a Debian package of the machine.
fn host_package_version(pkg: &str) -> Result<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status} ${Version}", pkg])
        .output()
        .context("dpkg-query")?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.strip_prefix("install ok installed ") {
        Some(v) if out.status.success() => Ok(v.trim().to_owned()),
        _ => bail!("{pkg} is not installed (scripts/install-toolchain.sh installs it)"),
    }
}

/// Fetches what is missing and prints the exact versions; returns the runtimes.
pub fn fetch(opts: &Options) -> Result<Vec<Runtime>> {
    let base = runtimes_dir();
    std::fs::create_dir_all(&base)?;
    let mut out = Vec::new();
    for suite in SUITES {
        let r = fetch_suite(&base, suite, opts.refresh)
            .with_context(|| format!("fetching containerd of Debian {suite}"))?;
        println!(
            "runtimes: containerd {} (Debian {}) in {}",
            r.version,
            r.suite,
            r.dir.display()
        );
        out.push(r);
    }
    for pkg in HOST_PACKAGES {
        println!("runtimes: {pkg} {} (host)", host_package_version(pkg)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_an_apt_record() {
        let show = "Package: containerd\nVersion: 2.1.9+ds1-5\nDepends: runc (>= 0.1.0~), libc6 (>= 2.34)\n";
        assert_eq!(version_field(show).as_deref(), Some("2.1.9+ds1-5"));
        assert_eq!(version_field("Package: x\n"), None);
    }

    #[test]
    fn present_needs_record_stamp_and_binary() {
        let base = std::env::temp_dir().join(format!("xtask-runtimes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        assert_eq!(present(&base, "sid"), None);
        std::fs::write(base.join("sid.version"), "2.1.9+ds1-5\n").unwrap();
        let dir = unpack_dir(&base, "2.1.9+ds1-5");
        std::fs::create_dir_all(dir.join("usr/bin")).unwrap();
        assert_eq!(present(&base, "sid"), None, "no stamp yet");
        std::fs::write(dir.join(STAMP), "2.1.9+ds1-5").unwrap();
        assert_eq!(present(&base, "sid"), None, "no binary yet");
        std::fs::write(dir.join("usr/bin/containerd"), b"").unwrap();
        assert_eq!(
            present(&base, "sid"),
            Some(Runtime {
                suite: "sid".into(),
                version: "2.1.9+ds1-5".into(),
                dir: dir.clone()
            })
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
