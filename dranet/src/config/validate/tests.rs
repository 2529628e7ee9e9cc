// Over 500 lines: one test per validation message.

use super::*;

fn errors_of(json: &str) -> Vec<String> {
    match parse_and_validate(json.as_bytes()) {
        Ok(_) => Vec::new(),
        Err(e @ ConfigError::Json { .. }) => vec![e.to_string()],
        Err(ConfigError::Decode { errors } | ConfigError::Invalid { errors }) => {
            errors.iter().map(ToString::to_string).collect()
        }
    }
}

fn assert_one(json: &str, needle: &str) {
    let errs = errors_of(json);
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "expected an error containing {needle:?} for {json}, got {errs:?}"
    );
}

fn assert_ok(json: &str) {
    let errs = errors_of(json);
    assert!(errs.is_empty(), "expected {json} to validate, got {errs:?}");
}

#[test]
fn empty_and_null_are_the_empty_config() {
    assert_eq!(parse_and_validate(b"").unwrap(), NetworkConfig::default());
    assert_eq!(parse_and_validate(b"  ").unwrap(), NetworkConfig::default());
    assert_eq!(parse_and_validate(b"null").unwrap(), NetworkConfig::default());
    assert_eq!(parse_and_validate(b"{}").unwrap(), NetworkConfig::default());
}

#[test]
fn full_valid_config_round_trips() {
    let json = r#"{
      "interface": {"name": "eth99", "addresses": ["10.0.0.2/24", "fd00::2/64"], "mtu": 9000,
        "hardwareAddr": "02:00:00:00:00:01", "gsoMaxSize": 65536, "groMaxSize": 65536,
        "gsoIPv4MaxSize": 65536, "groIPv4MaxSize": 65536, "disableEbpfPrograms": true,
        "arpIgnore": 8, "arpAnnounce": 2},
      "routes": [{"destination": "0.0.0.0/0", "gateway": "10.0.0.1", "table": 100},
                 {"destination": "10.1.0.0/16", "scope": 253},
                 {"destination": "fd01::/64", "gateway": "fd00::1", "source": "fd00::2"}],
      "rules": [{"priority": 100, "source": "10.0.0.0/24", "table": 100}],
      "neighbors": [{"destination": "10.0.0.9", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}],
      "ethtool": {"features": {"tcp-segmentation-offload": false}, "privateFlags": {"x": true}}
    }"#;
    let cfg = parse_and_validate(json.as_bytes()).unwrap();
    assert_eq!(cfg.interface.name.as_deref(), Some("eth99"));
    assert_eq!(cfg.interface.mtu, Some(9000));
    assert_eq!(cfg.routes.len(), 3);
    assert_eq!(cfg.routes[1].scope, 253);
    let back = serde_json::to_vec(&cfg).unwrap();
    assert_eq!(parse_and_validate(&back).unwrap(), cfg);
}

#[test]
fn malformed_json_and_unknown_fields_are_rejected() {
    assert_one("{", "failed to unmarshal JSON data");
    assert_one(r#"{"bogus": 1}"#, "unknown field `bogus`");
    assert_one(r#"{"interface": {"nmae": "x"}}"#, "unknown field `nmae`");
    assert_one(r#"{"routes": [{"dst": "1.2.3.0/24"}]}"#, "unknown field `dst`");
    assert_one(
        r#"{"interface": {"mtu": "big"}}"#,
        "interface.mtu: invalid type: string \"big\", expected i32",
    );
    // Case-sensitive like sigs.k8s.io/json strict decoding.
    assert_one(r#"{"Interface": {}}"#, "unknown field `Interface`");
    // The documented-but-wrong neighbour field name.
    assert_one(
        r#"{"neighbors": [{"ipAddress": "1.2.3.4", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#,
        "unknown field `ipAddress`",
    );
    assert!(matches!(
        parse_and_validate(b"[1]"),
        Err(ConfigError::Decode { .. })
    ));
    assert!(matches!(
        parse_and_validate(b"{\"interface\": "),
        Err(ConfigError::Json { .. })
    ));
}

#[test]
fn every_decoding_error_is_reported_with_its_path() {
    let json = r#"{
      "bogus": 1,
      "interface": {"nmae": "x", "mtu": "big", "addresses": [1, "10.0.0.1/24", 2, {"a": 1}]},
      "routes": [{"dst": "x"}, {"destination": "10.0.0.0/8"}, {"destination": "10.1.0.0/16", "gw": "y"}],
      "neighbors": ["x", {"destination": "10.0.0.9", "hardwareAddr": 5}]
    }"#;
    let err = parse_and_validate(json.as_bytes()).unwrap_err();
    assert!(matches!(err, ConfigError::Decode { .. }), "{err:?}");
    let got: Vec<(&str, &str)> = err
        .field_errors()
        .iter()
        .map(|e| (e.path.as_str(), e.problem.as_str()))
        .collect();
    let paths: Vec<&str> = got.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        paths,
        [
            // Members in key order (the decoder sees an ordered map), array elements in order.
            "bogus",
            "interface.addresses[0]",
            "interface.addresses[2]",
            "interface.addresses[3]",
            "interface.mtu",
            "interface.nmae",
            "neighbors[0]",
            "neighbors[1].hardwareAddr",
            "routes[0].dst",
            "routes[2].gw",
        ],
        "{got:#?}"
    );
    assert!(
        got[0].1.starts_with("unknown field `bogus`, expected one of"),
        "{}",
        got[0].1
    );
    assert_eq!(got[1].1, "invalid type: integer `1`, expected a string");
    assert_eq!(got[4].1, "invalid type: string \"big\", expected i32");
    assert!(
        err.to_string()
            .starts_with("failed to unmarshal JSON data: bogus: unknown field")
    );
    // Bounded: a config with hundreds of errors reports the first 32.
    let many: String = (0..100)
        .map(|i| format!("\"f{i}\": 1"))
        .collect::<Vec<_>>()
        .join(",");
    let err = parse_and_validate(format!("{{{many}}}").as_bytes()).unwrap_err();
    assert_eq!(err.field_errors().len(), 32);
}

#[test]
fn interface_names() {
    assert_ok(r#"{"interface": {"name": "eth0"}}"#);
    assert_ok(r#"{"interface": {"name": "a.b-c_d"}}"#);
    assert_ok(r#"{"interface": {"name": "123456789012345"}}"#);
    assert_ok(r#"{"interface": {"name": ""}}"#);
    assert_one(
        r#"{"interface": {"name": "1234567890123456"}}"#,
        "interface.name: name '1234567890123456' exceeds maximum length of 15 characters",
    );
    assert_one(r#"{"interface": {"name": "a/b"}}"#, "cannot contain '/'");
    assert_one(r#"{"interface": {"name": "a b"}}"#, "cannot contain whitespace");
    assert_one(r#"{"interface": {"name": "a\tb"}}"#, "cannot contain whitespace");
    assert_one(r#"{"interface": {"name": "."}}"#, "cannot be '.' or '..'");
    assert_one(r#"{"interface": {"name": ".."}}"#, "cannot be '.' or '..'");
    assert_one(
        r#"{"interface": {"name": "eth:0"}}"#,
        "contains invalid character ':'",
    );
    // '/' is reported once, not also as an invalid character.
    let errs = errors_of(r#"{"interface": {"name": "a/b"}}"#);
    assert_eq!(errs.len(), 1, "{errs:?}");
}

#[test]
fn interface_addresses_and_dhcp() {
    assert_ok(r#"{"interface": {"addresses": ["192.168.1.5/24", "2001:db8::1/128"]}}"#);
    assert_one(
        r#"{"interface": {"addresses": ["192.168.1.5"]}}"#,
        "interface.addresses[0]: invalid IP CIDR format '192.168.1.5'",
    );
    assert_one(r#"{"interface": {"addresses": ["10.0.0.1/33"]}}"#, "addresses[0]");
    assert_one(
        r#"{"interface": {"addresses": ["10.0.0.1/024"]}}"#,
        "addresses[0]",
    );
    assert_one(r#"{"interface": {"addresses": ["ok/24"]}}"#, "addresses[0]");
    assert_one(
        r#"{"interface": {"addresses": ["10.0.0.1/24", "x"]}}"#,
        "interface.addresses[1]",
    );
    assert_ok(r#"{"interface": {"dhcp": true}}"#);
    assert_ok(r#"{"interface": {"dhcp": false, "addresses": ["10.0.0.1/24"]}}"#);
    assert_one(
        r#"{"interface": {"dhcp": true, "addresses": ["10.0.0.1/24"]}}"#,
        "interface: dhcp and addresses are mutually exclusive",
    );
}

#[test]
fn interface_mtu_mac_and_offload_sizes() {
    assert_ok(r#"{"interface": {"mtu": 68}}"#);
    assert_one(
        r#"{"interface": {"mtu": 67}}"#,
        "interface.mtu: must be at least 68, got 67",
    );
    assert_one(r#"{"interface": {"mtu": -1}}"#, "interface.mtu");
    assert_ok(r#"{"interface": {"hardwareAddr": "00-11-22-33-44-55"}}"#);
    assert_ok(r#"{"interface": {"hardwareAddr": "0011.2233.4455"}}"#);
    assert_ok(r#"{"interface": {"hardwareAddr": "00:11:22:33:44:55:66:77"}}"#);
    assert_one(
        r#"{"interface": {"hardwareAddr": "00:11:22:33:44"}}"#,
        "interface.hardwareAddr: invalid Hardware Address format",
    );
    assert_one(
        r#"{"interface": {"hardwareAddr": "zz:11:22:33:44:55"}}"#,
        "hardwareAddr",
    );
    assert_one(r#"{"interface": {"hardwareAddr": ""}}"#, "hardwareAddr");
    for f in ["gsoMaxSize", "groMaxSize", "gsoIPv4MaxSize", "groIPv4MaxSize"] {
        assert_ok(&format!(r#"{{"interface": {{"{f}": 1}}}}"#));
        assert_one(
            &format!(r#"{{"interface": {{"{f}": 0}}}}"#),
            &format!("interface.{f}: must be positive, got 0"),
        );
        assert_one(&format!(r#"{{"interface": {{"{f}": -5}}}}"#), f);
    }
}

#[test]
fn interface_arp_sysctls() {
    for v in [0, 1, 2, 3, 8] {
        assert_ok(&format!(r#"{{"interface": {{"arpIgnore": {v}}}}}"#));
    }
    for v in [-1, 4, 5, 6, 7, 9] {
        assert_one(
            &format!(r#"{{"interface": {{"arpIgnore": {v}}}}}"#),
            "interface.arpIgnore",
        );
    }
    for v in [0, 1, 2] {
        assert_ok(&format!(r#"{{"interface": {{"arpAnnounce": {v}}}}}"#));
    }
    for v in [-1, 3] {
        assert_one(
            &format!(r#"{{"interface": {{"arpAnnounce": {v}}}}}"#),
            "interface.arpAnnounce",
        );
    }
}

#[test]
fn vrf_rules_and_default_table() {
    let cfg = parse_and_validate(br#"{"interface": {"vrf": {"name": "blue"}}}"#).unwrap();
    let table = cfg.interface.vrf.unwrap().table.unwrap();
    assert!((1000..2000).contains(&table), "{table}");
    let again = parse_and_validate(br#"{"interface": {"vrf": {"name": "blue"}}}"#).unwrap();
    assert_eq!(again.interface.vrf.unwrap().table, Some(table));
    assert_ok(r#"{"interface": {"vrf": {"name": "red", "table": 10}}}"#);
    assert_one(
        r#"{"interface": {"vrf": {}}}"#,
        "interface.vrf.name: cannot be empty",
    );
    assert_one(
        r#"{"interface": {"vrf": {"name": "r", "table": 0}}}"#,
        "interface.vrf.table: must be a positive integer, got 0",
    );
    for t in [253, 254, 255] {
        assert_one(
            &format!(r#"{{"interface": {{"vrf": {{"name": "r", "table": {t}}}}}}}"#),
            &format!("cannot use reserved table ID {t}"),
        );
    }
    assert_one(
        r#"{"interface": {"vrf": {"name": "r"}}, "rules": [{"priority": 1, "table": 5}]}"#,
        "rules are not supported when VRF is enabled",
    );
}

#[test]
fn fnv32a_matches_known_vectors() {
    // Published FNV-1a 32-bit test vectors.
    assert_eq!(super::super::fnv32a(b""), 0x811c_9dc5);
    assert_eq!(super::super::fnv32a(b"a"), 0xe40c_292c);
    assert_eq!(super::super::fnv32a(b"foobar"), 0xbf9c_f968);
}

#[test]
fn routes() {
    assert_one(
        r#"{"routes": [{"gateway": "10.0.0.1"}]}"#,
        "routes[0].destination: cannot be empty",
    );
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0", "gateway": "10.0.0.1"}]}"#,
        "routes[0].destination: invalid CIDR format '10.0.0.0' (host routes use /32 or /128)",
    );
    assert_ok(r#"{"routes": [{"destination": "10.0.0.5/32", "gateway": "10.0.0.1"}]}"#);
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "scope": 200}]}"#,
        "routes[0].scope: invalid scope '200', only Link (253) or Universe (0) allowed",
    );
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8"}]}"#,
        "routes[0].gateway: must be specified for Universe scope routes",
    );
    assert_ok(r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 253}]}"#);
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "nope"}]}"#,
        "routes[0].gateway: invalid IP address format 'nope'",
    );
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "fd00::1"}]}"#,
        "routes[0].gateway: 'fd00::1' must be the same IP family as destination '10.0.0.0/8'",
    );
    assert_ok(r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "::ffff:10.0.0.1"}]}"#);
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "source": "x"}]}"#,
        "routes[0].source: invalid IP address format 'x'",
    );
    assert_one(
        r#"{"routes": [{"destination": "fd00::/8", "gateway": "fd00::1", "source": "10.0.0.1"}]}"#,
        "routes[0].source: '10.0.0.1' must be the same IP family",
    );
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "table": -1}]}"#,
        "routes[0].table: must be a non-negative integer, got -1",
    );
    assert_one(
        r#"{"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1"}, {"destination": "x", "scope": 253}]}"#,
        "routes[1].destination",
    );
}

#[test]
fn rules() {
    assert_ok(r#"{"rules": [{"priority": 0, "table": 1}, {"priority": 32767, "table": 1}]}"#);
    assert_one(
        r#"{"rules": [{"priority": 32768}]}"#,
        "rules[0].priority: must be an integer between 0 and 32767, got 32768",
    );
    assert_one(r#"{"rules": [{"priority": -1}]}"#, "rules[0].priority");
    assert_one(
        r#"{"rules": [{"table": -2}]}"#,
        "rules[0].table: must be a non-negative integer, got -2",
    );
    assert_one(
        r#"{"rules": [{"source": "10.0.0.1"}]}"#,
        "rules[0].source: invalid CIDR format '10.0.0.1'",
    );
    assert_one(
        r#"{"rules": [{"destination": "zz/8"}]}"#,
        "rules[0].destination: invalid CIDR format 'zz/8'",
    );
    assert_one(
        r#"{"rules": [{"source": "10.0.0.0/8", "destination": "fd00::/8"}]}"#,
        "rules[0]: source '10.0.0.0/8' and destination 'fd00::/8' must be the same IP family",
    );
}

#[test]
fn neighbors() {
    assert_ok(r#"{"neighbors": [{"destination": "fd00::9", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#);
    assert_one(
        r#"{"neighbors": [{"hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#,
        "neighbors[0].destination: cannot be empty",
    );
    assert_one(
        r#"{"neighbors": [{"destination": "10.0.0.0/24", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#,
        "neighbors[0].destination: invalid IP address format '10.0.0.0/24'",
    );
    assert_one(
        r#"{"neighbors": [{"destination": "10.0.0.1"}]}"#,
        "neighbors[0].hardwareAddr: cannot be empty",
    );
    assert_one(
        r#"{"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "aa:bb"}]}"#,
        "neighbors[0].hardwareAddr: invalid Hardware Address format 'aa:bb'",
    );
}

#[test]
fn all_errors_are_reported_together() {
    let errs = errors_of(r#"{"interface": {"name": "a/b", "mtu": 1}, "routes": [{"destination": ""}]}"#);
    assert!(errs.len() >= 4, "{errs:?}");
    let e = parse_and_validate(br#"{"interface": {"mtu": 1, "gsoMaxSize": 0}}"#).unwrap_err();
    assert_eq!(e.field_errors().len(), 2);
    assert!(e.to_string().contains("; "), "{e}");
}

#[test]
fn rdma_only_rejects_netdev_settings() {
    let ok = parse_and_validate(b"{}").unwrap();
    assert!(validate_rdma_only(&ok).is_ok());
    for json in [
        r#"{"interface": {"name": "eth1"}}"#,
        r#"{"interface": {"addresses": ["10.0.0.1/24"]}}"#,
        r#"{"interface": {"mtu": 1500}}"#,
        r#"{"interface": {"hardwareAddr": "aa:bb:cc:dd:ee:ff"}}"#,
        r#"{"interface": {"dhcp": false}}"#,
        r#"{"interface": {"gsoMaxSize": 1}}"#,
        r#"{"interface": {"groIPv4MaxSize": 1}}"#,
        r#"{"interface": {"disableEbpfPrograms": true}}"#,
        r#"{"interface": {"arpIgnore": 1}}"#,
        r#"{"interface": {"arpAnnounce": 1}}"#,
    ] {
        let cfg = parse_and_validate(json.as_bytes()).unwrap();
        let e = validate_rdma_only(&cfg).unwrap_err();
        assert!(
            e.to_string()
                .contains("interface configuration is not supported for RDMA-only"),
            "{json}: {e}"
        );
    }
    for (json, needle) in [
        (
            r#"{"routes": [{"destination": "10.0.0.0/8", "scope": 253}]}"#,
            "routes are",
        ),
        (r#"{"rules": [{"priority": 1}]}"#, "rules are"),
        (r#"{"ethtool": {}}"#, "ethtool configuration is"),
        (
            r#"{"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}]}"#,
            "neighbors are",
        ),
    ] {
        let cfg = parse_and_validate(json.as_bytes()).unwrap();
        let e = validate_rdma_only(&cfg).unwrap_err();
        assert!(e.to_string().contains(needle), "{json}: {e}");
    }
}

#[test]
fn mac_forms() {
    assert!(is_valid_mac("02:42:ac:11:00:02"));
    assert!(is_valid_mac("02-42-AC-11-00-02"));
    assert!(is_valid_mac("0242.ac11.0002"));
    assert!(is_valid_mac(
        "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"
    ));
    assert!(!is_valid_mac("02:42:ac:11:00"));
    assert!(!is_valid_mac("02:42:ac:11:00:2"));
    assert!(!is_valid_mac("02:42-ac:11:00:02"));
    assert!(!is_valid_mac("0242.ac11"));
}

#[test]
fn null_means_zero_value_like_go() {
    let cfg = parse_and_validate(
        br#"{"interface": null, "routes": null, "rules": null, "neighbors": null, "ethtool": null, "profile": null}"#,
    )
    .unwrap();
    assert_eq!(cfg, NetworkConfig::default());
    let cfg = parse_and_validate(
        br#"{"interface": {"addresses": null, "name": null}, "routes": [{"destination": "10.0.0.0/8", "scope": 253, "gateway": null, "table": null}]}"#,
    )
    .unwrap();
    assert!(cfg.interface.addresses.is_empty());
    assert_eq!(cfg.routes[0].table, 0);
    assert_eq!(cfg.routes[0].gateway, "");
}

/// Every member of a full config replaced, one at a time, by values of every JSON type: the
/// decoder ends, and a failure names at least one path that exists in the document.
#[test]
fn wrong_types_everywhere_are_reported_with_paths() {
    fn leaves(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    leaves(x, format!("{at}/{k}"), out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    leaves(x, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
        out.push(at);
    }
    let full: serde_json::Value = serde_json::from_str(
        r#"{"interface": {"name": "eth9", "addresses": ["10.0.0.2/24"], "mtu": 9000,
            "hardwareAddr": "02:00:00:00:00:01", "vrf": {"name": "v", "table": 1001}},
           "routes": [{"destination": "0.0.0.0/0", "gateway": "10.0.0.1"}],
           "neighbors": [{"destination": "10.0.0.9", "hardwareAddr": "aa:bb:cc:dd:ee:ff"}],
           "ethtool": {"features": {"tso": false}}}"#,
    )
    .unwrap();
    let mut ptrs = Vec::new();
    leaves(&full, String::new(), &mut ptrs);
    let kinds = [
        serde_json::json!(7),
        serde_json::json!(-1.5),
        serde_json::json!("s"),
        serde_json::json!(true),
        serde_json::json!([1, {"x": 1}]),
        serde_json::json!({"bogus": [1]}),
    ];
    let mut decode_failures = 0;
    for p in ptrs.iter().filter(|p| !p.is_empty()) {
        for k in &kinds {
            let mut doc = full.clone();
            *doc.pointer_mut(p).unwrap() = k.clone();
            let raw = serde_json::to_vec(&doc).unwrap();
            match parse_and_validate(&raw) {
                Ok(_) | Err(ConfigError::Invalid { .. }) => {}
                Err(e @ ConfigError::Decode { .. }) => {
                    decode_failures += 1;
                    let errs = e.field_errors();
                    assert!(!errs.is_empty() && errs.len() <= 32, "{p} = {k}: {e}");
                    assert!(errs.iter().all(|f| !f.problem.is_empty()), "{p} = {k}: {e}");
                    // The path of the member that was replaced (or something inside it).
                    let want = p.trim_start_matches('/').replace('/', ".");
                    let named = errs.iter().any(|f| {
                        let norm = f.path.replace('[', ".").replace(']', "");
                        norm.starts_with(&want) || want.starts_with(&norm)
                    });
                    assert!(named, "{p} = {k}: {e}");
                }
                Err(e) => panic!("{p} = {k}: not JSON? {e}"),
            }
        }
    }
    assert!(decode_failures > 50, "{decode_failures}");
}
