// Over 500 lines: five providers' metadata readers, each short, behind one trait; they share the HTTP client and retry.
//! Cloud provider attributes, as upstream publishes them (`pkg/cloudprovider/*`): the instance
//! metadata of GCE, AWS, Azure, OCI (OKE) and Alibaba Cloud, or a BYODP webhook, add
//! attributes to the devices (`gce.dra.net/*`, `resource.aws.com/devicegroup*_id`,
//! `azure.dra.net/*`, `oke.dra.net/*`, `alibaba.dra.net/*`, whatever the webhook returns).
//!
//! The provider is `--cloud-provider-hint` or detected. Detection and the metadata reads run in
//! the background, off the start path: the daemon never waits on a metadata server before
//! protecting devices. Every request has a deadline; the probes of all providers run at once
//! and the first one in upstream's order (GCE, AWS, Azure, OKE, Alibaba, webhook) that answers
//! wins. Until the instance data is in (or when there is none: no cloud, a slow, missing or
//! malformed metadata service), devices carry no cloud attributes and a log line says why;
//! when it arrives the slices are republished with them.

mod alibaba;
mod aws;
mod azure;
mod gce;
pub mod http;
mod neuron;
mod oke;
pub mod webhook;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::inventory::{AttrValue, DeviceAttributeSource, DeviceIds};

pub use http::Endpoint;
pub use webhook::{Capabilities, Webhook};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("{url}: {why}")]
    Url { url: String, why: String },
    #[error("{url}: {why}")]
    Http { url: String, why: String },
    #[error("{url}: no answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("{url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("{url}: malformed answer")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what}: {why}")]
    Invalid { what: &'static str, why: String },
    #[error("unknown cloud provider hint {0:?} (upstream's: AWS, GCE, AZURE, OKE, ALIBABA, webhook, NONE)")]
    UnknownHint(String),
    #[error("--webhook-url is required for the webhook {0} provider")]
    NoWebhookUrl(&'static str),
    #[error("the webhook does not implement {0} (its /health says so)")]
    NotImplemented(&'static str),
}

/// A cloud provider (upstream's hint names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Provider {
    Gce,
    Aws,
    Azure,
    Oke,
    Alibaba,
    Webhook,
}

impl Provider {
    /// Upstream's detection order.
    pub const ORDER: [Self; 6] = [
        Self::Gce,
        Self::Aws,
        Self::Azure,
        Self::Oke,
        Self::Alibaba,
        Self::Webhook,
    ];

    /// The `--cloud-provider-hint` spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gce => "GCE",
            Self::Aws => "AWS",
            Self::Azure => "AZURE",
            Self::Oke => "OKE",
            Self::Alibaba => "ALIBABA",
            Self::Webhook => "webhook",
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `--cloud-provider-hint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// Not given: detect.
    Detect,
    /// `NONE` (or `none`): no cloud attributes.
    None,
    Provider(Provider),
}

/// Parses `--cloud-provider-hint` as upstream: exact names, empty = detect.
pub fn parse_hint(hint: Option<&str>) -> Result<Hint, CloudError> {
    Ok(match hint.unwrap_or("") {
        "" => Hint::Detect,
        "NONE" | "none" => Hint::None,
        other => Hint::Provider(
            Provider::ORDER
                .into_iter()
                .find(|p| p.as_str() == other)
                .ok_or_else(|| CloudError::UnknownHint(other.to_owned()))?,
        ),
    })
}

/// Deadlines and retries of the metadata clients.
#[derive(Clone, Copy, Debug)]
pub struct CloudTiming {
    /// One request to a metadata service (and the webhook's `/health`).
    pub request: Duration,
    /// One POST to the webhook (upstream's client: 10 s).
    pub webhook: Duration,
    /// How long a detection probe keeps trying (upstream: 5 s).
    pub probe_for: Duration,
    /// How long reading the instance data keeps trying (upstream: 15 s).
    pub fetch_for: Duration,
    /// Pause between two tries.
    pub retry_every: Duration,
}

impl Default for CloudTiming {
    fn default() -> Self {
        Self {
            request: Duration::from_secs(3),
            webhook: Duration::from_secs(10),
            probe_for: Duration::from_secs(5),
            fetch_for: Duration::from_secs(15),
            retry_every: Duration::from_secs(1),
        }
    }
}

/// The link-local metadata address of GCE, AWS, Azure and OCI.
pub const LINK_LOCAL_METADATA: &str = "http://169.254.169.254";
/// Alibaba Cloud's metadata address.
pub const ALIBABA_METADATA: &str = "http://100.100.100.200";

/// How to find and read the cloud.
#[derive(Clone, Debug)]
pub struct CloudOptions {
    pub hint: Hint,
    /// `--webhook-url`.
    pub webhook_url: Option<String>,
    /// Replaces the metadata addresses of every provider (tests: a local server).
    pub metadata_endpoint: Option<String>,
    /// `GCE_METADATA_HOST` (as Google's metadata client: GCE without probing, at this host).
    pub gce_metadata_host: Option<String>,
    /// sysfs root (AWS EFA drivers and DMI, Alibaba eRDMA devices).
    pub sysfs: PathBuf,
    pub timing: CloudTiming,
}

impl Default for CloudOptions {
    fn default() -> Self {
        Self {
            hint: Hint::Detect,
            webhook_url: None,
            metadata_endpoint: None,
            gce_metadata_host: None,
            sysfs: PathBuf::from("/sys"),
            timing: CloudTiming::default(),
        }
    }
}

impl CloudOptions {
    fn endpoint(&self, provider: Provider) -> Result<Endpoint, CloudError> {
        let url = match (provider, &self.metadata_endpoint) {
            (Provider::Webhook, _) => self
                .webhook_url
                .clone()
                .ok_or(CloudError::NoWebhookUrl("cloud"))?,
            (Provider::Gce, None) if self.gce_metadata_host.is_some() => {
                format!("http://{}", self.gce_metadata_host.as_deref().unwrap_or_default())
            }
            (_, Some(base)) => base.clone(),
            (Provider::Alibaba, None) => ALIBABA_METADATA.to_owned(),
            (_, None) => LINK_LOCAL_METADATA.to_owned(),
        };
        Endpoint::parse(&url)
    }
}

/// What one provider knows about this instance.
#[derive(Debug)]
pub enum CloudInstance {
    Gce(gce::Gce),
    Aws(aws::Aws),
    Azure(azure::Azure),
    Oke(oke::Oke),
    Alibaba(alibaba::Alibaba),
    Webhook(Webhook),
}

impl CloudInstance {
    #[must_use]
    pub fn provider(&self) -> Provider {
        match self {
            Self::Gce(_) => Provider::Gce,
            Self::Aws(_) => Provider::Aws,
            Self::Azure(_) => Provider::Azure,
            Self::Oke(_) => Provider::Oke,
            Self::Alibaba(_) => Provider::Alibaba,
            Self::Webhook(_) => Provider::Webhook,
        }
    }

    /// The attributes of one device (upstream's `GetDeviceAttributes`). Only the webhook's
    /// need a request; the others are computed from the instance data (and sysfs).
    pub async fn device_attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        match self {
            Self::Webhook(w) => w.device_attributes(ids).await,
            other => other.local_attributes(ids).unwrap_or_default(),
        }
    }

    /// The attributes of one device where no request is needed (every provider but the
    /// webhook: `None`).
    #[must_use]
    pub fn local_attributes(&self, ids: &DeviceIds) -> Option<BTreeMap<String, AttrValue>> {
        Some(match self {
            Self::Gce(g) => g.device_attributes(ids),
            Self::Aws(a) => a.device_attributes(ids),
            Self::Azure(a) => a.device_attributes(),
            Self::Oke(o) => o.device_attributes(),
            Self::Alibaba(a) => a.device_attributes(ids),
            Self::Webhook(_) => return None,
        })
    }
}

/// Finds the provider and reads its instance data; `None` (with a log line saying why) when
/// there is no cloud or its metadata cannot be read. Never fails the caller.
pub async fn discover(opts: &CloudOptions) -> Option<CloudInstance> {
    let provider = match opts.hint {
        Hint::None => {
            tracing::info!("cloud provider: NONE (--cloud-provider-hint): no cloud attributes");
            return None;
        }
        Hint::Provider(p) => p,
        Hint::Detect => match detect(opts).await {
            Ok(p) => {
                tracing::info!(provider = %p, "cloud provider detected");
                p
            }
            Err(why) => {
                tracing::info!(probes = %why, "no cloud provider detected: no cloud attributes");
                return None;
            }
        },
    };
    match instance(provider, opts).await {
        Ok(i) => {
            tracing::info!(provider = %provider, instance = ?i, "cloud instance metadata read: cloud attributes follow");
            Some(i)
        }
        Err(e) => {
            tracing::warn!(provider = %provider, error = %crate::telemetry::chain(&e),
                "cloud instance metadata unavailable: no cloud attributes");
            None
        }
    }
}

/// Probes every provider at once; the first in upstream's order that answered wins. The error
/// lists why each one did not.
async fn detect(opts: &CloudOptions) -> Result<Provider, String> {
    let candidates: Vec<Provider> = Provider::ORDER
        .into_iter()
        .filter(|p| *p != Provider::Webhook || opts.webhook_url.is_some())
        .collect();
    let results = futures::future::join_all(candidates.iter().map(|p| probe(*p, opts))).await;
    let mut why = Vec::new();
    for (p, r) in candidates.iter().zip(results) {
        match r {
            Ok(()) => return Ok(*p),
            Err(e) => why.push(format!("{p}: {}", crate::telemetry::chain(&e))),
        }
    }
    Err(why.join("; "))
}

/// Whether `provider` answers, retried for `probe_for`.
async fn probe(provider: Provider, opts: &CloudOptions) -> Result<(), CloudError> {
    if provider == Provider::Gce && opts.gce_metadata_host.is_some() && opts.metadata_endpoint.is_none() {
        return Ok(()); // As Google's client: GCE_METADATA_HOST says so.
    }
    let ep = opts.endpoint(provider)?;
    retry(opts.timing, opts.timing.probe_for, || async {
        match provider {
            Provider::Gce => gce::probe(&ep, opts.timing).await,
            Provider::Aws => aws::probe(&ep, opts.timing).await,
            Provider::Azure => azure::probe(&ep, opts.timing).await,
            Provider::Oke => oke::probe(&ep, opts.timing).await,
            Provider::Alibaba => alibaba::probe(&ep, opts.timing).await,
            Provider::Webhook => webhook::probe(&ep, opts.timing).await,
        }
    })
    .await
}

/// Reads `provider`'s instance data.
async fn instance(provider: Provider, opts: &CloudOptions) -> Result<CloudInstance, CloudError> {
    let ep = opts.endpoint(provider)?;
    Ok(match provider {
        Provider::Gce => CloudInstance::Gce(gce::instance(&ep, opts).await?),
        Provider::Aws => CloudInstance::Aws(aws::instance(&ep, opts).await?),
        Provider::Azure => CloudInstance::Azure(azure::instance(&ep, opts).await?),
        Provider::Oke => CloudInstance::Oke(oke::instance(&ep, opts).await?),
        Provider::Alibaba => CloudInstance::Alibaba(alibaba::instance(&ep, opts).await),
        Provider::Webhook => {
            let w = Webhook::connect(&ep, opts.timing).await?;
            if !w.capabilities().cloud_provider {
                return Err(CloudError::NotImplemented("the cloud provider"));
            }
            CloudInstance::Webhook(w)
        }
    })
}

/// Runs `f` until it succeeds or `within` has passed (at least once), pausing `retry_every`
/// between tries. A [`CloudError::Decode`] or [`CloudError::Invalid`] is final (a malformed
/// answer does not get better).
async fn retry<F, Fut, T>(timing: CloudTiming, within: Duration, mut f: F) -> Result<T, CloudError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CloudError>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e @ (CloudError::Decode { .. } | CloudError::Invalid { .. })) => return Err(e),
            Err(e) => {
                if tokio::time::Instant::now() + timing.retry_every >= until {
                    return Err(e);
                }
                tokio::time::sleep(timing.retry_every).await;
            }
        }
    }
}

/// GET `path` and require a 200.
async fn get_ok(
    ep: &Endpoint,
    path: &str,
    headers: &[(&str, &str)],
    timing: CloudTiming,
) -> Result<http::Response, CloudError> {
    let r = http::send(ep, ::http::Method::GET, path, headers, None, timing.request).await?;
    ok(ep, path, r)
}

fn ok(ep: &Endpoint, path: &str, r: http::Response) -> Result<http::Response, CloudError> {
    if r.status == 200 {
        Ok(r)
    } else {
        let mut body = r.text();
        body.truncate(200);
        Err(CloudError::Status {
            url: format!("{ep}{path}"),
            status: r.status,
            body,
        })
    }
}

fn decode<T: serde::de::DeserializeOwned>(ep: &Endpoint, path: &str, body: &[u8]) -> Result<T, CloudError> {
    serde_json::from_slice(body).map_err(|source| CloudError::Decode {
        url: format!("{ep}{path}"),
        source,
    })
}

/// The cloud instance once known: the scans' source of cloud attributes.
#[derive(Clone, Default)]
pub struct CloudSlot {
    inner: Arc<RwLock<Option<Arc<CloudInstance>>>>,
}

impl std::fmt::Debug for CloudSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudSlot")
            .field("provider", &self.get().map(|i| i.provider()))
            .finish()
    }
}

impl CloudSlot {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    pub fn set(&self, instance: CloudInstance) {
        let mut g = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g = Some(Arc::new(instance));
    }

    #[must_use]
    pub fn get(&self) -> Option<Arc<CloudInstance>> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl DeviceAttributeSource for CloudSlot {
    /// Called on a blocking thread (the scans run there): a webhook request is made with the
    /// runtime's handle and its own deadline.
    fn attributes(&self, ids: &DeviceIds) -> BTreeMap<String, AttrValue> {
        let Some(instance) = self.get() else {
            return BTreeMap::new();
        };
        if let Some(local) = instance.local_attributes(ids) {
            return local;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(h) => h.block_on(instance.device_attributes(ids)),
            Err(_) => BTreeMap::new(),
        }
    }
}

/// A string attribute (cut to the API's 64 bytes).
fn string(v: &str) -> AttrValue {
    AttrValue::String(crate::text::cut_at_char(v, crate::inventory::MAX_ATTRIBUTE_LEN).to_owned())
}

/// `--profile-provider` (upstream's values; default `cloud`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileChoice {
    /// The cloud provider's, when it has profiles (only the webhook does).
    Cloud,
    /// The webhook at `--webhook-url`.
    Webhook,
    None,
}

/// Parses `--profile-provider`.
pub fn parse_profile_provider(v: Option<&str>) -> Result<ProfileChoice, String> {
    match v.unwrap_or("cloud") {
        "cloud" => Ok(ProfileChoice::Cloud),
        "webhook" => Ok(ProfileChoice::Webhook),
        "none" => Ok(ProfileChoice::None),
        other => Err(format!(
            "unsupported profile provider {other:?} (cloud, webhook, none)"
        )),
    }
}

#[derive(Clone, Debug)]
enum ProfileState {
    /// Not known yet (detection or the webhook's first answer pending), with why.
    Pending(String),
    /// No profile provider on this node, with why.
    Unavailable(String),
    Ready(Webhook),
}

/// The profile provider once known.
#[derive(Clone, Debug)]
pub struct ProfileSlot {
    state: Arc<RwLock<ProfileState>>,
}

impl Default for ProfileSlot {
    fn default() -> Self {
        Self {
            state: Arc::new(RwLock::new(ProfileState::Pending(
                "the profile provider is being set up".to_owned(),
            ))),
        }
    }
}

impl ProfileSlot {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn set(&self, s: ProfileState) {
        *self
            .state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = s;
    }

    fn get(&self) -> ProfileState {
        self.state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The webhook, once ready.
    #[must_use]
    pub fn webhook(&self) -> Option<Webhook> {
        match self.get() {
            ProfileState::Ready(w) => Some(w),
            _ => None,
        }
    }
}

/// This node's providers, as Prepare uses them.
#[derive(Clone, Debug, Default)]
pub struct NodeProviders {
    pub cloud: CloudSlot,
    pub profiles: ProfileSlot,
}

impl crate::dra::Providers for NodeProviders {
    fn device_config<'a>(
        &'a self,
        ids: &'a DeviceIds,
    ) -> futures::future::BoxFuture<'a, Option<crate::config::NetworkConfig>> {
        Box::pin(async move {
            let instance = self.cloud.get()?;
            match &*instance {
                CloudInstance::Azure(a) => a.device_config(ids),
                CloudInstance::Webhook(w) => match w.device_config(ids).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(device = %ids.name, error = %crate::telemetry::chain(&e), "webhook GetDeviceConfig failed");
                        None
                    }
                },
                _ => None,
            }
        })
    }

    fn profile_config<'a>(
        &'a self,
        ids: &'a DeviceIds,
        claim_uid: &'a str,
        config: &'a crate::config::NetworkConfig,
    ) -> futures::future::BoxFuture<'a, Result<Option<crate::config::NetworkConfig>, crate::dra::ProfileError>>
    {
        use crate::dra::ProfileError;
        Box::pin(async move {
            match self.profiles.get() {
                ProfileState::Ready(w) => w
                    .profile_config(ids, claim_uid, config)
                    .await
                    .map_err(|e| ProfileError::Failed(crate::telemetry::chain(&e).to_string())),
                ProfileState::Pending(why) => Err(ProfileError::Failed(format!(
                    "the profile provider is not available yet: {why}"
                ))),
                ProfileState::Unavailable(why) => Err(ProfileError::NoProvider(why)),
            }
        })
    }

    fn release<'a>(
        &'a self,
        ids: &'a DeviceIds,
        claim_uid: &'a str,
        config: &'a crate::config::NetworkConfig,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::dra::ProfileError>> {
        use crate::dra::ProfileError;
        Box::pin(async move {
            match self.profiles.get() {
                ProfileState::Ready(w) => w
                    .release_profile_config(ids, claim_uid, config)
                    .await
                    .map_err(|e| ProfileError::Failed(crate::telemetry::chain(&e).to_string())),
                ProfileState::Pending(why) | ProfileState::Unavailable(why) => Err(ProfileError::Failed(
                    format!("no profile provider to release it: {why}"),
                )),
            }
        })
    }
}

/// The background job of `dranet run`: finds the cloud (then `on_cloud`, to republish with its
/// attributes) and sets up the profile provider. Never fails; says what it found in the log.
pub async fn run_providers(
    opts: CloudOptions,
    profile: ProfileChoice,
    slots: NodeProviders,
    on_cloud: impl Fn() + Send + 'static,
) {
    let webhook_profiles = async {
        if profile != ProfileChoice::Webhook {
            return;
        }
        let ep = match opts.webhook_url.as_deref().map(Endpoint::parse) {
            Some(Ok(ep)) => ep,
            Some(Err(e)) => {
                slots
                    .profiles
                    .set(ProfileState::Unavailable(crate::telemetry::chain(&e).to_string()));
                return;
            }
            None => {
                let e = CloudError::NoWebhookUrl("profile");
                slots
                    .profiles
                    .set(ProfileState::Unavailable(crate::telemetry::chain(&e).to_string()));
                return;
            }
        };
        connect_profiles(&ep, opts.timing, &slots.profiles).await;
    };
    let cloud = async {
        let instance = discover(&opts).await;
        if profile == ProfileChoice::Cloud {
            slots.profiles.set(match &instance {
                Some(CloudInstance::Webhook(w)) if w.capabilities().profile_provider => {
                    tracing::info!(webhook = %w.endpoint(), "profile provider: the webhook");
                    ProfileState::Ready(w.clone())
                }
                Some(CloudInstance::Webhook(_)) => ProfileState::Unavailable(
                    "the webhook has no profile provider (its /health says so)".to_owned(),
                ),
                Some(other) => ProfileState::Unavailable(format!(
                    "the cloud provider {} resolves no profiles (--profile-provider=cloud)",
                    other.provider()
                )),
                None => ProfileState::Unavailable(
                    "no cloud provider that resolves profiles (--profile-provider=cloud)".to_owned(),
                ),
            });
        }
        if let Some(i) = instance {
            slots.cloud.set(i);
            on_cloud();
        }
    };
    if profile == ProfileChoice::None {
        slots
            .profiles
            .set(ProfileState::Unavailable("--profile-provider=none".to_owned()));
    }
    futures::join!(cloud, webhook_profiles);
}

/// Connects to the profile webhook, retrying with backoff (1 s doubling to 60 s) until it
/// answers; Prepare meanwhile says it is not available yet.
async fn connect_profiles(ep: &Endpoint, timing: CloudTiming, slot: &ProfileSlot) {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        match Webhook::connect(ep, timing).await {
            Ok(w) if w.capabilities().profile_provider => {
                tracing::info!(webhook = %ep, "profile provider: the webhook");
                slot.set(ProfileState::Ready(w));
                return;
            }
            Ok(_) => {
                tracing::error!(webhook = %ep, "the webhook does not support the profile provider capability: claims with a profile fail");
                slot.set(ProfileState::Unavailable(format!(
                    "webhook at {ep} does not support the profile provider capability"
                )));
                return;
            }
            Err(e) => {
                let wait = backoff.next_delay();
                let why = crate::telemetry::chain(&e).to_string();
                tracing::warn!(webhook = %ep, error = %why, retry_in = ?wait, "profile webhook not reachable");
                slot.set(ProfileState::Pending(format!("webhook at {ep}: {why}")));
                tokio::time::sleep(wait).await;
            }
        }
    }
}
