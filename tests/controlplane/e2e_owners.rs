//! End-to-end: worker secrets follow their pods. The guard's reconciler gives each
//! secret an ownerReference to its pod (confirmed by quorum read), and the real garbage
//! collector deletes the secret when the pod goes.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::{process::Command, time::Duration, time::Instant};

use cluster::*;
use kube::api::DeleteParams;
use serde_json::{Value, json};

const WITHIN: Duration = Duration::from_secs(10);

#[tokio::test]
async fn secret_is_owned_by_its_pod_and_goes_with_it() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("owned").await;
    ns.worker_secret("w-own").await;
    let pod = ns.worker_pod("w-own").await;

    let owners = ns.owner_references("cds-worker-config-w-own", WITHIN).await;

    assert_eq!(owners.len(), 1, "{owners:?}");
    let owner = &owners[0];
    assert_eq!(
        (owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str()),
        ("v1", "Pod", "w-own")
    );
    assert_eq!(Some(&owner.uid), pod.metadata.uid.as_ref(), "the pod's own UID");
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(false), Some(false))
    );

    ns.pods().delete("w-own", &DeleteParams::default()).await.unwrap();
    ns.gone("cds-worker-config-w-own", Duration::from_secs(30)).await;
}

#[tokio::test]
async fn secret_created_after_its_pod_is_adopted() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("late").await;
    let pod = ns.worker_pod("w-late").await;
    ns.worker_secret("w-late").await;

    let owners = ns.owner_references("cds-worker-config-w-late", WITHIN).await;

    assert_eq!(
        owners.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(),
        [pod.metadata.uid.unwrap().as_str()]
    );
}

/// Two guards reconcile the same secrets at once; each secret gets exactly one reference.
/// Also prints the adoption latency (pod created → reference seen), for the record.
#[tokio::test]
async fn two_guards_write_one_reference_each() {
    let _guard = shared_guard();
    let _second = Guard::unregistered();
    let ns = TestNamespace::new("pair").await;
    let workers: Vec<String> = (0..30).map(|i| format!("w-pair-{i}")).collect();
    let mut latencies = Vec::new();
    for worker in &workers {
        ns.worker_secret(worker).await;
        let created = Instant::now();
        ns.worker_pod(worker).await;
        ns.owner_references(&format!("cds-worker-config-{worker}"), WITHIN)
            .await;
        latencies.push(created.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    for worker in &workers {
        let secret = ns
            .secrets()
            .get_metadata(&format!("cds-worker-config-{worker}"))
            .await
            .unwrap();
        assert_eq!(
            secret.metadata.owner_references.unwrap().len(),
            1,
            "{worker}: one reference, not two"
        );
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    println!(
        "adoption latency over {} pods: p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
}

/// How long the guard's pod watch may still show a deleted pod: a live pod it shows denies
/// at once, without a read (the safe side). Well inside the shared guard's grace period
/// (4 s), so a guard that did not waive the grace for a gone owner still fails the test.
const WATCH_LAG: Duration = Duration::from_secs(1);

/// The hatchery's kill path: delete the pod, then at once its secret. Either the guard
/// lets the delete through (owner gone, however young the secret) once its pod watch has
/// seen the pod go, or the garbage collector was first (404).
#[tokio::test]
async fn kill_path_leaves_no_secret() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("kill").await;
    for i in 0..5 {
        let worker = format!("w-kill-{i}");
        ns.worker_secret(&worker).await;
        ns.worker_pod(&worker).await;
        ns.owner_references(&format!("cds-worker-config-{worker}"), WITHIN)
            .await;
    }
    let mut denied_while_the_watch_lagged = 0;
    for i in 0..5 {
        let worker = format!("w-kill-{i}");
        ns.pods().delete(&worker, &DeleteParams::default()).await.unwrap();
        let pod_deleted = Instant::now();
        loop {
            match ns
                .delete_secret(&format!("cds-worker-config-{worker}"), &DeleteParams::default())
                .await
            {
                Ok(()) => break,
                Err(status) if status.code == 404 => break,
                Err(status) if status.code == 403 && pod_deleted.elapsed() < WATCH_LAG => {
                    denied_while_the_watch_lagged += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(status) => panic!(
                    "only 'already gone' is acceptable {:?} after the pod's delete: {status:?}",
                    pod_deleted.elapsed()
                ),
            }
        }
    }
    println!("{denied_while_the_watch_lagged} deletes denied while the guard's pod watch still showed the pod");
    for i in 0..5 {
        ns.gone(&format!("cds-worker-config-w-kill-{i}"), Duration::from_secs(30))
            .await;
    }
}

#[tokio::test]
async fn check_reports_each_case() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("check").await;
    ns.worker_secret("w-ok").await;
    ns.worker_pod("w-ok").await;
    ns.owner_references("cds-worker-config-w-ok", WITHIN).await;
    ns.worker_secret("w-gone").await;
    ns.worker_secret("w-mis").await;
    // The mutation never overwrites a label: this pod keeps a wrong worker name.
    ns.worker_pod_labelled("w-mis", json!({"CDS_WORKER_NAME": "someone-else"}))
        .await;

    // `check` runs as a service account bound only to its shipped read-only role.
    guard_kubeconfig();
    let _ = kubectl()
        .args([
            "-n",
            "cds-secret-guard",
            "create",
            "serviceaccount",
            "cds-secret-guard-check",
        ])
        .output();
    let _ = kubectl()
        .args([
            "create",
            "clusterrolebinding",
            "cds-secret-guard-check",
            "--clusterrole=cds-secret-guard-check",
            "--serviceaccount=cds-secret-guard:cds-secret-guard-check",
        ])
        .output();
    let checker = service_account_kubeconfig("cds-secret-guard", "cds-secret-guard-check");
    let output = Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .args(["check", "--namespace", &ns.name, "--output", "json"])
        .env("KUBECONFIG", &checker)
        .output()
        .unwrap();

    assert_eq!(
        output.status.code(),
        Some(1),
        "a mismatch exits 1: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let reports: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    let verdict = |secret: &str| {
        let report = reports
            .iter()
            .find(|r| r["secret"] == secret)
            .unwrap_or_else(|| panic!("{secret} not reported"));
        (
            report["verdict"].as_str().unwrap().to_owned(),
            report["owner"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(
        verdict("cds-worker-config-w-ok"),
        ("protected".to_owned(), "ok".to_owned())
    );
    assert_eq!(
        verdict("cds-worker-config-w-gone"),
        ("orphan".to_owned(), "none".to_owned())
    );
    assert_eq!(verdict("cds-worker-config-w-mis").0, "mismatched");
    let mismatched = reports
        .iter()
        .find(|r| r["secret"] == "cds-worker-config-w-mis")
        .unwrap();
    assert_eq!(mismatched["mismatches"][0], "CDS_WORKER_NAME: w-mis≠someone-else");

    let table = Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .args(["check", "-n", &ns.name])
        .env("KUBECONFIG", &checker)
        .output()
        .unwrap();
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("cds-worker-config-w-gone") && l.ends_with("orphan")),
        "{text}"
    );

    // The same binary as a kubectl plugin, with kubectl's flags.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_cds-secret-guard"),
        plugins.path().join("kubectl-cds_guard"),
    )
    .unwrap();
    let path = format!("{}:{}", plugins.path().display(), std::env::var("PATH").unwrap());
    let plugin = kubectl()
        .args([
            "cds-guard",
            "check",
            "-n",
            &ns.name,
            "-o",
            "json",
            "--context",
            "cds-guard-test",
        ])
        .arg("--kubeconfig")
        .arg(&checker)
        .env("PATH", path)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(
        plugin.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&plugin.stderr)
    );
    let through_kubectl: Vec<Value> = serde_json::from_slice(&plugin.stdout).unwrap();
    assert_eq!(through_kubectl.len(), reports.len());
}
