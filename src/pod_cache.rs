//! The reconciler's watches of worker pods, as a cache for the decisions.
//!
//! A pod the cache shows live may justify a denial at once: the safe side. The cache may
//! also say which pods carry a worker's label, which an allow needs, but only once it has
//! caught up with a revision read by quorum after the request arrived: the technique the
//! apiserver uses for consistent reads from its own watch cache. A watch delivers its
//! events in revision order, so a watch that has delivered an event at revision R or later
//! shows every change to its pods up to R. Without that proof the label is read by quorum
//! (a LIST, which costs the apiserver a scan of the namespace's pods).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, MutexGuard, RwLock},
    time::Duration,
};

use kube::runtime::watcher::Event;
use tokio::{sync::watch, time::Instant};

use crate::{lookup::PodState, pod::PodLiveness};

/// The worker-labelled pods the reconciler's watches see: one [`PodWatch`] per watched
/// namespace, or one for all.
#[derive(Clone, Default)]
pub struct PodCache {
    watches: Arc<RwLock<Vec<Arc<PodWatch>>>>,
}

/// One watch's pods, indexed by worker, and the revision the watch has caught up with.
pub struct PodWatch {
    /// The namespace watched, or `None` for all.
    scope: Option<String>,
    /// The worker label the watch selects on.
    label: String,
    index: Mutex<Index>,
    /// The index's revision, for the reads waiting for it to catch up.
    revision: watch::Sender<u64>,
}

#[derive(Default)]
struct Index {
    pods: Pods,
    /// The pods of a relist in progress, until it is done.
    relist: Option<Pods>,
    /// Every change up to this revision is in `pods`.
    revision: u64,
    /// When the last two events came: how soon the next may come.
    last_event: Option<Instant>,
    gap: Option<Duration>,
}

#[derive(Default)]
struct Pods {
    /// (namespace, worker) → the worker's pods, by name.
    by_worker: HashMap<(String, String), BTreeMap<String, PodState>>,
    /// (namespace, pod name) → the worker it is labelled with.
    worker_of: HashMap<(String, String), String>,
    /// The newest revision among the pods.
    newest: u64,
}

// === impl PodCache ===

impl PodCache {
    /// Adds the watch of one scope (a namespace, or all) selecting on `label`, and
    /// returns it: the watch's events go to [`PodWatch::observe`].
    pub fn add(&self, scope: Option<String>, label: &str) -> Arc<PodWatch> {
        let watch = Arc::new(PodWatch {
            scope,
            label: label.to_owned(),
            index: Mutex::default(),
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
        let watches = self.watches.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        watches.iter().find_map(|watch| watch.lock().pods.get(namespace, name))
    }
}

// === impl PodWatch ===

impl PodWatch {
    /// Takes one event of the watch, after the reconciler's store has.
    pub fn observe(&self, event: &Event<PodLiveness>) {
        let mut index = self.lock();
        match event {
            Event::Apply(pod) => {
                index.pods.put(&self.label, pod);
                index.advance(pod);
            }
            Event::Delete(pod) => {
                index.pods.remove(pod);
                index.advance(pod);
            }
            Event::Init => index.relist = Some(Pods::default()),
            Event::InitApply(pod) => {
                if let Some(relist) = index.relist.as_mut() {
                    relist.put(&self.label, pod);
                }
            }
            Event::InitDone => {
                if let Some(relist) = index.relist.take() {
                    // The list's own revision is not in the events; its newest pod's is
                    // no newer, so the claim stays true. It may be older than the last
                    // event's: a relist may be served from a lagging cache.
                    index.revision = relist.newest;
                    index.pods = relist;
                }
            }
        }
        self.revision.send_replace(index.revision);
    }

    /// Whether the watch's events come often enough that waiting for the next is
    /// likely to be quicker than a LIST: the last two came within `within` of each
    /// other, the last one within `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        let index = self.lock();
        index
            .last_event
            .is_some_and(|last| last.elapsed() <= within && index.gap.is_some_and(|gap| gap <= within))
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
        let deadline = Instant::now() + within;
        // Subscribed before the first look: no change between the two is missed.
        let mut changes = self.revision.subscribe();
        loop {
            {
                let index = self.lock();
                if index.revision >= revision {
                    return Some(index.pods.labelled(namespace, worker));
                }
            }
            tokio::time::timeout_at(deadline, changes.changed()).await.ok()?.ok()?;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// === impl Index ===

impl Index {
    fn advance(&mut self, pod: &PodLiveness) {
        if let Some(revision) = revision_of(pod) {
            self.revision = self.revision.max(revision);
        }
        let now = Instant::now();
        self.gap = self.last_event.map(|last| now - last);
        self.last_event = Some(now);
    }
}

// === impl Pods ===

impl Pods {
    fn put(&mut self, label: &str, pod: &PodLiveness) {
        self.remove(pod);
        let (Some(namespace), Some(name), Some(worker)) = (
            pod.metadata.namespace.as_ref(),
            pod.metadata.name.as_ref(),
            pod.label(label),
        ) else {
            return;
        };
        self.worker_of
            .insert((namespace.clone(), name.clone()), worker.to_owned());
        self.by_worker
            .entry((namespace.clone(), worker.to_owned()))
            .or_default()
            .insert(name.clone(), PodState::from(pod));
        if let Some(revision) = revision_of(pod) {
            self.newest = self.newest.max(revision);
        }
    }

    fn remove(&mut self, pod: &PodLiveness) {
        let (Some(namespace), Some(name)) = (pod.metadata.namespace.as_ref(), pod.metadata.name.as_ref()) else {
            return;
        };
        let Some(worker) = self.worker_of.remove(&(namespace.clone(), name.clone())) else {
            return;
        };
        let key = (namespace.clone(), worker);
        if let Some(pods) = self.by_worker.get_mut(&key) {
            pods.remove(name);
            if pods.is_empty() {
                self.by_worker.remove(&key);
            }
        }
    }

    fn get(&self, namespace: &str, name: &str) -> Option<PodState> {
        let worker = self.worker_of.get(&(namespace.to_owned(), name.to_owned()))?;
        self.by_worker
            .get(&(namespace.to_owned(), worker.clone()))?
            .get(name)
            .cloned()
    }

    fn labelled(&self, namespace: &str, worker: &str) -> Vec<PodState> {
        self.by_worker
            .get(&(namespace.to_owned(), worker.to_owned()))
            .map(|pods| pods.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// A resourceVersion as the revision it is (etcd's); `None` if it is not one.
pub fn parse_revision(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
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
        pod.metadata.labels = Some([(LABEL.to_owned(), worker.to_owned())].into());
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
    fn busy_only_while_events_come_close_together() {
        let cache = PodCache::default();
        let watch = cache.add(None, LABEL);
        let within = Duration::from_secs(60);
        assert!(!watch.is_busy(within), "no event yet");
        watch.observe(&Event::Apply(pod("a", "w1", 1)));
        assert!(!watch.is_busy(within), "one event: no pace yet");
        watch.observe(&Event::Apply(pod("b", "w1", 2)));
        assert!(watch.is_busy(within));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!watch.is_busy(Duration::from_millis(1)), "the last event is too old");
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

    #[test]
    fn revisions_are_etcd_revisions_or_nothing() {
        assert_eq!(parse_revision(Some("1234")), Some(1234));
        assert_eq!(parse_revision(Some("not-a-number")), None);
        assert_eq!(parse_revision(None), None);
    }
}
