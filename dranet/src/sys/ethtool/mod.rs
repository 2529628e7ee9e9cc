// Over 500 lines: one generic-netlink protocol: request builders, reply decoders and the feature table belong together.
//! ethtool over generic netlink (fenced: touches the kernel): a device's offload features
//! (`ETHTOOL_MSG_FEATURES_GET`/`_SET`) and private flags (`ETHTOOL_MSG_PRIVFLAGS_GET`/`_SET`),
//! by name, plus the name rules of ethtool(8) ([`resolve_feature`]).
//!
//! No crate speaks ethtool netlink, so the messages are built here byte by byte with the
//! numbers of the kernel uapi (`include/uapi/linux/ethtool_netlink*.h`, `genetlink.h`; stable
//! since 5.6): the family id comes from `CTRL_CMD_GETFAMILY "ethtool"`; every request carries a
//! nested `*_HEADER` naming the device (by index or name); bitsets are requested and sent in
//! the verbose form (a nest of bits, each with its name and a value flag) so the kernel does
//! the name lookup. Nested attributes carry `NLA_F_NESTED` (ethtool validates strictly).
//!
//! An [`Ethtool`] socket belongs to the netns it was opened in, whichever thread uses it later:
//! [`Ethtool::open`] for the driver's own (host) netns, [`Ethtool::open_in`] for a pod netns
//! (opened on a throw-away thread inside it, [`crate::sys::netns::socket_in`]; no tokio worker ever
//! `setns`es). Calls are blocking but short: generic netlink runs the request inside
//! `sendmsg`, so the reply is queued before `recv` is called (a receive timeout guards anyway).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{FromRawFd, IntoRawFd};

use crate::sys::netns::{Netns, NetnsError};

/// `NETLINK_GENERIC`.
pub const NETLINK_GENERIC: isize = 16;
/// `GENL_ID_CTRL`: the generic netlink controller's message type.
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `ETHTOOL_GENL_NAME` / `ETHTOOL_GENL_VERSION`.
pub const ETHTOOL_GENL_NAME: &str = "ethtool";
pub const ETHTOOL_GENL_VERSION: u8 = 1;

pub const ETHTOOL_MSG_FEATURES_GET: u8 = 11;
pub const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
pub const ETHTOOL_MSG_PRIVFLAGS_GET: u8 = 13;
pub const ETHTOOL_MSG_PRIVFLAGS_SET: u8 = 14;
/// Kernel → user replies.
pub const ETHTOOL_MSG_FEATURES_GET_REPLY: u8 = 11;
pub const ETHTOOL_MSG_PRIVFLAGS_GET_REPLY: u8 = 14;

pub const ETHTOOL_A_HEADER_DEV_INDEX: u16 = 1;
pub const ETHTOOL_A_HEADER_DEV_NAME: u16 = 2;
pub const ETHTOOL_A_HEADER_FLAGS: u16 = 3;
/// `ETHTOOL_FLAG_OMIT_REPLY`: no `*_SET_REPLY` (we read back with a GET instead).
pub const ETHTOOL_FLAG_OMIT_REPLY: u32 = 1 << 1;

pub const ETHTOOL_A_BITSET_NOMASK: u16 = 1;
pub const ETHTOOL_A_BITSET_SIZE: u16 = 2;
pub const ETHTOOL_A_BITSET_BITS: u16 = 3;
pub const ETHTOOL_A_BITSET_VALUE: u16 = 4;
pub const ETHTOOL_A_BITSET_MASK: u16 = 5;
pub const ETHTOOL_A_BITSET_BITS_BIT: u16 = 1;
pub const ETHTOOL_A_BITSET_BIT_INDEX: u16 = 1;
pub const ETHTOOL_A_BITSET_BIT_NAME: u16 = 2;
pub const ETHTOOL_A_BITSET_BIT_VALUE: u16 = 3;

pub const ETHTOOL_A_FEATURES_HEADER: u16 = 1;
pub const ETHTOOL_A_FEATURES_HW: u16 = 2;
pub const ETHTOOL_A_FEATURES_WANTED: u16 = 3;
pub const ETHTOOL_A_FEATURES_ACTIVE: u16 = 4;
pub const ETHTOOL_A_FEATURES_NOCHANGE: u16 = 5;
pub const ETHTOOL_A_PRIVFLAGS_HEADER: u16 = 1;
pub const ETHTOOL_A_PRIVFLAGS_FLAGS: u16 = 2;

/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    #[error("generic netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("the kernel has no ethtool netlink family")]
    NoFamily,
    #[error("decoding an ethtool netlink reply: {0}")]
    Decode(String),
    #[error("ethtool {what} on {dev}: kernel error {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Kernel {
        what: &'static str,
        dev: String,
        errno: i32,
    },
    #[error("ethtool {what} on {dev}: no reply")]
    NoReply { what: &'static str, dev: String },
    #[error("{dev}: {kind} {name:?} is {got} after setting it {want}")]
    NotApplied {
        dev: String,
        kind: &'static str,
        name: String,
        want: bool,
        got: bool,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Appends one attribute (`len u16, type u16, value`, padded to 4).
fn put(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
    buf.extend_from_slice(&len.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    pad(buf);
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

fn put_str(buf: &mut Vec<u8>, kind: u16, s: &str) {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    put(buf, kind, &v);
}

/// Appends a nest (with `NLA_F_NESTED`) whose contents `f` writes.
fn nest(buf: &mut Vec<u8>, kind: u16, f: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    f(buf);
    let len = u16::try_from(buf.len() - start).unwrap_or(u16::MAX);
    if let Some(b) = buf.get_mut(start..start + 2) {
        b.copy_from_slice(&len.to_ne_bytes());
    }
}

/// A whole generic netlink request: nlmsghdr + genlmsghdr (cmd, version, reserved) + `attrs`.
#[must_use]
pub fn request(family: u16, cmd: u8, version: u8, seq: u32, attrs: &[u8]) -> Vec<u8> {
    let len = u32::try_from(16 + 4 + attrs.len()).unwrap_or(u32::MAX);
    let mut v = Vec::with_capacity(20 + attrs.len());
    v.extend_from_slice(&len.to_ne_bytes());
    v.extend_from_slice(&family.to_ne_bytes());
    v.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(&[cmd, version, 0, 0]);
    v.extend_from_slice(attrs);
    v
}

/// `CTRL_CMD_GETFAMILY` for `name`.
#[must_use]
pub fn get_family(seq: u32, name: &str) -> Vec<u8> {
    let mut a = Vec::new();
    put_str(&mut a, CTRL_ATTR_FAMILY_NAME, name);
    request(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, seq, &a)
}

/// Which device a request is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dev {
    Index(u32),
    Name(String),
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Index(i) => write!(f, "ifindex {i}"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

fn header(buf: &mut Vec<u8>, kind: u16, dev: &Dev, flags: u32) {
    nest(buf, kind, |b| {
        match dev {
            Dev::Index(i) => put(b, ETHTOOL_A_HEADER_DEV_INDEX, &i.to_ne_bytes()),
            Dev::Name(n) => put_str(b, ETHTOOL_A_HEADER_DEV_NAME, n),
        }
        if flags != 0 {
            put(b, ETHTOOL_A_HEADER_FLAGS, &flags.to_ne_bytes());
        }
    });
}

/// A verbose bitset that changes only the named bits (no `NOMASK`): each bit by name, with
/// `VALUE` when it is to be set.
fn bitset_by_name(buf: &mut Vec<u8>, kind: u16, bits: &BTreeMap<String, bool>) {
    nest(buf, kind, |b| {
        nest(b, ETHTOOL_A_BITSET_BITS, |b| {
            for (name, on) in bits {
                nest(b, ETHTOOL_A_BITSET_BITS_BIT, |b| {
                    put_str(b, ETHTOOL_A_BITSET_BIT_NAME, name);
                    if *on {
                        put(b, ETHTOOL_A_BITSET_BIT_VALUE, &[]);
                    }
                });
            }
        });
    });
}

/// `ETHTOOL_MSG_FEATURES_GET` (verbose bitsets: names included).
#[must_use]
pub fn features_get(family: u16, seq: u32, dev: &Dev) -> Vec<u8> {
    let mut a = Vec::new();
    header(&mut a, ETHTOOL_A_FEATURES_HEADER, dev, 0);
    request(family, ETHTOOL_MSG_FEATURES_GET, ETHTOOL_GENL_VERSION, seq, &a)
}

/// `ETHTOOL_MSG_FEATURES_SET`: `wanted` bits by name, only those (value + implicit mask).
#[must_use]
pub fn features_set(family: u16, seq: u32, dev: &Dev, wanted: &BTreeMap<String, bool>) -> Vec<u8> {
    let mut a = Vec::new();
    header(&mut a, ETHTOOL_A_FEATURES_HEADER, dev, ETHTOOL_FLAG_OMIT_REPLY);
    bitset_by_name(&mut a, ETHTOOL_A_FEATURES_WANTED, wanted);
    request(family, ETHTOOL_MSG_FEATURES_SET, ETHTOOL_GENL_VERSION, seq, &a)
}

/// `ETHTOOL_MSG_PRIVFLAGS_GET`.
#[must_use]
pub fn privflags_get(family: u16, seq: u32, dev: &Dev) -> Vec<u8> {
    let mut a = Vec::new();
    header(&mut a, ETHTOOL_A_PRIVFLAGS_HEADER, dev, 0);
    request(family, ETHTOOL_MSG_PRIVFLAGS_GET, ETHTOOL_GENL_VERSION, seq, &a)
}

/// `ETHTOOL_MSG_PRIVFLAGS_SET`: `flags` by name, only those.
#[must_use]
pub fn privflags_set(family: u16, seq: u32, dev: &Dev, flags: &BTreeMap<String, bool>) -> Vec<u8> {
    let mut a = Vec::new();
    header(&mut a, ETHTOOL_A_PRIVFLAGS_HEADER, dev, ETHTOOL_FLAG_OMIT_REPLY);
    bitset_by_name(&mut a, ETHTOOL_A_PRIVFLAGS_FLAGS, flags);
    request(family, ETHTOOL_MSG_PRIVFLAGS_SET, ETHTOOL_GENL_VERSION, seq, &a)
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// The attributes in `buf` as (type without flags, value).
fn attrs(mut buf: &[u8]) -> Result<Vec<(u16, &[u8])>, EthtoolError> {
    let mut out = Vec::new();
    while buf.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return Err(EthtoolError::Decode(format!(
                "attribute length {len} in {} bytes",
                buf.len()
            )));
        }
        out.push((kind, &buf[4..len]));
        buf = buf.get((len + 3) & !3..).unwrap_or_default();
    }
    Ok(out)
}

fn u32_of(v: &[u8]) -> Result<u32, EthtoolError> {
    v.get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_ne_bytes)
        .ok_or_else(|| EthtoolError::Decode("short u32".into()))
}

fn str_of(v: &[u8]) -> Result<String, EthtoolError> {
    let end = v.iter().position(|b| *b == 0).unwrap_or(v.len());
    std::str::from_utf8(&v[..end])
        .map(str::to_owned)
        .map_err(|_| EthtoolError::Decode("name is not UTF-8".into()))
}

/// One bit of a verbose bitset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bit {
    pub index: u32,
    pub name: String,
    pub value: bool,
}

/// A decoded verbose bitset: the listed bits with their values. With `NOMASK` (a plain list)
/// only the set bits are listed and each is `value: true`.
pub fn decode_bitset(v: &[u8]) -> Result<Vec<Bit>, EthtoolError> {
    let top = attrs(v)?;
    let nomask = top.iter().any(|(k, _)| *k == ETHTOOL_A_BITSET_NOMASK);
    if top
        .iter()
        .any(|(k, _)| *k == ETHTOOL_A_BITSET_VALUE || *k == ETHTOOL_A_BITSET_MASK)
    {
        return Err(EthtoolError::Decode(
            "compact bitset (no names) where a verbose one was asked for".into(),
        ));
    }
    let mut out = Vec::new();
    for (_, bits) in top.iter().filter(|(k, _)| *k == ETHTOOL_A_BITSET_BITS) {
        for (_, bit) in attrs(bits)?
            .into_iter()
            .filter(|(k, _)| *k == ETHTOOL_A_BITSET_BITS_BIT)
        {
            let mut b = Bit {
                index: 0,
                name: String::new(),
                value: nomask,
            };
            for (k, val) in attrs(bit)? {
                match k {
                    ETHTOOL_A_BITSET_BIT_INDEX => b.index = u32_of(val)?,
                    ETHTOOL_A_BITSET_BIT_NAME => b.name = str_of(val)?,
                    ETHTOOL_A_BITSET_BIT_VALUE => b.value = true,
                    _ => {}
                }
            }
            if !b.name.is_empty() {
                out.push(b);
            }
        }
    }
    Ok(out)
}

/// One reply of a request: a message (its genetlink command and attributes) or an ACK/error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Message { cmd: u8, attrs: Vec<u8> },
    Ack { errno: Option<i32> },
    Done,
}

/// Decodes every netlink message in one datagram.
pub fn decode(mut buf: &[u8]) -> Result<Vec<Reply>, EthtoolError> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = usize::try_from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]])).unwrap_or(usize::MAX);
        if len < 16 || len > buf.len() {
            return Err(EthtoolError::Decode(format!(
                "message length {len} in {} bytes",
                buf.len()
            )));
        }
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        let body = &buf[16..len];
        match ty {
            NLMSG_ERROR => {
                let code = body
                    .get(..4)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map(i32::from_ne_bytes)
                    .ok_or_else(|| EthtoolError::Decode("short NLMSG_ERROR".into()))?;
                // Saturating: a garbage i32::MIN must not overflow (found by fuzzing).
                out.push(Reply::Ack {
                    errno: (code != 0).then_some(code.saturating_neg()),
                });
            }
            NLMSG_DONE => out.push(Reply::Done),
            t if t < 0x10 => {}
            _ => {
                let cmd = *body
                    .first()
                    .ok_or_else(|| EthtoolError::Decode("no genetlink header".into()))?;
                out.push(Reply::Message {
                    cmd,
                    attrs: body.get(4..).unwrap_or_default().to_vec(),
                });
            }
        }
        buf = buf.get((len + 3) & !3..).unwrap_or_default();
    }
    Ok(out)
}

/// The family id in a `CTRL_CMD_GETFAMILY` reply.
pub fn family_of(replies: &[Reply]) -> Result<Option<u16>, EthtoolError> {
    for r in replies {
        if let Reply::Message { attrs: a, .. } = r {
            for (k, v) in attrs(a)? {
                if k == CTRL_ATTR_FAMILY_ID {
                    let b = v
                        .get(..2)
                        .and_then(|b| <[u8; 2]>::try_from(b).ok())
                        .ok_or_else(|| EthtoolError::Decode("short family id".into()))?;
                    return Ok(Some(u16::from_ne_bytes(b)));
                }
            }
        }
    }
    Ok(None)
}

/// A device's offload features (`ethtool -k`), by kernel name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// Every feature name the kernel knows, with whether the device lists it as changeable
    /// (`hw_features`).
    pub hw: BTreeMap<String, bool>,
    /// `wanted_features`: what was asked for.
    pub wanted: BTreeSet<String>,
    /// `features`: what is on.
    pub active: BTreeSet<String>,
    /// Never changeable (`NETIF_F_NEVER_CHANGE`).
    pub nochange: BTreeSet<String>,
}

impl Features {
    /// Decodes a `FEATURES_GET_REPLY`'s attributes.
    pub fn decode(a: &[u8]) -> Result<Self, EthtoolError> {
        let mut f = Self::default();
        let names = |v: &[u8]| -> Result<BTreeSet<String>, EthtoolError> {
            Ok(decode_bitset(v)?
                .into_iter()
                .filter(|b| b.value)
                .map(|b| b.name)
                .collect())
        };
        for (k, v) in attrs(a)? {
            match k {
                ETHTOOL_A_FEATURES_HW => {
                    f.hw = decode_bitset(v)?.into_iter().map(|b| (b.name, b.value)).collect();
                }
                ETHTOOL_A_FEATURES_WANTED => f.wanted = names(v)?,
                ETHTOOL_A_FEATURES_ACTIVE => f.active = names(v)?,
                ETHTOOL_A_FEATURES_NOCHANGE => f.nochange = names(v)?,
                _ => {}
            }
        }
        Ok(f)
    }

    /// Whether the kernel knows a feature of this name.
    #[must_use]
    pub fn knows(&self, name: &str) -> bool {
        self.hw.contains_key(name)
    }

    /// ethtool(8)'s "not `[fixed]`": in `hw_features` and not never-change.
    #[must_use]
    pub fn changeable(&self, name: &str) -> bool {
        self.hw.get(name).copied().unwrap_or(false) && !self.nochange.contains(name)
    }

    /// The wanted state of every changeable feature: what a restore puts back.
    #[must_use]
    pub fn changeable_wanted(&self) -> BTreeMap<String, bool> {
        self.hw
            .keys()
            .filter(|n| self.changeable(n))
            .map(|n| (n.clone(), self.wanted.contains(n)))
            .collect()
    }
}

/// Decodes a `PRIVFLAGS_GET_REPLY`'s attributes: every private flag with its value.
pub fn decode_privflags(a: &[u8]) -> Result<BTreeMap<String, bool>, EthtoolError> {
    let mut out = BTreeMap::new();
    for (k, v) in attrs(a)? {
        if k == ETHTOOL_A_PRIVFLAGS_FLAGS {
            out.extend(decode_bitset(v)?.into_iter().map(|b| (b.name, b.value)));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Names

/// ethtool(8)'s legacy offload names (`off_flag_def` in ethtool's `common.c`): short and long
/// name → the kernel feature names they stand for (a `*` matches any run of characters).
const LEGACY: &[(&str, &str, &str)] = &[
    ("rx", "rx-checksumming", "rx-checksum"),
    ("tx", "tx-checksumming", "tx-checksum-*"),
    ("sg", "scatter-gather", "tx-scatter-gather*"),
    ("tso", "tcp-segmentation-offload", "tx-tcp*-segmentation"),
    ("ufo", "udp-fragmentation-offload", "tx-udp-fragmentation"),
    ("gso", "generic-segmentation-offload", "tx-generic-segmentation"),
    ("gro", "generic-receive-offload", "rx-gro"),
    ("lro", "large-receive-offload", "rx-lro"),
    ("rxvlan", "rx-vlan-offload", "rx-vlan-hw-parse"),
    ("txvlan", "tx-vlan-offload", "tx-vlan-hw-insert"),
    ("ntuple", "ntuple-filters", "rx-ntuple-filter"),
    ("rxhash", "receive-hashing", "rx-hashing"),
];

/// Shell-style match with `*` only.
fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, rest)) => {
            let Some(tail) = s.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

/// Why a requested feature cannot be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameProblem {
    /// Neither a kernel feature name nor an ethtool(8) alias of one.
    Unknown,
    /// Fixed on this device (`[fixed]` in `ethtool -k`) and asked to change.
    Fixed { feature: String, is: bool },
}

impl std::fmt::Display for NameProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown => f.write_str(
                "unknown feature: neither a kernel feature name of this device nor an ethtool alias",
            ),
            Self::Fixed { feature, is } => write!(
                f,
                "feature {feature} is fixed on this device ({}) and cannot be changed",
                if *is { "on" } else { "off" }
            ),
        }
    }
}

/// The kernel features that `name` = `on` sets on a device with `f`: a kernel name stands for
/// itself; an ethtool(8) alias (`tso`, `generic-receive-offload`, …) for every kernel feature
/// its pattern matches. Fixed features already in the asked state are left out (nothing to
/// do); a fixed feature asked to change is an error, except under an alias that also matches
/// changeable features (ethtool(8) skips the fixed ones there too).
pub fn resolve_feature(f: &Features, name: &str, on: bool) -> Result<BTreeMap<String, bool>, NameProblem> {
    let matched: Vec<&String> = if f.knows(name) {
        f.hw.keys().filter(|k| k.as_str() == name).collect()
    } else {
        let Some((_, _, pattern)) = LEGACY.iter().find(|(s, l, _)| *s == name || *l == name) else {
            return Err(NameProblem::Unknown);
        };
        f.hw.keys().filter(|k| glob(pattern, k)).collect()
    };
    if matched.is_empty() {
        return Err(NameProblem::Unknown);
    }
    let any_changeable = matched.iter().any(|k| f.changeable(k));
    let mut out = BTreeMap::new();
    for k in matched {
        if f.changeable(k) {
            out.insert(k.clone(), on);
        } else if f.active.contains(k) != on && !any_changeable {
            return Err(NameProblem::Fixed {
                feature: k.clone(),
                is: f.active.contains(k),
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// The socket

/// The ethtool family's id, once resolved. The kernel registers the family at boot (it is
/// built in, never unregistered) and generic netlink ids are the same in every netns, so every
/// later socket skips the lookup: a round trip and the decode of the family's op list, twice
/// per device brought home.
static FAMILY: std::sync::OnceLock<u16> = std::sync::OnceLock::new();

/// A blocking generic netlink socket with the ethtool family resolved, bound to one netns.
pub struct Ethtool {
    sock: netlink_sys::Socket,
    family: u16,
    seq: u32,
}

impl Ethtool {
    /// In the calling thread's netns (the driver's: the host).
    pub fn open() -> Result<Self, EthtoolError> {
        let sock = netlink_sys::Socket::new(NETLINK_GENERIC).map_err(EthtoolError::Socket)?;
        Self::with_socket(sock)
    }

    /// Inside `netns` (the socket is created on a thread inside it).
    pub fn open_in(netns: &Netns) -> Result<Self, EthtoolError> {
        let fd = crate::sys::netns::socket_in(netns, NETLINK_GENERIC)?.map_err(EthtoolError::Socket)?;
        let raw = fd.into_raw_fd();
        // SAFETY: `raw` is an owned netlink socket just released from its OwnedFd; the Socket
        // takes over its ownership and closes it on drop.
        let sock = unsafe { netlink_sys::Socket::from_raw_fd(raw) };
        sock.set_non_blocking(false).map_err(EthtoolError::Socket)?;
        Self::with_socket(sock)
    }

    fn with_socket(sock: netlink_sys::Socket) -> Result<Self, EthtoolError> {
        set_rcv_timeout(&sock, 5).map_err(EthtoolError::Socket)?;
        let mut me = Self {
            sock,
            family: FAMILY.get().copied().unwrap_or(0),
            seq: 0,
        };
        if me.family != 0 {
            return Ok(me);
        }
        let replies = me
            .call("family lookup", &Dev::Name(ETHTOOL_GENL_NAME.into()), |seq, _| {
                get_family(seq, ETHTOOL_GENL_NAME)
            })
            .map_err(|e| match e {
                EthtoolError::Kernel { errno, .. } if errno == libc::ENOENT => EthtoolError::NoFamily,
                e => e,
            })?;
        me.family = family_of(&replies)?.ok_or(EthtoolError::NoFamily)?;
        let _ = FAMILY.set(me.family);
        Ok(me)
    }

    fn call(
        &mut self,
        what: &'static str,
        dev: &Dev,
        req: impl FnOnce(u32, u16) -> Vec<u8>,
    ) -> Result<Vec<Reply>, EthtoolError> {
        self.seq = self.seq.wrapping_add(1);
        let bytes = req(self.seq, self.family);
        let kernel = netlink_sys::SocketAddr::new(0, 0);
        self.sock
            .send_to(&bytes, &kernel, 0)
            .map_err(EthtoolError::Socket)?;
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self
                .sock
                .recv(&mut &mut buf[..], 0)
                .map_err(EthtoolError::Socket)?;
            for r in decode(buf.get(..n).unwrap_or_default())? {
                match r {
                    Reply::Ack { errno: Some(errno) } => {
                        return Err(EthtoolError::Kernel {
                            what,
                            dev: dev.to_string(),
                            errno,
                        });
                    }
                    Reply::Ack { errno: None } | Reply::Done => return Ok(all),
                    m @ Reply::Message { .. } => all.push(m),
                }
            }
        }
    }

    fn reply_attrs(
        &mut self,
        what: &'static str,
        dev: &Dev,
        req: impl FnOnce(u32, u16) -> Vec<u8>,
    ) -> Result<Vec<u8>, EthtoolError> {
        self.call(what, dev, req)?
            .into_iter()
            .find_map(|r| match r {
                Reply::Message { attrs, .. } => Some(attrs),
                _ => None,
            })
            .ok_or_else(|| EthtoolError::NoReply {
                what,
                dev: dev.to_string(),
            })
    }

    /// The device's features.
    pub fn features(&mut self, dev: &Dev) -> Result<Features, EthtoolError> {
        let a = self.reply_attrs("features get", dev, |seq, fam| features_get(fam, seq, dev))?;
        Features::decode(&a)
    }

    /// The device's private flags; empty when its driver has none (`EOPNOTSUPP`).
    pub fn private_flags(&mut self, dev: &Dev) -> Result<BTreeMap<String, bool>, EthtoolError> {
        match self.reply_attrs("private flags get", dev, |seq, fam| privflags_get(fam, seq, dev)) {
            Ok(a) => decode_privflags(&a),
            Err(EthtoolError::Kernel { errno, .. }) if errno == libc::EOPNOTSUPP => Ok(BTreeMap::new()),
            Err(e) => Err(e),
        }
    }

    /// Sets the wanted state of the named kernel features (nothing else changes).
    pub fn set_features(&mut self, dev: &Dev, wanted: &BTreeMap<String, bool>) -> Result<(), EthtoolError> {
        if wanted.is_empty() {
            return Ok(());
        }
        self.call("features set", dev, |seq, fam| {
            features_set(fam, seq, dev, wanted)
        })
        .map(|_| ())
    }

    /// Sets the named private flags (nothing else changes).
    pub fn set_private_flags(
        &mut self,
        dev: &Dev,
        flags: &BTreeMap<String, bool>,
    ) -> Result<(), EthtoolError> {
        if flags.is_empty() {
            return Ok(());
        }
        self.call("private flags set", dev, |seq, fam| {
            privflags_set(fam, seq, dev, flags)
        })
        .map(|_| ())
    }

    /// Applies a pod's request: sets the features and flags, then reads them back; a feature
    /// that is not on (off) as asked afterwards — a kernel dependency refused it — is an error.
    pub fn apply(
        &mut self,
        dev: &Dev,
        features: &BTreeMap<String, bool>,
        flags: &BTreeMap<String, bool>,
    ) -> Result<(), EthtoolError> {
        if !features.is_empty() {
            self.set_features(dev, features)?;
            let now = self.features(dev)?;
            for (name, want) in features {
                let got = now.active.contains(name);
                if got != *want {
                    return Err(EthtoolError::NotApplied {
                        dev: dev.to_string(),
                        kind: "feature",
                        name: name.clone(),
                        want: *want,
                        got,
                    });
                }
            }
        }
        if !flags.is_empty() {
            self.set_private_flags(dev, flags)?;
            let now = self.private_flags(dev)?;
            for (name, want) in flags {
                let got = now.get(name).copied().unwrap_or(false);
                if got != *want {
                    return Err(EthtoolError::NotApplied {
                        dev: dev.to_string(),
                        kind: "private flag",
                        name: name.clone(),
                        want: *want,
                        got,
                    });
                }
            }
        }
        Ok(())
    }

    /// Puts back a snapshot: every changeable feature whose wanted state differs from
    /// `features`, and every private flag that differs from `flags` (whoever changed them).
    /// Returns what it changed.
    pub fn restore(
        &mut self,
        dev: &Dev,
        features: &BTreeMap<String, bool>,
        flags: &BTreeMap<String, bool>,
    ) -> Result<Restored, EthtoolError> {
        self.restore_from(dev, None, features, flags)
    }

    /// [`Ethtool::restore`] from the device's features as read just before (`now`; `None`:
    /// read them here).
    pub fn restore_from(
        &mut self,
        dev: &Dev,
        now: Option<Features>,
        features: &BTreeMap<String, bool>,
        flags: &BTreeMap<String, bool>,
    ) -> Result<Restored, EthtoolError> {
        let mut done = Restored::default();
        if !features.is_empty() {
            let now = match now {
                Some(n) => n,
                None => self.features(dev)?,
            };
            done.features = features
                .iter()
                .filter(|(n, want)| now.changeable(n) && now.wanted.contains(n.as_str()) != **want)
                .map(|(n, w)| (n.clone(), *w))
                .collect();
            self.set_features(dev, &done.features)?;
            if !done.features.is_empty() {
                let after = self.features(dev)?;
                if let Some((n, w)) = done
                    .features
                    .iter()
                    .find(|(n, w)| after.wanted.contains(n.as_str()) != **w)
                {
                    return Err(EthtoolError::NotApplied {
                        dev: dev.to_string(),
                        kind: "feature",
                        name: n.clone(),
                        want: *w,
                        got: !*w,
                    });
                }
            }
        }
        if !flags.is_empty() {
            let now = self.private_flags(dev)?;
            done.private_flags = flags
                .iter()
                .filter(|(n, want)| now.get(n.as_str()).is_some_and(|v| v != *want))
                .map(|(n, w)| (n.clone(), *w))
                .collect();
            self.set_private_flags(dev, &done.private_flags)?;
        }
        Ok(done)
    }
}

/// What a [`Ethtool::restore`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub features: BTreeMap<String, bool>,
    pub private_flags: BTreeMap<String, bool>,
}

/// Bounds every blocking receive on `sock` to `secs` seconds (then `EAGAIN`).
pub(crate) fn set_rcv_timeout(sock: &netlink_sys::Socket, secs: libc::time_t) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: secs,
        tv_usec: 0,
    };
    // SAFETY: SO_RCVTIMEO reads a `timeval` of the given size from a live local; the fd is an
    // open socket owned by `sock`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>()).unwrap_or(16),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
