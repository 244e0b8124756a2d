//! The finalizer's writes: added to an object, removed from it, and removed from every
//! object of a scope (`release-finalizers`).

use k8s_openapi::{
    api::core::v1::{ConfigMap, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
    core::PartialObjectMeta,
};
use serde_json::json;

use super::Protected;
use crate::{
    Error, Result, cluster,
    rules::in_use::{FINALIZER, is_held},
};

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(crate::FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Adds the finalizer to the object of this uid (a strategic merge: the other
/// finalizers stay).
pub(super) async fn hold<K: Protected>(objects: &Api<PartialObjectMeta<K>>, object: &ObjectMeta) -> Result<()> {
    let name = object.name.as_deref().unwrap_or_default();
    let patch = json!({"metadata": {"uid": object.uid, "finalizers": [FINALIZER]}});
    match objects
        .patch_metadata(name, &patch_params(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone, or deleted meanwhile (no finalizer can be added then): its next event says.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Removes the finalizer from the object of this uid, at the version read when
/// `conditional`; whether it was there to remove.
pub(super) async fn release<K: Protected>(
    objects: &Api<PartialObjectMeta<K>>,
    object: &ObjectMeta,
    conditional: bool,
) -> Result<bool> {
    let name = object.name.as_deref().unwrap_or_default();
    let mut metadata = json!({"uid": object.uid, "$deleteFromPrimitiveList/finalizers": [FINALIZER]});
    if conditional {
        metadata["resourceVersion"] = json!(object.resource_version);
    }
    let patch = json!({ "metadata": metadata });
    match objects
        .patch_metadata(name, &patch_params(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(Error::Conflict(format!(
            "{} {name} changed while its finalizer was being removed",
            K::RULES_KIND.as_str()
        ))),
        Err(error) => Err(error.into()),
    }
}

/// What [`release_all`] did.
#[derive(Debug, Default)]
pub struct Released {
    /// The objects the finalizer was removed from, as `namespace/kind/name`.
    pub objects: Vec<String>,
}

/// Removes the guard's finalizer from every Secret and ConfigMap of `scope` (all
/// namespaces when empty): the chart's uninstall hook, and the way out by hand. Objects
/// being deleted then go at once, whatever uses them.
pub async fn release_all(client: &Client, scope: &[String]) -> Result<Released> {
    let mut released = Released::default();
    for namespace in cluster::scopes(scope) {
        release_all_of::<Secret>(client, namespace.as_deref(), &mut released).await?;
        release_all_of::<ConfigMap>(client, namespace.as_deref(), &mut released).await?;
    }
    Ok(released)
}

async fn release_all_of<K: Protected>(client: &Client, scope: Option<&str>, released: &mut Released) -> Result<()> {
    let api: Api<PartialObjectMeta<K>> = cluster::api_in(client.clone(), scope);
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list_metadata(&params).await?;
        for object in page.items.iter().filter(|object| is_held(&object.metadata)) {
            let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
            let name = object.metadata.name.as_deref().unwrap_or_default();
            let objects: Api<PartialObjectMeta<K>> = Api::namespaced(client.clone(), namespace);
            if release(&objects, &object.metadata, false).await? {
                released
                    .objects
                    .push(format!("{namespace}/{}/{name}", K::RULES_KIND.as_str()));
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => return Ok(()),
        }
    }
}
