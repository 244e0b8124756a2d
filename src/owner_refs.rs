//! Secrets follow their pods: each protected secret a worker pod uses gets an
//! ownerReference to that pod, so the garbage collector deletes the secret when the pod
//! goes (and rule 3 of the policy lets that delete through at once).
//!
//! A pod has no UID during mutating admission, so the reference is written afterwards, by
//! this reconciler. It watches worker pods and protected secrets (metadata only: no pod
//! spec, no secret data) and, for each pair, adds the reference once a quorum read
//! confirms the pod with that UID exists and is live. It never writes a UID it could not
//! confirm. Writes carry the secret's resourceVersion (optimistic concurrency) and are
//! retried on conflict after a fresh read; a reference already there is left alone. So
//! several replicas can run it at once without a leader: they converge on one reference.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::{
    api::core::v1::{Pod, Secret},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    Result, config::PolicyConfig, lookup::PodState, metrics::Metrics, mutation::PROTECTED_SECRETS_ANNOTATION,
    policy::pod_owners,
};

/// How many pods or secrets are reconciled at once.
const CONCURRENCY: usize = 16;

/// Attempts at a write that keeps conflicting with other writers.
const ATTEMPTS: usize = 5;

/// What the reconciler shares between its two watches.
pub struct Reconciler {
    client: Client,
    policy: PolicyConfig,
    metrics: Arc<Metrics>,
}

/// What one adoption attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// The reference was added.
    Added,
    /// The reference was already there.
    Present,
    /// Nothing to do: the secret does not exist, or the pod is not confirmed live.
    Skipped,
}

// === impl Reconciler ===

impl Reconciler {
    /// A reconciler writing through `client`.
    pub fn new(client: Client, policy: PolicyConfig, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            client,
            policy,
            metrics,
        })
    }

    /// Watches worker pods and protected secrets until `shutdown`. The watches' initial
    /// lists backfill what existed before the guard started.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let pods = self.clone().watch_pods();
        let secrets = self.clone().watch_secrets();
        tokio::select! {
            () = pods => tracing::error!("pod watch ended"),
            () = secrets => tracing::error!("secret watch ended"),
            () = shutdown.cancelled() => {}
        }
    }

    async fn watch_pods(self: Arc<Self>) {
        // Metadata only: the mutation's annotation says which secrets a pod uses.
        let pods: Api<PartialObjectMeta<Pod>> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(&self.policy.worker_label);
        watcher(pods, config)
            .default_backoff()
            .applied_objects()
            .for_each_concurrent(CONCURRENCY, |pod| {
                let this = self.clone();
                async move {
                    match pod {
                        Ok(pod) => this.reconcile_pod(&pod.metadata).await,
                        Err(error) => tracing::warn!(%error, "pod watch error, retrying"),
                    }
                }
            })
            .await;
    }

    async fn watch_secrets(self: Arc<Self>) {
        // Metadata only: secret data never reaches the guard.
        let secrets: Api<PartialObjectMeta<Secret>> = Api::all(self.client.clone());
        watcher(secrets, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .try_filter(|secret| futures::future::ready(self.policy.worker_of_secret(&secret.metadata).is_some()))
            .for_each_concurrent(CONCURRENCY, |secret| {
                let this = self.clone();
                async move {
                    match secret {
                        Ok(secret) => this.reconcile_secret(&secret.metadata).await,
                        Err(error) => tracing::warn!(%error, "secret watch error, retrying"),
                    }
                }
            })
            .await;
    }

    /// A pod changed: adopt the protected secrets it uses.
    async fn reconcile_pod(&self, pod: &ObjectMeta) {
        let (Some(namespace), Some(name), Some(uid)) = (&pod.namespace, &pod.name, &pod.uid) else {
            return;
        };
        if pod.deletion_timestamp.is_some() {
            return;
        }
        for secret in self.secrets_of(pod) {
            match self.adopt(namespace, &secret, name, uid).await {
                Ok(Adoption::Added) => {
                    if let Some(created) = &pod.creation_timestamp {
                        let latency = Timestamp::now().duration_since(created.0);
                        self.metrics.adoption_latency(latency.as_secs_f64().max(0.0));
                    }
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, %namespace, %secret, pod = %name, "cannot add the ownerReference"),
            }
        }
    }

    /// A protected secret changed: adopt it by its worker's pod, if that pod is live.
    async fn reconcile_secret(&self, secret: &ObjectMeta) {
        let (Some(namespace), Some(name)) = (&secret.namespace, &secret.name) else {
            return;
        };
        if secret.deletion_timestamp.is_some() || pod_owners(secret).next().is_some() {
            return;
        }
        let Some(worker) = self.policy.worker_of_secret(secret) else {
            return;
        };
        // The worker's pod is named after it; the quorum read in `adopt` confirms its UID.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match pods.get_metadata_opt(&worker).await {
            Ok(Some(PartialObjectMeta { metadata: pod, .. })) if self.secrets_of(&pod).contains(name) => {
                if let (Some(pod_name), Some(uid)) = (&pod.name, &pod.uid)
                    && let Err(error) = self.adopt(namespace, name, pod_name, uid).await
                {
                    tracing::warn!(%error, %namespace, secret = %name, "cannot add the ownerReference");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::debug!(%error, %namespace, secret = %name, "cannot read the worker's pod"),
        }
    }

    /// The protected secrets a pod uses: the mutation's annotation, or else the names
    /// its worker label implies.
    fn secrets_of(&self, pod: &ObjectMeta) -> BTreeSet<String> {
        let annotated = pod
            .annotations
            .as_ref()
            .and_then(|a| a.get(PROTECTED_SECRETS_ANNOTATION));
        if let Some(list) = annotated {
            return list.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        }
        let worker = pod
            .labels
            .as_ref()
            .and_then(|labels| labels.get(&self.policy.worker_label));
        match worker {
            Some(worker) => self
                .policy
                .secret_prefixes
                .iter()
                .map(|prefix| format!("{prefix}{worker}"))
                .collect(),
            None => BTreeSet::new(),
        }
    }

    /// Adds an ownerReference to pod `pod`/`uid` on secret `secret`, after a quorum read
    /// confirms that pod is live. Conflicting writes are retried after a fresh read.
    pub async fn adopt(&self, namespace: &str, secret: &str, pod: &str, uid: &str) -> Result<Adoption> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        for _ in 0..ATTEMPTS {
            let Some(current) = secrets.get_metadata_opt(secret).await? else {
                return Ok(Adoption::Skipped);
            };
            let owners = current.metadata.owner_references.clone().unwrap_or_default();
            if owners.iter().any(|owner| owner.uid == uid) {
                return Ok(Adoption::Present);
            }
            // Confirm the UID by quorum read; a pod that is gone, replaced or finishing
            // does not get to own the secret.
            let confirmed = pods.get_opt(pod).await?.as_ref().map(PodState::from);
            if !confirmed.is_some_and(|p| p.uid == uid && p.is_live()) {
                return Ok(Adoption::Skipped);
            }
            let mut references = owners;
            references.push(pod_reference(pod, uid));
            // The resourceVersion makes the write conditional: another writer in
            // between gets us a 409 Conflict, and we start over from a fresh read.
            let patch = json!({
                "metadata": {
                    "resourceVersion": current.metadata.resource_version,
                    "ownerReferences": references,
                }
            });
            match secrets
                .patch_metadata(secret, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.metrics.reference_added();
                    tracing::info!(%namespace, %secret, %pod, %uid, "ownerReference added");
                    return Ok(Adoption::Added);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.metrics.adoption_conflict();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Adoption::Skipped),
                Err(error) => return Err(error.into()),
            }
        }
        Err(crate::Error::Conflict(format!(
            "secret {namespace}/{secret} kept changing"
        )))
    }
}

/// The reference a worker pod holds on its secret: not a controller, and not blocking
/// the pod's deletion.
pub fn pod_reference(pod: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Pod".to_owned(),
        name: pod.to_owned(),
        uid: uid.to_owned(),
        controller: Some(false),
        block_owner_deletion: Some(false),
    }
}
