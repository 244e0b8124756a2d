//! A metadata-only watch of the namespaces in the guard's scope: a namespace it shows
//! alive lets a denial stand without a read. Only a namespace it shows terminating (or
//! does not know) is read by quorum, since only that read may turn a denial into an allow.
//! Its labels say whether in-use protection covers the namespace, and in which mode.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    core::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};
use tokio::sync::mpsc;

use crate::Result;

/// The namespaces as the watches last saw them, by name (one store for all namespaces
/// under the empty name). Empty until [`NamespaceCache::watching`] sets it up.
#[derive(Clone, Default)]
pub struct NamespaceCache {
    stores: Arc<HashMap<String, Store<PartialObjectMeta<Namespace>>>>,
    /// Told the name of each namespace the watches bring, once the cache shows it.
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>>,
}

impl NamespaceCache {
    /// A cache of the namespaces in `scope` (all when empty), and the watches to run.
    pub fn watching(client: &Client, scope: &[String]) -> (Self, impl Future<Output = ()> + Send + use<>) {
        let all: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let watches: Vec<(String, watcher::Config)> = if scope.is_empty() {
            vec![(String::new(), watcher::Config::default())]
        } else {
            // One watch per namespace, by name: what a Role limited to those names allows.
            scope
                .iter()
                .map(|name| {
                    (
                        name.clone(),
                        watcher::Config::default().fields(&format!("metadata.name={name}")),
                    )
                })
                .collect()
        };
        let mut stores = HashMap::new();
        let mut runs = Vec::new();
        let subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<String>>>> = Arc::default();
        for (key, config) in watches {
            let (store, writer) = reflector::store();
            stores.insert(key, store);
            let subscribers = subscribers.clone();
            let events = watcher(all.clone(), config)
                .default_backoff()
                .modify(|ns| {
                    ns.metadata.managed_fields = None;
                    ns.metadata.annotations = None;
                })
                .reflect(writer)
                .for_each(move |event| {
                    match event {
                        Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns)) => {
                            if let Some(name) = ns.metadata.name {
                                let mut subscribers =
                                    subscribers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                                subscribers.retain(|subscriber| subscriber.send(name.clone()).is_ok());
                            }
                        }
                        Ok(_) => {}
                        Err(error) => tracing::debug!(%error, "namespace watch error, retrying"),
                    }
                    std::future::ready(())
                });
            runs.push(events);
        }
        let cache = Self {
            stores: Arc::new(stores),
            subscribers,
        };
        (cache, futures::future::join_all(runs).map(|_| ()))
    }

    /// The names of the namespaces the watches bring from now on (created, labelled,
    /// being deleted), each sent once the cache shows it.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<String> {
        let (sender, changes) = mpsc::unbounded_channel();
        self.subscribers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(sender);
        changes
    }

    /// What the cache says of a namespace: `Some(false)` when it shows it alive.
    pub fn terminating(&self, namespace: &str) -> Option<bool> {
        let cached = self.get(namespace)?;
        Some(cached.metadata.deletion_timestamp.is_some())
    }

    /// The namespace's labels as the cache shows them; `None` when it does not know it.
    pub fn labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        Some(self.get(namespace)?.metadata.labels.clone().unwrap_or_default())
    }

    fn get(&self, namespace: &str) -> Option<Arc<PartialObjectMeta<Namespace>>> {
        let store = self.stores.get(namespace).or_else(|| self.stores.get(""))?;
        store.get(&ObjectRef::new(namespace))
    }
}

/// Whether the namespace is being deleted: `false` at once when `cache` shows it alive
/// (a denial stands), else by quorum read.
pub async fn terminating(client: &Client, cache: &NamespaceCache, namespace: &str) -> Result<bool> {
    if cache.terminating(namespace) == Some(false) {
        return Ok(false);
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let found = namespaces.get_metadata_opt(namespace).await?;
    Ok(found.is_some_and(|ns| ns.metadata.deletion_timestamp.is_some()))
}
