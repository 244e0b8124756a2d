//! The reconciler's watches of worker pods, as a cache for the decisions.
//!
//! A pod the cache shows live may justify a denial at once: the safe side. The cache may
//! also say which pods carry a worker's label, which an allow needs, but only once it has
//! caught up with a revision read by quorum after the request arrived
//! ([`crate::cluster::revision`]). Without that proof the label is read by quorum (a LIST, which
//! costs the apiserver a scan of the namespace's pods).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, RwLock},
    time::Duration,
};

use kube::runtime::{
    reflector::{self, ObjectRef, Store, store::Writer},
    watcher::Event,
};
use tokio::sync::watch;

use crate::{
    cluster::revision::{Progress, once_caught_up, parse_revision},
    rules::worker::pod::{PodLiveness, PodState},
};

/// The worker-labelled pods the reconciler's watches see: one [`PodWatch`] per watched
/// namespace, or one for all.
#[derive(Clone, Default)]
pub struct PodCache {
    watches: Arc<RwLock<Vec<Arc<PodWatch>>>>,
}

/// One watch's pods: the reconciler's store, an index of their names by worker, and the
/// revision both have caught up with.
pub struct PodWatch {
    /// The namespace watched, or `None` for all.
    scope: Option<String>,
    /// The worker label the watch selects on.
    label: String,
    /// The pods, as the reconciler reads them.
    pods: Store<PodLiveness>,
    /// The store's writer and the index, written together under this lock: whoever holds
    /// it sees both at one revision.
    state: Mutex<WatchState>,
    /// The revision, for the reads waiting for the watch to catch up.
    revision: watch::Sender<u64>,
}

struct WatchState {
    writer: Writer<PodLiveness>,
    names: WorkerNames,
    /// The index of a relist in progress, until it is done.
    relist: Option<WorkerNames>,
    /// Every change up to its revision is in the store and the index.
    progress: Progress,
}

/// Namespace → worker → the names of the pods labelled with it.
#[derive(Default)]
struct WorkerNames {
    names: HashMap<String, HashMap<String, Vec<String>>>,
    /// The newest revision among the pods.
    newest: u64,
}

// === impl PodCache ===

impl PodCache {
    /// Adds the watch of one scope (a namespace, or all) selecting on `label`, and
    /// returns it: the watch's events go to [`PodWatch::observe`], which keeps the store
    /// that [`PodWatch::store`] reads.
    pub fn add(&self, scope: Option<String>, label: &str) -> Arc<PodWatch> {
        let (pods, writer) = reflector::store();
        let watch = Arc::new(PodWatch {
            scope,
            label: label.to_owned(),
            pods,
            state: Mutex::new(WatchState {
                writer,
                names: WorkerNames::default(),
                relist: None,
                progress: Progress::default(),
            }),
            revision: watch::Sender::new(0),
        });
        self.watches
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(watch.clone());
        watch
    }

    /// The watch of `namespace` that selects on `label`, if there is one.
    pub fn watching(&self, namespace: &str, label: &str) -> Option<Arc<PodWatch>> {
        let watches = self.watches.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        watches
            .iter()
            .find(|watch| watch.label == label && watch.scope.as_deref().is_none_or(|scope| scope == namespace))
            .cloned()
    }

    /// The pod as last seen, if a watch saw it: a hint, never the proof of an absence.
    pub fn get(&self, namespace: &str, name: &str) -> Option<PodState> {
        let key = ObjectRef::new(name).within(namespace);
        let watches = self.watches.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        watches
            .iter()
            .find_map(|watch| watch.pods.get(&key))
            .map(|pod| PodState::from(&*pod))
    }
}

// === impl PodWatch ===

impl PodWatch {
    /// The store of the watch's pods, which [`PodWatch::observe`] keeps.
    pub fn store(&self) -> Store<PodLiveness> {
        self.pods.clone()
    }

    /// Takes one event of the watch, its worker label moved to [`PodLiveness::worker`].
    pub fn observe(&self, event: &Event<PodLiveness>) {
        let mut state = self.lock();
        match event {
            Event::Apply(pod) | Event::Delete(pod) => {
                // The store still holds the pod as it was: its old worker, if relabelled.
                if let Some(old) = self.pods.get(&ObjectRef::from_obj(pod)) {
                    state.names.remove(&old);
                }
                if matches!(event, Event::Apply(_)) {
                    state.names.insert(pod);
                }
                state.progress.advance(revision_of(pod));
            }
            Event::Init => state.relist = Some(WorkerNames::default()),
            Event::InitApply(pod) => {
                if let Some(relist) = state.relist.as_mut() {
                    relist.insert(pod);
                }
            }
            Event::InitDone => {
                if let Some(relist) = state.relist.take() {
                    // The list's own revision is not in the events; its newest pod's is
                    // no newer, so the claim stays true. It may be older than the last
                    // event's: a relist may be served from a lagging cache.
                    state.progress.revision = relist.newest;
                    state.names = relist;
                }
            }
        }
        state.writer.apply_watcher_event(event);
        // Waiting reads wake only when the revision moves, not for each pod of a relist.
        let revision = state.progress.revision;
        self.revision
            .send_if_modified(|seen| std::mem::replace(seen, revision) != revision);
    }

    /// Whether the watch's events come often enough that waiting for the next is
    /// likely to be quicker than a LIST: the last two came within `within` of each
    /// other, the last one within `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        self.lock().progress.is_busy(within)
    }

    /// The pods labelled with `worker` in `namespace`, once the watch has caught up with
    /// `revision`; `None` if it has not within `within`.
    pub async fn labelled_at(
        &self,
        revision: u64,
        namespace: &str,
        worker: &str,
        within: Duration,
    ) -> Option<Vec<PodState>> {
        once_caught_up(&self.revision, within, || {
            let state = self.lock();
            (state.progress.revision >= revision).then(|| {
                state
                    .names
                    .of(namespace, worker)
                    .iter()
                    .filter_map(|name| self.pods.get(&ObjectRef::new(name).within(namespace)))
                    .map(|pod| PodState::from(&*pod))
                    .collect()
            })
        })
        .await
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// === impl WorkerNames ===

impl WorkerNames {
    fn insert(&mut self, pod: &PodLiveness) {
        if let Some(revision) = revision_of(pod) {
            self.newest = self.newest.max(revision);
        }
        let (Some(namespace), Some(name), Some(worker)) = (&pod.metadata.namespace, &pod.metadata.name, &pod.worker)
        else {
            return;
        };
        let names = self
            .names
            .entry(namespace.clone())
            .or_default()
            .entry(worker.clone())
            .or_default();
        if !names.contains(name) {
            names.push(name.clone());
        }
    }

    fn remove(&mut self, pod: &PodLiveness) {
        let (Some(namespace), Some(name), Some(worker)) = (&pod.metadata.namespace, &pod.metadata.name, &pod.worker)
        else {
            return;
        };
        let Some(workers) = self.names.get_mut(namespace) else {
            return;
        };
        if let Some(names) = workers.get_mut(worker) {
            names.retain(|kept| kept != name);
            if names.is_empty() {
                workers.remove(worker);
            }
        }
        if workers.is_empty() {
            self.names.remove(namespace);
        }
    }

    fn of(&self, namespace: &str, worker: &str) -> &[String] {
        self.names
            .get(namespace)
            .and_then(|workers| workers.get(worker))
            .map_or(&[], Vec::as_slice)
    }
}

fn revision_of(pod: &PodLiveness) -> Option<u64> {
    parse_revision(pod.metadata.resource_version.as_deref())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const LABEL: &str = "CDS_WORKER_NAME";

    fn pod(name: &str, worker: &str, revision: u64) -> PodLiveness {
        let mut pod = PodLiveness::default();
        pod.metadata.name = Some(name.to_owned());
        pod.metadata.namespace = Some("cds".to_owned());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod.metadata.resource_version = Some(revision.to_string());
        pod.worker = Some(worker.to_owned());
        pod
    }

    fn names(pods: Option<Vec<PodState>>) -> Option<Vec<String>> {
        pods.map(|pods| pods.into_iter().map(|pod| pod.name).collect())
    }

    const NOW: Duration = Duration::ZERO;

    #[tokio::test]
    async fn answers_once_caught_up_with_the_revision_and_not_before() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        watch.observe(&Event::Apply(pod("runner", "w1", 10)));

        assert_eq!(
            names(watch.labelled_at(10, "cds", "w1", NOW).await),
            Some(vec!["runner".into()])
        );
        assert_eq!(
            watch.labelled_at(11, "cds", "w1", NOW).await,
            None,
            "not caught up: no answer"
        );
        assert_eq!(names(watch.labelled_at(10, "cds", "w2", NOW).await), Some(vec![]));
        assert_eq!(names(watch.labelled_at(10, "other", "w1", NOW).await), Some(vec![]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_read_is_answered_by_the_next_event() {
        let cache = PodCache::default();
        let watch = cache.add(Some("cds".into()), LABEL);
        watch.observe(&Event::Apply(pod("runner", "w1", 10)));

        let read = tokio::spawn({
            let watch = watch.clone();
            async move { watch.labelled_at(12, "cds", "w1", Duration::from_millis(50)).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The pod is deleted at revision 12: the read waiting for 12 sees it gone.
        watch.observe(&Event::Delete(pod("runner", "w1", 12)));

        assert_eq!(names(read.await.unwrap()), Some(vec![]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_does_not_catch_up_in_time_gives_no_answer() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        watch.observe(&Event::Apply(pod("runner", "w1", 10)));

        let read = watch.labelled_at(11, "cds", "w1", Duration::from_millis(50));

        assert_eq!(read.await, None);
    }

    #[tokio::test]
    async fn a_relabelled_pod_moves_to_its_new_worker() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        watch.observe(&Event::Apply(pod("runner", "w1", 10)));
        watch.observe(&Event::Apply(pod("runner", "w2", 11)));

        assert_eq!(names(watch.labelled_at(11, "cds", "w1", NOW).await), Some(vec![]));
        assert_eq!(
            names(watch.labelled_at(11, "cds", "w2", NOW).await),
            Some(vec!["runner".into()])
        );
        assert_eq!(cache.get("cds", "runner").map(|pod| pod.uid), Some("uid-runner".into()));
        assert_eq!(cache.get("cds", "other"), None);
    }

    #[tokio::test]
    async fn a_relist_replaces_the_pods_and_claims_only_its_newest_revision() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        watch.observe(&Event::Apply(pod("old", "w1", 20)));

        watch.observe(&Event::Init);
        watch.observe(&Event::InitApply(pod("new", "w1", 15)));
        assert_eq!(
            names(watch.labelled_at(20, "cds", "w1", NOW).await),
            Some(vec!["old".into()]),
            "until the relist is done, the pods it replaces stand"
        );
        watch.observe(&Event::InitDone);

        assert_eq!(
            watch.labelled_at(20, "cds", "w1", NOW).await,
            None,
            "a relist served from a lagging cache proves nothing past its newest pod"
        );
        assert_eq!(
            names(watch.labelled_at(15, "cds", "w1", NOW).await),
            Some(vec!["new".into()])
        );
    }

    #[test]
    fn busy_once_its_events_come_close_together() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        let within = Duration::from_secs(60);
        watch.observe(&Event::Apply(pod("a", "w1", 1)));
        assert!(!watch.is_busy(within), "one event: no pace yet");
        watch.observe(&Event::Apply(pod("b", "w1", 2)));
        assert!(watch.is_busy(within));
    }

    #[test]
    fn a_watch_serves_its_namespace_and_label_only() {
        let cache = PodCache::default();
        cache.add(Some("cds".into()), LABEL);
        assert!(cache.watching("cds", LABEL).is_some());
        assert!(cache.watching("other", LABEL).is_none());
        assert!(cache.watching("cds", "team").is_none());
        cache.add(None, LABEL);
        assert!(cache.watching("other", LABEL).is_some());
    }
}
