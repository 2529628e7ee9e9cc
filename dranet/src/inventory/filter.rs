//! The CEL `--filter` over device attributes, as upstream (`pkg/filter`): the expression sees
//! `attributes`, a map from attribute name to `{StringValue|IntValue|BoolValue|VersionValue}`
//! (or `IntValues` for a list).
//! A device is kept when the expression is `true` or fails to evaluate; any other result drops it.

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Env, Program, Value};

use super::{AttrValue, Device};

/// Upstream's default: drop veth devices.
pub const DEFAULT_FILTER: &str =
    r#"!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth""#;

/// A compiled filter.
pub struct Filter {
    program: Program,
    /// CEL's standard library (every function, type and macro declaration), built once: each
    /// device is evaluated in a context over it. `Context::default()` builds it anew, per device.
    env: Arc<Env>,
    source: String,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter").field("source", &self.source).finish()
    }
}

impl Filter {
    /// Compiles `expr`; `Ok(None)` for an empty expression (no filtering).
    pub fn compile(expr: &str) -> Result<Option<Self>, super::InventoryError> {
        if expr.trim().is_empty() {
            return Ok(None);
        }
        let program = Program::compile(expr).map_err(|e| super::InventoryError::Filter {
            expr: expr.to_owned(),
            detail: e.to_string(),
        })?;
        Ok(Some(Self {
            program,
            env: Arc::new(Env::stdlib()),
            source: expr.to_owned(),
        }))
    }

    /// True when the device passes.
    #[must_use]
    pub fn keep(&self, device: &Device) -> bool {
        let attrs: HashMap<String, Value> = device
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), attr_value(v)))
            .collect();
        let mut ctx = Context::with_env(Arc::clone(&self.env));
        ctx.add_variable_from_value("attributes", attrs);
        match self.program.execute(&ctx) {
            Ok(Value::Bool(b)) => b,
            Ok(_) => false,
            Err(e) => {
                tracing::debug!(device = %device.name, error = %crate::telemetry::chain(&e), "filter evaluation failed; keeping device");
                true
            }
        }
    }
}

fn attr_value(v: &AttrValue) -> Value {
    let (field, value): (&str, Value) = match v {
        AttrValue::String(s) => ("StringValue", s.clone().into()),
        AttrValue::Int(i) => ("IntValue", (*i).into()),
        AttrValue::Bool(b) => ("BoolValue", (*b).into()),
        AttrValue::Version(s) => ("VersionValue", s.clone().into()),
        AttrValue::Ints(v) => ("IntValues", v.clone().into()),
    };
    HashMap::from([(field.to_owned(), value)]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(attrs: &[(&str, AttrValue)]) -> Device {
        Device {
            name: "d".into(),
            attributes: attrs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
            ..Device::default()
        }
    }

    #[test]
    fn default_filter_drops_veth_only() {
        let f = Filter::compile(DEFAULT_FILTER).unwrap().unwrap();
        assert!(!f.keep(&dev(&[("dra.net/type", AttrValue::String("veth".into()))])));
        assert!(f.keep(&dev(&[("dra.net/type", AttrValue::String("dummy".into()))])));
        assert!(f.keep(&dev(&[("dra.net/type", AttrValue::String("device".into()))])));
        assert!(f.keep(&dev(&[])));
    }

    #[test]
    fn other_expressions() {
        let f = Filter::compile(r#"!attributes["dra.net/virtual"].BoolValue"#)
            .unwrap()
            .unwrap();
        assert!(!f.keep(&dev(&[("dra.net/virtual", AttrValue::Bool(true))])));
        assert!(f.keep(&dev(&[("dra.net/virtual", AttrValue::Bool(false))])));
        // Evaluation error (missing key) keeps the device.
        assert!(f.keep(&dev(&[])));
        let f = Filter::compile(r#"attributes["dra.net/mtu"].IntValue >= 9000"#)
            .unwrap()
            .unwrap();
        assert!(f.keep(&dev(&[("dra.net/mtu", AttrValue::Int(9000))])));
        assert!(!f.keep(&dev(&[("dra.net/mtu", AttrValue::Int(1500))])));
        // A non-bool result drops.
        let f = Filter::compile(r#""x""#).unwrap().unwrap();
        assert!(!f.keep(&dev(&[])));
        // The NUMA list (DRAListTypeAttributes) as IntValues.
        let f = Filter::compile(r#"1 in attributes["resource.kubernetes.io/numaNode"].IntValues"#)
            .unwrap()
            .unwrap();
        let numa = |v: Vec<i64>| dev(&[("resource.kubernetes.io/numaNode", AttrValue::Ints(v))]);
        assert!(f.keep(&numa(vec![0, 1])));
        assert!(!f.keep(&numa(vec![2, 3])));
    }

    #[test]
    fn empty_disables_and_bad_syntax_fails() {
        assert!(Filter::compile("").unwrap().is_none());
        assert!(Filter::compile("  ").unwrap().is_none());
        assert!(Filter::compile("attributes[").is_err());
    }
}
