//! End-to-end: the namespaced install. A guard given `--namespace` runs as a service
//! account bound only to the Role of `manifests/overlays/namespaced/role.yaml` in that
//! namespace (and the ClusterRole reading that one namespace), and protects it fully;
//! other namespaces never reach it.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::time::Duration;

use cluster::*;
use kube::api::DeleteParams;

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_namespaced_guard_protects_its_namespace_with_a_role_only() {
    let ns = TestNamespace::new("scoped").await;
    let elsewhere = TestNamespace::new("elsewhere").await;
    // The shipped Role, for this namespace and a service account of its own (the shared
    // one is bound to the ClusterRole).
    let role = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/overlays/namespaced/role.yaml"
    ))
    .unwrap()
    .replace("namespace: cds-secret-guard", "namespace: cds-secret-guard-scoped")
    .replace("namespace: cds\n", &format!("namespace: {}\n", ns.name))
    .replace("resourceNames: [\"cds\"]", &format!("resourceNames: [\"{}\"]", ns.name))
    .replace(
        "name: cds-secret-guard-namespaces",
        &format!("name: {}-namespaces", ns.name),
    );
    let _ = kubectl()
        .args(["create", "namespace", "cds-secret-guard-scoped"])
        .output();
    let _ = kubectl()
        .args([
            "-n",
            "cds-secret-guard-scoped",
            "create",
            "serviceaccount",
            "cds-secret-guard",
        ])
        .output();
    ns.apply(&role);
    let guard = Guard::start_with(GuardOptions {
        kubeconfig: service_account_kubeconfig("cds-secret-guard-scoped", "cds-secret-guard"),
        env: vec![("CDS_GUARD_NAMESPACES".into(), ns.name.clone())],
        register: Some(vec!["--namespace".into(), ns.name.clone()]),
    });

    // Its namespace: young secrets kept, pods labelled, secrets adopted, orphans freed,
    // a live pod's secret kept past the grace period.
    ns.worker_secret("w-young").await;
    let refused = ns
        .delete_secret("cds-worker-config-w-young", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code, 403, "{refused:?}");
    ns.worker_secret("w-live").await;
    let pod = ns.worker_pod("w-live").await;
    assert_eq!(
        pod.metadata
            .labels
            .unwrap_or_default()
            .get("CDS_WORKER_NAME")
            .map(String::as_str),
        Some("w-live")
    );
    let owners = ns.owner_references("cds-worker-config-w-live", WITHIN).await;
    assert_eq!(owners[0].uid, pod.metadata.uid.unwrap());
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
    let refused = ns
        .delete_secret("cds-worker-config-w-live", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(refused.message.contains("still uses secret"), "{refused:?}");
    ns.delete_secret("cds-worker-config-w-young", &DeleteParams::default())
        .await
        .expect("an orphan past the grace period");
    ns.pods().delete("w-live", &DeleteParams::default()).await.unwrap();
    ns.gone("cds-worker-config-w-live", Duration::from_secs(30)).await;

    // Another namespace never reaches this guard.
    elsewhere.worker_secret("w-other").await;
    elsewhere
        .delete_secret("cds-worker-config-w-other", &DeleteParams::default())
        .await
        .expect("not this guard's namespace");
    assert!(
        guard
            .audit_lines()
            .iter()
            .all(|line| line["namespace"] != elsewhere.name.as_str()),
        "a request from another namespace reached the scoped guard"
    );
    // Everything it did, its Role allowed.
    let user = "system:serviceaccount:cds-secret-guard-scoped:cds-secret-guard";
    let requests: Vec<_> = apiserver_audit()
        .into_iter()
        .filter(|event| event["user"]["username"] == user)
        .collect();
    assert!(!requests.is_empty(), "no request by {user} in the audit log");
    let forbidden: Vec<_> = requests
        .iter()
        .filter(|event| event["responseStatus"]["code"] == 403)
        .map(|event| format!("{} {}", event["verb"], event["requestURI"]))
        .collect();
    assert!(forbidden.is_empty(), "the Role was not enough: {forbidden:?}");
}
