//! Debian kernel packages through a private apt configuration: its own sources.list, state and
//! cache under `target/vm/apt/<suite>/`, never the system's sources or lists. The mirror URIs are
//! taken from the system's configured Debian sources (read only), so a local mirror is honoured.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// One private apt setup: a directory holding sources.list, state and cache.
pub struct PrivateApt {
    pub dir: PathBuf,
}

/// The Debian archive URIs found in the system's apt sources.
#[derive(Debug, PartialEq, Eq)]
pub struct Mirrors {
    /// The main archive (suites without `-security`).
    pub archive: String,
    /// The security archive.
    pub security: String,
}

/// Parses apt sources (deb822 `.sources` stanzas or one-line `deb` entries) for the Debian archive
/// and security URIs.
pub fn parse_mirrors(text: &str) -> Option<Mirrors> {
    let mut archive = None;
    let mut security = None;
    let mut note = |uri: &str, suites: &[&str]| {
        if suites.iter().any(|s| s.ends_with("-security")) {
            security.get_or_insert_with(|| uri.trim_end_matches('/').to_owned());
        } else if uri.contains("debian") && !suites.is_empty() {
            archive.get_or_insert_with(|| uri.trim_end_matches('/').to_owned());
        }
    };
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        if let (Some(uri), Some(suites)) = (field("URIs"), field("Suites")) {
            let suites: Vec<&str> = suites.split_whitespace().collect();
            for u in uri.split_whitespace() {
                note(u, &suites);
            }
        }
        for l in stanza.lines() {
            let Some(rest) = l.trim().strip_prefix("deb ") else {
                continue;
            };
            let mut in_opts = false;
            let words: Vec<&str> = rest
                .split_whitespace()
                .filter(|w| {
                    if w.starts_with('[') {
                        in_opts = !w.ends_with(']');
                        return false;
                    }
                    if in_opts {
                        in_opts = !w.ends_with(']');
                        return false;
                    }
                    true
                })
                .collect();
            if let [uri, suite, ..] = words.as_slice() {
                note(uri, &[suite]);
            }
        }
    }
    Some(Mirrors {
        archive: archive?,
        security: security.unwrap_or_default(),
    })
}

/// Reads the system's apt sources (read only).
pub fn system_mirrors() -> Result<Mirrors> {
    let mut text = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    text.push_str("\n\n");
    if let Ok(rd) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "sources" || x == "list"))
            .collect();
        files.sort();
        for f in files {
            text.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
            text.push_str("\n\n");
        }
    }
    parse_mirrors(&text).context("no Debian archive in the system's apt sources")
}

/// The sources.list text for a private configuration.
pub fn sources_list(entries: &[(&str, &str)]) -> String {
    entries
        .iter()
        .map(|(uri, suite)| {
            format!("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {uri} {suite} main\n")
        })
        .collect()
}

/// The `-o` options that point apt at the private directory only.
pub fn apt_options(dir: &Path) -> Vec<String> {
    let d = dir.display();
    vec![
        format!("Dir::Etc::SourceList={d}/sources.list"),
        format!("Dir::Etc::SourceParts={d}/sources.list.d"),
        format!("Dir::Etc::PreferencesParts={d}/preferences.d"),
        format!("Dir::Etc::Preferences={d}/preferences"),
        format!("Dir::State={d}/state"),
        format!("Dir::Cache={d}/cache"),
        "APT::Sandbox::User=root".to_owned(),
        "Debug::NoLocking=1".to_owned(),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_owned(), o])
    .collect()
}

/// The package names of a `Depends:` (or `Pre-Depends:`) field, alternatives flattened.
pub fn depends_names(field: &str) -> Vec<String> {
    field
        .split([',', '|'])
        .filter_map(|d| d.split_whitespace().next())
        .map(|n| n.split(':').next().unwrap_or(n).to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The `Depends:` field of an `apt-cache show` record.
pub fn depends_field(show: &str) -> String {
    show.lines()
        .find_map(|l| l.strip_prefix("Depends:"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// Which packages make up a kernel: the versioned image named by the `linux-image-amd64`
/// metapackage's Depends, plus the image's own `linux-*-<abi>` parts (7.x splits binary and
/// modules out). Returns (abi, packages).
pub fn kernel_packages(
    meta_depends: &str,
    image_depends: impl Fn(&str) -> String,
) -> Option<(String, Vec<String>)> {
    let image = depends_names(meta_depends)
        .into_iter()
        .find(|n| n.starts_with("linux-image-") && n != "linux-image-amd64")?;
    let abi = image.strip_prefix("linux-image-")?.to_owned();
    let mut pkgs = vec![image.clone()];
    for d in depends_names(&image_depends(&image)) {
        if d.starts_with("linux-") && d.ends_with(&abi) && !pkgs.contains(&d) {
            pkgs.push(d);
        }
    }
    Some((abi, pkgs))
}

impl PrivateApt {
    /// Creates the directory tree and sources.list (idempotent).
    pub fn new(dir: PathBuf, sources: &str) -> Result<Self> {
        for sub in [
            "sources.list.d",
            "preferences.d",
            "state/lists/partial",
            "cache/archives/partial",
        ] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        std::fs::write(dir.join("sources.list"), sources)?;
        Ok(Self { dir })
    }

    fn cmd(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.args(apt_options(&self.dir));
        c
    }

    /// `apt-get update` on the private lists, unless they were fetched in the last day.
    pub fn update(&self) -> Result<()> {
        let stamp = self.dir.join("state/updated");
        let fresh = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() < 86_400);
        if fresh {
            return Ok(());
        }
        crate::run(self.cmd("apt-get").args(["-q", "update"]))?;
        std::fs::write(stamp, b"")?;
        Ok(())
    }

    /// `apt-cache show --no-all-versions <pkg>`.
    pub fn show(&self, pkg: &str) -> Result<String> {
        let out = self
            .cmd("apt-cache")
            .args(["show", "--no-all-versions", pkg])
            .output()
            .context("apt-cache show")?;
        if !out.status.success() {
            bail!(
                "apt-cache show {pkg}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Downloads the packages into `into` unless a `.deb` of each is already there.
    pub fn download(&self, pkgs: &[String], into: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(into)?;
        let have = |p: &str| -> Option<PathBuf> {
            std::fs::read_dir(into)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|f| {
                    f.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{p}_")) && n.ends_with(".deb"))
                })
        };
        let missing: Vec<&String> = pkgs.iter().filter(|p| have(p).is_none()).collect();
        if !missing.is_empty() {
            crate::run(
                self.cmd("apt-get")
                    .current_dir(into)
                    .arg("-q")
                    .arg("download")
                    .args(missing),
            )?;
        }
        pkgs.iter()
            .map(|p| have(p).with_context(|| format!("{p} not downloaded")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_from_deb822_and_one_line_sources() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n";
        assert_eq!(
            parse_mirrors(deb822),
            Some(Mirrors {
                archive: "http://mirror.example/debian".into(),
                security: "http://mirror.example/debian-security".into()
            })
        );
        let one = "deb [arch=amd64] http://m.example/debian/ bookworm main\ndeb http://m.example/sec bookworm-security main\n";
        let m = parse_mirrors(one).unwrap();
        assert_eq!(m.archive, "http://m.example/debian");
        assert_eq!(m.security, "http://m.example/sec");
        assert_eq!(
            parse_mirrors("deb https://packages.example/apt cloud main\n").map(|m| m.archive),
            None
        );
    }

    #[test]
    fn private_options_never_name_system_paths() {
        let o = apt_options(Path::new("/x/apt"));
        let joined = o.join(" ");
        assert!(joined.contains("Dir::Etc::SourceList=/x/apt/sources.list"));
        assert!(joined.contains("Dir::Etc::SourceParts=/x/apt/sources.list.d"));
        assert!(joined.contains("Dir::State=/x/apt/state"));
        assert!(joined.contains("Dir::Cache=/x/apt/cache"));
        assert!(!joined.contains("/etc/apt"));
        assert_eq!(o.iter().filter(|w| *w == "-o").count(), o.len() / 2);
        let s = sources_list(&[("http://m/debian", "trixie-backports")]);
        assert_eq!(
            s,
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://m/debian trixie-backports main\n"
        );
    }

    #[test]
    fn kernel_packages_follow_the_metapackage() {
        let meta = depends_field(
            "Package: linux-image-amd64\nDepends: linux-base-amd64, linux-image-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-amd64\n",
        );
        let (abi, pkgs) = kernel_packages(&meta, |img| {
            assert_eq!(img, "linux-image-7.3.4+deb13-amd64");
            "dracut | initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool, linux-base-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-binary-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1)".into()
        })
        .unwrap();
        assert_eq!(abi, "7.3.4+deb13-amd64");
        assert_eq!(
            pkgs,
            [
                "linux-image-7.3.4+deb13-amd64",
                "linux-base-7.3.4+deb13-amd64",
                "linux-binary-7.3.4+deb13-amd64",
                "linux-modules-7.3.4+deb13-amd64"
            ]
        );
        let (abi, pkgs) = kernel_packages("linux-image-6.1.0-57-amd64 (= 6.1.192-3)", |_| {
            "kmod, linux-base (>= 4.3~), initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool".into()
        })
        .unwrap();
        assert_eq!(abi, "6.1.0-57-amd64");
        assert_eq!(pkgs, ["linux-image-6.1.0-57-amd64"]);
    }
}
