//! In-use protection's reads against the apiserver. Every read here is sent without a
//! `resourceVersion`: a quorum read, served by etcd (the GETs) or by a watch cache proven
//! current (the LISTs of pods). The guard's own watch of the pods ([`UserIndex`]) stands
//! in for the LIST of every pod's spec once it has caught up with a revision read by
//! quorum after the request.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
    runtime::{
        WatchStreamExt,
        watcher::{self, watcher},
    },
};
use tokio::time::Instant;

use super::{
    Dependent, InUseLookup, WORKLOAD_KINDS,
    index::{ObjectKey, UserIndex},
};
use crate::{
    Error, Result, cluster,
    cluster::namespaces::{self, NamespaceCache},
    cluster::references::Kind,
    cluster::revision::{self, CATCH_UP},
    observe::metrics::Metrics,
    rules::{Bounded, Unavailable},
};

/// Pods per page of the namespace's LIST: a page's specs are held at once, never more.
const PAGE: u32 = 500;

/// The pods of a namespace that need a Secret or ConfigMap, each with what it needs.
type Listed = Vec<(Dependent, Vec<(Kind, String)>)>;

/// One LIST at a time per namespace, and the last one while reads wait for it.
#[derive(Default)]
struct Lists(std::sync::Mutex<HashMap<String, Arc<Lane>>>);

/// A namespace's LISTs.
#[derive(Default)]
struct Lane {
    /// The reads waiting for a LIST of the namespace, or reading one.
    waiting: AtomicUsize,
    /// When the last LIST was sent, and the pods it found needing something; held while a
    /// LIST runs.
    last: tokio::sync::Mutex<Option<(Instant, Arc<Listed>)>>,
}

/// Counts a read as waiting for its lane until dropped, even when its deadline drops it.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn on(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::SeqCst);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lists {
    fn lane(&self, namespace: &str) -> Arc<Lane> {
        let mut lanes = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        lanes.entry(namespace.to_owned()).or_default().clone()
    }
}

/// [`InUseLookup`] against the apiserver, through kube.
#[derive(Clone)]
pub struct KubeInUse {
    client: Client,
    /// The pod watches' indexes, one per watched namespace or one for all.
    indexes: Arc<Vec<Arc<UserIndex>>>,
    namespaces: NamespaceCache,
    /// Counts where the users were read from, when set.
    metrics: Option<Arc<Metrics>>,
    /// The namespaces' LISTs, shared by the reads that wait for them.
    lists: Arc<Lists>,
}

impl KubeInUse {
    /// Reads through this client, every user by a LIST.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            indexes: Arc::default(),
            namespaces: NamespaceCache::default(),
            metrics: None,
            lists: Arc::default(),
        }
    }

    /// Watches the pods of `scope` (each namespace, or all when empty) into an index of
    /// the objects they need, and consults `namespaces`: a user the index shows denies
    /// without a LIST, a denial in a namespace shown alive stands without a read. Returns
    /// the watches to run.
    pub fn watching(
        self,
        scope: &[String],
        namespaces: NamespaceCache,
        metrics: Arc<Metrics>,
    ) -> (Self, impl Future<Output = ()> + Send + use<>) {
        let indexes: Vec<Arc<UserIndex>> = cluster::scopes(scope)
            .into_iter()
            .map(|scope| Arc::new(UserIndex::new(scope)))
            .collect();
        let runs: Vec<_> = indexes
            .iter()
            .map(|index| watch_pods(self.client.clone(), index.clone()))
            .collect();
        let lookup = Self {
            indexes: Arc::new(indexes),
            namespaces,
            metrics: Some(metrics),
            ..self
        };
        (lookup, async move {
            futures::future::join_all(runs).await;
        })
    }

    /// The objects whose users may have changed from now on, as every index tells them
    /// ([`UserIndex::subscribe`]).
    pub fn subscribe(&self) -> tokio::sync::mpsc::UnboundedReceiver<ObjectKey> {
        let (sender, changes) = tokio::sync::mpsc::unbounded_channel();
        for index in self.indexes.iter() {
            index.subscribe(sender.clone());
        }
        changes
    }

    fn index(&self, namespace: &str) -> Option<&Arc<UserIndex>> {
        self.indexes.iter().find(|index| index.covers(namespace))
    }

    /// The pods of `namespace` whose spec needs the object, by a quorum LIST of them all
    /// sent after this read began: the reads of one namespace that arrive while its LIST
    /// runs share the next one, so that a burst of them (a `helm uninstall`, the deferred
    /// deletes it completes) costs a LIST or two, not one each.
    async fn list_users(&self, namespace: &str, kind: Kind, name: &str) -> Result<Vec<Dependent>> {
        let arrived = Instant::now();
        let lane = self.lists.lane(namespace);
        let _waiting = Waiting::on(&lane.waiting);
        let mut last = lane.last.lock().await;
        let listed = match last.as_ref() {
            Some((started, listed)) if *started >= arrived => Ok(listed.clone()),
            _ => {
                let started = Instant::now();
                let listed = self.list_namespace(namespace).await.map(Arc::new);
                if let Ok(listed) = &listed {
                    *last = Some((started, listed.clone()));
                }
                listed
            }
        };
        // The last read waiting lets the listing go: it would serve no later one.
        if lane.waiting.load(Ordering::SeqCst) == 1 {
            *last = None;
        }
        drop(last);
        Ok(listed?
            .iter()
            .filter(|(_, needs)| needs.contains(&(kind, name.to_owned())))
            .map(|(pod, _)| pod.clone())
            .collect())
    }

    /// Every pod of `namespace` that needs a Secret or ConfigMap, with what it needs, by
    /// a quorum LIST in pages.
    async fn list_namespace(&self, namespace: &str) -> Result<Listed> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        // No resourceVersion: the most recent, a quorum read; the next pages continue it.
        let mut params = ListParams::default().limit(PAGE);
        let mut listed = Vec::new();
        loop {
            let page = pods.list(&params).await?;
            for pod in page.items {
                let mut needs = Vec::new();
                if let Some(spec) = &pod.spec {
                    crate::cluster::references::visit(spec, |reference| {
                        let needed = (reference.kind, reference.name.to_owned());
                        if !reference.optional && !needs.contains(&needed) {
                            needs.push(needed);
                        }
                    });
                }
                if needs.is_empty() {
                    continue;
                }
                let phase = pod.status.and_then(|status| status.phase);
                let terminal = matches!(phase.as_deref(), Some("Succeeded" | "Failed"));
                let pod = Dependent {
                    terminal,
                    ..Dependent::from_metadata("v1", "Pod", &pod.metadata)
                };
                listed.push((pod, needs));
            }
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => return Ok(listed),
            }
        }
    }

    fn count(&self, from_index: bool) {
        if let Some(metrics) = &self.metrics {
            metrics.in_use_read(from_index);
        }
    }
}

/// Feeds `index` from a watch of its scope's pods, all along.
async fn watch_pods(client: Client, index: Arc<UserIndex>) {
    let pods: Api<Pod> = cluster::api_in(client, index.scope());
    watcher(pods, watcher::Config::default())
        .default_backoff()
        .inspect_ok(|event| index.observe(event))
        .for_each(|event| async move {
            if let Err(error) = event {
                tracing::debug!(%error, "in-use pod watch interrupted, retrying");
            }
        })
        .await;
}

#[async_trait]
impl InUseLookup for KubeInUse {
    async fn users(&self, namespace: &str, kind: Kind, name: &str) -> Result<Vec<Dependent>> {
        let Some(index) = self.index(namespace).filter(|index| index.is_busy(CATCH_UP)) else {
            self.count(false);
            return self.list_users(namespace, kind, name).await;
        };
        let found = match revision::current(&self.client, namespace, name).await? {
            Some(revision) => index.users_at(revision, namespace, kind, name, CATCH_UP).await,
            None => None,
        };
        self.count(found.is_some());
        match found {
            Some(users) => Ok(users),
            None => self.list_users(namespace, kind, name).await,
        }
    }

    async fn object(&self, namespace: &str, api_version: &str, kind: &str, name: &str) -> Result<Option<Dependent>> {
        self.get_object(namespace, api_version, kind, name).await
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        namespaces::terminating(&self.client, &self.namespaces, namespace).await
    }

    fn cached_users(&self, namespace: &str, kind: Kind, name: &str) -> Vec<Dependent> {
        self.index(namespace)
            .map(|index| index.users(namespace, kind, name))
            .unwrap_or_default()
    }

    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces.labels(namespace)
    }
}

impl KubeInUse {
    /// The object of this `apiVersion`, `kind` and name, metadata only, by a GET.
    async fn get_object(
        &self,
        namespace: &str,
        api_version: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<Dependent>> {
        let plural = match (api_version, kind) {
            ("v1", "Pod") => "pods",
            ("apps/v1", "ReplicaSet") => "replicasets",
            ("apps/v1", "Deployment") => "deployments",
            ("apps/v1", "StatefulSet") => "statefulsets",
            ("apps/v1", "DaemonSet") => "daemonsets",
            ("batch/v1", "Job") => "jobs",
            ("batch/v1", "CronJob") => "cronjobs",
            ("v1", "ReplicationController") => "replicationcontrollers",
            _ => {
                return Err(Error::Usage(format!(
                    "{api_version} {kind} is not read by in-use protection"
                )));
            }
        };
        debug_assert!(kind == "Pod" || WORKLOAD_KINDS.contains(&(api_version, kind)));
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        };
        let objects: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &resource);
        let found = objects.get_metadata_opt(name).await?;
        Ok(found.map(|found| Dependent::from_metadata(api_version, kind, &found.metadata)))
    }
}

/// Without a Kubernetes client every read fails: every in-use delete is denied.
#[async_trait]
impl InUseLookup for Unavailable {
    async fn users(&self, _: &str, _: Kind, _: &str) -> Result<Vec<Dependent>> {
        Err(Error::KubeConfig(self.0.clone()))
    }

    async fn object(&self, _: &str, _: &str, _: &str, _: &str) -> Result<Option<Dependent>> {
        Err(Error::KubeConfig(self.0.clone()))
    }

    async fn namespace_terminating(&self, _: &str) -> Result<bool> {
        Err(Error::KubeConfig(self.0.clone()))
    }
}

/// Every read timed and counted, and bounded by the decision's deadline when it has one.
#[async_trait]
impl InUseLookup for Bounded<dyn InUseLookup> {
    async fn users(&self, namespace: &str, kind: Kind, name: &str) -> Result<Vec<Dependent>> {
        self.read(self.inner().users(namespace, kind, name)).await
    }

    async fn object(&self, namespace: &str, api_version: &str, kind: &str, name: &str) -> Result<Option<Dependent>> {
        self.read(self.inner().object(namespace, api_version, kind, name)).await
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        self.read(self.inner().namespace_terminating(namespace)).await
    }

    fn cached_users(&self, namespace: &str, kind: Kind, name: &str) -> Vec<Dependent> {
        self.inner().cached_users(namespace, kind, name)
    }

    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.inner().namespace_labels(namespace)
    }
}
