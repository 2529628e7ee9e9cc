//! Every field of a sandbox record read from disk, checked before the engine acts on it (issue
//! 38: record files are not trusted). A record file is written by dranet alone, but a bad disk,
//! a hand edit or a hostile writer of the state dir can put anything there; what the engine does
//! with a field (a link looked up or renamed by a name, a sysctl written under a key, a list
//! walked per restore) must not be steered by such a file. A record whose field is out of what
//! the kernel or dranet ever writes is refused as a whole: its file is moved aside as corrupt
//! and its `.prev` tried ([`super::Store::load_or_recover`]), and no other record pays for it.
//! The ids (pod UID, sandbox id) and the pin path are checked where they always were
//! ([`super::record_ok`], [`super::store::pin_path_ok`]). Plans ([`plan_fields`]) are records
//! too: their host link names, PCI addresses and MACs, the claim's configuration (the rules a
//! Prepare checked) and the character devices given to the pod's containers
//! (`/dev/infiniband/<node>` only).
//!
//! The bounds are those of the kernel where it has one (IFNAMSIZ, ALTIFNAMSIZ, IFALIASZ,
//! MAX_ADDR_LEN, ETH_GSTRING_LEN, `int` ifindexes, GSO_MAX_SEGS) and otherwise far beyond any real
//! device (an MTU over 1 MiB, more than 256 altnames, 4,096 addresses, 1,024 offload features)
//! while small enough that a restore walking them stays cheap. One value outside the kernel's is
//! dranet's own: a snapshot's host ifindex 0, unknown (a record rebuilt from a pin).

use std::path::{Component, Path};

use super::{DeviceAt, DeviceRecord, PodRecord};
use crate::sys::link::{AddrSnapshot, LinkSnapshot};

/// Devices in one sandbox record.
const MAX_DEVICES: usize = 1024;
/// Kubernetes names (DNS subdomain) and ResourceSlice device names.
const MAX_K8S_NAME: usize = 253;
/// `PATH_MAX` less its NUL.
const MAX_PATH: usize = 4095;
/// `ALTIFNAMSIZ` less its NUL.
const MAX_ALTNAME: usize = 127;
/// Altnames of one link kept in a snapshot.
const MAX_ALTNAMES: usize = 256;
/// `IFALIASZ` less its NUL.
const MAX_ALIAS: usize = 255;
/// An MTU beyond any device's `max_mtu` (jumbo frames are 9 KiB, IPoIB 64 KiB).
const MAX_MTU: u32 = 1 << 20;
/// A GSO/GRO size beyond BIG TCP's (512 KiB).
const MAX_GSO_SIZE: u32 = 1 << 24;
/// `GSO_MAX_SEGS`.
const MAX_GSO_SEGS: u32 = 65_535;
/// Addresses of one link kept in a snapshot.
const MAX_ADDRESSES: usize = 4096;
/// `MAX_ADDR_LEN` (bytes of a link-layer address).
const MAX_LL_ADDR: usize = 32;
/// Offload features or private flags of one driver.
const MAX_FLAG_NAMES: usize = 1024;
/// `ETH_GSTRING_LEN` less its NUL.
const MAX_FLAG_NAME: usize = 31;
/// Per-device IP sysctls.
const MAX_SYSCTLS: usize = 256;
/// Link kinds and parent device names (`<bus>/<name>`).
const MAX_KIND: usize = 64;
const MAX_PARENT: usize = 255;
/// `IB_DEVICE_NAME_MAX` less its NUL.
const MAX_RDMA_NAME: usize = 63;
/// Free text kept in a record (why it was rebuilt, the last return error).
const MAX_TEXT: usize = 64 * 1024;

/// Checks every field of `r` but its ids and pin; the first field that fails, and why.
pub(super) fn record_fields(r: &PodRecord) -> Result<(), String> {
    for (what, v) in [("namespace", &r.namespace), ("name", &r.name)] {
        // Empty in a record rebuilt from a pin until its sandbox is named.
        if !v.is_empty() {
            k8s_name(v).map_err(|why| format!("pod {what} {v:?}: {why}"))?;
        }
    }
    netns_path(&r.netns_path).map_err(|why| format!("netns path {}: {why}", r.netns_path.display()))?;
    if r.devices.len() > MAX_DEVICES {
        return Err(format!("{} devices (at most {MAX_DEVICES})", r.devices.len()));
    }
    if let Some(rec) = &r.recovered {
        text(&rec.reason).map_err(|why| format!("recovered reason: {why}"))?;
    }
    for (i, d) in r.devices.iter().enumerate() {
        device(d).map_err(|why| format!("device {i} ({:?}): {why}", cut(&d.device)))?;
    }
    Ok(())
}

/// Checks every field of plan `p` but its pod UID ([`super::plan_ok`]): what Prepare wrote, which
/// an attach acts on (a host link looked up by name, the claim's configuration applied in the
/// pod, character devices given to its containers).
pub(super) fn plan_fields(p: &crate::plan::PodPlan) -> Result<(), String> {
    for (what, v) in [("namespace", &p.pod_namespace), ("name", &p.pod_name)] {
        if !v.is_empty() {
            k8s_name(v).map_err(|why| format!("pod {what}: {why}"))?;
        }
    }
    if p.devices.len() > MAX_DEVICES {
        return Err(format!("{} devices (at most {MAX_DEVICES})", p.devices.len()));
    }
    for (i, d) in p.devices.iter().enumerate() {
        planned_device(d).map_err(|why| format!("device {i} ({:?}): {why}", cut(&d.device)))?;
    }
    Ok(())
}

fn planned_device(d: &crate::plan::DevicePlan) -> Result<(), String> {
    k8s_name(&d.device).map_err(|why| format!("device name: {why}"))?;
    for (what, v) in [
        ("pool", &d.pool),
        ("request", &d.request),
        ("claim namespace", &d.claim.namespace),
        ("claim name", &d.claim.name),
        ("claim UID", &d.claim.uid),
    ] {
        if !v.is_empty() {
            k8s_name(v).map_err(|why| format!("{what}: {why}"))?;
        }
    }
    if let Some(n) = &d.host_ifname {
        ifname(n).map_err(|why| format!("host interface name: {why}"))?;
    }
    if let Some(a) = &d.pci_address {
        crate::pci::validate_address(a).map_err(|_| format!("PCI address {:?}", cut(a)))?;
    }
    if let Some(m) = &d.permanent_mac {
        ll_addr(m).map_err(|why| format!("permanent MAC: {why}"))?;
    }
    if let Some(n) = &d.rdma_device {
        printable(n, MAX_RDMA_NAME).map_err(|why| format!("RDMA device: {why}"))?;
    }
    crate::config::validate(&d.config).map_err(|e| format!("config: {}", crate::telemetry::chain(&e)))?;
    if d.char_devices.len() > MAX_FLAG_NAMES {
        return Err(format!("{} character devices", d.char_devices.len()));
    }
    for c in &d.char_devices {
        char_device(c).map_err(|why| format!("character device {:?}: {why}", cut(&c.path)))?;
    }
    Ok(())
}

/// A character device dranet gives a pod: `/dev/infiniband/<node>` (what the inventory finds in
/// sysfs), kind `c`, a major and minor the kernel can have (12 and 20 bits).
fn char_device(c: &crate::plan::CharDevice) -> Result<(), &'static str> {
    let node_ok = c
        .path
        .strip_prefix("/dev/infiniband/")
        .is_some_and(|n| n != "." && n != ".." && printable(n, 64).is_ok());
    if !node_ok {
        return Err("not /dev/infiniband/<node>");
    }
    if c.kind != "c" {
        return Err("not a character device");
    }
    if !(0..1 << 12).contains(&c.major) || !(0..1 << 20).contains(&c.minor) {
        return Err("major or minor out of range");
    }
    Ok(())
}

/// A value short enough to quote in an error.
fn cut(s: &str) -> &str {
    crate::text::cut_at_char(s, 64)
}

fn device(d: &DeviceRecord) -> Result<(), String> {
    k8s_name(&d.device).map_err(|why| format!("device name: {why}"))?;
    ifname(&d.pod_ifname).map_err(|why| format!("pod interface name: {why}"))?;
    if let Some(a) = &d.pci_address {
        crate::pci::validate_address(a).map_err(|_| format!("PCI address {:?}", cut(a)))?;
    }
    for (what, mac) in [("permanent MAC", &d.permanent_mac), ("pod MAC", &d.pod_mac)] {
        if let Some(m) = mac {
            ll_addr(m).map_err(|why| format!("{what}: {why}"))?;
        }
    }
    if let Some(n) = &d.rdma_device {
        printable(n, MAX_RDMA_NAME).map_err(|why| format!("RDMA device: {why}"))?;
    }
    if let Some(n) = &d.temp_name {
        ifname(n).map_err(|why| format!("temporary name: {why}"))?;
    }
    if let Some(at) = &d.at {
        place(at).map_err(|why| format!("place: {why}"))?;
    }
    if let Some(e) = &d.return_error {
        text(e).map_err(|why| format!("return error: {why}"))?;
    }
    snapshot(&d.snapshot).map_err(|why| format!("snapshot: {why}"))
}

fn snapshot(s: &LinkSnapshot) -> Result<(), String> {
    host_ifindex(s.ifindex).map_err(|why| format!("ifindex: {why}"))?;
    ifname(&s.name).map_err(|why| format!("name: {why}"))?;
    if s.altnames.len() > MAX_ALTNAMES {
        return Err(format!("{} altnames (at most {MAX_ALTNAMES})", s.altnames.len()));
    }
    for a in &s.altnames {
        altname(a).map_err(|why| format!("altname: {why}"))?;
    }
    if let Some(a) = &s.alias
        && a.len() > MAX_ALIAS
    {
        return Err(format!("alias of {} bytes (at most {MAX_ALIAS})", a.len()));
    }
    if s.mtu > MAX_MTU {
        return Err(format!("MTU {} (at most {MAX_MTU})", s.mtu));
    }
    for (what, mac) in [("MAC", &s.mac), ("permanent MAC", &s.perm_mac)] {
        if let Some(m) = mac {
            ll_addr(m).map_err(|why| format!("{what}: {why}"))?;
        }
    }
    for (what, v, max) in [
        ("gso_max_size", s.gso_max_size, MAX_GSO_SIZE),
        ("gro_max_size", s.gro_max_size, MAX_GSO_SIZE),
        ("gso_ipv4_max_size", s.gso_ipv4_max_size, MAX_GSO_SIZE),
        ("gro_ipv4_max_size", s.gro_ipv4_max_size, MAX_GSO_SIZE),
        ("gso_max_segs", s.gso_max_segs, MAX_GSO_SEGS),
        ("txqlen", s.txqlen, i32::MAX.unsigned_abs()),
    ] {
        if let Some(v) = v
            && v > max
        {
            return Err(format!("{what} {v} (at most {max})"));
        }
    }
    if s.addresses.len() > MAX_ADDRESSES {
        return Err(format!(
            "{} addresses (at most {MAX_ADDRESSES})",
            s.addresses.len()
        ));
    }
    for a in &s.addresses {
        address(a)?;
    }
    if let Some(k) = &s.kind {
        printable(k, MAX_KIND).map_err(|why| format!("kind: {why}"))?;
    }
    if let Some(p) = &s.parent {
        // `<bus>/<name>`: one `/`, names of their own.
        let ok = p.split_once('/').is_some_and(|(bus, name)| {
            printable(bus, MAX_PARENT).is_ok() && printable(name, MAX_PARENT).is_ok()
        });
        if !ok || p.len() > MAX_PARENT {
            return Err(format!("parent {:?}: not <bus>/<name>", cut(p)));
        }
    }
    for (what, m) in [("features", &s.features), ("private flags", &s.private_flags)] {
        if m.len() > MAX_FLAG_NAMES {
            return Err(format!("{} {what} (at most {MAX_FLAG_NAMES})", m.len()));
        }
        for k in m.keys() {
            printable(k, MAX_FLAG_NAME).map_err(|why| format!("{what}: {why}"))?;
        }
    }
    if s.sysctls.len() > MAX_SYSCTLS {
        return Err(format!("{} sysctls (at most {MAX_SYSCTLS})", s.sysctls.len()));
    }
    for k in s.sysctls.keys() {
        sysctl_key(k).map_err(|why| format!("sysctl {:?}: {why}", cut(k)))?;
    }
    if let Some(l) = s.lower {
        ifindex(l).map_err(|why| format!("lower link: {why}"))?;
    }
    Ok(())
}

fn address(a: &AddrSnapshot) -> Result<(), String> {
    if a.cidr.len() > 64 || crate::sys::link::parse_cidr(&a.cidr).is_err() {
        return Err(format!("address {:?}: not ip/prefix", cut(&a.cidr)));
    }
    if let Some(l) = &a.label {
        ifname(l).map_err(|why| format!("address label: {why}"))?;
    }
    Ok(())
}

/// A link's ifindex: the kernel's are `int`s from 1.
fn ifindex(i: u32) -> Result<(), String> {
    if i == 0 || i > i32::MAX.unsigned_abs() {
        return Err(format!("{i} (1 to {})", i32::MAX));
    }
    Ok(())
}

/// A snapshot's host ifindex: a kernel's, or 0, unknown (a record rebuilt from a pin, which
/// has no snapshot from before the attach; [`LinkSnapshot`] never looks a device up at 0).
fn host_ifindex(i: u32) -> Result<(), String> {
    if i == 0 { Ok(()) } else { ifindex(i) }
}

fn place(at: &DeviceAt) -> Result<(), String> {
    ifindex(at.ifindex.get())
}

/// A name the kernel takes for a netdev ([`crate::ids::is_ifname`]).
fn ifname(n: &str) -> Result<(), String> {
    if crate::ids::is_ifname(n) {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a link name (1 to 15 bytes, no '/', ':' or space)",
            cut(n)
        ))
    }
}

/// An altname: as a link name, up to 127 bytes (`ALTIFNAMSIZ`).
fn altname(n: &str) -> Result<(), String> {
    let ok = (1..=MAX_ALTNAME).contains(&n.len())
        && n != "."
        && n != ".."
        && n.bytes().all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not an altname (1 to {MAX_ALTNAME} bytes, no '/', ':' or space)",
            cut(n)
        ))
    }
}

/// A link-layer address as dranet writes it: 1 to 32 bytes, two hex digits each, `:` between.
fn ll_addr(m: &str) -> Result<(), String> {
    let parts: Vec<&str> = m.split(':').collect();
    let ok = (1..=MAX_LL_ADDR).contains(&parts.len())
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok || (m.contains(['-', '.']) && crate::config::mac_bytes(m).is_some()) {
        Ok(())
    } else {
        Err(format!("{:?} is not a link-layer address", cut(m)))
    }
}

/// A Kubernetes name or a ResourceSlice device name: 1 to 253 bytes of `[A-Za-z0-9._-]`, not
/// `.` or `..`.
fn k8s_name(n: &str) -> Result<(), String> {
    let ok = (1..=MAX_K8S_NAME).contains(&n.len())
        && n != "."
        && n != ".."
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?}: not 1 to {MAX_K8S_NAME} bytes of [A-Za-z0-9._-]",
            cut(n)
        ))
    }
}

/// Printable ASCII without `/`, 1 to `max` bytes.
fn printable(n: &str, max: usize) -> Result<(), String> {
    let ok = (1..=max).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?}: not 1 to {max} printable bytes without '/'",
            cut(n)
        ))
    }
}

/// `ipv4/<name>` or `ipv6/<name>`, `<name>` of `[a-z0-9_]` (a key becomes part of a
/// `/proc/sys` path).
fn sysctl_key(k: &str) -> Result<(), String> {
    let ok = k.split_once('/').is_some_and(|(family, name)| {
        matches!(family, "ipv4" | "ipv6")
            && (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    });
    if ok {
        Ok(())
    } else {
        Err("not ipv4/<name> or ipv6/<name>".into())
    }
}

/// The runtime's netns path: absolute, no `.` or `..`, no NUL, at most `PATH_MAX`.
fn netns_path(p: &Path) -> Result<(), &'static str> {
    let s = p.as_os_str().as_encoded_bytes();
    if !p.is_absolute() {
        return Err("not absolute");
    }
    if s.len() > MAX_PATH {
        return Err("longer than PATH_MAX");
    }
    if s.contains(&0) {
        return Err("holds a NUL byte");
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err("has a '..' or '.' component");
    }
    Ok(())
}

/// Free text: at most 64 KiB.
fn text(t: &str) -> Result<(), String> {
    if t.len() > MAX_TEXT {
        return Err(format!("{} bytes (at most {MAX_TEXT})", t.len()));
    }
    Ok(())
}
