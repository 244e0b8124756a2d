//! The pods of the guard's scope as a watch shows them, indexed by the Secrets and
//! ConfigMaps they need.
//!
//! The index answers two questions. Which pods does it show needing an object, now: a
//! hint that may justify a denial, never an allow ([`UserIndex::users`]). And which pods
//! needed it at a revision read by quorum after the request arrived, once the watch has
//! caught up with that revision ([`UserIndex::users_at`], see [`crate::cluster::revision`]): that
//! answer stands in for the LIST of every pod's spec.
//!
//! It also tells a subscriber ([`UserIndex::subscribe`]) which objects' users may have
//! changed: the finalizer of deferred deletes ([`super::finalizer`]) looks at them again.
//!
//! A pod is kept as the rules read it (a [`Dependent`]) with the names it needs, never its
//! spec. Staleness of what is kept errs towards a denial: a pod deleted, gone terminal or
//! leaving since the index last saw it still counts, and its owners are read by quorum
//! before it keeps anything. Only a pod created (or given an ephemeral container) after
//! the index last saw its namespace could be missed, which is what the revision proves.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use tokio::sync::mpsc;

use super::Dependent;
use crate::cluster::{
    gate::{Gated, Index},
    references::{self, Kind},
};

/// One watch's pods (a namespace's, or all), indexed by what they need.
pub struct UserIndex {
    /// The namespace watched, or `None` for all.
    scope: Option<String>,
    pods: Gated<Pods>,
    /// Where the objects whose users changed are sent, while someone listens.
    changes: Mutex<Option<mpsc::UnboundedSender<ObjectKey>>>,
}

/// (namespace, name) of a pod.
type PodKey = (String, String);
/// (namespace, kind, name) of a Secret or ConfigMap.
pub type ObjectKey = (String, Kind, String);

#[derive(Default)]
struct Pods {
    pods: HashMap<PodKey, Indexed>,
    /// The names of the pods that need each object.
    users: HashMap<ObjectKey, BTreeSet<String>>,
}

/// A pod as the rules read it, and the objects its spec needs.
struct Indexed {
    pod: Dependent,
    needs: Vec<(Kind, String)>,
}

// === impl UserIndex ===

impl UserIndex {
    /// An empty index of `scope`'s pods (a namespace, or all), for a watch to fill
    /// through [`UserIndex::observe`].
    pub fn new(scope: Option<String>) -> Self {
        Self {
            scope,
            pods: Gated::new(Pods::default()),
            changes: Mutex::default(),
        }
    }

    /// Sends to `changes`, from now on, the objects whose users may have changed: those
    /// needed by a pod that came, went, or changed what it needs or whether it runs.
    /// Replaces an earlier subscriber.
    pub fn subscribe(&self, changes: mpsc::UnboundedSender<ObjectKey>) {
        *self.changes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(changes);
    }

    /// The namespace watched, or `None` for all.
    pub fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }

    /// Whether this index holds `namespace`'s pods.
    pub fn covers(&self, namespace: &str) -> bool {
        self.scope.as_deref().is_none_or(|scope| scope == namespace)
    }

    /// Takes one event of the watch.
    pub fn observe(&self, event: &Event<Pod>) {
        let changed = self.pods.observe(event);
        if !changed.is_empty()
            && let Some(changes) = self
                .changes
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .as_ref()
        {
            for object in changed {
                let _ = changes.send(object);
            }
        }
    }

    /// Whether the watch's events come often enough that waiting for the next is likely
    /// quicker than a LIST: the last two came within `within` of each other, the last one
    /// within `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        self.pods.is_busy(within)
    }

    /// The pods the index shows needing the object now: a hint, never the proof of an
    /// absence.
    pub fn users(&self, namespace: &str, kind: Kind, name: &str) -> Vec<Dependent> {
        self.pods.now(|pods| pods.users(namespace, kind, name))
    }

    /// The pods that need the object, once the watch has caught up with `revision`;
    /// `None` if it has not within `within`.
    pub async fn users_at(
        &self,
        revision: u64,
        namespace: &str,
        kind: Kind,
        name: &str,
        within: Duration,
    ) -> Option<Vec<Dependent>> {
        self.pods
            .at(revision, within, |pods| pods.users(namespace, kind, name))
            .await
    }
}

// === impl Pods ===

impl Index for Pods {
    type Object = Pod;
    type Relist = Pods;
    type Change = ObjectKey;

    fn apply(&mut self, pod: &Pod, deleted: bool, changes: &mut Vec<ObjectKey>) {
        changes.extend(if deleted { self.remove(pod) } else { self.insert(pod) });
    }

    fn relist(relist: &mut Pods, pod: &Pod) {
        relist.insert(pod);
    }

    /// Every object needed before or after has its users changed.
    fn replace(&mut self, relist: Pods, changes: &mut Vec<ObjectKey>) {
        let replaced = std::mem::replace(self, relist);
        changes.extend(replaced.users.into_keys());
        changes.extend(self.users.keys().cloned());
    }
}

impl Pods {
    /// Keeps `pod`; returns the objects whose users changed with it.
    fn insert(&mut self, pod: &Pod) -> Vec<ObjectKey> {
        let Some(key) = key(pod) else { return Vec::new() };
        let old = self.remove_key(&key);
        let mut needs = Vec::new();
        if let Some(spec) = &pod.spec {
            references::visit(spec, |reference| {
                let needed = (reference.kind, reference.name.to_owned());
                if !reference.optional && !needs.contains(&needed) {
                    needs.push(needed);
                }
            });
        }
        for (kind, name) in &needs {
            self.users
                .entry((key.0.clone(), *kind, name.clone()))
                .or_default()
                .insert(key.1.clone());
        }
        let phase = pod.status.as_ref().and_then(|status| status.phase.as_deref());
        let dependent = Dependent {
            terminal: matches!(phase, Some("Succeeded" | "Failed")),
            ..Dependent::from_metadata("v1", "Pod", &pod.metadata)
        };
        // A status update of a running pod changes no object's users.
        let same = old.as_ref().is_some_and(|old| {
            old.needs == needs && old.pod.deleting == dependent.deleting && old.pod.terminal == dependent.terminal
        });
        let mut changed = Vec::new();
        if !same {
            let olds = old.iter().flat_map(|old| old.needs.iter());
            for (kind, name) in olds.chain(&needs) {
                let object = (key.0.clone(), *kind, name.clone());
                if !changed.contains(&object) {
                    changed.push(object);
                }
            }
        }
        self.pods.insert(key, Indexed { pod: dependent, needs });
        changed
    }

    /// Forgets `pod`; returns the objects it needed.
    fn remove(&mut self, pod: &Pod) -> Vec<ObjectKey> {
        let Some(key) = key(pod) else { return Vec::new() };
        let old = self.remove_key(&key);
        old.into_iter()
            .flat_map(|old| old.needs)
            .map(|(kind, name)| (key.0.clone(), kind, name))
            .collect()
    }

    fn remove_key(&mut self, key: &PodKey) -> Option<Indexed> {
        let old = self.pods.remove(key)?;
        for (kind, name) in &old.needs {
            let object = (key.0.clone(), *kind, name.clone());
            if let Some(names) = self.users.get_mut(&object) {
                names.remove(&key.1);
                if names.is_empty() {
                    self.users.remove(&object);
                }
            }
        }
        Some(old)
    }

    fn users(&self, namespace: &str, kind: Kind, name: &str) -> Vec<Dependent> {
        let object = (namespace.to_owned(), kind, name.to_owned());
        let Some(names) = self.users.get(&object) else {
            return Vec::new();
        };
        names
            .iter()
            .filter_map(|pod| self.pods.get(&(namespace.to_owned(), pod.clone())))
            .map(|indexed| indexed.pod.clone())
            .collect()
    }
}

fn key(pod: &Pod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn pod(name: &str, config_map: &str, revision: u64) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"),
                         "resourceVersion": revision.to_string()},
            "spec": {
                "containers": [{"name": "main", "envFrom": [{"secretRef": {"name": "token", "optional": true}}]}],
                "volumes": [{"name": "settings", "configMap": {"name": config_map}}],
            },
        }))
        .unwrap()
    }

    fn names(users: Option<Vec<Dependent>>) -> Option<Vec<String>> {
        users.map(|users| users.into_iter().map(|user| user.name).collect())
    }

    const NOW: Duration = Duration::ZERO;

    #[tokio::test]
    async fn answers_once_caught_up_with_the_revision_and_not_before() {
        let index = UserIndex::new(None);
        index.observe(&Event::Apply(pod("web", "settings", 10)));

        let users = |revision| index.users_at(revision, "app", Kind::ConfigMap, "settings", NOW);
        assert_eq!(names(users(10).await), Some(vec!["web".into()]));
        assert_eq!(users(11).await, None, "not caught up: no answer");
        let other = index.users_at(10, "other", Kind::ConfigMap, "settings", NOW).await;
        assert_eq!(names(other), Some(vec![]));
        let optional = index.users_at(10, "app", Kind::Secret, "token", NOW).await;
        assert_eq!(names(optional), Some(vec![]), "an optional reference is no use");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_read_is_answered_by_the_next_event() {
        let index = std::sync::Arc::new(UserIndex::new(Some("app".into())));
        index.observe(&Event::Apply(pod("web", "settings", 10)));

        let read = tokio::spawn({
            let index = index.clone();
            async move {
                index
                    .users_at(12, "app", Kind::ConfigMap, "settings", Duration::from_millis(50))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        index.observe(&Event::Apply(pod("api", "settings", 12)));

        assert_eq!(names(read.await.unwrap()), Some(vec!["api".into(), "web".into()]));
    }

    #[tokio::test]
    async fn a_pod_deleted_or_given_another_spec_leaves_the_index() {
        let index = UserIndex::new(None);
        index.observe(&Event::Apply(pod("web", "settings", 10)));
        index.observe(&Event::Apply(pod("web", "other", 11)));
        assert_eq!(
            names(Some(index.users("app", Kind::ConfigMap, "settings"))),
            Some(vec![])
        );
        assert_eq!(
            names(Some(index.users("app", Kind::ConfigMap, "other"))),
            Some(vec!["web".into()])
        );
        index.observe(&Event::Delete(pod("web", "other", 12)));
        assert!(index.users("app", Kind::ConfigMap, "other").is_empty());
        assert!(index.pods.now(|pods| pods.users.is_empty()), "nothing is left behind");
    }

    #[tokio::test]
    async fn a_relist_replaces_the_pods_and_claims_only_its_newest_revision() {
        let index = UserIndex::new(None);
        index.observe(&Event::Apply(pod("old", "settings", 20)));

        index.observe(&Event::Init);
        index.observe(&Event::InitApply(pod("new", "settings", 15)));
        let users = |revision| index.users_at(revision, "app", Kind::ConfigMap, "settings", NOW);
        assert_eq!(
            names(users(20).await),
            Some(vec!["old".into()]),
            "until the relist is done, the pods it replaces stand"
        );
        index.observe(&Event::InitDone);

        assert_eq!(users(20).await, None, "a relist proves nothing past its newest pod");
        assert_eq!(names(users(15).await), Some(vec!["new".into()]));
    }

    #[test]
    fn a_terminal_pod_is_kept_as_terminal() {
        let index = UserIndex::new(None);
        let mut done = pod("done", "settings", 3);
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        index.observe(&Event::Apply(done));
        let users = index.users("app", Kind::ConfigMap, "settings");
        assert_eq!((users.len(), users[0].terminal), (1, true));
    }

    #[test]
    fn an_index_covers_its_namespace_only() {
        assert!(UserIndex::new(Some("app".into())).covers("app"));
        assert!(!UserIndex::new(Some("app".into())).covers("other"));
        assert!(UserIndex::new(None).covers("other"));
    }

    #[test]
    fn a_subscriber_hears_of_the_objects_whose_users_changed_and_not_of_status_updates() {
        let index = UserIndex::new(None);
        let (sender, mut changes) = mpsc::unbounded_channel();
        index.subscribe(sender);
        let mut heard = || {
            let mut objects = Vec::new();
            while let Ok((namespace, kind, name)) = changes.try_recv() {
                objects.push(format!("{namespace}/{}/{name}", kind.as_str()));
            }
            objects
        };
        index.observe(&Event::Apply(pod("web", "settings", 10)));
        assert_eq!(heard(), ["app/ConfigMap/settings"], "the optional Secret is no use");
        let mut running = pod("web", "settings", 11);
        running.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        index.observe(&Event::Apply(running));
        assert!(heard().is_empty(), "a status update changes no object's users");
        index.observe(&Event::Apply(pod("web", "other", 12)));
        assert_eq!(heard(), ["app/ConfigMap/settings", "app/ConfigMap/other"]);
        index.observe(&Event::Delete(pod("web", "other", 13)));
        assert_eq!(heard(), ["app/ConfigMap/other"]);
        index.observe(&Event::Init);
        index.observe(&Event::InitApply(pod("api", "settings", 14)));
        index.observe(&Event::InitDone);
        assert_eq!(heard(), ["app/ConfigMap/settings"], "a relist: what its pods need");
    }
}
