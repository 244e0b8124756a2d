use std::{
    collections::HashMap,
    sync::atomic::{AtomicUsize, Ordering},
};

use super::*;
use crate::rules::in_use::staying::{CHAIN_DEPTH, FOREGROUND_DELETION, MAX_OWNERS};

/// The cluster as the rules read it: the pods a LIST returns (a snapshot), the objects
/// GETs return (now), what a watch shows.
#[derive(Default)]
struct Fake {
    users: Vec<Dependent>,
    objects: HashMap<(String, String), Dependent>,
    cached: Vec<Dependent>,
    users_fail: bool,
    objects_fail: bool,
    terminating: bool,
    lists: AtomicUsize,
}

impl Fake {
    fn with(mut self, object: Dependent) -> Self {
        self.objects.insert((object.kind.clone(), object.name.clone()), object);
        self
    }

    /// `pod` listed as a user, and readable by name.
    fn using(mut self, pod: Dependent) -> Self {
        self.users.push(pod.clone());
        self.with(pod)
    }
}

#[async_trait]
impl InUseLookup for Fake {
    async fn users(&self, _: &str, _: Kind, _: &str) -> crate::Result<Vec<Dependent>> {
        self.lists.fetch_add(1, Ordering::Relaxed);
        if self.users_fail {
            return Err(crate::Error::Timeout(std::time::Duration::from_secs(2)));
        }
        Ok(self.users.clone())
    }

    async fn object(&self, _: &str, _: &str, kind: &str, name: &str) -> crate::Result<Option<Dependent>> {
        if self.objects_fail {
            return Err(crate::Error::Timeout(std::time::Duration::from_secs(2)));
        }
        Ok(self.objects.get(&(kind.to_owned(), name.to_owned())).cloned())
    }

    async fn namespace_terminating(&self, _: &str) -> crate::Result<bool> {
        Ok(self.terminating)
    }

    fn cached_users(&self, _: &str, _: Kind, _: &str) -> Vec<Dependent> {
        self.cached.clone()
    }
}

fn object(api_version: &str, kind: &str, name: &str, owners: &[&Dependent]) -> Dependent {
    Dependent {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        owners: owners
            .iter()
            .map(|owner| OwnerReference {
                api_version: owner.api_version.clone(),
                kind: owner.kind.clone(),
                name: owner.name.clone(),
                uid: owner.uid.clone(),
                controller: Some(true),
                ..OwnerReference::default()
            })
            .collect(),
        ..Dependent::default()
    }
}

fn pod(name: &str, owners: &[&Dependent]) -> Dependent {
    object("v1", "Pod", name, owners)
}

/// A Deployment, its ReplicaSet and its pod.
fn workload() -> (Dependent, Dependent, Dependent) {
    let deployment = object("apps/v1", "Deployment", "web", &[]);
    let replica_set = object("apps/v1", "ReplicaSet", "web-5d8f", &[&deployment]);
    let pod = pod("web-5d8f-x2k", &[&replica_set]);
    (deployment, replica_set, pod)
}

async fn delete_with(lookup: &Fake, annotations: &[(&str, &str)]) -> Verdict {
    let meta = ObjectMeta {
        annotations: Some(annotations.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()),
        ..ObjectMeta::default()
    };
    delete_of(lookup, &meta, Mode::Refuse).await
}

/// `object` being deleted, held by `finalizers`.
fn being_deleted(object: Dependent, finalizers: &[impl ToString]) -> Dependent {
    Dependent {
        deleting: true,
        finalizers: finalizers.iter().map(ToString::to_string).collect(),
        ..object
    }
}

async fn delete(lookup: &Fake) -> Verdict {
    delete_with(lookup, &[]).await
}

/// The reason a delete gets while `user` uses the object and `objects` can be read.
async fn reason_among(objects: &[&Dependent], user: Dependent) -> Reason {
    let lookup = objects
        .iter()
        .copied()
        .cloned()
        .fold(Fake::default(), Fake::with)
        .using(user);
    delete(&lookup).await.reason
}

#[tokio::test]
async fn a_pod_that_uses_it_denies_naming_the_pod() {
    let verdict = delete(&Fake::default().using(pod("web", &[]))).await;
    assert!(!verdict.allowed);
    assert_eq!(verdict.reason, Reason::InUse);
    assert_eq!(verdict.found.pods, ["web"]);
    assert!(
        verdict
            .message
            .starts_with("configmap settings is in use by pod web in namespace app;"),
        "{}",
        verdict.message
    );
    assert!(verdict.message.contains(FORCE_ANNOTATION), "{}", verdict.message);
}

#[tokio::test]
async fn a_denial_names_three_pods_and_counts_the_rest() {
    let lookup = ["e", "d", "c", "b", "a"]
        .into_iter()
        .fold(Fake::default(), |fake, name| fake.using(pod(name, &[])));
    let verdict = delete(&lookup).await;
    assert_eq!(verdict.found.pods, ["a", "b", "c"]);
    assert!(
        verdict
            .message
            .contains("by pod a, b, c (and 2 more pods name it) in namespace app"),
        "{}",
        verdict.message
    );
}

#[tokio::test]
async fn a_pod_with_more_owners_than_any_workload_stays_unread() {
    let owners: Vec<Dependent> = (0..=MAX_OWNERS)
        .map(|i| object("apps/v1", "ReplicaSet", &format!("gone-{i}"), &[]))
        .collect();
    let many = pod("many", &owners.iter().collect::<Vec<_>>());
    let lookup = Fake {
        objects_fail: true,
        ..Fake::default().using(many)
    };
    assert_eq!(delete(&lookup).await.reason, Reason::InUse, "no owner was read");
}

#[tokio::test]
async fn no_user_terminal_or_deleted_pods_allow() {
    assert_eq!(delete(&Fake::default()).await.reason, Reason::Unused);
    let done = Dependent {
        terminal: true,
        ..pod("done", &[])
    };
    let going = Dependent {
        deleting: true,
        ..pod("going", &[])
    };
    let verdict = delete(&Fake::default().using(done).using(going)).await;
    assert!(verdict.allowed, "{verdict:?}");
    assert_eq!(verdict.reason, Reason::Unused);
}

#[tokio::test]
async fn the_root_ca_and_exempt_requesters_are_let_through_without_a_read() {
    let lookup = Fake::default().using(pod("web", &[]));
    let root_ca = ObjectDelete {
        kind: Kind::ConfigMap,
        namespace: "app",
        name: ROOT_CA,
        object: None,
        exempt: false,
        mode: Mode::Refuse,
    };
    assert_eq!(decide(&root_ca, &lookup).await.reason, Reason::NotProtected);
    let secret_named_so = ObjectDelete {
        kind: Kind::Secret,
        ..root_ca
    };
    assert_eq!(decide(&secret_named_so, &lookup).await.reason, Reason::InUse);
    let exempt = ObjectDelete {
        name: "settings",
        exempt: true,
        ..root_ca
    };
    assert_eq!(decide(&exempt, &lookup).await.reason, Reason::Exempt);
    assert_eq!(lookup.lists.load(Ordering::Relaxed), 1, "only the secret was read");
}

#[tokio::test]
async fn the_force_annotation_lets_it_through_saying_why() {
    let lookup = Fake::default().using(pod("web", &[]));
    let verdict = delete_with(&lookup, &[(FORCE_ANNOTATION, "replacing an immutable ConfigMap")]).await;
    assert!(verdict.allowed);
    assert_eq!(verdict.reason, Reason::Forced);
    assert!(
        verdict.message.contains("replacing an immutable ConfigMap"),
        "{}",
        verdict.message
    );
    let blank = delete_with(&lookup, &[(FORCE_ANNOTATION, " ")]).await;
    assert_eq!(blank.reason, Reason::InUse, "a blank reason forces nothing");
}

#[tokio::test]
async fn helm_uninstall_completes_once_the_deployment_is_gone() {
    let (deployment, replica_set, pod) = workload();
    // Gone: the pod and its ReplicaSet are dangling, and both still name their owners.
    assert_eq!(reason_among(&[&replica_set], pod.clone()).await, Reason::Unused);
    // Still there: the pod stays.
    assert_eq!(
        reason_among(&[&deployment, &replica_set], pod.clone()).await,
        Reason::InUse
    );
    // Being deleted in the foreground, or with nothing holding it: the pod goes with it.
    for finalizers in [&[FOREGROUND_DELETION][..], &[]] {
        let deleting = being_deleted(deployment.clone(), finalizers);
        assert_eq!(
            reason_among(&[&deleting, &replica_set], pod.clone()).await,
            Reason::Unused
        );
    }
}

#[tokio::test]
async fn an_owner_another_finalizer_holds_keeps_its_pods() {
    let (_, replica_set, pod) = workload();
    let held = being_deleted(replica_set, &["example.com/hold"]);
    // The Deployment is gone and the ReplicaSet deleted, but it may be held for good.
    assert_eq!(reason_among(&[&held], pod.clone()).await, Reason::InUse);
    // Not deleted yet, but its owner is gone: held all the same once the GC deletes it.
    let held = Dependent {
        deleting: false,
        ..held
    };
    assert_eq!(reason_among(&[&held], pod).await, Reason::InUse);
}

#[tokio::test]
async fn an_orphaning_delete_leaves_the_pods_in_use() {
    let (deployment, replica_set, pod) = workload();
    // `--cascade=orphan`: the owner waits on its `orphan` finalizer.
    let orphaning = being_deleted(deployment, &["orphan"]);
    assert_eq!(
        reason_among(&[&orphaning, &replica_set], pod.clone()).await,
        Reason::InUse
    );
    // Already orphaned: the owner is gone, and the ReplicaSet read again no longer names it.
    let orphaned = Dependent {
        owners: Vec::new(),
        ..replica_set
    };
    assert_eq!(reason_among(&[&orphaned], pod).await, Reason::InUse);
}

#[tokio::test]
async fn a_pod_with_an_owner_left_or_of_another_kind_stays() {
    let (_, replica_set, _) = workload();
    let other = object("example.com/v1", "Runner", "runner", &[]);
    // The Runner is gone too, but its kind is not followed.
    assert_eq!(reason_among(&[], pod("by-crd", &[&other])).await, Reason::InUse);
    // One owner gone, one left: the garbage collector removes the reference only.
    let gone = object("apps/v1", "ReplicaSet", "gone", &[]);
    assert_eq!(
        reason_among(
            &[&replica_set, &object("apps/v1", "Deployment", "web", &[])],
            pod("two-owners", &[&replica_set, &gone])
        )
        .await,
        Reason::InUse
    );
}

#[tokio::test]
async fn an_owner_replaced_under_its_name_is_gone() {
    let (deployment, replica_set, pod) = workload();
    let replaced = Dependent {
        uid: "uid-new".into(),
        ..deployment
    };
    assert_eq!(reason_among(&[&replaced, &replica_set], pod).await, Reason::Unused);
}

#[tokio::test]
async fn a_chain_longer_than_followed_stays() {
    let mut chain = vec![object("apps/v1", "Deployment", "top", &[])];
    for level in 0..CHAIN_DEPTH {
        let owner = chain.last().unwrap().clone();
        chain.push(object("apps/v1", "ReplicaSet", &format!("level-{level}"), &[&owner]));
    }
    let bottom = pod("bottom", &[chain.last().unwrap()]);
    // The top is gone; it is one owner too far up.
    let lookup = chain[1..]
        .iter()
        .cloned()
        .fold(Fake::default(), Fake::with)
        .using(bottom);
    assert_eq!(delete(&lookup).await.reason, Reason::InUse);
}

#[tokio::test]
async fn a_failed_read_denies_unless_the_namespace_goes() {
    let lookup = Fake {
        users_fail: true,
        ..Fake::default()
    };
    let verdict = delete(&lookup).await;
    assert_eq!(verdict.reason, Reason::LookupFailed);
    assert!(
        verdict
            .message
            .starts_with("cannot verify that no pod uses configmap settings")
    );
    let (_, replica_set, owned) = workload();
    let lookup = Fake {
        objects_fail: true,
        ..Fake::default().with(replica_set).using(owned)
    };
    assert_eq!(
        delete(&lookup).await.reason,
        Reason::LookupFailed,
        "a chain read failed"
    );
    let lookup = Fake {
        users_fail: true,
        terminating: true,
        ..Fake::default()
    };
    assert_eq!(delete(&lookup).await.reason, Reason::NamespaceTerminating);
    let lookup = Fake {
        terminating: true,
        ..Fake::default().using(pod("web", &[]))
    };
    assert_eq!(delete(&lookup).await.reason, Reason::NamespaceTerminating);
}

#[tokio::test]
async fn a_watched_user_denies_without_the_list_and_never_allows() {
    let lookup = Fake {
        cached: vec![pod("seen", &[])],
        ..Fake::default()
    };
    let verdict = delete(&lookup).await;
    assert_eq!(
        (verdict.reason, verdict.found.pods),
        (Reason::InUse, vec!["seen".to_owned()])
    );
    assert_eq!(lookup.lists.load(Ordering::Relaxed), 0);
    // A watched pod on its way out proves nothing: the LIST decides.
    let lookup = Fake {
        cached: vec![Dependent {
            deleting: true,
            ..pod("leaving", &[])
        }],
        ..Fake::default().using(pod("listed", &[]))
    };
    let verdict = delete(&lookup).await;
    assert_eq!(
        (verdict.reason, verdict.found.pods),
        (Reason::InUse, vec!["listed".to_owned()])
    );
    assert_eq!(lookup.lists.load(Ordering::Relaxed), 1);
}

/// `settings`, held by the finalizer or not, deleted in `mode`.
async fn delete_in(lookup: &Fake, mode: Mode, held: bool) -> Verdict {
    let meta = ObjectMeta {
        finalizers: held.then(|| vec!["example.com/other".to_owned(), FINALIZER.to_owned()]),
        ..ObjectMeta::default()
    };
    delete_of(lookup, &meta, mode).await
}

/// A delete of the ConfigMap `settings`, as `meta` stands, in `mode`.
async fn delete_of(lookup: &Fake, meta: &ObjectMeta, mode: Mode) -> Verdict {
    let request = ObjectDelete {
        kind: Kind::ConfigMap,
        namespace: "app",
        name: "settings",
        object: Some(meta),
        exempt: false,
        mode,
    };
    decide(&request, lookup).await
}

#[tokio::test]
async fn in_defer_a_held_object_goes_through_unread_naming_the_pods_the_watch_shows() {
    let done = Dependent {
        terminal: true,
        ..pod("done", &[])
    };
    let lookup = Fake {
        cached: vec![pod("web-b", &[]), pod("web-a", &[]), done],
        users_fail: true,
        objects_fail: true,
        ..Fake::default()
    };
    let verdict = delete_in(&lookup, Mode::Defer, true).await;
    assert!(verdict.allowed, "{verdict:?}");
    assert_eq!(verdict.reason, Reason::Deferred);
    assert_eq!(verdict.found.pods, ["web-a", "web-b"]);
    assert_eq!(
        verdict.message,
        "configmap settings is in use by pod web-a, web-b in namespace app; it will be deleted once they are gone"
    );
    assert_eq!(lookup.lists.load(Ordering::Relaxed), 0, "nothing was read");

    let unseen = delete_in(&Fake::default(), Mode::Defer, true).await;
    assert_eq!((unseen.reason, unseen.found.pods.len()), (Reason::Deferred, 0));
    assert_eq!(
        unseen.message,
        "configmap settings will be deleted once no pod of namespace app uses it"
    );
}

#[tokio::test]
async fn in_defer_a_used_object_not_yet_held_is_refused_and_told_to_retry() {
    let lookup = Fake::default().using(pod("web", &[]));
    let verdict = delete_in(&lookup, Mode::Defer, false).await;
    assert_eq!(verdict.reason, Reason::InUse);
    assert!(
        verdict
            .message
            .contains("not yet held for a deferred delete: try again"),
        "{}",
        verdict.message
    );
    let unused = delete_in(&Fake::default(), Mode::Defer, false).await;
    assert_eq!(unused.reason, Reason::Unused, "nothing to hold: it goes at once");
}

#[tokio::test]
async fn in_refuse_the_finalizer_changes_nothing() {
    let lookup = Fake::default().using(pod("web", &[]));
    assert_eq!(delete_in(&lookup, Mode::Refuse, true).await.reason, Reason::InUse);
    assert!(
        !delete_in(&lookup, Mode::Refuse, true)
            .await
            .message
            .contains("try again")
    );
}

#[tokio::test]
async fn a_held_object_is_released_once_no_pod_that_runs_needs_it_not_even_one_leaving() {
    let held = ObjectMeta {
        finalizers: Some(vec![FINALIZER.to_owned()]),
        ..ObjectMeta::default()
    };
    let object = ObjectDelete {
        kind: Kind::Secret,
        namespace: "app",
        name: "token",
        object: Some(&held),
        exempt: true,
        mode: Mode::Defer,
    };
    let used = Fake::default().using(pod("web", &[]));
    assert_eq!(
        may_release(&object, &used).await.reason,
        Reason::InUse,
        "never deferred, never exempt"
    );
    assert_eq!(may_release(&object, &Fake::default()).await.reason, Reason::Unused);
    let watched_only = Fake {
        cached: vec![pod("seen", &[])],
        ..Fake::default()
    };
    assert_eq!(
        may_release(&object, &watched_only).await.reason,
        Reason::InUse,
        "a pod the watch shows keeps it"
    );
    let forced = ObjectMeta {
        annotations: Some([(FORCE_ANNOTATION.to_owned(), "INC-1".to_owned())].into()),
        ..held.clone()
    };
    let forced = ObjectDelete {
        object: Some(&forced),
        ..object
    };
    assert_eq!(may_release(&forced, &used).await.reason, Reason::Forced);
}

#[test]
fn an_object_is_opted_in_by_its_label_else_by_its_namespace() {
    let labels = |value: &str| BTreeMap::from([(OPT_IN_LABEL.to_owned(), value.to_owned())]);
    let (enabled, defer, refuse, other) = (labels("enabled"), labels("defer"), labels("refuse"), labels("yes"));
    assert_eq!(opted_in(None, Some(&enabled), Mode::Defer), Some(Mode::Defer));
    assert_eq!(opted_in(None, Some(&enabled), Mode::Refuse), Some(Mode::Refuse));
    assert_eq!(opted_in(Some(&refuse), Some(&defer), Mode::Defer), Some(Mode::Refuse));
    assert_eq!(opted_in(Some(&defer), None, Mode::Refuse), Some(Mode::Defer));
    assert_eq!(opted_in(Some(&other), Some(&refuse), Mode::Defer), Some(Mode::Refuse));
    assert_eq!(opted_in(Some(&other), None, Mode::Defer), None);
    assert_eq!(opted_in(None, None, Mode::Defer), None);
    for value in OPT_IN_VALUES {
        assert!(Mode::from_label(value, Mode::Defer).is_some(), "{value}");
    }
}
