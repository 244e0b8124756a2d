//! End-to-end: in-use protection's rules over quorum reads of the real apiserver, beside
//! the real Deployment and ReplicaSet controllers and garbage collector. A Deployment's
//! pods keep the ConfigMap and Secret they name; the garbage collector's own judgement of
//! which pods go after their owner is the rules' judgement. Then the guard itself,
//! registered with `webhooks --in-use-protection` and running as a service account with
//! the chart's rights for it, as `kubectl` users meet it.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::{
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use cds_secret_guard::{
    cluster::namespaces::NamespaceCache,
    cluster::references::Kind,
    observe::metrics::Metrics,
    rules::in_use::{self, InUseLookup, KubeInUse, ObjectDelete, Reason, Verdict},
};
use cluster::*;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(30);

/// Tests that need kube-controller-manager running take it shared; the one that pauses
/// it, exclusively.
static CONTROLLERS: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// kube-controller-manager (its garbage collector among its controllers) stopped with
/// SIGSTOP until dropped: the moment before the garbage collector acts, held still.
struct Paused(String);

impl Paused {
    fn controller_manager() -> Self {
        let file = repo().join("target/controlplane/run/kube-controller-manager.pid");
        let pid = std::fs::read_to_string(&file).unwrap().trim().to_owned();
        Self::signal(&pid, "-STOP");
        Self(pid)
    }

    fn signal(pid: &str, signal: &str) {
        let status = std::process::Command::new("kill").args([signal, pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        Self::signal(&self.0, "-CONT");
    }
}

/// A Deployment of `replicas` pods reading the ConfigMap `settings` through `env` and a
/// volume, and the Secret `token` through `envFrom`.
fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "busybox",
                        "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}],
                        "envFrom": [{"secretRef": {"name": "token"}}],
                        "volumeMounts": [{"name": "settings", "mountPath": "/etc/app"}],
                    }],
                    "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
                },
            },
        },
    }))
    .unwrap()
}

async fn decide(ns: &TestNamespace, kind: Kind, name: &str) -> Verdict {
    let request = ObjectDelete {
        kind,
        namespace: &ns.name,
        name,
        object: None,
        exempt: false,
        mode: in_use::Mode::Refuse,
    };
    in_use::decide(&request, &KubeInUse::new(client().await)).await
}

/// The pods of Deployment `app`, once there are `count` of them.
async fn pods_of(ns: &TestNamespace, app: &str, count: usize) -> Vec<Pod> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let pods = ns
            .pods()
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap();
        if pods.items.len() == count {
            return pods.items;
        }
        assert!(
            Instant::now() < deadline,
            "{app}: {} pods, not {count}",
            pods.items.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !done().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for an Event of `ns` that `matches`.
async fn until_event(ns: &TestNamespace, what: &str, matches: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool) {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client().await, &ns.name);
    until(what, async || {
        let listed = events.list(&ListParams::default()).await.unwrap();
        listed.items.iter().any(&matches)
    })
    .await;
}

fn names(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().map(|pod| pod.metadata.name.clone().unwrap()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_deployments_pods_keep_what_they_name_until_the_deployment_is_deleted() {
    let _running = CONTROLLERS.read().await;
    let ns = TestNamespace::new("in-use").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    let settings = serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"mode": "on"}})).unwrap();
    config_maps.create(&PostParams::default(), &settings).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    let pods = pods_of(&ns, "web", 2).await;

    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!((verdict.reason, &verdict.found.pods), (Reason::InUse, &names(&pods)));
    assert!(!verdict.allowed);
    assert_eq!(decide(&ns, Kind::Secret, "token").await.reason, Reason::InUse);
    assert_eq!(
        decide(&ns, Kind::Secret, "settings").await.reason,
        Reason::Unused,
        "another kind"
    );
    assert_eq!(decide(&ns, Kind::ConfigMap, "other").await.reason, Reason::Unused);

    // `helm uninstall`: the Deployment, then at once the ConfigMap.
    deployments.delete("web", &DeleteParams::background()).await.unwrap();
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!(verdict.reason, Reason::Unused, "{verdict:?}");
}

/// The moment between a Deployment's delete and the garbage collector's work, held still:
/// the ReplicaSet names a Deployment that is gone, and its pods are not deleted yet. They
/// are leaving all the same.
#[tokio::test]
async fn pods_whose_deployment_is_gone_are_leaving_before_the_garbage_collector_acts() {
    let _alone = CONTROLLERS.write().await;
    let ns = TestNamespace::new("in-use-dangling").await;
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    let pods = pods_of(&ns, "web", 2).await;
    let paused = Paused::controller_manager();

    deployments.delete("web", &DeleteParams::background()).await.unwrap();
    assert!(deployments.get_opt("web").await.unwrap().is_none());
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!(verdict.reason, Reason::Unused, "{verdict:?}");
    let left = pods_of(&ns, "web", 2).await;
    assert_eq!(names(&left), names(&pods));
    assert!(
        left.iter().all(|pod| pod.metadata.deletion_timestamp.is_none()),
        "the garbage collector has not acted: the rules followed the owners"
    );

    drop(paused);
    pods_of(&ns, "web", 0).await;
}

#[tokio::test]
async fn an_orphaning_delete_leaves_the_pods_using_it() {
    let _running = CONTROLLERS.read().await;
    let ns = TestNamespace::new("in-use-orphan").await;
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("kept", 1))
        .await
        .unwrap();
    let pods = pods_of(&ns, "kept", 1).await;

    deployments.delete("kept", &DeleteParams::orphan()).await.unwrap();
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!(
        (verdict.reason, &verdict.found.pods),
        (Reason::InUse, &names(&pods)),
        "while orphaning"
    );
    until("the Deployment is gone", async || {
        deployments.get_opt("kept").await.unwrap().is_none()
    })
    .await;
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!(
        (verdict.reason, &verdict.found.pods),
        (Reason::InUse, &names(&pods)),
        "orphaned"
    );
}

/// An owner another finalizer holds keeps its pods: the garbage collector leaves them
/// running, and so the rules count them.
#[tokio::test]
async fn a_held_replica_set_keeps_its_pods_using_it_until_released() {
    let _running = CONTROLLERS.read().await;
    let ns = TestNamespace::new("in-use-held").await;
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("held", 1))
        .await
        .unwrap();
    let pods = pods_of(&ns, "held", 1).await;
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client().await, &ns.name);
    let replica_set = pods[0].metadata.owner_references.as_ref().unwrap()[0].name.clone();
    let hold = json!({"metadata": {"finalizers": ["example.com/hold"]}});
    replica_sets
        .patch(&replica_set, &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .unwrap();

    deployments.delete("held", &DeleteParams::background()).await.unwrap();
    until("the garbage collector deletes the ReplicaSet", async || {
        let found = replica_sets.get_opt(&replica_set).await.unwrap();
        found.is_some_and(|found| found.metadata.deletion_timestamp.is_some())
    })
    .await;
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!((verdict.reason, &verdict.found.pods), (Reason::InUse, &names(&pods)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pod = ns.pods().get(pods[0].metadata.name.as_ref().unwrap()).await.unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "the garbage collector left the held ReplicaSet's pod running, as the rules said"
    );

    let release = json!({"metadata": {"finalizers": null}});
    replica_sets
        .patch(&replica_set, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .unwrap();
    until("the pod is deleted", async || {
        let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
        verdict.reason == Reason::Unused
    })
    .await;
}

#[tokio::test]
async fn an_optional_reference_is_no_use() {
    let _running = CONTROLLERS.read().await;
    let ns = TestNamespace::new("in-use-optional").await;
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "tolerant"},
        "spec": {"containers": [{
            "name": "app",
            "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "settings", "optional": true}}],
        }]},
    }))
    .unwrap();
    ns.pods().create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(decide(&ns, Kind::ConfigMap, "settings").await.reason, Reason::Unused);
}

// --- the guard, registered ---

/// The guard with in-use protection on ([`in_use_guard_options`]), shared by the tests
/// that hold it.
/// The in-use reads of `metrics` from `source` (index, list).
fn user_reads(metrics: &Metrics, source: &str) -> u64 {
    let series = format!("cds_secret_guard_in_use_user_reads_total{{source=\"{source}\"}}");
    metric(&metrics.encode().unwrap(), &series).map_or(0, |count| count as u64)
}

/// A pod of `name` reading the ConfigMap `config_map` through a volume.
fn reader(name: &str, config_map: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "settings", "configMap": {"name": config_map}}],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn the_pod_index_answers_for_the_list_and_misses_no_pod_created_a_moment_before() {
    let ns = TestNamespace::new("in-use-index").await;
    let metrics = Arc::new(Metrics::default());
    let (lookup, watches) = KubeInUse::new(client().await).watching(
        std::slice::from_ref(&ns.name),
        NamespaceCache::default(),
        metrics.clone(),
    );
    let watches = tokio::spawn(watches);
    let pods = ns.pods();
    pods.create(&PostParams::default(), &reader("busy", "nothing"))
        .await
        .unwrap();
    // Pod writes every 10 ms: the watch is busy, as on a cluster with pods coming and going.
    let churn = tokio::spawn({
        let pods = pods.clone();
        async move {
            for i in 0.. {
                let patch = json!({"metadata": {"labels": {"tick": i.to_string()}}});
                let _ = pods.patch("busy", &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let delete = |name: &'static str| ObjectDelete {
        kind: Kind::ConfigMap,
        namespace: &ns.name,
        name,
        object: None,
        exempt: false,
        mode: in_use::Mode::Refuse,
    };
    until("the index is filled", async || {
        !lookup.cached_users(&ns.name, Kind::ConfigMap, "nothing").is_empty()
    })
    .await;

    // A pod created, then at once a delete of what it reads: never missed.
    let names = ["settings-0", "settings-1", "settings-2", "settings-3", "settings-4"];
    for (i, config_map) in names.into_iter().enumerate() {
        pods.create(&PostParams::default(), &reader(&format!("reader-{i}"), config_map))
            .await
            .unwrap();
        let verdict = in_use::decide(&delete(config_map), &lookup).await;
        assert_eq!(verdict.reason, Reason::InUse, "{config_map}: {verdict:?}");
        assert_eq!(verdict.found.pods, [format!("reader-{i}")]);
    }

    // What no pod reads: allowed, from the index caught up with the revision (or, when
    // the machine is too loaded for the watch to look busy, from the LIST).
    let (indexed, listed) = (user_reads(&metrics, "index"), user_reads(&metrics, "list"));
    let mut allows = 0;
    while user_reads(&metrics, "index") - indexed < 10 && allows < 200 {
        let verdict = in_use::decide(&delete("unused"), &lookup).await;
        assert_eq!(verdict.reason, Reason::Unused, "{verdict:?}");
        allows += 1;
    }
    let from_index = user_reads(&metrics, "index") - indexed;
    assert!(
        from_index >= 10,
        "the busy index answered {from_index} of {allows} allows (and the LIST {})",
        user_reads(&metrics, "list") - listed
    );

    // A pod the index shows denies without a read of the users.
    let before = (user_reads(&metrics, "index"), user_reads(&metrics, "list"));
    let verdict = in_use::decide(&delete("settings-0"), &lookup).await;
    assert_eq!(verdict.reason, Reason::InUse);
    assert_eq!((user_reads(&metrics, "index"), user_reads(&metrics, "list")), before);
    churn.abort();
    watches.abort();
}

fn in_use_guard() -> Arc<Guard> {
    static SHARED: Mutex<Weak<Guard>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(guard) = shared.upgrade() {
        return guard;
    }
    let guard = Arc::new(Guard::start_with(in_use_guard_options()));
    *shared = Arc::downgrade(&guard);
    guard
}

fn label(target: &[&str], ns: Option<&str>) {
    label_with(
        target,
        ns,
        &format!("{}={}", in_use::OPT_IN_LABEL, in_use::OPT_IN_VALUE),
    );
}

/// `kubectl label --overwrite TARGET LABEL` (`key-` removes it).
fn label_with(target: &[&str], ns: Option<&str>, label: &str) {
    let mut command = kubectl();
    if let Some(ns) = ns {
        command.args(["-n", ns]);
    }
    let labelled = command
        .args(["label", "--overwrite"])
        .args(target)
        .arg(label)
        .output()
        .unwrap();
    assert!(labelled.status.success(), "label {target:?}: {labelled:?}");
}

/// `kubectl delete KIND NAME` in `ns`, as admin: Ok, or the refusal kubectl prints.
async fn create_settings_and_token(ns: &TestNamespace, labels: Value) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    let settings =
        serde_json::from_value(json!({"metadata": {"name": "settings", "labels": labels}, "data": {"mode": "on"}}))
            .unwrap();
    config_maps.create(&PostParams::default(), &settings).await.unwrap();
    let token = serde_json::from_value(
        json!({"metadata": {"name": "token", "labels": labels}, "stringData": {"TOKEN": SECRET_VALUE}}),
    )
    .unwrap();
    ns.secrets().create(&PostParams::default(), &token).await.unwrap();
}

#[tokio::test]
async fn in_an_opted_in_namespace_kubectl_delete_is_refused_while_a_deployment_has_pods() {
    let _running = CONTROLLERS.read().await;
    let guard = in_use_guard();
    let ns = TestNamespace::new("in-use-kubectl").await;
    label(&["namespace", &ns.name], None);
    create_settings_and_token(&ns, json!({})).await;
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    let pods = names(&pods_of(&ns, "web", 2).await);

    for (kind, name) in [("configmap", "settings"), ("secret", "token")] {
        let refused = kubectl_delete(&ns.name, kind, name).unwrap_err();
        let says = format!(
            "admission webhook \"in-use-namespaces.cds-secret-guard.io\" denied the request: {kind} {name} is in use by pod {} in namespace {}",
            pods.join(", "),
            ns.name
        );
        assert!(refused.contains(&says), "{refused:?} lacks {says:?}");
    }
    let line = guard
        .audit_line_where("the settings denial", |line| {
            line["object"] == "settings" && line["namespace"] == ns.name.as_str()
        })
        .await;
    assert_eq!((&line["decision"], &line["reason"]), (&json!("deny"), &json!("in-use")));
    assert_eq!(line["pods"], pods.join(","));
    until_event(&ns, "a DeleteDenied Event on the ConfigMap", |event| {
        event.reason.as_deref() == Some("DeleteDenied")
            && event.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ConfigMap")
    })
    .await;
    // The local control plane's audit policy records Secrets, not ConfigMaps.
    let recorded = apiserver_audit().into_iter().any(|event| {
        event["verb"] == "delete"
            && event["objectRef"]["name"] == "token"
            && event["objectRef"]["namespace"] == ns.name.as_str()
            && event["annotations"]["in-use-namespaces.cds-secret-guard.io/reason"] == "in-use"
            && event["annotations"]["in-use-namespaces.cds-secret-guard.io/pods"] == pods.join(",").as_str()
    });
    assert!(recorded, "the apiserver's audit log has the denial's annotations");

    let scale = json!({"spec": {"replicas": 0}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    pods_of(&ns, "web", 0).await;
    assert_eq!(kubectl_delete(&ns.name, "configmap", "settings"), Ok(()));
    assert_eq!(kubectl_delete(&ns.name, "secret", "token"), Ok(()));
}

#[tokio::test]
async fn outside_the_opt_in_deletes_are_as_if_the_guard_were_absent_and_an_opted_in_object_is_kept() {
    let _running = CONTROLLERS.read().await;
    let guard = in_use_guard();
    let ns = TestNamespace::new("in-use-objects").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    for (name, labels) in [
        ("plain", json!({})),
        ("kept", json!({in_use::OPT_IN_LABEL: in_use::OPT_IN_VALUE})),
    ] {
        let config_map = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        config_maps.create(&PostParams::default(), &config_map).await.unwrap();
    }
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "reader"},
        "spec": {"containers": [{
            "name": "app", "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "plain"}}, {"configMapRef": {"name": "kept"}}],
        }]},
    }))
    .unwrap();
    ns.pods().create(&PostParams::default(), &pod).await.unwrap();

    let refused = kubectl_delete(&ns.name, "configmap", "kept").unwrap_err();
    assert!(
        refused.contains(
            "\"in-use-objects.cds-secret-guard.io\" denied the request: configmap kept is in use by pod reader"
        ),
        "{refused}"
    );
    assert_eq!(kubectl_delete(&ns.name, "configmap", "plain"), Ok(()));
    guard
        .audit_line_where("the kept denial", |line| {
            line["object"] == "kept" && line["namespace"] == ns.name.as_str()
        })
        .await;
    let plain = guard
        .audit_lines()
        .into_iter()
        .filter(|line| line["namespace"] == ns.name.as_str() && line["object"] == "plain")
        .count();
    assert_eq!(plain, 0, "a delete not opted in never reached the guard");
}

#[tokio::test]
async fn the_force_path_the_root_ca_and_namespace_deletion_are_never_blocked() {
    let _running = CONTROLLERS.read().await;
    let guard = in_use_guard();
    let ns = TestNamespace::new("in-use-force").await;
    label(&["namespace", &ns.name], None);
    create_settings_and_token(&ns, json!({})).await;
    // As kube-controller-manager's root-ca-cert-publisher makes it (the local control
    // plane does not run that controller).
    let root_ca =
        serde_json::from_value(json!({"metadata": {"name": in_use::ROOT_CA}, "data": {"ca.crt": "PEM"}})).unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    config_maps.create(&PostParams::default(), &root_ca).await.unwrap();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "reader"},
        "spec": {"containers": [{
            "name": "app", "image": "busybox",
            "envFrom": [{"configMapRef": {"name": "settings"}}, {"secretRef": {"name": "token"}}],
            "volumeMounts": [{"name": "ca", "mountPath": "/ca"}],
        }], "volumes": [{"name": "ca", "configMap": {"name": "kube-root-ca.crt"}}]},
    }))
    .unwrap();
    ns.pods().create(&PostParams::default(), &pod).await.unwrap();
    assert!(kubectl_delete(&ns.name, "secret", "token").is_err());

    let annotated = kubectl()
        .args(["-n", &ns.name, "annotate", "secret", "token"])
        .arg(format!("{}=INC-42 rotate the token", in_use::FORCE_ANNOTATION))
        .output()
        .unwrap();
    assert!(annotated.status.success(), "{annotated:?}");
    assert_eq!(kubectl_delete(&ns.name, "secret", "token"), Ok(()));
    let line = guard
        .audit_line_where("the forced delete", |line| {
            line["object"] == "token" && line["namespace"] == ns.name.as_str() && line["decision"] == "allow"
        })
        .await;
    assert_eq!(line["reason"], "forced");
    assert!(
        line["detail"].as_str().unwrap().contains("INC-42 rotate the token"),
        "{line}"
    );
    let recorded = apiserver_audit().into_iter().any(|event| {
        event["verb"] == "delete"
            && event["objectRef"]["name"] == "token"
            && event["objectRef"]["namespace"] == ns.name.as_str()
            && event["annotations"]["in-use-namespaces.cds-secret-guard.io/reason"] == "forced"
    });
    assert!(recorded, "the apiserver's audit log says the delete was forced");

    // kube-root-ca.crt, mounted by the pod: its controller must be able to replace it.
    assert_eq!(kubectl_delete(&ns.name, "configmap", "kube-root-ca.crt"), Ok(()));

    // The namespace, with the ConfigMap still in use: the namespace controller is exempt.
    assert!(kubectl_delete(&ns.name, "configmap", "settings").is_err());
    let deleted = kubectl()
        .args(["delete", "namespace", &ns.name, "--wait=false"])
        .output()
        .unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client().await);
    let deadline = Instant::now() + Duration::from_secs(60);
    while namespaces.get_opt(&ns.name).await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "namespace {} still there after 60 s",
            ns.name
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// --- deferred deletes: the same guard, in namespaces opted in with `defer` ---

const DEFER: &str = "cds-secret-guard/in-use-protection=defer";

/// `kubectl -n NS delete KIND NAME --wait=false`: whether it succeeded, and what kubectl
/// printed on stderr (the warnings of a deferred delete, or the refusal).
fn kubectl_delete_said(namespace: &str, kind: &str, name: &str) -> (bool, String) {
    let output = kubectl()
        .args(["-n", namespace, "delete", kind, name, "--wait=false"])
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The object's metadata, `None` once it is gone.
async fn metadata_of(
    ns: &TestNamespace,
    kind: Kind,
    name: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta> {
    let client = client().await;
    match kind {
        Kind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns.name)
            .get_metadata_opt(name)
            .await
            .unwrap()
            .map(|found| found.metadata),
        Kind::Secret => Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, &ns.name)
            .get_metadata_opt(name)
            .await
            .unwrap()
            .map(|found| found.metadata),
    }
}

async fn held(ns: &TestNamespace, kind: Kind, name: &str) -> bool {
    metadata_of(ns, kind, name)
        .await
        .is_some_and(|meta| in_use::is_held(&meta))
}

/// A bare pod `name` reading the ConfigMap `settings` through a volume and the Secret
/// `token` through `envFrom`.
fn settings_and_token_reader(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "app", "image": "busybox", "envFrom": [{"secretRef": {"name": "token"}}]}],
            "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
        },
    }))
    .unwrap()
}

/// Deletes the namespace and waits until it is gone: whatever the guard held in it is
/// released.
async fn namespace_deleted(ns: &TestNamespace, within: Duration) -> Duration {
    let started = Instant::now();
    let deleted = kubectl()
        .args(["delete", "namespace", &ns.name, "--wait=false"])
        .output()
        .unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client().await);
    while namespaces.get_opt(&ns.name).await.unwrap().is_some() {
        assert!(
            started.elapsed() < within,
            "namespace {} still there after {within:?}",
            ns.name
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    started.elapsed()
}

#[tokio::test]
async fn in_defer_a_used_object_is_held_and_its_delete_completes_once_its_last_pod_is_gone() {
    let _running = CONTROLLERS.read().await;
    let guard = in_use_guard();
    let ns = TestNamespace::new("in-use-defer").await;
    label_with(&["namespace", &ns.name], None, DEFER);
    create_settings_and_token(&ns, json!({})).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, &ns.name);
    let unused = serde_json::from_value(json!({"metadata": {"name": "unused"}})).unwrap();
    config_maps.create(&PostParams::default(), &unused).await.unwrap();
    ns.pods()
        .create(&PostParams::default(), &settings_and_token_reader("web"))
        .await
        .unwrap();

    // Held once a pod uses it, and only then.
    until("the finalizer on what the pod uses", async || {
        held(&ns, Kind::ConfigMap, "settings").await && held(&ns, Kind::Secret, "token").await
    })
    .await;
    assert!(!held(&ns, Kind::ConfigMap, "unused").await, "no pod uses it");

    // The delete succeeds, tells why the object stays, and the object stays.
    for (kind, name) in [("configmap", "settings"), ("secret", "token")] {
        let (deleted, said) = kubectl_delete_said(&ns.name, kind, name);
        assert!(deleted, "{kind} {name}: {said}");
        let warning = format!(
            "Warning: {kind} {name} is in use by pod web in namespace {}; it will be deleted once they are gone",
            ns.name
        );
        assert!(said.contains(&warning), "{said:?} lacks {warning:?}");
    }
    let settings = metadata_of(&ns, Kind::ConfigMap, "settings").await.unwrap();
    assert!(settings.deletion_timestamp.is_some() && in_use::is_held(&settings));
    let line = guard
        .audit_line_where("the deferred delete", |line| {
            line["object"] == "settings" && line["namespace"] == ns.name.as_str()
        })
        .await;
    assert_eq!(
        (&line["decision"], &line["reason"], &line["pods"]),
        (&json!("allow"), &json!("deferred"), &json!("web"))
    );
    let recorded = apiserver_audit().into_iter().any(|event| {
        event["verb"] == "delete"
            && event["objectRef"]["name"] == "token"
            && event["objectRef"]["namespace"] == ns.name.as_str()
            && event["annotations"]["in-use-deferred.cds-secret-guard.io/reason"] == "deferred"
    });
    assert!(recorded, "the apiserver's audit log has the deferral");
    until_event(&ns, "a DeleteDeferred Event on the ConfigMap", |event| {
        event.reason.as_deref() == Some("DeleteDeferred")
            && event.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("settings")
    })
    .await;
    // An unused object goes at once, as without the guard.
    assert!(kubectl_delete_said(&ns.name, "configmap", "unused").0);
    assert!(metadata_of(&ns, Kind::ConfigMap, "unused").await.is_none());

    // A pod created against the object being deleted uses it too: it stays for both.
    ns.pods()
        .create(&PostParams::default(), &settings_and_token_reader("late"))
        .await
        .unwrap();
    ns.pods().delete("web", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        metadata_of(&ns, Kind::ConfigMap, "settings").await.is_some(),
        "the pod created meanwhile keeps it"
    );

    // The last pod gone, both go.
    ns.pods().delete("late", &DeleteParams::default()).await.unwrap();
    let started = Instant::now();
    until("both objects gone once no pod uses them", async || {
        metadata_of(&ns, Kind::ConfigMap, "settings").await.is_none()
            && metadata_of(&ns, Kind::Secret, "token").await.is_none()
    })
    .await;
    println!("deferred deletes completed {:?} after the last pod", started.elapsed());
    let metrics = guard.metrics().await;
    assert!(
        metric(
            &metrics,
            "cds_secret_guard_in_use_finalizer_writes_total{action=\"add\"}"
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        metric(
            &metrics,
            "cds_secret_guard_in_use_finalizer_writes_total{action=\"remove\"}"
        )
        .unwrap()
            >= 2.0
    );
}

#[tokio::test]
async fn in_defer_helm_uninstalls_order_completes_and_the_force_path_deletes_at_once() {
    let _running = CONTROLLERS.read().await;
    let _guard = in_use_guard();
    let ns = TestNamespace::new("in-use-defer-helm").await;
    label_with(&["namespace", &ns.name], None, DEFER);
    create_settings_and_token(&ns, json!({})).await;
    let deployments: Api<Deployment> = Api::namespaced(client().await, &ns.name);
    deployments
        .create(&PostParams::default(), &deployment("web", 2))
        .await
        .unwrap();
    pods_of(&ns, "web", 2).await;
    until("the Deployment's objects held", async || {
        held(&ns, Kind::ConfigMap, "settings").await && held(&ns, Kind::Secret, "token").await
    })
    .await;

    // `helm uninstall`: the Deployment, then at once what its pods use. The pods are on
    // their way out, so the objects go without waiting for the garbage collector.
    let started = Instant::now();
    deployments.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(kubectl_delete_said(&ns.name, "configmap", "settings").0);
    until("the ConfigMap gone with its Deployment", async || {
        metadata_of(&ns, Kind::ConfigMap, "settings").await.is_none()
    })
    .await;
    println!(
        "a held ConfigMap deleted after its Deployment went in {:?}",
        started.elapsed()
    );

    // The force annotation: deleted at once, whatever uses it.
    ns.pods()
        .create(&PostParams::default(), &settings_and_token_reader("reader"))
        .await
        .unwrap();
    until("the token held", async || held(&ns, Kind::Secret, "token").await).await;
    let annotated = kubectl()
        .args(["-n", &ns.name, "annotate", "secret", "token"])
        .arg(format!("{}=INC-7 leaked", in_use::FORCE_ANNOTATION))
        .output()
        .unwrap();
    assert!(annotated.status.success(), "{annotated:?}");
    let started = Instant::now();
    assert!(kubectl_delete_said(&ns.name, "secret", "token").0);
    until("the forced delete done", async || {
        metadata_of(&ns, Kind::Secret, "token").await.is_none()
    })
    .await;
    println!("a forced delete of a held Secret done in {:?}", started.elapsed());
}

#[tokio::test]
async fn removing_the_opt_in_releases_and_namespace_deletion_completes() {
    let _running = CONTROLLERS.read().await;
    let _guard = in_use_guard();
    let ns = TestNamespace::new("in-use-defer-opt").await;
    label_with(&["namespace", &ns.name], None, DEFER);
    create_settings_and_token(&ns, json!({})).await;
    ns.pods()
        .create(&PostParams::default(), &settings_and_token_reader("web"))
        .await
        .unwrap();
    until("held", async || held(&ns, Kind::ConfigMap, "settings").await).await;

    // The namespace's label removed: released. Back: held again.
    label_with(&["namespace", &ns.name], None, &format!("{}-", in_use::OPT_IN_LABEL));
    until("released once the namespace is opted out", async || {
        !held(&ns, Kind::ConfigMap, "settings").await && !held(&ns, Kind::Secret, "token").await
    })
    .await;
    label_with(&["namespace", &ns.name], None, DEFER);
    until("held again", async || held(&ns, Kind::ConfigMap, "settings").await).await;
    // The object's own label says `refuse`: released, and its delete refused.
    label_with(
        &["configmap", "settings"],
        Some(&ns.name),
        &format!("{}=refuse", in_use::OPT_IN_LABEL),
    );
    until("released in refuse", async || {
        !held(&ns, Kind::ConfigMap, "settings").await
    })
    .await;
    let (deleted, said) = kubectl_delete_said(&ns.name, "configmap", "settings");
    assert!(!deleted && said.contains("is in use by pod web"), "{said}");

    // An object opted in by its own label, in a namespace that is not: held, then
    // released when the label goes.
    let other = TestNamespace::new("in-use-defer-object").await;
    create_settings_and_token(&other, json!({in_use::OPT_IN_LABEL: "defer"})).await;
    other
        .pods()
        .create(&PostParams::default(), &settings_and_token_reader("web"))
        .await
        .unwrap();
    until("the labelled object held", async || {
        held(&other, Kind::Secret, "token").await
    })
    .await;
    label_with(
        &["secret", "token"],
        Some(&other.name),
        &format!("{}-", in_use::OPT_IN_LABEL),
    );
    until("released once the object is opted out", async || {
        !held(&other, Kind::Secret, "token").await
    })
    .await;

    // Deleting a namespace whose pods use what the guard holds, and a deferred delete
    // pending in it: it completes.
    until("the token held", async || held(&ns, Kind::Secret, "token").await).await;
    assert!(kubectl_delete_said(&ns.name, "secret", "token").0);
    let took = namespace_deleted(&ns, Duration::from_secs(60)).await;
    println!("a namespace with held objects in use deleted in {took:?}");
}

#[tokio::test]
async fn release_finalizers_lets_every_deferred_delete_complete() {
    let _running = CONTROLLERS.read().await;
    let _guard = in_use_guard();
    let ns = TestNamespace::new("in-use-release").await;
    label_with(&["namespace", &ns.name], None, DEFER);
    create_settings_and_token(&ns, json!({})).await;
    ns.pods()
        .create(&PostParams::default(), &settings_and_token_reader("web"))
        .await
        .unwrap();
    until("held", async || {
        held(&ns, Kind::ConfigMap, "settings").await && held(&ns, Kind::Secret, "token").await
    })
    .await;
    assert!(kubectl_delete_said(&ns.name, "configmap", "settings").0);
    // What the chart's uninstall hook and the emergency page run.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .args(["release-finalizers", "--namespace", &ns.name])
        .env("KUBECONFIG", control_plane())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        said.contains(&format!("released {}/ConfigMap/settings", ns.name))
            && said.contains(&format!("released {}/Secret/token", ns.name)),
        "{said}"
    );
    assert!(
        metadata_of(&ns, Kind::ConfigMap, "settings").await.is_none(),
        "the deferred delete completed"
    );
}

#[tokio::test]
async fn reads_of_a_namespace_waiting_for_its_list_share_the_next_one() {
    let ns = TestNamespace::new("in-use-lists").await;
    for i in 0..3 {
        ns.pods()
            .create(
                &PostParams::default(),
                &reader(&format!("reader-{i}"), &format!("settings-{i}")),
            )
            .await
            .unwrap();
    }
    // No pod watch: every read LISTs the namespace's pods.
    let lookup = KubeInUse::new(client().await);
    let reads = (0..20).map(|i| {
        let lookup = lookup.clone();
        let namespace = ns.name.clone();
        async move {
            let name = format!("settings-{}", i % 4);
            let users = lookup.users(&namespace, Kind::ConfigMap, &name).await.unwrap();
            (name, users.into_iter().map(|user| user.name).collect::<Vec<_>>())
        }
    });
    for (name, users) in futures::future::join_all(reads).await {
        let expected: Vec<String> = match name.as_str() {
            "settings-3" => Vec::new(),
            other => vec![format!("reader-{}", &other["settings-".len()..])],
        };
        assert_eq!(users, expected, "{name}");
    }
    // The apiserver's audit log: how many LISTs of the namespace's pods were sent.
    let lists = || {
        apiserver_audit()
            .into_iter()
            .filter(|event| {
                event["verb"] == "list"
                    && event["stage"] == "ResponseComplete"
                    && event["objectRef"]["resource"] == "pods"
                    && event["objectRef"]["namespace"] == ns.name.as_str()
            })
            .count()
    };
    until("the audit log written", async || lists() > 0).await;
    let sent = lists();
    println!("20 reads at once, {sent} LISTs");
    assert!(sent <= 4, "20 reads at once sent {sent} LISTs");
}
