//! The world: an etcd-like store of pods and secrets in a compact hashable form, the
//! short history of past answers that stale reads are served from, and the conversions to
//! the k8s-openapi values the product's functions take.
//!
//! Objects live in fixed slots: a namespace holds at most one pod per name, so pods are
//! indexed by name (`w1`, `w2`, `x`); secrets by name (`cds-worker-config-w1`,
//! `cds-worker-config-w2`, `db-password`). Revisions are implicit: every write makes a new
//! one, and what a stale read may still see is kept per stale reader ([`Lagging`]).
//! Absolute revision numbers are not kept: they would make two states that differ only in
//! how many writes led to them look different, and nothing reads them (a secret's
//! resourceVersion is its own write count, enough for conditional writes because no
//! secret is ever recreated under its name).

use std::{collections::BTreeMap, fmt, marker::PhantomData, time::Duration};

use cds_secret_guard::{
    rules::worker::mutation::PROTECTED_SECRETS_ANNOTATION,
    rules::worker::owners::pod_reference,
    rules::worker::pod::{ContainerReferences, EnvFromReference, PhasePart, PodState, SecretReferences, WorkerPod},
};
use k8s_openapi::{
    api::core::v1::SecretEnvSource,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};

/// The namespace everything lives in.
pub const NAMESPACE: &str = "cds";
/// The label naming a worker, as CDS and the guard use it.
pub const WORKER_LABEL: &str = "CDS_WORKER_NAME";
/// The label naming a hatchery.
pub const HATCHERY_LABEL: &str = "CDS_HATCHERY_NAME";

// === Names ===

/// A value with a fixed place among a handful: what a [`Set`] can hold.
pub trait Slot: Copy + 'static {
    /// Every value, in index order.
    const ALL: &'static [Self];
    /// Its place.
    fn index(self) -> usize;
}

/// A CDS worker. `w1` is spawned by hatchery `h1` (the one whose cleanup runs), `w2` by
/// `h2`, another hatchery in the same namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Worker {
    W1,
    W2,
}

/// A pod name: a worker's (CDS names the pod after the worker) or another one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PodName {
    Worker(Worker),
    /// `x`: a name no worker has.
    Other,
}

/// A secret: a worker's config secret (protected by its prefix and its label) or
/// `db-password`, which no worker owns and the guard does not protect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretId {
    Config(Worker),
    DbPassword,
}

/// A pod UID. The hatchery creates one pod per worker; the adversary numbers its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Uid {
    Hatchery(Worker),
    Adversary(u8),
}

/// A pod's `status.phase` (Failed behaves as Succeeded for everything here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
}

impl Worker {
    pub const ALL: [Worker; 2] = [Worker::W1, Worker::W2];

    pub fn name(self) -> &'static str {
        match self {
            Worker::W1 => "w1",
            Worker::W2 => "w2",
        }
    }

    pub fn hatchery(self) -> &'static str {
        match self {
            Worker::W1 => "h1",
            Worker::W2 => "h2",
        }
    }

    pub fn secret(self) -> SecretId {
        SecretId::Config(self)
    }

    pub fn pod(self) -> PodName {
        PodName::Worker(self)
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.name() == name)
    }
}

impl Slot for Worker {
    const ALL: &'static [Self] = &[Worker::W1, Worker::W2];
    fn index(self) -> usize {
        self as usize
    }
}

impl PodName {
    pub const ALL: [PodName; 3] = [PodName::Worker(Worker::W1), PodName::Worker(Worker::W2), PodName::Other];

    pub fn name(self) -> &'static str {
        match self {
            PodName::Worker(w) => w.name(),
            PodName::Other => "x",
        }
    }

    pub fn worker(self) -> Option<Worker> {
        match self {
            PodName::Worker(w) => Some(w),
            PodName::Other => None,
        }
    }
}

impl Slot for PodName {
    const ALL: &'static [Self] = &PodName::ALL;
    fn index(self) -> usize {
        match self {
            PodName::Worker(w) => w as usize,
            PodName::Other => 2,
        }
    }
}

impl SecretId {
    pub const ALL: [SecretId; 3] = [
        SecretId::Config(Worker::W1),
        SecretId::Config(Worker::W2),
        SecretId::DbPassword,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SecretId::Config(Worker::W1) => "cds-worker-config-w1",
            SecretId::Config(Worker::W2) => "cds-worker-config-w2",
            SecretId::DbPassword => "db-password",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The worker the secret belongs to, as the hatchery labelled it.
    pub fn worker(self) -> Option<Worker> {
        match self {
            SecretId::Config(w) => Some(w),
            SecretId::DbPassword => None,
        }
    }
}

impl Slot for SecretId {
    const ALL: &'static [Self] = &SecretId::ALL;
    fn index(self) -> usize {
        match self {
            SecretId::Config(w) => w as usize,
            SecretId::DbPassword => 2,
        }
    }
}

impl Uid {
    pub fn text(self) -> String {
        match self {
            Uid::Hatchery(w) => format!("uid-{}", w.name()),
            Uid::Adversary(n) => format!("uid-adv-{n}"),
        }
    }
}

// === Set ===

/// A set of a few [`Slot`] values, as bits: small to hash and to clone.
pub struct Set<T>(u8, PhantomData<T>);

impl<T: Slot> Set<T> {
    pub const fn empty() -> Self {
        Self(0, PhantomData)
    }

    pub fn of(value: T) -> Self {
        let mut set = Self::empty();
        set.insert(value);
        set
    }

    pub fn contains(self, value: T) -> bool {
        self.0 & (1 << value.index()) != 0
    }

    pub fn insert(&mut self, value: T) {
        self.0 |= 1 << value.index();
    }

    pub fn remove(&mut self, value: T) {
        self.0 &= !(1 << value.index());
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0, PhantomData)
    }

    /// The values in index order.
    pub fn iter(self) -> impl Iterator<Item = T> {
        T::ALL.iter().copied().filter(move |&v| self.contains(v))
    }

    pub fn first(self) -> Option<T> {
        self.iter().next()
    }
}

impl<T: Slot> FromIterator<T> for Set<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut set = Self::empty();
        for value in iter {
            set.insert(value);
        }
        set
    }
}

impl<T> Clone for Set<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Set<T> {}
impl<T> PartialEq for Set<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<T> Eq for Set<T> {}
impl<T> std::hash::Hash for Set<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}
impl<T: Slot + fmt::Debug> fmt::Debug for Set<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}
impl<T: Slot> Default for Set<T> {
    fn default() -> Self {
        Self::empty()
    }
}

// === Objects ===

/// A pod, as far as anything here reads it. Its name is its slot in the store.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pod {
    pub uid: Uid,
    /// `CDS_WORKER_NAME`, when it names a modelled worker.
    pub worker_label: Option<Worker>,
    /// `CDS_HATCHERY_NAME=<hatchery of this worker>`.
    pub hatchery_label: Option<Worker>,
    /// The secrets listed in the `cds-secret-guard/protected-secrets` annotation.
    pub annotation: Set<SecretId>,
    /// The secrets the spec references (here as `envFrom.secretRef`).
    pub refs: Set<SecretId>,
    pub phase: Phase,
    /// Has a deletionTimestamp.
    pub terminating: bool,
}

/// A pod as someone asks to create it (before the mutating webhook, with no UID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PodShape {
    pub name: PodName,
    pub worker_label: Option<Worker>,
    pub hatchery_label: Option<Worker>,
    pub annotation: Set<SecretId>,
    pub refs: Set<SecretId>,
}

/// An ownerReference to a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub name: PodName,
    pub uid: Uid,
}

/// A secret's metadata: its labels follow from its name (the hatchery labels its worker
/// secrets `CDS_HATCHERY_NAME` and `CDS_WORKER_NAME`; `db-password` has none), its age is
/// kept with the clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Secret {
    /// The resourceVersion: the number of writes to this secret.
    pub version: u8,
    pub owners: Vec<Owner>,
}

impl Pod {
    /// Not terminating and not finished: may still need its secrets (`PodState::is_live`).
    pub fn is_live(&self) -> bool {
        !self.terminating && self.phase != Phase::Succeeded
    }
}

// === Store ===

/// Every object at one revision.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Snapshot {
    pub pods: [Option<Pod>; 3],
    pub secrets: [Option<Secret>; 3],
}

impl Snapshot {
    pub fn pod(&self, name: PodName) -> Option<&Pod> {
        self.pods[name.index()].as_ref()
    }

    pub fn secret(&self, id: SecretId) -> Option<&Secret> {
        self.secrets[id.index()].as_ref()
    }

    pub fn pods(&self) -> impl Iterator<Item = (PodName, &Pod)> {
        PodName::ALL.into_iter().filter_map(|n| self.pod(n).map(|p| (n, p)))
    }

    /// The pods of a worker as rule 5 defines them: named after it or labelled with it.
    pub fn worker_pods(&self, worker: Worker) -> impl Iterator<Item = (PodName, &Pod)> {
        self.pods()
            .filter(move |(n, p)| *n == worker.pod() || p.worker_label == Some(worker))
    }

    /// Whether a pod with this name and UID exists.
    pub fn has_pod(&self, owner: Owner) -> bool {
        self.pod(owner.name).is_some_and(|p| p.uid == owner.uid)
    }
}

/// The store: the current snapshot, and what a lagging replica may still serve.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    pub now: Snapshot,
    pub lagging: Lagging,
}

/// How many changes behind each stale read may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lag {
    /// The cleanup's pod list (K).
    pub list: usize,
    /// The reconciler's secret cache.
    pub cache: usize,
    /// The guard's pod watch, in writes (`watch`); `None` when the guard reads no watch,
    /// which is then left out.
    pub watch: Option<usize>,
}

/// The answers a stale read may still get: for each stale read in the model, its last `k`
/// earlier answers, newest first. A stale read returns one of them or the current answer.
///
/// The history keeps the projections of past snapshots that the stale readers read, not
/// whole snapshots: states would otherwise differ in data no stale reader looks at. And it
/// counts the writes that changed a reader's answer, not all writes, so a stale read may
/// miss the last `k` changes to what it lists: that allows every read at most `k`
/// revisions behind, and more.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Lagging {
    /// The cleanup's pod list (CDS reads pods through an informer-backed client).
    pub listed_workers: Vec<Set<Worker>>,
    /// The reconciler's label-selected secret cache.
    pub cached_secrets: Vec<[Option<Secret>; 2]>,
}

impl Store {
    /// `db-password` exists from the start; nothing else does.
    pub fn new() -> Self {
        let mut secrets: [Option<Secret>; 3] = Default::default();
        secrets[SecretId::DbPassword.index()] = Some(Secret::default());
        Self {
            now: Snapshot {
                pods: Default::default(),
                secrets,
            },
            lagging: Lagging::default(),
        }
    }

    /// One write: a new revision; the previous answers of the stale reads join their
    /// history, which keeps `lag.list` of the pod list's and `lag.cache` of the cache's.
    pub fn write(&mut self, lag: Lag, change: impl FnOnce(&mut Snapshot)) {
        let (workers, secrets) = (self.now.listed_workers(), self.now.cached_secrets());
        change(&mut self.now);
        remember(
            &mut self.lagging.listed_workers,
            workers,
            self.now.listed_workers(),
            lag.list,
        );
        remember(
            &mut self.lagging.cached_secrets,
            secrets,
            self.now.cached_secrets(),
            lag.cache,
        );
    }

    /// Drops stale answers that equal the current one, or an earlier stale one: a read
    /// could not tell them apart.
    pub fn forget_current_answers(&mut self) {
        dedup(&mut self.lagging.listed_workers, self.now.listed_workers());
        dedup(&mut self.lagging.cached_secrets, self.now.cached_secrets());
    }

    /// The lagging replica caught up: every read is current again.
    pub fn sync(&mut self) {
        self.lagging = Lagging::default();
    }

    pub fn is_lagging(&self) -> bool {
        self.lagging != Lagging::default()
    }

    /// The answers a stale LIST of the cleanup's pods may get, current first, each once.
    pub fn listed_workers(&self) -> Vec<Set<Worker>> {
        answers(self.now.listed_workers(), &self.lagging.listed_workers)
    }

    /// The answers the reconciler's secret cache may give, current first, each once.
    pub fn cached_secrets(&self) -> Vec<[Option<Secret>; 2]> {
        answers(self.now.cached_secrets(), &self.lagging.cached_secrets)
    }
}

fn remember<T: PartialEq>(history: &mut Vec<T>, before: T, after: T, k: usize) {
    if before != after && k > 0 {
        history.insert(0, before);
        history.truncate(k);
    }
}

fn dedup<T: PartialEq>(history: &mut Vec<T>, now: T) {
    let mut kept: Vec<T> = Vec::new();
    for old in history.drain(..) {
        if old != now && !kept.contains(&old) {
            kept.push(old);
        }
    }
    *history = kept;
}

fn answers<T: PartialEq + Clone>(now: T, history: &[T]) -> Vec<T> {
    let mut all = vec![now];
    for old in history {
        if !all.contains(old) {
            all.push(old.clone());
        }
    }
    all
}

impl Snapshot {
    /// What the cleanup of `h1` lists: the worker labels of the pods labelled with its
    /// hatchery, whatever their phase.
    pub fn listed_workers(&self) -> Set<Worker> {
        self.pods()
            .filter(|(_, p)| p.hatchery_label == Some(Worker::W1))
            .filter_map(|(_, p)| p.worker_label)
            .collect()
    }

    /// What the reconciler's cache watches: the secrets labelled with a worker.
    pub fn cached_secrets(&self) -> [Option<Secret>; 2] {
        Worker::ALL.map(|w| self.secret(w.secret()).cloned())
    }
}

// === Conversions to what the product's functions take ===

/// The clock: the instant of every decision, and how long a tick is.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub now: Timestamp,
    pub tick: Duration,
}

impl Clock {
    pub fn created(&self, age_ticks: u8) -> Timestamp {
        let age = Duration::from_secs(self.tick.as_secs() * u64::from(age_ticks));
        self.now - age
    }
}

/// The secret's metadata as the apiserver would send it in `oldObject`.
pub fn secret_meta(id: SecretId, secret: &Secret, age_ticks: u8, clock: &Clock) -> ObjectMeta {
    let labels = id.worker().map(|w| {
        BTreeMap::from([
            (HATCHERY_LABEL.to_owned(), w.hatchery().to_owned()),
            (WORKER_LABEL.to_owned(), w.name().to_owned()),
        ])
    });
    let owners: Vec<_> = secret
        .owners
        .iter()
        .map(|o| pod_reference(o.name.name(), &o.uid.text()))
        .collect();
    ObjectMeta {
        name: Some(id.name().to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        uid: Some(format!("uid-{}", id.name())),
        resource_version: Some(secret.version.to_string()),
        creation_timestamp: Some(Time(clock.created(age_ticks))),
        labels,
        owner_references: (!owners.is_empty()).then_some(owners),
        ..ObjectMeta::default()
    }
}

fn pod_labels(worker: Option<Worker>, hatchery: Option<Worker>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if let Some(w) = worker {
        labels.insert(WORKER_LABEL.to_owned(), w.name().to_owned());
    }
    if let Some(h) = hatchery {
        labels.insert(HATCHERY_LABEL.to_owned(), h.hatchery().to_owned());
    }
    labels
}

/// What the guard's lookups return for a pod.
pub fn pod_state(name: PodName, pod: &Pod) -> PodState {
    PodState {
        name: name.name().to_owned(),
        labels: pod_labels(pod.worker_label, pod.hatchery_label),
        uid: pod.uid.text(),
        phase: Some(format!("{:?}", pod.phase)),
        terminating: pod.terminating,
    }
}

fn spec(refs: Set<SecretId>) -> SecretReferences {
    let env_from = refs
        .iter()
        .map(|s| EnvFromReference {
            secret_ref: Some(SecretEnvSource {
                name: s.name().to_owned(),
                optional: None,
            }),
        })
        .collect();
    SecretReferences {
        containers: Some(vec![ContainerReferences {
            env_from: Some(env_from),
            ..ContainerReferences::default()
        }]),
        ..SecretReferences::default()
    }
}

fn annotations(listed: Set<SecretId>) -> Option<BTreeMap<String, String>> {
    (!listed.is_empty()).then(|| {
        let names: Vec<_> = listed.iter().map(SecretId::name).collect();
        BTreeMap::from([(PROTECTED_SECRETS_ANNOTATION.to_owned(), names.join(","))])
    })
}

/// The pod as a quorum GET returns it.
pub fn kube_pod(name: PodName, pod: &Pod, clock: &Clock) -> WorkerPod {
    let labels = pod_labels(pod.worker_label, pod.hatchery_label);
    WorkerPod {
        metadata: ObjectMeta {
            name: Some(name.name().to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            uid: Some(pod.uid.text()),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: annotations(pod.annotation),
            deletion_timestamp: pod.terminating.then_some(Time(clock.now)),
            ..ObjectMeta::default()
        },
        spec: Some(spec(pod.refs)),
        status: Some(PhasePart {
            phase: Some(format!("{:?}", pod.phase)),
        }),
        ..WorkerPod::default()
    }
}

/// The pod as a client sends it to be created: no UID, no status.
pub fn kube_pod_request(shape: &PodShape) -> WorkerPod {
    let labels = pod_labels(shape.worker_label, shape.hatchery_label);
    WorkerPod {
        metadata: ObjectMeta {
            name: Some(shape.name.name().to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            labels: (!labels.is_empty()).then_some(labels),
            annotations: annotations(shape.annotation),
            ..ObjectMeta::default()
        },
        spec: Some(spec(shape.refs)),
        ..WorkerPod::default()
    }
}

/// Reads a created pod back into the compact form. Label or annotation values that name
/// nothing in the model are dropped: no rule can match them.
pub fn shape_of(pod: &WorkerPod, name: PodName) -> PodShape {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let worker_label = labels.get(WORKER_LABEL).and_then(|v| Worker::from_name(v));
    let hatchery_label = labels
        .get(HATCHERY_LABEL)
        .and_then(|v| Worker::ALL.into_iter().find(|w| w.hatchery() == v));
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROTECTED_SECRETS_ANNOTATION))
        .map(|list| list.split(',').filter_map(SecretId::from_name).collect())
        .unwrap_or_default();
    let refs = pod
        .spec
        .as_ref()
        .map(|spec| spec.names().iter().filter_map(|n| SecretId::from_name(n)).collect())
        .unwrap_or_default();
    PodShape {
        name,
        worker_label,
        hatchery_label,
        annotation,
        refs,
    }
}
