//! The reconciler's watches of worker pods, as a cache for the decisions.
//!
//! A pod the cache shows live may justify a denial at once: the safe side. The cache may
//! also say which pods carry a worker's label, which an allow needs, but only once it has
//! caught up with a revision read by quorum after the request arrived
//! ([`crate::cluster::revision`]). Without that proof the label is read by quorum (a LIST, which
//! costs the apiserver a scan of the namespace's pods).

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use kube::runtime::{
    reflector::{self, ObjectRef, Store, store::Writer},
    watcher::Event,
};

use crate::{
    cluster::gate::{Gated, Index},
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
    /// The store's writer and the index, written together behind the gate's lock:
    /// whoever holds it sees both at one revision.
    gated: Gated<WorkerIndex>,
}

/// What the gate keeps of the worker pods: their names by worker, and the store.
struct WorkerIndex {
    writer: Writer<PodLiveness>,
    /// The pods as they were before the event being taken.
    pods: Store<PodLiveness>,
    names: WorkerNames,
}

/// Namespace → worker → the names of the pods labelled with it.
#[derive(Default)]
struct WorkerNames {
    names: HashMap<String, HashMap<String, Vec<String>>>,
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
            pods: pods.clone(),
            gated: Gated::new(WorkerIndex {
                writer,
                pods,
                names: WorkerNames::default(),
            }),
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
        self.gated.observe(event);
    }

    /// Whether the watch's events come often enough that waiting for the next is
    /// likely to be quicker than a LIST: the last two came within `within` of each
    /// other, the last one within `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        self.gated.is_busy(within)
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
        self.gated
            .at(revision, within, |index| {
                index
                    .names
                    .of(namespace, worker)
                    .iter()
                    .filter_map(|name| self.pods.get(&ObjectRef::new(name).within(namespace)))
                    .map(|pod| PodState::from(&*pod))
                    .collect()
            })
            .await
    }
}

// === impl WorkerIndex ===

impl Index for WorkerIndex {
    type Object = PodLiveness;
    type Relist = WorkerNames;
    type Change = ();

    fn apply(&mut self, pod: &PodLiveness, deleted: bool, _: &mut Vec<()>) {
        // The store still holds the pod as it was: its old worker, if relabelled.
        if let Some(old) = self.pods.get(&ObjectRef::from_obj(pod)) {
            self.names.remove(&old);
        }
        if !deleted {
            self.names.insert(pod);
        }
    }

    fn relist(relist: &mut WorkerNames, pod: &PodLiveness) {
        relist.insert(pod);
    }

    fn replace(&mut self, relist: WorkerNames, _: &mut Vec<()>) {
        self.names = relist;
    }

    fn observed(&mut self, event: &Event<PodLiveness>) {
        self.writer.apply_watcher_event(event);
    }
}

// === impl WorkerNames ===

impl WorkerNames {
    fn insert(&mut self, pod: &PodLiveness) {
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
