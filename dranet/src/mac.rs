//! Link-layer addresses ("MACs": 6 bytes for Ethernet, 20 for IPoIB, up to the kernel's
//! `MAX_ADDR_LEN` of 32): one type, one way to write them, one set of rules for reading them.
//!
//! * Written lowercase, two hex digits a byte, `:` between (`02:d7:00:00:00:01`), what Go's
//!   `net.HardwareAddr.String()` writes. Checkpoints and plan files hold this form.
//! * Read from the kernel ([`Mac::from_kernel`]): any length; no bytes or all zeros is no
//!   address (a link without one: loopback, a tunnel, a device that has no permanent address).
//! * Parsed ([`Mac::parse`]) in the forms Go's `net.ParseMAC` accepts, and compared as bytes:
//!   `AA-BB-…`, `aa:bb:…` and `aabb.…` are one address.

use std::fmt;

/// The longest link-layer address the kernel has (`MAX_ADDR_LEN`).
pub const MAX_LEN: usize = 32;

/// A link-layer address of 1 to [`MAX_LEN`] bytes. Equal when the bytes are.
#[derive(Clone, Copy)]
pub struct Mac {
    len: u8,
    bytes: [u8; MAX_LEN],
}

impl Mac {
    /// `bytes` as an address: `None` when there are none or more than [`MAX_LEN`].
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || bytes.len() > MAX_LEN {
            return None;
        }
        let mut b = [0; MAX_LEN];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Self {
            len: bytes.len() as u8,
            bytes: b,
        })
    }

    /// An address as the kernel reports it (`IFLA_ADDRESS`, `IFLA_PERM_ADDRESS`,
    /// `NDA_LLADDR`): `None` when it is empty or all zeros, which means the link has none.
    #[must_use]
    pub fn from_kernel(bytes: &[u8]) -> Option<Self> {
        if bytes.iter().all(|b| *b == 0) {
            return None;
        }
        Self::from_bytes(bytes)
    }

    /// An address in a form Go's `net.ParseMAC` accepts: 6, 8 or 20 bytes written as
    /// `xx:xx:…`, `xx-xx-…` or `xxxx.xxxx.…`, hex digits of either case.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        let mut b = [0; MAX_LEN];
        let mut len = 0;
        let mut push = |pair: &str| -> Option<()> {
            let slot = b.get_mut(len)?;
            *slot = u8::from_str_radix(pair, 16).ok()?;
            len += 1;
            Some(())
        };
        let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|c| c.is_ascii_hexdigit());
        if s.contains('.') {
            for group in s.split('.') {
                if !hex(group, 4) {
                    return None;
                }
                push(&group[..2])?;
                push(&group[2..])?;
            }
        } else {
            let sep = if s.contains('-') { '-' } else { ':' };
            for pair in s.split(sep) {
                if !hex(pair, 2) {
                    return None;
                }
                push(pair)?;
            }
        }
        if !matches!(len, 6 | 8 | 20) {
            return None;
        }
        Self::from_bytes(&b[..len])
    }

    /// An address as dranet records it (checkpoints, plan files, published attributes): what
    /// [`Display`](fmt::Display) writes, `xx:xx:…` of any length the kernel has (a tunnel's
    /// 4 bytes as well as Ethernet's 6 or IPoIB's 20), either case; or a form [`Mac::parse`]
    /// takes.
    #[must_use]
    pub fn parse_recorded(s: &str) -> Option<Self> {
        let mut b = [0; MAX_LEN];
        let mut len = 0;
        for pair in s.split(':') {
            let slot = b.get_mut(len)?;
            if pair.len() != 2 || !pair.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Self::parse(s);
            }
            *slot = u8::from_str_radix(pair, 16).ok()?;
            len += 1;
        }
        Self::from_bytes(&b[..len])
    }

    /// The address's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl PartialEq for Mac {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Mac {}

impl std::hash::Hash for Mac {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.as_bytes().iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IPOIB: &str = "80:00:02:08:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:7b:3c:4e";

    #[test]
    fn an_address_is_written_lowercase_with_colons() {
        let m = Mac::from_kernel(&[2, 0xd7, 0, 0, 0, 1]).unwrap();
        assert_eq!(m.to_string(), "02:d7:00:00:00:01");
        assert_eq!(format!("{m:?}"), "02:d7:00:00:00:01");
        assert_eq!(Mac::from_bytes(&[0xab]).unwrap().to_string(), "ab");
        let long: Vec<u8> = (0..32).collect();
        assert_eq!(Mac::from_bytes(&long).unwrap().to_string().len(), 32 * 3 - 1);
    }

    #[test]
    fn the_kernel_s_empty_or_zero_address_is_none() {
        assert_eq!(Mac::from_kernel(&[]), None);
        assert_eq!(Mac::from_kernel(&[0; 6]), None);
        assert_eq!(Mac::from_kernel(&[0; 20]), None);
        assert_eq!(Mac::from_kernel(&[0; 33]), None);
        assert_eq!(Mac::from_kernel(&[1; 33]), None);
        // Any other length the kernel has: a tunnel's 4 bytes, IPoIB's 20, MAX_ADDR_LEN.
        assert_eq!(
            Mac::from_kernel(&[10, 0, 0, 1]).unwrap().to_string(),
            "0a:00:00:01"
        );
        let ipoib = Mac::parse(IPOIB).unwrap();
        assert_eq!(Mac::from_kernel(ipoib.as_bytes()), Some(ipoib));
        assert_eq!(ipoib.to_string(), IPOIB);
        assert!(Mac::from_kernel(&[1; 32]).is_some());
        // Zeros allowed by from_bytes (a neighbour entry may hold them).
        assert_eq!(Mac::from_bytes(&[0; 6]).unwrap().to_string(), "00:00:00:00:00:00");
    }

    #[test]
    fn go_forms_parse_to_the_same_bytes() {
        let want = Mac::from_bytes(&[2, 0xd7, 0, 0, 0, 0x0a]).unwrap();
        for s in [
            "02:d7:00:00:00:0a",
            "02-D7-00-00-00-0A",
            "02d7.0000.000a",
            "02:D7:00:00:00:0A",
        ] {
            assert_eq!(Mac::parse(s), Some(want), "{s}");
        }
        assert_eq!(Mac::parse("02:d7:00:00:00:01:02:03").unwrap().as_bytes().len(), 8);
        assert_eq!(Mac::parse(&IPOIB.replace(':', "-")).unwrap().to_string(), IPOIB);
        for bad in [
            "",
            "02:d7:00:00:00",
            "02:d7:00:00:00:01:02",
            "0:d7:00:00:00:01",
            "zz:d7:00:00:00:01",
            "02:d7-00:00:00:01",
            "02d7.0000.00",
            "+2:d7:00:00:00:01",
            "02:d7:00:00:00:01:",
        ] {
            assert_eq!(Mac::parse(bad), None, "{bad:?}");
        }
        // Longer than MAX_LEN: refused, never cut.
        assert_eq!(Mac::parse(&vec!["aa"; 40].join(":")), None);
    }

    #[test]
    fn a_recorded_address_of_any_kernel_length_reads_back() {
        for bytes in [
            &[10, 0, 0, 1][..],
            &[2, 0xd7, 0, 0, 0, 1],
            &[0x80; 20],
            &[0xab; MAX_LEN],
        ] {
            let m = Mac::from_bytes(bytes).unwrap();
            assert_eq!(Mac::parse_recorded(&m.to_string()), Some(m));
            assert_eq!(Mac::parse_recorded(&m.to_string().to_uppercase()), Some(m));
        }
        assert_eq!(
            Mac::parse_recorded("02-D7-00-00-00-01"),
            Mac::parse("02:d7:00:00:00:01")
        );
        for bad in [
            "",
            "0",
            "02:d7:0",
            "zz:00",
            "02::01",
            &["ab"; MAX_LEN + 1].join(":"),
        ] {
            assert_eq!(Mac::parse_recorded(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn equality_is_on_the_bytes() {
        let a = Mac::parse("0c:42:a1:00:00:01").unwrap();
        assert_eq!(a, Mac::parse("0C-42-A1-00-00-01").unwrap());
        assert_ne!(a, Mac::parse("0c:42:a1:00:00:01:00:00").unwrap());
        let set: std::collections::HashSet<Mac> = [a, Mac::parse("0c42.a100.0001").unwrap()].into();
        assert_eq!(set.len(), 1);
    }
}
