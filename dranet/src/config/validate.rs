// Over 500 lines: upstream's validation rules, one function per config block, reported together.
//! Validation of [`NetworkConfig`], with upstream's rules and messages (`pkg/apis/validation.go`):
//! strict JSON (unknown fields are errors), then every rule is checked and all failures are
//! reported together, each prefixed with its field path (`interface.mtu`, `routes[1].gateway`).

use std::fmt;
use std::net::IpAddr;

use super::{InterfaceConfig, NeighborConfig, NetworkConfig, RouteConfig, RuleConfig, VrfConfig};

/// Minimum practical MTU (IPv4).
pub const MIN_MTU: i32 = 68;
/// `IFNAMSIZ - 1`.
pub const MAX_INTERFACE_NAME_LEN: usize = 15;

const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;

/// One failed rule: where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Field path, e.g. `routes[0].gateway`; empty for whole-config problems.
    pub path: String,
    pub problem: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.problem)
        } else {
            write!(f, "{}: {}", self.path, self.problem)
        }
    }
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON at all (the position is in the message).
    #[error("failed to unmarshal JSON data")]
    Json {
        #[source]
        source: serde_json::Error,
    },
    /// JSON, but with unknown fields or values of the wrong type (strict decoding): every one,
    /// each with its field path.
    #[error("failed to unmarshal JSON data: {}", join(.errors))]
    Decode { errors: Vec<FieldError> },
    /// Decoded, but one or more rules fail.
    #[error("invalid configuration: {}", join(.errors))]
    Invalid { errors: Vec<FieldError> },
}

impl ConfigError {
    /// The individual failures, each with its path (empty when the input is not JSON).
    #[must_use]
    pub fn field_errors(&self) -> &[FieldError] {
        match self {
            Self::Json { .. } => &[],
            Self::Decode { errors } | Self::Invalid { errors } => errors,
        }
    }
}

/// Decodes `opaque.parameters` strictly, applies defaults and validates. Empty input (or JSON
/// `null`) is the empty config, as upstream ("no configuration provided").
pub fn parse_and_validate(raw: &[u8]) -> Result<NetworkConfig, ConfigError> {
    let mut cfg = parse(raw)?;
    cfg.apply_defaults();
    validate(&cfg)?;
    Ok(cfg)
}

/// At most this many decoding errors are reported for one config.
const MAX_DECODE_ERRORS: usize = 32;

/// Strict decoding that reports every unknown field and wrong type, not only the first: after
/// each error the offending member is taken out of the document and decoding starts again.
fn parse(raw: &[u8]) -> Result<NetworkConfig, ConfigError> {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Ok(NetworkConfig::default());
    }
    let mut doc: serde_json::Value =
        serde_json::from_slice(raw).map_err(|source| ConfigError::Json { source })?;
    let mut errors: Vec<FieldError> = Vec::new();
    let mut removed = Removed::default();
    while errors.len() < MAX_DECODE_ERRORS {
        let err = match serde_path_to_error::deserialize::<_, Option<NetworkConfig>>(&doc) {
            Ok(cfg) if errors.is_empty() => return Ok(cfg.unwrap_or_default()),
            Ok(_) => break,
            Err(e) => e,
        };
        let segments: Vec<serde_path_to_error::Segment> = err.path().iter().cloned().collect();
        errors.push(FieldError {
            path: removed.original_path(&segments),
            problem: err.into_inner().to_string(),
        });
        if !removed.take_out(&mut doc, &segments) {
            break;
        }
    }
    Err(ConfigError::Decode { errors })
}

/// Array elements taken out so far, by the original path of their array, so that the paths of
/// later errors name the elements as the user wrote them.
#[derive(Default)]
struct Removed(std::collections::HashMap<String, Vec<usize>>);

impl Removed {
    /// The original index of what is now element `current` of the array at `array`.
    fn original_index(&self, array: &str, current: usize) -> usize {
        let Some(gone) = self.0.get(array) else {
            return current;
        };
        // The `current`-th index (0-based) not in `gone` (sorted).
        let mut idx = current;
        for g in gone {
            if *g <= idx {
                idx += 1;
            } else {
                break;
            }
        }
        idx
    }

    /// `interface.addresses[1]`: map keys joined by dots, indices in brackets, as written.
    fn original_path(&self, segments: &[serde_path_to_error::Segment]) -> String {
        use serde_path_to_error::Segment;
        let mut out = String::new();
        for s in segments {
            match s {
                Segment::Seq { index } => {
                    let i = self.original_index(&out, *index);
                    out.push_str(&format!("[{i}]"));
                }
                Segment::Map { key } | Segment::Enum { variant: key } => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                Segment::Unknown => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push('?');
                }
            }
        }
        out
    }

    /// Removes the member at `path` (an object key or an array element) and records a removed
    /// element. False if there is nothing to take out (the document itself is wrong).
    fn take_out(&mut self, doc: &mut serde_json::Value, path: &[serde_path_to_error::Segment]) -> bool {
        use serde_path_to_error::Segment;
        let Some((last, parents)) = path.split_last() else {
            return false;
        };
        let mut cur = doc;
        for seg in parents {
            let next = match (seg, cur) {
                (Segment::Map { key }, serde_json::Value::Object(m)) => m.get_mut(key.as_str()),
                (Segment::Seq { index }, serde_json::Value::Array(a)) => a.get_mut(*index),
                _ => None,
            };
            let Some(n) = next else {
                return false;
            };
            cur = n;
        }
        match (last, cur) {
            (Segment::Map { key }, serde_json::Value::Object(m)) => m.remove(key.as_str()).is_some(),
            (Segment::Seq { index }, serde_json::Value::Array(a)) if *index < a.len() => {
                a.remove(*index);
                let array = self.original_path(parents);
                let original = self.original_index(&array, *index);
                let gone = self.0.entry(array).or_default();
                gone.push(original);
                gone.sort_unstable();
                true
            }
            _ => false,
        }
    }
}

/// Checks every rule on an already decoded config.
pub fn validate(cfg: &NetworkConfig) -> Result<(), ConfigError> {
    let mut errs = Errors::default();
    validate_interface(&cfg.interface, "interface", &mut errs);
    validate_routes(&cfg.routes, &mut errs);
    if !cfg.rules.is_empty() {
        if cfg.interface.vrf.is_some() {
            errs.push("", "rules are not supported when VRF is enabled");
        } else {
            validate_rules(&cfg.rules, &mut errs);
        }
    }
    // ethtool: no static checks (names are checked against the NIC at prepare time).
    validate_neighbors(&cfg.neighbors, &mut errs);
    errs.finish()
}

/// Extra rules for a device without a netdev (RDMA-only): no interface, routes, rules, ethtool
/// or neighbours.
pub fn validate_rdma_only(cfg: &NetworkConfig) -> Result<(), ConfigError> {
    const NO_NETDEV: &str = "not supported for RDMA-only devices (no network interface present)";
    let mut errs = Errors::default();
    let i = &cfg.interface;
    if i.name.as_deref().is_some_and(|n| !n.is_empty())
        || !i.addresses.is_empty()
        || i.mtu.is_some()
        || i.hardware_addr.is_some()
        || i.dhcp.is_some()
        || i.gso_max_size.is_some()
        || i.gro_max_size.is_some()
        || i.gso_ipv4_max_size.is_some()
        || i.gro_ipv4_max_size.is_some()
        || i.disable_ebpf_programs.is_some()
        || i.arp_ignore.is_some()
        || i.arp_announce.is_some()
    {
        errs.push("", format!("interface configuration is {NO_NETDEV}"));
    }
    if !cfg.routes.is_empty() {
        errs.push("", format!("routes are {NO_NETDEV}"));
    }
    if !cfg.rules.is_empty() {
        errs.push("", format!("rules are {NO_NETDEV}"));
    }
    if cfg.ethtool.is_some() {
        errs.push("", format!("ethtool configuration is {NO_NETDEV}"));
    }
    if !cfg.neighbors.is_empty() {
        errs.push("", format!("neighbors are {NO_NETDEV}"));
    }
    errs.finish()
}

#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, problem: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            problem: problem.into(),
        });
    }

    fn finish(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid { errors: self.0 })
        }
    }
}

fn validate_ifname(name: &str, path: &str, errs: &mut Errors) {
    if name.is_empty() {
        return;
    }
    if name.len() > MAX_INTERFACE_NAME_LEN {
        errs.push(
            path,
            format!("name '{name}' exceeds maximum length of {MAX_INTERFACE_NAME_LEN} characters"),
        );
    }
    if name.contains('/') {
        errs.push(path, format!("name '{name}' cannot contain '/'"));
    }
    if name.chars().any(char::is_whitespace) {
        errs.push(path, format!("name '{name}' cannot contain whitespace"));
    }
    if name == "." || name == ".." {
        errs.push(path, format!("name '{name}' cannot be '.' or '..'"));
    }
    for c in name.chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/') || c.is_whitespace() {
            continue;
        }
        errs.push(
            path,
            format!(
                "name '{name}' contains invalid character '{c}'. Only letters, digits, '-', '_', '.' are recommended"
            ),
        );
    }
}

fn validate_interface(cfg: &InterfaceConfig, path: &str, errs: &mut Errors) {
    validate_ifname(cfg.name.as_deref().unwrap_or(""), &format!("{path}.name"), errs);
    for (i, addr) in cfg.addresses.iter().enumerate() {
        if let Err(why) = parse_prefix(addr) {
            errs.push(
                format!("{path}.addresses[{i}]"),
                format!("invalid IP CIDR format '{addr}': {why}"),
            );
        }
    }
    if cfg.dhcp == Some(true) && !cfg.addresses.is_empty() {
        errs.push(path, "dhcp and addresses are mutually exclusive");
    }
    if let Some(mtu) = cfg.mtu
        && mtu < MIN_MTU
    {
        errs.push(
            format!("{path}.mtu"),
            format!("must be at least {MIN_MTU}, got {mtu}"),
        );
    }
    if let Some(mac) = &cfg.hardware_addr {
        match mac_bytes(mac) {
            None => errs.push(
                format!("{path}.hardwareAddr"),
                format!("invalid Hardware Address format '{mac}'"),
            ),
            Some(b) => {
                if let Some(why) = not_a_station_address(&b) {
                    errs.push(
                        format!("{path}.hardwareAddr"),
                        format!("'{mac}' {why}: a device needs a unicast address"),
                    );
                }
            }
        }
    }
    for (field, value) in [
        ("gsoMaxSize", cfg.gso_max_size),
        ("groMaxSize", cfg.gro_max_size),
        ("gsoIPv4MaxSize", cfg.gso_ipv4_max_size),
        ("groIPv4MaxSize", cfg.gro_ipv4_max_size),
    ] {
        if let Some(v) = value.filter(|v| *v <= 0) {
            errs.push(format!("{path}.{field}"), format!("must be positive, got {v}"));
        }
    }
    if let Some(v) = cfg.arp_ignore
        && !matches!(v, 0..=3 | 8)
    {
        errs.push(
            format!("{path}.arpIgnore"),
            format!("must be one of 0, 1, 2, 3 or 8, got {v}"),
        );
    }
    if let Some(v) = cfg.arp_announce
        && !(0..=2).contains(&v)
    {
        errs.push(
            format!("{path}.arpAnnounce"),
            format!("must be between 0 and 2, got {v}"),
        );
    }
    if let Some(vrf) = &cfg.vrf {
        validate_vrf(vrf, &format!("{path}.vrf"), errs);
    }
}

fn validate_vrf(cfg: &VrfConfig, path: &str, errs: &mut Errors) {
    if cfg.name.is_empty() {
        errs.push(format!("{path}.name"), "cannot be empty");
    }
    if let Some(t) = cfg.table {
        if t <= 0 {
            errs.push(
                format!("{path}.table"),
                format!("must be a positive integer, got {t}"),
            );
        }
        if matches!(t, 253..=255) {
            errs.push(
                format!("{path}.table"),
                format!("cannot use reserved table ID {t}"),
            );
        }
    }
}

fn validate_routes(routes: &[RouteConfig], errs: &mut Errors) {
    for (i, r) in routes.iter().enumerate() {
        let p = format!("routes[{i}]");
        let mut dst = None;
        if r.destination.is_empty() {
            errs.push(format!("{p}.destination"), "cannot be empty");
        } else {
            match parse_prefix(&r.destination) {
                Ok((ip, _)) => dst = Some(ip),
                Err(_) => errs.push(
                    format!("{p}.destination"),
                    format!(
                        "invalid CIDR format '{}' (host routes use /32 or /128)",
                        r.destination
                    ),
                ),
            }
        }
        if r.scope != RT_SCOPE_UNIVERSE && r.scope != RT_SCOPE_LINK {
            errs.push(
                format!("{p}.scope"),
                format!(
                    "invalid scope '{}', only Link ({RT_SCOPE_LINK}) or Universe ({RT_SCOPE_UNIVERSE}) allowed",
                    r.scope
                ),
            );
        }
        if r.gateway.is_empty() {
            if r.scope != RT_SCOPE_LINK {
                errs.push(
                    format!("{p}.gateway"),
                    "must be specified for Universe scope routes",
                );
            }
        } else {
            check_ip_family(&r.gateway, dst, &r.destination, &format!("{p}.gateway"), errs);
        }
        if !r.source.is_empty() {
            check_ip_family(&r.source, dst, &r.destination, &format!("{p}.source"), errs);
        }
        if r.table < 0 {
            errs.push(
                format!("{p}.table"),
                format!("must be a non-negative integer, got {}", r.table),
            );
        }
    }
}

fn check_ip_family(value: &str, dst: Option<IpAddr>, dst_text: &str, path: &str, errs: &mut Errors) {
    match value.parse::<IpAddr>() {
        Err(_) => errs.push(path, format!("invalid IP address format '{value}'")),
        Ok(ip) => {
            if dst.is_some_and(|d| !same_family(d, ip)) {
                errs.push(
                    path,
                    format!("'{value}' must be the same IP family as destination '{dst_text}'"),
                );
            }
        }
    }
}

fn validate_rules(rules: &[RuleConfig], errs: &mut Errors) {
    for (i, r) in rules.iter().enumerate() {
        let p = format!("rules[{i}]");
        if !(0..=32767).contains(&r.priority) {
            errs.push(
                format!("{p}.priority"),
                format!("must be an integer between 0 and 32767, got {}", r.priority),
            );
        }
        if r.table < 0 {
            errs.push(
                format!("{p}.table"),
                format!("must be a non-negative integer, got {}", r.table),
            );
        }
        let mut cidr = |value: &str, field: &str| -> Option<IpAddr> {
            if value.is_empty() {
                return None;
            }
            match parse_prefix(value) {
                Ok((ip, _)) => Some(ip),
                Err(_) => {
                    errs.push(format!("{p}.{field}"), format!("invalid CIDR format '{value}'"));
                    None
                }
            }
        };
        let src = cidr(&r.source, "source");
        let dst = cidr(&r.destination, "destination");
        if let (Some(s), Some(d)) = (src, dst)
            && !same_family(s, d)
        {
            errs.push(
                p,
                format!(
                    "source '{}' and destination '{}' must be the same IP family",
                    r.source, r.destination
                ),
            );
        }
    }
}

fn validate_neighbors(neighbors: &[NeighborConfig], errs: &mut Errors) {
    for (i, n) in neighbors.iter().enumerate() {
        let p = format!("neighbors[{i}]");
        if n.destination.is_empty() {
            errs.push(format!("{p}.destination"), "cannot be empty");
        } else if n.destination.parse::<IpAddr>().is_err() {
            errs.push(
                format!("{p}.destination"),
                format!("invalid IP address format '{}'", n.destination),
            );
        }
        if n.hardware_addr.is_empty() {
            errs.push(format!("{p}.hardwareAddr"), "cannot be empty");
        } else if !is_valid_mac(&n.hardware_addr) {
            errs.push(
                format!("{p}.hardwareAddr"),
                format!("invalid Hardware Address format '{}'", n.hardware_addr),
            );
        }
    }
}

/// IPv4 and IPv4-mapped IPv6 count as one family (Go's `To4() != nil`).
fn same_family(a: IpAddr, b: IpAddr) -> bool {
    is_v4(a) == is_v4(b)
}

fn is_v4(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some(),
    }
}

/// `addr/bits` as Go's `netip.ParsePrefix`: a literal address (no zone), decimal bits without
/// sign or leading zeros, at most 32 or 128. Host bits may be set.
fn parse_prefix(s: &str) -> Result<(IpAddr, u8), &'static str> {
    let (addr, bits) = s.split_once('/').ok_or("no '/'")?;
    let ip: IpAddr = addr.parse().map_err(|_| "bad address")?;
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err("bad bits");
    }
    let bits: u8 = bits.parse().map_err(|_| "bad bits")?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err("prefix length out of range");
    }
    Ok((ip, bits))
}

/// A MAC as Go's `net.ParseMAC` accepts it: 6, 8 or 20 octets written as `xx:xx:…`, `xx-xx-…`
/// or `xxxx.xxxx.…`.
#[must_use]
pub fn is_valid_mac(s: &str) -> bool {
    mac_bytes(s).is_some()
}

/// The octets of a MAC in any form Go's `net.ParseMAC` accepts (`xx:xx:…`, `xx-xx-…`,
/// `xxxx.xxxx.…`; 6, 8 or 20 octets), or `None`. MACs are compared as these bytes, never as
/// strings: `AA-BB-…`, `aa:bb:…` and `aabb.…` are one address.
#[must_use]
pub fn mac_bytes(s: &str) -> Option<Vec<u8>> {
    crate::mac::Mac::parse(s).map(|m| m.as_bytes().to_vec())
}

/// Why `mac` cannot be a device's own address, if it cannot: all zeros, broadcast, or (for
/// EUI-48/EUI-64) a group address (the I/G bit, the low bit of the first octet).
#[must_use]
pub fn not_a_station_address(mac: &[u8]) -> Option<&'static str> {
    if mac.iter().all(|b| *b == 0) {
        Some("is all zeros")
    } else if mac.iter().all(|b| *b == 0xff) {
        Some("is the broadcast address")
    } else if mac.len() != 20 && mac.first().is_some_and(|b| b & 1 == 1) {
        Some("is a multicast address")
    } else {
        None
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod table;
