//! Model check of in-use protection through the product's real rules (`in_use::decide`).
//!
//! The world is one namespace: an opted-in ConfigMap, a Deployment whose ReplicaSet keeps
//! one pod that uses it, and a bare pod a user may create and delete. The actors are the
//! ReplicaSet controller, a user who deletes the Deployment once (in the background, the
//! foreground, or orphaning), the garbage collector (orphaning, foreground cascades,
//! dangling dependents, as kube-controller-manager does them), the kubelet removing
//! deleted pods, and a client who deletes the ConfigMap at any moment, through the guard.
//! Every such delete is decided by the real `in_use::decide`, over a lookup that reads the
//! model's store at that moment, as the server's quorum reads do.
//!
//! The guard's pod watch is modelled too: every write takes the next revision, every change
//! to a pod goes to the watch's log, and the watch delivers it at any later step. The
//! product's own index (`in_use::UserIndex`) is fed what was delivered, and answers as in
//! the server: a hint that may deny, and the users once caught up with the revision read
//! after the request, else the LIST.
//!
//! The property: once the garbage collector and the kubelet have nothing left to do, no pod
//! that used the ConfigMap when its delete was allowed still runs. A delete never strands
//! a pod; it may come before the garbage collector has acted (`helm uninstall`), which the
//! model shows reachable. Deliberately broken lookups must fail the property.
//!
//! In `defer`, the guard's finalizer is modelled too: the guard holds the ConfigMap once
//! its index shows a pod that runs using it; a delete of the held ConfigMap is deferred
//! (it becomes terminating, and pods may still be created against it); the guard removes
//! the finalizer when the real `in_use::may_release` allows it, over the same reads. The
//! properties: the finalizer is never removed while a pod that needs the ConfigMap exists,
//! no delete strands a pod, and nothing stays held once no pod is left. The broken
//! variants: removing on the index alone, and a webhook that defers a delete before the
//! finalizer is on.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use async_trait::async_trait;
use cds_secret_guard::{
    cluster::references::Kind,
    rules::in_use::{self, Dependent, InUseLookup, ObjectDelete, UserIndex},
};
use k8s_openapi::{
    api::core::v1::Pod as KubePod,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::runtime::watcher::Event;
use serde_json::json;
use stateright::{Checker, HasDiscoveries, Model, Property};

const DEPLOYMENT: u8 = 1;
const REPLICA_SET: u8 = 2;
const BARE_POD: u8 = 20;
/// Pods the ReplicaSet controller may create in all (uids 10, 11).
const REPLICA_PODS: u8 = 2;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Finalizer {
    Orphan,
    Foreground,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Owner {
    owner: Option<u8>,
    deleting: bool,
    finalizer: Option<Finalizer>,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Pod {
    uid: u8,
    owner: Option<u8>,
    deleting: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    config_map: bool,
    deployment: Option<Owner>,
    replica_set: Option<Owner>,
    pods: Vec<Pod>,
    /// The pods as they were one step before: what a stale LIST shows.
    stale_pods: Vec<Pod>,
    created: u8,
    deployment_deleted: bool,
    bare_created: bool,
    /// The pods that used the ConfigMap when its delete was allowed.
    users_at_delete: Vec<u8>,
    /// The delete was allowed while the Deployment was gone and a pod of its ReplicaSet
    /// was not deleted yet.
    allowed_before_gc: bool,
    /// A delete was denied.
    denied: bool,
    /// The revision of the last write.
    revision: u32,
    /// Every change to a pod, in revision order: what the watch delivers.
    log: Vec<Change>,
    /// How many changes of `log` the watch has delivered.
    delivered: usize,
    /// A delete was decided from the index caught up with the revision, without the LIST.
    from_index: bool,
    /// The ConfigMap carries the guard's finalizer (`defer`).
    held: bool,
    /// The ConfigMap is being deleted, held by the finalizer.
    terminating: bool,
    /// A delete was deferred.
    deferred: bool,
    /// The finalizer was removed, and the ConfigMap deleted.
    released: bool,
    /// The finalizer was removed while a pod that needs the ConfigMap existed.
    released_while_used: bool,
}

/// A pod as a write left it (`removed`: the write deleted it), at a revision.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Change {
    pod: Pod,
    removed: bool,
    revision: u32,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Action {
    Replicate,
    DeleteDeployment(Option<Finalizer>),
    CreateBarePod,
    DeleteBarePod,
    Gc(GcStep),
    KubeletRemoves(u8),
    DeleteConfigMap,
    /// The guard's pod watch delivers the next change.
    WatchDelivers,
    /// `defer`: the guard adds its finalizer, its index showing a pod that runs using it.
    GuardHolds,
    /// `defer`: the guard removes its finalizer from the ConfigMap being deleted, if
    /// `in_use::may_release` allows it.
    GuardReleases,
}

/// The garbage collector's steps.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum GcStep {
    /// An orphaning owner: its dependents lose their reference, then it goes.
    Orphan,
    /// A foreground owner: its dependents are deleted in the foreground, then it goes.
    Foreground,
    /// The ReplicaSet in the foreground: its pods are deleted, then it goes.
    ReplicaSetForeground,
    /// The ReplicaSet names a Deployment that is gone: it is deleted.
    DanglingReplicaSet,
    /// A pod names a ReplicaSet that is gone: it is deleted.
    DanglingPod(u8),
}

/// How the guard's lookup reads the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reads {
    /// As the server does: the store at the moment of the decision.
    Quorum,
    /// Broken: the pods LIST one step behind (a cache).
    StaleList,
    /// Broken: an owner's finalizers are not read, so an orphaning delete looks like a
    /// background one.
    NoFinalizers,
    /// As the server does with its pod index: the index's hint may deny; the users come
    /// from the index once it has caught up with the current revision, else the LIST.
    Index,
    /// Broken: the users come from the index as it is, without the revision.
    IndexAlone,
}

/// How the guard answers a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Webhook {
    /// `refuse`: the rules, and a delete allowed is done at once.
    Refuse,
    /// `defer`, as the server does: a held ConfigMap's delete is deferred, the others are
    /// decided as in `refuse`.
    Defer,
    /// Broken: `defer` taking the ConfigMap as held before the finalizer is on, counting on
    /// the guard to add it after allowing.
    DeferBeforeHeld,
}

struct InUseModel {
    reads: Reads,
    webhook: Webhook,
}

impl Model for InUseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let owned = |owner| Owner {
            owner,
            deleting: false,
            finalizer: None,
        };
        let pod = Pod {
            uid: 10,
            owner: Some(REPLICA_SET),
            deleting: false,
        };
        vec![State {
            config_map: true,
            deployment: Some(owned(None)),
            replica_set: Some(owned(Some(DEPLOYMENT))),
            pods: vec![pod],
            stale_pods: vec![pod],
            created: 1,
            deployment_deleted: false,
            bare_created: false,
            users_at_delete: Vec::new(),
            allowed_before_gc: false,
            denied: false,
            revision: 1,
            log: vec![Change {
                pod,
                removed: false,
                revision: 1,
            }],
            delivered: 0,
            from_index: false,
            held: false,
            terminating: false,
            deferred: false,
            released: false,
            released_while_used: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if let Some(replica_set) = state.replica_set {
            let running = state
                .pods
                .iter()
                .any(|pod| pod.owner == Some(REPLICA_SET) && !pod.deleting);
            if !replica_set.deleting && !running && state.created < REPLICA_PODS {
                actions.push(Action::Replicate);
            }
        }
        if state.deployment.is_some() && !state.deployment_deleted {
            for finalizer in [None, Some(Finalizer::Foreground), Some(Finalizer::Orphan)] {
                actions.push(Action::DeleteDeployment(finalizer));
            }
        }
        if !state.bare_created {
            actions.push(Action::CreateBarePod);
        }
        if state.pods.iter().any(|pod| pod.uid == BARE_POD && !pod.deleting) {
            actions.push(Action::DeleteBarePod);
        }
        actions.extend(gc_steps(state).into_iter().map(Action::Gc));
        for pod in state.pods.iter().filter(|pod| pod.deleting) {
            actions.push(Action::KubeletRemoves(pod.uid));
        }
        if state.config_map && !state.terminating {
            actions.push(Action::DeleteConfigMap);
        }
        if state.delivered < state.log.len() {
            actions.push(Action::WatchDelivers);
        }
        if self.webhook != Webhook::Refuse && state.config_map {
            if !state.held && !state.terminating && Store::new(state, self.reads).runs_a_user() {
                actions.push(Action::GuardHolds);
            }
            if state.held && state.terminating {
                actions.push(Action::GuardReleases);
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        if action == Action::WatchDelivers {
            let mut state = last.clone();
            state.delivered += 1;
            return Some(state);
        }
        let mut state = self.write(last, action)?;
        let unchanged = State {
            stale_pods: last.stale_pods.clone(),
            ..state.clone()
        };
        if unchanged == *last {
            // No write: no revision (the garbage collector waiting on a dependent).
            return Some(state);
        }
        // Every write takes the next revision; the pods it changed go to the watch's log.
        state.revision = last.revision + 1;
        for pod in &state.pods {
            if !last.pods.contains(pod) {
                state.log.push(Change {
                    pod: *pod,
                    removed: false,
                    revision: state.revision,
                });
            }
        }
        for pod in &last.pods {
            if !state.pods.iter().any(|now| now.uid == pod.uid) {
                state.log.push(Change {
                    pod: *pod,
                    removed: true,
                    revision: state.revision,
                });
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(NO_STRANDED_POD, |_, state: &State| {
                !settled(state) || !state.pods.iter().any(|pod| state.users_at_delete.contains(&pod.uid))
            }),
            Property::sometimes(DENIED, |_, state: &State| state.denied),
        ];
        if self.webhook == Webhook::Refuse {
            properties.push(Property::sometimes(ALLOWED_BEFORE_GC, |_, state: &State| {
                state.allowed_before_gc
            }));
        } else {
            properties.extend([
                Property::always(NOT_RELEASED_WHILE_USED, |_, state: &State| !state.released_while_used),
                Property::always(NOTHING_HELD_FOR_NOTHING, |model: &InUseModel, state: &State| {
                    // Its watch delivered (the index then tells the guard to look again).
                    let quiet = settled(state) && state.delivered == state.log.len();
                    !(quiet && state.terminating && state.pods.is_empty()) || model.release(state).is_some()
                }),
                Property::sometimes(DEFERRED, |_, state: &State| state.deferred),
                Property::sometimes(RELEASED, |_, state: &State| state.released),
            ]);
        }
        if self.reads == Reads::Index {
            properties.push(Property::sometimes(FROM_INDEX, |_, state: &State| state.from_index));
        }
        properties
    }
}

impl InUseModel {
    /// Whether the guard removes its finalizer now, by the real `in_use::may_release`
    /// over the reads at this moment: `Some(answered from the index)`, `None` if it waits.
    fn release(&self, state: &State) -> Option<bool> {
        let store = Store::new(state, self.reads);
        let meta = ObjectMeta {
            finalizers: Some(vec![in_use::FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        };
        let object = ObjectDelete {
            kind: Kind::ConfigMap,
            namespace: "app",
            name: "settings",
            object: Some(&meta),
            exempt: false,
            mode: in_use::Mode::Defer,
        };
        let verdict = futures::executor::block_on(in_use::may_release(&object, &store));
        verdict.allowed.then(|| store.from_index.load(Ordering::Relaxed))
    }

    /// The state after one write, `None` when it changes nothing worth exploring.
    fn write(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        state.stale_pods = last.pods.clone();
        match action {
            Action::Replicate => {
                state.pods.push(Pod {
                    uid: 10 + state.created,
                    owner: Some(REPLICA_SET),
                    deleting: false,
                });
                state.created += 1;
            }
            Action::DeleteDeployment(finalizer) => {
                state.deployment_deleted = true;
                state.deployment = finalizer.map(|finalizer| Owner {
                    owner: None,
                    deleting: true,
                    finalizer: Some(finalizer),
                });
            }
            Action::CreateBarePod => {
                state.bare_created = true;
                state.pods.push(Pod {
                    uid: BARE_POD,
                    owner: None,
                    deleting: false,
                });
            }
            Action::DeleteBarePod => delete_pod(&mut state, BARE_POD),
            Action::Gc(step) => gc(&mut state, step),
            Action::KubeletRemoves(uid) => state.pods.retain(|pod| pod.uid != uid),
            Action::WatchDelivers => unreachable!("not a write"),
            Action::GuardHolds => state.held = true,
            Action::GuardReleases => {
                let released = self.release(last)?;
                state.from_index |= released;
                state.config_map = false;
                state.held = false;
                state.terminating = false;
                state.released = true;
                state.released_while_used = !last.pods.is_empty();
                state.users_at_delete = last
                    .pods
                    .iter()
                    .filter(|pod| !pod.deleting)
                    .map(|pod| pod.uid)
                    .collect();
            }
            Action::DeleteConfigMap => {
                let store = Store::new(last, self.reads);
                // The ConfigMap as the webhook receives it: with the finalizer once held.
                let held = match self.webhook {
                    Webhook::Refuse | Webhook::Defer => last.held,
                    Webhook::DeferBeforeHeld => true,
                };
                let meta = ObjectMeta {
                    finalizers: held.then(|| vec![in_use::FINALIZER.to_owned()]),
                    ..ObjectMeta::default()
                };
                let mode = match self.webhook {
                    Webhook::Refuse => in_use::Mode::Refuse,
                    Webhook::Defer | Webhook::DeferBeforeHeld => in_use::Mode::Defer,
                };
                let request = ObjectDelete {
                    kind: Kind::ConfigMap,
                    namespace: "app",
                    name: "settings",
                    object: Some(&meta),
                    exempt: false,
                    mode,
                };
                let verdict = futures::executor::block_on(in_use::decide(&request, &store));
                state.from_index |= store.from_index.load(Ordering::Relaxed);
                if !verdict.allowed {
                    // Once is enough to show it: a retry changes nothing.
                    state.denied = true;
                    return (!last.denied).then_some(state);
                }
                if last.held {
                    // The apiserver marks it; the finalizer keeps it.
                    state.terminating = true;
                    state.deferred |= verdict.reason == in_use::Reason::Deferred;
                    return Some(state);
                }
                state.config_map = false;
                state.users_at_delete = last
                    .pods
                    .iter()
                    .filter(|pod| !pod.deleting)
                    .map(|pod| pod.uid)
                    .collect();
                state.allowed_before_gc = last.deployment.is_none()
                    && last.replica_set.is_some()
                    && last
                        .pods
                        .iter()
                        .any(|pod| pod.owner == Some(REPLICA_SET) && !pod.deleting);
            }
        }
        Some(state)
    }
}

const NO_STRANDED_POD: &str = "no pod that used the ConfigMap runs on once it is deleted";
const NOT_RELEASED_WHILE_USED: &str = "the finalizer is never removed while a pod needs the ConfigMap";
const NOTHING_HELD_FOR_NOTHING: &str =
    "once no pod is left and the watch has said so, a held ConfigMap being deleted is released";
const DEFERRED: &str = "a delete is deferred";
const RELEASED: &str = "a deferred delete completes";
const ALLOWED_BEFORE_GC: &str = "the delete goes through before the garbage collector acts";
const DENIED: &str = "a delete is denied";
const FROM_INDEX: &str = "the index, caught up, answers in place of the LIST";

fn delete_pod(state: &mut State, uid: u8) {
    for pod in state.pods.iter_mut().filter(|pod| pod.uid == uid) {
        pod.deleting = true;
    }
}

/// The garbage collector and the kubelet have nothing left to do.
fn settled(state: &State) -> bool {
    gc_steps(state).is_empty() && state.pods.iter().all(|pod| !pod.deleting)
}

fn gc_steps(state: &State) -> Vec<GcStep> {
    let mut steps = Vec::new();
    match state.deployment.and_then(|deployment| deployment.finalizer) {
        Some(Finalizer::Orphan) => steps.push(GcStep::Orphan),
        Some(Finalizer::Foreground) => steps.push(GcStep::Foreground),
        None => {}
    }
    if let Some(replica_set) = state.replica_set {
        if replica_set.finalizer == Some(Finalizer::Foreground) {
            steps.push(GcStep::ReplicaSetForeground);
        }
        if replica_set.owner == Some(DEPLOYMENT) && state.deployment.is_none() && !replica_set.deleting {
            steps.push(GcStep::DanglingReplicaSet);
        }
    }
    for pod in &state.pods {
        if pod.owner == Some(REPLICA_SET) && state.replica_set.is_none() && !pod.deleting {
            steps.push(GcStep::DanglingPod(pod.uid));
        }
    }
    steps
}

fn gc(state: &mut State, step: GcStep) {
    match step {
        GcStep::Orphan => match &mut state.replica_set {
            Some(replica_set) if replica_set.owner == Some(DEPLOYMENT) => replica_set.owner = None,
            _ => state.deployment = None,
        },
        GcStep::Foreground => match &mut state.replica_set {
            Some(replica_set) if replica_set.owner == Some(DEPLOYMENT) && !replica_set.deleting => {
                replica_set.deleting = true;
                replica_set.finalizer = Some(Finalizer::Foreground);
            }
            Some(replica_set) if replica_set.owner == Some(DEPLOYMENT) => {}
            _ => state.deployment = None,
        },
        GcStep::ReplicaSetForeground => {
            let owned: Vec<u8> = state
                .pods
                .iter()
                .filter(|pod| pod.owner == Some(REPLICA_SET))
                .map(|pod| pod.uid)
                .collect();
            if owned.is_empty() {
                state.replica_set = None;
            } else {
                owned.into_iter().for_each(|uid| delete_pod(state, uid));
            }
        }
        GcStep::DanglingReplicaSet => state.replica_set = None,
        GcStep::DanglingPod(uid) => delete_pod(state, uid),
    }
}

/// The model's store as the guard's reads see it.
struct Store<'a> {
    state: &'a State,
    reads: Reads,
    /// The product's index, fed the changes the watch has delivered.
    index: UserIndex,
    /// The index answered for the LIST.
    from_index: AtomicBool,
}

fn reference(kind: &str, name: &str, uid: u8) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.to_string(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}

impl<'a> Store<'a> {
    fn new(state: &'a State, reads: Reads) -> Self {
        let index = UserIndex::new(None);
        for change in &state.log[..state.delivered] {
            let pod = Store::kube_pod(&change.pod, change.revision);
            index.observe(&if change.removed {
                Event::Delete(pod)
            } else {
                Event::Apply(pod)
            });
        }
        Self {
            state,
            reads,
            index,
            from_index: AtomicBool::new(false),
        }
    }

    /// Whether the index shows a pod that runs using the ConfigMap: what makes the guard
    /// hold it.
    fn runs_a_user(&self) -> bool {
        self.index
            .users("app", Kind::ConfigMap, "settings")
            .iter()
            .any(|pod| !pod.terminal && !pod.deleting)
    }

    /// The pod as the apiserver serves it: a volume of the ConfigMap, its owner, whether
    /// it is being deleted, the revision of its last write.
    fn kube_pod(pod: &Pod, revision: u32) -> KubePod {
        let owners: Vec<OwnerReference> = pod
            .owner
            .map(|_| reference("ReplicaSet", "web-rs", REPLICA_SET))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("pod-{}", pod.uid),
                "namespace": "app",
                "uid": pod.uid.to_string(),
                "resourceVersion": revision.to_string(),
                "ownerReferences": owners,
                "deletionTimestamp": pod.deleting.then_some("2026-01-01T00:00:00Z"),
            },
            "spec": {
                "containers": [{"name": "app", "image": "app"}],
                "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
            },
        }))
        .unwrap()
    }

    fn pod(pod: &Pod) -> Dependent {
        Dependent {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: format!("pod-{}", pod.uid),
            uid: pod.uid.to_string(),
            deleting: pod.deleting,
            owners: pod
                .owner
                .map(|_| reference("ReplicaSet", "web-rs", REPLICA_SET))
                .into_iter()
                .collect(),
            ..Dependent::default()
        }
    }

    fn owner(&self, kind: &str, name: &str, uid: u8, owner: &Owner) -> Dependent {
        let finalizers = match (owner.finalizer, self.reads) {
            (_, Reads::NoFinalizers) | (None, _) => Vec::new(),
            (Some(Finalizer::Orphan), _) => vec!["orphan".to_owned()],
            (Some(Finalizer::Foreground), _) => vec!["foregroundDeletion".to_owned()],
        };
        Dependent {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.to_string(),
            deleting: owner.deleting,
            finalizers,
            owners: owner
                .owner
                .map(|_| reference("Deployment", "web", DEPLOYMENT))
                .into_iter()
                .collect(),
            ..Dependent::default()
        }
    }
}

#[async_trait]
impl InUseLookup for Store<'_> {
    async fn users(&self, namespace: &str, kind: Kind, name: &str) -> cds_secret_guard::Result<Vec<Dependent>> {
        let pods = match self.reads {
            Reads::StaleList => &self.state.stale_pods,
            Reads::Index => {
                // The revision read after the request: the last write's.
                let revision = u64::from(self.state.revision);
                let indexed = self
                    .index
                    .users_at(revision, namespace, kind, name, Duration::ZERO)
                    .await;
                if let Some(users) = indexed {
                    self.from_index.store(true, Ordering::Relaxed);
                    return Ok(users);
                }
                &self.state.pods
            }
            Reads::IndexAlone => return Ok(self.index.users(namespace, kind, name)),
            Reads::Quorum | Reads::NoFinalizers => &self.state.pods,
        };
        Ok(pods.iter().map(Store::pod).collect())
    }

    fn cached_users(&self, namespace: &str, kind: Kind, name: &str) -> Vec<Dependent> {
        match self.reads {
            Reads::Index | Reads::IndexAlone => self.index.users(namespace, kind, name),
            Reads::Quorum | Reads::StaleList | Reads::NoFinalizers => Vec::new(),
        }
    }

    async fn object(&self, _: &str, _: &str, kind: &str, name: &str) -> cds_secret_guard::Result<Option<Dependent>> {
        Ok(match (kind, name) {
            ("Deployment", "web") => self
                .state
                .deployment
                .map(|owner| self.owner(kind, name, DEPLOYMENT, &owner)),
            ("ReplicaSet", "web-rs") => self
                .state
                .replica_set
                .map(|owner| self.owner(kind, name, REPLICA_SET, &owner)),
            ("Pod", name) => self
                .state
                .pods
                .iter()
                .find(|pod| format!("pod-{}", pod.uid) == name)
                .map(Store::pod),
            _ => None,
        })
    }

    async fn namespace_terminating(&self, _: &str) -> cds_secret_guard::Result<bool> {
        Ok(false)
    }
}

fn check(reads: Reads) -> impl Checker<InUseModel> {
    check_with(reads, Webhook::Refuse)
}

fn check_with(reads: Reads, webhook: Webhook) -> impl Checker<InUseModel> {
    InUseModel { reads, webhook }.checker().spawn_bfs().join()
}

/// The actions by which the broken `reads` or `webhook` break `property`, the search
/// stopped at the first; fails if the model finds none.
fn counterexample(reads: Reads, webhook: Webhook, property: &'static str) -> Vec<Action> {
    let checker = InUseModel { reads, webhook }
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("the model catches {reads:?} with {webhook:?}"));
    path.into_actions()
}

#[test]
fn no_delete_strands_a_pod_and_helm_uninstall_goes_through() {
    let checker = check(Reads::Quorum);
    println!(
        "in-use model: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

#[test]
fn the_pod_index_caught_up_with_the_revision_strands_no_pod() {
    let checker = check(Reads::Index);
    println!(
        "in-use model, pod index: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

/// The actions by which the broken `reads` strand a pod; fails if the model finds none.
fn stranding(reads: Reads) -> Vec<Action> {
    counterexample(reads, Webhook::Refuse, NO_STRANDED_POD)
}

#[test]
fn in_defer_the_finalizer_is_removed_only_once_no_pod_needs_it_and_always_then() {
    // The server's reads: the index caught up with the revision, else the LIST.
    let checker = check_with(Reads::Index, Webhook::Defer);
    println!(
        "in-use model, defer: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

#[test]
fn in_defer_removing_the_finalizer_on_the_index_alone_releases_it_while_a_pod_needs_it() {
    let path = counterexample(Reads::IndexAlone, Webhook::Defer, NOT_RELEASED_WHILE_USED);
    println!("defer, index alone: {path:?}");
}

#[test]
fn in_defer_a_delete_deferred_before_the_finalizer_is_on_strands_a_pod() {
    let path = counterexample(Reads::Index, Webhook::DeferBeforeHeld, NO_STRANDED_POD);
    println!("defer before held: {path:?}");
}

#[test]
fn allowing_from_the_pod_index_alone_strands_a_pod() {
    println!("index alone: {:?}", stranding(Reads::IndexAlone));
}

#[test]
fn a_stale_pod_list_strands_a_pod() {
    println!("stale LIST: {:?}", stranding(Reads::StaleList));
}

#[test]
fn an_orphaning_delete_read_without_its_finalizer_strands_a_pod() {
    // An orphaning delete taken for a cascade.
    println!("no finalizers: {:?}", stranding(Reads::NoFinalizers));
}
