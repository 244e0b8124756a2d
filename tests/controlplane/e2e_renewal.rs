//! End-to-end: certificates the guard renews itself (`--certificate-secret`), against
//! the real apiserver, with a CA of 30 s and leaves of 10 s: one CA rotation and several
//! leaf renewals while deletes keep coming, and not one webhook call fails (the
//! apiserver's own admission metrics and every client's answer). The guard runs as its
//! shipped service account with the renewal rights the chart grants, rendered from the
//! chart, and those rights reach no other secret or webhook configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use testkit::cluster;

use std::{
    collections::BTreeSet,
    io::Write,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use cluster::*;
use kube::api::DeleteParams;
use serde_json::Value;

const NAMESPACE: &str = "cds-secret-guard";
const STATE: &str = "cds-secret-guard-certificate";
const CONFIGURATION: &str = "cds-secret-guard";
const SERVICE_ACCOUNT: &str = "system:serviceaccount:cds-secret-guard:cds-secret-guard";

/// The chart's renewal objects (the state secret and its rights) for a release named
/// like the shipped one, applied as admin, deleted when dropped: Helm would refuse to
/// adopt them.
struct ChartRenewalObjects(Vec<u8>);

impl Drop for ChartRenewalObjects {
    fn drop(&mut self) {
        let mut delete = kubectl()
            .args(["delete", "--ignore-not-found", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        delete.stdin.take().unwrap().write_all(&self.0).unwrap();
        let deleted = delete.wait().unwrap().success();
        assert!(
            deleted || std::thread::panicking(),
            "delete the chart's renewal objects"
        );
    }
}

fn apply_chart_renewal_objects() -> ChartRenewalObjects {
    let rendered = std::process::Command::new(repo().join("target/tools/bin/helm"))
        .args(["template", "cds-secret-guard"])
        .arg(repo().join("manifests/helm/cds-secret-guard"))
        .args(["-n", NAMESPACE, "--show-only", "templates/renewal.yaml"])
        .output()
        .expect("helm from hack/tools/build.sh (make test builds it); this test never skips");
    assert!(rendered.status.success(), "helm template: {rendered:?}");
    let _ = kubectl().args(["create", "namespace", NAMESPACE]).output();
    // A state left by an earlier run would carry CAs the webhooks no longer hold.
    let _ = kubectl()
        .args(["-n", NAMESPACE, "delete", "secret", STATE, "--ignore-not-found"])
        .output();
    assert!(
        kubectl_apply(None, &rendered.stdout),
        "apply the chart's renewal objects"
    );
    ChartRenewalObjects(rendered.stdout)
}

/// Both webhook configurations for the guard at `url`, limited to `namespace`, with no
/// caBundle: the guard publishes its own.
fn register_without_ca(url: &str, namespace: &str) {
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .args(["webhooks", "--url", url, "--namespace", namespace])
        .output()
        .unwrap();
    assert!(printed.status.success(), "webhooks: {printed:?}");
    let text = String::from_utf8(printed.stdout).unwrap();
    assert!(!text.contains("caBundle"), "printed without a CA");
    assert!(kubectl_apply(None, text.as_bytes()), "apply the webhooks");
}

/// The CAs (DER, base64) each webhook of both configurations trusts.
fn held_bundles() -> Vec<BTreeSet<String>> {
    let mut bundles = Vec::new();
    for kind in ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"] {
        let output = kubectl()
            .args(["get", kind, CONFIGURATION, "-o", "json"])
            .output()
            .unwrap();
        assert!(output.status.success(), "get {kind}: {output:?}");
        let object: Value = serde_json::from_slice(&output.stdout).unwrap();
        for webhook in object["webhooks"].as_array().unwrap() {
            let pem = webhook["clientConfig"]["caBundle"]
                .as_str()
                .map(|encoded| BASE64.decode(encoded).unwrap())
                .unwrap_or_default();
            let text = String::from_utf8(pem).unwrap();
            bundles.push(
                text.split("-----END CERTIFICATE-----")
                    .map(|block| {
                        block
                            .replace("-----BEGIN CERTIFICATE-----", "")
                            .split_whitespace()
                            .collect::<String>()
                    })
                    .filter(|der| !der.trim().is_empty())
                    .collect(),
            );
        }
    }
    bundles
}

/// Webhook calls and failed calls to the guard's webhooks, from the apiserver's metrics.
fn webhook_calls() -> (f64, f64) {
    let output = kubectl().args(["get", "--raw", "/metrics"]).output().unwrap();
    let metrics = String::from_utf8(output.stdout).unwrap();
    let (mut calls, mut failed) = (0.0, 0.0);
    for line in metrics.lines().filter(|line| line.contains(".cds-secret-guard.io\"")) {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        if line.starts_with("apiserver_admission_webhook_request_total{") {
            calls += value;
        } else if line.starts_with("apiserver_admission_webhook_fail_open_count{")
            || (line.starts_with("apiserver_admission_webhook_rejection_count{")
                && !line.contains("error_type=\"no_error\""))
        {
            failed += value;
        }
    }
    (calls, failed)
}

fn can_i(verb_and_resource: &[&str]) -> bool {
    let output = kubectl()
        .args(["auth", "can-i", "--as", SERVICE_ACCOUNT])
        .args(verb_and_resource)
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout).trim() == "yes"
}

#[tokio::test]
async fn a_ca_rotation_and_leaf_renewals_under_load_fail_no_call() {
    control_plane();
    guard_kubeconfig();
    let _applied = apply_chart_renewal_objects();
    assert_renewal_rights_reach_only_the_state_secret_and_the_two_configurations();
    let ns = TestNamespace::new("renewal").await;
    let guard = Guard::start_with(GuardOptions {
        env: vec![
            ("CDS_GUARD_CERTIFICATE_SECRET".to_owned(), STATE.to_owned()),
            ("CDS_GUARD_CERTIFICATE_NAMESPACE".to_owned(), NAMESPACE.to_owned()),
            ("CDS_GUARD_CERTIFICATE_HOSTS".to_owned(), "127.0.0.1".to_owned()),
            ("CDS_GUARD_CA_VALIDITY".to_owned(), "30s".to_owned()),
            ("CDS_GUARD_LEAF_VALIDITY".to_owned(), "10s".to_owned()),
        ],
        register: None,
        ..GuardOptions::default()
    });
    // Fresh configurations: `kubectl apply` would keep an earlier run's caBundle.
    assert!(unregister_webhooks());
    register_without_ca(&format!("https://{}", guard.admission_addr()), &ns.name);

    // The guard publishes its CA into both configurations.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let held = held_bundles();
        if held.len() == 2 && held.iter().all(|bundle| bundle.len() == 1) && held[0] == held[1] {
            break held[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the CA was never published: {held:?}\n{}",
            guard.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Deletes keep coming, as dry runs (each one a webhook call), from 4 clients.
    ns.worker_secret("w-renewal").await;
    let (calls_before, failed_before) = webhook_calls();
    let answered = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut load = Vec::new();
    for _ in 0..4 {
        let (secrets, answered, failures, stop) = (ns.secrets(), answered.clone(), failures.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let dry_run = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            while !stop.is_cancelled() {
                match secrets.delete("cds-worker-config-w-renewal", &dry_run).await {
                    Ok(_) => {}
                    // The guard's own answer: decided, not failed.
                    Err(kube::Error::Api(status)) if status.message.contains("cds-secret-guard") => {}
                    Err(error) => failures.lock().unwrap().push(error.to_string()),
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // Watch the bundle through one CA rotation: {A}, {A, B}, {B}.
    let mut seen: Vec<BTreeSet<String>> = vec![first.clone()];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // The configurations are written one after the other: follow the first.
        let held = held_bundles();
        if seen.last() != Some(&held[0]) {
            seen.push(held[0].clone());
        }
        let rotated = seen.last().is_some_and(|bundle| bundle.len() == 1 && *bundle != first);
        if rotated {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no CA rotation within 60 s: {seen:?}\n{}",
            guard.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Let the new CA's first leaves be served for a while.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = held_bundles();
    assert!(
        held.iter().all(|bundle| *bundle == held[0]),
        "every webhook holds the same bundle: {held:?}"
    );
    stop.cancel();
    for task in load {
        task.await.unwrap();
    }
    let (calls_after, failed_after) = webhook_calls();

    let renewals = guard
        .log_lines()
        .iter()
        .filter(|line| {
            line["message"] == "new serving certificate" || line["message"] == "the next CA signs from now on"
        })
        .count();
    let answered = answered.load(Ordering::Relaxed);
    let calls = calls_after - calls_before;
    let failed = failed_after - failed_before;
    println!(
        "renewal: {answered} deletes, {calls} webhook calls, {failed} failed, {renewals} leaves signed (1 CA rotation)"
    );
    let failures = failures.lock().unwrap();
    println!(
        "renewal: {} deletes failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    // The order: the new CA joined the old one before the old one left.
    assert_eq!(seen.len(), 3, "bundles seen: {seen:?}");
    assert!(
        seen[1].len() == 2 && seen[1].is_superset(&seen[0]) && seen[1].is_superset(&seen[2]),
        "bundles seen: {seen:?}"
    );

    assert!(
        failures.is_empty(),
        "{} deletes failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        calls >= answered as f64 * 0.9,
        "the deletes reached the guard: {calls} calls"
    );
    assert_eq!(failed, 0.0, "failed webhook calls (apiserver metrics)");
    assert!(renewals >= 3, "leaves signed: {renewals}\n{}", guard.log());

    assert!(unregister_webhooks());
}

/// What the chart's renewal rights allow the guard's service account, and what not.
fn assert_renewal_rights_reach_only_the_state_secret_and_the_two_configurations() {
    let secret = format!("secrets/{STATE}");
    for (verb, resource) in [("get", &*secret), ("update", &*secret), ("watch", &*secret)] {
        assert!(can_i(&[verb, resource, "-n", NAMESPACE]), "{verb} {resource}");
    }
    for kind in ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"] {
        let named = format!("{kind}/{CONFIGURATION}");
        assert!(can_i(&["update", &named]), "update {named}");
        let other = format!("{kind}/another-webhook");
        assert!(!can_i(&["update", &other]), "update {other}");
        assert!(!can_i(&["create", kind]), "create {kind}");
        assert!(!can_i(&["delete", &named]), "delete {named}");
    }
    for (verb, resource) in [
        ("update", "secrets/another-secret"),
        ("create", "secrets"),
        ("delete", &*secret),
        ("update", "secrets"),
    ] {
        assert!(!can_i(&[verb, resource, "-n", NAMESPACE]), "{verb} {resource}");
    }
}
