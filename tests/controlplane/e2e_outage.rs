//! End-to-end: while the guard is down, worker-secret deletes fail (failurePolicy Fail)
//! and nothing is lost; once it is back, deletes are decided again.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::time::Duration;

use cluster::*;
use kube::api::DeleteParams;

/// These tests stop guards on purpose: one at a time, so that no other guard covers for
/// the stopped one.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn worker_secrets_survive_a_guard_outage() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let guard = Guard::start();
    let ns = TestNamespace::new("outage").await;
    ns.worker_secret("w-outage").await;
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;

    guard.kill();
    let refused = ns
        .delete_secret("cds-worker-config-w-outage", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code, 500, "{refused:?}");
    assert!(
        refused.message.contains("failed calling webhook"),
        "{}",
        refused.message
    );
    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-outage")
            .await
            .unwrap()
            .is_some(),
        "nothing lost"
    );

    guard.run();
    ns.delete_secret("cds-worker-config-w-outage", &DeleteParams::default())
        .await
        .expect("an orphan, deleted once the guard is back");
}

/// Pods and secrets created while the guard is down get their references once it is back.
#[tokio::test]
async fn restarted_guard_backfills_references() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let guard = Guard::unregistered();
    guard.kill();
    let ns = TestNamespace::new("backfill").await;
    ns.worker_secret("w-back").await;
    // The CDS hatchery labels its pods itself.
    let pod = ns
        .worker_pod_labelled("w-back", serde_json::json!({"CDS_WORKER_NAME": "w-back"}))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = ns.secrets().get_metadata("cds-worker-config-w-back").await.unwrap();
    assert!(
        before.metadata.owner_references.is_none(),
        "nobody adopted it while the guard was down"
    );

    guard.run();

    let owners = ns
        .owner_references("cds-worker-config-w-back", Duration::from_secs(10))
        .await;
    assert_eq!(owners[0].uid, pod.metadata.uid.unwrap());
}

/// The exempt namespace controller is left out by the webhook's own match conditions:
/// a namespace full of workers is deleted while no guard answers.
#[tokio::test]
async fn namespace_deletion_completes_with_the_guard_down() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let guard = Guard::start();
    let ns = TestNamespace::new("down").await;
    for worker in ["w-d1", "w-d2", "w-d3"] {
        ns.worker_secret(worker).await;
        ns.worker_pod(worker).await;
    }
    guard.kill();
    let refused = ns
        .delete_secret("cds-worker-config-w-d1", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(
        refused.code, 500,
        "the guard is down and the webhook fails closed: {refused:?}"
    );

    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(ns.client.clone());
    namespaces.delete(&ns.name, &DeleteParams::default()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while namespaces.get_opt(&ns.name).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "namespace {} still there after 90s with the guard down",
            ns.name
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
