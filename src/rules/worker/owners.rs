//! Secrets follow their pods: each protected secret a worker pod really uses gets an
//! ownerReference to that pod, so the garbage collector deletes the secret when the pod
//! goes.
//!
//! Adoption is a privilege (the garbage collector acts on it), so it rests on facts only.
//! Secret S is adopted by pod P when a quorum read of P shows that P is named after S's
//! worker, P's spec references S, S is protected, and P is live with the UID written
//! ([`may_adopt`]). Labels and annotations only say which objects to look at.
//!
//! A pod has no UID during mutating admission, so the reference is written afterwards, by
//! a `kube::runtime::Controller` keyed on worker pods: it watches pods that carry the
//! worker label and secrets that carry it (metadata only, label-selected by the
//! apiserver: no other secret reaches the guard), and maps a secret to the pod named after
//! its worker. Events for one pod are coalesced; a pod is reconciled once per UID (status
//! updates do not trigger it), and a failed reconcile is retried with backoff until it
//! succeeds or becomes moot (pod gone, secret gone).
//!
//! With a Lease ([`crate::cluster::lease`]), only its holder adopts. Every replica keeps its pod
//! watch, which is also the decisions' cache ([`PodCache`]); the holder's watch forwards
//! the pods to its controller, which it starts, with a watch of the secrets of its own,
//! when it takes the Lease, and stops when it loses it. A new term begins with one pass
//! over every pod in the store, as a restart does: the pods seen while another replica
//! held the Lease were not forwarded. Writes carry the secret's resourceVersion, so the
//! replicas converge on one reference whether one of them adopts (a Lease), all of them
//! (none), or two for a moment (a holder that has stalled past its lease): a second
//! writer costs a 409 Conflict and a re-read, never a wrong reference.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{
    StreamExt, TryStreamExt,
    channel::mpsc,
    future::{join, join_all},
    stream,
};
use k8s_openapi::{
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher::{self, watcher},
    },
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result, cluster,
    cluster::lease::Leadership,
    cluster::revision::parse_revision,
    observe::events::{Events, secret_reference},
    observe::metrics::Metrics,
    rules::worker::{
        Settings,
        pod::{PodLiveness, PodState, WorkerPod},
        watch::PodCache,
    },
};

/// How many pods are reconciled at once.
const CONCURRENCY: u16 = 16;

/// Attempts at a write that keeps conflicting with other writers.
const ATTEMPTS: usize = 5;

/// The reconciler: adds ownerReferences from worker secrets to their pods.
pub struct Reconciler {
    client: Client,
    policy: Settings,
    /// The namespaces watched; empty means all.
    namespaces: Vec<String>,
    metrics: Arc<Metrics>,
    events: Events,
    pod_cache: PodCache,
    own_writes: OwnWrites,
}

/// The revisions of this replica's own secret writes, kept a little while. A cached copy
/// older than one is a write behind (the watch has not delivered the write yet, and a
/// reconcile came first: the pod's event and its secret's both bring a pod): writing from
/// it would only earn a 409 Conflict, so the secret is read instead.
#[derive(Default)]
struct OwnWrites(Mutex<HashMap<(String, String), (u64, Instant)>>);

/// How long an own write is remembered: far longer than a watch takes to deliver it.
const OWN_WRITES_KEPT: Duration = Duration::from_secs(30);

/// What an adoption attempt did to one secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// The reference was added.
    Added,
    /// The reference was already there.
    Present,
    /// The facts do not allow it (or no longer do).
    Refused,
    /// The secret does not exist (yet, or any more).
    Missing,
}

/// Whether `pod` may own `secret`. Both must come from quorum reads (or, for the secret,
/// be written with its resourceVersion as a precondition): this is the whole of what the
/// guard trusts before it lets the garbage collector act.
pub fn may_adopt(policy: &Settings, secret: &ObjectMeta, pod: &WorkerPod) -> bool {
    let (Some(secret_name), Some(pod_name)) = (secret.name.as_deref(), pod.metadata.name.as_deref()) else {
        return false;
    };
    policy.worker_of_secret(secret).as_deref() == Some(pod_name)
        && secret.namespace == pod.metadata.namespace
        && pod.metadata.uid.as_deref().is_some_and(|uid| !uid.is_empty())
        && PodState::from(pod).is_live()
        && pod.spec.as_ref().is_some_and(|spec| spec.names().contains(secret_name))
}

/// What the reconciles of one scope share.
struct Context {
    reconciler: Arc<Reconciler>,
    /// Worker-labelled pods, stripped to their liveness: what the controller reconciles.
    pods: Store<PodLiveness>,
    /// Worker-labelled secrets, metadata only: a hint of what exists and what is done.
    secrets: Store<PartialObjectMeta<Secret>>,
    retries: cluster::Retries<ObjectRef<PodLiveness>>,
}

// === impl Reconciler ===

impl Reconciler {
    /// A reconciler writing through `client`.
    pub fn new(
        client: Client,
        policy: Settings,
        namespaces: Vec<String>,
        metrics: Arc<Metrics>,
        events: Events,
        pod_cache: PodCache,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            policy,
            namespaces,
            metrics,
            events,
            pod_cache,
            own_writes: OwnWrites::default(),
        })
    }

    /// Watches worker pods until `shutdown`, and adopts their secrets while `leadership`
    /// says so: one watch and controller per watched namespace, or one for all.
    pub async fn run(self: Arc<Self>, leadership: Leadership, shutdown: CancellationToken) {
        let controllers = cluster::scopes(&self.namespaces)
            .into_iter()
            .map(|scope| self.clone().run_scope(scope, leadership.clone(), shutdown.clone()));
        join_all(controllers).await;
    }

    /// An API handle in the scope: one namespace, or all.
    fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        &self,
        namespace: Option<&str>,
    ) -> Api<K> {
        cluster::api_in(self.client.clone(), namespace)
    }

    /// One scope's pod watch, all along, and its controller, term after term.
    async fn run_scope(
        self: Arc<Self>,
        namespace: Option<String>,
        mut leadership: Leadership,
        shutdown: CancellationToken,
    ) {
        // Metadata, the worker label's value and the phase (a metadata-only watch has no
        // phase): the store that the controller reads is also the decisions' cache.
        let cache = self.pod_cache.add(namespace.clone(), &self.policy.worker_label);
        let pods = cache.store();
        let label = self.policy.worker_label.clone();
        // Where the watch sends the pods to adopt: the controller of the term in progress.
        let term: Arc<Mutex<Option<mpsc::UnboundedSender<PodLiveness>>>> = Arc::default();
        let watch = {
            let term = term.clone();
            watcher(
                self.api::<PodLiveness>(namespace.as_deref()),
                watcher::Config::default().labels(&self.policy.worker_label),
            )
            .default_backoff()
            .modify(move |pod| pod.keep_worker(&label))
            .inspect_ok(move |event| cache.observe(event))
            .applied_objects()
            // Once per pod UID: status updates change nothing adoption depends on.
            .predicate_filter(uid, Default::default())
            .for_each(move |pod| {
                match pod {
                    // Unbounded: the watch, which the decisions read, never waits for the
                    // controller, which drains the channel into its queue (one entry a pod).
                    Ok(pod) => {
                        if let Some(controller) = lock(&term).as_ref() {
                            let _ = controller.unbounded_send(pod);
                        }
                    }
                    Err(error) => tracing::debug!(%error, "pod watch interrupted, retrying"),
                }
                std::future::ready(())
            })
        };
        let watch = async {
            tokio::select! {
                () = watch => {}
                () = shutdown.cancelled() => {}
            }
        };
        let terms = async {
            while leadership.gained().await && !shutdown.is_cancelled() {
                let (sender, receiver) = mpsc::unbounded();
                *lock(&term) = Some(sender);
                let leader = leadership.term(&shutdown);
                tracing::debug!(namespace = namespace.as_deref(), "adoption term begins");
                self.clone()
                    .adopt_until(namespace.as_deref(), receiver, pods.clone(), leader.ended())
                    .await;
                tracing::debug!(namespace = namespace.as_deref(), "adoption term ends");
                *lock(&term) = None;
                leader.end().await;
            }
        };
        join(watch, terms).await;
    }

    /// One term's controller: reconciles the pods the watch forwards, the pods of the
    /// secrets its own secret watch sees, and once every pod of the store, until `ended`.
    async fn adopt_until(
        self: Arc<Self>,
        namespace: Option<&str>,
        forwarded: mpsc::UnboundedReceiver<PodLiveness>,
        pods: Store<PodLiveness>,
        ended: CancellationToken,
    ) {
        let labelled = watcher::Config::default().labels(&self.policy.worker_label);
        let (secrets, secret_events) =
            cluster::metadata_store(self.api::<PartialObjectMeta<Secret>>(namespace), labelled, &[]);
        // The pass over the store waits for the pod watch's first list: until then the
        // store is empty, and the pods listed before this term began were not forwarded.
        // A relist after that keeps the old store until it ends: a pod first seen in a
        // relist under way when the term begins waits for the next term or restart (its
        // secret stays protected; only the garbage collector's cleanup waits).
        let every_pod = stream::once({
            let pods = pods.clone();
            async move {
                let _ = pods.wait_until_ready().await;
            }
        });

        let policy = self.policy.clone();
        let watched = pods.clone();
        let context = Arc::new(Context {
            reconciler: self,
            pods: pods.clone(),
            secrets,
            retries: cluster::Retries::default(),
        });
        Controller::for_stream(forwarded.map(Ok), pods)
            .watches_stream(secret_events, move |secret| pod_of(&policy, &secret.metadata, &watched))
            .reconcile_all_on(every_pod)
            .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
            .graceful_shutdown_on(ended.cancelled_owned())
            .run(reconcile, error_policy, context)
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "reconcile not run");
                }
            })
            .await;
    }

    /// Adds `pod`'s reference to `secret` if [`may_adopt`] holds. The secret's metadata
    /// comes from the label-selected cache when it has it: the write's resourceVersion
    /// precondition makes a stale copy fail with a conflict, after which it is read again.
    async fn adopt(&self, pod: &WorkerPod, secret: &str, cached: Option<ObjectMeta>) -> Result<Adoption> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let mut current = cached.filter(|meta| !self.own_writes.ahead_of(namespace, secret, meta));
        for _ in 0..ATTEMPTS {
            let meta = match current.take() {
                Some(meta) => meta,
                None => match secrets.get_metadata_opt(secret).await? {
                    Some(found) => found.metadata,
                    None => return Ok(Adoption::Missing),
                },
            };
            let owners = meta.owner_references.clone().unwrap_or_default();
            if owners.iter().any(|owner| owner.uid == uid) {
                return Ok(Adoption::Present);
            }
            if !may_adopt(&self.policy, &meta, pod) {
                return Ok(Adoption::Refused);
            }
            let mut references = owners;
            references.push(pod_reference(pod.metadata.name.as_deref().unwrap_or_default(), uid));
            // The resourceVersion makes the write conditional: another writer in
            // between gets us a 409 Conflict, and we start over from a fresh read.
            let patch = json!({
                "metadata": {
                    "resourceVersion": meta.resource_version,
                    "ownerReferences": references,
                }
            });
            match secrets
                .patch_metadata(
                    secret,
                    &PatchParams {
                        field_manager: Some(crate::FIELD_MANAGER.to_owned()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(patched) => {
                    self.own_writes.record(namespace, secret, &patched.metadata);
                    self.metrics.reference_added();
                    tracing::info!(%namespace, %secret, pod = pod.metadata.name.as_deref(), %uid, "ownerReference added");
                    let secret = secret_reference(namespace, secret, patched.metadata.uid.as_deref());
                    self.events.adopted(secret, pod_object_reference(pod));
                    return Ok(Adoption::Added);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => self.metrics.adoption_conflict(),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Adoption::Missing),
                Err(error) => return Err(error.into()),
            }
        }
        Err(Error::Conflict(format!("secret {namespace}/{secret} kept changing")))
    }
}

// === impl OwnWrites ===

impl OwnWrites {
    /// Remembers the revision `written` was left at; forgets writes older than
    /// [`OWN_WRITES_KEPT`].
    fn record(&self, namespace: &str, name: &str, written: &ObjectMeta) {
        let Some(revision) = parse_revision(written.resource_version.as_deref()) else {
            return;
        };
        let mut writes = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        writes.retain(|_, (_, at)| at.elapsed() < OWN_WRITES_KEPT);
        writes.insert((namespace.to_owned(), name.to_owned()), (revision, Instant::now()));
    }

    /// Whether this replica wrote the secret at a revision `cached` has not reached.
    fn ahead_of(&self, namespace: &str, name: &str, cached: &ObjectMeta) -> bool {
        let writes = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some((written, _)) = writes.get(&(namespace.to_owned(), name.to_owned())) else {
            return false;
        };
        parse_revision(cached.resource_version.as_deref()).is_none_or(|seen| seen < *written)
    }
}

/// One pod: read it by quorum, then adopt each protected secret of its worker that its
/// spec references.
async fn reconcile(cached: Arc<PodLiveness>, context: Arc<Context>) -> Result<Action> {
    let this = &context.reconciler;
    let key = ObjectRef::from_obj(&*cached);
    let (Some(namespace), Some(name)) = (cached.metadata.namespace.as_deref(), cached.metadata.name.as_deref()) else {
        return Ok(Action::await_change());
    };
    if cached.metadata.deletion_timestamp.is_some() {
        return Ok(context.forget(&key));
    }
    let pods: Api<WorkerPod> = Api::namespaced(this.client.clone(), namespace);
    let Some(pod) = pods.get_opt(name).await? else {
        return Ok(context.forget(&key));
    };
    if !PodState::from(&pod).is_live() {
        return Ok(context.forget(&key));
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(context.forget(&key));
    };

    for secret in spec.names() {
        let cached = context
            .secrets
            .get(&ObjectRef::new(&secret).within(namespace))
            .map(|secret| secret.metadata.clone());
        // A secret the cache does not have is protected only by its name; one that is
        // neither labelled nor named after this pod's worker is not this pod's to adopt.
        if cached.is_none() && this.policy.worker_of_secret_name(&secret).as_deref() != Some(name) {
            continue;
        }
        match this.adopt(&pod, &secret, cached).await? {
            Adoption::Added => {
                if let Some(created) = &pod.metadata.creation_timestamp {
                    let latency = Timestamp::now().duration_since(created.0);
                    this.metrics.adoption_latency(latency.as_secs_f64().max(0.0));
                }
            }
            // The pod came before its secret. A labelled secret (as CDS makes them) brings
            // this pod back when it is created; one protected by its name only is not
            // watched, and polling for it would cost a read per pod and period: it is
            // adopted at the next reconcile of the pod (a restart's backfill).
            Adoption::Missing | Adoption::Present | Adoption::Refused => {}
        }
    }
    Ok(context.forget(&key))
}

fn error_policy(pod: Arc<PodLiveness>, error: &Error, context: Arc<Context>) -> Action {
    context.reconciler.metrics.reconcile_error();
    let delay = context.next_retry(&ObjectRef::from_obj(&*pod));
    tracing::warn!(
        %error,
        pod = pod.metadata.name.as_deref(),
        namespace = pod.metadata.namespace.as_deref(),
        ?delay,
        "cannot adopt the pod's secrets, retrying"
    );
    Action::requeue(delay)
}

/// The pod a secret event concerns: the one named after its worker, unless the secret is
/// already owned by that pod as the watch shows it. A secret owned by another UID (a
/// stale owner, a previous pod of the same name) still brings the live pod in: the
/// garbage collector would otherwise keep trying to delete it while the pod lives.
fn pod_of(policy: &Settings, secret: &ObjectMeta, pods: &Store<PodLiveness>) -> Option<ObjectRef<PodLiveness>> {
    if secret.deletion_timestamp.is_some() {
        return None;
    }
    let worker = policy.worker_of_secret(secret)?;
    let pod = ObjectRef::new(&worker).within(secret.namespace.as_deref()?);
    let adopted = pods.get(&pod).is_some_and(|watched| {
        let uid = watched.metadata.uid.as_deref();
        crate::rules::worker::pod_owners(secret).any(|owner| Some(owner.uid.as_str()) == uid)
    });
    (!adopted).then_some(pod)
}

/// The forwarding slot of a scope, whatever a panicking holder left in it.
fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The predicate that lets each pod through once per UID.
fn uid(pod: &PodLiveness) -> Option<u64> {
    let mut hasher = DefaultHasher::new();
    pod.metadata.uid.as_ref()?.hash(&mut hasher);
    Some(hasher.finish())
}

// === impl Context ===

impl Context {
    /// The delay before the next attempt for `pod`.
    fn next_retry(&self, pod: &ObjectRef<PodLiveness>) -> Duration {
        self.retries.next(pod, |pod| self.pods.get(pod).is_some())
    }

    /// Done with `pod`: nothing to retry.
    fn forget(&self, pod: &ObjectRef<PodLiveness>) -> Action {
        self.retries.forget(pod);
        Action::await_change()
    }
}

/// A reference to a pod, for an event that names it.
fn pod_object_reference(pod: &WorkerPod) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
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

#[cfg(test)]
mod tests;
