//! The product in the model: the guard's validating decision is the real
//! `worker::decide`, adoption is the real `owners::may_adopt`, and pods are created
//! through the real `mutation::mutate`. Each call converts the compact state into the
//! k8s-openapi values the function takes.
//!
//! `decide` is async and reads only through `ClusterLookup`. The lookup here answers the
//! way the server's `KubeLookup` does: the pod watch's store as the deny hint
//! (`cached_pod`), the namespace cache, the label index when the revision gate lets it
//! answer (`watch`), and every other read by quorum, at the store's latest revision. Its
//! futures are immediately ready, so `futures::executor::block_on` drives it: no runtime
//! is involved.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use async_trait::async_trait;
use cds_secret_guard::{
    rules,
    rules::Unavailable,
    rules::worker::mutation,
    rules::worker::owners::may_adopt,
    rules::worker::pod::PodState,
    rules::worker::reads::ClusterLookup,
    rules::worker::{self, SecretDelete, Verdict},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::world::{
    Clock, NAMESPACE, Pod, PodName, PodShape, Secret, SecretId, Slot, Snapshot, WORKER_LABEL, kube_pod,
    kube_pod_request, pod_state, secret_meta, shape_of,
};

/// Who sends a secret DELETE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Requester {
    /// A hatchery's service account (its cleanup and its kill path).
    Hatchery,
    /// The garbage collector.
    GarbageCollector,
}

impl Requester {
    pub fn username(self) -> &'static str {
        match self {
            Requester::Hatchery => "system:serviceaccount:cds:cds-hatchery",
            Requester::GarbageCollector => "system:serviceaccount:kube-system:generic-garbage-collector",
        }
    }
}

/// What the guard's caches show a decision: the pod watch's store, and its label index
/// when the revision gate lets it answer (see `watch`). The namespace cache is not kept:
/// the model's one namespace is never deleted and the guard's namespace watch has listed
/// it, so the cache always shows it alive.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caches {
    /// The pods the watch's store holds: the deny hint.
    pub hint: [Option<Pod>; 3],
    /// The label index, when the gate lets it stand in for the label LIST.
    pub index: Option<[Option<Pod>; 3]>,
}

/// [`ClusterLookup`] as `KubeLookup` answers it, over the model's store (quorum reads see
/// the latest revision) and the guard's caches.
pub struct StoreLookup<'a> {
    pub snapshot: &'a Snapshot,
    pub ages: &'a [u8; 3],
    pub clock: &'a Clock,
    pub caches: &'a Caches,
    /// The label read was answered from the watch's index.
    pub from_index: AtomicBool,
}

#[async_trait]
impl ClusterLookup for StoreLookup<'_> {
    async fn pod(&self, namespace: &str, name: &str) -> cds_secret_guard::Result<Option<PodState>> {
        Ok(self
            .snapshot
            .pods()
            .find(|(n, _)| namespace == NAMESPACE && n.name() == name)
            .map(|(n, p)| pod_state(n, p)))
    }

    async fn pods_labelled(
        &self,
        namespace: &str,
        label: &str,
        value: &str,
    ) -> cds_secret_guard::Result<Vec<PodState>> {
        if namespace != NAMESPACE {
            return Ok(Vec::new());
        }
        // `KubeLookup::pods_labelled` and `namesake_and_labelled` (whose namesake comes
        // from the same quorum read as the revision, as `pod` reads it here): the watch of
        // this namespace selects on this label, and it has caught up with the revision a
        // quorum read returns now; otherwise (or when it is not busy, which gives the same
        // answer then) the LIST below.
        let pods = match self.caches.index.as_ref().filter(|_| label == WORKER_LABEL) {
            Some(index) => {
                self.from_index.store(true, Ordering::Relaxed);
                labelled(index.iter(), label, value)
            }
            None => labelled(self.snapshot.pods.iter(), label, value),
        };
        Ok(pods)
    }

    async fn secret_metadata(&self, namespace: &str, name: &str) -> cds_secret_guard::Result<Option<ObjectMeta>> {
        let Some(id) = SecretId::from_name(name).filter(|_| namespace == NAMESPACE) else {
            return Ok(None);
        };
        Ok(self
            .snapshot
            .secret(id)
            .map(|s| secret_meta(id, s, self.ages[id.index()], self.clock)))
    }

    async fn namespace_terminating(&self, _namespace: &str) -> cds_secret_guard::Result<bool> {
        // The namespace cache shows it alive: `KubeLookup` answers without a read.
        Ok(false)
    }

    fn cached_pod(&self, namespace: &str, name: &str) -> Option<PodState> {
        let name = PodName::ALL
            .into_iter()
            .find(|n| namespace == NAMESPACE && n.name() == name)?;
        self.caches.hint[name.index()].as_ref().map(|p| pod_state(name, p))
    }
}

/// The pods of `pods` (by slot) carrying `label=value`.
fn labelled<'p>(pods: impl Iterator<Item = &'p Option<Pod>>, label: &str, value: &str) -> Vec<PodState> {
    PodName::ALL
        .into_iter()
        .zip(pods)
        .filter_map(|(n, p)| p.as_ref().map(|p| pod_state(n, p)))
        .filter(|pod| pod.labels.get(label).map(String::as_str) == Some(value))
        .collect()
}

/// What a decision sees: the guard's configuration, the clock, the store's latest
/// revision (its quorum reads) and its caches.
pub struct View<'a> {
    pub policy: &'a worker::Settings,
    pub shared: &'a rules::Settings,
    pub clock: &'a Clock,
    pub snapshot: &'a Snapshot,
    pub ages: &'a [u8; 3],
    pub caches: Caches,
}

/// A decision, and whether its label read was answered from the watch's index.
#[derive(Clone, Debug)]
pub struct Decision {
    pub verdict: Verdict,
    pub from_index: bool,
}

impl View<'_> {
    /// The secret's metadata as the apiserver sends it.
    pub fn meta(&self, id: SecretId, secret: &Secret) -> ObjectMeta {
        secret_meta(id, secret, self.ages[id.index()], self.clock)
    }
}

/// Answers of the product's functions, by their inputs in compact form. The functions are
/// deterministic (the rules read nothing but their arguments and the lookup), so each
/// distinct input is computed once by the real function and then reused: the model
/// checker asks the same question in many states.
#[derive(Default)]
pub struct Memo {
    decisions: Mutex<HashMap<DecisionKey, Decision>>,
    adoptions: Mutex<HashMap<(PodName, Pod, SecretId, Secret), bool>>,
}

/// Everything a decision reads: the secret (with its age), the pods, the caches, the
/// requester.
#[derive(Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    id: SecretId,
    secret: Secret,
    age: u8,
    pods: [Option<Pod>; 3],
    caches: Caches,
    requester: Requester,
}

impl Memo {
    /// [`decide`], once per distinct input.
    pub fn decide(&self, view: &View<'_>, id: SecretId, secret: &Secret, requester: Requester) -> Decision {
        let key = DecisionKey {
            id,
            secret: secret.clone(),
            age: view.ages[id.index()],
            pods: view.snapshot.pods.clone(),
            caches: view.caches.clone(),
            requester,
        };
        if let Some(decision) = lock(&self.decisions).get(&key) {
            return decision.clone();
        }
        let decision = decide(view, id, secret, requester);
        lock(&self.decisions).insert(key, decision.clone());
        decision
    }

    /// The distinct decisions whose label read the watch's index answered: how many allowed
    /// and how many denied.
    pub fn index_answers(&self) -> (usize, usize) {
        let decisions = lock(&self.decisions);
        let from_index = decisions.values().filter(|d| d.from_index);
        from_index.fold((0, 0), |(allowed, denied), d| {
            if d.verdict.allowed {
                (allowed + 1, denied)
            } else {
                (allowed, denied + 1)
            }
        })
    }

    /// [`adoptable`], once per distinct input (the age of the secret plays no part).
    pub fn adoptable(&self, view: &View<'_>, name: PodName, pod: &Pod, id: SecretId, secret: &Secret) -> bool {
        let key = (name, pod.clone(), id, secret.clone());
        if let Some(&answer) = lock(&self.adoptions).get(&key) {
            return answer;
        }
        let answer = adoptable(view, name, pod, id, secret);
        lock(&self.adoptions).insert(key, answer);
        answer
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The real validating decision on a DELETE of `id` by `requester`, with the secret as it
/// is now (`oldObject`), the guard's caches and quorum reads of the current snapshot.
pub fn decide(view: &View<'_>, id: SecretId, secret: &Secret, requester: Requester) -> Decision {
    let lookup = StoreLookup {
        snapshot: view.snapshot,
        ages: view.ages,
        clock: view.clock,
        caches: &view.caches,
        from_index: AtomicBool::new(false),
    };
    let verdict = decide_with(view, id, secret, requester, &lookup);
    Decision {
        verdict,
        from_index: lookup.from_index.load(Ordering::Relaxed),
    }
}

/// The real validating decision when every read fails (the apiserver unreachable).
pub fn decide_unreachable(view: &View<'_>, id: SecretId, secret: &Secret, requester: Requester) -> Verdict {
    let lookup = Unavailable("the model's apiserver is unreachable".to_owned());
    decide_with(view, id, secret, requester, &lookup)
}

fn decide_with(
    view: &View<'_>,
    id: SecretId,
    secret: &Secret,
    requester: Requester,
    lookup: &dyn ClusterLookup,
) -> Verdict {
    let meta = view.meta(id, secret);
    let request = SecretDelete {
        namespace: NAMESPACE,
        name: id.name(),
        secret: Some(&meta),
        username: Some(requester.username()),
        groups: &[],
    };
    futures::executor::block_on(worker::decide(
        view.shared,
        view.policy,
        &request,
        lookup,
        view.clock.now,
    ))
}

/// The real adoption predicate: may the pod named `name`, as a quorum read returned it,
/// own secret `id` as the reconciler read it?
pub fn adoptable(view: &View<'_>, name: PodName, pod: &Pod, id: SecretId, secret: &Secret) -> bool {
    may_adopt(view.policy, &view.meta(id, secret), &kube_pod(name, pod, view.clock))
}

/// The secrets a pod's spec references, by the real `SecretReferences::names`.
pub fn referenced(name: PodName, pod: &Pod, clock: &Clock) -> crate::world::Set<SecretId> {
    let kube = kube_pod(name, pod, clock);
    let spec = kube.spec.as_ref().expect("a model pod always has a spec");
    spec.names().iter().filter_map(|n| SecretId::from_name(n)).collect()
}

/// Whether a secret the reconciler's label-selected cache does not hold is still one it
/// reads for this pod: named after the pod's worker (the real reconcile's filter).
pub fn named_for(policy: &worker::Settings, id: SecretId, pod: PodName) -> bool {
    policy.worker_of_secret_name(id.name()).as_deref() == Some(pod.name())
}

/// The pod as it is stored after the real mutating webhook patched the request.
pub fn admit_pod(policy: &worker::Settings, shape: &PodShape) -> PodShape {
    let request = kube_pod_request(shape);
    let planned = mutation::mutate(policy, &request, None);
    let mut doc = serde_json::to_value(&request).expect("a pod serialises");
    json_patch::patch(&mut doc, &planned.patch).expect("the mutation's patch applies to the pod it was planned for");
    let created = serde_json::from_value(doc).expect("a patched pod is still a pod");
    shape_of(&created, shape.name)
}

/// The worker label the guard's configuration uses must be the one the model writes.
pub fn check_policy(policy: &worker::Settings) {
    assert_eq!(
        policy.worker_label, WORKER_LABEL,
        "the model labels pods with the default worker label"
    );
}

/// The conversions are right: the real functions, fed from model states, answer as the
/// rules say. Without this the model could check a guard that never sees a pod.
#[cfg(test)]
mod checks {
    use cds_secret_guard::rules::worker::Reason;

    use super::*;
    use crate::{
        model::{default_policy, default_shared},
        world::{Lag, Owner, Phase, Set, Store, Uid, Worker},
    };

    fn clock() -> Clock {
        Clock {
            now: "2026-01-01T00:00:00Z".parse().unwrap(),
            tick: std::time::Duration::from_secs(600),
        }
    }

    fn hatchery_pod() -> Pod {
        Pod {
            uid: Uid::Hatchery(Worker::W1),
            worker_label: Some(Worker::W1),
            hatchery_label: Some(Worker::W1),
            annotation: Set::empty(),
            refs: Set::of(Worker::W1.secret()),
            phase: Phase::Running,
            terminating: false,
        }
    }

    fn store(secret: Secret, pods: &[(PodName, Pod)]) -> Store {
        let mut store = Store::new();
        store.write(
            Lag {
                list: 0,
                cache: 0,
                watch: None,
            },
            |snap| {
                snap.secrets[Worker::W1.secret().index()] = Some(secret);
                for (name, pod) in pods {
                    snap.pods[name.index()] = Some(pod.clone());
                }
            },
        );
        store
    }

    fn verdict(store: &Store, age: u8) -> Verdict {
        let (policy, shared, clock) = (default_policy(), default_shared(), clock());
        let ages = [age, 0, u8::MAX];
        let view = View {
            policy: &policy,
            shared: &shared,
            clock: &clock,
            snapshot: &store.now,
            ages: &ages,
            caches: Caches::default(),
        };
        let id = Worker::W1.secret();
        let secret = store.now.secret(id).unwrap();
        decide(&view, id, secret, Requester::Hatchery).verdict
    }

    #[test]
    fn the_guard_reads_the_model_store() {
        let old = 1;
        let live = store(Secret::default(), &[(Worker::W1.pod(), hatchery_pod())]);
        assert_eq!(verdict(&live, old).reason, Reason::PodLive);
        assert!(!verdict(&live, old).allowed);

        let finished = Pod {
            phase: Phase::Succeeded,
            ..hatchery_pod()
        };
        let done = store(Secret::default(), &[(Worker::W1.pod(), finished)]);
        assert_eq!(verdict(&done, old).reason, Reason::Orphan);

        let empty = store(Secret::default(), &[]);
        assert_eq!(verdict(&empty, 0).reason, Reason::TooYoung);
        assert!(verdict(&empty, old).allowed);

        let owned = Secret {
            version: 2,
            owners: vec![Owner {
                name: Worker::W1.pod(),
                uid: Uid::Hatchery(Worker::W1),
            }],
        };
        let gone = store(owned.clone(), &[]);
        assert_eq!(
            verdict(&gone, 0).reason,
            Reason::OwnerGone,
            "rule 3 waives the grace period"
        );
        let labelled = Pod {
            uid: Uid::Adversary(0),
            ..hatchery_pod()
        };
        let relabelled = store(owned, &[(PodName::Other, labelled)]);
        assert_eq!(verdict(&relabelled, 0).reason, Reason::PodLive, "rule 5 still runs");
    }

    #[test]
    fn only_the_worker_pod_using_the_secret_may_adopt_it() {
        let (policy, shared, clock) = (default_policy(), default_shared(), clock());
        let empty = Store::new();
        let ages = [0, 0, u8::MAX];
        let view = View {
            policy: &policy,
            shared: &shared,
            clock: &clock,
            snapshot: &empty.now,
            ages: &ages,
            caches: Caches::default(),
        };
        let (s1, db) = (Worker::W1.secret(), SecretId::DbPassword);
        let secret = Secret::default();
        assert!(adoptable(&view, Worker::W1.pod(), &hatchery_pod(), s1, &secret));
        assert!(
            !adoptable(&view, PodName::Other, &hatchery_pod(), s1, &secret),
            "another name"
        );
        let finished = Pod {
            phase: Phase::Succeeded,
            ..hatchery_pod()
        };
        assert!(!adoptable(&view, Worker::W1.pod(), &finished, s1, &secret), "not live");
        let using_db = Pod {
            refs: Set::of(db),
            annotation: Set::of(db),
            ..hatchery_pod()
        };
        assert!(
            !adoptable(&view, Worker::W1.pod(), &using_db, db, &secret),
            "not protected"
        );
        assert!(
            !adoptable(&view, Worker::W1.pod(), &using_db, s1, &secret),
            "not referenced"
        );
    }

    #[test]
    fn the_webhook_labels_a_pod_using_one_workers_secrets() {
        let policy = default_policy();
        let request = PodShape {
            name: PodName::Other,
            worker_label: None,
            hatchery_label: None,
            annotation: Set::of(SecretId::DbPassword),
            refs: Set::of(Worker::W1.secret()),
        };
        let stored = admit_pod(&policy, &request);
        assert_eq!(stored.worker_label, Some(Worker::W1));
        assert_eq!(
            stored.annotation,
            Set::of(Worker::W1.secret()),
            "the annotation is rewritten"
        );
        let both = PodShape {
            refs: Worker::ALL.into_iter().map(Worker::secret).collect(),
            ..request
        };
        assert_eq!(admit_pod(&policy, &both).worker_label, None, "two workers: no label");
    }
}
