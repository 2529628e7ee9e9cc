//! Device names as upstream (`pkg/names`): a netdev keeps its name when it is a DNS-1123 label,
//! otherwise `net-` + lowercase unpadded base32 of the name; PCI devices are `pci-dddd-bb-dd-f`.

/// True for a DNS-1123 label: 1–63 of `[a-z0-9-]`, starting and ending alphanumeric.
#[must_use]
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Slice device name of a netdev that is not PCI-backed.
#[must_use]
pub fn netdev_device_name(ifname: &str) -> String {
    if is_dns_label(ifname) {
        ifname.to_owned()
    } else {
        format!("net-{}", base32_lower_nopad(ifname.as_bytes()))
    }
}

/// Slice device name of a PCI device from its address `dddd:bb:dd.f`.
#[must_use]
pub fn pci_device_name(pci_address: &str) -> String {
    format!(
        "pci-{}",
        pci_address.replace([':', '.'], "-").to_ascii_lowercase()
    )
}

/// RFC 4648 base32, lowercase, no padding.
#[must_use]
pub fn base32_lower_nopad(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    let mut buf: u32 = 0;
    let mut bits = 0;
    for &byte in data {
        buf = (buf << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buf >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buf << (5 - bits)) & 31) as usize]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_rfc4648_vectors() {
        assert_eq!(base32_lower_nopad(b""), "");
        assert_eq!(base32_lower_nopad(b"f"), "my");
        assert_eq!(base32_lower_nopad(b"fo"), "mzxq");
        assert_eq!(base32_lower_nopad(b"foo"), "mzxw6");
        assert_eq!(base32_lower_nopad(b"foob"), "mzxw6yq");
        assert_eq!(base32_lower_nopad(b"fooba"), "mzxw6ytb");
        assert_eq!(base32_lower_nopad(b"foobar"), "mzxw6ytboi");
    }

    #[test]
    fn netdev_names() {
        assert_eq!(netdev_device_name("eth0"), "eth0");
        assert_eq!(netdev_device_name("ens1f0np0"), "ens1f0np0");
        assert_eq!(netdev_device_name("eth0.100"), "net-mv2gqmbogeyda");
        assert_eq!(
            netdev_device_name("Eth0"),
            format!("net-{}", base32_lower_nopad(b"Eth0"))
        );
        assert_eq!(netdev_device_name("my_if"), "net-nv4v62lg");
        assert!(netdev_device_name("-x").starts_with("net-"));
        assert!(is_dns_label(&netdev_device_name("weird_Name.1")));
    }

    #[test]
    fn pci_names() {
        assert_eq!(pci_device_name("0000:10:1b.0"), "pci-0000-10-1b-0");
        assert_eq!(pci_device_name("0000:AF:00.1"), "pci-0000-af-00-1");
        assert!(is_dns_label(&pci_device_name("0000:af:00.1")));
    }
}
