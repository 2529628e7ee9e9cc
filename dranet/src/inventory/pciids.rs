//! PCI vendor and device names for `dra.net/pciVendor` and `dra.net/pciDevice`, rendered as
//! upstream does: upstream asks ghw, which reads the `pci.ids` database with jaypipes/pcidb (a
//! copy embedded in the binary unless `PCIDB_PATH` names another file). So a name is the rest of
//! its `pci.ids` line after the ID and its two spaces, untrimmed, and an ID the database does not
//! know is published as `unknown` (ghw's placeholder), not as hex.
//!
//! Where the database comes from, first found wins: `$PCIDB_PATH` (a `pci.ids` file, as
//! upstream), `/usr/share/hwdata/pci.ids`, `/usr/share/misc/pci.ids` (Debian's `pci.ids`
//! package, installed in the image), then the copy bundled with the `pci-ids-rs` crate (feature
//! `bundled-pci-ids`, on by default), so a host without any still gets names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// ghw's name for an ID missing from the database.
pub const UNKNOWN: &str = "unknown";

/// The system locations searched after `$PCIDB_PATH`, in pcidb's order.
pub const SYSTEM_PATHS: [&str; 2] = ["/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids"];

/// Where the names come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PciIdsSource {
    /// A `pci.ids` file.
    File(PathBuf),
    /// The database bundled in the binary (`pci-ids-rs`, with its version).
    Bundled(&'static str),
    /// Parsed from text given by the caller (tests).
    Text,
    /// No database: every name is [`UNKNOWN`].
    None,
}

impl std::fmt::Display for PciIdsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Bundled(v) => write!(f, "bundled pci.ids (pci-ids-rs {v})"),
            Self::Text => f.write_str("given text"),
            Self::None => f.write_str("no pci.ids database"),
        }
    }
}

/// Where one vendor is in the text: its name and its block of device lines.
#[derive(Clone, Copy, Debug, Default)]
struct Vendor {
    name: (usize, usize),
    block: (usize, usize),
}

/// Vendor and device names by lowercase 4-digit hex ID. The text is kept as read, with an
/// index of vendors (about 1.4 MB for the whole database, instead of a map of every device).
#[derive(Clone)]
pub struct PciIds {
    text: std::sync::Arc<str>,
    vendors: BTreeMap<String, Vendor>,
    bundled: bool,
    source: PciIdsSource,
}

impl Default for PciIds {
    /// No database: every name is [`UNKNOWN`].
    fn default() -> Self {
        Self {
            text: std::sync::Arc::from(""),
            vendors: BTreeMap::new(),
            bundled: false,
            source: PciIdsSource::None,
        }
    }
}

impl std::fmt::Debug for PciIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciIds")
            .field("source", &self.source.to_string())
            .field("vendors", &self.vendors.len())
            .finish()
    }
}

impl PciIds {
    /// `$PCIDB_PATH`, the system database, else the bundled one (see the module docs). A
    /// `PCIDB_PATH` that cannot be read is logged and skipped.
    #[must_use]
    pub fn load_default() -> Self {
        let env = std::env::var_os("PCIDB_PATH").map(PathBuf::from);
        Self::load_from(env.as_deref(), &SYSTEM_PATHS.map(Path::new))
    }

    /// The first readable of `env` (upstream's `PCIDB_PATH`) and `paths`, else the bundled
    /// database (or none without the `bundled-pci-ids` feature).
    #[must_use]
    pub fn load_from(env: Option<&Path>, paths: &[&Path]) -> Self {
        if let Some(p) = env {
            match Self::from_file(p) {
                Ok(ids) => return ids,
                Err(e) => tracing::warn!(path = %p.display(), error = %crate::telemetry::chain(&e),
                    "PCIDB_PATH: cannot read this pci.ids (a gzipped one is not supported); trying the system database"),
            }
        }
        for p in paths {
            if let Ok(ids) = Self::from_file(p) {
                return ids;
            }
        }
        Self::bundled()
    }

    /// Parses the `pci.ids` file at `path`.
    pub fn from_file(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        let mut ids = Self::parse(&String::from_utf8_lossy(&bytes));
        ids.source = PciIdsSource::File(path.to_owned());
        Ok(ids)
    }

    /// The database bundled in the binary.
    #[cfg(feature = "bundled-pci-ids")]
    #[must_use]
    pub fn bundled() -> Self {
        Self {
            bundled: true,
            source: PciIdsSource::Bundled(BUNDLED_VERSION),
            ..Self::default()
        }
    }

    /// Without the `bundled-pci-ids` feature: no database.
    #[cfg(not(feature = "bundled-pci-ids"))]
    #[must_use]
    pub fn bundled() -> Self {
        Self::default()
    }

    /// Parses `pci.ids` text the way pcidb does: `#` lines and blank lines skipped; a line that
    /// starts with `C` opens the class section, any other line not starting with a tab is a
    /// vendor (`vvvv  Name`); a line with one tab is a device of the current vendor
    /// (`\tdddd  Name`) outside the class section; two tabs (subsystems, programming
    /// interfaces) carry no name we publish. A later duplicate ID wins, as in pcidb's maps.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let text: std::sync::Arc<str> = std::sync::Arc::from(text);
        let mut vendors: BTreeMap<String, Vendor> = BTreeMap::new();
        let mut current: Option<String> = None;
        let mut in_classes = false;
        let mut pos = 0;
        for raw in text.split_inclusive('\n') {
            let start = pos;
            pos += raw.len();
            let line = raw.trim_end_matches(['\n', '\r']);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('C') {
                in_classes = true;
                current = None;
                continue;
            }
            if line.starts_with('\t') {
                // Device or subsystem lines: part of the current vendor's block.
                if !in_classes && let Some(v) = current.as_ref().and_then(|v| vendors.get_mut(v)) {
                    v.block.1 = pos;
                }
                continue;
            }
            in_classes = false;
            // `vvvv  Name`: the name from the 7th character on.
            if let (Some(id), Some(_)) = (line.get(..4), line.get(6..)) {
                let id = id.to_ascii_lowercase();
                vendors.insert(
                    id.clone(),
                    Vendor {
                        name: (start + 6, start + line.len()),
                        block: (pos, pos),
                    },
                );
                current = Some(id);
            }
        }
        Self {
            text,
            vendors,
            bundled: false,
            source: PciIdsSource::Text,
        }
    }

    /// Where the names come from.
    #[must_use]
    pub fn source(&self) -> &PciIdsSource {
        &self.source
    }

    /// The vendor's name, if the database has it. `vendor_id` is 4 hex digits.
    #[must_use]
    pub fn vendor(&self, vendor_id: &str) -> Option<String> {
        if self.bundled {
            return bundled_vendor(vendor_id);
        }
        let v = self.vendors.get(&vendor_id.to_ascii_lowercase())?;
        self.text.get(v.name.0..v.name.1).map(str::to_owned)
    }

    /// The device's name, if the database has it.
    #[must_use]
    pub fn device(&self, vendor_id: &str, device_id: &str) -> Option<String> {
        if self.bundled {
            return bundled_device(vendor_id, device_id);
        }
        let v = self.vendors.get(&vendor_id.to_ascii_lowercase())?;
        let block = self.text.get(v.block.0..v.block.1)?;
        let want = device_id.to_ascii_lowercase();
        // `\tdddd  Name` (pcidb takes the name from the 8th character on); two tabs are
        // subsystems. A later duplicate wins, as in pcidb's map.
        block
            .lines()
            .rev()
            .filter_map(|l| l.strip_prefix('\t'))
            .filter(|l| !l.starts_with('\t'))
            .filter(|l| l.get(..4).is_some_and(|id| id.eq_ignore_ascii_case(&want)))
            .find_map(|l| l.get(6..))
            .map(str::to_owned)
    }

    /// `dra.net/pciVendor` as upstream publishes it: the name, or [`UNKNOWN`].
    #[must_use]
    pub fn vendor_attribute(&self, vendor_id: &str) -> String {
        self.vendor(vendor_id).unwrap_or_else(|| UNKNOWN.to_owned())
    }

    /// `dra.net/pciDevice` as upstream publishes it: the name, or [`UNKNOWN`].
    #[must_use]
    pub fn device_attribute(&self, vendor_id: &str, device_id: &str) -> String {
        self.device(vendor_id, device_id)
            .unwrap_or_else(|| UNKNOWN.to_owned())
    }
}

/// The `pci-ids-rs` release bundled (its version is the database's date).
#[cfg(feature = "bundled-pci-ids")]
const BUNDLED_VERSION: &str = "1.2026.10";

#[cfg(feature = "bundled-pci-ids")]
fn hex16(s: &str) -> Option<u16> {
    u16::from_str_radix(s, 16).ok()
}

#[cfg(feature = "bundled-pci-ids")]
fn bundled_vendor(vendor_id: &str) -> Option<String> {
    use pci_ids_rs::FromId;
    pci_ids_rs::Vendor::from_id(hex16(vendor_id)?).map(|v| v.name().to_owned())
}

#[cfg(feature = "bundled-pci-ids")]
fn bundled_device(vendor_id: &str, device_id: &str) -> Option<String> {
    pci_ids_rs::Device::from_vid_pid(hex16(vendor_id)?, hex16(device_id)?).map(|d| d.name().to_owned())
}

#[cfg(not(feature = "bundled-pci-ids"))]
fn bundled_vendor(_vendor_id: &str) -> Option<String> {
    None
}

#[cfg(not(feature = "bundled-pci-ids"))]
fn bundled_device(_vendor_id: &str, _device_id: &str) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's `dra.net/pciVendor` and `dra.net/pciDevice` for five devices dranet is run
    /// on (vendor ID, device ID, vendor, device), as upstream's embedded pci.ids renders them.
    pub(crate) const UPSTREAM_NAMES: [(&str, &str, &str, &str); 5] = [
        (
            "15b3",
            "101e",
            "Mellanox Technologies",
            "ConnectX Family mlx5Gen Virtual Function",
        ),
        (
            "15b3",
            "1021",
            "Mellanox Technologies",
            "MT2910 Family [ConnectX-7]",
        ),
        ("1d0f", "efa1", "Amazon.com, Inc.", "Elastic Fabric Adapter (EFA)"),
        (
            "1ae0",
            "0042",
            "Google, Inc.",
            "Compute Engine Virtual Ethernet [gVNIC]",
        ),
        ("1af4", "1041", "Red Hat, Inc.", "Virtio 1.0 network device"),
    ];

    pub(crate) const FIXTURE: &str = include_str!("testdata/pci.ids");

    fn check_upstream_names(ids: &PciIds) {
        for (v, d, vendor, device) in UPSTREAM_NAMES {
            assert_eq!(ids.vendor_attribute(v), vendor, "{v} in {}", ids.source());
            assert_eq!(ids.device_attribute(v, d), device, "{v}:{d} in {}", ids.source());
        }
    }

    #[test]
    fn fixture_gives_upstreams_strings() {
        check_upstream_names(&PciIds::parse(FIXTURE));
    }

    #[test]
    fn bundled_database_gives_upstreams_strings() {
        let ids = PciIds::bundled();
        assert!(matches!(ids.source(), PciIdsSource::Bundled(_)));
        check_upstream_names(&ids);
        assert_eq!(ids.vendor_attribute("f00d"), UNKNOWN);
    }

    /// The system database (Debian's `pci.ids`, which `scripts/install-toolchain.sh` installs,
    /// so CI must have it).
    #[test]
    fn system_database_gives_upstreams_strings() {
        let Some(path) = SYSTEM_PATHS.iter().map(Path::new).find(|p| p.exists()) else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no pci.ids in {SYSTEM_PATHS:?}: run scripts/install-toolchain.sh"
            );
            eprintln!("skipped: no system pci.ids");
            return;
        };
        let ids = PciIds::from_file(path).unwrap();
        check_upstream_names(&ids);
    }

    #[test]
    fn names_are_rendered_as_pcidb_does() {
        let ids = PciIds::parse(FIXTURE);
        // Not trimmed; a later duplicate wins; unknown IDs are "unknown", never hex.
        assert_eq!(ids.vendor_attribute("f00d"), "Test Vendor  ");
        assert_eq!(ids.device_attribute("f00d", "0001"), "Second name");
        assert_eq!(ids.vendor_attribute("abcd"), UNKNOWN);
        assert_eq!(ids.device_attribute("15b3", "ffff"), UNKNOWN);
        assert_eq!(ids.device_attribute("abcd", "0001"), UNKNOWN);
        // IDs are matched whatever their case (sysfs and modalias differ).
        assert_eq!(ids.device_attribute("15B3", "101E"), UPSTREAM_NAMES[0].3);
        // Subsystem lines and the class section name no device.
        assert_eq!(ids.device_attribute("1af4", "01de"), UNKNOWN);
        assert_eq!(ids.device_attribute("f00d", "00"), UNKNOWN);
        assert_eq!(ids.vendor("02"), None);
        assert_eq!(PciIds::default().vendor_attribute("15b3"), UNKNOWN);
    }

    #[test]
    fn pcidb_path_then_system_paths_then_bundled() {
        let dir = std::env::temp_dir().join(format!("dranet-pciids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = dir.join("env.ids");
        let sys = dir.join("sys.ids");
        std::fs::write(&env, "f00d  From PCIDB_PATH\n").unwrap();
        std::fs::write(&sys, "f00d  From the system\n").unwrap();
        let missing = dir.join("missing.ids");
        let from = |e: Option<&Path>, p: &[&Path]| PciIds::load_from(e, p);
        let ids = from(Some(&env), &[&sys]);
        assert_eq!(ids.vendor_attribute("f00d"), "From PCIDB_PATH");
        assert_eq!(ids.source(), &PciIdsSource::File(env.clone()));
        let ids = from(Some(&missing), &[&missing, &sys]);
        assert_eq!(ids.vendor_attribute("f00d"), "From the system");
        let ids = from(None, &[&missing]);
        assert!(
            matches!(ids.source(), PciIdsSource::Bundled(_)),
            "{}",
            ids.source()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
