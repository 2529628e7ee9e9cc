//! The BYODP webhook (upstream `pkg/cloudprovider/webhook`): `GET /health` says what it
//! implements (`{"cloudProvider": bool, "profileProvider": bool}`); as a cloud provider it
//! answers `POST /GetDeviceAttributes` and `/GetDeviceConfig` with a device's identifiers
//! (`{"mac_address", "pci_address", "name"}`), as a profile provider `POST /GetProfileConfig`
//! and `/ReleaseProfileConfig` with `{"device", "claim_uid", "config"}`. JSON over HTTP or a
//! unix socket (`unix:///path`); any answer but 200 is an error carrying its body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{CloudError, CloudTiming, Endpoint};
use crate::config::NetworkConfig;
use crate::inventory::{AttrValue, DeviceIds};

pub const PATH_HEALTH: &str = "/health";
pub const PATH_GET_DEVICE_ATTRIBUTES: &str = "/GetDeviceAttributes";
pub const PATH_GET_DEVICE_CONFIG: &str = "/GetDeviceConfig";
pub const PATH_GET_PROFILE_CONFIG: &str = "/GetProfileConfig";
pub const PATH_RELEASE_PROFILE_CONFIG: &str = "/ReleaseProfileConfig";

/// `/health`'s answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    #[serde(default)]
    pub cloud_provider: bool,
    #[serde(default)]
    pub profile_provider: bool,
}

/// The body of the profile calls.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileRequest {
    pub device: DeviceIds,
    pub claim_uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<NetworkConfig>,
}

/// A connected webhook.
#[derive(Clone, Debug)]
pub struct Webhook {
    endpoint: Endpoint,
    caps: Capabilities,
    timing: CloudTiming,
}

/// Reachable and healthy (upstream's `OnWebhook`).
pub(super) async fn probe(ep: &Endpoint, timing: CloudTiming) -> Result<(), CloudError> {
    super::get_ok(ep, PATH_HEALTH, &[], timing).await.map(|_| ())
}

impl Webhook {
    /// Reads the webhook's capabilities (upstream's `NewWebhookProvider`).
    pub async fn connect(endpoint: &Endpoint, timing: CloudTiming) -> Result<Self, CloudError> {
        let r = super::get_ok(endpoint, PATH_HEALTH, &[], timing).await?;
        let caps: Capabilities = super::decode(endpoint, PATH_HEALTH, &r.body)?;
        Ok(Self {
            endpoint: endpoint.clone(),
            caps,
            timing,
        })
    }

    #[must_use]
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    async fn post<B: Serialize, R: serde::de::DeserializeOwned>(
        &self,
        path: &'static str,
        body: &B,
    ) -> Result<R, CloudError> {
        let r = self.post_raw(path, body).await?;
        // An empty body reads as JSON null.
        let raw: &[u8] = if r.body.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            &r.body
        };
        super::decode(&self.endpoint, path, raw)
    }

    async fn post_raw<B: Serialize>(
        &self,
        path: &'static str,
        body: &B,
    ) -> Result<super::http::Response, CloudError> {
        let needs_cloud = matches!(path, PATH_GET_DEVICE_ATTRIBUTES | PATH_GET_DEVICE_CONFIG);
        if needs_cloud && !self.caps.cloud_provider {
            return Err(CloudError::NotImplemented("the cloud provider"));
        }
        if !needs_cloud && !self.caps.profile_provider {
            return Err(CloudError::NotImplemented("the profile provider"));
        }
        let body = serde_json::to_vec(body).map_err(|source| CloudError::Decode {
            url: format!("{}{path}", self.endpoint),
            source,
        })?;
        let r = super::http::send(
            &self.endpoint,
            http::Method::POST,
            path,
            &[("Content-Type", "application/json")],
            Some(body),
            self.timing.webhook,
        )
        .await?;
        super::ok(&self.endpoint, path, r)
    }

    /// `/GetDeviceAttributes`; a failure is logged and gives none.
    pub async fn device_attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        match self
            .post::<_, Option<BTreeMap<String, AttrValue>>>(PATH_GET_DEVICE_ATTRIBUTES, ids)
            .await
        {
            Ok(a) => a
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| match v {
                    AttrValue::String(s) => (k, super::string(&s)),
                    other => (k, other),
                })
                .collect(),
            Err(e) => {
                tracing::warn!(device = %ids.name, error = %crate::telemetry::chain(&e), "webhook GetDeviceAttributes failed");
                BTreeMap::new()
            }
        }
    }

    /// `/GetDeviceConfig`: the provider's base config for a device.
    pub async fn device_config(&self, ids: &DeviceIds) -> Result<Option<NetworkConfig>, CloudError> {
        self.post(PATH_GET_DEVICE_CONFIG, ids).await
    }

    /// `/GetProfileConfig`: resolves the profile of `config` for `claim_uid` (e.g. allocates an
    /// address); the answer is merged into the config.
    pub async fn profile_config(
        &self,
        device: &DeviceIds,
        claim_uid: &str,
        config: &NetworkConfig,
    ) -> Result<Option<NetworkConfig>, CloudError> {
        let req = ProfileRequest {
            device: device.clone(),
            claim_uid: claim_uid.to_owned(),
            config: Some(config.clone()),
        };
        self.post(PATH_GET_PROFILE_CONFIG, &req).await
    }

    /// `/ReleaseProfileConfig`: frees what [`Self::profile_config`] took.
    pub async fn release_profile_config(
        &self,
        device: &DeviceIds,
        claim_uid: &str,
        config: &NetworkConfig,
    ) -> Result<(), CloudError> {
        let req = ProfileRequest {
            device: device.clone(),
            claim_uid: claim_uid.to_owned(),
            config: Some(config.clone()),
        };
        self.post_raw(PATH_RELEASE_PROFILE_CONFIG, &req).await.map(|_| ())
    }
}
