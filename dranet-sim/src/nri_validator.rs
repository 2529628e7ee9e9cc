//! NRI's built-in default validator, the part that requires plugins, as the runtime harness runs
//! it at CreateContainer ([`crate::nri_runtime`]). Modelled on containerd/nri
//! `plugins/default-validator/default-validator.go` (`validateRequiredPlugins`),
//! `pkg/plugin` (`GetEffectiveAnnotation`), `pkg/api/validate.go` (`GetPluginMap`,
//! `ValidationResult`) and `pkg/adaptation/adaptation.go` (`CreateContainer`), which are the same
//! in NRI v0.10.0 through v0.12.x: containerd ≥ 2.2 (2.3.4 vendors v0.12.0) and CRI-O with NRI ≥ v0.10
//! (1.36.3 vendors v0.11.0). Debian's containerd builds (2.1.9: NRI v0.8.0; 1.7.24: v0.6.1) have
//! no validator at all.
//!
//! What the real one does:
//! * It is a builtin plugin, `00-default-validator`, present only when enabled (containerd
//!   `[plugins.'io.containerd.nri.v1.nri'.default_validator] enable`, CRI-O
//!   `[crio.nri.default_validator] nri_enable_default_validator`).
//! * It is consulted at **CreateContainer only** (never RunPodSandbox or any other request), after
//!   every plugin was called.
//! * The plugins that count as present are every plugin in the runtime's list when the
//!   CreateContainer request began, the validator itself included, each recorded *before* it is
//!   called: a plugin that times out on this very request (the runtime then drops it and goes on
//!   without its answer) still counts as present for it. A plugin matches by its base name
//!   (`dranet`) or by `<index>-<name>` (`10-dranet`).
//! * Required = the global `required_plugins` plus the pod's annotation
//!   `required-plugins.noderesource.dev`, a YAML list, read at the most specific scope present:
//!   `<key>/container.<name>`, then `<key>/pod`, then `<key>`. Only the **pod sandbox's**
//!   annotations are read (the container's own are not).
//! * `tolerate_missing_plugins_annotation` names an annotation key (no default; NRI's docs use
//!   `tolerate-missing-nri-plugins.noderesource.dev` as the example). If set and the pod carries
//!   it (same scopes) with a value Go's `strconv.ParseBool` reads as true, the check passes, the
//!   per-pod annotation included; false goes on to the check; anything else is an error.
//! * The refusal the CRI CreateContainer gets: `validator "00-default-validator" rejected
//!   container adjustment, reason: validation error: required plugin "dranet" not present`
//!   (several missing: `required plugins "a,b" not present`). kubelet records CreateContainerError
//!   and retries in the same sandbox ([`crate::kubelet::PodSyncBackoff`]).

use std::collections::HashMap;

use dranet::nri::pb::nri as pb;

/// The per-pod annotation key of required plugins (`plugin.RequiredPluginsAnnotation`).
pub const REQUIRED_PLUGINS_ANNOTATION: &str = "required-plugins.noderesource.dev";
/// The toleration key NRI's docs (`docs/validation-plugins.md`) use as their example, and the one
/// dranet's DaemonSet pod carries. NRI has no default: the runtime must be configured with it.
pub const TOLERATION_ANNOTATION: &str = "tolerate-missing-nri-plugins.noderesource.dev";
/// The builtin validator's name in the runtime's plugin list.
pub const VALIDATOR_BASE: &str = "default-validator";
/// The builtin validator's index.
pub const VALIDATOR_INDEX: &str = "00";

/// The default validator's settings that concern required plugins (the `reject_*` settings are
/// about adjustments dranet never makes and are not modelled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DefaultValidatorConfig {
    /// Off by default in both runtimes.
    pub enable: bool,
    /// Plugins every container of the node needs.
    pub required_plugins: Vec<String>,
    /// An annotation key that lets a pod or container tolerate missing plugins ("" = none).
    pub tolerate_missing_plugins_annotation: String,
}

impl DefaultValidatorConfig {
    /// The global set-up: `dranet` required for every container, dranet's own pod tolerating it
    /// with [`TOLERATION_ANNOTATION`].
    #[must_use]
    pub fn global_dranet() -> Self {
        Self {
            enable: true,
            required_plugins: vec!["dranet".into()],
            tolerate_missing_plugins_annotation: TOLERATION_ANNOTATION.into(),
        }
    }

    /// The per-pod set-up: the validator on, nothing required globally; pods opt in with
    /// [`REQUIRED_PLUGINS_ANNOTATION`].
    #[must_use]
    pub fn per_pod() -> Self {
        Self {
            enable: true,
            ..Self::default()
        }
    }

    /// The containerd (≥ 2.2) config table for these settings.
    #[must_use]
    pub fn containerd_toml(&self) -> String {
        format!(
            "[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = {}\n  required_plugins = {}\n  tolerate_missing_plugins_annotation = {:?}\n",
            self.enable,
            toml_list(&self.required_plugins),
            self.tolerate_missing_plugins_annotation
        )
    }

    /// The CRI-O (NRI ≥ v0.10) config table for these settings.
    #[must_use]
    pub fn crio_toml(&self) -> String {
        format!(
            "[crio.nri.default_validator]\nnri_enable_default_validator = {}\nnri_validator_required_plugins = {}\nnri_validator_tolerate_missing_plugins_annotation = {:?}\n",
            self.enable,
            toml_list(&self.required_plugins),
            self.tolerate_missing_plugins_annotation
        )
    }
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A plugin the runtime consulted for a CreateContainer (`api.PluginInstance`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInstance {
    pub name: String,
    pub index: String,
}

impl PluginInstance {
    /// The builtin validator itself (it is in the runtime's plugin list too).
    #[must_use]
    pub fn validator() -> Self {
        Self {
            name: VALIDATOR_BASE.into(),
            index: VALIDATOR_INDEX.into(),
        }
    }
}

/// The value of annotation `key` that applies to `container`: `<key>/container.<container>`, else
/// `<key>/pod`, else `<key>`.
#[must_use]
pub fn effective_annotation<'a>(
    annotations: &'a HashMap<String, String>,
    key: &str,
    container: &str,
) -> Option<&'a str> {
    [
        format!("{key}/container.{container}"),
        format!("{key}/pod"),
        key.to_owned(),
    ]
    .iter()
    .find_map(|k| annotations.get(k).map(String::as_str))
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The required-plugins check: `Err(reason)` as the validator words it when it rejects (see the
/// module doc; the wording of a YAML or boolean parse error after the colon is Go's, not ours).
///
/// # Errors
/// A required plugin is not in `plugins`, or an annotation does not parse.
pub fn validate_required_plugins(
    cfg: &DefaultValidatorConfig,
    pod: &pb::PodSandbox,
    container: &pb::Container,
    plugins: &[PluginInstance],
) -> Result<(), String> {
    let name = container.name.as_str();
    let tolerate_key = cfg.tolerate_missing_plugins_annotation.as_str();
    if !tolerate_key.is_empty()
        && let Some(v) = effective_annotation(&pod.annotations, tolerate_key, name)
    {
        match parse_go_bool(v) {
            Some(true) => return Ok(()),
            Some(false) => {}
            None => {
                return Err(format!(
                    "invalid {tolerate_key} annotation {v:?}: strconv.ParseBool: parsing {v:?}: invalid syntax"
                ));
            }
        }
    }
    let mut required = cfg.required_plugins.clone();
    if let Some(v) = effective_annotation(&pod.annotations, REQUIRED_PLUGINS_ANNOTATION, name) {
        let listed: Vec<String> = serde_saphyr::from_str(v)
            .map_err(|e| format!("invalid {REQUIRED_PLUGINS_ANNOTATION} annotation {v:?}: {e}"))?;
        required.extend(listed);
    }
    let missing: Vec<&str> = required
        .iter()
        .filter(|r| {
            !plugins
                .iter()
                .any(|p| p.name == **r || format!("{}-{}", p.index, p.name) == **r)
        })
        .map(String::as_str)
        .collect();
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(format!("validation error: required plugin {one:?} not present")),
        many => Err(format!(
            "validation error: required plugins {:?} not present",
            many.join(",")
        )),
    }
}

/// The error a validator's rejection becomes (`ValidateContainerAdjustmentResponse.ValidationResult`),
/// what the runtime's CRI CreateContainer fails with.
#[must_use]
pub fn rejection(validator: &PluginInstance, reason: &str) -> String {
    format!(
        "validator \"{}-{}\" rejected container adjustment, reason: {reason}",
        validator.index, validator.name
    )
}
