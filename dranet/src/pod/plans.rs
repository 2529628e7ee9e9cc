//! Plans from Prepare go to the rescue engine: it checkpoints them, and they are what the NRI
//! hooks attach.

use futures::future::BoxFuture;

use crate::dra::PlanSink;
use crate::plan::{ClaimPlan, DevicePlan};
use crate::rescue::Engine;
use crate::telemetry::chain;

/// The rescue engine is the daemon's plan store: the plans it checkpoints are what the NRI hooks
/// attach.
impl PlanSink for Engine {
    fn claim_devices(&self, claim_uid: &str) -> Vec<DevicePlan> {
        Engine::claim_devices(self, claim_uid)
    }

    fn set_claim(&self, claim: ClaimPlan) -> Result<(), String> {
        Engine::set_claim(self, claim).map_err(|e| chain(&e).to_string())
    }

    fn remove_claim(&self, claim_uid: &str) -> Result<Vec<DevicePlan>, String> {
        Engine::remove_claim(self, claim_uid).map_err(|e| chain(&e).to_string())
    }

    fn remove_claims(&self, claim_uids: &[String]) -> Vec<Result<Vec<DevicePlan>, String>> {
        match Engine::remove_claims(self, claim_uids) {
            Ok(removed) => removed.into_iter().map(Ok).collect(),
            Err(e) => {
                let e = chain(&e).to_string();
                claim_uids.iter().map(|_| Err(e.clone())).collect()
            }
        }
    }

    fn durable<'a>(&'a self) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { Engine::durable(self).await.map_err(|e| chain(&e).to_string()) })
    }
}
