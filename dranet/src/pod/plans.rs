//! Plans from Prepare go to the rescue engine: it checkpoints them, and they are what the NRI
//! hooks attach.

use futures::future::BoxFuture;

use crate::dra::PlanSink;
use crate::plan::PodPlan;

/// The rescue engine is the daemon's plan store: the plans it checkpoints are what the NRI hooks
/// attach.
impl PlanSink for crate::rescue::Engine {
    fn set_plan(&self, plan: PodPlan) -> Result<(), String> {
        crate::rescue::Engine::set_plan(self, plan).map_err(|e| crate::telemetry::chain(&e).to_string())
    }

    fn remove_claim(&self, claim_uid: &str) -> Result<(), String> {
        crate::rescue::Engine::remove_claim(self, claim_uid)
            .map_err(|e| crate::telemetry::chain(&e).to_string())
    }

    fn durable<'a>(&'a self) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            crate::rescue::Engine::durable(self)
                .await
                .map_err(|e| crate::telemetry::chain(&e).to_string())
        })
    }
}
