//! The actors and their steps. Each step is one API call (or one local decision that
//! leads to the next call), so any two actors' calls can interleave.
//!
//! Environment (no fairness: may stop at any point, which is how a crash looks):
//! - the **hatcheries** `h1` (worker `w1`) and `h2` (worker `w2`), in CDS's order: CREATE
//!   secret, CREATE pod (409 when the name is taken: the worker never runs); then, at any
//!   time, the kill path: DELETE pod, DELETE secret (a refusal is not retried);
//! - the **pods' lifecycle**: Pending → Running → Succeeded. A DELETE removes a Pending
//!   (unscheduled) pod at once and marks any other terminating;
//! - the **adversary**: CREATE pods of any shape in its catalogue (through the mutating
//!   webhook) and DELETE any pod. It has no right on secrets;
//! - the guard's **pod watch** fails and relists, at any time (when the bounds let it).
//!
//! System (weakly fair: keeps stepping while it has something to do):
//! - the **cleanup** of `h1` (CDS's `deleteSecrets`): LIST pods labelled `h1` (stale: it
//!   may miss the last K changes of its answer), LIST secrets with a hatchery label
//!   (quorum), DELETE each one whose worker is in no listed pod (after upstream's fix:
//!   only if older than the cleanup's own grace period);
//! - the **garbage collector**: for a secret whose Pod owners are all gone (no pod with
//!   their name and UID), GET the owners (quorum), then DELETE the secret; a denied delete
//!   is retried;
//! - the **reconciler** replicas: a queue of pod names fed by watch events (a worker-
//!   labelled pod created, an unowned worker secret created for an existing pod); GET the
//!   pod (quorum), then for each secret its spec references: found in the label-selected
//!   cache (which may lag) it is vetted with `may_adopt` and PATCHed at once, else read by
//!   GET, vetted and PATCHed; the PATCH carries the resourceVersion read as a precondition;
//! - the **kubelet**: removes a terminating pod;
//! - the guard's **pod watch** (`watch`): delivers its next event; during a relist, hands
//!   over the next listed pod, then ends the relist;
//! - the **clock** (a tick ages the secrets) and **replication** (a lagging replica
//!   catches up: stale answers are gone).
//!
//! Every secret DELETE goes through the guard (the configured [`Guard`] variant).
//!
//! A system actor never repeats itself over an unchanged world: the cleanup starts a new
//! round, and the garbage collector retries a denied delete, only once something they read
//! has changed; the reconciler runs on events. A repeat over the same world could do
//! nothing the first run could not (its choices were all explored from that world). This
//! keeps the state graph finite and acyclic without losing behaviours, and makes a state
//! where no system step is offered the true end of every fair run (see `properties`).
//!
//! [`Guard`]: crate::variants::Guard

use crate::{
    guard::{self, Requester},
    model::GuardModel,
    variants::{self, Adoption, Cleanup as CleanupVersion},
    watch::{self, Watch},
    world::{Lag, Owner, Phase, Pod, PodName, PodShape, Secret, SecretId, Set, Slot, Snapshot, Store, Uid, Worker},
};

/// Attempts at a conflicting PATCH before the reconcile fails (`owners::ATTEMPTS`).
const ATTEMPTS: u8 = 5;

/// The whole state: the store, the clock, each actor's progress, and ghost facts that only
/// the properties read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub store: Store,
    /// Ticks since each secret was created, capped where no grace period can tell the
    /// difference any more (`db-password` is old).
    pub ages: [u8; 3],
    pub hatcheries: [Hatchery; 2],
    /// Pods the adversary created so far.
    pub adversary: u8,
    pub cleanup: Cleanup,
    pub gc: Gc,
    pub reconcilers: Vec<Reconciler>,
    /// The guard's pod watch.
    pub watch: Watch,
    pub ghost: Ghost,
}

/// Where a hatchery is with its worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hatchery {
    Start,
    SecretCreated,
    /// `slow`: the pod was created once the secret was already older than the guard's
    /// grace period (the one case the grace period cannot cover).
    PodCreated {
        slow: bool,
    },
    /// The pod's name was taken: the worker never runs.
    NameTaken,
    /// Kill path: the pod is deleted, the secret is next.
    PodDeleted,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cleanup {
    pub round: CleanupRound,
    /// Something the cleanup reads changed since its round started.
    pub rerun: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupRound {
    Idle,
    /// The workers named by the listed pods of `h1`.
    PodsListed(Set<Worker>),
    /// The secrets left to delete.
    Deleting(Set<SecretId>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gc {
    /// The secret whose owners were all found gone, to delete next.
    pub collecting: Option<SecretId>,
    /// Secrets whose delete was denied, with nothing changed since: retried after a change.
    pub denied: Set<SecretId>,
}

/// A reconciler replica: its own watches, its own queue.
///
/// As in the real reconciler, a pod whose secret is missing is not requeued: the secret's
/// creation (CDS labels its secrets, so the secret watch sees it) queues the pod again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reconciler {
    /// Pod names queued by watch events.
    pub queued: Set<PodName>,
    pub adopting: Option<Adopting>,
}

/// One reconcile in progress.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Adopting {
    pub name: PodName,
    /// The pod as the quorum GET returned it.
    pub pod: Pod,
    /// Secrets still to handle, in the order `referenced_secrets` yields them.
    pub todo: Set<SecretId>,
    /// The writes kept conflicting: requeue at the end.
    pub retry: bool,
    pub next: AdoptStep,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AdoptStep {
    /// Read the first secret of `todo` (from the cache on the first attempt).
    Read { attempts: u8 },
    /// PATCH its ownerReferences, conditional on the resourceVersion read.
    Patch { read: Secret, attempts: u8 },
}

impl Adopting {
    /// Done with `id`: on to the next secret, first from the cache again.
    fn next_secret(&mut self, id: SecretId) {
        self.todo.remove(id);
        self.next = AdoptStep::Read { attempts: 0 };
    }
}

/// Facts about the past that the properties need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// A secret was deleted while a live pod of its worker referenced it.
    pub lost: bool,
    /// A deletion the adversary could not have made itself (see `properties`).
    pub deputy: bool,
    /// Workers whose name the adversary took, with a pod using their secret, before the
    /// hatchery created the worker's pod.
    pub squatted: Set<Worker>,
}

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The hatchery's next call for its worker.
    Hatchery(Worker),
    /// The pod moves to its next phase.
    PodPhase(PodName),
    /// The adversary creates the pod `catalogue[i]`.
    AdversaryCreate(u16),
    /// The adversary deletes a pod.
    AdversaryDelete(PodName),
    /// The kubelet removes a terminating pod.
    Kubelet(PodName),
    /// The cleanup lists pods and gets the current answer (0) or the `n`-th older one.
    CleanupListPods(u8),
    CleanupListSecrets,
    CleanupDelete,
    /// The garbage collector reads the owners of a secret.
    GcObserve(SecretId),
    GcDelete,
    /// Reconciler `r` takes a queued pod and GETs it.
    ReconcileGetPod(u8, PodName),
    /// Reconciler `r` goes on with the next secret: found in its cache (as it is: 0, or
    /// the `n`-th older answer it may still hold), vetted and PATCHed; or read by GET.
    ReconcileRead(u8, u8),
    /// Reconciler `r` PATCHes the secret it read by GET.
    ReconcilePatch(u8),
    Tick,
    Sync,
    /// The guard's pod watch delivers its oldest event.
    WatchDeliver,
    /// The guard's pod watch fails and relists; the LIST sees the first `n` writes the
    /// watch has yet to pass (all of them: a current list).
    WatchRelist(u8),
    /// The relist hands over its next listed pod.
    WatchInitApply,
    /// The relist is done.
    WatchInitDone,
}

impl Action {
    /// Whether the step is the system's (weakly fair) rather than the environment's.
    pub fn is_system(self) -> bool {
        !matches!(
            self,
            Action::Hatchery(_)
                | Action::PodPhase(_)
                | Action::AdversaryCreate(_)
                | Action::AdversaryDelete(_)
                | Action::WatchRelist(_)
        )
    }
}

/// What a step did, for traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome(pub String);

impl Outcome {
    fn of(text: impl Into<String>) -> Self {
        Self(text.into())
    }
}

/// What changed, so the actors that read it may run again.
#[derive(Clone, Copy)]
enum Change {
    /// A write to the store.
    Store,
    /// Time passed: only age-dependent decisions change.
    Clock,
    /// The lagging replica caught up: only stale reads change.
    Replication,
    /// The guard's pod watch changed what it shows or claims: the guard's answers change.
    Watch,
}

// === impl State ===

impl State {
    pub fn initial(reconcilers: usize, lookup: variants::Lookup) -> Self {
        Self {
            store: Store::new(),
            ages: [0, 0, u8::MAX],
            hatcheries: [Hatchery::Start; 2],
            adversary: 0,
            cleanup: Cleanup {
                round: CleanupRound::Idle,
                rerun: true,
            },
            gc: Gc {
                collecting: None,
                denied: Set::empty(),
            },
            reconcilers: vec![
                Reconciler {
                    queued: Set::empty(),
                    adopting: None,
                };
                reconcilers
            ],
            watch: Watch::new(lookup),
            ghost: Ghost::default(),
        }
    }

    pub fn now(&self) -> &Snapshot {
        &self.store.now
    }

    fn changed(&mut self, change: Change) {
        // The cleanup reads pods (stale), secrets and their ages.
        self.cleanup.rerun = true;
        // The garbage collector's deletes depend on the store, on ages and on the guard's
        // pod watch (the guard).
        if matches!(change, Change::Store | Change::Clock | Change::Watch) {
            self.gc.denied = Set::empty();
        }
    }

    fn write(&mut self, lag: Lag, change: impl FnOnce(&mut Snapshot)) {
        let before = self.store.now.clone();
        self.store.write(lag, change);
        if let Some(watch_lag) = lag.watch {
            self.watch.write(watch::event(&before, &self.store.now), watch_lag);
        }
        self.changed(Change::Store);
    }

    /// Whether worker `w` is over: its hatchery could not create its pod, or the pod it
    /// created (known by its UID) is gone or no longer live.
    pub fn ended(&self, w: Worker) -> bool {
        match self.hatcheries[w as usize] {
            Hatchery::Start | Hatchery::SecretCreated => false,
            Hatchery::NameTaken | Hatchery::PodDeleted | Hatchery::Done => true,
            Hatchery::PodCreated { .. } => !self
                .now()
                .pod(w.pod())
                .is_some_and(|p| p.uid == Uid::Hatchery(w) && p.is_live()),
        }
    }
}

// === Steps ===

impl GuardModel {
    /// The environment's possible steps.
    pub fn environment_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for &w in self.workers() {
            if !matches!(s.hatcheries[w as usize], Hatchery::NameTaken | Hatchery::Done) {
                actions.push(Action::Hatchery(w));
            }
        }
        for (name, pod) in s.now().pods() {
            if !pod.terminating && pod.phase != Phase::Succeeded {
                actions.push(Action::PodPhase(name));
            }
        }
        if s.adversary < self.bounds.adversary_pods {
            for (i, shape) in self.catalogue.iter().enumerate() {
                if s.now().pod(shape.name).is_none() {
                    actions.push(Action::AdversaryCreate(i as u16));
                }
            }
        }
        for (name, pod) in s.now().pods() {
            if !pod.terminating {
                actions.push(Action::AdversaryDelete(name));
            }
        }
        if s.watch.relist.is_none() && self.bounds.relists && self.reads_the_watch() {
            for covered in 0..=s.watch.stream.len() {
                actions.push(Action::WatchRelist(covered as u8));
            }
        }
    }

    /// The system's possible steps. None at all: the system is done for good, unless the
    /// environment acts again.
    pub fn system_actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (name, pod) in s.now().pods() {
            if pod.terminating {
                actions.push(Action::Kubelet(name));
            }
        }
        self.cleanup_actions(s, actions);
        self.gc_actions(s, actions);
        for (r, rec) in s.reconcilers.iter().enumerate() {
            self.reconciler_actions(s, r as u8, rec, actions);
        }
        if self.tick_enabled(s) {
            actions.push(Action::Tick);
        }
        if s.store.is_lagging() {
            actions.push(Action::Sync);
        }
        match s.watch.relist_handed_all() {
            None if !s.watch.stream.is_empty() => actions.push(Action::WatchDeliver),
            None => {}
            Some(false) => actions.push(Action::WatchInitApply),
            Some(true) => actions.push(Action::WatchInitDone),
        }
    }

    /// Applies one step; `None` when it changes nothing.
    pub fn apply(&self, s: &State, action: Action) -> Option<(State, Outcome)> {
        let mut next = s.clone();
        let outcome = match action {
            Action::Hatchery(w) => self.hatchery(&mut next, w),
            Action::PodPhase(name) => {
                next.write(self.k(), |snap| {
                    let pod = snap.pods[slot(name)].as_mut().expect("a pod whose phase moves exists");
                    pod.phase = match pod.phase {
                        Phase::Pending => Phase::Running,
                        Phase::Running | Phase::Succeeded => Phase::Succeeded,
                    };
                });
                Outcome::of(format!("{:?}", next.now().pod(name).map(|p| p.phase)))
            }
            Action::AdversaryCreate(i) => self.adversary_create(&mut next, usize::from(i)),
            Action::AdversaryDelete(name) => self.delete_pod(&mut next, name),
            Action::Kubelet(name) => {
                next.write(self.k(), |snap| snap.pods[slot(name)] = None);
                Outcome::of("removed")
            }
            Action::CleanupListPods(answer) => self.cleanup_list_pods(&mut next, usize::from(answer)),
            Action::CleanupListSecrets => self.cleanup_list_secrets(&mut next),
            Action::CleanupDelete => self.cleanup_delete(&mut next),
            Action::GcObserve(id) => self.gc_observe(&mut next, id),
            Action::GcDelete => {
                let id = next.gc.collecting.take().expect("GcDelete follows GcObserve");
                let outcome = self.delete_secret(&mut next, id, Requester::GarbageCollector);
                if next.now().secret(id).is_some() {
                    next.gc.denied.insert(id);
                }
                outcome
            }
            Action::ReconcileGetPod(r, name) => self.reconcile_get_pod(&mut next, usize::from(r), name),
            Action::ReconcileRead(r, answer) => self.reconcile_read(&mut next, usize::from(r), usize::from(answer)),
            Action::ReconcilePatch(r) => self.reconcile_patch(&mut next, usize::from(r)),
            Action::Tick => {
                let cap = self.age_cap();
                for id in SecretId::ALL {
                    if self.ages_matter(s, id) {
                        next.ages[id.index()] = (next.ages[id.index()] + 1).min(cap);
                    }
                }
                next.changed(Change::Clock);
                Outcome::of("")
            }
            Action::Sync => {
                next.store.sync();
                next.changed(Change::Replication);
                Outcome::of("")
            }
            Action::WatchDeliver => {
                next.watch.deliver();
                next.changed(Change::Watch);
                Outcome::of(self.watch_claim(&next))
            }
            Action::WatchRelist(covered) => {
                next.watch.relist(usize::from(covered));
                // The real watch keeps its store, index and claim until the relist is done.
                if self.variant.lookup == variants::Lookup::EarlyRelistClaim {
                    next.changed(Change::Watch);
                }
                let listed = next
                    .watch
                    .relist
                    .as_ref()
                    .map_or_else(Vec::new, |r| r.listed_names().map(PodName::name).collect::<Vec<_>>());
                Outcome::of(format!("pods {listed:?}; {}", self.watch_claim(&next)))
            }
            Action::WatchInitApply => {
                next.watch.init_apply();
                if self.variant.lookup == variants::Lookup::EarlyRelistClaim {
                    next.changed(Change::Watch);
                }
                Outcome::of("")
            }
            Action::WatchInitDone => {
                next.watch.init_done();
                next.changed(Change::Watch);
                Outcome::of(self.watch_claim(&next))
            }
        };
        self.normalize(&mut next);
        (next != *s).then_some((next, outcome))
    }

    /// Forgets what can no longer make a difference, so that states that behave alike are
    /// one state: the age of a secret no decision will read, a queued pod that the
    /// reconciler would find gone or no longer live (neither ever comes back), and stale
    /// answers equal to the current one.
    fn normalize(&self, s: &mut State) {
        for id in SecretId::ALL {
            if id.worker().is_some() && !self.ages_matter(s, id) {
                s.ages[id.index()] = 0;
            }
        }
        let live: Set<PodName> = s.now().pods().filter(|(_, p)| p.is_live()).map(|(n, _)| n).collect();
        for r in &mut s.reconcilers {
            r.queued = r.queued.intersection(live);
        }
        s.store.forget_current_answers();
        s.watch.normalize(self.bounds.relists);
    }

    fn k(&self) -> Lag {
        Lag {
            list: usize::from(self.bounds.k),
            cache: usize::from(self.bounds.cache_k),
            watch: self.reads_the_watch().then_some(usize::from(self.bounds.watch_lag)),
        }
    }

    /// Whether the configured guard reads the pod watch: one that does not (no guard, an
    /// unreachable apiserver) runs without it.
    fn reads_the_watch(&self) -> bool {
        matches!(self.variant.guard, variants::Guard::Real | variants::Guard::OldRule3)
    }

    /// What the watch's claim lets the label index do now, for traces.
    fn watch_claim(&self, s: &State) -> String {
        let gate = if s.watch.current {
            "claims the current revision"
        } else {
            "behind the current revision"
        };
        match s.watch.undelivered() {
            0 => gate.to_owned(),
            n => format!("{gate}, {n} event(s) undelivered"),
        }
    }

    // --- the store's verbs, shared by the actors ---

    /// A pod DELETE: an unscheduled (Pending) pod goes at once, others get a deletion
    /// timestamp and wait for the kubelet.
    fn delete_pod(&self, s: &mut State, name: PodName) -> Outcome {
        match s.now().pod(name) {
            None => Outcome::of("404"),
            Some(pod) if pod.terminating => Outcome::of("200 already terminating"),
            Some(pod) if pod.phase == Phase::Pending => {
                s.write(self.k(), |snap| snap.pods[slot(name)] = None);
                Outcome::of("200 gone")
            }
            Some(_) => {
                s.write(self.k(), |snap| {
                    snap.pods[slot(name)].as_mut().expect("checked above").terminating = true;
                });
                Outcome::of("200 terminating")
            }
        }
    }

    /// A pod CREATE through the mutating webhook; watch events queue it for the reconcilers
    /// when it carries the worker label (their pod watch selects on it).
    fn create_pod(&self, s: &mut State, shape: &PodShape, uid: Uid) -> bool {
        if s.now().pod(shape.name).is_some() {
            return false;
        }
        let pod = Pod {
            uid,
            worker_label: shape.worker_label,
            hatchery_label: shape.hatchery_label,
            annotation: shape.annotation,
            refs: shape.refs,
            phase: Phase::Pending,
            terminating: false,
        };
        s.write(self.k(), |snap| snap.pods[slot(shape.name)] = Some(pod));
        // The reconcilers' pod watch selects on the worker label.
        if shape.worker_label.is_some() {
            for r in &mut s.reconcilers {
                r.queued.insert(shape.name);
            }
        }
        true
    }

    /// A secret DELETE through the guard. An allowed delete is checked against the safety
    /// properties on the state it happens in.
    fn delete_secret(&self, s: &mut State, id: SecretId, requester: Requester) -> Outcome {
        let Some(secret) = s.now().secret(id).cloned() else {
            return Outcome::of("404");
        };
        let decision = variants::admit(self.variant.guard, &self.memo, &self.view(s), id, &secret, requester);
        let verdict = decision.verdict;
        let read = if decision.from_index {
            "; label read from the watch's index"
        } else {
            ""
        };
        if !verdict.allowed {
            return Outcome::of(format!("403 denied ({}{read})", verdict.reason));
        }
        if crate::properties::deletion_loses_secret(s, id) {
            s.ghost.lost = true;
        }
        if crate::properties::deletion_is_deputy(s, id, requester) {
            s.ghost.deputy = true;
        }
        s.write(self.k(), |snap| snap.secrets[id.index()] = None);
        let why = match self.variant.guard {
            variants::Guard::Off => "no guard".to_owned(),
            _ => verdict.reason.to_string(),
        };
        Outcome::of(format!("200 deleted ({why}{read})"))
    }

    // --- hatchery ---

    fn hatchery(&self, s: &mut State, w: Worker) -> Outcome {
        let h = w as usize;
        match s.hatcheries[h] {
            Hatchery::Start => {
                s.write(self.k(), |snap| {
                    snap.secrets[w.secret().index()] = Some(Secret {
                        version: 1,
                        owners: Vec::new(),
                    });
                });
                s.ages[w.secret().index()] = 0;
                // The secret watch maps a new unowned worker secret to its worker's pod; the
                // controller only reconciles a pod it has.
                if s.now().pod(w.pod()).is_some() {
                    for r in &mut s.reconcilers {
                        r.queued.insert(w.pod());
                    }
                }
                s.hatcheries[h] = Hatchery::SecretCreated;
                Outcome::of("201")
            }
            Hatchery::SecretCreated => {
                if self.create_pod(s, &self.hatchery_pods[h], Uid::Hatchery(w)) {
                    let slow = s.ages[w.secret().index()] >= self.bounds.grace_ticks;
                    s.hatcheries[h] = Hatchery::PodCreated { slow };
                    Outcome::of(if slow {
                        "201 (secret older than the grace period)"
                    } else {
                        "201"
                    })
                } else {
                    s.hatcheries[h] = Hatchery::NameTaken;
                    Outcome::of("409 name taken: the worker never runs")
                }
            }
            Hatchery::PodCreated { .. } => {
                s.hatcheries[h] = Hatchery::PodDeleted;
                self.delete_pod(s, w.pod())
            }
            Hatchery::PodDeleted => {
                s.hatcheries[h] = Hatchery::Done;
                self.delete_secret(s, w.secret(), Requester::Hatchery)
            }
            Hatchery::NameTaken | Hatchery::Done => unreachable!("no step is offered"),
        }
    }

    // --- adversary ---

    fn adversary_create(&self, s: &mut State, i: usize) -> Outcome {
        let shape = self.catalogue[i];
        let uid = Uid::Adversary(s.adversary);
        // Taking a worker's name, with a pod using its secret, before its hatchery created
        // the pod: Kubernetes cannot tell this pod from the worker's own.
        if let Some(w) = shape.name.worker()
            && shape.refs.contains(w.secret())
            && matches!(s.hatcheries[w as usize], Hatchery::Start | Hatchery::SecretCreated)
        {
            s.ghost.squatted.insert(w);
        }
        let created = self.create_pod(s, &shape, uid);
        debug_assert!(created, "only offered for a free name");
        s.adversary += 1;
        Outcome::of(format!("201 {}", uid.text()))
    }

    // --- cleanup ---

    fn cleanup_actions(&self, s: &State, actions: &mut Vec<Action>) {
        match s.cleanup.round {
            CleanupRound::Idle if s.cleanup.rerun => {
                // One step per answer the (possibly stale) list can give.
                for answer in 0..s.store.listed_workers().len() {
                    actions.push(Action::CleanupListPods(answer as u8));
                }
            }
            CleanupRound::Idle => {}
            CleanupRound::PodsListed(_) => actions.push(Action::CleanupListSecrets),
            CleanupRound::Deleting(_) => actions.push(Action::CleanupDelete),
        }
    }

    fn cleanup_list_pods(&self, s: &mut State, answer: usize) -> Outcome {
        let workers = s.store.listed_workers()[answer];
        s.cleanup = Cleanup {
            round: CleanupRound::PodsListed(workers),
            rerun: false,
        };
        Outcome::of(format!(
            "workers {:?}",
            workers.iter().map(Worker::name).collect::<Vec<_>>()
        ))
    }

    fn cleanup_list_secrets(&self, s: &mut State) -> Outcome {
        let CleanupRound::PodsListed(workers) = s.cleanup.round else {
            unreachable!("offered after the pod list")
        };
        // Every secret with a hatchery label, whichever hatchery (CDS's selector).
        let doomed: Set<SecretId> = Worker::ALL
            .into_iter()
            .map(Worker::secret)
            .filter(|&id| s.now().secret(id).is_some())
            .filter(|&id| !id.worker().is_some_and(|w| workers.contains(w)))
            .filter(|&id| {
                self.variant.cleanup == CleanupVersion::BeforeFix
                    || s.ages[id.index()] >= self.bounds.client_grace_ticks
            })
            .collect();
        s.cleanup.round = if doomed.is_empty() {
            CleanupRound::Idle
        } else {
            CleanupRound::Deleting(doomed)
        };
        Outcome::of(format!(
            "to delete {:?}",
            doomed.iter().map(SecretId::name).collect::<Vec<_>>()
        ))
    }

    fn cleanup_delete(&self, s: &mut State) -> Outcome {
        let CleanupRound::Deleting(mut doomed) = s.cleanup.round else {
            unreachable!("offered while deleting")
        };
        let id = doomed.first().expect("a deleting round has a secret left");
        doomed.remove(id);
        s.cleanup.round = if doomed.is_empty() {
            CleanupRound::Idle
        } else {
            CleanupRound::Deleting(doomed)
        };
        self.delete_secret(s, id, Requester::Hatchery)
    }

    // --- garbage collector ---

    fn gc_actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.gc.collecting.is_some() {
            actions.push(Action::GcDelete);
            return;
        }
        // A secret some of whose owners exist is left alone: reading them changes nothing.
        for id in SecretId::ALL {
            if !s.gc.denied.contains(id) && s.now().secret(id).is_some_and(|secret| owners_gone(s.now(), secret)) {
                actions.push(Action::GcObserve(id));
            }
        }
    }

    fn gc_observe(&self, s: &mut State, id: SecretId) -> Outcome {
        s.gc.collecting = Some(id);
        Outcome::of("all owners gone")
    }

    // --- reconciler ---

    fn reconciler_actions(&self, s: &State, r: u8, rec: &Reconciler, actions: &mut Vec<Action>) {
        let Some(adopting) = &rec.adopting else {
            for name in rec.queued.iter() {
                actions.push(Action::ReconcileGetPod(r, name));
            }
            return;
        };
        match &adopting.next {
            AdoptStep::Read { attempts: 0 } if self.variant.adoption == Adoption::Real => {
                // One step per distinct answer the lagging cache can give for this secret.
                let id = adopting
                    .todo
                    .first()
                    .expect("a reconcile in progress has a secret left");
                let mut seen = Vec::new();
                for (answer, cache) in s.store.cached_secrets().iter().enumerate() {
                    let cached = cached_secret(cache, id);
                    if !seen.contains(&cached) {
                        seen.push(cached);
                        actions.push(Action::ReconcileRead(r, answer as u8));
                    }
                }
            }
            AdoptStep::Read { .. } => actions.push(Action::ReconcileRead(r, 0)),
            AdoptStep::Patch { .. } => actions.push(Action::ReconcilePatch(r)),
        }
    }

    fn reconcile_get_pod(&self, s: &mut State, r: usize, name: PodName) -> Outcome {
        s.reconcilers[r].queued.remove(name);
        let Some(pod) = s.store.now.pod(name).cloned() else {
            return Outcome::of("404");
        };
        if !pod.is_live() {
            return Outcome::of("200 not live");
        }
        let todo = match self.variant.adoption {
            Adoption::Real => guard::referenced(name, &pod, &self.clock),
            Adoption::PreFixAnnotation => pod.annotation,
        };
        if todo.is_empty() {
            return Outcome::of("200 live, no secret to adopt");
        }
        let outcome = Outcome::of(format!(
            "200 live {}, secrets {:?}",
            pod.uid.text(),
            todo.iter().map(SecretId::name).collect::<Vec<_>>()
        ));
        s.reconcilers[r].adopting = Some(Adopting {
            name,
            pod,
            todo,
            retry: false,
            next: AdoptStep::Read { attempts: 0 },
        });
        outcome
    }

    /// The next call for the next secret: a cached secret is vetted and PATCHed at once
    /// (the cache read is no API call); one the cache lacks is read by GET first.
    fn reconcile_read(&self, s: &mut State, r: usize, answer: usize) -> Outcome {
        let mut adopting = s.reconcilers[r].adopting.take().expect("offered while adopting");
        let AdoptStep::Read { attempts } = adopting.next else {
            unreachable!("offered for a read")
        };
        let id = adopting
            .todo
            .first()
            .expect("a reconcile in progress has a secret left");
        let cached = match self.variant.adoption {
            Adoption::Real if attempts == 0 => cached_secret(&s.store.cached_secrets()[answer], id),
            Adoption::Real | Adoption::PreFixAnnotation => None,
        };
        let outcome = match cached {
            Some(secret) => {
                let vetted = self.vet(s, &mut adopting, id, Some(secret));
                match adopting.next.clone() {
                    AdoptStep::Patch { read, attempts } => {
                        format!(
                            "cache: {vetted}; PATCH: {}",
                            self.patch(s, &mut adopting, id, &read, attempts)
                        )
                    }
                    AdoptStep::Read { .. } => format!("cache: {vetted}"),
                }
            }
            // Not in the cache: only a secret named after the pod's worker is read.
            None if self.variant.adoption == Adoption::Real && !guard::named_for(&self.policy, id, adopting.name) => {
                adopting.next_secret(id);
                "not cached, not named for this pod: skipped".to_owned()
            }
            None => {
                let read = s.now().secret(id).cloned();
                format!("GET: {}", self.vet(s, &mut adopting, id, read))
            }
        };
        s.reconcilers[r].adopting = Some(adopting);
        self.reconcile_done(s, r);
        Outcome::of(outcome)
    }

    /// What the reconciler does with the secret it read: skip it, or PATCH it next.
    fn vet(&self, s: &State, adopting: &mut Adopting, id: SecretId, read: Option<Secret>) -> &'static str {
        let AdoptStep::Read { attempts } = adopting.next else {
            unreachable!("vetting follows a read")
        };
        match read {
            None => {
                adopting.next_secret(id);
                "missing"
            }
            Some(secret) if secret.owners.iter().any(|o| o.uid == adopting.pod.uid) => {
                adopting.next_secret(id);
                "already owned"
            }
            Some(secret) if !self.may_adopt(s, adopting, id, &secret) => {
                adopting.next_secret(id);
                "refused"
            }
            Some(secret) => {
                adopting.next = AdoptStep::Patch { read: secret, attempts };
                "may adopt"
            }
        }
    }

    fn may_adopt(&self, s: &State, adopting: &Adopting, id: SecretId, secret: &Secret) -> bool {
        match self.variant.adoption {
            Adoption::Real => self
                .memo
                .adoptable(&self.view(s), adopting.name, &adopting.pod, id, secret),
            Adoption::PreFixAnnotation => {
                let pod = crate::world::kube_pod(adopting.name, &adopting.pod, &self.clock);
                variants::pre_fix_may_adopt(&self.policy, id.name(), &pod)
            }
        }
    }

    fn reconcile_patch(&self, s: &mut State, r: usize) -> Outcome {
        let mut adopting = s.reconcilers[r].adopting.take().expect("offered while adopting");
        let AdoptStep::Patch { read, attempts } = adopting.next.clone() else {
            unreachable!("offered for a patch")
        };
        let id = adopting
            .todo
            .first()
            .expect("a reconcile in progress has a secret left");
        let outcome = self.patch(s, &mut adopting, id, &read, attempts);
        s.reconcilers[r].adopting = Some(adopting);
        self.reconcile_done(s, r);
        Outcome::of(outcome)
    }

    /// The PATCH of the secret's ownerReferences, conditional on the resourceVersion read.
    fn patch(&self, s: &mut State, adopting: &mut Adopting, id: SecretId, read: &Secret, attempts: u8) -> &'static str {
        match s.now().secret(id) {
            None => {
                adopting.next_secret(id);
                "404"
            }
            Some(current) if current.version != read.version => {
                if attempts + 1 >= ATTEMPTS {
                    // The reconcile fails and is retried with backoff.
                    adopting.retry = true;
                    adopting.todo = Set::empty();
                } else {
                    adopting.next = AdoptStep::Read { attempts: attempts + 1 };
                }
                "409 conflict"
            }
            Some(_) => {
                let mut owners = read.owners.clone();
                owners.push(Owner {
                    name: adopting.name,
                    uid: adopting.pod.uid,
                });
                let version = read.version + 1;
                s.write(self.k(), |snap| {
                    snap.secrets[id.index()] = Some(Secret { version, owners })
                });
                adopting.next_secret(id);
                "200 ownerReference added"
            }
        }
    }

    /// Ends the reconcile once no secret is left: forget the pod, or requeue it when its
    /// writes kept conflicting.
    fn reconcile_done(&self, s: &mut State, r: usize) {
        let rec = &mut s.reconcilers[r];
        let Some(adopting) = &rec.adopting else { return };
        if !adopting.todo.is_empty() {
            return;
        }
        let (name, retry) = (adopting.name, adopting.retry);
        rec.adopting = None;
        if retry {
            rec.queued.insert(name);
        }
    }

    // --- clock ---

    /// The age of a secret matters while it exists, or while its hatchery has yet to
    /// create the pod (to tell a slow hatchery).
    fn ages_matter(&self, s: &State, id: SecretId) -> bool {
        let Some(w) = id.worker() else { return false };
        s.now().secret(id).is_some() || s.hatcheries[w as usize] == Hatchery::SecretCreated
    }

    fn tick_enabled(&self, s: &State) -> bool {
        SecretId::ALL
            .into_iter()
            .any(|id| self.ages_matter(s, id) && s.ages[id.index()] < self.age_cap())
    }
}

fn slot(name: PodName) -> usize {
    name.index()
}

/// An owner is gone when no pod has its name and UID (the garbage collector's
/// `isDangling`); a secret with Pod owners all gone is garbage.
fn owners_gone(snapshot: &Snapshot, secret: &Secret) -> bool {
    !secret.owners.is_empty() && secret.owners.iter().all(|&owner| !snapshot.has_pod(owner))
}

/// What the reconciler's label-selected secret cache holds for `id`.
fn cached_secret(cache: &[Option<Secret>; 2], id: SecretId) -> Option<Secret> {
    // Only worker-labelled secrets are watched: `db-password` is never cached.
    id.worker().and_then(|w| cache[w as usize].clone())
}
