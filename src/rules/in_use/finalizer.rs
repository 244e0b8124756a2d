//! Deferred deletes ([`Mode::Defer`]): the guard's [`FINALIZER`] on every opted-in object a
//! pod uses, so that a delete is accepted and the object stays, terminating, until no pod
//! uses it. Kubernetes protects a PersistentVolumeClaim in use the same way
//! (pvc-protection): a finalizer, and a controller that removes it once no pod needs the
//! claim.
//!
//! The [`Holder`] is that controller, one `kube::runtime::Controller` per kind and scope,
//! on the Lease holder. Each watches its objects' metadata (labels, finalizers, deletion;
//! never data, never other annotations), and is told by the pod index
//! ([`UserIndex::subscribe`](super::UserIndex::subscribe)) which objects' users changed, and by a namespace watch which
//! namespaces' labels did. For each object it does what [`plan`] says:
//!
//! - **hold**: an object opted in to `defer`, not being deleted, that a pod the index
//!   shows running needs gets the finalizer (once per object, not per pod). Adding it is
//!   always safe, so the index's word is enough;
//! - **release when unused**: an object held and being deleted loses the finalizer once
//!   [`may_release`] proves that no pod that stays uses it: the quorum proof that allows a
//!   delete in [`Mode::Refuse`], made after the delete. A pod created meanwhile counts:
//!   nothing refuses it, and it would not start without the object;
//! - **release**: an object held that is no longer opted in (label removed from it or its
//!   namespace), or that is opted in to `refuse` and not being deleted. A release of an
//!   object being deleted is confirmed by quorum reads first; a release of one that is not
//!   carries its resourceVersion, so that a delete in between (deferred, since it saw the
//!   finalizer) makes the write fail, and the object is looked at again.
//!
//! Until the finalizer is on, the webhook refuses the delete of a used object, as in
//! `refuse`: no window opens. Nothing here keeps an object for good: a namespace being
//! deleted releases its objects ([`may_release`]), the force annotation releases at once,
//! and [`release_all`] (`cds-secret-guard release-finalizers`, the chart's uninstall hook)
//! removes the finalizer everywhere.

use std::{collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use futures::{FutureExt, StreamExt, channel::mpsc, future::join_all};
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{ConfigMap, Namespace, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource,
    core::PartialObjectMeta,
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::{FORCE_ANNOTATION, InUseLookup, KubeInUse, Mode, ObjectDelete, ROOT_CA, is_held, may_release, opted_in};
use crate::{
    Error, Result, cluster,
    cluster::lease::Leadership,
    cluster::namespaces::NamespaceCache,
    cluster::references::Kind,
    observe::events::{DeletedRef, Events},
    observe::metrics::Metrics,
    rules::Bounded,
};

/// Objects reconciled at once, per controller.
const CONCURRENCY: u16 = 8;
/// How often an object held for a deferred delete is looked at again when nothing said
/// that its users changed (an owner up a pod's chain may have).
const RECHECK: Duration = Duration::from_secs(30);

/// What the guard does with one object's finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: it is as it should be.
    Keep,
    /// Add it: a pod uses the object, opted in to `defer`.
    Hold,
    /// Remove it once no pod that stays uses the object, which is being deleted.
    ReleaseWhenUnused,
    /// Remove it: the object is no longer opted in, or, not being deleted, is opted in to
    /// `refuse`.
    Release,
}

/// What an object's finalizer needs: `held`, whether it carries it; `deleting`, whether it
/// is being deleted; `mode`, what it is opted in to ([`opted_in`]); `used`, whether a pod
/// that runs needs it, as the index shows.
pub fn plan(held: bool, deleting: bool, mode: Option<Mode>, used: bool) -> Step {
    match (held, deleting, mode) {
        (false, false, Some(Mode::Defer)) if used => Step::Hold,
        (false, _, _) | (true, false, Some(Mode::Defer)) => Step::Keep,
        // A deferred delete keeps its promise whatever the mode has become since.
        (true, true, Some(_)) => Step::ReleaseWhenUnused,
        (true, _, None) | (true, false, Some(Mode::Refuse)) => Step::Release,
    }
}

/// Secret or ConfigMap, as the holder watches and patches them.
pub trait Protected:
    k8s_openapi::Metadata<Ty = ObjectMeta>
    + Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The kind the rules name it by.
    const RULES_KIND: Kind;
}

impl Protected for Secret {
    const RULES_KIND: Kind = Kind::Secret;
}

impl Protected for ConfigMap {
    const RULES_KIND: Kind = Kind::ConfigMap;
}

/// The controller that holds opted-in objects for deferred deletes and releases them.
pub struct Holder {
    client: Client,
    lookup: KubeInUse,
    /// The same reads, timed and counted: what a release is decided on.
    reads: Bounded<dyn InUseLookup>,
    namespaces: NamespaceCache,
    /// What `enabled` asks for.
    default_mode: Mode,
    /// The namespaces watched; all when empty.
    scope: Vec<String>,
    metrics: Arc<Metrics>,
    events: Events,
}

/// What a term's reconciles share.
struct Context<K: Protected> {
    holder: Arc<Holder>,
    objects: Store<PartialObjectMeta<K>>,
    retries: cluster::Retries<ObjectRef<PartialObjectMeta<K>>>,
}

// === impl Holder ===

impl Holder {
    /// A holder writing through `client`, reading the users through `lookup` (the pod
    /// index, quorum reads) and the namespaces' labels through `namespaces`.
    pub fn new(
        client: Client,
        lookup: KubeInUse,
        namespaces: NamespaceCache,
        default_mode: Mode,
        scope: Vec<String>,
        metrics: Arc<Metrics>,
        events: Events,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            reads: Bounded::new(Arc::new(lookup.clone()), metrics.clone()),
            lookup,
            namespaces,
            default_mode,
            scope,
            metrics,
            events,
        })
    }

    /// Holds and releases while `leadership` says so, until `shutdown`.
    pub async fn run(self: Arc<Self>, mut leadership: Leadership, shutdown: CancellationToken) {
        while leadership.gained().await && !shutdown.is_cancelled() {
            let term = leadership.term(&shutdown);
            tracing::debug!("in-use finalizer term begins");
            self.clone().hold_until(term.ended()).await;
            tracing::debug!("in-use finalizer term ends");
            term.end().await;
        }
    }

    /// One term: a controller per kind and scope, each told of its objects' users by the
    /// pod index, until `ended`.
    async fn hold_until(self: Arc<Self>, ended: CancellationToken) {
        let mut routes = HashMap::new();
        let mut controllers = Vec::new();
        for scope in cluster::scopes(&self.scope) {
            let (secrets, secret_changes) = mpsc::unbounded();
            let (config_maps, config_map_changes) = mpsc::unbounded();
            routes.insert((scope.clone(), Kind::Secret), secrets);
            routes.insert((scope.clone(), Kind::ConfigMap), config_maps);
            controllers.push(
                self.clone()
                    .control::<Secret>(scope.clone(), secret_changes, ended.clone())
                    .boxed(),
            );
            controllers.push(
                self.clone()
                    .control::<ConfigMap>(scope, config_map_changes, ended.clone())
                    .boxed(),
            );
        }
        let mut changes = self.lookup.subscribe();
        let route = async {
            loop {
                let change = tokio::select! {
                    change = changes.recv() => change,
                    () = ended.cancelled() => None,
                };
                let Some((namespace, kind, name)) = change else { return };
                let in_scope = if self.scope.is_empty() {
                    None
                } else {
                    Some(namespace.clone())
                };
                if let Some(route) = routes.get(&(in_scope, kind)) {
                    let _ = route.unbounded_send((namespace, name));
                }
            }
        };
        futures::future::join(join_all(controllers), route).await;
    }

    /// The controller of the `K`s of `scope`: the objects' metadata watched, each
    /// reconciled when it changes, when its users change (`changes`), when its namespace
    /// does, and [`RECHECK`] after a deferred delete that has to wait.
    async fn control<K: Protected>(
        self: Arc<Self>,
        scope: Option<String>,
        changes: mpsc::UnboundedReceiver<(String, String)>,
        ended: CancellationToken,
    ) {
        let api: Api<PartialObjectMeta<K>> = cluster::api_in(self.client.clone(), scope.as_deref());
        // The metadata the rules read: the force annotation alone of the annotations.
        let (objects, events) = cluster::metadata_store(api, watcher::Config::default(), &[FORCE_ANNOTATION]);
        // A namespace's labels may opt its objects in or out: they are looked at again once
        // the cache the reconciles read shows the change.
        let in_namespace = objects.clone();
        let namespace_changed = tokio_stream_of(self.namespaces.subscribe()).flat_map(move |namespace| {
            let objects: Vec<_> = in_namespace
                .state()
                .into_iter()
                .filter(|object| object.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .map(|object| ObjectRef::from_obj(&*object))
                .collect();
            futures::stream::iter(objects)
        });
        let users_changed = changes.map(|(namespace, name)| ObjectRef::new(&name).within(&namespace));
        let context = Arc::new(Context {
            holder: self,
            objects: objects.clone(),
            retries: cluster::Retries::default(),
        });
        Controller::for_stream(events, objects)
            .reconcile_on(namespace_changed)
            .reconcile_on(users_changed)
            .with_config(kube::runtime::controller::Config::default().concurrency(CONCURRENCY))
            .graceful_shutdown_on(ended.cancelled_owned())
            .run(reconcile::<K>, error_policy::<K>, context.clone())
            .for_each(|result| {
                match result {
                    // A watch that fails (its rights taken away, the apiserver gone) holds
                    // and releases nothing until it is back: say so.
                    Err(kube::runtime::controller::Error::QueueError(error)) => {
                        context.holder.metrics.in_use_finalizer_error();
                        tracing::warn!(%error, kind = K::RULES_KIND.as_str(), "cannot watch the objects to hold, retrying");
                    }
                    Err(error) => tracing::debug!(%error, "in-use finalizer reconcile not run"),
                    Ok(_) => {}
                }
                std::future::ready(())
            })
            .await;
    }

    /// What the object is opted in to: its label's mode, else its namespace's, as the
    /// watches show them. `kube-system` and the guard's own namespace never are, as the
    /// webhooks leave them out.
    fn mode_of(&self, object: &ObjectMeta) -> Option<Mode> {
        let namespace = object.namespace.as_deref().unwrap_or_default();
        if self.left_out(namespace) {
            return None;
        }
        let namespace_labels = self.namespaces.labels(namespace);
        opted_in(object.labels.as_ref(), namespace_labels.as_ref(), self.default_mode)
    }

    /// `kube-system` and the guard's own namespace.
    fn left_out(&self, namespace: &str) -> bool {
        namespace == "kube-system" || namespace == self.client.default_namespace()
    }

    /// Whether a pod that runs needs the object, as the index shows it now.
    fn used(&self, kind: Kind, namespace: &str, name: &str) -> bool {
        if kind == Kind::ConfigMap && name == ROOT_CA {
            return false;
        }
        self.lookup
            .cached_users(namespace, kind, name)
            .iter()
            .any(|pod| !pod.terminal && !pod.deleting)
    }

    /// A Warning Event on `object`, being deleted, when pods created since its delete use
    /// it (a `helm rollback` to the revision that used it, a ReplicaSet replacing a pod):
    /// it will go once none runs, which they may not expect.
    fn tell_of_pods_created_since(&self, kind: Kind, object: &ObjectMeta) {
        let (Some(deleted), Some(namespace), Some(name)) = (
            object.deletion_timestamp.as_ref(),
            object.namespace.as_deref(),
            object.name.as_deref(),
        ) else {
            return;
        };
        let mut since: Vec<String> = self
            .lookup
            .cached_users(namespace, kind, name)
            .into_iter()
            .filter(|pod| !pod.terminal && pod.created.is_some_and(|created| created > deleted.0))
            .map(|pod| pod.name)
            .collect();
        if since.is_empty() {
            return;
        }
        since.sort_unstable();
        let object = DeletedRef {
            kind: kind.as_str(),
            namespace,
            name,
            uid: object.uid.as_deref(),
        };
        self.events.used_after_delete(object, &since);
    }
}

/// The object one reconcile is about, and the handle that writes it.
struct Target<'a, K: Protected> {
    objects: Api<PartialObjectMeta<K>>,
    namespace: &'a str,
    name: &'a str,
}

/// One object: [`plan`], then the write it calls for.
async fn reconcile<K: Protected>(object: Arc<PartialObjectMeta<K>>, context: Arc<Context<K>>) -> Result<Action> {
    let holder = &context.holder;
    let meta = &object.metadata;
    let (Some(namespace), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return Ok(Action::await_change());
    };
    let target = Target::<K> {
        objects: Api::namespaced(holder.client.clone(), namespace),
        namespace,
        name,
    };
    let objects = &target.objects;
    let held = is_held(meta);
    let deleting = meta.deletion_timestamp.is_some();
    let used = !held && !deleting && holder.used(K::RULES_KIND, namespace, name);
    let action = match plan(held, deleting, holder.mode_of(meta), used) {
        Step::Keep => Action::await_change(),
        Step::Hold => {
            hold(objects, meta).await?;
            holder.metrics.in_use_finalizer("add");
            tracing::info!(%namespace, kind = K::RULES_KIND.as_str(), object = %name, "held for deferred deletes: a pod uses it");
            Action::await_change()
        }
        Step::Release if !deleting => {
            // Conditional on the version read: a delete in between was deferred on the
            // finalizer's word, and the object must be looked at again.
            if release(objects, meta, true).await? {
                holder.metrics.in_use_finalizer("remove");
                tracing::info!(%namespace, kind = K::RULES_KIND.as_str(), object = %name, "released: no longer opted in to deferred deletes");
            }
            Action::await_change()
        }
        Step::Release => target.release_opted_out(holder).await?,
        Step::ReleaseWhenUnused => target.release_when_unused(holder, meta).await?,
    };
    context.retries.forget(&ObjectRef::from_obj(&*object));
    Ok(action)
}

// === impl Target ===

impl<K: Protected> Target<'_, K> {
    /// An object held and being deleted: released once [`may_release`] proves that no pod
    /// that stays uses it, else looked at again in [`RECHECK`] (or when its users change).
    async fn release_when_unused(&self, holder: &Holder, meta: &ObjectMeta) -> Result<Action> {
        let (objects, namespace, name) = (&self.objects, self.namespace, self.name);
        let delete = ObjectDelete {
            kind: K::RULES_KIND,
            namespace,
            name,
            object: Some(meta),
            exempt: false,
            mode: Mode::Refuse,
        };
        let verdict = may_release(&delete, &holder.reads).await;
        if verdict.reason == super::Reason::LookupFailed {
            return Err(Error::Conflict(verdict.message));
        }
        if !verdict.allowed {
            tracing::debug!(%namespace, kind = K::RULES_KIND.as_str(), object = %name, pods = %verdict.found.pods.join(","), "deferred delete waits for its pods");
            holder.tell_of_pods_created_since(K::RULES_KIND, meta);
            return Ok(Action::requeue(RECHECK));
        }
        if release(objects, meta, false).await? {
            holder.metrics.in_use_finalizer("remove");
            tracing::info!(%namespace, kind = K::RULES_KIND.as_str(), object = %name, reason = verdict.reason.code(), detail = %verdict.message, "deferred delete completes");
        }
        Ok(Action::await_change())
    }

    /// An object being deleted whose watches show it opted out: read again with its
    /// namespace by quorum, and released if they agree; else it waits for its pods.
    async fn release_opted_out(&self, holder: &Holder) -> Result<Action> {
        let (objects, namespace, name) = (&self.objects, self.namespace, self.name);
        let Some(current) = objects.get_metadata_opt(name).await? else {
            return Ok(Action::await_change());
        };
        let current = current.metadata;
        let namespaces: Api<Namespace> = Api::all(holder.client.clone());
        let namespace_labels = namespaces
            .get_metadata_opt(namespace)
            .await?
            .and_then(|found| found.metadata.labels);
        // The watch is behind: its next event brings the object again.
        if !is_held(&current) || current.deletion_timestamp.is_none() {
            return Ok(Action::await_change());
        }
        let mode = opted_in(current.labels.as_ref(), namespace_labels.as_ref(), holder.default_mode);
        if mode.is_some() && !holder.left_out(namespace) {
            return self.release_when_unused(holder, &current).await;
        }
        if release(objects, &current, false).await? {
            holder.metrics.in_use_finalizer("remove");
            tracing::info!(%namespace, kind = K::RULES_KIND.as_str(), object = %name, "deferred delete completes: no longer opted in");
        }
        Ok(Action::await_change())
    }
}

fn error_policy<K: Protected>(object: Arc<PartialObjectMeta<K>>, error: &Error, context: Arc<Context<K>>) -> Action {
    let holder = &context.holder;
    holder.metrics.in_use_finalizer_error();
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let key = ObjectRef::from_obj(&*object);
    // A deleted object is not reconciled again: forget it here.
    if context.objects.get(&key).is_none() {
        context.retries.forget(&key);
        return Action::await_change();
    }
    let delay = context.retries.next(&key, |key| context.objects.get(key).is_some());
    tracing::warn!(%error, %namespace, kind = K::RULES_KIND.as_str(), object = %name, ?delay, "cannot hold or release for deferred deletes, retrying");
    Action::requeue(delay)
}

/// A tokio channel's messages as a stream.
fn tokio_stream_of<T>(mut receiver: tokio::sync::mpsc::UnboundedReceiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |context| receiver.poll_recv(context))
}

#[cfg(test)]
mod tests;
mod writes;

pub use writes::{Released, release_all};
use writes::{hold, release};
