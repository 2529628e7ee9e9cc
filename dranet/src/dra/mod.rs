//! The DRA kubelet plugin: registration + DRA node service (v1, v1beta1) + device health
//! ([`health`], KEP-4680) over unix sockets
//! ([`KubeletPlugin`]), and Prepare/Unprepare ([`Preparer`]) turning allocated ResourceClaims
//! into per-pod [`crate::plan::PodPlan`]s for a [`PlanSink`].

pub mod claim;
pub mod health;
mod prepare;
pub mod profiles;
pub mod proto;
mod server;

pub use crate::telemetry::metrics::DraMetrics;
pub use claim::{
    ClaimError, ClaimSource, FileClaimSource, KubeClaimSource, MemoryClaimSource, ResourceClaim,
    devices_by_pod,
};
pub use health::HealthHub;
pub use prepare::{
    DeviceLookup, LeaseSource, PlanContext, PlanSink, PlannedClaim, PrepareError, PreparedDevice, Preparer,
    RescanOnMiss, device_config, plan_claim, plan_claim_in,
};
pub use profiles::{NoProviders, ProfileError, Providers};
pub use server::{DraError, KubeletPlugin, PLUGIN_TYPE, PluginConfig, SUPPORTED_VERSIONS};

#[cfg(test)]
mod profile_tests;
#[cfg(test)]
mod tests;
