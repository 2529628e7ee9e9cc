//! EFA device groups of AWS Trainium instances, as upstream gets them from
//! aws-neuron/connected-device-maps-over-efa-for-neuron (`lookup`): which EFA function
//! (PCI address) each Neuron device is wired to, per instance family, and from that four
//! attributes per EFA device: `resource.aws.com/devicegroup1_id` (the EFA address itself) and
//! `devicegroup{4,8,16}_id`, a hash naming the group of 4, 8 or 16 Neuron devices (and their
//! EFAs) the device belongs to, so a claim can ask for EFAs of one group.
//!
//! The wiring tables are hardware facts, transcribed from that library's `neuron/*.json`
//! (Apache-2.0, Amazon.com, Inc.); the instance type comes from DMI (`product_name`), as there.

use std::collections::BTreeMap;

use ring::digest;

/// Attribute names (`lookup/consts.go`).
pub const DEVICE_GROUP_1: &str = "resource.aws.com/devicegroup1_id";
pub const DEVICE_GROUP_4: &str = "resource.aws.com/devicegroup4_id";
pub const DEVICE_GROUP_8: &str = "resource.aws.com/devicegroup8_id";
pub const DEVICE_GROUP_16: &str = "resource.aws.com/devicegroup16_id";

/// Instance types with EFA device groups.
const EFA_ENABLED: [&str; 11] = [
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "trn2.48xlarge",
    "trn2e.48xlarge",
    "trn2u.48xlarge",
    "trn3.48xlarge",
    "trn3p.48xlarge",
    "trn3pd98.48xlarge",
    "trn3s.48xlarge",
    "trn3-dev0.48xlarge",
    "trn3-dev1.48xlarge",
];

/// Instance family → wiring table.
fn table(family: &str) -> Option<&'static [&'static str; 16]> {
    Some(match family {
        "trn1" => &TRN1,
        "trn1n" => &TRN1N,
        "trn2" | "trn2e" | "trn2u" => &TRN2,
        "trn3" | "trn3p" | "trn3pd98" | "trn3s" => &TRN3,
        "trn3-dev0" | "trn3-dev1" => &TRN3PDS,
        _ => return None,
    })
}

/// EFA PCI address of Neuron device 0..15.
const TRN1: [&str; 16] = [
    "0000:10:1a.0",
    "0000:10:1a.0",
    "0000:a0:1a.0",
    "0000:a0:1a.0",
    "0000:20:19.0",
    "0000:20:19.0",
    "0000:90:19.0",
    "0000:90:19.0",
    "0000:20:1a.0",
    "0000:20:1a.0",
    "0000:90:1a.0",
    "0000:90:1a.0",
    "0000:10:19.0",
    "0000:10:19.0",
    "0000:a0:19.0",
    "0000:a0:19.0",
];
const TRN1N: [&str; 16] = [
    "0000:10:17.0",
    "0000:10:1a.0",
    "0000:a0:17.0",
    "0000:a0:1a.0",
    "0000:20:19.0",
    "0000:20:18.0",
    "0000:90:19.0",
    "0000:90:18.0",
    "0000:20:17.0",
    "0000:20:1a.0",
    "0000:90:17.0",
    "0000:90:1a.0",
    "0000:10:19.0",
    "0000:10:18.0",
    "0000:a0:19.0",
    "0000:a0:18.0",
];
const TRN2: [&str; 16] = [
    "0000:c9:00.0",
    "0000:b4:00.0",
    "0000:b3:00.0",
    "0000:ca:00.0",
    "0000:6c:00.0",
    "0000:57:00.0",
    "0000:56:00.0",
    "0000:6d:00.0",
    "0000:98:00.0",
    "0000:83:00.0",
    "0000:82:00.0",
    "0000:99:00.0",
    "0000:f5:00.0",
    "0000:e0:00.0",
    "0000:df:00.0",
    "0000:f6:00.0",
];
const TRN3: [&str; 16] = [
    "0000:be:00.0",
    "0000:a9:00.0",
    "0000:a8:00.0",
    "0000:bf:00.0",
    "0000:61:00.0",
    "0000:4c:00.0",
    "0000:4b:00.0",
    "0000:62:00.0",
    "0000:8d:00.0",
    "0000:78:00.0",
    "0000:77:00.0",
    "0000:8e:00.0",
    "0000:ea:00.0",
    "0000:d5:00.0",
    "0000:d4:00.0",
    "0000:eb:00.0",
];
const TRN3PDS: [&str; 16] = [
    "0000:a9:00.0",
    "0000:a8:00.0",
    "0000:bf:00.0",
    "0000:be:00.0",
    "0000:d5:00.0",
    "0000:d4:00.0",
    "0000:eb:00.0",
    "0000:ea:00.0",
    "0000:4c:00.0",
    "0000:4b:00.0",
    "0000:62:00.0",
    "0000:61:00.0",
    "0000:78:00.0",
    "0000:77:00.0",
    "0000:8e:00.0",
    "0000:8d:00.0",
];

/// Why there are no device groups.
#[derive(Debug, PartialEq, Eq)]
pub enum NoGroups {
    /// The instance type has none (not an error upstream: an empty map).
    NotEnabled(String),
    /// The address is not an EFA of this instance family (empty map upstream too).
    NotMapped,
    /// The instance family is listed but has no table (an error upstream).
    NoTable(String),
}

/// The four device-group attributes of EFA function `efa_bdf` on an instance of type
/// `instance_type` (DMI `product_name`).
pub fn device_groups(instance_type: &str, efa_bdf: &str) -> Result<BTreeMap<String, String>, NoGroups> {
    if !EFA_ENABLED.contains(&instance_type) {
        return Err(NoGroups::NotEnabled(instance_type.to_owned()));
    }
    let family = instance_type.split('.').next().unwrap_or_default();
    let wiring = table(family).ok_or_else(|| NoGroups::NoTable(family.to_owned()))?;
    // With two Neuron devices per EFA (trn1) either one gives the same groups of 4, 8, 16.
    let neuron = wiring
        .iter()
        .position(|b| *b == efa_bdf)
        .ok_or(NoGroups::NotMapped)?;
    let group = |size: usize| {
        let start = neuron / size * size;
        let mut bdfs: Vec<&str> = wiring[start..(start + size).min(wiring.len())].to_vec();
        bdfs.sort_unstable();
        bdfs.dedup();
        let d = digest::digest(&digest::SHA256, bdfs.join(",").as_bytes());
        d.as_ref()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    Ok(BTreeMap::from([
        (DEVICE_GROUP_1.to_owned(), efa_bdf.to_owned()),
        (DEVICE_GROUP_4.to_owned(), group(4)),
        (DEVICE_GROUP_8.to_owned(), group(8)),
        (DEVICE_GROUP_16.to_owned(), group(16)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha16(s: &str) -> String {
        let d = digest::digest(&digest::SHA256, s.as_bytes());
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn groups_hash_the_sorted_unique_efa_addresses_of_the_group() {
        let g = device_groups("trn1.32xlarge", "0000:20:19.0").unwrap();
        // Neuron devices 4 and 5 are wired to this EFA: group of 4 is devices 4..8.
        assert_eq!(g[DEVICE_GROUP_1], "0000:20:19.0");
        assert_eq!(g[DEVICE_GROUP_4], sha16("0000:20:19.0,0000:90:19.0"));
        assert_eq!(
            g[DEVICE_GROUP_8],
            sha16("0000:10:1a.0,0000:20:19.0,0000:90:19.0,0000:a0:1a.0")
        );
        let all = "0000:10:19.0,0000:10:1a.0,0000:20:19.0,0000:20:1a.0,0000:90:19.0,0000:90:1a.0,0000:a0:19.0,0000:a0:1a.0";
        assert_eq!(g[DEVICE_GROUP_16], sha16(all));
        assert_eq!(g[DEVICE_GROUP_4].len(), 16);
        // Same group of 4 on another EFA of it.
        let h = device_groups("trn1.32xlarge", "0000:90:19.0").unwrap();
        assert_eq!(h[DEVICE_GROUP_4], g[DEVICE_GROUP_4]);
        assert_ne!(h[DEVICE_GROUP_1], g[DEVICE_GROUP_1]);
        // trn2e shares trn2's wiring.
        assert_eq!(
            device_groups("trn2e.48xlarge", "0000:c9:00.0").unwrap(),
            device_groups("trn2.48xlarge", "0000:c9:00.0").unwrap()
        );
    }

    #[test]
    fn other_instances_and_addresses_have_none() {
        assert_eq!(
            device_groups("p5.48xlarge", "0000:20:19.0"),
            Err(NoGroups::NotEnabled("p5.48xlarge".into()))
        );
        assert_eq!(
            device_groups("trn1.32xlarge", "0000:ff:00.0"),
            Err(NoGroups::NotMapped)
        );
    }
}
