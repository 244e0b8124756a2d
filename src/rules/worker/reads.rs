//! Quorum reads of pods, secrets and namespaces.
//!
//! Every read here is sent to the apiserver without a `resourceVersion`, so it is served
//! from etcd (or from a watch cache proven current): never from an informer cache and
//! never with `resourceVersion=0`. Deciding "pod absent" from a stale read is exactly the
//! bug this guard exists to stop.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::{Api, Client, api::ListParams};

use crate::{
    Error, Result,
    cluster::namespaces::{self, NamespaceCache},
    cluster::revision::{self, CATCH_UP, parse_revision},
    observe::metrics::Metrics,
    rules::worker::pod::{PodState, WorkerPod},
    rules::worker::watch::{PodCache, PodWatch},
    rules::{Bounded, Unavailable},
};

/// Pods per page of the worker-label LIST. The apiserver's priority and fairness charges
/// a LIST by the memory it may load: without a limit, a LIST of pods in a cluster with
/// thousands of them costs 10 seats however few it returns, and under load the guard's
/// own LISTs, waiting for the watch cache, filled its priority level and starved its
/// GETs and PATCHes (docs/design/benchmarks.md). A page of 10 pods costs one seat; a worker has one
/// pod, rarely more.
const LABEL_PAGE: u32 = 10;

/// What rule 5 reads of a worker: the pod named after it, and the pods its label names,
/// each answer apart.
pub type WorkerPods = (Result<Option<PodState>>, Result<Vec<PodState>>);

/// The apiserver reads behind the admission decisions, behind a narrow trait so the
/// rules can be tested with an in-memory fake and model-checked against a model store.
#[async_trait]
pub trait ClusterLookup: Send + Sync {
    /// The pod with this name, by quorum read.
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodState>>;

    /// The pods carrying `label=value`, by quorum read.
    async fn pods_labelled(&self, namespace: &str, label: &str, value: &str) -> Result<Vec<PodState>>;

    /// The pod named `worker` and the pods carrying `label=worker`, by quorum reads: what
    /// rule 5 reads of a worker. Each answer stands apart, so that a live pod one of them
    /// shows denies whatever became of the other. By default [`ClusterLookup::pod`] and
    /// [`ClusterLookup::pods_labelled`], at once.
    async fn namesake_and_labelled(&self, namespace: &str, label: &str, worker: &str) -> WorkerPods {
        futures::join!(
            self.pod(namespace, worker),
            self.pods_labelled(namespace, label, worker)
        )
    }

    /// The metadata (never the data) of a secret, by quorum read.
    async fn secret_metadata(&self, namespace: &str, name: &str) -> Result<Option<ObjectMeta>>;

    /// Whether the namespace is being deleted, by quorum read. Only `true` is acted on.
    async fn namespace_terminating(&self, namespace: &str) -> Result<bool>;

    /// The pod of this name as a watch last saw it, if it did: a hint that may justify a
    /// denial at once (the safe side), never the absence of a pod.
    fn cached_pod(&self, _namespace: &str, _name: &str) -> Option<PodState> {
        None
    }
}

/// [`ClusterLookup`] against the apiserver, through kube.
#[derive(Clone)]
pub struct KubeLookup {
    client: Client,
    pods: PodCache,
    /// Counts the label reads by where they were answered, when set.
    metrics: Option<Arc<Metrics>>,
    /// The namespaces as a watch shows them, when [`KubeLookup::with_namespaces`] set it.
    namespaces: NamespaceCache,
}

// === impl KubeLookup ===

impl KubeLookup {
    /// Reads through this client.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            pods: PodCache::default(),
            metrics: None,
            namespaces: NamespaceCache::default(),
        }
    }

    /// Consults `pods`, the reconciler's watch of worker pods: a live pod it shows denies
    /// without a read, and once it has caught up with a revision read after the request
    /// it answers for the worker label in place of a LIST. `metrics` counts which.
    #[must_use]
    pub fn with_pod_cache(self, pods: PodCache, metrics: Arc<Metrics>) -> Self {
        Self {
            pods,
            metrics: Some(metrics),
            ..self
        }
    }

    /// The pod watch selecting on `label` in `namespace`, if its events come often enough
    /// that waiting for it to catch up with a revision is likely quicker than a LIST.
    fn busy_watch(&self, namespace: &str, label: &str) -> Option<Arc<PodWatch>> {
        self.pods
            .watching(namespace, label)
            .filter(|watch| watch.is_busy(CATCH_UP))
    }

    /// The pod named `name` and the current revision, by one quorum read: a LIST of that
    /// one name answers what a GET would, with the revision the read was served at.
    async fn pod_and_revision(&self, namespace: &str, name: &str) -> Result<(Option<PodState>, Option<u64>)> {
        let pods: Api<WorkerPod> = Api::namespaced(self.client.clone(), namespace);
        let params = ListParams::default().fields(&format!("metadata.name={name}"));
        debug_assert!(params.resource_version.is_none(), "the pod must be read by quorum");
        let current = pods.list(&params).await?;
        let pod = current
            .items
            .iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(name))
            .map(PodState::from);
        Ok((pod, parse_revision(current.metadata.resource_version.as_deref())))
    }

    /// The pods labelled `value` from `watch`, once it has caught up with `revision`
    /// (read by quorum after the request arrived); `None` without a revision, or if the
    /// watch does not catch up in time.
    async fn labelled_from_watch(
        &self,
        watch: &PodWatch,
        revision: Option<u64>,
        namespace: &str,
        value: &str,
    ) -> Option<Vec<PodState>> {
        let found = match revision {
            Some(revision) => watch.labelled_at(revision, namespace, value, CATCH_UP).await,
            None => None,
        };
        if let Some(metrics) = &self.metrics {
            metrics.label_read(found.is_some());
        }
        found
    }

    /// The pods carrying `label=value`, by a quorum LIST, page by page.
    async fn list_labelled(&self, namespace: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        let pods: Api<WorkerPod> = Api::namespaced(self.client.clone(), namespace);
        // The default ListParams carry no resourceVersion: "most recent", a quorum read.
        // The next pages continue that same read (the token pins its resourceVersion).
        let mut params = ListParams::default()
            .labels(&format!("{label}={value}"))
            .limit(LABEL_PAGE);
        debug_assert!(params.resource_version.is_none(), "a pod list must be a quorum read");
        let mut found = Vec::new();
        loop {
            let page = pods.list(&params).await?;
            found.extend(page.items.iter().map(PodState::from));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => return Ok(found),
            }
        }
    }

    fn count_listed(&self) {
        if let Some(metrics) = &self.metrics {
            metrics.label_read(false);
        }
    }

    /// Keeps `namespaces`, a cache of the namespaces in the guard's scope: a denial in a
    /// namespace it shows alive stands without a read.
    #[must_use]
    pub fn with_namespaces(self, namespaces: NamespaceCache) -> Self {
        Self { namespaces, ..self }
    }
}

#[async_trait]
impl ClusterLookup for KubeLookup {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodState>> {
        // `get_opt` sends no resourceVersion: a quorum read.
        let pods: Api<WorkerPod> = Api::namespaced(self.client.clone(), namespace);
        Ok(pods.get_opt(name).await?.as_ref().map(PodState::from))
    }

    async fn pods_labelled(&self, namespace: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        let Some(watch) = self.busy_watch(namespace, label) else {
            self.count_listed();
            return self.list_labelled(namespace, label, value).await;
        };
        let revision = revision::current(&self.client, namespace, value).await?;
        match self.labelled_from_watch(&watch, revision, namespace, value).await {
            Some(found) => Ok(found),
            None => self.list_labelled(namespace, label, value).await,
        }
    }

    async fn namesake_and_labelled(&self, namespace: &str, label: &str, worker: &str) -> WorkerPods {
        let Some(watch) = self.busy_watch(namespace, label) else {
            // The label has no index to answer from: a GET and a label LIST, at once.
            self.count_listed();
            return futures::join!(
                self.pod(namespace, worker),
                self.list_labelled(namespace, label, worker)
            );
        };
        // One quorum read serves both: the LIST of the worker's name shows its namesake as
        // a GET would, and its revision is the one the watch must reach for the label.
        match self.pod_and_revision(namespace, worker).await {
            Ok((namesake, revision)) => {
                let labelled = match self.labelled_from_watch(&watch, revision, namespace, worker).await {
                    Some(found) => Ok(found),
                    None => self.list_labelled(namespace, label, worker).await,
                };
                (Ok(namesake), labelled)
            }
            // No revision, no answer from the watch: the label is LISTed, and the namesake's
            // read stays failed (rule 6 denies unless a live pod does first).
            Err(error) => {
                self.count_listed();
                (Err(error), self.list_labelled(namespace, label, worker).await)
            }
        }
    }

    async fn secret_metadata(&self, namespace: &str, name: &str) -> Result<Option<ObjectMeta>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        Ok(secrets.get_metadata_opt(name).await?.map(|partial| partial.metadata))
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        namespaces::terminating(&self.client, &self.namespaces, namespace).await
    }

    fn cached_pod(&self, namespace: &str, name: &str) -> Option<PodState> {
        self.pods.get(namespace, name)
    }
}

#[async_trait]
impl ClusterLookup for Unavailable {
    async fn pod(&self, _: &str, _: &str) -> Result<Option<PodState>> {
        Err(Error::KubeConfig(self.0.clone()))
    }

    async fn pods_labelled(&self, _: &str, _: &str, _: &str) -> Result<Vec<PodState>> {
        Err(Error::KubeConfig(self.0.clone()))
    }

    async fn secret_metadata(&self, _: &str, _: &str) -> Result<Option<ObjectMeta>> {
        Err(Error::KubeConfig(self.0.clone()))
    }

    async fn namespace_terminating(&self, _: &str) -> Result<bool> {
        Err(Error::KubeConfig(self.0.clone()))
    }
}

/// Every read on the request path timed, counted and bounded by the decision's deadline.
#[async_trait]
impl ClusterLookup for Bounded<dyn ClusterLookup> {
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodState>> {
        self.read(self.inner().pod(namespace, name)).await
    }

    async fn pods_labelled(&self, namespace: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        self.read(self.inner().pods_labelled(namespace, label, value)).await
    }

    /// One read with two answers: one timer, failed if either failed; past the deadline,
    /// both fail.
    async fn namesake_and_labelled(&self, namespace: &str, label: &str, worker: &str) -> WorkerPods {
        let timer = self.time();
        let read = self.inner().namesake_and_labelled(namespace, label, worker);
        let (namesake, labelled) = self
            .within_deadline(read, |budget| {
                (Err(Error::Timeout(budget)), Err(Error::Timeout(budget)))
            })
            .await;
        timer.finish(namesake.is_err() || labelled.is_err());
        (namesake, labelled)
    }

    async fn secret_metadata(&self, namespace: &str, name: &str) -> Result<Option<ObjectMeta>> {
        self.read(self.inner().secret_metadata(namespace, name)).await
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        self.read(self.inner().namespace_terminating(namespace)).await
    }

    fn cached_pod(&self, namespace: &str, name: &str) -> Option<PodState> {
        self.inner().cached_pod(namespace, name)
    }
}
