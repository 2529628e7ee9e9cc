//! Provider configs at Prepare (upstream `getDeviceNetworkConfig`): the cloud provider's base
//! config for a device (`GetDeviceConfig`) goes under the claim's, then a claim that names a
//! `profile` has it resolved by the profile provider (`GetProfileConfig`, e.g. an address from
//! an IPAM webhook), merged under the claim's too: claim > profile > cloud. What a profile took
//! is given back when the claim is unprepared (`ReleaseProfileConfig`), or at once when the
//! Prepare that took it fails.
//!
//! Without a profile provider a claim with a `profile` fails Prepare with the field's path:
//! never silently ignored.

use futures::future::BoxFuture;

use crate::config::{self, ConfigError, FieldError, NetworkConfig};
use crate::inventory::{Device, DeviceIds};

/// Why a profile could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No provider resolves profiles on this node (or not yet): a config error of `profile`.
    #[error("{0}")]
    NoProvider(String),
    /// The provider was asked and failed.
    #[error("{0}")]
    Failed(String),
}

/// The cloud and profile providers, as Prepare needs them.
pub trait Providers: Send + Sync + 'static {
    /// The cloud provider's config for a device (`GetDeviceConfig`), if any. A failure is the
    /// provider's problem: logged, and the device gets none (as upstream).
    fn device_config<'a>(&'a self, ids: &'a DeviceIds) -> BoxFuture<'a, Option<NetworkConfig>>;
    /// Resolves `config.profile` for `claim_uid` (`GetProfileConfig`).
    fn profile_config<'a>(
        &'a self,
        ids: &'a DeviceIds,
        claim_uid: &'a str,
        config: &'a NetworkConfig,
    ) -> BoxFuture<'a, Result<Option<NetworkConfig>, ProfileError>>;
    /// Gives back what a profile took (`ReleaseProfileConfig`).
    fn release<'a>(
        &'a self,
        ids: &'a DeviceIds,
        claim_uid: &'a str,
        config: &'a NetworkConfig,
    ) -> BoxFuture<'a, Result<(), ProfileError>>;
}

/// No cloud config and no profile provider.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProviders;

impl Providers for NoProviders {
    fn device_config<'a>(&'a self, _ids: &'a DeviceIds) -> BoxFuture<'a, Option<NetworkConfig>> {
        Box::pin(async { None })
    }

    fn profile_config<'a>(
        &'a self,
        _ids: &'a DeviceIds,
        _claim_uid: &'a str,
        _config: &'a NetworkConfig,
    ) -> BoxFuture<'a, Result<Option<NetworkConfig>, ProfileError>> {
        Box::pin(async {
            Err(ProfileError::NoProvider(
                "no profile provider on this node (dranet run --profile-provider=webhook --webhook-url=...)"
                    .to_owned(),
            ))
        })
    }

    fn release<'a>(
        &'a self,
        _ids: &'a DeviceIds,
        _claim_uid: &'a str,
        _config: &'a NetworkConfig,
    ) -> BoxFuture<'a, Result<(), ProfileError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The identifiers a provider gets for a device at Prepare: its slice name, MAC and PCI
/// address (upstream's, whose `name` is the device name here, not the interface name).
#[must_use]
pub fn prepare_ids(d: &Device) -> DeviceIds {
    DeviceIds {
        name: d.name.clone(),
        ..DeviceIds::of(d)
    }
}

/// Why the provider configs could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// A config error (the `profile` field without a provider, or the merged config breaking a
    /// rule), with paths.
    #[error(transparent)]
    Config(ConfigError),
    /// The profile provider failed.
    #[error("failed to get profile config: {0}")]
    Profile(String),
}

/// The claim's config with the providers' under it; `true` when a profile was resolved (and
/// must be released).
pub async fn resolve(
    providers: &dyn Providers,
    device: &Device,
    claim_uid: &str,
    user: NetworkConfig,
) -> Result<(NetworkConfig, bool), ResolveError> {
    let ids = prepare_ids(device);
    let base = providers.device_config(&ids).await;
    let mut merged = config::merge(&user, base.as_ref());
    let profiled = merged.profile.as_deref().is_some_and(|p| !p.is_empty());
    if profiled {
        match providers.profile_config(&ids, claim_uid, &merged).await {
            Ok(p) => merged = config::merge(&merged, p.as_ref()),
            Err(ProfileError::NoProvider(why)) => {
                return Err(ResolveError::Config(ConfigError::Invalid {
                    errors: vec![FieldError {
                        path: "profile".to_owned(),
                        problem: format!(
                            "{why}: profile {:?} cannot be resolved",
                            merged.profile.as_deref().unwrap_or_default()
                        ),
                    }],
                }));
            }
            Err(ProfileError::Failed(why)) => return Err(ResolveError::Profile(why)),
        }
    }
    if base.is_some() || profiled {
        merged.apply_defaults();
        if let Err(e) = config::validate(&merged) {
            if profiled && let Err(r) = providers.release(&ids, claim_uid, &merged).await {
                tracing::warn!(device = %device.name, error = %r, "releasing the profile of a config that failed validation");
            }
            return Err(ResolveError::Config(e));
        }
    }
    Ok((merged, profiled))
}
