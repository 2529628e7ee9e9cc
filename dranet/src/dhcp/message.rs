//! DHCPv4 messages (RFC 2131 §2, options RFC 2132, classless static routes RFC 3442): pure
//! encode and decode, no I/O. Decoding never panics: every length is checked against the
//! buffer and a message that does not follow the format is a [`DhcpError::Malformed`].

use std::net::Ipv4Addr;

use super::DhcpError;

/// `op` of a client request.
pub const BOOTREQUEST: u8 = 1;
/// `op` of a server reply.
pub const BOOTREPLY: u8 = 2;
/// `flags`: ask the server to broadcast its replies (we have no address yet; RFC 2131 §4.1).
pub const FLAG_BROADCAST: u16 = 0x8000;
/// The four bytes before the options (RFC 2131 §3).
pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// Fixed part (236 bytes) + the magic cookie.
pub const FIXED_LEN: usize = 240;

/// Option codes used here (RFC 2132 unless noted).
pub mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS: u8 = 6;
    pub const HOSTNAME: u8 = 12;
    pub const DOMAIN_NAME: u8 = 15;
    pub const MTU: u8 = 26;
    pub const BROADCAST: u8 = 28;
    pub const STATIC_ROUTE: u8 = 33;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const OVERLOAD: u8 = 52;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_LIST: u8 = 55;
    pub const MESSAGE: u8 = 56;
    pub const MAX_MESSAGE_SIZE: u8 = 57;
    pub const RENEWAL_TIME: u8 = 58;
    pub const REBINDING_TIME: u8 = 59;
    pub const CLIENT_ID: u8 = 61;
    /// RFC 3442.
    pub const CLASSLESS_ROUTE: u8 = 121;
    pub const END: u8 = 255;
}

/// Option 53 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageType {
    Discover,
    Offer,
    Request,
    Decline,
    Ack,
    Nak,
    Release,
    Inform,
}

impl MessageType {
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Discover => 1,
            Self::Offer => 2,
            Self::Request => 3,
            Self::Decline => 4,
            Self::Ack => 5,
            Self::Nak => 6,
            Self::Release => 7,
            Self::Inform => 8,
        }
    }

    #[must_use]
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Self::Discover,
            2 => Self::Offer,
            3 => Self::Request,
            4 => Self::Decline,
            5 => Self::Ack,
            6 => Self::Nak,
            7 => Self::Release,
            8 => Self::Inform,
            _ => return None,
        })
    }
}

/// One route of option 121: `destination/prefix_len` via `router` (`0.0.0.0` = on-link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClasslessRoute {
    pub destination: Ipv4Addr,
    pub prefix_len: u8,
    pub router: Ipv4Addr,
}

/// A DHCPv4 message. `options` keeps each code once, in first-seen order, with the values of
/// repeated codes concatenated (RFC 3396), including options from `file`/`sname` when option
/// 52 says they are overloaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub op: u8,
    pub htype: u8,
    pub hlen: u8,
    pub hops: u8,
    pub xid: u32,
    pub secs: u16,
    pub flags: u16,
    pub ciaddr: Ipv4Addr,
    pub yiaddr: Ipv4Addr,
    pub siaddr: Ipv4Addr,
    pub giaddr: Ipv4Addr,
    pub chaddr: [u8; 16],
    pub sname: [u8; 64],
    pub file: [u8; 128],
    pub options: Vec<(u8, Vec<u8>)>,
}

fn malformed(why: impl Into<String>) -> DhcpError {
    DhcpError::Malformed(why.into())
}

fn ip_at(b: &[u8], at: usize) -> Ipv4Addr {
    match b.get(at..at + 4) {
        Some(&[a, b2, c, d]) => Ipv4Addr::new(a, b2, c, d),
        _ => Ipv4Addr::UNSPECIFIED,
    }
}

fn ipv4(value: &[u8], what: &str) -> Result<Ipv4Addr, DhcpError> {
    match value {
        &[a, b, c, d] => Ok(Ipv4Addr::new(a, b, c, d)),
        _ => Err(malformed(format!("{what}: want 4 bytes, got {}", value.len()))),
    }
}

impl Message {
    /// A client request (`op` 1, Ethernet) of `kind` with transaction `xid` from `mac`, with
    /// option 53 set; more options are pushed by the caller.
    #[must_use]
    pub fn request(kind: MessageType, xid: u32, mac: [u8; 6]) -> Self {
        let mut chaddr = [0u8; 16];
        chaddr[..6].copy_from_slice(&mac);
        Self {
            op: BOOTREQUEST,
            htype: 1,
            hlen: 6,
            hops: 0,
            xid,
            secs: 0,
            flags: FLAG_BROADCAST,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            chaddr,
            sname: [0; 64],
            file: [0; 128],
            options: vec![(opt::MESSAGE_TYPE, vec![kind.code()])],
        }
    }

    /// Sets option `code` (replacing a previous value).
    pub fn set_option(&mut self, code: u8, value: Vec<u8>) {
        if let Some(slot) = self.options.iter_mut().find(|(c, _)| *c == code) {
            slot.1 = value;
        } else {
            self.options.push((code, value));
        }
    }

    /// The value of option `code`, if present.
    #[must_use]
    pub fn option(&self, code: u8) -> Option<&[u8]> {
        self.options
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, v)| v.as_slice())
    }

    /// Option 53; `None` if absent or unknown.
    #[must_use]
    pub fn message_type(&self) -> Option<MessageType> {
        match self.option(opt::MESSAGE_TYPE) {
            Some(&[c]) => MessageType::from_code(c),
            _ => None,
        }
    }

    /// The client hardware address, if this is an Ethernet message.
    #[must_use]
    pub fn mac(&self) -> Option<[u8; 6]> {
        if self.htype != 1 || self.hlen != 6 {
            return None;
        }
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.chaddr[..6]);
        Some(m)
    }

    /// An IPv4 address option (54, 1, 50, ...); a wrong length is malformed.
    pub fn ip_option(&self, code: u8) -> Result<Option<Ipv4Addr>, DhcpError> {
        self.option(code)
            .map(|v| ipv4(v, &format!("option {code}")))
            .transpose()
    }

    /// A list-of-addresses option (3 routers, 6 DNS): a non-empty multiple of 4 bytes.
    pub fn ip_list_option(&self, code: u8) -> Result<Vec<Ipv4Addr>, DhcpError> {
        let Some(v) = self.option(code) else {
            return Ok(Vec::new());
        };
        if v.is_empty() || v.len() % 4 != 0 {
            return Err(malformed(format!(
                "option {code}: want a multiple of 4 bytes, got {}",
                v.len()
            )));
        }
        Ok(v.chunks_exact(4).map(|c| ip_at(c, 0)).collect())
    }

    /// A 32-bit option (51, 58, 59).
    pub fn u32_option(&self, code: u8) -> Result<Option<u32>, DhcpError> {
        match self.option(code) {
            None => Ok(None),
            Some(&[a, b, c, d]) => Ok(Some(u32::from_be_bytes([a, b, c, d]))),
            Some(v) => Err(malformed(format!("option {code}: want 4 bytes, got {}", v.len()))),
        }
    }

    /// Option 1 as a prefix length; a mask that is not contiguous ones is malformed.
    pub fn prefix_len(&self) -> Result<Option<u8>, DhcpError> {
        let Some(mask) = self.ip_option(opt::SUBNET_MASK)? else {
            return Ok(None);
        };
        let m = u32::from(mask);
        let ones = m.leading_ones();
        if m.checked_shl(ones).unwrap_or(0) != 0 {
            return Err(malformed(format!(
                "subnet mask {mask} is not a contiguous prefix"
            )));
        }
        // `ones` ≤ 32.
        Ok(Some(u8::try_from(ones).unwrap_or(32)))
    }

    /// Option 121 (RFC 3442), in order. Each route is one byte of prefix length (≤ 32), the
    /// significant octets of the destination (`ceil(len/8)`), and 4 bytes of router.
    /// Destination bits beyond the prefix must be zero (RFC 3442 §1: such a route is invalid).
    pub fn classless_routes(&self) -> Result<Vec<ClasslessRoute>, DhcpError> {
        let Some(mut v) = self.option(opt::CLASSLESS_ROUTE) else {
            return Ok(Vec::new());
        };
        let mut routes = Vec::new();
        while let Some((&len, rest)) = v.split_first() {
            if len > 32 {
                return Err(malformed(format!("option 121: prefix length {len} > 32")));
            }
            let sig = usize::from(len).div_ceil(8);
            let Some(dest_bytes) = rest.get(..sig) else {
                return Err(malformed("option 121: truncated destination"));
            };
            let Some(router_bytes) = rest.get(sig..sig + 4) else {
                return Err(malformed("option 121: truncated router"));
            };
            let mut d = [0u8; 4];
            d[..sig].copy_from_slice(dest_bytes);
            let dest = u32::from_be_bytes(d);
            let host_bits = u32::MAX.checked_shr(u32::from(len)).unwrap_or(0);
            if dest & host_bits != 0 {
                return Err(malformed(format!(
                    "option 121: destination {}/{len} has bits set beyond the prefix",
                    Ipv4Addr::from(dest)
                )));
            }
            routes.push(ClasslessRoute {
                destination: Ipv4Addr::from(dest),
                prefix_len: len,
                router: ip_at(router_bytes, 0),
            });
            v = rest.get(sig + 4..).unwrap_or(&[]);
        }
        Ok(routes)
    }

    /// Option 56 (the server's text, e.g. in a NAK), lossily as UTF-8.
    #[must_use]
    pub fn server_message(&self) -> Option<String> {
        self.option(opt::MESSAGE)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Wire form. Options longer than 255 bytes are split into several instances of the code
    /// (RFC 3396); the options area is ended with option 255. Never overloads `file`/`sname`.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_LEN + 64);
        b.extend_from_slice(&[self.op, self.htype, self.hlen, self.hops]);
        b.extend_from_slice(&self.xid.to_be_bytes());
        b.extend_from_slice(&self.secs.to_be_bytes());
        b.extend_from_slice(&self.flags.to_be_bytes());
        for a in [self.ciaddr, self.yiaddr, self.siaddr, self.giaddr] {
            b.extend_from_slice(&a.octets());
        }
        b.extend_from_slice(&self.chaddr);
        b.extend_from_slice(&self.sname);
        b.extend_from_slice(&self.file);
        b.extend_from_slice(&MAGIC_COOKIE);
        for (code, value) in &self.options {
            // Option 52 would send readers to `file`/`sname`, which we do not fill with options.
            if matches!(*code, opt::PAD | opt::END | opt::OVERLOAD) {
                continue;
            }
            if value.is_empty() {
                b.extend_from_slice(&[*code, 0]);
            }
            for chunk in value.chunks(255) {
                b.push(*code);
                // `chunks(255)`: the length fits a byte.
                b.push(u8::try_from(chunk.len()).unwrap_or(u8::MAX));
                b.extend_from_slice(chunk);
            }
        }
        b.push(opt::END);
        // Some servers and relays drop BOOTP messages shorter than 300 bytes (RFC 1542 §2.1).
        if b.len() < 300 {
            b.resize(300, opt::PAD);
        }
        b
    }

    /// Parses a message; the options area must start with the magic cookie.
    pub fn decode(b: &[u8]) -> Result<Self, DhcpError> {
        if b.len() < FIXED_LEN {
            return Err(malformed(format!(
                "{} bytes, shorter than the {FIXED_LEN}-byte fixed part",
                b.len()
            )));
        }
        if b.get(236..240) != Some(&MAGIC_COOKIE[..]) {
            return Err(malformed("no DHCP magic cookie"));
        }
        let u16_at = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let mut chaddr = [0u8; 16];
        chaddr.copy_from_slice(&b[28..44]);
        let mut sname = [0u8; 64];
        sname.copy_from_slice(&b[44..108]);
        let mut file = [0u8; 128];
        file.copy_from_slice(&b[108..236]);
        let mut m = Self {
            op: b[0],
            htype: b[1],
            hlen: b[2],
            hops: b[3],
            xid: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            secs: u16_at(8),
            flags: u16_at(10),
            ciaddr: ip_at(b, 12),
            yiaddr: ip_at(b, 16),
            siaddr: ip_at(b, 20),
            giaddr: ip_at(b, 24),
            chaddr,
            sname,
            file,
            options: Vec::new(),
        };
        let mut options = Vec::new();
        parse_options(&b[FIXED_LEN..], "options", &mut options)?;
        // Option 52 (RFC 2132 §9.3): 1 = `file` holds options, 2 = `sname`, 3 = both (file first).
        let overload = options
            .iter()
            .find(|(c, _)| *c == opt::OVERLOAD)
            .map(|(_, v)| v.clone());
        match overload.as_deref() {
            None => {}
            Some(&[1]) => parse_options(&m.file, "file", &mut options)?,
            Some(&[2]) => parse_options(&m.sname, "sname", &mut options)?,
            Some(&[3]) => {
                parse_options(&m.file, "file", &mut options)?;
                parse_options(&m.sname, "sname", &mut options)?;
            }
            Some(v) => return Err(malformed(format!("option 52: invalid value {v:?}"))),
        }
        m.options = options;
        Ok(m)
    }
}

/// Appends the options of one area to `out`, concatenating repeated codes (RFC 3396). The
/// area ends at option 255 or at its end (some servers omit 255 before padding runs out).
fn parse_options(mut area: &[u8], what: &str, out: &mut Vec<(u8, Vec<u8>)>) -> Result<(), DhcpError> {
    while let Some((&code, rest)) = area.split_first() {
        match code {
            opt::PAD => {
                area = rest;
                continue;
            }
            opt::END => return Ok(()),
            _ => {}
        }
        let Some((&len, rest)) = rest.split_first() else {
            return Err(malformed(format!("{what}: option {code} has no length")));
        };
        let Some(value) = rest.get(..usize::from(len)) else {
            return Err(malformed(format!(
                "{what}: option {code} of {len} bytes runs past the end"
            )));
        };
        if let Some(slot) = out.iter_mut().find(|(c, _)| *c == code) {
            slot.1.extend_from_slice(value);
        } else {
            out.push((code, value.to_vec()));
        }
        area = rest.get(usize::from(len)..).unwrap_or(&[]);
    }
    Ok(())
}
