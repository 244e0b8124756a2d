//! The properties, checked over every reachable state.
//!
//! Safety, checked on every secret deletion that takes effect (on the state it happens in;
//! a ghost flag keeps the verdict):
//!
//! - **no lost secret**: no secret is deleted while a live pod of its worker references
//!   it. Live: not terminating, not Succeeded/Failed. Of its worker: named after the
//!   worker or labelled `CDS_WORKER_NAME=<worker>` (rule 5).
//! - **no confused deputy**: the adversary, who may create and delete pods but no secret,
//!   must not get a secret deleted that it could not have deleted itself. Deleting pods
//!   is its right, and a worker's secret follows the worker's pod by design; so what is
//!   within its reach is the secret of a worker that has *ended*: the pod its hatchery
//!   created (known by UID) is gone or no longer live, or the hatchery could not create it.
//!   Formally, every deletion must be of a protected secret (an unprotected secret such as
//!   `db-password` is never deleted), and every deletion by the garbage collector must be
//!   of the secret of an ended worker. This is what an adversary pod under another name, a
//!   label, an annotation or a stale ownerReference must not achieve against a pending or
//!   running worker, its own or another. The deletes CDS sends itself (its cleanup, its
//!   kill path) are its own decisions, which the guard filters: there the guard's answer
//!   rests on live pods, which the adversary can add (more denials) or delete (ending a
//!   worker: its right), and *no lost secret* is the contract.
//!
//!   The documented exception is the *name squat*. A pod's name is the worker's identity
//!   in Kubernetes: CDS names the pod after the worker. When the adversary creates the pod
//!   `<worker>` (using the worker's secret) before the hatchery does, Kubernetes cannot
//!   tell it from the worker's own pod: the secret may be adopted by it and deleted when it
//!   goes, exactly as for the real worker. If it is still there when the hatchery creates
//!   its pod, that create fails and the worker never runs (then it has ended anyway); if
//!   it went before, the worker's pod starts without its secret, which the adversary could
//!   have caused by deleting the worker's pod instead. Squatted workers are exempt from
//!   this property (not from *no lost secret*: a squat never makes the guard delete a
//!   secret under a live pod).
//! - **worker has its secret** (end to end, what CDS sees): a live pod that a hatchery
//!   created always finds its secret, unless the hatchery created the pod after the
//!   secret's grace period had passed (the one case a grace period cannot cover: the
//!   cleanup may rightly delete a secret no pod uses that is older than the grace period)
//!   or the worker's name was squatted.
//!
//! Liveness, under weak fairness of the system's actors (cleanup, garbage collector,
//! reconciler, kubelet, clock, replication, the guard's pod watch) while the environment
//! (hatcheries, pod lifecycle, adversary, the watch's failures) may stop at any point: every run of system steps alone is finite
//! (see `actors`), so every fair run ends in a *quiescent* state where no system actor can
//! step, and stays there. A property that must hold "eventually" holds in every such
//! state:
//!
//! - **no leak**: every worker secret whose worker has no pod left (named after it or
//!   labelled with it) is deleted;
//! - **adopted**: every live worker pod (named after a worker, carrying the worker label)
//!   whose spec references that worker's existing secret is an owner of it. The label is
//!   where the reconciler looks (its pod watch selects on it; labels say where to look,
//!   facts decide): a pod without it is never adopted, and its secret is then deleted by
//!   the cleanup once no live pod needs it. Every CDS worker pod carries the label, and the
//!   mutating webhook adds it to any pod using the secrets of exactly one worker.

use std::{
    collections::HashMap,
    hash::{DefaultHasher, Hash, Hasher},
};

use stateright::{Model, Property};

use crate::{
    actors::{Hatchery, State},
    guard::Requester,
    model::GuardModel,
    world::{Owner, SecretId, Uid, Worker},
};

pub const NO_LOST_SECRET: &str = "no lost secret";
pub const NO_CONFUSED_DEPUTY: &str = "no confused deputy";
pub const WORKER_HAS_ITS_SECRET: &str = "worker has its secret";
pub const NO_LEAK: &str = "no leak (quiescent)";
pub const ADOPTED: &str = "adopted (quiescent)";

/// Every property, with the examples that show the model is not vacuous.
pub fn all() -> Vec<Property<GuardModel>> {
    vec![
        Property::always(NO_LOST_SECRET, |_, s: &State| !s.ghost.lost),
        Property::always(NO_CONFUSED_DEPUTY, |_, s: &State| !s.ghost.deputy),
        Property::always(WORKER_HAS_ITS_SECRET, |_, s: &State| worker_has_its_secret(s)),
        Property::always(NO_LEAK, |m: &GuardModel, s: &State| no_leak(s) || !m.quiescent(s)),
        Property::always(ADOPTED, |m: &GuardModel, s: &State| adopted(s) || !m.quiescent(s)),
        // Examples: the race is in the model, and so is every path a secret can go by.
        Property::sometimes(STALE_LIST, |_, s: &State| stale_list_misses_live_pod(s)),
        Property::sometimes(OWNED, |_, s: &State| owned_by_its_pod(s)),
        Property::sometimes(CLEAN_END, |m: &GuardModel, s: &State| {
            m.workers().iter().all(|&w| s.hatcheries[w as usize] == Hatchery::Done)
                && Worker::ALL.into_iter().all(|w| s.now().secret(w.secret()).is_none())
                && m.quiescent(s)
        }),
    ]
}

pub const STALE_LIST: &str = "example: the cleanup's pod list misses a live worker pod";
pub const OWNED: &str = "example: a worker secret is owned by its pod";
pub const CLEAN_END: &str = "example: every worker ran and left nothing behind";

fn owned_by_its_pod(s: &State) -> bool {
    Worker::ALL.into_iter().any(|w| {
        s.now()
            .secret(w.secret())
            .is_some_and(|secret| secret.owners.contains(&hatchery_owner(w)))
    })
}

/// Deleting `id` now would delete it under a live pod of its worker that references it.
pub fn deletion_loses_secret(s: &State, id: SecretId) -> bool {
    let Some(w) = id.worker() else { return false };
    s.now().worker_pods(w).any(|(_, p)| p.is_live() && p.refs.contains(id))
}

/// Deleting `id` now, by `requester`, is beyond what the adversary may cause.
pub fn deletion_is_deputy(s: &State, id: SecretId, requester: Requester) -> bool {
    match id.worker() {
        None => true,
        Some(w) => requester == Requester::GarbageCollector && !s.ended(w) && !s.ghost.squatted.contains(w),
    }
}

fn worker_has_its_secret(s: &State) -> bool {
    Worker::ALL.into_iter().all(|w| {
        let running = s.hatcheries[w as usize] == Hatchery::PodCreated { slow: false }
            && s.now()
                .pod(w.pod())
                .is_some_and(|p| p.uid == Uid::Hatchery(w) && p.is_live());
        !running || s.now().secret(w.secret()).is_some() || s.ghost.squatted.contains(w)
    })
}

fn no_leak(s: &State) -> bool {
    Worker::ALL
        .into_iter()
        .all(|w| s.now().secret(w.secret()).is_none() || s.now().worker_pods(w).next().is_some())
}

fn adopted(s: &State) -> bool {
    Worker::ALL.into_iter().all(|w| {
        let Some(secret) = s.now().secret(w.secret()) else {
            return true;
        };
        s.now().pod(w.pod()).is_none_or(|pod| {
            let owner = Owner {
                name: w.pod(),
                uid: pod.uid,
            };
            let worker_pod = pod.is_live() && pod.worker_label.is_some() && pod.refs.contains(w.secret());
            !worker_pod || secret.owners.contains(&owner)
        })
    })
}

fn hatchery_owner(w: Worker) -> Owner {
    Owner {
        name: w.pod(),
        uid: Uid::Hatchery(w),
    }
}

fn stale_list_misses_live_pod(s: &State) -> bool {
    let crate::actors::CleanupRound::PodsListed(workers) = s.cleanup.round else {
        return false;
    };
    s.now()
        .pod(Worker::W1.pod())
        .is_some_and(|p| p.uid == Uid::Hatchery(Worker::W1) && p.is_live() && !workers.contains(Worker::W1))
}

// === impl GuardModel ===

impl GuardModel {
    /// No system actor can step: the end of every fair run that gets here.
    pub fn quiescent(&self, s: &State) -> bool {
        let mut actions = Vec::new();
        self.system_actions(s, &mut actions);
        actions.is_empty()
    }

    /// Checks what the liveness properties rest on: no cycle of system steps anywhere in
    /// the reachable graph, so from every state every run of system steps alone is finite
    /// and a fair run that the environment leaves alone does reach a quiescent state
    /// (otherwise "holds in every quiescent state" would prove nothing of the runs that
    /// never get there). Explores every reachable state once more, keeping fingerprints
    /// and the system steps between them, then peels off states with no system step into
    /// them (Kahn): what is left lies on a cycle.
    ///
    /// Returns the number of reachable states, or the number of states on a cycle or after one.
    pub fn system_steps_terminate(&self) -> Result<usize, usize> {
        let mut index: HashMap<u64, u32> = HashMap::new();
        let mut system_steps: Vec<Vec<u32>> = Vec::new();
        let mut todo: Vec<State> = Vec::new();
        let mut intern = |s: &State, system_steps: &mut Vec<Vec<u32>>| {
            let next = u32::try_from(index.len()).expect("fewer than 2^32 states");
            let mut new = false;
            let i = *index.entry(fingerprint(s)).or_insert_with(|| {
                new = true;
                system_steps.push(Vec::new());
                next
            });
            (i, new)
        };
        for s in self.init_states() {
            if intern(&s, &mut system_steps).1 {
                todo.push(s);
            }
        }
        let mut actions = Vec::new();
        while let Some(s) = todo.pop() {
            let (i, _) = intern(&s, &mut system_steps);
            actions.clear();
            self.actions(&s, &mut actions);
            for &action in &actions {
                let Some(next) = self.next_state(&s, action) else {
                    continue;
                };
                let (j, new) = intern(&next, &mut system_steps);
                if action.is_system() {
                    system_steps[i as usize].push(j);
                }
                if new {
                    todo.push(next);
                }
            }
        }
        let states = system_steps.len();
        let mut into = vec![0u32; states];
        for &j in system_steps.iter().flatten() {
            into[j as usize] += 1;
        }
        let mut free: Vec<usize> = (0..states).filter(|&i| into[i] == 0).collect();
        let mut peeled = 0;
        while let Some(i) = free.pop() {
            peeled += 1;
            for &j in &system_steps[i] {
                into[j as usize] -= 1;
                if into[j as usize] == 0 {
                    free.push(j as usize);
                }
            }
        }
        if peeled == states {
            Ok(states)
        } else {
            Err(states - peeled)
        }
    }
}

fn fingerprint(s: &State) -> u64 {
    let mut hasher = DefaultHasher::new();
    s.hash(&mut hasher);
    hasher.finish()
}
