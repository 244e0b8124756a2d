//! End-to-end: in-use protection's rules over quorum reads of the real apiserver, beside
//! the real Deployment and ReplicaSet controllers and garbage collector. A Deployment's
//! pods keep the ConfigMap and Secret they name; the garbage collector's own judgement of
//! which pods go after their owner is the rules' judgement.
#![allow(clippy::unwrap_used)]

#[path = "e2e/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use cds_secret_guard::{
    in_use::{self, KubeInUse, ObjectDelete, Reason, Verdict},
    references::Kind,
};
use harness::*;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{ConfigMap, Pod},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

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
    assert_eq!((verdict.reason, &verdict.pods), (Reason::InUse, &names(&pods)));
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
        (verdict.reason, &verdict.pods),
        (Reason::InUse, &names(&pods)),
        "while orphaning"
    );
    until("the Deployment is gone", async || {
        deployments.get_opt("kept").await.unwrap().is_none()
    })
    .await;
    let verdict = decide(&ns, Kind::ConfigMap, "settings").await;
    assert_eq!(
        (verdict.reason, &verdict.pods),
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
    assert_eq!((verdict.reason, &verdict.pods), (Reason::InUse, &names(&pods)));
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
