//! The worker pods one watch shows, indexed by their worker label, and the revision up to
//! which the watch is known to have shown every change.
//!
//! Rule 5 needs the live pods labelled with a worker. The apiserver indexes pods by name,
//! not by label: a LIST by label scans every pod of the namespace in its watch cache
//! (about 0.35 µs a pod, 5 ms with 10,000 of them). The reconciler's watch of worker pods
//! holds the same answer, but a watch is a cache, and a cache may only say "no such pod"
//! once it is proven current: once it has shown every change up to a revision that a
//! quorum read returned after the request arrived. That is how the apiserver serves
//! consistent reads from its own watch cache.
//!
//! A watch proves its progress only through its events (kube-rs keeps bookmarks to itself,
//! and the apiserver sends them once a minute), so the index answers where worker pods
//! change often, which is where the load is; a quiet watch is not waited for, and the
//! caller falls back to the label LIST.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
    time::Duration,
};

use kube::runtime::{
    reflector::{ObjectRef, Store},
    watcher,
};
use tokio::{sync::watch, time::Instant};

use crate::{lookup::PodState, pod::PodLiveness};

/// How recent the watch's last event must be for a reader to wait for the next ones.
const MOVING: Duration = Duration::from_millis(100);

/// How long a reader waits for the watch to catch up before it reads from the apiserver.
const CATCH_UP: Duration = Duration::from_millis(20);

/// One watch's worker pods: its reflector store, and its pods' names by worker label.
pub struct WatchedPods {
    /// The watched namespace, or `None` for all.
    namespace: Option<String>,
    /// The label the watch selects on, whose values the index is keyed by.
    label: String,
    store: Store<PodLiveness>,
    index: Mutex<Indexes>,
    progress: watch::Sender<Progress>,
}

/// What the index has seen of the watch.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Every change up to this revision is in the index (0: none known yet).
    revision: u64,
    /// When the last event arrived.
    last_event: Option<Instant>,
}

#[derive(Default)]
struct Indexes {
    /// What the index answers from.
    current: ByWorker,
    /// A relist in progress, and the highest revision among the pods it listed.
    relisting: Option<(ByWorker, u64)>,
}

/// Pod names by namespace and worker label value.
#[derive(Default)]
struct ByWorker {
    pods: HashMap<(String, String), BTreeSet<String>>,
    /// The worker of each pod, by namespace and name, to move it when its label changes.
    workers: HashMap<(String, String), String>,
}

// === impl WatchedPods ===

impl WatchedPods {
    /// The index of a watch of pods carrying `label`, in `namespace` (all when `None`),
    /// whose reflector writes `store`.
    pub fn new(store: Store<PodLiveness>, namespace: Option<String>, label: &str) -> Self {
        Self {
            namespace,
            label: label.to_owned(),
            store,
            index: Mutex::default(),
            progress: watch::Sender::new(Progress::default()),
        }
    }

    /// Takes in one event of the watch, after its reflector has applied it to the store.
    /// The progress is updated under the index's lock: a reader that sees a revision
    /// finds an index at least that current.
    pub fn observe(&self, event: &watcher::Event<PodLiveness>) {
        let now = Instant::now();
        let mut index = self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match event {
            watcher::Event::Apply(pod) => {
                index.current.insert(&self.label, pod);
                self.shown(revision(pod), now);
            }
            watcher::Event::Delete(pod) => {
                index.current.remove(pod);
                self.shown(revision(pod), now);
            }
            watcher::Event::Init => index.relisting = Some((ByWorker::default(), 0)),
            watcher::Event::InitApply(pod) => {
                if let Some((listed, highest)) = &mut index.relisting {
                    listed.insert(&self.label, pod);
                    *highest = (*highest).max(revision(pod).unwrap_or(0));
                }
            }
            watcher::Event::InitDone => {
                if let Some((listed, highest)) = index.relisting.take() {
                    index.current = listed;
                    // The list was read at a revision at least as high as its newest pod's,
                    // which may be lower than what the previous watch had shown (a lagging
                    // apiserver): the progress is set, not raised.
                    self.progress.send_modify(|progress| {
                        progress.revision = highest;
                        progress.last_event = Some(now);
                    });
                }
            }
        }
    }

    /// A change at `revision` is in the index: every change before it is too, as a watch
    /// delivers them in order. A revision that is not a number only leaves the progress
    /// behind the index (the safe side).
    fn shown(&self, revision: Option<u64>, now: Instant) {
        self.progress.send_modify(|progress| {
            progress.revision = progress.revision.max(revision.unwrap_or(0));
            progress.last_event = Some(now);
        });
    }

    /// Whether this watch sees `label` in `namespace`.
    pub fn covers(&self, namespace: &str, label: &str) -> bool {
        self.label == label && self.namespace.as_deref().is_none_or(|watched| watched == namespace)
    }

    /// The pod as last seen, if the watch saw it.
    pub fn get(&self, namespace: &str, name: &str) -> Option<PodState> {
        let pod = self.store.get(&ObjectRef::new(name).within(namespace))?;
        Some(PodState::from(&*pod))
    }

    /// The pods labelled with `worker` in `namespace`, once the watch has shown every
    /// change up to `revision`: at once if it has, after a short wait if it is moving,
    /// else `None`. A pod the index names but the store no longer has is gone.
    pub async fn labelled_since(&self, namespace: &str, worker: &str, revision: u64) -> Option<Vec<PodState>> {
        let mut progress = self.progress.subscribe();
        let seen = *progress.borrow_and_update();
        if seen.revision < revision {
            if seen.last_event.is_none_or(|at| at.elapsed() >= MOVING) {
                return None;
            }
            let caught_up = progress.wait_for(|progress| progress.revision >= revision);
            tokio::time::timeout(CATCH_UP, caught_up).await.ok()?.ok()?;
        }
        let names: Vec<String> = {
            let index = self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let key = (namespace.to_owned(), worker.to_owned());
            index.current.pods.get(&key).into_iter().flatten().cloned().collect()
        };
        Some(names.iter().filter_map(|name| self.get(namespace, name)).collect())
    }
}

/// The revision of a pod's last change, as a watch event carries it.
fn revision(pod: &PodLiveness) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
}

// === impl ByWorker ===

impl ByWorker {
    fn insert(&mut self, label: &str, pod: &PodLiveness) {
        let key = key(pod);
        let worker = pod.metadata.labels.as_ref().and_then(|labels| labels.get(label));
        if self.workers.get(&key) == worker {
            return;
        }
        self.remove(pod);
        if let Some(worker) = worker {
            let (namespace, name) = key.clone();
            self.pods.entry((namespace, worker.clone())).or_default().insert(name);
            self.workers.insert(key, worker.clone());
        }
    }

    fn remove(&mut self, pod: &PodLiveness) {
        let (namespace, name) = key(pod);
        let Some(worker) = self.workers.remove(&(namespace.clone(), name.clone())) else {
            return;
        };
        let by_worker = (namespace, worker);
        if let Some(names) = self.pods.get_mut(&by_worker) {
            names.remove(&name);
            if names.is_empty() {
                self.pods.remove(&by_worker);
            }
        }
    }
}

fn key(pod: &PodLiveness) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::runtime::reflector::{self, store::Writer};

    use super::*;

    fn pod(name: &str, worker: Option<&str>, revision: u64) -> PodLiveness {
        PodLiveness {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("cds".to_owned()),
                uid: Some(format!("uid-{name}")),
                resource_version: Some(revision.to_string()),
                labels: worker.map(|worker| BTreeMap::from([("CDS_WORKER_NAME".to_owned(), worker.to_owned())])),
                ..ObjectMeta::default()
            },
            status: None,
        }
    }

    /// A watch as the reconciler runs it: the reflector first, then the index.
    struct Watch {
        writer: Writer<PodLiveness>,
        pods: WatchedPods,
    }

    impl Watch {
        fn new() -> Self {
            let (store, writer) = reflector::store();
            Self {
                writer,
                pods: WatchedPods::new(store, None, "CDS_WORKER_NAME"),
            }
        }

        fn event(&mut self, event: watcher::Event<PodLiveness>) {
            self.writer.apply_watcher_event(&event);
            self.pods.observe(&event);
        }

        fn listed(&mut self, pods: Vec<PodLiveness>) {
            self.event(watcher::Event::Init);
            for pod in pods {
                self.event(watcher::Event::InitApply(pod));
            }
            self.event(watcher::Event::InitDone);
        }

        async fn names(&self, worker: &str, revision: u64) -> Option<Vec<String>> {
            let pods = self.pods.labelled_since("cds", worker, revision).await?;
            Some(pods.into_iter().map(|pod| pod.name).collect())
        }
    }

    #[tokio::test]
    async fn a_watch_answers_for_the_revisions_it_has_shown() {
        let mut watch = Watch::new();
        watch.listed(vec![
            pod("w1", Some("w1"), 5),
            pod("helper", Some("w1"), 7),
            pod("w2", Some("w2"), 6),
        ]);

        assert_eq!(
            watch.names("w1", 7).await,
            Some(vec!["helper".to_owned(), "w1".to_owned()])
        );
        assert_eq!(
            watch.names("w3", 7).await,
            Some(vec![]),
            "no pod labelled w3 at revision 7"
        );

        watch.event(watcher::Event::Apply(pod("w3", Some("w3"), 9)));
        assert_eq!(watch.names("w3", 9).await, Some(vec!["w3".to_owned()]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_revision_the_watch_has_not_shown_proves_nothing() {
        let mut watch = Watch::new();
        assert_eq!(
            watch.names("w1", 1).await,
            None,
            "a watch that showed nothing proves nothing"
        );

        watch.listed(vec![pod("w1", Some("w1"), 5)]);
        assert_eq!(
            watch.names("w1", 6).await,
            None,
            "revision 6 may hold a change not shown yet"
        );

        tokio::time::sleep(MOVING * 2).await;
        let started = Instant::now();
        assert_eq!(watch.names("w2", 6).await, None);
        assert_eq!(started.elapsed(), Duration::ZERO, "a quiet watch is not waited for");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_waits_for_a_moving_watch_to_catch_up() {
        let mut watch = Watch::new();
        watch.listed(vec![pod("w1", Some("w1"), 5)]);

        let read = watch.pods.labelled_since("cds", "w2", 8);
        let shown = async {
            tokio::time::sleep(CATCH_UP / 4).await;
            watch
                .writer
                .apply_watcher_event(&watcher::Event::Apply(pod("w2", Some("w2"), 8)));
            watch.pods.observe(&watcher::Event::Apply(pod("w2", Some("w2"), 8)));
        };
        let (read, ()) = futures::join!(read, shown);
        let names: Vec<String> = read.expect("caught up").into_iter().map(|pod| pod.name).collect();
        assert_eq!(names, ["w2"], "the change at revision 8 is in the answer");
    }

    #[tokio::test]
    async fn relabelled_and_deleted_pods_leave_their_worker() {
        let mut watch = Watch::new();
        watch.listed(vec![pod("a", Some("w1"), 5), pod("b", Some("w1"), 6)]);

        watch.event(watcher::Event::Apply(pod("a", Some("w2"), 7)));
        watch.event(watcher::Event::Delete(pod("b", Some("w1"), 8)));
        assert_eq!(watch.names("w1", 8).await, Some(vec![]));
        assert_eq!(watch.names("w2", 8).await, Some(vec!["a".to_owned()]));

        // A pod that loses the label leaves a label-selected watch as a deletion.
        watch.event(watcher::Event::Delete(pod("a", None, 9)));
        assert_eq!(watch.names("w2", 9).await, Some(vec![]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_relist_answers_only_for_what_it_listed() {
        let mut watch = Watch::new();
        watch.listed(vec![pod("w1", Some("w1"), 5)]);
        watch.event(watcher::Event::Apply(pod("w2", Some("w2"), 20)));

        // While relisting, the index answers from the watch it had.
        watch.event(watcher::Event::Init);
        watch.event(watcher::Event::InitApply(pod("w1", Some("w1"), 5)));
        assert_eq!(watch.names("w2", 20).await, Some(vec!["w2".to_owned()]));

        // A list from a lagging apiserver: it proves revision 5, not 20.
        watch.event(watcher::Event::InitDone);
        assert_eq!(watch.names("w1", 5).await, Some(vec!["w1".to_owned()]));
        assert_eq!(watch.names("w2", 20).await, None);
    }

    #[test]
    fn a_watch_covers_its_namespace_and_label_only() {
        let (store, _writer) = reflector::store();
        let scoped = WatchedPods::new(store.clone(), Some("cds".to_owned()), "CDS_WORKER_NAME");
        assert!(scoped.covers("cds", "CDS_WORKER_NAME"));
        assert!(!scoped.covers("other", "CDS_WORKER_NAME"));
        assert!(!scoped.covers("cds", "other-label"));
        assert!(WatchedPods::new(store, None, "CDS_WORKER_NAME").covers("any", "CDS_WORKER_NAME"));
    }
}
