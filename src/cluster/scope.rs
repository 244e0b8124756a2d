//! Where a watch, a list or a controller looks: one namespace, or all of them.

use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client, Resource};

/// The scopes the guard watches: each of `namespaces`, or all (`None`) when it names none.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().cloned().map(Some).collect()
    }
}

/// An API handle in `scope`: one namespace, or all. Metadata-only types
/// (`PartialObjectMeta`) make metadata-only requests.
pub fn api_in<K>(client: Client, scope: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}
