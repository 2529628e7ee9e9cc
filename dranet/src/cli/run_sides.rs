//! The runtime (NRI) and kubelet (DRA) sides of `dranet run`.

use prometheus_client::registry::Registry;

use super::run::RunArgs;
use crate::rescue::Engine;

/// Running sides, stopped on shutdown.
pub struct Sides {}

impl Sides {
    pub async fn stop(self) {}
}

pub async fn start(_args: &RunArgs, _engine: &Engine, _registry: &mut Registry) -> anyhow::Result<Sides> {
    Ok(Sides {})
}
