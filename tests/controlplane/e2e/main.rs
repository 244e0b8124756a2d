//! End-to-end: the guard registered with a real kube-apiserver (etcd behind it, garbage
//! collector and namespace controller beside it), asserted as a client sees it.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::time::Duration;

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use cluster::*;
use kube::api::DeleteParams;

async fn past_grace_period() {
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;
}

fn denied_by_guard(status: &kube::core::Status, says: &str) {
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status.message.contains("secret-deletes.cds-secret-guard.io"),
        "{}",
        status.message
    );
    assert!(status.message.contains(says), "{:?} lacks {says:?}", status.message);
}

#[tokio::test]
async fn young_worker_secret_is_kept() {
    let guard = shared_guard();
    let ns = TestNamespace::new("young").await;
    ns.worker_secret("w-young").await;

    let refused = ns
        .delete_secret("cds-worker-config-w-young", &DeleteParams::default())
        .await
        .unwrap_err();

    denied_by_guard(&refused, "cannot be deleted within 4s of creation");
    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-young")
            .await
            .unwrap()
            .is_some(),
        "secret kept"
    );
    let audit = guard.audit_line(&ns.name, "cds-worker-config-w-young", "deny").await;
    assert_eq!(audit["reason"], "too-young");
    assert_eq!(audit["worker"], "w-young");
    assert_eq!(audit["user"], "admin");
    assert_eq!(audit["dry_run"], false);
}

#[tokio::test]
async fn live_pod_keeps_its_secret_after_the_grace_period_dry_run_included() {
    let guard = shared_guard();
    let ns = TestNamespace::new("live").await;
    ns.worker_secret("w-live").await;
    let pod = ns.worker_pod("w-live").await;
    past_grace_period().await;

    let refused = ns
        .delete_secret("cds-worker-config-w-live", &DeleteParams::default())
        .await
        .unwrap_err();
    let uid = pod.metadata.uid.unwrap();
    denied_by_guard(
        &refused,
        &format!("pod w-live (uid {uid}, Pending) still uses secret cds-worker-config-w-live"),
    );
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    let refused = ns
        .delete_secret("cds-worker-config-w-live", &dry_run)
        .await
        .unwrap_err();
    denied_by_guard(&refused, "still uses secret");

    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-live")
            .await
            .unwrap()
            .is_some(),
        "secret kept"
    );
    let audit = guard.audit_line(&ns.name, "cds-worker-config-w-live", "deny").await;
    assert_eq!(audit["reason"], "pod-live");
    assert_eq!(audit["pod"], "w-live");
    let dry = guard
        .audit_line_where("dry-run audit line for cds-worker-config-w-live", |l| {
            l["namespace"] == ns.name.as_str() && l["secret"] == "cds-worker-config-w-live" && l["dry_run"] == true
        })
        .await;
    assert_eq!(dry["decision"], "deny", "dry-run denial audited");
}

#[tokio::test]
async fn orphan_and_unprotected_secrets_are_deleted() {
    let guard = shared_guard();
    let ns = TestNamespace::new("orphan").await;
    ns.worker_secret("w-orphan").await;
    let other = serde_json::from_value(serde_json::json!({"metadata": {"name": "database-password"}})).unwrap();
    ns.secrets().create(&Default::default(), &other).await.unwrap();

    ns.delete_secret("database-password", &DeleteParams::default())
        .await
        .expect("unprotected: deleted at once");
    past_grace_period().await;
    ns.delete_secret("cds-worker-config-w-orphan", &DeleteParams::default())
        .await
        .expect("orphan: deleted");

    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-orphan")
            .await
            .unwrap()
            .is_none()
    );
    let audit = guard.audit_line(&ns.name, "cds-worker-config-w-orphan", "allow").await;
    assert_eq!(audit["reason"], "orphan");
}

/// The label LIST asks for small pages (one APF seat each): a live pod of the worker on a
/// later page must still be found.
#[tokio::test]
async fn a_labelled_live_pod_past_the_first_page_keeps_its_secret() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("paged").await;
    ns.worker_secret("w-paged").await;
    // Finished pods first (the apiserver lists by name): a page's worth and more.
    let finished = serde_json::json!({"status": {"phase": "Succeeded"}});
    for i in 0..12 {
        let name = format!("a-done-{i:02}");
        ns.pods()
            .create(&Default::default(), &labelled_pod(&name, "w-paged"))
            .await
            .unwrap();
        ns.pods()
            .patch_status(&name, &Default::default(), &kube::api::Patch::Merge(&finished))
            .await
            .unwrap();
    }
    let live = ns
        .pods()
        .create(&Default::default(), &labelled_pod("z-live", "w-paged"))
        .await
        .unwrap();
    past_grace_period().await;

    let refused = ns
        .delete_secret("cds-worker-config-w-paged", &DeleteParams::default())
        .await
        .unwrap_err();

    let uid = live.metadata.uid.unwrap();
    denied_by_guard(
        &refused,
        &format!("pod z-live (uid {uid}, Pending) still uses secret cds-worker-config-w-paged"),
    );
}

/// While worker pods change all the time, the guard answers the worker label from its pod
/// watch once the watch has caught up with a revision read after the request, in place of
/// a LIST that scans the namespace. A pod labelled for the worker, created just before the
/// delete, must still keep the secret; a true orphan still goes.
#[tokio::test]
async fn under_worker_pod_churn_the_label_is_read_from_the_watch_and_a_pod_just_created_counts() {
    const ROUNDS: usize = 8;
    let guard = shared_guard();
    let ns = TestNamespace::new("churn").await;
    let churn = churn_worker_pods(&ns).await;
    for round in 0..ROUNDS {
        ns.worker_secret(&format!("w-race-{round}")).await;
    }
    ns.worker_secret("w-gone").await;
    past_grace_period().await;

    for round in 0..ROUNDS {
        let worker = format!("w-race-{round}");
        let racer = ns
            .pods()
            .create(&Default::default(), &labelled_pod(&format!("racer-{round}"), &worker))
            .await
            .unwrap();
        let refused = ns
            .delete_secret(&format!("cds-worker-config-{worker}"), &DeleteParams::default())
            .await
            .unwrap_err();
        let uid = racer.metadata.uid.unwrap();
        denied_by_guard(
            &refused,
            &format!("pod racer-{round} (uid {uid}, Pending) still uses secret"),
        );
    }
    ns.delete_secret("cds-worker-config-w-gone", &DeleteParams::default())
        .await
        .expect("orphan: deleted");
    churn.abort();
    assert_eq!(
        guard.audit_line(&ns.name, "cds-worker-config-w-gone", "allow").await["reason"],
        "orphan"
    );

    // Which rounds the watch answered: the guard read the revision (a LIST of one name)
    // and never LISTed the worker label.
    let guard_reads: Vec<String> = apiserver_audit()
        .into_iter()
        .filter(|event| {
            event["user"]["username"] == "system:serviceaccount:cds-secret-guard:cds-secret-guard"
                && event["verb"] == "list"
                && event["objectRef"]["namespace"] == ns.name.as_str()
        })
        .filter_map(|event| event["requestURI"].as_str().map(str::to_owned))
        .collect();
    let asked = |parameter: &str| {
        guard_reads.iter().any(|uri| {
            let query = uri.split_once('?').map_or("", |(_, query)| query).replace("%3D", "=");
            query.split('&').any(|part| part == parameter)
        })
    };
    let from_watch = (0..ROUNDS)
        .filter(|round| {
            asked(&format!("fieldSelector=metadata.name=w-race-{round}"))
                && !asked(&format!("labelSelector=CDS_WORKER_NAME=w-race-{round}"))
        })
        .count();
    assert!(
        from_watch > 0,
        "no round was answered from the watch; the guard's LISTs: {guard_reads:#?}"
    );
}

/// On the watch path, an allow proves that no pod of the worker lives with one quorum read
/// of its pods: the LIST of the worker's name shows its namesake as a GET would, and its
/// revision is the one the watch must reach to answer for the label. No GET repeats it.
#[tokio::test]
async fn under_worker_pod_churn_an_allow_reads_the_worker_pods_once() {
    const ROUNDS: usize = 8;
    let guard = shared_guard();
    let ns = TestNamespace::new("once").await;
    let churn = churn_worker_pods(&ns).await;
    for round in 0..ROUNDS {
        ns.worker_secret(&format!("w-once-{round}")).await;
    }
    past_grace_period().await;

    for round in 0..ROUNDS {
        let secret = format!("cds-worker-config-w-once-{round}");
        ns.delete_secret(&secret, &DeleteParams::default())
            .await
            .expect("orphan: deleted");
        assert_eq!(guard.audit_line(&ns.name, &secret, "allow").await["reason"], "orphan");
    }
    churn.abort();

    // The guard's reads of pods in the namespace, as the apiserver logged them.
    let reads: Vec<(String, String)> = apiserver_audit()
        .into_iter()
        .filter(|event| {
            event["user"]["username"] == "system:serviceaccount:cds-secret-guard:cds-secret-guard"
                && matches!(event["verb"].as_str(), Some("get" | "list"))
                && event["objectRef"]["resource"] == "pods"
                && event["objectRef"]["namespace"] == ns.name.as_str()
        })
        .map(|event| {
            let uri = event["requestURI"].as_str().unwrap_or_default().replace("%3D", "=");
            (event["verb"].as_str().unwrap_or_default().to_owned(), uri)
        })
        .collect();
    let count = |verb: &str, what: &str| {
        reads
            .iter()
            .filter(|(asked, uri)| asked == verb && (uri.contains(&format!("{what}&")) || uri.ends_with(what)))
            .count()
    };
    let mut from_watch = 0;
    for round in 0..ROUNDS {
        let worker = format!("w-once-{round}");
        let by_name = count("list", &format!("fieldSelector=metadata.name={worker}"));
        let by_label = count("list", &format!("labelSelector=CDS_WORKER_NAME={worker}"));
        let got = count("get", &format!("/pods/{worker}"));
        if by_name == 1 && by_label == 0 {
            from_watch += 1;
            assert_eq!(
                got, 0,
                "{worker}: the LIST of its name showed the namesake; reads: {reads:#?}"
            );
        }
        assert!(
            by_name + by_label + got <= 2,
            "{worker}: more reads than the proof needs: {reads:#?}"
        );
    }
    eprintln!("{from_watch} of {ROUNDS} allows answered from the watch");
    assert!(
        from_watch > 0,
        "no round was answered from the watch; the guard's reads: {reads:#?}"
    );
}

#[tokio::test]
async fn delete_collection_keeps_young_worker_secrets() {
    let guard = shared_guard();
    let ns = TestNamespace::new("collection").await;
    ns.worker_secret("w-coll").await;

    let selector = kube::api::ListParams::default().labels("CDS_HATCHERY_NAME");
    let refused = ns
        .secrets()
        .delete_collection(&DeleteParams::default(), &selector)
        .await;

    let Err(kube::Error::Api(status)) = refused else {
        panic!("deletecollection went through: {refused:?}")
    };
    denied_by_guard(&status, "secret cds-worker-config-w-coll is");
    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-coll")
            .await
            .unwrap()
            .is_some(),
        "secret kept"
    );
    guard.audit_line(&ns.name, "cds-worker-config-w-coll", "deny").await;
}

#[tokio::test]
async fn worker_pod_gets_its_labels() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("label").await;
    ns.worker_secret("w-label").await;

    let pod = ns.worker_pod("w-label").await;

    let labels = pod.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("CDS_WORKER_NAME").map(String::as_str), Some("w-label"));
    assert_eq!(
        labels.get("CDS_HATCHERY_NAME").map(String::as_str),
        Some("hatchery-e2e"),
        "copied from the secret"
    );
    let annotations = pod.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations
            .get("cds-secret-guard/protected-secrets")
            .map(String::as_str),
        Some("cds-worker-config-w-label")
    );
}

#[tokio::test]
async fn namespace_full_of_workers_is_deleted() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("teardown").await;
    for worker in ["w-a", "w-b", "w-c"] {
        ns.worker_secret(worker).await;
        ns.worker_pod(worker).await;
    }
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(ns.client.clone());

    namespaces.delete(&ns.name, &DeleteParams::default()).await.unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while namespaces.get_opt(&ns.name).await.unwrap().is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "namespace {} still there after 90s",
            ns.name
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn secret_data_never_reaches_the_log() {
    let guard = shared_guard();
    let ns = TestNamespace::new("data").await;
    ns.worker_secret("w-data").await;
    let _ = ns
        .delete_secret("cds-worker-config-w-data", &DeleteParams::default())
        .await
        .unwrap_err();
    guard.audit_line(&ns.name, "cds-worker-config-w-data", "deny").await;

    let log = guard.log();
    assert!(!log.contains(SECRET_VALUE));
    assert!(!log.contains(&BASE64.encode(SECRET_VALUE)));
}

/// Each field of each log line holds its value, or is left out: never Rust's `Debug` of an
/// `Option` (`"pod":"Some(\"w1\")"`, `"pod":"None"`). The adoption's line is waited for, so
/// that path is always among those read; the rest of the log is whatever the run did.
#[tokio::test]
async fn log_fields_hold_values_not_debug_options() {
    let guard = shared_guard();
    let ns = TestNamespace::new("fields").await;
    ns.worker_secret("w-fields").await;
    let pod = ns.worker_pod("w-fields").await;
    ns.owner_references("cds-worker-config-w-fields", Duration::from_secs(10))
        .await;
    ns.delete_secret("cds-worker-config-w-fields", &DeleteParams::default())
        .await
        .unwrap_err();
    guard.audit_line(&ns.name, "cds-worker-config-w-fields", "deny").await;

    let added = guard
        .log_line(
            "ownerReference added",
            &[("namespace", &ns.name), ("secret", "cds-worker-config-w-fields")],
        )
        .await;

    let mut debug_options = Vec::new();
    for line in guard.log_lines() {
        let mut fields = Vec::new();
        debug_option_fields(&line, "", &mut fields);
        debug_options.extend(fields.into_iter().map(|field| format!("{}: {field}", line["message"])));
    }
    assert!(
        debug_options.is_empty(),
        "fields holding a Debug Option: {debug_options:#?}"
    );
    assert_eq!(added["pod"], "w-fields", "{added}");
    assert_eq!(
        Some(&added["uid"]),
        pod.metadata.uid.map(Into::into).as_ref(),
        "{added}"
    );
}

/// The fields of `value` (a log line, or a span in one) whose value is `None` or holds
/// `Some(`, as `path = value`.
fn debug_option_fields(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, field) in fields {
                debug_option_fields(field, &format!("{path}.{name}"), found);
            }
        }
        serde_json::Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                debug_option_fields(item, &format!("{path}[{index}]"), found);
            }
        }
        serde_json::Value::String(text) if text == "None" || text.contains("Some(") => {
            found.push(format!("{path} = {text}"));
        }
        _ => {}
    }
}

/// `kubectl kustomize` of an overlay, as JSON documents.
fn render(overlay: &str) -> Vec<serde_json::Value> {
    let output = kubectl()
        .args(["kustomize", &format!("manifests/overlays/{overlay}")])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kustomize {overlay}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let yaml = String::from_utf8(output.stdout).unwrap();
    yaml.split("\n---\n")
        .map(|doc| serde_saphyr::from_str(doc).unwrap())
        .collect()
}

/// Server-side apply, dry run: the apiserver validates everything and keeps nothing.
/// The webhook configurations are renamed, so they are not merged with the ones the
/// test guard has registered under the same name.
fn server_side_dry_run(objects: &[&serde_json::Value]) {
    use std::io::Write;
    let renamed: Vec<serde_json::Value> = objects
        .iter()
        .map(|&object| {
            let mut object = object.clone();
            if object["kind"]
                .as_str()
                .is_some_and(|k| k.ends_with("WebhookConfiguration"))
            {
                object["metadata"]["name"] = "cds-secret-guard-manifest-check".into();
            }
            object
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": renamed});
    let mut apply = kubectl()
        .args(["apply", "--server-side", "--dry-run=server", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(list.to_string().as_bytes())
        .unwrap();
    let output = apply.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "rejected: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let applied = String::from_utf8_lossy(&output.stdout).lines().count();
    assert_eq!(applied, objects.len(), "{}", String::from_utf8_lossy(&output.stdout));
}

#[test]
fn manifests_are_accepted_by_the_apiserver() {
    // Namespaced objects need their namespace to exist for a dry run.
    let _ = kubectl()
        .args(["create", "namespace", "cds-secret-guard"])
        .output()
        .unwrap();
    let certs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/overlays/tls-secret/certs");
    cds_secret_guard::certs::write(&certs, &["cds-secret-guard.cds-secret-guard.svc".to_owned()]).unwrap();

    let tls_secret = render("tls-secret");
    let kinds: Vec<&str> = tls_secret.iter().filter_map(|o| o["kind"].as_str()).collect();
    for kind in [
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ClusterRole",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let ca = std::fs::read(certs.join("ca.crt")).unwrap();
    for webhook in tls_secret
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")))
    {
        let bundle = webhook["webhooks"][0]["clientConfig"]["caBundle"]
            .as_str()
            .unwrap()
            .replace('\n', "");
        assert_eq!(BASE64.decode(bundle).unwrap(), ca, "caBundle is the CA");
    }
    let deployment = tls_secret.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2);
    server_side_dry_run(&tls_secret.iter().collect::<Vec<_>>());

    // cert-manager's kinds need its CRDs, absent here: check them, send the rest.
    let cert_manager = render("cert-manager");
    let (issuing, rest): (Vec<_>, Vec<_>) = cert_manager.iter().partition(|o| {
        o["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("cert-manager.io/"))
    });
    // The chain: self-signed issuer → CA certificate → CA issuer → serving certificate;
    // the webhooks trust the CA, so a renewed serving certificate changes no caBundle.
    let find = |kind: &str, name: &str| {
        issuing
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    assert_eq!(issuing.len(), 4, "two Issuers and two Certificates");
    assert!(find("Issuer", "cds-secret-guard-selfsigned")["spec"]["selfSigned"].is_object());
    let ca = find("Certificate", "cds-secret-guard-ca");
    assert_eq!(ca["spec"]["isCA"], true);
    assert_eq!(ca["spec"]["issuerRef"]["name"], "cds-secret-guard-selfsigned");
    let ca_issuer = find("Issuer", "cds-secret-guard-ca");
    assert_eq!(ca_issuer["spec"]["ca"]["secretName"], ca["spec"]["secretName"]);
    let serving = find("Certificate", "cds-secret-guard");
    assert_eq!(serving["spec"]["secretName"], "cds-secret-guard-tls");
    assert_eq!(serving["spec"]["issuerRef"]["name"], "cds-secret-guard-ca");
    for webhook in rest
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")))
    {
        assert_eq!(
            webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "cds-secret-guard/cds-secret-guard-ca"
        );
    }
    server_side_dry_run(&rest);
}

#[test]
fn namespaced_install_holds_no_cluster_wide_secret_right() {
    let _ = kubectl()
        .args(["create", "namespace", "cds-secret-guard"])
        .output()
        .unwrap();
    let _ = kubectl().args(["create", "namespace", "cds"]).output().unwrap();
    let objects = render("namespaced");
    let (issuing, rest): (Vec<_>, Vec<_>) = objects.iter().partition(|o| {
        o["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("cert-manager.io/"))
    });
    assert_eq!(issuing.len(), 4);
    // Cluster-wide, the guard may read the watched namespaces and nothing else.
    for role in rest.iter().filter(|o| o["kind"] == "ClusterRole") {
        let name = role["metadata"]["name"].as_str().unwrap();
        for rule in role["rules"].as_array().unwrap() {
            let resources = &rule["resources"];
            assert!(
                name == "cds-secret-guard-check" || *resources == serde_json::json!(["namespaces"]),
                "{name} grants {rule} cluster-wide"
            );
        }
    }
    let role = |name: &str| {
        rest.iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Role {name}"))
    };
    assert_eq!(role("cds-secret-guard")["metadata"]["namespace"], "cds");
    // And the Lease's, in the guard's own namespace.
    assert_eq!(
        role("cds-secret-guard-lease")["metadata"]["namespace"],
        "cds-secret-guard"
    );
    let deployment = rest.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(env.contains(&serde_json::json!({"name": "CDS_GUARD_NAMESPACES", "value": "cds"})));
    // The webhooks are those `cds-secret-guard webhooks --namespace cds` prints.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .args([
            "webhooks",
            "--service",
            "cds-secret-guard/cds-secret-guard",
            "--namespace",
            "cds",
        ])
        .output()
        .unwrap();
    let printed: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .split("---\n")
        .map(|doc| serde_saphyr::from_str(doc).unwrap())
        .collect();
    for webhook in rest
        .iter()
        .filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("WebhookConfiguration")))
    {
        let twin = printed.iter().find(|p| p["kind"] == webhook["kind"]).unwrap();
        assert_eq!(webhook["webhooks"], twin["webhooks"], "{}", webhook["kind"]);
    }
    server_side_dry_run(&rest);
}

/// Events as `kubectl events --for secret/NAME` shows them (`kubectl describe secret`
/// lists no events for any secret: kubectl's SecretDescriber never asks for them, v1.36
/// `describe.go`). A refused delete leaves one
/// `DeleteDenied` (repeats fold into it, dry runs leave nothing) and an adoption one
/// `Adopted`.
#[tokio::test]
async fn denials_and_adoptions_are_events_on_the_secret() {
    let _guard = shared_guard();
    let ns = TestNamespace::new("events").await;
    ns.worker_secret("w-ev").await;
    let dry_run = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    ns.delete_secret("cds-worker-config-w-ev", &dry_run).await.unwrap_err();
    for _ in 0..5 {
        ns.delete_secret("cds-worker-config-w-ev", &DeleteParams::default())
            .await
            .unwrap_err();
    }
    let pod = ns.worker_pod("w-ev").await;
    ns.owner_references("cds-worker-config-w-ev", Duration::from_secs(10))
        .await;

    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(ns.client.clone(), &ns.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (denied, adopted) = loop {
        let listed = events.list(&Default::default()).await.unwrap().items;
        let of = |reason: &str| {
            listed
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .cloned()
                .collect::<Vec<_>>()
        };
        let (denied, adopted) = (of("DeleteDenied"), of("Adopted"));
        if !denied.is_empty() && !adopted.is_empty() {
            break (denied, adopted);
        }
        assert!(std::time::Instant::now() < deadline, "events so far: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(denied.len(), 1, "five refusals, one event: {denied:?}");
    let denial = &denied[0];
    assert_eq!(denial.type_.as_deref(), Some("Warning"));
    assert_eq!(denial.action.as_deref(), Some("TooYoung"));
    assert!(
        denial
            .note
            .as_deref()
            .unwrap()
            .contains("cannot be deleted within 4s of creation"),
        "{denial:?}"
    );
    let regarding = denial.regarding.as_ref().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Secret"), Some("cds-worker-config-w-ev"))
    );
    assert_eq!(adopted.len(), 1);
    assert_eq!(
        adopted[0].related.as_ref().and_then(|r| r.uid.clone()),
        pod.metadata.uid
    );

    let described = kubectl()
        .args(["-n", &ns.name, "events", "--for", "secret/cds-worker-config-w-ev"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(text.contains("DeleteDenied") && text.contains("Adopted"), "{text}");
}
