//! End-to-end, as an attacker would try it: the guard cannot be turned against the
//! cluster. A user who may only create pods gets no secret deleted through it, whatever
//! its pods' names, labels, annotations and secret references; a live pod keeps its
//! secret whatever the secret's ownerReferences say; and the guard asks the apiserver
//! for no secret it does not protect.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use cluster::*;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

const WITHIN: Duration = Duration::from_secs(10);

/// A worker that goes through its whole life (secret, pod, adoption, pod deleted, secret
/// collected): once its secret is gone, the reconciler and the garbage collector have
/// had their turn at everything that came before.
async fn control_worker_lifecycle(ns: &TestNamespace, worker: &str) {
    ns.worker_secret(worker).await;
    ns.worker_pod(worker).await;
    ns.owner_references(&format!("cds-worker-config-{worker}"), WITHIN)
        .await;
    ns.pods().delete(worker, &DeleteParams::default()).await.unwrap();
    ns.gone(&format!("cds-worker-config-{worker}"), Duration::from_secs(30))
        .await;
}

fn owner_uids(secret: &Secret) -> BTreeSet<String> {
    secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|owner| owner.uid.clone())
        .collect()
}

#[tokio::test]
async fn a_pod_only_user_cannot_get_any_secret_deleted() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("attack").await;
    ns.grant_pods_only("mallory");
    let mallory = client_as("mallory").await;
    let mallory_pods: Api<Pod> = Api::namespaced(mallory.clone(), &ns.name);
    let mallory_secrets: Api<Secret> = Api::namespaced(mallory, &ns.name);

    // The victims: an unprotected secret, a running worker's secret (already owned by its
    // pod), and the secret of a worker whose pod is not there yet.
    let plain = serde_json::from_value(json!({"metadata": {"name": "db-password"}, "stringData": {"p": "x"}})).unwrap();
    ns.secrets().create(&PostParams::default(), &plain).await.unwrap();
    ns.worker_secret("victim").await;
    ns.worker_pod("victim").await;
    ns.owner_references("cds-worker-config-victim", WITHIN).await;
    ns.worker_secret("later").await;
    let victims = ["db-password", "cds-worker-config-victim", "cds-worker-config-later"];
    let secrets = ns.secrets();
    let before: Vec<Secret> = futures::future::join_all(victims.map(|name| secrets.get(name)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();

    // Mallory cannot delete a secret herself...
    let refused = mallory_secrets.delete("db-password", &DeleteParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 403),
        "{refused:?}"
    );
    // ...so she tries to make the guard and the garbage collector do it, with pods that
    // claim the secrets every way a pod can: the annotation the mutation writes, the
    // worker label, spec references, under names that are not the workers'.
    let annotation = json!({"cds-secret-guard/protected-secrets": victims.join(",")});
    let tricks = [
        pod("x", json!({"CDS_WORKER_NAME": "x"}), annotation.clone(), &[]),
        pod("y", json!({"CDS_WORKER_NAME": "victim"}), annotation.clone(), &victims),
        pod(
            "z",
            json!({"CDS_WORKER_NAME": "later"}),
            annotation,
            &["cds-worker-config-later"],
        ),
        pod(
            "db-password",
            json!({"CDS_WORKER_NAME": "db-password"}),
            json!({}),
            &["db-password"],
        ),
    ];
    let mut uids = BTreeSet::new();
    for trick in &tricks {
        let created = mallory_pods.create(&PostParams::default(), trick).await.unwrap();
        uids.insert(created.metadata.uid.unwrap());
    }
    // Everything the reconciler does for those pods is done once a worker created after
    // them has been through its whole life.
    control_worker_lifecycle(&ns, "control-1").await;
    for name in victims {
        let secret = ns.secrets().get(name).await.unwrap();
        assert!(
            owner_uids(&secret).is_disjoint(&uids),
            "{name} was given to one of mallory's pods: {:?}",
            secret.metadata.owner_references
        );
    }

    // Her pods go; the garbage collector has nothing of hers to act on.
    for trick in &tricks {
        let name = trick.metadata.name.as_deref().unwrap();
        mallory_pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    control_worker_lifecycle(&ns, "control-2").await;
    for (name, before) in victims.iter().zip(&before) {
        let after = ns.secrets().get(name).await.unwrap();
        assert_eq!(
            after.metadata.uid, before.metadata.uid,
            "{name} was deleted (and recreated?)"
        );
        assert_eq!(owner_uids(&after), owner_uids(before), "{name}'s owners changed");
    }
}

/// A secret whose only owner is stale (a pod recreated under the same name, say).
fn stale_owned_secret(worker: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("cds-worker-config-{worker}"),
            "labels": {"CDS_WORKER_NAME": worker},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": worker, "uid": "00000000-0000-0000-0000-00000000dead"}],
        },
        "stringData": {"CDS_CONFIG": SECRET_VALUE},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_garbage_collector_cannot_delete_the_secret_of_a_live_pod() {
    let guard = shared_guard();
    let ns = TestNamespace::new("stale").await;
    // A live pod of the worker that does not mount the secret (so nobody adopts it):
    // the garbage collector sees the secret's only owner gone and deletes it; rule 5
    // refuses, whatever rule 3 says.
    let pod = pod("w-stale", json!({}), json!({}), &[]);
    let pod = ns.pods().create(&PostParams::default(), &pod).await.unwrap();
    let uid = pod.metadata.uid.unwrap();
    ns.secrets()
        .create(&PostParams::default(), &stale_owned_secret("w-stale"))
        .await
        .unwrap();

    let denial = guard.audit_line(&ns.name, "cds-worker-config-w-stale", "deny").await;
    assert_eq!(denial["reason"], "pod-live", "{denial}");
    assert_eq!(
        denial["user"],
        "system:serviceaccount:kube-system:generic-garbage-collector"
    );
    assert_eq!(denial["pod_uid"], uid.as_str());
    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-stale")
            .await
            .unwrap()
            .is_some()
    );

    // Once the pod really goes, the collector's next try goes through.
    ns.pods().delete("w-stale", &DeleteParams::default()).await.unwrap();
    ns.gone("cds-worker-config-w-stale", Duration::from_secs(30)).await;
    let allowed = guard.audit_line(&ns.name, "cds-worker-config-w-stale", "allow").await;
    assert_eq!(allowed["reason"], "owner-gone", "{allowed}");
}

#[tokio::test]
async fn a_stale_owner_is_replaced_by_the_live_pod() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("restale").await;
    let pod = ns.worker_pod("w-restale").await;
    let uid = pod.metadata.uid.unwrap();
    ns.secrets()
        .create(&PostParams::default(), &stale_owned_secret("w-restale"))
        .await
        .unwrap();

    // The reconciler adds the live pod (whether the collector tried, and was refused,
    // first or not); the collector then drops the stale owner.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let secret = ns.secrets().get("cds-worker-config-w-restale").await.unwrap();
        if owner_uids(&secret) == BTreeSet::from([uid.clone()]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "owners: {:?}",
            secret.metadata.owner_references
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ns.pods().delete("w-restale", &DeleteParams::default()).await.unwrap();
    ns.gone("cds-worker-config-w-restale", Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_delete_in_a_terminating_namespace_is_allowed() {
    let guard = shared_guard();
    let ns = TestNamespace::new("terminating").await;
    // Finalizers hold the secret, the pod and so the namespace in place while it
    // terminates.
    let hold = Some(vec!["e2e.cds-secret-guard.io/hold".to_owned()]);
    let mut secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "cds-worker-config-w-term", "labels": {"CDS_WORKER_NAME": "w-term"}},
        "stringData": {"k": "v"},
    }))
    .unwrap();
    secret.metadata.finalizers = hold.clone();
    ns.secrets().create(&PostParams::default(), &secret).await.unwrap();
    let mut held = pod("w-term", json!({}), json!({}), &["cds-worker-config-w-term"]);
    held.metadata.finalizers = hold;
    ns.pods().create(&PostParams::default(), &held).await.unwrap();
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let refused = ns.delete_secret("cds-worker-config-w-term", &dry_run).await;
    assert!(refused.is_err_and(|status| status.code == 403), "young and in use");

    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(ns.client.clone());
    namespaces.delete(&ns.name, &DeleteParams::default()).await.unwrap();
    // Anyone's delete is now allowed, whatever rules 4 and 5 would say: once the guard's
    // namespace watch shows the deletion. Until then its cache shows the namespace alive
    // and the denial stands (the safe side; the namespace controller retries).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ns.delete_secret("cds-worker-config-w-term", &dry_run).await {
            Ok(_) => break,
            Err(status) => {
                assert_eq!(status.code, 403, "{status:?}");
                assert!(
                    Instant::now() < deadline,
                    "still denied 10 s after the namespace was deleted: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let allowed = guard.audit_line(&ns.name, "cds-worker-config-w-term", "allow").await;
    assert_eq!(allowed["reason"], "namespace-terminating", "{allowed}");
    assert_eq!(allowed["user"], "admin");

    let release = json!({"metadata": {"finalizers": null}});
    let patch = kube::api::Patch::Merge(&release);
    ns.pods().patch("w-term", &Default::default(), &patch).await.unwrap();
    ns.secrets()
        .patch("cds-worker-config-w-term", &Default::default(), &patch)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_worker_name_that_cannot_be_a_label_value_does_not_stick() {
    let guard = shared_guard();
    let ns = TestNamespace::new("longname").await;
    // 64 characters: a valid secret name suffix, not a valid label value.
    let worker = "w".repeat(64);
    let name = format!("cds-worker-config-{worker}");
    let secret = serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})).unwrap();
    ns.secrets().create(&PostParams::default(), &secret).await.unwrap();
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;

    ns.delete_secret(&name, &DeleteParams::default())
        .await
        .expect("an orphan is deleted, not refused by a failing label query");
    let allowed = guard.audit_line(&ns.name, &name, "allow").await;
    assert_eq!(allowed["reason"], "orphan");
}

/// Checked in the apiserver's own audit log: every secret request the guard's service
/// account made is a label-selected list or watch of worker secrets, or a read or patch of
/// a secret with a protected name.
#[tokio::test]
async fn the_guard_asks_for_no_secret_it_does_not_protect() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("privacy").await;
    let plain =
        serde_json::from_value(json!({"metadata": {"name": "not-a-worker-secret"}, "stringData": {"p": "x"}})).unwrap();
    ns.secrets().create(&PostParams::default(), &plain).await.unwrap();
    control_worker_lifecycle(&ns, "w-privacy").await;

    let guard_user = "system:serviceaccount:cds-secret-guard:cds-secret-guard";
    let mut seen = 0;
    for event in apiserver_audit() {
        if event["user"]["username"] != guard_user || event["objectRef"]["resource"] != "secrets" {
            continue;
        }
        seen += 1;
        let (verb, uri) = (event["verb"].as_str().unwrap(), event["requestURI"].as_str().unwrap());
        let name = event["objectRef"]["name"].as_str().unwrap_or_default();
        let ok = match verb {
            "list" | "watch" => uri.contains("labelSelector=CDS_WORKER_NAME"),
            "get" | "patch" => name.starts_with("cds-worker-config-") || name.starts_with("cds-worker-registry-"),
            _ => false,
        };
        assert!(ok, "the guard asked for {verb} {uri}");
        assert_ne!(name, "not-a-worker-secret");
    }
    assert!(
        seen > 0,
        "no secret request by {guard_user} in the audit log: is it running as its service account?"
    );
}
