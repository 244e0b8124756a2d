//! The guard's pod watch (`src/rules/worker/watch.rs`): the reconciler's watch of the pods that
//! carry the worker label, which the decisions use as a cache. Its store gives the deny
//! hint (a live pod it shows may deny at once); its label index may stand in for the label
//! LIST, but only once the watch has caught up with a revision read by quorum (the
//! revision gate).
//!
//! The watch is an ordered stream of the selected pods' events: every write that creates,
//! changes or removes a worker-labelled pod appends one event, and the watch delivers them
//! in order, at its own pace (a system step). A relist (an environment step: the watch
//! failed, e.g. 410 Gone, and lists again) LISTs the selected pods at any revision from the
//! watch's own to the current one, drops the events the list covers, hands the listed pods
//! over (`InitApply`), and replaces store and index when it is done (`InitDone`); the
//! events after the list's revision are delivered after that. Until then the real watch
//! shows its old store and index and keeps its old claim, so the handing over is one step
//! with the end of the relist, except for the broken [`Lookup::EarlyRelistClaim`], whose
//! index fills one pod per step. The watch may relist at any time, any number of times.
//! It is at most `lag` writes behind, relist included: the events it has yet to deliver
//! are those of the last `lag` writes (of any object); a write that would leave an older
//! one undelivered first ends the relist, then delivers it.
//!
//! Revisions. The model keeps no absolute revision (see `world`); what the gate compares
//! is kept as one fact: whether the revision the watch claims (every change up to it is in
//! its store and index) is the store's current revision. A decision and its reads are one
//! step in this model, so the revision a quorum read returns during a decision is the
//! current one, and the gate lets the index answer exactly when the claim is current. The
//! claim follows `PodWatch::observe`: an event claims its own revision, so the claim
//! becomes current when the watch delivers the event of the store's latest write, and
//! stays so until the next write (of any object); a relist claims its newest listed pod's
//! revision when it is done, which is current only if the list is current and the store's
//! latest write created or changed one of the listed pods. Whenever the gate is open the
//! model's lookup answers from the index; the server may still LIST (a watch that is not
//! busy), which reads the same pods then. The checks below replay random runs of the
//! model into the real `PodWatch`, with the revisions the model leaves out, and compare.

use crate::{
    variants::Lookup,
    world::{Pod, PodName, Slot, Snapshot},
};

/// One event of the stream: the pod after the change, or `None` when it is gone (or no
/// longer selected).
pub type Event = (PodName, Option<Pod>);

/// One write the watch has yet to pass: its event, or `None` if it made none.
pub type Pending = Option<Event>;

/// What the watch holds. Only worker-labelled pods are in it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Watch {
    /// The pods its store (and, outside a relist, its index) shows.
    pub shown: [Option<Pod>; 3],
    /// The writes since the oldest event not yet delivered, oldest first (so the first
    /// has an event); during a relist, those after the list.
    pub stream: Vec<Pending>,
    pub relist: Option<Relist>,
    /// Its claimed revision is the store's current one (see the module's note).
    pub current: bool,
    /// The store's latest write, as far as the watch's claims can tell.
    pub latest: Latest,
    /// The configured lookup is [`Lookup::EarlyRelistClaim`] (the same in every state).
    pub early_claim: bool,
}

/// The store's latest write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Latest {
    /// It made no event of the watch (a secret, a pod without the worker label).
    Unwatched,
    /// It removed a selected pod: no pod carries its revision.
    Removed,
    /// It created or changed a selected pod, which now carries its revision.
    Applied,
}

/// A relist under way.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Relist {
    /// The pods the LIST returned.
    pub listed: [Option<Pod>; 3],
    /// How many of them the watch has handed over (`InitApply`), in slot order.
    pub handed: u8,
    /// The newest listed pod carries the store's current revision.
    pub newest_current: bool,
}

/// Whether the watch selects this pod (its label selector: the worker label exists).
pub fn selected(pod: &Pod) -> bool {
    pod.worker_label.is_some()
}

/// The watch's event for one write, if the write changed a selected pod (a write changes
/// at most one pod).
pub fn event(before: &Snapshot, after: &Snapshot) -> Option<Event> {
    PodName::ALL.into_iter().find_map(|name| {
        let was = before.pod(name).filter(|p| selected(p));
        let is = after.pod(name).filter(|p| selected(p));
        (was != is).then(|| (name, is.cloned()))
    })
}

impl Watch {
    /// A watch that has listed the empty namespace: it shows nothing and claims no
    /// revision a quorum read could return.
    pub fn new(lookup: Lookup) -> Self {
        Self {
            shown: Default::default(),
            stream: Vec::new(),
            relist: None,
            current: false,
            latest: Latest::Unwatched,
            early_claim: lookup == Lookup::EarlyRelistClaim,
        }
    }

    /// One write to the store, with its event if it made one.
    pub fn write(&mut self, event: Option<Event>, lag: usize) {
        // A new revision: no claim reaches it yet.
        self.current = false;
        if let Some(relist) = &mut self.relist {
            relist.newest_current = false;
        }
        self.latest = match &event {
            None => Latest::Unwatched,
            Some((_, Some(_))) => Latest::Applied,
            Some((_, None)) => Latest::Removed,
        };
        if event.is_some() || !self.stream.is_empty() {
            self.stream.push(event);
        }
        if self.stream.len() > lag {
            if self.relist.is_some() {
                while self.relist_handed_all() == Some(false) {
                    self.init_apply();
                }
                self.init_done();
            }
            self.deliver();
        }
    }

    /// Delivers the oldest event: `Event::Apply` or `Event::Delete`, which claims the
    /// event's revision.
    pub fn deliver(&mut self) -> Event {
        let (name, pod) = self.stream.remove(0).expect("the stream starts with an event");
        self.shown[name.index()] = pod.clone();
        self.trim();
        // It carries the store's current revision if no write came after it.
        self.current = self.stream.is_empty() && self.latest != Latest::Unwatched;
        (name, pod)
    }

    /// Events not yet delivered.
    pub fn undelivered(&self) -> usize {
        self.stream.iter().flatten().count()
    }

    /// Drops the writes before the oldest undelivered event: nothing is left to deliver of
    /// them.
    fn trim(&mut self) {
        let start = self
            .stream
            .iter()
            .position(Option::is_some)
            .unwrap_or(self.stream.len());
        self.stream.drain(..start);
    }

    /// Starts a relist whose LIST sees the first `covered` writes of the stream (all of
    /// them: a current list). The real watch claims nothing yet and keeps its store and
    /// index; `Lookup::EarlyRelistClaim` claims the list's revision at once.
    pub fn relist(&mut self, covered: usize) {
        let mut listed = self.shown.clone();
        let rest = self.stream.split_off(covered);
        let list_current = rest.is_empty();
        for (name, pod) in self.stream.drain(..).flatten() {
            listed[name.index()] = pod;
        }
        self.stream = rest;
        self.trim();
        let mut relist = Relist {
            listed,
            handed: 0,
            newest_current: list_current && self.latest == Latest::Applied,
        };
        if !self.early_claim {
            // Nothing shows the real watch's handing over: it is one step with its end.
            relist.handed = relist.listed_names().count() as u8;
        }
        self.relist = Some(relist);
        if self.early_claim {
            // The list's own revision: current when the list is.
            self.current = list_current;
        }
    }

    /// The relist hands over its next pod (`Event::InitApply`); returns its name.
    pub fn init_apply(&mut self) -> PodName {
        let relist = self.relist.as_mut().expect("offered during a relist");
        let name = relist
            .listed_names()
            .nth(usize::from(relist.handed))
            .expect("offered while a listed pod is left");
        relist.handed += 1;
        name
    }

    /// The relist is done (`Event::InitDone`): its pods replace the store and the index,
    /// and it claims its newest pod's revision.
    pub fn init_done(&mut self) {
        let relist = self.relist.take().expect("offered during a relist");
        self.shown = relist.listed;
        if !self.early_claim {
            self.current = relist.newest_current;
        }
    }

    /// Whether the relist has handed over every listed pod.
    pub fn relist_handed_all(&self) -> Option<bool> {
        self.relist
            .as_ref()
            .map(|r| usize::from(r.handed) == r.listed_names().count())
    }

    /// The label index, when the configured lookup lets it answer a label read now;
    /// `None`: the label is read by a quorum LIST.
    pub fn index_for_label_read(&self, lookup: Lookup) -> Option<[Option<Pod>; 3]> {
        match lookup {
            // `labelled_at(R)` with R read by quorum: the claim must reach it.
            Lookup::Server => self.current.then(|| self.shown.clone()),
            // No gate, or one that waits for the watch's own revision: it always passes.
            Lookup::Ungated | Lookup::OwnRevision => Some(self.shown.clone()),
            // The index is the relist's, filled as its pods are handed over.
            Lookup::EarlyRelistClaim => self.current.then(|| match &self.relist {
                Some(relist) => relist.handed_pods(),
                None => self.shown.clone(),
            }),
        }
    }

    /// Forgets what no later step reads: which write was the latest, once no undelivered
    /// event and no relist to come can carry its revision.
    pub fn normalize(&mut self, relists: bool) {
        // With no event left, only a relist to come reads it, and only to ask whether it
        // is `Applied`.
        if self.stream.is_empty() && (!relists || self.latest == Latest::Removed) {
            self.latest = Latest::Unwatched;
        }
    }
}

impl Relist {
    /// The listed pods' names, in the order the relist hands them over.
    pub fn listed_names(&self) -> impl Iterator<Item = PodName> + '_ {
        PodName::ALL
            .into_iter()
            .filter(|name| self.listed[name.index()].is_some())
    }

    /// The listed pods handed over so far.
    fn handed_pods(&self) -> [Option<Pod>; 3] {
        let mut pods: [Option<Pod>; 3] = Default::default();
        for name in self.listed_names().take(usize::from(self.handed)) {
            pods[name.index()] = self.listed[name.index()].clone();
        }
        pods
    }
}

/// The model's watch against the real one: random runs of the model, replayed into
/// `src/rules/worker/watch.rs`'s `PodWatch` with the revisions the model leaves out, must agree at
/// every step on what the watch's store shows (the deny hint), on whether the gate lets the
/// index answer a read at the current revision, and on what the index answers then.
#[cfg(test)]
mod checks {
    use std::{sync::Arc, time::Duration};

    use cds_secret_guard::{
        rules::worker::pod::{PhasePart, PodLiveness},
        rules::worker::watch::{PodCache, PodWatch},
    };
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use kube::runtime::watcher::Event as Observed;
    use stateright::Model;

    use super::*;
    use crate::{
        actors::{Action, State},
        model::{Bounds, Catalogue, GuardModel, Variant},
        variants::Cleanup,
        world::{NAMESPACE, WORKER_LABEL, Worker},
    };

    /// etcd as the real watch sees it.
    struct Etcd {
        revision: u64,
        /// The selected pods' events, with their revisions, in order.
        log: Vec<(u64, Event)>,
        /// The events of `log` the real watch has had or a relist covered.
        next: usize,
        /// The listed pods a relist has yet to hand over.
        listed: Vec<PodLiveness>,
    }

    /// What the runs went through, to show they reach what matters.
    #[derive(Default, Debug)]
    struct Seen {
        index_answers: usize,
        index_finds_a_pod: usize,
        stale_hints: usize,
        stale_relists: usize,
        relists_done: usize,
    }

    fn liveness(name: PodName, pod: &Pod, revision: u64) -> PodLiveness {
        let mut live = PodLiveness::default();
        live.metadata.name = Some(name.name().to_owned());
        live.metadata.namespace = Some(NAMESPACE.to_owned());
        live.metadata.uid = Some(pod.uid.text());
        live.metadata.resource_version = Some(revision.to_string());
        live.metadata.deletion_timestamp = pod.terminating.then_some(Time(Timestamp::UNIX_EPOCH));
        live.status = Some(PhasePart {
            phase: Some(format!("{:?}", pod.phase)),
        });
        live.worker = pod.worker_label.map(|w| w.name().to_owned());
        live
    }

    impl Etcd {
        /// The pod of slot `name` as of `log[..upto]`, with its revision.
        fn pod_at(&self, name: PodName, upto: usize) -> Option<(u64, &Pod)> {
            self.log[..upto]
                .iter()
                .rev()
                .find(|(_, (n, _))| *n == name)
                .and_then(|(rev, (_, pod))| pod.as_ref().map(|p| (*rev, p)))
        }

        /// Feeds `watch` what the model's step from `s` to `next` did.
        fn replay(&mut self, watch: &PodWatch, s: &State, action: Action, next: &State, seen: &mut Seen) {
            let mut appended = 0;
            if s.now() != next.now() {
                self.revision += 1;
                if let Some(event) = event(s.now(), next.now()) {
                    self.log.push((self.revision, event));
                    appended = 1;
                }
            }
            match action {
                Action::WatchRelist(covered) => {
                    let covered = usize::from(covered);
                    let upto = self.next + s.watch.stream[..covered].iter().flatten().count();
                    if covered < s.watch.stream.len() {
                        seen.stale_relists += 1;
                    }
                    watch.observe(&Observed::Init);
                    self.listed = PodName::ALL
                        .into_iter()
                        .filter_map(|name| self.pod_at(name, upto).map(|(rev, pod)| liveness(name, pod, rev)))
                        .collect();
                    self.next = upto;
                    return;
                }
                Action::WatchInitApply => {
                    watch.observe(&Observed::InitApply(self.listed.remove(0)));
                    return;
                }
                _ => {}
            }
            if s.watch.relist.is_some() && next.watch.relist.is_none() {
                // Done, in its own step or ended by a write.
                for pod in self.listed.drain(..) {
                    watch.observe(&Observed::InitApply(pod));
                }
                watch.observe(&Observed::InitDone);
                seen.relists_done += 1;
            }
            let delivered = s.watch.undelivered() + appended - next.watch.undelivered();
            for _ in 0..delivered {
                let (rev, (name, pod)) = self.log[self.next].clone();
                let observed = match pod {
                    Some(pod) => Observed::Apply(liveness(name, &pod, rev)),
                    None => {
                        let (_, last) = self.pod_at(name, self.next).expect("a removed pod existed");
                        Observed::Delete(liveness(name, last, rev))
                    }
                };
                watch.observe(&observed);
                self.next += 1;
            }
        }
    }

    /// The real watch and the model's agree in state `s`.
    fn agree(
        rt: &tokio::runtime::Runtime,
        cache: &PodCache,
        watch: &PodWatch,
        etcd: &Etcd,
        s: &State,
        seen: &mut Seen,
    ) {
        for name in PodName::ALL {
            let real = cache
                .get(NAMESPACE, name.name())
                .map(|pod| (pod.uid.clone(), pod.is_live()));
            let model = s.watch.shown[name.index()]
                .as_ref()
                .map(|pod| (pod.uid.text(), pod.is_live()));
            assert_eq!(real, model, "the hint for pod {}, in {s:#?}", name.name());
            if model
                != s.now()
                    .pod(name)
                    .filter(|p| selected(p))
                    .map(|p| (p.uid.text(), p.is_live()))
            {
                seen.stale_hints += 1;
            }
        }
        let index = s.watch.index_for_label_read(Lookup::Server);
        for w in Worker::ALL {
            let real = rt
                .block_on(watch.labelled_at(etcd.revision, NAMESPACE, w.name(), Duration::ZERO))
                .map(|pods| {
                    let mut names: Vec<String> = pods.into_iter().map(|pod| pod.name).collect();
                    names.sort();
                    names
                });
            let model = index.as_ref().map(|index| {
                let mut names: Vec<String> = PodName::ALL
                    .into_iter()
                    .filter(|n| index[n.index()].as_ref().is_some_and(|p| p.worker_label == Some(w)))
                    .map(|n| n.name().to_owned())
                    .collect();
                names.sort();
                names
            });
            assert_eq!(real, model, "the label read of {}, in {s:#?}", w.name());
            if let Some(names) = model {
                seen.index_answers += 1;
                if !names.is_empty() {
                    seen.index_finds_a_pod += 1;
                }
            }
        }
    }

    /// A small, seeded generator (splitmix64): the same runs every time.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % n as u64) as usize
        }
    }

    #[test]
    fn the_watch_claims_and_shows_what_the_real_pod_watch_does() {
        let bounds = Bounds {
            workers: 2,
            k: 1,
            cache_k: 1,
            grace_ticks: 1,
            client_grace_ticks: 1,
            adversary_pods: 3,
            reconcilers: 1,
            watch_lag: 2,
            relists: true,
            catalogue: Catalogue::Representative,
        };
        let model = GuardModel::new(bounds, Variant::real(Cleanup::AfterFix));
        // Paused time: a read the watch cannot answer gives up at once.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let mut rng = Rng(21);
        let mut seen = Seen::default();
        let mut actions = Vec::new();
        for _ in 0..500 {
            let cache = PodCache::default();
            let watch: Arc<PodWatch> = cache.add(Some(NAMESPACE.to_owned()), WORKER_LABEL);
            let mut etcd = Etcd {
                revision: 1,
                log: Vec::new(),
                next: 0,
                listed: Vec::new(),
            };
            let mut s = model.init_states().remove(0);
            agree(&rt, &cache, &watch, &etcd, &s, &mut seen);
            for _ in 0..60 {
                actions.clear();
                model.actions(&s, &mut actions);
                if actions.is_empty() {
                    break;
                }
                let action = actions[rng.below(actions.len())];
                let Some(next) = model.next_state(&s, action) else {
                    continue;
                };
                etcd.replay(&watch, &s, action, &next, &mut seen);
                agree(&rt, &cache, &watch, &etcd, &next, &mut seen);
                s = next;
            }
        }
        println!("{seen:?}");
        assert!(seen.index_finds_a_pod > 0 && seen.stale_hints > 0, "{seen:?}");
        assert!(seen.stale_relists > 0 && seen.relists_done > 0, "{seen:?}");
    }
}
