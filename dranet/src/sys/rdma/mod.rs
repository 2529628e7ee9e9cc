//! RDMA links over NETLINK_RDMA (fenced: touches the kernel). No crate speaks it, so the
//! messages are built here on netlink-packet-core, with the numbers of the kernel uapi
//! (`include/uapi/rdma/rdma_netlink.h`, identical from 6.1 to 7.3):
//!
//! * the netns mode: `RDMA_NLDEV_CMD_SYS_GET` → `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (0 = exclusive);
//! * the devices: `RDMA_NLDEV_CMD_GET` dump → `DEV_INDEX`, `DEV_NAME`;
//! * a move: `RDMA_NLDEV_CMD_SET` with `DEV_INDEX` + `RDMA_NLDEV_NET_NS_FD`. The kernel looks the
//!   device up in the *socket's* netns and moves it from the *calling thread's* netns, so both
//!   must be the source netns: [`move_device`] runs on a thread inside it
//!   ([`crate::sys::netns::in_netns`]).
//!
//! RDMA messages carry no family header: attributes follow the netlink header directly.

use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{
    DecodeError, DefaultNla, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, NetlinkSerializable, Nla, NlaBuffer, NlasIterator, parse_string,
    parse_u8, parse_u32,
};

use crate::sys::netns::{Netns, NetnsError};

mod ops;
pub use ops::{KernelRdma, RdmaOps};

/// `NETLINK_RDMA`.
pub const NETLINK_RDMA: isize = 20;
/// `RDMA_NL_NLDEV`.
pub const RDMA_NL_NLDEV: u16 = 5;
pub const RDMA_NLDEV_CMD_GET: u16 = 1;
pub const RDMA_NLDEV_CMD_SET: u16 = 2;
pub const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
pub const RDMA_NLDEV_CMD_SYS_SET: u16 = 7;
pub const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1;
pub const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2;
pub const RDMA_NLDEV_ATTR_NDEV_INDEX: u16 = 50;
pub const RDMA_NLDEV_ATTR_NDEV_NAME: u16 = 51;
pub const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66;
pub const RDMA_NLDEV_NET_NS_FD: u16 = 68;

/// `RDMA_NL_GET_TYPE(client, op)`.
#[must_use]
pub const fn nl_type(cmd: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + cmd
}

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("NETLINK_RDMA socket")]
    Socket(#[source] std::io::Error),
    #[error("the kernel has no RDMA netlink (no ib_core loaded?)")]
    NoRdma,
    #[error("decoding an RDMA netlink reply: {0}")]
    Decode(String),
    #[error("RDMA {what}: kernel error {errno} ({})", std::io::Error::from_raw_os_error(*errno))]
    Kernel { what: &'static str, errno: i32 },
    #[error("RDMA device {0:?} not found in the source netns")]
    NotFound(String),
    #[error("the RDMA subsystem is in shared netns mode: devices cannot move (set ib_core netns_mode=0)")]
    SharedMode,
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// One attribute of an RDMA nldev message (those dranet uses; the rest kept raw).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdmaAttr {
    DevIndex(u32),
    DevName(String),
    NdevIndex(u32),
    NdevName(String),
    NetnsMode(u8),
    NetNsFd(u32),
    Other(DefaultNla),
}

impl Nla for RdmaAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::DevIndex(_) | Self::NdevIndex(_) | Self::NetNsFd(_) => 4,
            Self::DevName(s) | Self::NdevName(s) => s.len() + 1,
            Self::NetnsMode(_) => 1,
            Self::Other(n) => n.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::DevIndex(_) => RDMA_NLDEV_ATTR_DEV_INDEX,
            Self::DevName(_) => RDMA_NLDEV_ATTR_DEV_NAME,
            Self::NdevIndex(_) => RDMA_NLDEV_ATTR_NDEV_INDEX,
            Self::NdevName(_) => RDMA_NLDEV_ATTR_NDEV_NAME,
            Self::NetnsMode(_) => RDMA_NLDEV_SYS_ATTR_NETNS_MODE,
            Self::NetNsFd(_) => RDMA_NLDEV_NET_NS_FD,
            Self::Other(n) => n.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            Self::DevIndex(v) | Self::NdevIndex(v) | Self::NetNsFd(v) => {
                if let Some(b) = buf.get_mut(..4) {
                    b.copy_from_slice(&v.to_ne_bytes());
                }
            }
            Self::DevName(s) | Self::NdevName(s) => {
                if let Some(b) = buf.get_mut(..s.len()) {
                    b.copy_from_slice(s.as_bytes());
                }
                if let Some(z) = buf.get_mut(s.len()) {
                    *z = 0;
                }
            }
            Self::NetnsMode(v) => {
                if let Some(b) = buf.first_mut() {
                    *b = *v;
                }
            }
            Self::Other(n) => n.emit_value(buf),
        }
    }
}

fn parse_attr(b: &NlaBuffer<&[u8]>) -> Result<RdmaAttr, DecodeError> {
    let v = b.value();
    Ok(match b.kind() {
        RDMA_NLDEV_ATTR_DEV_INDEX => RdmaAttr::DevIndex(parse_u32(v)?),
        RDMA_NLDEV_ATTR_DEV_NAME => RdmaAttr::DevName(parse_string(v)?),
        RDMA_NLDEV_ATTR_NDEV_INDEX => RdmaAttr::NdevIndex(parse_u32(v)?),
        RDMA_NLDEV_ATTR_NDEV_NAME => RdmaAttr::NdevName(parse_string(v)?),
        RDMA_NLDEV_SYS_ATTR_NETNS_MODE => RdmaAttr::NetnsMode(parse_u8(v)?),
        RDMA_NLDEV_NET_NS_FD => RdmaAttr::NetNsFd(parse_u32(v)?),
        kind => RdmaAttr::Other(DefaultNla::new(kind, v.to_vec())),
    })
}

/// An RDMA nldev message: a command and its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaMessage {
    pub cmd: u16,
    pub attrs: Vec<RdmaAttr>,
}

impl NetlinkSerializable for RdmaMessage {
    fn message_type(&self) -> u16 {
        nl_type(self.cmd)
    }

    fn buffer_len(&self) -> usize {
        self.attrs
            .iter()
            .map(netlink_packet_core::Emitable::buffer_len)
            .sum()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        let mut off = 0;
        for a in &self.attrs {
            let len = netlink_packet_core::Emitable::buffer_len(a);
            if let Some(b) = buffer.get_mut(off..off + len) {
                netlink_packet_core::Emitable::emit(a, b);
            }
            off += len;
        }
    }
}

impl NetlinkDeserializable for RdmaMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type >> 10 != RDMA_NL_NLDEV {
            return Err(DecodeError::from(format!(
                "not an nldev message: type {}",
                header.message_type
            )));
        }
        let mut attrs = Vec::new();
        for nla in NlasIterator::new(payload) {
            attrs.push(parse_attr(&nla?)?);
        }
        Ok(Self {
            cmd: header.message_type & 0x3ff,
            attrs,
        })
    }
}

/// Encodes one request (`flags`: NLM_F_REQUEST | NLM_F_ACK, plus NLM_F_DUMP for dumps).
#[must_use]
pub fn encode(msg: RdmaMessage, seq: u32, dump: bool) -> Vec<u8> {
    let mut m = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    m.header.flags = NLM_F_REQUEST | NLM_F_ACK | if dump { NLM_F_DUMP } else { 0 };
    m.header.sequence_number = seq;
    m.finalize();
    let mut buf = vec![0; m.buffer_len()];
    m.serialize(&mut buf);
    buf
}

/// The netns-mode query.
#[must_use]
pub fn sys_get(seq: u32) -> Vec<u8> {
    encode(
        RdmaMessage {
            cmd: RDMA_NLDEV_CMD_SYS_GET,
            attrs: vec![],
        },
        seq,
        false,
    )
}

/// The device dump.
#[must_use]
pub fn dev_dump(seq: u32) -> Vec<u8> {
    encode(
        RdmaMessage {
            cmd: RDMA_NLDEV_CMD_GET,
            attrs: vec![],
        },
        seq,
        true,
    )
}

/// The move of device `index` into the netns behind `netns_fd`.
#[must_use]
pub fn dev_move(seq: u32, index: u32, netns_fd: u32) -> Vec<u8> {
    encode(
        RdmaMessage {
            cmd: RDMA_NLDEV_CMD_SET,
            attrs: vec![RdmaAttr::DevIndex(index), RdmaAttr::NetNsFd(netns_fd)],
        },
        seq,
        false,
    )
}

/// One decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Message(RdmaMessage),
    /// An ACK (`errno` None) or an error.
    Ack {
        errno: Option<i32>,
    },
    Done,
}

/// Decodes every netlink message in `buf` (a datagram may carry several).
pub fn decode(mut buf: &[u8]) -> Result<Vec<Reply>, RdmaError> {
    let mut out = Vec::new();
    while buf.len() >= 16 {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < 16 || len > buf.len() {
            return Err(RdmaError::Decode(format!(
                "bad message length {len} in {} bytes",
                buf.len()
            )));
        }
        let m = NetlinkMessage::<RdmaMessage>::deserialize(&buf[..len])
            .map_err(|e| RdmaError::Decode(e.to_string()))?;
        match m.payload {
            NetlinkPayload::InnerMessage(r) => out.push(Reply::Message(r)),
            NetlinkPayload::Error(e) => out.push(Reply::Ack {
                // Saturating: a garbage i32::MIN must not overflow (found by fuzzing).
                errno: e.code.map(|c| c.get().saturating_neg()),
            }),
            NetlinkPayload::Done(_) => out.push(Reply::Done),
            _ => {}
        }
        buf = buf.get((len + 3) & !3..).unwrap_or_default();
    }
    Ok(out)
}

/// RDMA netns mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetnsMode {
    Shared,
    Exclusive,
}

/// An RDMA device as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaDevice {
    pub index: u32,
    pub name: String,
}

/// Devices in a dump reply.
#[must_use]
pub fn devices_of(replies: &[Reply]) -> Vec<RdmaDevice> {
    replies
        .iter()
        .filter_map(|r| match r {
            Reply::Message(m) => {
                let index = m.attrs.iter().find_map(|a| {
                    if let RdmaAttr::DevIndex(i) = a {
                        Some(*i)
                    } else {
                        None
                    }
                })?;
                let name = m.attrs.iter().find_map(|a| {
                    if let RdmaAttr::DevName(n) = a {
                        Some(n.clone())
                    } else {
                        None
                    }
                })?;
                Some(RdmaDevice { index, name })
            }
            _ => None,
        })
        .collect()
}

/// The netns mode in a SYS_GET reply.
#[must_use]
pub fn mode_of(replies: &[Reply]) -> Option<NetnsMode> {
    replies.iter().find_map(|r| match r {
        Reply::Message(m) => m.attrs.iter().find_map(|a| match a {
            RdmaAttr::NetnsMode(0) => Some(NetnsMode::Exclusive),
            RdmaAttr::NetnsMode(_) => Some(NetnsMode::Shared),
            _ => None,
        }),
        _ => None,
    })
}

/// A blocking NETLINK_RDMA socket in the netns of the thread that opened it.
pub struct Rdma {
    sock: netlink_sys::Socket,
    seq: u32,
}

impl Rdma {
    /// Opens the socket in the calling thread's netns.
    pub fn open() -> Result<Self, RdmaError> {
        let sock = netlink_sys::Socket::new(NETLINK_RDMA).map_err(|e| {
            if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) {
                RdmaError::NoRdma
            } else {
                RdmaError::Socket(e)
            }
        })?;
        Ok(Self { sock, seq: 0 })
    }

    fn call(
        &mut self,
        what: &'static str,
        req: impl FnOnce(u32) -> Vec<u8>,
    ) -> Result<Vec<Reply>, RdmaError> {
        self.seq = self.seq.wrapping_add(1);
        let bytes = req(self.seq);
        let kernel = netlink_sys::SocketAddr::new(0, 0);
        self.sock.send_to(&bytes, &kernel, 0).map_err(RdmaError::Socket)?;
        let mut all = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.sock.recv(&mut &mut buf[..], 0).map_err(RdmaError::Socket)?;
            let replies = decode(buf.get(..n).unwrap_or_default())?;
            let mut end = false;
            for r in replies {
                match r {
                    Reply::Ack { errno: Some(e) } => return Err(RdmaError::Kernel { what, errno: e }),
                    Reply::Ack { errno: None } | Reply::Done => end = true,
                    m @ Reply::Message(_) => all.push(m),
                }
            }
            if end {
                return Ok(all);
            }
        }
    }

    /// Shared or exclusive.
    pub fn netns_mode(&mut self) -> Result<NetnsMode, RdmaError> {
        let r = self.call("sys get", sys_get)?;
        mode_of(&r).ok_or_else(|| RdmaError::Decode("SYS_GET reply without NETNS_MODE".into()))
    }

    /// The devices visible in this netns.
    pub fn devices(&mut self) -> Result<Vec<RdmaDevice>, RdmaError> {
        let r = self.call("device dump", dev_dump)?;
        Ok(devices_of(&r))
    }

    /// Moves device `index` into the netns behind `target`.
    pub fn move_to(&mut self, index: u32, target: BorrowedFd<'_>) -> Result<(), RdmaError> {
        let fd = u32::try_from(target.as_raw_fd()).map_err(|_| RdmaError::Decode("negative fd".into()))?;
        self.call("move device", |seq| dev_move(seq, index, fd))
            .map(|_| ())
    }
}

/// Moves the RDMA device `name` from netns `from` to netns `to`, with the socket and the
/// calling thread both in `from`. Refuses in shared mode (nothing to move there: every netns
/// sees every device).
pub fn move_device(from: &Netns, name: &str, to: &Netns) -> Result<(), RdmaError> {
    let to = to.try_clone()?;
    let name = name.to_owned();
    crate::sys::netns::in_netns_alone(from, move || -> Result<(), RdmaError> {
        let mut r = Rdma::open()?;
        if r.netns_mode()? == NetnsMode::Shared {
            return Err(RdmaError::SharedMode);
        }
        let dev = r
            .devices()?
            .into_iter()
            .find(|d| d.name == name)
            .ok_or(RdmaError::NotFound(name.clone()))?;
        r.move_to(dev.index, to.as_fd())
    })?
}

/// The netns mode of the host (None when the kernel has no RDMA).
pub fn host_mode() -> Result<Option<NetnsMode>, RdmaError> {
    match Rdma::open() {
        Ok(mut r) => r.netns_mode().map(Some),
        Err(RdmaError::NoRdma) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
