// Over 500 lines: the validation rules as one table (data, one case per rule).
//! The validation rules as one table: every case is a config and the exact list of errors it
//! must produce, each as (JSON path, problem). An empty list means the config is valid. Paths are
//! compared exactly and in order; a problem is compared as a prefix, so that serde's
//! "expected one of …" tails need not be spelled out.

use super::*;

/// (case, config JSON, expected errors as (path, problem prefix)).
type Case = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const OK: &[(&str, &str)] = &[];

const CASES: &[Case] = &[
    // Empty input, null and the empty object are the empty config.
    ("empty", "", OK),
    ("null", "null", OK),
    ("empty object", "{}", OK),
    // Strict decoding: unknown fields and wrong types, each with its path.
    (
        "unknown top-level field",
        r#"{"bogus": 1}"#,
        &[("bogus", "unknown field `bogus`")],
    ),
    (
        "field names are case-sensitive",
        r#"{"Interface": {}}"#,
        &[("Interface", "unknown field `Interface`")],
    ),
    (
        "unknown interface field",
        r#"{"interface": {"nmae": "x"}}"#,
        &[("interface.nmae", "unknown field `nmae`")],
    ),
    (
        "unknown route field",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gw": "10.0.0.1"}]}"#,
        &[("routes[0].gw", "unknown field `gw`")],
    ),
    (
        "neighbour ipAddress is not a field",
        r#"{"neighbors": [{"ipAddress": "10.0.0.9", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#,
        &[("neighbors[0].ipAddress", "unknown field `ipAddress`")],
    ),
    (
        "unknown vrf field",
        r#"{"interface": {"vrf": {"name": "r", "id": 1}}}"#,
        &[("interface.vrf.id", "unknown field `id`")],
    ),
    (
        "unknown ethtool field",
        r#"{"ethtool": {"feature": {}}}"#,
        &[("ethtool.feature", "unknown field `feature`")],
    ),
    (
        "mtu as a string",
        r#"{"interface": {"mtu": "big"}}"#,
        &[("interface.mtu", "invalid type: string \"big\", expected i32")],
    ),
    (
        "dhcp as a string",
        r#"{"interface": {"dhcp": "yes"}}"#,
        &[(
            "interface.dhcp",
            "invalid type: string \"yes\", expected a boolean",
        )],
    ),
    (
        "addresses as a string",
        r#"{"interface": {"addresses": "10.0.0.1/24"}}"#,
        &[(
            "interface.addresses",
            "invalid type: string \"10.0.0.1/24\", expected a sequence",
        )],
    ),
    (
        "an address as a number",
        r#"{"interface": {"addresses": ["10.0.0.1/24", 7]}}"#,
        &[(
            "interface.addresses[1]",
            "invalid type: integer `7`, expected a string",
        )],
    ),
    (
        "routes as an object",
        r#"{"routes": {"destination": "10.0.0.0/8"}}"#,
        &[("routes", "invalid type: map, expected a sequence")],
    ),
    (
        "an ethtool feature as a string",
        r#"{"ethtool": {"features": {"tso": "on"}}}"#,
        &[(
            "ethtool.features.tso",
            "invalid type: string \"on\", expected a boolean",
        )],
    ),
    (
        "scope out of u8",
        r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 300}]}"#,
        &[("routes[0].scope", "invalid value: integer `300`, expected u8")],
    ),
    (
        "two decoding errors, both reported",
        r#"{"interface": {"mtu": "x", "nmae": 1}}"#,
        &[
            ("interface.mtu", "invalid type"),
            ("interface.nmae", "unknown field `nmae`"),
        ],
    ),
    // interface.name
    (
        "name of 15 bytes",
        r#"{"interface": {"name": "123456789012345"}}"#,
        OK,
    ),
    (
        "name with dot, dash, underscore",
        r#"{"interface": {"name": "a.b-c_d"}}"#,
        OK,
    ),
    (
        "empty name keeps the host name",
        r#"{"interface": {"name": ""}}"#,
        OK,
    ),
    (
        "name of 16 bytes",
        r#"{"interface": {"name": "1234567890123456"}}"#,
        &[(
            "interface.name",
            "name '1234567890123456' exceeds maximum length of 15 characters",
        )],
    ),
    (
        "name with a slash",
        r#"{"interface": {"name": "a/b"}}"#,
        &[("interface.name", "name 'a/b' cannot contain '/'")],
    ),
    (
        "name with a space",
        r#"{"interface": {"name": "a b"}}"#,
        &[("interface.name", "name 'a b' cannot contain whitespace")],
    ),
    (
        "name '.'",
        r#"{"interface": {"name": "."}}"#,
        &[("interface.name", "name '.' cannot be '.' or '..'")],
    ),
    (
        "name '..'",
        r#"{"interface": {"name": ".."}}"#,
        &[("interface.name", "name '..' cannot be '.' or '..'")],
    ),
    (
        "name with a colon",
        r#"{"interface": {"name": "eth:0"}}"#,
        &[("interface.name", "name 'eth:0' contains invalid character ':'")],
    ),
    (
        "long name with a slash: both rules",
        r#"{"interface": {"name": "abcdefgh/ijklmnop"}}"#,
        &[
            (
                "interface.name",
                "name 'abcdefgh/ijklmnop' exceeds maximum length",
            ),
            ("interface.name", "name 'abcdefgh/ijklmnop' cannot contain '/'"),
        ],
    ),
    // interface.addresses and dhcp
    (
        "IPv4 and IPv6 addresses",
        r#"{"interface": {"addresses": ["192.168.1.5/24", "2001:db8::1/64"]}}"#,
        OK,
    ),
    (
        "host bits set are allowed",
        r#"{"interface": {"addresses": ["10.1.2.3/8"]}}"#,
        OK,
    ),
    (
        "address without prefix",
        r#"{"interface": {"addresses": ["192.168.1.5"]}}"#,
        &[("interface.addresses[0]", "invalid IP CIDR format '192.168.1.5'")],
    ),
    (
        "IPv4 prefix over 32",
        r#"{"interface": {"addresses": ["10.0.0.1/33"]}}"#,
        &[("interface.addresses[0]", "invalid IP CIDR format '10.0.0.1/33'")],
    ),
    (
        "IPv6 prefix over 128",
        r#"{"interface": {"addresses": ["2001:db8::1/129"]}}"#,
        &[(
            "interface.addresses[0]",
            "invalid IP CIDR format '2001:db8::1/129'",
        )],
    ),
    (
        "prefix with a leading zero",
        r#"{"interface": {"addresses": ["10.0.0.1/024"]}}"#,
        &[("interface.addresses[0]", "invalid IP CIDR format '10.0.0.1/024'")],
    ),
    (
        "the second address bad",
        r#"{"interface": {"addresses": ["10.0.0.1/24", "x/24"]}}"#,
        &[("interface.addresses[1]", "invalid IP CIDR format 'x/24'")],
    ),
    ("dhcp alone", r#"{"interface": {"dhcp": true}}"#, OK),
    (
        "dhcp false with addresses",
        r#"{"interface": {"dhcp": false, "addresses": ["10.0.0.1/24"]}}"#,
        OK,
    ),
    (
        "dhcp with addresses",
        r#"{"interface": {"dhcp": true, "addresses": ["10.0.0.1/24"]}}"#,
        &[("interface", "dhcp and addresses are mutually exclusive")],
    ),
    // interface.mtu, hardwareAddr, GSO/GRO sizes
    ("mtu 68", r#"{"interface": {"mtu": 68}}"#, OK),
    ("mtu 9000", r#"{"interface": {"mtu": 9000}}"#, OK),
    (
        "mtu 67",
        r#"{"interface": {"mtu": 67}}"#,
        &[("interface.mtu", "must be at least 68, got 67")],
    ),
    (
        "mtu 0",
        r#"{"interface": {"mtu": 0}}"#,
        &[("interface.mtu", "must be at least 68, got 0")],
    ),
    (
        "mtu negative",
        r#"{"interface": {"mtu": -1}}"#,
        &[("interface.mtu", "must be at least 68, got -1")],
    ),
    (
        "MAC with colons",
        r#"{"interface": {"hardwareAddr": "02:00:00:00:00:01"}}"#,
        OK,
    ),
    (
        "MAC with dashes",
        r#"{"interface": {"hardwareAddr": "02-00-00-00-00-01"}}"#,
        OK,
    ),
    (
        "MAC with dots",
        r#"{"interface": {"hardwareAddr": "0200.0000.0001"}}"#,
        OK,
    ),
    (
        "EUI-64",
        r#"{"interface": {"hardwareAddr": "02:00:00:00:00:00:00:01"}}"#,
        OK,
    ),
    (
        "InfiniBand 20-octet address",
        r#"{"interface": {"hardwareAddr": "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"}}"#,
        OK,
    ),
    (
        "MAC all zeros",
        r#"{"interface": {"hardwareAddr": "00:00:00:00:00:00"}}"#,
        &[(
            "interface.hardwareAddr",
            "'00:00:00:00:00:00' is all zeros: a device needs a unicast address",
        )],
    ),
    (
        "MAC broadcast",
        r#"{"interface": {"hardwareAddr": "FF-FF-FF-FF-FF-FF"}}"#,
        &[(
            "interface.hardwareAddr",
            "'FF-FF-FF-FF-FF-FF' is the broadcast address: a device needs a unicast address",
        )],
    ),
    (
        "MAC multicast",
        r#"{"interface": {"hardwareAddr": "0100.5e00.0001"}}"#,
        &[(
            "interface.hardwareAddr",
            "'0100.5e00.0001' is a multicast address: a device needs a unicast address",
        )],
    ),
    (
        "MAC of 5 octets",
        r#"{"interface": {"hardwareAddr": "02:00:00:00:01"}}"#,
        &[(
            "interface.hardwareAddr",
            "invalid Hardware Address format '02:00:00:00:01'",
        )],
    ),
    (
        "MAC with a non-hex digit",
        r#"{"interface": {"hardwareAddr": "zz:00:00:00:00:01"}}"#,
        &[(
            "interface.hardwareAddr",
            "invalid Hardware Address format 'zz:00:00:00:00:01'",
        )],
    ),
    (
        "MAC with mixed separators",
        r#"{"interface": {"hardwareAddr": "02:00-00:00:00:01"}}"#,
        &[("interface.hardwareAddr", "invalid Hardware Address format")],
    ),
    (
        "empty MAC",
        r#"{"interface": {"hardwareAddr": ""}}"#,
        &[("interface.hardwareAddr", "invalid Hardware Address format ''")],
    ),
    (
        "GSO/GRO sizes positive",
        r#"{"interface": {"gsoMaxSize": 65536, "groMaxSize": 65536, "gsoIPv4MaxSize": 65536, "groIPv4MaxSize": 65536}}"#,
        OK,
    ),
    (
        "gsoMaxSize 0",
        r#"{"interface": {"gsoMaxSize": 0}}"#,
        &[("interface.gsoMaxSize", "must be positive, got 0")],
    ),
    (
        "groMaxSize negative",
        r#"{"interface": {"groMaxSize": -5}}"#,
        &[("interface.groMaxSize", "must be positive, got -5")],
    ),
    (
        "gsoIPv4MaxSize 0",
        r#"{"interface": {"gsoIPv4MaxSize": 0}}"#,
        &[("interface.gsoIPv4MaxSize", "must be positive, got 0")],
    ),
    (
        "groIPv4MaxSize 0",
        r#"{"interface": {"groIPv4MaxSize": 0}}"#,
        &[("interface.groIPv4MaxSize", "must be positive, got 0")],
    ),
    // ARP sysctls, forwarding, eBPF
    (
        "arpIgnore 8",
        r#"{"interface": {"arpIgnore": 8, "arpAnnounce": 2, "forwarding": true, "disableEbpfPrograms": true}}"#,
        OK,
    ),
    (
        "arpIgnore 4",
        r#"{"interface": {"arpIgnore": 4}}"#,
        &[("interface.arpIgnore", "must be one of 0, 1, 2, 3 or 8, got 4")],
    ),
    (
        "arpIgnore negative",
        r#"{"interface": {"arpIgnore": -1}}"#,
        &[("interface.arpIgnore", "must be one of 0, 1, 2, 3 or 8, got -1")],
    ),
    (
        "arpAnnounce 3",
        r#"{"interface": {"arpAnnounce": 3}}"#,
        &[("interface.arpAnnounce", "must be between 0 and 2, got 3")],
    ),
    // VRF
    (
        "vrf with a table",
        r#"{"interface": {"vrf": {"name": "red", "table": 10}}}"#,
        OK,
    ),
    (
        "vrf with the default table",
        r#"{"interface": {"vrf": {"name": "blue"}}}"#,
        OK,
    ),
    (
        "vrf without a name",
        r#"{"interface": {"vrf": {"name": ""}}}"#,
        &[("interface.vrf.name", "cannot be empty")],
    ),
    (
        "vrf table 0",
        r#"{"interface": {"vrf": {"name": "r", "table": 0}}}"#,
        &[("interface.vrf.table", "must be a positive integer, got 0")],
    ),
    (
        "vrf table 254 (main)",
        r#"{"interface": {"vrf": {"name": "r", "table": 254}}}"#,
        &[("interface.vrf.table", "cannot use reserved table ID 254")],
    ),
    (
        "vrf table 255 (local)",
        r#"{"interface": {"vrf": {"name": "r", "table": 255}}}"#,
        &[("interface.vrf.table", "cannot use reserved table ID 255")],
    ),
    (
        "vrf with rules",
        r#"{"interface": {"vrf": {"name": "r"}}, "rules": [{"priority": 1, "table": 5}]}"#,
        &[("", "rules are not supported when VRF is enabled")],
    ),
    // routes
    (
        "universe route with a gateway",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "192.168.1.1"}]}"#,
        OK,
    ),
    (
        "link route without a gateway",
        r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 253}]}"#,
        OK,
    ),
    (
        "IPv6 route with source and table",
        r#"{"routes": [{"destination": "2001:db8::/32", "gateway": "fe80::1", "source": "2001:db8::5", "table": 100}]}"#,
        OK,
    ),
    (
        "IPv4-mapped gateway counts as IPv4",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "::ffff:10.0.0.1"}]}"#,
        OK,
    ),
    (
        "route without destination",
        r#"{"routes": [{"gateway": "10.0.0.1"}]}"#,
        &[("routes[0].destination", "cannot be empty")],
    ),
    (
        "route destination without prefix",
        r#"{"routes": [{"destination": "10.0.0.1", "gateway": "10.0.0.254"}]}"#,
        &[(
            "routes[0].destination",
            "invalid CIDR format '10.0.0.1' (host routes use /32 or /128)",
        )],
    ),
    (
        "route scope host",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "scope": 254}]}"#,
        &[(
            "routes[0].scope",
            "invalid scope '254', only Link (253) or Universe (0) allowed",
        )],
    ),
    (
        "universe route without a gateway",
        r#"{"routes": [{"destination": "10.0.0.0/8"}]}"#,
        &[("routes[0].gateway", "must be specified for Universe scope routes")],
    ),
    (
        "gateway not an address",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "router"}]}"#,
        &[("routes[0].gateway", "invalid IP address format 'router'")],
    ),
    (
        "IPv6 gateway for an IPv4 route",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "2001:db8::1"}]}"#,
        &[(
            "routes[0].gateway",
            "'2001:db8::1' must be the same IP family as destination '10.0.0.0/8'",
        )],
    ),
    (
        "IPv4 source for an IPv6 route",
        r#"{"routes": [{"destination": "2001:db8::/32", "gateway": "fe80::1", "source": "10.0.0.5"}]}"#,
        &[(
            "routes[0].source",
            "'10.0.0.5' must be the same IP family as destination '2001:db8::/32'",
        )],
    ),
    (
        "source not an address",
        r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 253, "source": "me"}]}"#,
        &[("routes[0].source", "invalid IP address format 'me'")],
    ),
    (
        "route table negative",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "table": -1}]}"#,
        &[("routes[0].table", "must be a non-negative integer, got -1")],
    ),
    (
        "the second route bad, the first fine",
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1"}, {"destination": "bad", "scope": 253}]}"#,
        &[("routes[1].destination", "invalid CIDR format 'bad'")],
    ),
    // rules
    (
        "rules at the priority bounds",
        r#"{"rules": [{"priority": 0, "table": 1}, {"priority": 32767, "table": 1}]}"#,
        OK,
    ),
    (
        "rule with source and destination",
        r#"{"rules": [{"priority": 100, "source": "10.0.0.0/8", "destination": "192.168.0.0/16", "table": 100}]}"#,
        OK,
    ),
    (
        "rule priority over 32767",
        r#"{"rules": [{"priority": 32768, "table": 1}]}"#,
        &[(
            "rules[0].priority",
            "must be an integer between 0 and 32767, got 32768",
        )],
    ),
    (
        "rule priority negative",
        r#"{"rules": [{"priority": -1, "table": 1}]}"#,
        &[(
            "rules[0].priority",
            "must be an integer between 0 and 32767, got -1",
        )],
    ),
    (
        "rule table negative",
        r#"{"rules": [{"table": -2}]}"#,
        &[("rules[0].table", "must be a non-negative integer, got -2")],
    ),
    (
        "rule source not a CIDR",
        r#"{"rules": [{"source": "10.0.0.1", "table": 1}]}"#,
        &[("rules[0].source", "invalid CIDR format '10.0.0.1'")],
    ),
    (
        "rule destination not a CIDR",
        r#"{"rules": [{"destination": "x", "table": 1}]}"#,
        &[("rules[0].destination", "invalid CIDR format 'x'")],
    ),
    (
        "rule source and destination of two families",
        r#"{"rules": [{"source": "10.0.0.0/8", "destination": "2001:db8::/32", "table": 1}]}"#,
        &[(
            "rules[0]",
            "source '10.0.0.0/8' and destination '2001:db8::/32' must be the same IP family",
        )],
    ),
    // neighbours
    (
        "IPv4 and IPv6 neighbours",
        r#"{"neighbors": [{"destination": "10.0.0.9", "hardwareAddr": "02:00:00:00:00:09"}, {"destination": "2001:db8::9", "hardwareAddr": "02-00-00-00-00-0a"}]}"#,
        OK,
    ),
    (
        "neighbour without destination",
        r#"{"neighbors": [{"hardwareAddr": "02:00:00:00:00:09"}]}"#,
        &[("neighbors[0].destination", "cannot be empty")],
    ),
    (
        "neighbour destination is a CIDR",
        r#"{"neighbors": [{"destination": "10.0.0.9/32", "hardwareAddr": "02:00:00:00:00:09"}]}"#,
        &[(
            "neighbors[0].destination",
            "invalid IP address format '10.0.0.9/32'",
        )],
    ),
    (
        "neighbour without MAC",
        r#"{"neighbors": [{"destination": "10.0.0.9"}]}"#,
        &[("neighbors[0].hardwareAddr", "cannot be empty")],
    ),
    (
        "neighbour MAC bad",
        r#"{"neighbors": [{"destination": "10.0.0.9", "hardwareAddr": "02:00"}]}"#,
        &[(
            "neighbors[0].hardwareAddr",
            "invalid Hardware Address format '02:00'",
        )],
    ),
    // ethtool: names are checked against the NIC at Prepare, not here.
    (
        "ethtool features and private flags",
        r#"{"ethtool": {"features": {"tcp-segmentation-offload": false, "rx-gro": true}, "privateFlags": {"legacy-rx": true}}}"#,
        OK,
    ),
    // Every rule at once: all reported, in the order of the document's sections.
    (
        "every section wrong",
        r#"{"interface": {"name": "a/b", "mtu": 10}, "routes": [{"destination": "10.0.0.0/8"}], "rules": [{"priority": 40000, "table": 1}], "neighbors": [{"destination": "x", "hardwareAddr": "y"}]}"#,
        &[
            ("interface.name", "name 'a/b' cannot contain '/'"),
            ("interface.mtu", "must be at least 68, got 10"),
            ("routes[0].gateway", "must be specified for Universe scope routes"),
            (
                "rules[0].priority",
                "must be an integer between 0 and 32767, got 40000",
            ),
            ("neighbors[0].destination", "invalid IP address format 'x'"),
            ("neighbors[0].hardwareAddr", "invalid Hardware Address format 'y'"),
        ],
    ),
];

/// RDMA-only devices (no netdev): everything that needs a netdev is refused, as a whole-config
/// error; the profile is all that may be set.
const RDMA_ONLY_CASES: &[Case] = &[
    ("empty", "{}", OK),
    ("an empty interface name", r#"{"interface": {"name": ""}}"#, OK),
    (
        "interface name",
        r#"{"interface": {"name": "net0"}}"#,
        &[(
            "",
            "interface configuration is not supported for RDMA-only devices",
        )],
    ),
    (
        "mtu",
        r#"{"interface": {"mtu": 9000}}"#,
        &[(
            "",
            "interface configuration is not supported for RDMA-only devices",
        )],
    ),
    (
        "arpIgnore",
        r#"{"interface": {"arpIgnore": 1}}"#,
        &[(
            "",
            "interface configuration is not supported for RDMA-only devices",
        )],
    ),
    (
        "routes",
        r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 253}]}"#,
        &[("", "routes are not supported for RDMA-only devices")],
    ),
    (
        "rules",
        r#"{"rules": [{"priority": 1, "table": 1}]}"#,
        &[("", "rules are not supported for RDMA-only devices")],
    ),
    (
        "ethtool",
        r#"{"ethtool": {"features": {}}}"#,
        &[("", "ethtool configuration is not supported for RDMA-only devices")],
    ),
    (
        "neighbors",
        r#"{"neighbors": [{"destination": "10.0.0.9", "hardwareAddr": "02:00:00:00:00:09"}]}"#,
        &[("", "neighbors are not supported for RDMA-only devices")],
    ),
];

/// Runs one table: every mismatch is collected, so one run shows them all.
fn run(cases: &[Case], check: impl Fn(&[u8]) -> Result<(), ConfigError>) {
    let mut failures = Vec::new();
    for (name, json, want) in cases {
        let got: Vec<(String, String)> = match check(json.as_bytes()) {
            Ok(()) => Vec::new(),
            Err(e @ ConfigError::Json { .. }) => {
                vec![(String::new(), crate::telemetry::chain(&e).to_string())]
            }
            Err(e) => e
                .field_errors()
                .iter()
                .map(|f| (f.path.clone(), f.problem.clone()))
                .collect(),
        };
        let matches = got.len() == want.len()
            && got
                .iter()
                .zip(want.iter())
                .all(|((gp, gm), (wp, wm))| gp == wp && gm.starts_with(wm));
        if !matches {
            failures.push(format!("{name}: {json}\n    want {want:?}\n    got  {got:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn validation_table() {
    run(CASES, |raw| parse_and_validate(raw).map(|_| ()));
}

#[test]
fn rdma_only_validation_table() {
    run(RDMA_ONLY_CASES, |raw| {
        let cfg = parse_and_validate(raw)?;
        validate_rdma_only(&cfg)
    });
}

#[test]
fn the_table_covers_valid_and_invalid_cases_of_every_section() {
    for section in ["interface", "routes", "rules", "neighbors", "ethtool"] {
        let of_section: Vec<&Case> = CASES
            .iter()
            .filter(|(_, json, _)| json.contains(&format!("\"{section}\"")))
            .collect();
        assert!(
            of_section.iter().any(|(_, _, want)| want.is_empty()),
            "no valid case for {section}"
        );
        assert!(
            of_section.iter().any(|(_, _, want)| !want.is_empty()),
            "no invalid case for {section}"
        );
    }
}
