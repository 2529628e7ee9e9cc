//! Reports to the API server: server-side apply of the claim status subresource, events
//! created in the object's namespace.

use futures::future::BoxFuture;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::{ClaimStatusApply, Event, Patched, ReportError, Sink};

/// The API server, through `client`; `field_manager` is the driver name (`dra.net`).
#[derive(Clone)]
pub struct KubeSink {
    client: kube::Client,
    field_manager: String,
}

impl KubeSink {
    #[must_use]
    pub fn new(client: kube::Client, field_manager: impl Into<String>) -> Self {
        Self {
            client,
            field_manager: field_manager.into(),
        }
    }
}

impl Sink for KubeSink {
    fn apply_claim_status<'a>(
        &'a self,
        apply: &'a ClaimStatusApply,
    ) -> BoxFuture<'a, Result<(), ReportError>> {
        Box::pin(async move {
            use k8s_openapi::api::resource::v1::ResourceClaim;
            let m = &apply.metadata;
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &m.namespace);
            api.patch_status(
                &m.name,
                &PatchParams::apply(&self.field_manager).force(),
                &Patch::Apply(apply),
            )
            .await
            .map_err(|source| {
                // A 403 here is `resourceclaims/status` patch or, from 1.36, the granular
                // `resourceclaims/driver` check; the server's message says which.
                crate::rbac::note_forbidden(&source, ("patch", "resource.k8s.io", "resourceclaims/status"));
                ReportError::Apply {
                    claim: format!("{}/{}", m.namespace, m.name),
                    source: Box::new(source),
                }
            })?;
            Ok(())
        })
    }

    fn event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<(), ReportError>> {
        Box::pin(async move {
            let o = &event.involved_object;
            let err = |source| ReportError::Event {
                reason: event.reason.clone(),
                object: format!("{} {}/{}", o.kind, o.namespace, o.name),
                source: Box::new(source),
            };
            let obj: k8s_openapi::api::core::v1::Event = serde_json::to_value(event)
                .and_then(serde_json::from_value)
                .map_err(ReportError::Encode)?;
            let api: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(self.client.clone(), &event.metadata.namespace);
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => Ok(()),
                // There is an Event of that name: ours (a create after a 404 that raced), the
                // next repeat patches it. client-go does not retry it either.
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
                Err(e) => {
                    crate::rbac::note_forbidden(&e, ("create", "", "events"));
                    Err(err(e))
                }
            }
        })
    }

    fn patch_event<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Result<Patched, ReportError>> {
        Box::pin(async move {
            let api: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(self.client.clone(), &event.metadata.namespace);
            let patch = Patch::Strategic(event.patch());
            match api
                .patch(&event.metadata.name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => Ok(Patched::Updated),
                Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Patched::Gone),
                Err(source) => {
                    crate::rbac::note_forbidden(&source, ("patch", "", "events"));
                    let o = &event.involved_object;
                    Err(ReportError::EventUpdate {
                        name: event.metadata.name.clone(),
                        reason: event.reason.clone(),
                        object: format!("{} {}/{}", o.kind, o.namespace, o.name),
                        source: Box::new(source),
                    })
                }
            }
        })
    }
}
