//! A link's parent device on a kernel whose rtnetlink does not name it (fenced: touches the
//! kernel). `IFLA_PARENT_DEV_NAME` / `IFLA_PARENT_DEV_BUS_NAME` came in Linux 5.15; before that
//! (Debian 11's 5.10, found by the kernel matrix) a NIC moved into a pod has no kernel identity
//! in its link messages but its permanent MAC, and dranet's PCI identity of a NIC (Prepare's
//! `pciAddress`, adoption by PCI function) found nothing.
//!
//! The fallback is ethtool's driver info (`ETHTOOL_GDRVINFO` over `SIOCETHTOOL`), which every
//! kernel answers in any netns, on a socket of that netns: its `bus_info` is the name of the
//! device the driver hangs the netdev on, the same device `IFLA_PARENT_DEV_NAME` names (the
//! kernel fills it from `dev->dev.parent` for a driver without `get_drvinfo`, and a PCI driver
//! names its PCI function). The bus is found in sysfs (`/sys/bus/<bus>/devices/<bus_info>`:
//! devices are not per netns, only their `net/` entries are). One driver names another device:
//! virtio-net gives its transport's PCI function, not its `virtioN` device; a PCI function with
//! a single `virtio*` child is therefore answered as that child, as `IFLA_PARENT_DEV_NAME` would.
//! A `bus_info` that names no device in sysfs (`""` of veth, `"N/A"`, `"tun"`, a USB path) is no
//! parent.
//!
//! Only used where the kernel cannot send the attribute ([`kernel_names_parents`]), and only
//! for links without a link kind (a physical device's; a pod can only make links that have one).
//! The ioctl names the device by name: the name is checked to still be at the link's index
//! before and after (`SIOCGIFINDEX`), so a rename in between gives no parent rather than another
//! link's.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
use std::sync::OnceLock;

/// `SIOCETHTOOL` (`include/uapi/linux/sockios.h`).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GDRVINFO` (`include/uapi/linux/ethtool.h`).
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// `struct ethtool_drvinfo` (`include/uapi/linux/ethtool.h`, unchanged since 2.6).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ParentError {
    #[error("interface name {0:?} does not fit an ifreq")]
    BadName(String),
    #[error("link {name} is no longer at index {index} (renamed or gone)")]
    Gone { name: String, index: u32 },
    #[error("SIOCETHTOOL ETHTOOL_GDRVINFO on {name}")]
    Ioctl {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Whether this kernel's link messages can carry `IFLA_PARENT_DEV_NAME` (Linux ≥ 5.15), read
/// once from the running kernel's release. An unreadable release counts as a new kernel (the
/// attribute is then used alone, as before the fallback).
pub fn kernel_names_parents() -> bool {
    static NAMES: OnceLock<bool> = OnceLock::new();
    *NAMES.get_or_init(|| {
        nix::sys::utsname::uname()
            .ok()
            .and_then(|u| u.release().to_str().and_then(release_version))
            .is_none_or(|v| v >= (5, 15))
    })
}

/// `(major, minor)` of a kernel release such as `5.10.0-46-amd64`.
#[must_use]
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(['.', '-', '+']);
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// `(bus, name)` of the parent device of link `name` (at `index`), in the netns of `sock`
/// (any socket of that netns: the ioctl runs in the socket's netns), from ethtool's driver
/// info and sysfs under `sysfs` (`/sys` on a node). `None` when the link has none that sysfs
/// knows (veth, loopback, a driver without a parent device).
pub fn parent_by_ethtool(
    sock: BorrowedFd<'_>,
    name: &str,
    index: u32,
    sysfs: &Path,
) -> Result<Option<(String, String)>, ParentError> {
    let Some((driver, bus_info)) = drvinfo(sock, name, index)? else {
        return Ok(None);
    };
    Ok(parent_in_sysfs(sysfs, &driver, &bus_info))
}

/// The bus of the device named `bus_info` in sysfs, and that device (or its single `virtio*`
/// child for virtio-net, which names its transport's PCI function).
#[must_use]
pub fn parent_in_sysfs(sysfs: &Path, driver: &str, bus_info: &str) -> Option<(String, String)> {
    if bus_info.is_empty() || bus_info.contains('/') || bus_info.starts_with('.') {
        return None;
    }
    let buses = std::fs::read_dir(sysfs.join("bus")).ok()?;
    let mut found = buses.flatten().filter_map(|b| {
        let bus = b.file_name().into_string().ok()?;
        b.path()
            .join("devices")
            .join(bus_info)
            .symlink_metadata()
            .is_ok()
            .then_some(bus)
    });
    let bus = found.next()?;
    if found.next().is_some() {
        return None;
    }
    if driver == "virtio_net" {
        let dev = sysfs.join("bus").join(&bus).join("devices").join(bus_info);
        let children: Vec<String> = std::fs::read_dir(&dev)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| {
                n.strip_prefix("virtio")
                    .is_some_and(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
            })
            .collect();
        if let [child] = children.as_slice() {
            return Some(("virtio".to_owned(), child.clone()));
        }
    }
    Some((bus, bus_info.to_owned()))
}

/// An `ifreq` naming `name`.
fn ifreq(name: &str) -> Result<libc::ifreq, ParentError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(ParentError::BadName(name.to_owned()));
    }
    // SAFETY: ifreq is plain old data (a name array and a union of integers, sockaddrs and a
    // pointer); all zeroes is a valid value of it.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(r)
}

/// The index link `name` has now in the netns of `sock` (`SIOCGIFINDEX`).
fn index_of(sock: BorrowedFd<'_>, name: &str) -> Result<Option<u32>, ParentError> {
    let mut r = ifreq(name)?;
    // SAFETY: SIOCGIFINDEX reads ifr_name and writes ifr_ifindex of the ifreq we own, which
    // outlives the call; the fd is a socket borrowed for the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFINDEX as _, &raw mut r) };
    if rc < 0 {
        return Ok(None);
    }
    // SAFETY: the kernel filled ifru_ifindex (the call succeeded).
    let index = unsafe { r.ifr_ifru.ifru_ifindex };
    Ok(u32::try_from(index).ok())
}

/// `(driver, bus_info)` of link `name` at `index`; `None` for a device without driver info
/// (`EOPNOTSUPP`: no `get_drvinfo` and no parent device, as loopback).
fn drvinfo(sock: BorrowedFd<'_>, name: &str, index: u32) -> Result<Option<(String, String)>, ParentError> {
    let gone = || ParentError::Gone {
        name: name.to_owned(),
        index,
    };
    if index_of(sock, name)? != Some(index) {
        return Err(gone());
    }
    // SAFETY: EthtoolDrvinfo is plain old data (integers and byte arrays).
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    let mut r = ifreq(name)?;
    r.ifr_ifru.ifru_data = (&raw mut info).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO copies a struct ethtool_drvinfo to and from
    // ifru_data, which points at `info`, ours and alive for the call; ifr_name names the link.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &raw mut r) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => Ok(None),
            Some(libc::ENODEV) => Err(gone()),
            _ => Err(ParentError::Ioctl {
                name: name.to_owned(),
                source: e,
            }),
        };
    }
    if index_of(sock, name)? != Some(index) {
        return Err(gone());
    }
    Ok(Some((c_str(&info.driver), c_str(&info.bus_info))))
}

/// A NUL-terminated byte array as a string (lossy).
fn c_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The parent device (`bus/name`) of link `name` at `index` in the calling thread's netns,
/// through ethtool, on a kernel that cannot name it in link messages
/// ([`kernel_names_parents`]); `None` on a newer kernel (the message is the answer there), for
/// a link without one, and on any failure (logged at debug). For the watcher's host-side link
/// events, which come off a multicast socket: a blocking ioctl, so only for the rare link
/// without a kind and without a parent in its message.
#[must_use]
pub fn parent_here(name: &str, index: u32) -> Option<String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    if kernel_names_parents() {
        return None;
    }
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| tracing::debug!(link = %name, error = %e, "no socket for ethtool"))
    .ok()?;
    match parent_by_ethtool(std::os::fd::AsFd::as_fd(&sock), name, index, Path::new("/sys")) {
        Ok(p) => p.map(|(bus, dev)| format!("{bus}/{dev}")),
        Err(e) => {
            tracing::debug!(link = %name, error = %e, "no parent device through ethtool");
            None
        }
    }
}
