// Over 500 lines: the three databases (file, bundled, text) behind one lookup, and their tests against upstream's names.
//! PCI vendor and device names for `dra.net/pciVendor` and `dra.net/pciDevice`, rendered as
//! upstream does: upstream asks ghw, which reads the `pci.ids` database with jaypipes/pcidb (a
//! copy embedded in the binary unless `PCIDB_PATH` names another file). So a name is the rest of
//! its `pci.ids` line after the ID and its two spaces, untrimmed, and an ID the database does not
//! know is published as `unknown` (ghw's placeholder), not as hex.
//!
//! Where the database comes from, first found wins: `$PCIDB_PATH` (a `pci.ids` file, as
//! upstream), `/usr/share/hwdata/pci.ids`, `/usr/share/misc/pci.ids` (Debian's `pci.ids`
//! package, installed in the image), then the copy bundled with the `pci-ids-rs` crate (feature
//! `bundled-pci-ids`, off by default: it costs every daemon 2.6 MiB of RSS), so a binary built
//! with it still gets names on a host without any.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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

/// A parsed `pci.ids`: the text as read, with an index of vendors.
struct Index {
    text: String,
    vendors: BTreeMap<String, Vendor>,
}

/// Where the names are looked up.
#[derive(Clone)]
enum Db {
    /// No database: every name is [`UNKNOWN`].
    None,
    /// The tables of `pci-ids-rs`.
    #[cfg_attr(not(feature = "bundled-pci-ids"), allow(dead_code))]
    Bundled,
    /// Text given by the caller, kept (tests).
    Text(Arc<Index>),
    /// A `pci.ids` file, read again for each vendor/device pair not asked before: only the
    /// answers are kept (a few per NIC model on a node), not the 1.4 MB of text.
    File(Arc<FileDb>),
}

struct FileDb {
    path: PathBuf,
    /// Lowercase `vvvv` and `vvvv:dddd` to the name, `None` for an ID the file lacks.
    names: Mutex<HashMap<String, Option<String>>>,
    /// Reads of the file since it was opened (tests).
    reads: AtomicUsize,
}

/// Vendor and device names by lowercase 4-digit hex ID. A `pci.ids` file is read at start (to
/// know it is readable) and again only when a vendor/device pair not seen before is looked up;
/// the answers are kept, the text is dropped after each read.
#[derive(Clone)]
pub struct PciIds {
    db: Db,
    source: PciIdsSource,
}

impl Default for PciIds {
    /// No database: every name is [`UNKNOWN`].
    fn default() -> Self {
        Self {
            db: Db::None,
            source: PciIdsSource::None,
        }
    }
}

impl std::fmt::Debug for PciIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciIds")
            .field("source", &self.source.to_string())
            .finish_non_exhaustive()
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

    /// The `pci.ids` file at `path`, read once now to check it can be.
    pub fn from_file(path: &Path) -> std::io::Result<Self> {
        read_index(path)?;
        Ok(Self {
            db: Db::File(Arc::new(FileDb {
                path: path.to_owned(),
                names: Mutex::new(HashMap::new()),
                reads: AtomicUsize::new(1),
            })),
            source: PciIdsSource::File(path.to_owned()),
        })
    }

    /// The database bundled in the binary.
    #[cfg(feature = "bundled-pci-ids")]
    #[must_use]
    pub fn bundled() -> Self {
        Self {
            db: Db::Bundled,
            source: PciIdsSource::Bundled(BUNDLED_VERSION),
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
        Self {
            db: Db::Text(Arc::new(Index::parse(text.to_owned()))),
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
        match &self.db {
            Db::None => None,
            Db::Bundled => bundled_vendor(vendor_id),
            Db::Text(ix) => ix.vendor(vendor_id),
            Db::File(f) => f.names(vendor_id, None).0,
        }
    }

    /// The device's name, if the database has it.
    #[must_use]
    pub fn device(&self, vendor_id: &str, device_id: &str) -> Option<String> {
        match &self.db {
            Db::None => None,
            Db::Bundled => bundled_device(vendor_id, device_id),
            Db::Text(ix) => ix.device(vendor_id, device_id),
            Db::File(f) => f.names(vendor_id, Some(device_id)).1,
        }
    }

    /// `dra.net/pciVendor` and `dra.net/pciDevice` as upstream publishes them: the names, or
    /// [`UNKNOWN`]. A file database is read at most once for both.
    #[must_use]
    pub fn attributes(&self, vendor_id: &str, device_id: &str) -> (String, String) {
        let (v, d) = match &self.db {
            Db::File(f) => f.names(vendor_id, Some(device_id)),
            _ => (self.vendor(vendor_id), self.device(vendor_id, device_id)),
        };
        let unknown = || UNKNOWN.to_owned();
        (v.unwrap_or_else(unknown), d.unwrap_or_else(unknown))
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

    /// How many times the file database was read (tests).
    #[cfg(test)]
    fn reads(&self) -> usize {
        match &self.db {
            Db::File(f) => f.reads.load(Ordering::Relaxed),
            _ => 0,
        }
    }
}

fn read_index(path: &Path) -> std::io::Result<Index> {
    let bytes = std::fs::read(path)?;
    Ok(Index::parse(String::from_utf8_lossy(&bytes).into_owned()))
}

impl FileDb {
    /// The vendor's name and, with `device_id`, the device's: from the answers kept, else from
    /// one read of the file (an unreadable file is logged and answers `None`, not kept).
    fn names(&self, vendor_id: &str, device_id: Option<&str>) -> (Option<String>, Option<String>) {
        let vkey = vendor_id.to_ascii_lowercase();
        let dkey = device_id.map(|d| format!("{vkey}:{}", d.to_ascii_lowercase()));
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = |names: &HashMap<String, Option<String>>, k: &str| names.get(k).cloned();
        let v = kept(&names, &vkey);
        let d = dkey.as_deref().map(|k| kept(&names, k));
        match (v, d) {
            (Some(v), None) => return (v, None),
            (Some(v), Some(Some(d))) => return (v, d),
            _ => {}
        }
        self.reads.fetch_add(1, Ordering::Relaxed);
        let ix = match read_index(&self.path) {
            Ok(ix) => ix,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %crate::telemetry::chain(&e),
                    "cannot read pci.ids again: names of a new vendor/device are unknown");
                return (None, None);
            }
        };
        // A name already kept stays: what was published does not change under a changed file.
        let v = names.entry(vkey).or_insert_with(|| ix.vendor(vendor_id)).clone();
        let d = match (dkey, device_id) {
            (Some(k), Some(id)) => names.entry(k).or_insert_with(|| ix.device(vendor_id, id)).clone(),
            _ => None,
        };
        (v, d)
    }
}

impl Index {
    fn parse(text: String) -> Self {
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
        Self { text, vendors }
    }

    fn vendor(&self, vendor_id: &str) -> Option<String> {
        let v = self.vendors.get(&vendor_id.to_ascii_lowercase())?;
        self.text.get(v.name.0..v.name.1).map(str::to_owned)
    }

    fn device(&self, vendor_id: &str, device_id: &str) -> Option<String> {
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

    #[cfg(feature = "bundled-pci-ids")]
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

    /// A file database keeps the answers, not the text: a pair asked before is answered without
    /// reading the file (the file changed since, its answer did not), a new pair reads the file
    /// once for both names, and an ID the file lacks is not read for again.
    #[test]
    fn a_file_database_keeps_the_answers_not_the_text() {
        let dir = std::env::temp_dir().join(format!("dranet-pciids-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pci.ids");
        std::fs::write(&path, "f00d  Old vendor\n\t0001  Old device\n").unwrap();
        let ids = PciIds::from_file(&path).unwrap();
        assert_eq!(ids.reads(), 1, "read once at start");
        let old = ("Old vendor".to_owned(), "Old device".to_owned());
        assert_eq!(ids.attributes("f00d", "0001"), old);
        assert_eq!(ids.reads(), 2, "one read for both names of a new pair");
        std::fs::write(
            &path,
            "f00d  New vendor\n\t0001  New device\n\t0002  Second device\n",
        )
        .unwrap();
        // Clones share the answers.
        let clone = ids.clone();
        assert_eq!(clone.attributes("F00D", "0001"), old);
        assert_eq!(clone.vendor_attribute("f00d"), "Old vendor");
        assert_eq!(ids.reads(), 2, "answered from what was kept");
        assert_eq!(ids.device_attribute("f00d", "0002"), "Second device");
        assert_eq!(ids.reads(), 3);
        assert_eq!(
            ids.attributes("abcd", "0001"),
            (UNKNOWN.to_owned(), UNKNOWN.to_owned())
        );
        assert_eq!(
            ids.attributes("abcd", "0001"),
            (UNKNOWN.to_owned(), UNKNOWN.to_owned())
        );
        assert_eq!(ids.reads(), 4, "an unknown pair is not read for again");
        // A file gone: a new pair is unknown (and asked again later), the kept ones stay.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(ids.device_attribute("f00d", "0003"), UNKNOWN);
        assert_eq!(ids.attributes("f00d", "0001"), old);
        let _ = std::fs::remove_dir_all(&dir);
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
        #[cfg(feature = "bundled-pci-ids")]
        assert!(
            matches!(ids.source(), PciIdsSource::Bundled(_)),
            "{}",
            ids.source()
        );
        // Without the bundled copy (the default build): no database, every name `unknown`, as
        // ghw publishes an ID its database lacks.
        #[cfg(not(feature = "bundled-pci-ids"))]
        {
            assert_eq!(ids.source(), &PciIdsSource::None);
            assert_eq!(ids.vendor_attribute("1af4"), UNKNOWN);
            assert_eq!(ids.device_attribute("1af4", "1041"), UNKNOWN);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
