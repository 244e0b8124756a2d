//! In-use protection on the node, as shipped: the chart installed with `inUse.enabled` and
//! `inUse.mode=refuse`,
//! a Deployment whose pods the kubelet runs reading a Secret through `env` and a ConfigMap
//! through a volume, and `kubectl` users deleting them. Without the guard, the same
//! sequence leaves the rollout's new pods in `CreateContainerConfigError`; with it, every
//! delete is refused while a pod needs the object, and nothing is lost.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    cluster::{TestNamespace, kubectl, kubectl_delete},
    install::{Release, VERSION, default_service_account, eventually, kubectl_json, run},
    seed::WORKER_IMAGE,
};

const OPT_IN: &str = "cds-secret-guard/in-use-protection=enabled";
const FORCE: &str = "cds-secret-guard/force-delete";
const WITHIN: Duration = Duration::from_secs(120);

/// The Deployment `web`: `replicas` pods on the node that read the Secret `token` through
/// `env` and the ConfigMap `settings` through a volume, and the two objects.
fn workload(replicas: u32) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"mode": "live"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}, "stringData": {"TOKEN": "t0k3n"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
            "replicas": replicas,
            // A restart starts every new pod at once, and stops an old one only once a new
            // one runs.
            "strategy": {"rollingUpdate": {"maxSurge": "100%", "maxUnavailable": 0}},
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "test -f /etc/app/mode && test -n \"$TOKEN\" && exec sleep 3600"],
                    "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "TOKEN"}}}],
                    "volumeMounts": [{"name": "settings", "mountPath": "/etc/app"}],
                }],
                "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
            }},
        }},
    ]})
    .to_string()
}

/// The pods of `web` not being deleted: name, the reason its container waits if it does,
/// whether it runs.
fn web_pods(ns: &str) -> Vec<(String, Option<String>, bool)> {
    let pods = kubectl_json(&["-n", ns, "get", "pods", "-l", "app=web"]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .map(|pod| {
            let status = &pod["status"]["containerStatuses"][0];
            let waiting = status["state"]["waiting"]["reason"].as_str().map(str::to_owned);
            let running = status["state"]["running"].is_object();
            (pod["metadata"]["name"].as_str().unwrap().to_owned(), waiting, running)
        })
        .collect()
}

/// Waits until `web` has `replicas` pods running and no other.
async fn running(ns: &str, replicas: usize) {
    eventually(&format!("{replicas} pods of web running in {ns}"), WITHIN, || {
        let pods = web_pods(ns);
        (pods.len() == replicas && pods.iter().all(|(_, _, running)| *running)).then_some(())
    })
    .await;
}

/// In-use protection's audit lines (JSON) in a guard pod's log about the object `name`.
fn in_use_lines(log: &str, name: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["audit"] == true && line["rules"] == "in-use" && line["object"] == name)
        .collect()
}

/// Both objects of [`workload`].
const BOTH: [(&str, &str); 2] = [("configmap", "settings"), ("secret", "token")];

/// `kubectl rollout restart`, then, until the rollout is done or `within` has passed, the
/// deletes of `objects` (kind, name) tried every 200 ms; then the pods of `web` that cannot
/// start.
async fn restart_while_deleting(ns: &str, objects: &[(&str, &str)], within: Duration) -> Restart {
    run(kubectl().args(["-n", ns, "rollout", "restart", "deployment/web"]));
    let mut restart = Restart::default();
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !rolled_out(ns) {
        for &(kind, name) in objects {
            match kubectl_delete(ns, kind, name) {
                Ok(()) => restart.deleted.push(format!("{kind}/{name}")),
                Err(refusal) if refusal.contains("is in use by pod") => restart.refused += 1,
                Err(error) if error.contains("NotFound") => {}
                Err(error) => panic!("kubectl delete {kind} {name}: {error}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    restart.stuck = web_pods(ns)
        .into_iter()
        .filter(|(_, _, running)| !running)
        .map(|(pod, waiting, _)| (pod, waiting.unwrap_or_default()))
        .collect();
    restart
}

#[derive(Debug, Default)]
struct Restart {
    /// The deletes refused by the guard.
    refused: usize,
    /// The objects deleted.
    deleted: Vec<String>,
    /// The pods that do not run once it is over, and why their container waits
    /// (`CreateContainerConfigError`: the Secret `env` reads is gone; `ContainerCreating`:
    /// the kubelet cannot mount the ConfigMap).
    stuck: Vec<(String, String)>,
}

/// Whether the restarted Deployment's pods all run, the old ones gone.
fn rolled_out(ns: &str) -> bool {
    let deployment = kubectl_json(&["-n", ns, "get", "deployment", "web"]);
    let status = &deployment["status"];
    let want = &deployment["spec"]["replicas"];
    status["updatedReplicas"] == *want
        && status["availableReplicas"] == *want
        && status["replicas"] == *want
        && status["observedGeneration"] == deployment["metadata"]["generation"]
}

/// Without the guard, then with it: the same Deployment, the same deletes, the same
/// rollout; then the ways out (scale to 0, the force annotation, `helm uninstall`,
/// deleting the namespace).
pub async fn the_chart_installed_guard_keeps_what_a_deployment_uses_on_the_node() {
    let release = Release::install_with(VERSION, &["inUse.enabled=true", "inUse.mode=refuse"]);

    // Outside the opt-in, as if there were no guard: both deletes pass, and the rollout's
    // new pods wait for what is gone.
    let open = TestNamespace::new("in-use-open").await;
    default_service_account(&open.name).await;
    open.apply(&workload(3));
    running(&open.name, 3).await;
    assert_eq!(kubectl_delete(&open.name, "secret", "token"), Ok(()));
    assert_eq!(kubectl_delete(&open.name, "configmap", "settings"), Ok(()));
    let unguarded = restart_while_deleting(&open.name, &BOTH, Duration::from_secs(30)).await;
    println!("in-use, without the guard: {unguarded:?}");
    assert_eq!(
        unguarded.stuck.len(),
        3,
        "every new pod waits for what was deleted: {unguarded:?}"
    );
    for (pod, reason) in &unguarded.stuck {
        assert!(
            ["CreateContainerConfigError", "ContainerCreating"].contains(&reason.as_str()),
            "{pod} waits for {reason}"
        );
    }
    assert_eq!(unguarded.refused, 0, "the guard answered outside the opt-in");
    // The Secret alone gone: the kubelet mounts the volume, then cannot build the env.
    open.apply(&workload(3));
    let secret_only = {
        run(kubectl().args([
            "-n",
            &open.name,
            "rollout",
            "status",
            "deployment/web",
            "--timeout=120s",
        ]));
        assert_eq!(kubectl_delete(&open.name, "secret", "token"), Ok(()));
        restart_while_deleting(&open.name, &[("secret", "token")], Duration::from_secs(30)).await
    };
    println!("in-use, without the guard, the Secret alone deleted: {secret_only:?}");
    let config_errors = secret_only
        .stuck
        .iter()
        .filter(|(_, reason)| reason == "CreateContainerConfigError")
        .count();
    assert_eq!(config_errors, 3, "{secret_only:?}");

    // Opted in: each delete is refused, naming the pods, all through a rollout.
    let guarded = TestNamespace::new("in-use-guarded").await;
    default_service_account(&guarded.name).await;
    run(kubectl().args(["label", "namespace", &guarded.name, OPT_IN]));
    guarded.apply(&workload(3));
    running(&guarded.name, 3).await;
    let pods: Vec<String> = web_pods(&guarded.name).into_iter().map(|(pod, _, _)| pod).collect();
    for (kind, name) in BOTH {
        let refusal = kubectl_delete(&guarded.name, kind, name).unwrap_err();
        for pod in &pods {
            assert!(refusal.contains(pod.as_str()), "the refusal names {pod}: {refusal}");
        }
    }
    let guarded_run = restart_while_deleting(&guarded.name, &BOTH, WITHIN).await;
    println!("in-use, with the guard: {guarded_run:?}");
    assert!(
        guarded_run.deleted.is_empty(),
        "deleted in use: {:?}",
        guarded_run.deleted
    );
    assert!(
        guarded_run.stuck.is_empty(),
        "pods lost what they read: {guarded_run:?}"
    );
    assert!(guarded_run.refused > 0);
    assert!(rolled_out(&guarded.name), "the rollout completed");
    let audited = release.logs().iter().any(|(_, log)| {
        in_use_lines(log, "settings")
            .iter()
            .any(|line| line["rules"] == "in-use" && line["decision"] == "deny")
    });
    assert!(audited, "a guard pod's audit line for the refusal");

    // Scaled to 0, its pods gone: both deletes pass.
    run(kubectl().args(["-n", &guarded.name, "scale", "deployment/web", "--replicas=0"]));
    eventually("web's pods gone", WITHIN, || {
        web_pods(&guarded.name).is_empty().then_some(())
    })
    .await;
    eventually(
        "the deletes pass once no pod uses them",
        Duration::from_secs(10),
        || {
            let config_map = kubectl_delete(&guarded.name, "configmap", "settings");
            let secret = kubectl_delete(&guarded.name, "secret", "token");
            (config_map.is_ok() && secret.is_ok()).then_some(())
        },
    )
    .await;

    // The force path, while a pod uses the object; audited as forced.
    guarded.apply(&workload(1));
    running(&guarded.name, 1).await;
    assert!(kubectl_delete(&guarded.name, "configmap", "settings").is_err());
    let why = format!("{FORCE}=replaced by settings-v2");
    run(kubectl().args(["-n", &guarded.name, "annotate", "configmap", "settings", &why]));
    assert_eq!(kubectl_delete(&guarded.name, "configmap", "settings"), Ok(()));
    let forced = eventually(
        "a guard pod's audit line for the forced delete",
        Duration::from_secs(10),
        || {
            release.logs().into_iter().find_map(|(_, log)| {
                in_use_lines(&log, "settings")
                    .into_iter()
                    .find(|line| line["reason"] == "forced")
            })
        },
    )
    .await;
    println!("forced: {forced}");

    // Deleting the namespace while a pod still uses its Secret completes.
    let started = Instant::now();
    run(kubectl().args(["delete", "namespace", &guarded.name, "--timeout=120s"]));
    println!("namespace deleted, a pod using its Secret, in {:?}", started.elapsed());

    helm_uninstall_completes().await;
    drop(release);
}

/// A release of a Deployment (2 pods on the node) and the ConfigMaps and Secrets it and
/// others read, in an opted-in namespace: `helm uninstall --wait` completes.
async fn helm_uninstall_completes() {
    let ns = TestNamespace::new("in-use-helm").await;
    default_service_account(&ns.name).await;
    run(kubectl().args(["label", "namespace", &ns.name, OPT_IN]));
    let chart = chart();
    let helm = |args: &[&str]| {
        let mut command = Command::new(repo().join("target/tools/bin/helm"));
        command
            .env("KUBECONFIG", crate::cluster::control_plane())
            .args(["-n", &ns.name])
            .args(args);
        command
    };
    run(helm(&["install", "app"])
        .arg(&chart)
        .args(["--wait", "--timeout", "2m"]));
    running(&ns.name, 2).await;
    let started = Instant::now();
    run(&mut helm(&["uninstall", "app", "--wait", "--timeout", "2m"]));
    let took = started.elapsed();
    let left = kubectl_json(&[
        "-n",
        &ns.name,
        "get",
        "configmaps,secrets,deployments",
        "-l",
        "release=app",
    ]);
    let names: Vec<&Value> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| &item["metadata"]["name"])
        .collect();
    assert!(names.is_empty(), "helm uninstall left {names:?}");
    // The Deployment's pods were still running when their ConfigMap and Secret went: on
    // their way out, the garbage collector deleting them.
    eventually("the release's pods gone", WITHIN, || {
        let pods = kubectl_json(&["-n", &ns.name, "get", "pods", "-l", "release=app"]);
        pods["items"].as_array().unwrap().is_empty().then_some(())
    })
    .await;
    println!("helm uninstall of a release in use on the node: {took:?}");
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A chart of 10 ConfigMaps, 10 Secrets and the Deployment `web` reading the first of
/// each, written under target/shipped.
fn chart() -> PathBuf {
    let dir = repo().join("target/shipped/in-use-chart");
    let templates = dir.join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: in-use-app\nversion: 0.1.0\n",
    )
    .unwrap();
    let mut objects: Vec<Value> = Vec::new();
    for i in 0..10 {
        // The first of each is the one the Deployment uses.
        let name = |base: &str| if i == 0 { base.to_owned() } else { format!("{base}-{i}") };
        objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name("settings"), "labels": {"release": "app"}}, "data": {"mode": "live"}}));
        objects.push(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name("token"), "labels": {"release": "app"}}, "stringData": {"TOKEN": "t0k3n"}}));
    }
    let list: Value = serde_json::from_str(&workload(2)).unwrap();
    let mut deployment = list["items"][2].clone();
    deployment["metadata"]["labels"] = json!({"release": "app"});
    deployment["spec"]["template"]["metadata"]["labels"]["release"] = json!("app");
    objects.push(deployment);
    let manifests: Vec<String> = objects.iter().map(|object| object.to_string()).collect();
    std::fs::write(templates.join("all.yaml"), manifests.join("\n---\n")).unwrap();
    dir
}
