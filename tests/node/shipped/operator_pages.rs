//! The operator pages, run as they write it: each block read from its page at test time
//! (`testkit::pages`), with this registry's address, login and the guard's release in
//! place of the pages' examples, in the order an operator meets them. A release of its
//! own signed with a key the page makes, verified, installed from the registry with the
//! values file the page writes, looked at, given in-use protection, upgraded, rolled
//! back, brought through an outage, and uninstalled; then installed and uninstalled again
//! the other way the pages give.

use std::{path::PathBuf, time::Duration};

use serde_json::json;
use testkit::pages::Shell;

use crate::{
    cluster::{TestNamespace, kubectl},
    install::{self, VERSION, eventually, kubectl_json, run},
    release::{self, Registry},
    seed,
};

/// What the pages write into the checkout, as an operator's working directory.
const WRITTEN: [&str; 3] = ["my-values.yaml", "cosign.key", "cosign.pub"];

/// The checkout's own files of those names, put aside while the pages run, and the
/// pages' files removed after.
struct Workspace {
    aside: PathBuf,
}

impl Workspace {
    fn new() -> Self {
        let aside = crate::cluster::repo().join("target/shipped/pages-aside");
        std::fs::create_dir_all(&aside).unwrap();
        for name in WRITTEN {
            let file = crate::cluster::repo().join(name);
            if file.exists() {
                std::fs::rename(&file, aside.join(name)).unwrap();
            }
        }
        Self { aside }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        for name in WRITTEN {
            let _ = std::fs::remove_file(crate::cluster::repo().join(name));
            let _ = std::fs::rename(self.aside.join(name), crate::cluster::repo().join(name));
        }
    }
}

/// The guard's release and namespace of the pages, as a test leaves nothing behind.
fn uninstalled() {
    let _ = kubectl()
        .args([
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            "cds-secret-guard",
            "--ignore-not-found",
        ])
        .output();
    let _ = release::helm()
        .args(["uninstall", "cds-secret-guard", "--wait"])
        .output();
    for namespace in ["cds-secret-guard", "demo", "shop", "guard-smoke", "guard-ns-check"] {
        let _ = kubectl()
            .args(["delete", "namespace", namespace, "--ignore-not-found", "--wait=false"])
            .output();
    }
}

/// Every block the pages mark `run` that needs the release: see the module's comment.
pub async fn the_operator_pages_run_as_written(nodes: &Registry) {
    let _workspace = Workspace::new();
    // A team of its own: the page's key signs a first release there.
    let registry = nodes.elsewhere("pages");
    let cosign_password = format!("pages-{}", std::process::id());
    let plugin = crate::cluster::repo().join("target/shipped/operator-bin");
    std::fs::create_dir_all(&plugin).unwrap();
    let _ = std::fs::remove_file(plugin.join("kubectl-cds_guard"));
    // The CLI as install.md installs it: the binary, linked as the kubectl plugin.
    std::os::unix::fs::symlink(crate::cluster::guard_binary(), plugin.join("kubectl-cds_guard")).unwrap();
    let shell = Shell::new(crate::cluster::repo())
        .path_first(&plugin)
        // The registry's CA, as a system that trusts it (Go's TLS: helm, cosign, crane).
        .env("SSL_CERT_FILE", registry.ca.display().to_string())
        .env("DOCKER_CONFIG", registry.docker_config().display().to_string())
        .env(
            "HELM_REGISTRY_CONFIG",
            release::helm_registry_config().display().to_string(),
        )
        .env("COSIGN_PASSWORD", cosign_password.clone())
        .substitute("registry.example:5000", registry.address.clone())
        .substitute(
            "--docker-username=nodes",
            format!("--docker-username={}", registry.user),
        )
        .substitute(
            "--docker-password=...",
            format!("--docker-password={}", registry.password),
        )
        .substitute("REGISTRY_USER=ci", format!("REGISTRY_USER={}", registry.user))
        .substitute(
            "REGISTRY_PASSWORD=...",
            format!("REGISTRY_PASSWORD={}", registry.password),
        )
        .substitute("COSIGN_PASSWORD=...", format!("COSIGN_PASSWORD={cosign_password}"));
    uninstalled();

    // Publish and verify (install.md).
    let started = std::time::Instant::now();
    shell.run("docs/install.md", "publish", &[]);
    println!("pages: the release published and signed in {:?}", started.elapsed());
    assert_eq!(
        registry.tags("cds-secret-guard").first().map(String::as_str),
        Some(VERSION)
    );
    let verified = shell.run("docs/install.md", "verify", &[]);
    for crate_name in ["\"kube\"", "\"rustls\"", "\"axum\""] {
        assert!(verified.contains(crate_name), "the SBOM lists {crate_name}: {verified}");
    }

    // Install from the registry as the README gives it (its `make release` of the same
    // commit again: nothing pushed).
    shell.run("README.md", "readme-install", &[]);
    running_from(&registry).await;
    let tried = shell.paste("README.md", "try", &[]);
    assert!(
        tried.output.contains("cannot be deleted within 10m of creation")
            && tried.output.contains("\"decision\":\"deny\""),
        "README's try: the delete refused, its audit line shown: {}",
        tried.output
    );

    // The install's checks (install.md).
    // The page's good outcome: the namespace went, and its secret's delete never reached
    // the guard (no audit line: the grep finds nothing).
    let checked = shell.paste("docs/install.md", "namespace-controller", &[]);
    assert!(
        checked.output.contains("namespace \"guard-ns-check\" deleted")
            && !checked.output.contains("\"secret\":\"cds-worker-config-ns-check\""),
        "the namespace controller is exempt: {}",
        checked.output
    );
    let smoke = shell.paste("docs/install.md", "smoke", &[]);
    assert!(
        smoke.output.contains("cannot be deleted") && smoke.output.contains("smoke"),
        "the dry-run delete of a live pod's secret is refused: {}",
        smoke.output
    );
    eventually("the smoke secret adopted by its pod", Duration::from_secs(60), || {
        let secret = kubectl_json(&["-n", "guard-smoke", "get", "secret", "cds-worker-config-smoke"]);
        (secret["metadata"]["ownerReferences"][0]["name"] == "smoke").then_some(())
    })
    .await;
    let unlabelled = shell.run(
        "docs/troubleshooting.md",
        "unlabelled-pod",
        &[("NS", "guard-smoke"), ("W", "smoke")],
    );
    assert!(unlabelled.contains("CDS_WORKER_NAME=smoke"), "{unlabelled}");
    let smoke_checked = shell.run("docs/install.md", "smoke-check", &[]);
    // The table's row, then the owner's name (jsonpath prints no newline after it).
    assert!(
        smoke_checked.lines().filter(|line| line.starts_with("smoke")).count() >= 2,
        "the pod labelled, the secret adopted: {smoke_checked}"
    );

    // Looking at it (troubleshooting.md, monitoring.md), with README's demo secret.
    let demo = [("NS", "demo"), ("NAME", "cds-worker-config-w1")];
    let first_look = shell.run("docs/troubleshooting.md", "first-look", &demo);
    assert!(first_look.contains("cds-worker-config-w1"), "{first_look}");
    shell.run("docs/monitoring.md", "replicas", &[]);
    let denied = shell.run("docs/monitoring.md", "denied", &demo);
    assert!(denied.contains("cds-worker-config-w1"), "{denied}");
    let can = shell.run("docs/monitoring.md", "can-read-pods", &demo);
    assert_eq!(can.lines().collect::<Vec<_>>(), ["yes", "yes"], "{can}");
    let can = shell.run("docs/monitoring.md", "can-patch-secrets", &demo);
    assert_eq!(can.trim(), "yes");
    let trusted = shell.run("docs/troubleshooting.md", "which-ca", &[]);
    assert!(
        trusted.contains("subject=") && trusted.contains("issuer=") && trusted.contains("notAfter="),
        "{trusted}"
    );

    // In-use protection (in-use.md), on a ConfigMap a pod reads.
    shell.run("docs/in-use.md", "enable", &[]);
    // As the page says: the replicas before it refuse in-use deletes while they drain.
    install::drained("cds-secret-guard").await;
    let can = shell.run("docs/monitoring.md", "can-patch-configmaps", &[("NS", "shop")]);
    assert_eq!(can.lines().collect::<Vec<_>>(), ["yes", "yes"], "{can}");
    run(kubectl().args(["create", "namespace", "shop"]));
    install::default_service_account("shop").await;
    run(kubectl().args([
        "-n",
        "shop",
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=fast",
    ]));
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": seed::WORKER_IMAGE, "imagePullPolicy": "Never",
            "command": ["sleep", "3600"], "envFrom": [{"configMapRef": {"name": "settings"}}]}]}});
    assert!(crate::cluster::kubectl_apply(Some("shop"), pod.to_string().as_bytes()));
    shell.run("docs/in-use.md", "label-namespace", &[]);
    shell.run("docs/in-use.md", "label-object", &[]);
    // "A refused delete", in the mode `refuse` the object's label chooses.
    run(kubectl().args([
        "-n",
        "shop",
        "label",
        "--overwrite",
        "configmap",
        "settings",
        "cds-secret-guard/in-use-protection=refuse",
    ]));
    let refused = eventually("the used ConfigMap's delete refused", Duration::from_secs(30), || {
        let delete = kubectl()
            .args(["-n", "shop", "delete", "configmap", "settings"])
            .output()
            .unwrap();
        let message = String::from_utf8_lossy(&delete.stderr).into_owned();
        (!delete.status.success() && message.contains("is in use by pod web")).then_some(message)
    })
    .await;
    println!("pages: {refused}");
    shell.run("docs/in-use.md", "force-delete", &[]);
    eventually("the forced ConfigMap gone", Duration::from_secs(60), || {
        (!kubectl()
            .args(["-n", "shop", "get", "configmap", "settings"])
            .output()
            .unwrap()
            .status
            .success())
        .then_some(())
    })
    .await;
    let events = shell.run(
        "docs/troubleshooting.md",
        "deferred-events",
        &[("NS", "shop"), ("NAME", "settings")],
    );
    println!("pages: the ConfigMap's events: {events}");

    // Upgrade and roll back (upgrade.md): install, enable, upgrade, rollback, rollback 3.
    shell.run("docs/upgrade.md", "upgrade", &[]);
    shell.run("docs/upgrade.md", "rollback", &[]);
    let history = release::helm_history();
    assert_eq!(history.len(), 5, "{history:?}");

    // Every replica down (emergency.md): its steps, then the guard decides again.
    run(kubectl().args([
        "-n",
        "cds-secret-guard",
        "scale",
        "deployment/cds-secret-guard",
        "--replicas=0",
    ]));
    eventually("no guard pod left", Duration::from_secs(90), || {
        install::live_guard_pods("cds-secret-guard").is_empty().then_some(())
    })
    .await;
    shell.run("docs/emergency.md", "every-replica-down", &[]);
    let webhook = kubectl_json(&["get", "validatingwebhookconfiguration", "cds-secret-guard"]);
    assert_eq!(
        webhook["webhooks"][0]["failurePolicy"], "Fail",
        "back to failing closed"
    );
    running_from(&registry).await;
    let _probe = install::a_young_worker_secret_is_refused("pages-after-outage").await;

    // The last resort, then the uninstall (uninstall.md).
    shell.run("docs/emergency.md", "last-resort", &[]);
    assert!(!validating_webhook_registered(), "the last resort deletes it");
    shell.run("docs/uninstall.md", "uninstall", &[]);
    assert!(!release::webhook_registered(), "uninstalled, a webhook is left");

    // Installed as install.md gives it, and uninstalled the Helm 3 way.
    shell.run("docs/install.md", "install", &[]);
    running_from(&registry).await;
    let probe = TestNamespace::new("pages-install").await;
    probe.worker_secret("probe").await;
    install::refused_by_the_guard(&probe, "cds-worker-config-probe").await;
    shell.run("docs/uninstall.md", "uninstall-helm-3", &[]);
    assert!(!release::webhook_registered(), "uninstalled, a webhook is left");
    uninstalled();
}

/// Every replica of the release runs the registry's image and is ready. (Not which
/// registry path the node pulled it from: it holds the same bytes from the release test's
/// path, and containerd names an image by its first pull.)
async fn running_from(registry: &Registry) {
    let image = format!("{}/cds-secret-guard:{VERSION}", registry.address);
    install::every_replica("cds-secret-guard", &image, |pod| {
        pod["spec"]["containers"][0]["image"] == image.as_str()
    })
    .await;
}

/// The secret webhook's configuration exists.
fn validating_webhook_registered() -> bool {
    kubectl()
        .args(["get", "validatingwebhookconfiguration", "cds-secret-guard"])
        .output()
        .unwrap()
        .status
        .success()
}
