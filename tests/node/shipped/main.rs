//! Run it as shipped: the image built from the Dockerfile, on a real node (containerd,
//! kubelet, kube-scheduler, kube-proxy), installed with the Helm chart as the README says,
//! against the failure the project exists for, seen as its users see it: a worker pod
//! stuck in `CreateContainerConfigError` because a cleanup deleted its secret.
//!
//! Not part of `cargo test --all-targets` (`test = false` in Cargo.toml): it needs the
//! node, which schedules and runs every pod of the cluster, so `make test` runs it after
//! the other suites, with `cargo test --test shipped`. It fails when the node cannot start.
#![allow(clippy::unwrap_used)]

mod deferred;
mod in_use;
mod operator_pages;
mod published;
mod release;

use testkit::{cluster, install, pages, seed};

use std::time::Duration;

use cluster::{TestNamespace, apiserver_audit, kubectl};
use install::{
    IMAGE, Kustomized, Release, VERSION, audit_lines, default_service_account, docker, eventually, guard_logs,
    guard_pods, held_cas, kubectl_json, run, stdout,
};
use serde_json::json;

/// `make image` builds the Dockerfile; the image runs the binary, as non-root, on a
/// read-only root filesystem, and holds no shell.
#[test]
fn the_image_runs_the_binary_as_non_root() {
    install::image();
    // The image names the commit it was built from, though its build never sees .git.
    let head = stdout(&run(std::process::Command::new("git").args([
        "rev-parse",
        "--short=12",
        "HEAD",
    ])));
    for tag in [VERSION, "dev"] {
        let image = format!("{IMAGE}:{tag}");
        let version = run(docker().args(["run", "--rm", "--read-only", "--network=none", &image, "--version"]));
        assert_eq!(
            stdout(&version),
            format!("cds-secret-guard {VERSION} (commit {head})"),
            "{image}"
        );
        let user = run(docker().args(["image", "inspect", "-f", "{{.Config.User}}", &image]));
        assert_eq!(stdout(&user), "65532:65532", "{image} runs as nonroot");
        let shell = docker()
            .args([
                "run",
                "--rm",
                "--network=none",
                "--entrypoint",
                "/bin/sh",
                &image,
                "-c",
                "true",
            ])
            .output()
            .unwrap();
        assert!(!shell.status.success(), "{image} has a shell");
    }
}

/// The node is Ready and runs a plain pod to completion.
#[tokio::test]
async fn a_plain_pod_runs_to_completion_on_the_node() {
    install::node();
    let node = kubectl_json(&["get", "node", "cds-guard-node"]);
    let ready = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "True");
    assert!(ready, "node not Ready: {:#}", node["status"]["conditions"]);

    let ns = TestNamespace::new("node-plain").await;
    default_service_account(&ns.name).await;
    ns.apply(&format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "plain"}},
            "spec": {{"restartPolicy": "Never", "containers": [{{"name": "c", "image": "{}",
            "imagePullPolicy": "Never", "command": ["sh", "-c", "echo ran on $NODE"],
            "env": [{{"name": "NODE", "valueFrom": {{"fieldRef": {{"fieldPath": "spec.nodeName"}}}}}}]}}]}}}}"#,
        seed::WORKER_IMAGE
    ));
    let name = ns.name.clone();
    eventually("the plain pod Succeeded", Duration::from_secs(60), || {
        let pod = kubectl_json(&["-n", &name, "get", "pod", "plain"]);
        (pod["status"]["phase"] == "Succeeded").then_some(())
    })
    .await;
    let log = run(kubectl().args(["-n", &ns.name, "logs", "plain"]));
    assert_eq!(stdout(&log), "ran on cds-guard-node");
}

/// The seed's failure without the guard, then the guard installed from the chart on the
/// node: its pods decide deletes, and every worker of the same race runs to completion.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installed_guard_keeps_every_worker_secret_on_the_node() {
    install::node();
    let spawns = seed::Spawns {
        workers: 24,
        every: Duration::from_millis(250),
        list_lag: Duration::from_millis(500),
    };

    // Without the guard: the stale cleanup deletes secrets of workers about to start.
    let open = TestNamespace::new("seed-open").await;
    default_service_account(&open.name).await;
    let unguarded = seed::run(&open, &spawns).await;
    println!("without the guard: {unguarded:?}");
    assert_eq!(unguarded.workers, spawns.workers);
    assert!(unguarded.deleted > 0, "the stale cleanup deleted nothing");
    assert!(
        !unguarded.config_errors.is_empty(),
        "no worker lost its secret without the guard: the race was not reproduced, so the guarded run would prove nothing"
    );
    for worker in &unguarded.config_errors {
        assert!(
            unguarded.missing_secret_events.contains_key(worker),
            "{worker} is in CreateContainerConfigError without the kubelet's event naming its secret"
        );
    }

    // Installed as users install it.
    let release = Release::install(VERSION);
    let pods = release.pods();
    assert_eq!(pods.len(), 2, "two replicas: {pods:?}");
    for (pod, node, ready) in &pods {
        assert_eq!(node, "cds-guard-node", "{pod} runs on the node");
        assert!(ready, "{pod} ready");
    }
    let webhook = kubectl_json(&["get", "validatingwebhookconfiguration", release.name]);
    assert_eq!(
        webhook["webhooks"][0]["clientConfig"]["service"],
        json!({"namespace": release.namespace, "name": release.name, "path": "/validate", "port": 443}),
        "the apiserver calls the guard through its Service"
    );

    // A young worker secret: the pods refuse its delete; their logs and the apiserver's
    // audit log say so.
    let _probe = install::a_young_worker_secret_is_refused("guard-probe").await;
    let answered = eventually(
        "a guard pod's audit line for the refusal",
        Duration::from_secs(10),
        || {
            release.logs().into_iter().find(|(_, log)| {
                audit_lines(log, "cds-worker-config-probe")
                    .iter()
                    .any(|l| l["decision"] == "deny")
            })
        },
    )
    .await;
    println!("the refusal was decided by pod {}", answered.0);
    let annotated = apiserver_audit().into_iter().any(|event| {
        event["verb"] == "delete"
            && event["objectRef"]["name"] == "cds-worker-config-probe"
            && event["annotations"]["secret-deletes.cds-secret-guard.io/reason"] == "too-young"
    });
    assert!(annotated, "the apiserver's audit log carries the guard's annotations");

    // The same race with the guard: every worker runs to completion.
    let ns = TestNamespace::new("seed-guarded").await;
    default_service_account(&ns.name).await;
    let guarded = seed::run(&ns, &spawns).await;
    println!("with the guard: {guarded:?}");
    assert!(
        guarded.config_errors.is_empty(),
        "workers lost their secret: {:?}",
        guarded.config_errors
    );
    assert_eq!(guarded.completed.len(), spawns.workers);
    assert!(
        guarded.refused > 0,
        "the cleanup never tried a live worker's secret: the guard was not tested"
    );
    assert_eq!(
        guarded.deleted, 0,
        "the cleanup deleted a live worker's secret through the guard"
    );
    // Once the pods go, the garbage collector removes their secrets, through the guard.
    seed::delete_pods(&ns).await;
    let ns_name = ns.name.clone();
    eventually("the worker secrets collected", Duration::from_secs(60), || {
        let secrets = kubectl_json(&[
            "-n",
            &ns_name,
            "get",
            "secrets",
            "-l",
            "CDS_HATCHERY_NAME=hatchery-seed",
        ]);
        secrets["items"].as_array().unwrap().is_empty().then_some(())
    })
    .await;

    drop(release);

    certificates_rotate_under_load().await;

    // `helm install --wait` returns once the guard can be called, even right after an
    // uninstall; and not while the webhooks do not trust it.
    fresh_installs_are_callable_when_helm_returns().await;
    an_install_the_webhooks_do_not_trust_fails().await;

    // The same guard from the kustomize manifests.
    kustomize_install_decides_from_its_pods().await;

    make_run_installs_over_what_the_suites_leave().await;

    the_host_network_variant_serves_from_the_node().await;

    // In-use protection, from the chart, on the node: refused, then deferred.
    in_use::the_chart_installed_guard_keeps_what_a_deployment_uses_on_the_node().await;
    deferred::the_chart_installed_guard_defers_what_tools_delete_on_the_node().await;

    // From the registry, as an operator installs it, and upgraded from the last release.
    release::released_chart_upgrades_and_rolls_back_under_load().await;
}

/// Ten installs, each right after an uninstall (whose replicas still drain, serving a
/// certificate of the CA the uninstall deleted), each followed at once by a worker pod and
/// a delete of its secret: the pod is labelled, the delete refused by the guard, and the
/// apiserver's audit log shows no request of the test meeting a failed call to the guard. The chart's post-install Job
/// (`cds-secret-guard wait`) holds `helm install` until the guard answers through its
/// Service; without it, calls failed with `x509: certificate signed by unknown authority`
/// in two installs of four.
async fn fresh_installs_are_callable_when_helm_returns() {
    let (_, failed_before) = webhook_calls();
    let mut kept = Vec::new();
    for attempt in 0..10 {
        let release = Release::install(VERSION);
        let ns = TestNamespace::new("fresh-install").await;
        ns.worker_secret("w").await;
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "w"},
            "spec": {"containers": [{"name": "w", "image": seed::WORKER_IMAGE, "imagePullPolicy": "Never",
                "envFrom": [{"secretRef": {"name": "cds-worker-config-w"}}]}]},
        }))
        .unwrap();
        let pod = ns.pods().create(&Default::default(), &pod).await.unwrap();
        let refusal = ns
            .delete_secret("cds-worker-config-w", &kube::api::DeleteParams::default())
            .await
            .expect_err("the delete is refused");
        assert!(
            refusal.message.contains("cannot be deleted within 10m of creation"),
            "install {attempt}: {}",
            refusal.message
        );
        let labels = pod.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("CDS_WORKER_NAME").map(String::as_str),
            Some("w"),
            "install {attempt}: the pod was not labelled"
        );
        drop(release);
        kept.push(ns);
    }
    let (_, failed_after) = webhook_calls();
    // The apiserver's metrics count every call, the garbage collector's of earlier tests'
    // secrets too; its audit log says which of the test's own requests met a failed call.
    let namespaces: Vec<&str> = kept.iter().map(|ns| ns.name.as_str()).collect();
    let failed: Vec<String> = apiserver_audit()
        .into_iter()
        .filter(|event| namespaces.contains(&event["objectRef"]["namespace"].as_str().unwrap_or_default()))
        .filter(|event| {
            let failed_open = event["annotations"]
                .as_object()
                .is_some_and(|annotations| annotations.keys().any(|key| key.starts_with("failed-open")));
            let failed_closed = event["responseStatus"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("failed calling webhook"));
            failed_open || failed_closed
        })
        .map(|event| {
            format!(
                "{} {}: {}",
                event["verb"], event["objectRef"]["name"], event["responseStatus"]
            )
        })
        .collect();
    println!(
        "fresh installs: 10, the test's requests meeting a failed webhook call: {}; all failed calls in the apiserver's metrics meanwhile: {}",
        failed.len(),
        failed_after - failed_before
    );
    assert!(
        failed.is_empty(),
        "requests that met a failed webhook call: {failed:#?}"
    );
    drop(kept);
}

/// A chart whose webhooks trust another CA than the one that signed the guard's
/// certificate (`certificate.source=secret` with the wrong `caBundle`): its replicas are
/// ready, but the post-install Job finds that the guard cannot be called, and the install
/// fails with `--rollback-on-failure`, leaving no webhook behind.
async fn an_install_the_webhooks_do_not_trust_fails() {
    let (namespace, name) = ("cds-secret-guard", "cds-secret-guard");
    let dir = std::env::temp_dir().join(format!("untrusted-{}", std::process::id()));
    let certs = |out: &std::path::Path| {
        run(std::process::Command::new(cluster::guard_binary())
            .args(["certs", "--out"])
            .arg(out)
            .args(["--host", &format!("{name}.{namespace}.svc")]));
    };
    certs(&dir.join("served"));
    certs(&dir.join("other"));
    let helm = || {
        let mut command = std::process::Command::new(cluster::repo().join("target/tools/bin/helm"));
        command
            .env("KUBECONFIG", cluster::control_plane())
            .args(["-n", namespace]);
        command
    };
    let _ = helm().args(["uninstall", name, "--wait"]).output();
    let _ = kubectl().args(["create", "namespace", namespace]).output();
    let _ = kubectl()
        .args(["-n", namespace, "delete", "secret", "untrusted-tls"])
        .output();
    run(kubectl()
        .args(["-n", namespace, "create", "secret", "tls", "untrusted-tls"])
        .args([
            format!("--cert={}", dir.join("served/tls.crt").display()),
            format!("--key={}", dir.join("served/tls.key").display()),
        ]));
    let started = std::time::Instant::now();
    let install = helm()
        .args(["install", name])
        .arg(cluster::repo().join("manifests/helm/cds-secret-guard"))
        .args(["--wait", "--rollback-on-failure", "--timeout", "40s"])
        .args([
            "--set",
            &format!("image.tag={VERSION}"),
            "--set",
            "image.pullPolicy=Never",
        ])
        .args([
            "--set",
            "certificate.source=secret",
            "--set",
            "certificate.secret.name=untrusted-tls",
        ])
        .arg(format!(
            "--set-file=certificate.secret.caBundle={}",
            dir.join("other/ca.crt").display()
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&install.stderr);
    println!(
        "an untrusted install: exit {:?} after {:?}: {said}",
        install.status.code(),
        started.elapsed()
    );
    assert!(
        !install.status.success(),
        "an install the webhooks do not trust succeeded"
    );
    assert!(said.contains("wait"), "the failure does not name the wait Job: {said}");
    let left = kubectl()
        .args(["get", "validatingwebhookconfiguration", name])
        .output()
        .unwrap();
    assert!(!left.status.success(), "the failed install left its webhook behind");
    let _ = kubectl()
        .args(["-n", namespace, "delete", "job", "cds-secret-guard-wait"])
        .output();
    let _ = kubectl()
        .args(["-n", namespace, "delete", "secret", "untrusted-tls"])
        .output();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Calls to the guard's webhooks, and failed ones, from the apiserver's own metrics.
fn webhook_calls() -> (f64, f64) {
    let metrics = stdout(&run(kubectl().args(["get", "--raw", "/metrics"])));
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

/// The chart installed with its certificates compressed to seconds (a CA of 45 s, leaves
/// of 15 s), renewed by the guard while the hatchery's race runs: CA rotations and leaf renewals on
/// both replicas, and not one failed webhook call (the apiserver's metrics), no lost
/// secret, every worker completed.
async fn certificates_rotate_under_load() {
    let values = ["certificate.guard.caValidity=45s", "certificate.guard.leafValidity=15s"];
    let release = &Release::install_with(VERSION, &values);
    // Counting starts once the previous release's replicas are gone: while they drain they
    // still serve the old CA's leaf, and kube-proxy sends calls to such terminating
    // endpoints until the new ones are in its rules. Then a delete the new replicas refuse.
    eventually("the previous release's replicas gone", Duration::from_secs(90), || {
        let pods = kubectl_json(&["-n", release.namespace, "get", "pods", "-l", install::GUARD_PODS]);
        let pods = pods["items"].as_array().cloned().unwrap_or_default();
        pods.iter()
            .all(|pod| pod["metadata"]["deletionTimestamp"].is_null())
            .then_some(())
    })
    .await;
    let probe = TestNamespace::new("rotation-probe").await;
    probe.worker_secret("probe").await;
    install::refused_by_the_guard(&probe, "cds-worker-config-probe").await;
    let (calls_before, failed_before) = webhook_calls();
    let cas_seen = std::sync::Arc::new(std::sync::Mutex::new(held_cas(release.name)));
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (cas_seen, sampling, name) = (cas_seen.clone(), sampling.clone(), release.name);
        async move {
            while !sampling.is_cancelled() {
                let held = tokio::task::spawn_blocking(move || held_cas(name)).await.unwrap();
                cas_seen.lock().unwrap().extend(held);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });

    let ns = TestNamespace::new("seed-rotation").await;
    default_service_account(&ns.name).await;
    let spawns = seed::Spawns {
        workers: 60,
        every: Duration::from_secs(1),
        list_lag: Duration::from_millis(500),
    };
    let outcome = seed::run(&ns, &spawns).await;
    sampling.cancel();
    sampler.await.unwrap();
    let (calls_after, failed_after) = webhook_calls();
    let cas = cas_seen.lock().unwrap().len();
    let renewals: usize = release
        .logs()
        .iter()
        .map(|(_, log)| log.matches("new serving certificate").count() + log.matches("the next CA signs").count())
        .sum();
    println!(
        "rotation under load: {outcome:?}; {} webhook calls, {} failed; {cas} CAs seen in the bundle; {renewals} leaves signed",
        calls_after - calls_before,
        failed_after - failed_before
    );
    assert_eq!(
        failed_after - failed_before,
        0.0,
        "failed webhook calls during the rotation"
    );
    assert_eq!(outcome.failed, 0, "cleanup deletes the apiserver could not decide");
    assert!(
        outcome.config_errors.is_empty(),
        "workers lost their secret: {:?}",
        outcome.config_errors
    );
    assert_eq!(outcome.completed.len(), spawns.workers);
    // A first CA, then another: one rotation at least.
    assert!(cas >= 2, "CAs seen in the bundle: {cas}");
    assert!(renewals >= 4, "leaves signed: {renewals}");

    the_way_out_when_every_replica_is_down(release, &values).await;
}

/// The replicas scaled to 0 or back (the drill's stand-in for an outage and its fix).
async fn scale_guard(release: &Release, replicas: usize) {
    let deployment = format!("deployment/{}", release.name);
    run(kubectl().args([
        "-n",
        release.namespace,
        "scale",
        &deployment,
        &format!("--replicas={replicas}"),
    ]));
    if replicas == 0 {
        // Terminating replicas still answer while they drain: wait until none is left.
        eventually("no guard pod left", Duration::from_secs(90), || {
            let pods = kubectl_json(&["-n", release.namespace, "get", "pods", "-l", install::GUARD_PODS]);
            pods["items"].as_array().is_some_and(Vec::is_empty).then_some(())
        })
        .await;
    } else {
        run(kubectl().args([
            "-n",
            release.namespace,
            "rollout",
            "status",
            &deployment,
            "--timeout=120s",
        ]));
    }
}

/// A delete of `secret` that the apiserver could not decide (no replica to call).
async fn failing_closed(ns: &TestNamespace, secret: &str) {
    let refusal = ns
        .delete_secret(secret, &kube::api::DeleteParams::default())
        .await
        .expect_err("no guard: the delete fails closed");
    assert!(
        refusal.message.contains("failed calling webhook"),
        "{}",
        refusal.message
    );
}

/// A delete of `secret` that goes through, once the apiserver has the new configuration.
async fn let_through(ns: &TestNamespace, secret: &str) {
    let started = std::time::Instant::now();
    while let Err(refusal) = ns.delete_secret(secret, &kube::api::DeleteParams::default()).await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still refused after the way out: {}",
            refusal.message
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// docs/emergency.md, "When every replica is down", step by step: both ways out let a
/// protected delete through, and back to normal the guard decides again (with a webhook
/// configuration recreated by Helm, the guard writes its caBundle back).
async fn the_way_out_when_every_replica_is_down(release: &Release, values: &[&str]) {
    let ns = TestNamespace::new("way-out").await;
    let configuration = format!("validatingwebhookconfiguration/{}", release.name);
    for (way, worker) in [("failurePolicy=Ignore", "a"), ("delete the configuration", "b")] {
        let secret = format!("cds-worker-config-{worker}");
        ns.worker_secret(worker).await;
        scale_guard(release, 0).await;
        failing_closed(&ns, &secret).await;
        if worker == "a" {
            let ignore = [values, &["webhooks.validating.failurePolicy=Ignore"]].concat();
            release.upgrade_waiting(VERSION, &ignore, false);
        } else {
            run(kubectl().args(["delete", &configuration]));
        }
        let_through(&ns, &secret).await;
        println!("way out ({way}): the delete went through");

        scale_guard(release, 2).await;
        release.upgrade_with(VERSION, values);
        let young = format!("cds-worker-config-{worker}-again");
        ns.worker_secret(&format!("{worker}-again")).await;
        let refusal = install::refused_by_the_guard(&ns, &young).await;
        assert!(
            refusal.message.contains("cannot be deleted within 10m of creation"),
            "back to normal after {way}: {}",
            refusal.message
        );
    }
}

/// The kustomize install (the tls-secret overlay) runs on the node too and decides a
/// delete from its pods.
async fn kustomize_install_decides_from_its_pods() {
    let installed = Kustomized::install(VERSION);
    let pods = guard_pods("cds-secret-guard");
    assert_eq!(pods.len(), 2, "two replicas: {pods:?}");
    assert!(
        pods.iter().all(|(_, node, ready)| node == "cds-guard-node" && *ready),
        "{pods:?}"
    );
    let _probe = install::a_young_worker_secret_is_refused("kustomize-probe").await;
    eventually(
        "a kustomize-installed pod's audit line",
        Duration::from_secs(10),
        || {
            guard_logs("cds-secret-guard").into_iter().find(|(_, log)| {
                audit_lines(log, "cds-worker-config-probe")
                    .iter()
                    .any(|l| l["decision"] == "deny")
            })
        },
    )
    .await;
    drop(installed);
}

/// `make run` after an end-to-end suite: the suites run the guard as its shipped role under
/// the chart's names, which Helm refuses to adopt ("exists and cannot be imported into the
/// current release"); `make run` installs all the same, and its guard decides.
async fn make_run_installs_over_what_the_suites_leave() {
    // What cluster::guard_kubeconfig leaves behind.
    let _ = kubectl().args(["create", "namespace", "cds-secret-guard"]).output();
    run(kubectl()
        .args(["-n", "cds-secret-guard", "apply", "-f"])
        .arg(cluster::repo().join("manifests/base/rbac.yaml")));
    let account = kubectl_json(&["-n", "cds-secret-guard", "get", "serviceaccount", "cds-secret-guard"]);
    assert!(
        account["metadata"]["annotations"]["meta.helm.sh/release-name"].is_null(),
        "the leftover is no release's: {account}"
    );

    // As the README gives it.
    let readme = pages::block("README.md", "make-run");
    let make_run = readme.lines().find(|line| line.starts_with("make run")).unwrap();
    run(std::process::Command::new("bash")
        .args(["-c", make_run])
        .current_dir(cluster::repo()));
    // Uninstalled when dropped.
    let release = Release {
        name: "cds-secret-guard",
        namespace: "cds-secret-guard",
    };
    let pods = release.pods();
    assert!(
        pods.len() == 2 && pods.iter().all(|(_, _, ready)| *ready),
        "make run's replicas: {pods:?}"
    );
    let account = kubectl_json(&["-n", "cds-secret-guard", "get", "serviceaccount", "cds-secret-guard"]);
    assert_eq!(
        account["metadata"]["annotations"]["meta.helm.sh/release-name"],
        "cds-secret-guard"
    );
    let _probe = install::a_young_worker_secret_is_refused("make-run-probe").await;
}

/// `hostNetwork: true` on its own ports: the replica serves from the node's address (for
/// CNIs the control plane cannot reach), and the apiserver still calls it through the
/// Service.
async fn the_host_network_variant_serves_from_the_node() {
    let release = Release::install_with(
        VERSION,
        &[
            "hostNetwork=true",
            "replicas=1",
            "ports.webhook=9443",
            "ports.probes=9080",
        ],
    );
    let pods = install::live_guard_pods(release.namespace);
    assert_eq!(pods.len(), 1, "one replica");
    let pod = &pods[0];
    assert_eq!(pod["spec"]["hostNetwork"], true);
    assert_eq!(
        pod["status"]["podIP"], pod["status"]["hostIP"],
        "the replica has the node's address"
    );
    let slices = kubectl_json(&[
        "-n",
        release.namespace,
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=cds-secret-guard",
    ]);
    let ports: Vec<i64> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|slice| slice["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|port| port["port"].as_i64())
        .collect();
    assert!(
        ports.contains(&9443),
        "the Service sends to the node's port 9443: {ports:?}"
    );
    let _probe = install::a_young_worker_secret_is_refused("host-network-probe").await;
}
