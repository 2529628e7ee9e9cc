//! The validation the real API server (resource.k8s.io/v1, Kubernetes 1.34) applies to the
//! objects dranet writes, for the in-memory API server: a refusal is a 422 `Invalid` `Status`
//! with one cause per field, as the real one. Only the rules that matter for what dranet sends
//! are modelled (see each function). Test support only.

use serde_json::{Value, json};

/// `ResourceSliceMaxDevices`.
pub const MAX_DEVICES: usize = 128;
/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// `DeviceAttributeMaxValueLength`.
pub const MAX_ATTRIBUTE_VALUE: usize = 64;
/// `DeviceMaxIDLength` for the name part of a qualified name.
pub const MAX_ID: usize = 32;
/// `AllocatedDeviceStatusMaxConditions`.
pub const MAX_CONDITIONS: usize = 8;

/// One field error: (field path, cause reason, message).
pub type Cause = (String, &'static str, String);

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.split('.').all(is_dns_label)
}

fn is_c_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// A qualified attribute or capacity name: `<C identifier ≤ 32>` or
/// `<DNS subdomain ≤ 63>/<C identifier ≤ 32>`.
fn check_qualified_name(field: &str, name: &str, out: &mut Vec<Cause>) {
    let (domain, id) = match name.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, name),
    };
    if let Some(d) = domain
        && !is_dns_subdomain(d, 63)
    {
        out.push((
            field.to_owned(),
            "FieldValueInvalid",
            format!("Invalid value: {d:?}: a DNS-1123 subdomain of at most 63 characters is required as the domain of a qualified name"),
        ));
    }
    if !is_c_identifier(id) {
        out.push((
            field.to_owned(),
            "FieldValueInvalid",
            format!("Invalid value: {id:?}: a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')"),
        ));
    } else if id.len() > MAX_ID {
        out.push((
            field.to_owned(),
            "FieldValueTooLong",
            format!("Too long: may not be more than {MAX_ID} bytes"),
        ));
    }
}

/// The v1 `ResourceSlice` checks that bear on what dranet publishes: driver (DNS subdomain),
/// pool name, `resourceSliceCount` ≥ 1, `nodeName`, ≤ 128 devices, device names (DNS labels,
/// unique), qualified attribute names, exactly one value per attribute, string and version
/// values ≤ 64 bytes, ≤ 32 attributes + capacities per device.
#[must_use]
pub fn resource_slice(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let spec = &obj["spec"];
    let driver = spec["driver"].as_str().unwrap_or_default();
    if !is_dns_subdomain(driver, 63) {
        out.push((
            "spec.driver".into(),
            "FieldValueInvalid",
            format!("Invalid value: {driver:?}: a lowercase RFC 1123 subdomain of at most 63 characters is required"),
        ));
    }
    let pool = spec["pool"]["name"].as_str().unwrap_or_default();
    if pool.is_empty() || pool.len() > 253 || !pool.split('/').all(|p| is_dns_subdomain(p, 253)) {
        out.push((
            "spec.pool.name".into(),
            "FieldValueInvalid",
            format!("Invalid value: {pool:?}: must be one or more DNS subdomains separated by slashes"),
        ));
    }
    match spec["pool"]["resourceSliceCount"].as_i64() {
        Some(n) if n > 0 => {}
        other => out.push((
            "spec.pool.resourceSliceCount".into(),
            "FieldValueInvalid",
            format!(
                "Invalid value: {}: must be greater than zero",
                other.unwrap_or_default()
            ),
        )),
    }
    if spec["pool"]["generation"].as_i64().is_some_and(|g| g < 0) {
        out.push((
            "spec.pool.generation".into(),
            "FieldValueInvalid",
            "Invalid value: must be greater than or equal to 0".into(),
        ));
    }
    let selectors = ["nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection"]
        .iter()
        .filter(|k| !spec[**k].is_null() && spec[**k] != json!(false) && spec[**k] != json!(""))
        .count();
    if selectors != 1 {
        out.push((
            "spec".into(),
            "FieldValueRequired",
            "Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required".into(),
        ));
    }
    let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or_default();
    if devices.len() > MAX_DEVICES {
        out.push((
            "spec.devices".into(),
            "FieldValueTooMany",
            format!(
                "Too many: {}: must have at most {MAX_DEVICES} items",
                devices.len()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, d) in devices.iter().enumerate() {
        let f = format!("spec.devices[{i}]");
        let name = d["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            out.push((
                format!("{f}.name"),
                "FieldValueInvalid",
                format!("Invalid value: {name:?}: {LABEL_MSG}"),
            ));
        } else if !seen.insert(name.to_owned()) {
            out.push((
                format!("{f}.name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {name:?}"),
            ));
        }
        let attrs = d["attributes"].as_object();
        let caps = d["capacity"].as_object();
        let n = attrs.map_or(0, serde_json::Map::len) + caps.map_or(0, serde_json::Map::len);
        if n > MAX_ATTRIBUTES_AND_CAPACITIES {
            out.push((
                f.clone(),
                "FieldValueTooMany",
                format!("Too many: {n}: must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities combined"),
            ));
        }
        for (k, v) in attrs.into_iter().flatten() {
            let af = format!("{f}.attributes[{k}]");
            check_qualified_name(&af, k, &mut out);
            let kinds: Vec<&str> = ["int", "bool", "string", "version"]
                .into_iter()
                .filter(|t| !v[*t].is_null())
                .collect();
            if kinds.len() != 1 {
                out.push((
                    af.clone(),
                    "FieldValueInvalid",
                    "Invalid value: exactly one value must be specified".into(),
                ));
            }
            for t in ["string", "version"] {
                if let Some(s) = v[t].as_str()
                    && s.len() > MAX_ATTRIBUTE_VALUE
                {
                    out.push((
                        format!("{af}.{t}"),
                        "FieldValueTooLong",
                        format!("Too long: may not be more than {MAX_ATTRIBUTE_VALUE} bytes"),
                    ));
                }
            }
        }
        for k in caps.into_iter().flatten().map(|(k, _)| k) {
            check_qualified_name(&format!("{f}.capacity[{k}]"), k, &mut out);
        }
    }
    out
}

/// The checks of a claim's `status.devices` after a status write: each entry is an allocated
/// device of the claim (driver, pool, device as in `status.allocation.devices.results`), no
/// entry twice, at most 8 conditions, `networkData.interfaceName` ≤ 256 bytes, `ips` in CIDR
/// form.
#[must_use]
pub fn claim_status(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let allocated: Vec<(&Value, &Value, &Value)> = obj
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| (&r["driver"], &r["pool"], &r["device"]))
        .collect();
    let mut seen = Vec::new();
    for (i, d) in obj
        .pointer("/status/devices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let f = format!("status.devices[{i}]");
        let id = (&d["driver"], &d["pool"], &d["device"]);
        let shown = format!(
            "{}/{}/{}",
            d["driver"].as_str().unwrap_or_default(),
            d["pool"].as_str().unwrap_or_default(),
            d["device"].as_str().unwrap_or_default()
        );
        if !allocated.contains(&id) {
            out.push((
                f.clone(),
                "FieldValueInvalid",
                format!("Invalid value: {shown:?}: must be an allocated device in the claim"),
            ));
        }
        if seen.contains(&id) {
            out.push((
                f.clone(),
                "FieldValueDuplicate",
                format!("Duplicate value: {shown:?}"),
            ));
        }
        seen.push(id);
        if d["conditions"]
            .as_array()
            .is_some_and(|c| c.len() > MAX_CONDITIONS)
        {
            out.push((
                format!("{f}.conditions"),
                "FieldValueTooMany",
                format!("Too many: must have at most {MAX_CONDITIONS} items"),
            ));
        }
        if d["networkData"]["interfaceName"]
            .as_str()
            .is_some_and(|n| n.len() > 256)
        {
            out.push((
                format!("{f}.networkData.interfaceName"),
                "FieldValueTooLong",
                "Too long: may not be more than 256 bytes".into(),
            ));
        }
        for (j, ip) in d["networkData"]["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let s = ip.as_str().unwrap_or_default();
            let ok = s.split_once('/').is_some_and(|(a, p)| {
                a.parse::<std::net::IpAddr>().is_ok() && p.parse::<u8>().is_ok_and(|p| p <= 128)
            });
            if !ok {
                out.push((
                    format!("{f}.networkData.ips[{j}]"),
                    "FieldValueInvalid",
                    format!("Invalid value: {s:?}: must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::/64)"),
                ));
            }
        }
    }
    out
}

/// The 422 `Invalid` `Status` for `causes` on object `name` of `kind` in `group`.
#[must_use]
pub fn invalid(kind: &str, group: &str, name: &str, causes: &[Cause]) -> Value {
    let gk = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let details: Vec<String> = causes.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
    let message = if details.len() == 1 {
        format!("{gk} \"{name}\" is invalid: {}", details[0])
    } else {
        format!("{gk} \"{name}\" is invalid: [{}]", details.join(", "))
    };
    let mut status = crate::apiserver::status_body(422, "Invalid", &message);
    status["details"] = json!({
        "name": name,
        "group": group,
        "kind": kind,
        "causes": causes.iter().map(|(f, r, m)| json!({"reason": r, "message": m, "field": f})).collect::<Vec<_>>(),
    });
    status
}

/// Problems of a node's pool as the scheduler sees it (not a write check of the real server:
/// it validates each slice alone): at the newest generation the pool must have exactly
/// `resourceSliceCount` slices, all saying the same count, and no device twice.
#[must_use]
pub fn pool_problems(slices: &[Value]) -> Vec<String> {
    let newest = slices
        .iter()
        .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
        .max();
    let Some(g) = newest else {
        return vec!["no slice".into()];
    };
    let current: Vec<&Value> = slices
        .iter()
        .filter(|s| s["spec"]["pool"]["generation"].as_i64() == Some(g))
        .collect();
    let mut out = Vec::new();
    let counts: std::collections::BTreeSet<i64> = current
        .iter()
        .filter_map(|s| s["spec"]["pool"]["resourceSliceCount"].as_i64())
        .collect();
    if counts.len() != 1 {
        out.push(format!(
            "generation {g}: slices disagree on resourceSliceCount: {counts:?}"
        ));
    } else if counts.first().copied() != i64::try_from(current.len()).ok() {
        out.push(format!(
            "generation {g}: {} slices, resourceSliceCount {counts:?}",
            current.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for s in &current {
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let n = d["name"].as_str().unwrap_or_default().to_owned();
            if !names.insert(n.clone()) {
                out.push(format!("generation {g}: device {n} in two slices"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(devices: Vec<Value>) -> Value {
        json!({"spec": {"driver": "dra.net", "nodeName": "n", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1}, "devices": devices}})
    }

    #[test]
    fn slice_limits() {
        let ok = slice(vec![
            json!({"name": "eth1", "attributes": {"dra.net/ifName": {"string": "eth1"}, "mtu": {"int": 1500}}}),
        ]);
        assert!(resource_slice(&ok).is_empty(), "{:?}", resource_slice(&ok));
        let many = slice((0..129).map(|i| json!({"name": format!("d{i}")})).collect());
        assert_eq!(resource_slice(&many)[0].0, "spec.devices");
        let bad = slice(vec![json!({"name": "Eth_1", "attributes": {
            "dra.net/has space": {"string": "x"},
            "Bad_Domain/x": {"int": 1},
            "dra.net/a_very_long_identifier_of_more_than_32": {"bool": true},
            "dra.net/long": {"string": "x".repeat(65)},
            "dra.net/two": {"int": 1, "bool": true},
        }})]);
        let fields: Vec<String> = resource_slice(&bad).into_iter().map(|c| c.0).collect();
        for f in [
            "spec.devices[0].name",
            "spec.devices[0].attributes[dra.net/has space]",
            "spec.devices[0].attributes[Bad_Domain/x]",
            "spec.devices[0].attributes[dra.net/a_very_long_identifier_of_more_than_32]",
            "spec.devices[0].attributes[dra.net/long].string",
            "spec.devices[0].attributes[dra.net/two]",
        ] {
            assert!(fields.iter().any(|x| x == f), "{f} not in {fields:?}");
        }
        let attrs: serde_json::Map<String, Value> =
            (0..33).map(|i| (format!("a{i}"), json!({"int": i}))).collect();
        let fat = slice(vec![json!({"name": "d", "attributes": attrs})]);
        assert_eq!(resource_slice(&fat)[0].1, "FieldValueTooMany");
        let mut zero = ok.clone();
        zero["spec"]["pool"]["resourceSliceCount"] = json!(0);
        assert_eq!(resource_slice(&zero)[0].0, "spec.pool.resourceSliceCount");
    }

    #[test]
    fn claim_status_entries_must_be_allocated() {
        let claim = json!({"status": {
            "allocation": {"devices": {"results": [{"driver": "dra.net", "pool": "n", "device": "eth1", "request": "r"}]}},
            "devices": [
                {"driver": "dra.net", "pool": "n", "device": "eth1", "networkData": {"ips": ["10.0.0.1/24"]}},
                {"driver": "dra.net", "pool": "n", "device": "eth2"},
                {"driver": "dra.net", "pool": "n", "device": "eth1", "networkData": {"ips": ["10.0.0.1"]}}
            ]
        }});
        let c = claim_status(&claim);
        let fields: Vec<&str> = c.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            fields,
            [
                "status.devices[1]",
                "status.devices[2]",
                "status.devices[2].networkData.ips[0]"
            ],
            "{c:?}"
        );
        let s = invalid("ResourceClaim", "resource.k8s.io", "c", &c[..1]);
        assert_eq!(
            s["message"],
            "ResourceClaim.resource.k8s.io \"c\" is invalid: status.devices[1]: Invalid value: \"dra.net/n/eth2\": must be an allocated device in the claim"
        );
        assert_eq!(s["code"], 422);
        assert_eq!(s["reason"], "Invalid");
    }

    #[test]
    fn pool_consistency() {
        let s = |g: i64, c: i64, devs: &[&str]| {
            json!({"spec": {"pool": {"generation": g, "resourceSliceCount": c},
                "devices": devs.iter().map(|d| json!({"name": d})).collect::<Vec<_>>()}})
        };
        assert!(pool_problems(&[s(2, 2, &["a"]), s(2, 2, &["b"]), s(1, 3, &["a"])]).is_empty());
        assert_eq!(pool_problems(&[s(2, 2, &["a"])]).len(), 1);
        assert_eq!(pool_problems(&[s(2, 1, &["a"]), s(2, 2, &["b"])]).len(), 1);
        assert_eq!(pool_problems(&[s(2, 2, &["a"]), s(2, 2, &["a"])]).len(), 1);
    }
}
