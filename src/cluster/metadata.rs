//! The metadata watches the controllers cache objects from.

use std::fmt::Debug;

use futures::Stream;
use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Resource,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher::{self, watcher},
    },
};
use serde::de::DeserializeOwned;

/// A watch of the metadata of the objects of `api` that `config` selects: the store it
/// fills, and the objects it applies. The copies keep no managedFields and no annotation
/// but those in `kept`: kubectl's last-applied-configuration annotation holds a copy of
/// the object, a Secret's data included.
pub fn metadata_store<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    kept: &'static [&'static str],
) -> (
    Store<PartialObjectMeta<K>>,
    impl Stream<Item = watcher::Result<PartialObjectMeta<K>>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let objects = watcher(api, config)
        .default_backoff()
        .modify(move |object| {
            let metadata = &mut object.metadata;
            metadata.managed_fields = None;
            if let Some(annotations) = metadata.annotations.as_mut() {
                annotations.retain(|key, _| kept.contains(&key.as_str()));
            }
            if metadata
                .annotations
                .as_ref()
                .is_some_and(|annotations| annotations.is_empty())
            {
                metadata.annotations = None;
            }
        })
        .reflect(writer)
        .applied_objects();
    (store, objects)
}
