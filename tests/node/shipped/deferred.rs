//! Deferred deletes on the node, as shipped: the chart installed with `inUse.enabled` (its
//! default mode, `defer`), and the tools that delete what they no longer render. A chart
//! whose ConfigMap and Secret are named after their data's hash (the ConfigMap read
//! through a volume, the Secret through `env`) is upgraded with new data, rolled back, and
//! uninstalled; the same rename goes through `kubectl apply --prune`; the guard is scaled
//! to 0 while a delete is deferred; and the guard itself is turned off and uninstalled with
//! objects it holds. Whenever an old pod runs, what it reads is there; once the last one is
//! gone, the old objects go.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::{
    cluster::{TestNamespace, kubectl},
    install::{Release, VERSION, default_service_account, eventually, kubectl_json, run, stdout},
    pages,
    seed::WORKER_IMAGE,
};

const FINALIZER: &str = "cds-secret-guard.io/in-use";
const FORCE: &str = "cds-secret-guard/force-delete";
const OPT_IN: &str = "cds-secret-guard/in-use-protection=enabled";
const WITHIN: Duration = Duration::from_secs(120);
/// How long an old object may outlive the last old pod.
const AFTER_THE_LAST_POD: Duration = Duration::from_secs(30);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn helm(namespace: &str) -> Command {
    let mut command = Command::new(repo().join("target/tools/bin/helm"));
    command
        .env("KUBECONFIG", crate::cluster::control_plane())
        .args(["-n", namespace]);
    command
}

/// The first 8 hex digits of the data's SHA-256, as the chart names its objects.
fn hash_of(data: &str) -> String {
    let output = run(Command::new("sh")
        .arg("-c")
        .arg(format!("printf %s '{data}' | sha256sum")));
    stdout(&output)[..8].to_owned()
}

/// The Deployment `web` (2 pods, one more at a time) reading the ConfigMap
/// `app-config-HASH` through a volume and the Secret `app-token-HASH` through `env`, and
/// the two objects, labelled `set=app`; `HASH` is `hash` as written (a Helm template's, or
/// a value). A container stops when `/tmp/stop` appears; its restart reads both again.
fn manifests(hash: &str, data: &str) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": format!("app-config-{hash}"), "labels": {"set": "app"}},
               "data": {"mode": data}}),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": format!("app-token-{hash}"), "labels": {"set": "app"}},
               "stringData": {"TOKEN": data}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"set": "app"}},
        "spec": {
            "replicas": 2,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "app", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "test -f /etc/app/mode && test -n \"$TOKEN\" && while [ ! -e /tmp/stop ]; do sleep 1; done"],
                    "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": format!("app-token-{hash}"), "key": "TOKEN"}}}],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
                }],
                "volumes": [{"name": "config", "configMap": {"name": format!("app-config-{hash}")}}],
            }},
        }}),
    ]
}

/// The chart `app`: [`manifests`] named after the hash of `.Values.data`.
fn chart() -> PathBuf {
    let dir = repo().join("target/shipped/deferred-app");
    let templates = dir.join("templates");
    std::fs::create_dir_all(&templates).unwrap();
    std::fs::write(dir.join("Chart.yaml"), "apiVersion: v2\nname: app\nversion: 0.1.0\n").unwrap();
    std::fs::write(dir.join("values.yaml"), "data: one\n").unwrap();
    let hash = "{{ .Values.data | sha256sum | trunc 8 }}";
    let yaml: Vec<String> = manifests(hash, "{{ .Values.data }}")
        .iter()
        .map(|object| object.to_string())
        .collect();
    std::fs::write(templates.join("all.yaml"), yaml.join("\n---\n")).unwrap();
    dir
}

/// The pods of `web` reading what `hash` names and not terminal (Succeeded, Failed: done,
/// their volumes let go): name, whether its container runs.
fn pods_of(ns: &str, hash: &str) -> Vec<(String, bool)> {
    let pods = kubectl_json(&["-n", ns, "get", "pods", "-l", "app=web"]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pod| pod.to_string().contains(&format!("app-config-{hash}")))
        .filter(|pod| !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .map(|pod| {
            let running = pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
            (pod["metadata"]["name"].as_str().unwrap().to_owned(), running)
        })
        .collect()
}

/// Whether `kind/name` exists in `ns`, and whether the guard's finalizer holds it.
fn object(ns: &str, kind: &str, name: &str) -> Option<Value> {
    let output = kubectl()
        .args(["-n", ns, "get", kind, name, "-o", "json", "--ignore-not-found"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    (!text.trim().is_empty()).then(|| serde_json::from_str(&text).unwrap())
}

fn held(object: &Value) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|finalizers| finalizers.iter().any(|finalizer| finalizer == FINALIZER))
}

async fn both_held(ns: &str, hash: &str) {
    eventually(
        &format!("app-config-{hash} and app-token-{hash} held"),
        Duration::from_secs(30),
        || {
            let config_map = object(ns, "configmap", &format!("app-config-{hash}"))?;
            let secret = object(ns, "secret", &format!("app-token-{hash}"))?;
            (held(&config_map) && held(&secret)).then_some(())
        },
    )
    .await;
}

/// What a sampler saw of a rename while it ran.
#[derive(Debug, Default)]
struct Rename {
    /// Samples in which an old pod existed while an old object did not.
    lost: Vec<String>,
    /// Samples in which an old pod existed (and its objects with it).
    with_old_pods: usize,
    /// When the last old pod was seen, and when an old object was last seen.
    last_old_pod: Option<Instant>,
    last_old_object: Option<Instant>,
}

/// Samples every 100 ms, until `done` and both old objects are gone (or `WITHIN`), which
/// of the old pods (reading `old`) and old objects exist.
async fn watch_rename(ns: &str, old: &str, done: impl Fn() -> bool) -> Rename {
    let mut seen = Rename::default();
    let deadline = Instant::now() + WITHIN;
    loop {
        // The objects first: an old pod seen after an object is gone was there before
        // (old pods only end), so it ran without it.
        let config_map = object(ns, "configmap", &format!("app-config-{old}")).is_some();
        let secret = object(ns, "secret", &format!("app-token-{old}")).is_some();
        let pods = pods_of(ns, old);
        let now = Instant::now();
        if !pods.is_empty() {
            seen.last_old_pod = Some(now);
            seen.with_old_pods += 1;
            if !config_map || !secret {
                seen.lost
                    .push(format!("pods {pods:?}, configmap {config_map}, secret {secret}"));
            }
        }
        if config_map || secret {
            seen.last_old_object = Some(now);
        } else if done() {
            return seen;
        }
        assert!(now < deadline, "{ns}: the rename did not settle: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `helm ARGS` in the background; its output once it is done.
fn helm_in_background(ns: &str, args: &[&str]) -> Arc<Mutex<Option<Output>>> {
    let output = Arc::new(Mutex::new(None));
    let mut command = helm(ns);
    command.args(args);
    std::thread::spawn({
        let output = output.clone();
        move || *output.lock().unwrap() = Some(command.output().unwrap())
    });
    output
}

fn finished(output: &Arc<Mutex<Option<Output>>>) -> Option<Output> {
    output.lock().unwrap().clone()
}

/// Every Secret and ConfigMap of the cluster that carries the guard's finalizer.
fn held_anywhere() -> Vec<String> {
    let objects = kubectl_json(&["get", "secrets,configmaps", "-A"]);
    objects["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|object| held(object))
        .map(|object| format!("{}/{}", object["metadata"]["namespace"], object["metadata"]["name"]))
        .collect()
}

/// The chart from the registry's defaults with in-use protection on: a hash-renamed
/// chart upgraded, rolled back and uninstalled, the same rename by `kubectl apply
/// --prune`, the guard scaled to 0, turned off and uninstalled.
pub async fn the_chart_installed_guard_defers_what_tools_delete_on_the_node() {
    let release = Release::install_with(VERSION, &["inUse.enabled=true"]);
    helm_upgrade_renames_and_rolls_back().await;
    kubectl_apply_prune_renames().await;
    the_guard_scaled_to_0_leaves_a_delete_pending().await;
    the_guard_turned_off_or_uninstalled_holds_nothing(&release).await;
    drop(release);
}

/// `helm upgrade` of the hash-renamed chart, then `helm rollback` while a delete is
/// deferred, then `helm uninstall`.
async fn helm_upgrade_renames_and_rolls_back() {
    let ns = TestNamespace::new("deferred-helm").await;
    default_service_account(&ns.name).await;
    run(kubectl().args(["label", "namespace", &ns.name, OPT_IN]));
    let chart = chart();
    let (one, two, three) = (hash_of("one"), hash_of("two"), hash_of("three"));
    run(helm(&ns.name)
        .args(["install", "app"])
        .arg(&chart)
        .args(["--wait", "--timeout", "2m"]));
    both_held(&ns.name, &one).await;

    // The upgrade: accepted, the release deployed, each old object kept while an old pod
    // is there, and gone once they all are.
    let started = Instant::now();
    let upgrade = helm_in_background(
        &ns.name,
        &[
            "upgrade",
            "app",
            chart.to_str().unwrap(),
            "--set",
            "data=two",
            "--wait",
            "--timeout",
            "2m",
        ],
    );
    let rename = watch_rename(&ns.name, &one, || finished(&upgrade).is_some()).await;
    let upgrade = finished(&upgrade).unwrap();
    let said = String::from_utf8_lossy(&upgrade.stderr);
    assert!(upgrade.status.success(), "helm upgrade: {said}");
    for what in [format!("configmap app-config-{one}"), format!("secret app-token-{one}")] {
        assert!(
            said.contains(&format!("{what} is in use by pod"))
                && said.contains("it will be deleted once they are gone"),
            "helm printed no warning for {what}: {said}"
        );
    }
    let status = stdout(&run(helm(&ns.name).args(["status", "app", "-o", "json"])));
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["info"]["status"], "deployed");
    assert!(
        rename.lost.is_empty(),
        "an old pod ran without what it reads: {rename:?}"
    );
    assert!(rename.with_old_pods > 0, "no old pod was seen: {rename:?}");
    let (last_pod, last_object) = (rename.last_old_pod.unwrap(), rename.last_old_object.unwrap());
    let after = last_object.saturating_duration_since(last_pod);
    assert!(
        after <= AFTER_THE_LAST_POD,
        "the old objects outlived the old pods by {after:?}"
    );
    println!(
        "deferred, helm upgrade of a hash-renamed chart: exit 0 and deployed; old pods seen in {} samples, never without their objects; the old objects gone {after:?} after the last old pod ({:?} in all)",
        rename.with_old_pods,
        started.elapsed()
    );

    // A rollback while the upgrade's deletes are deferred (the upgrade not waited for, as
    // when it fails): it succeeds, and the objects it needs, being deleted, stay while its
    // pods run. `--wait` would wait for them to stop terminating, which they never do.
    both_held(&ns.name, &two).await;
    let upgrade = helm(&ns.name)
        .args(["upgrade", "app"])
        .arg(&chart)
        .args(["--set", "data=three"])
        .output()
        .unwrap();
    assert!(upgrade.status.success(), "{upgrade:?}");
    let rollback = helm(&ns.name).args(["rollback", "app", "2"]).output().unwrap();
    assert!(rollback.status.success(), "helm rollback: {rollback:?}");
    eventually("the rolled-back pods run", WITHIN, || {
        let pods = pods_of(&ns.name, &two);
        (pods.len() == 2 && pods.iter().all(|(_, running)| *running)).then_some(())
    })
    .await;
    for (kind, name) in [
        ("configmap", format!("app-config-{two}")),
        ("secret", format!("app-token-{two}")),
    ] {
        let kept = object(&ns.name, kind, &name).unwrap_or_else(|| panic!("{kind} {name} lost"));
        assert!(
            !kept["metadata"]["deletionTimestamp"].is_null() && held(&kept),
            "{kind} {name}: deleted by the upgrade, held for the rolled-back pods: {kept}"
        );
    }
    // A pod replaced since the delete: the new one keeps them too, and is told of with a
    // Warning Event. Timestamps are to the second: it is created in a later one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (replaced, _) = pods_of(&ns.name, &two).into_iter().next().unwrap();
    run(kubectl().args(["-n", &ns.name, "delete", "pod", &replaced, "--wait=false"]));
    let event = eventually("a UsedAfterDelete Event", Duration::from_secs(60), || {
        let events = kubectl_json(&["-n", &ns.name, "get", "events.events.k8s.io"]);
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| {
                event["reason"] == "UsedAfterDelete"
                    && event["regarding"]["name"] == format!("app-config-{two}").as_str()
            })
            .cloned()
    })
    .await;
    println!(
        "deferred, helm rollback during the deferral: exit 0, its pods run on the objects being deleted; {}",
        event["note"]
    );
    // The way back, as docs/in-use.md says: the force annotation lets them go, and
    // `helm upgrade` with the rolled-back values creates them again.
    let started = Instant::now();
    for (kind, name) in [
        ("configmap", format!("app-config-{two}")),
        ("secret", format!("app-token-{two}")),
    ] {
        run(kubectl().args([
            "-n",
            &ns.name,
            "annotate",
            kind,
            &name,
            &format!("{FORCE}=made again after a rollback"),
        ]));
    }
    eventually("the objects being deleted gone", WITHIN, || {
        object(&ns.name, "configmap", &format!("app-config-{two}"))
            .is_none()
            .then_some(())
    })
    .await;
    run(helm(&ns.name)
        .args(["upgrade", "app"])
        .arg(&chart)
        .args(["--set", "data=two", "--wait", "--timeout", "2m"]));
    both_held(&ns.name, &two).await;
    let whole = object(&ns.name, "configmap", &format!("app-config-{two}")).unwrap();
    assert!(whole["metadata"]["deletionTimestamp"].is_null(), "made again: {whole}");
    eventually("the pods run", WITHIN, || {
        let pods = pods_of(&ns.name, &two);
        (pods.len() == 2 && pods.iter().all(|(_, running)| *running)).then_some(())
    })
    .await;
    println!(
        "deferred, after the rollback: the objects made again in {:?}",
        started.elapsed()
    );
    eventually("the abandoned upgrade's objects gone", WITHIN, || {
        object(&ns.name, "configmap", &format!("app-config-{three}"))
            .is_none()
            .then_some(())
    })
    .await;

    // `helm uninstall`: everything it installed goes within 30 s after its pods.
    let uninstall = helm_in_background(&ns.name, &["uninstall", "app"]);
    let rename = watch_rename(&ns.name, &two, || finished(&uninstall).is_some()).await;
    let uninstall = finished(&uninstall).unwrap();
    assert!(uninstall.status.success(), "helm uninstall: {uninstall:?}");
    assert!(rename.lost.is_empty(), "a pod ran without what it reads: {rename:?}");
    let after = rename
        .last_old_object
        .unwrap()
        .saturating_duration_since(rename.last_old_pod.unwrap_or(Instant::now()));
    assert!(
        after <= AFTER_THE_LAST_POD,
        "the release's objects outlived its pods by {after:?}"
    );
    println!("deferred, helm uninstall: the release's objects gone {after:?} after its pods");
}

/// The same rename by `kubectl apply --prune -l set=app`.
async fn kubectl_apply_prune_renames() {
    let ns = TestNamespace::new("deferred-prune").await;
    default_service_account(&ns.name).await;
    run(kubectl().args(["label", "namespace", &ns.name, OPT_IN]));
    let (one, two) = (hash_of("one"), hash_of("two"));
    let list = |hash: &str, data: &str| {
        json!({"apiVersion": "v1", "kind": "List", "items": manifests(hash, data)}).to_string()
    };
    ns.apply(&list(&one, "one"));
    run(kubectl().args(["-n", &ns.name, "rollout", "status", "deployment/web", "--timeout=120s"]));
    both_held(&ns.name, &one).await;

    let manifest = repo().join("target/shipped/deferred-prune.json");
    std::fs::write(&manifest, list(&two, "two")).unwrap();
    let started = Instant::now();
    let prune = kubectl()
        .args(["-n", &ns.name, "apply", "--prune", "-l", "set=app", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(prune.status.success(), "kubectl apply --prune: {prune:?}");
    let rename = watch_rename(&ns.name, &one, || true).await;
    assert!(
        rename.lost.is_empty(),
        "an old pod ran without what it reads: {rename:?}"
    );
    run(kubectl().args(["-n", &ns.name, "rollout", "status", "deployment/web", "--timeout=120s"]));
    let after = rename
        .last_old_object
        .unwrap()
        .saturating_duration_since(rename.last_old_pod.unwrap_or(started));
    assert!(
        after <= AFTER_THE_LAST_POD,
        "the pruned objects outlived the old pods by {after:?}"
    );
    println!(
        "deferred, kubectl apply --prune: exit 0; the pruned objects gone {after:?} after the last old pod ({:?} in all)",
        started.elapsed()
    );
}

/// No replica answers: a delete of a held object is accepted and waits; the pods keep
/// running, and a container that stops starts again reading the object; once the guard is
/// back and the pods are gone, the object goes.
async fn the_guard_scaled_to_0_leaves_a_delete_pending() {
    let ns = TestNamespace::new("deferred-down").await;
    default_service_account(&ns.name).await;
    run(kubectl().args(["label", "namespace", &ns.name, OPT_IN]));
    let one = hash_of("one");
    ns.apply(&json!({"apiVersion": "v1", "kind": "List", "items": manifests(&one, "one")}).to_string());
    run(kubectl().args(["-n", &ns.name, "rollout", "status", "deployment/web", "--timeout=120s"]));
    both_held(&ns.name, &one).await;

    let scale = |replicas: &str| {
        run(kubectl().args([
            "-n",
            "cds-secret-guard",
            "scale",
            "deployment/cds-secret-guard",
            "--replicas",
            replicas,
        ]));
    };
    scale("0");
    eventually("no guard pod left", WITHIN, || {
        crate::install::live_guard_pods("cds-secret-guard")
            .is_empty()
            .then_some(())
    })
    .await;
    let secret = format!("app-token-{one}");
    let deleted = kubectl()
        .args(["-n", &ns.name, "delete", "secret", &secret, "--wait=false"])
        .output()
        .unwrap();
    assert!(
        deleted.status.success(),
        "the delete waits on the finalizer, not on the guard: {deleted:?}"
    );
    let pending = object(&ns.name, "secret", &secret).unwrap();
    assert!(!pending["metadata"]["deletionTimestamp"].is_null() && held(&pending));

    // What waits, as docs/in-use.md lists it.
    let what_waits = pages::block("docs/in-use.md", "what-waits");
    let listed = stdout(&run(Command::new("sh")
        .arg("-c")
        .arg(&what_waits)
        .env("KUBECONFIG", crate::cluster::control_plane())
        .env("PATH", path_with_kubectl())));
    assert!(
        listed.contains(&secret),
        "the page's command lists the pending delete: {listed}"
    );

    // A container that stops starts again, reading the Secret being deleted.
    let (pod, _) = pods_of(&ns.name, &one).into_iter().next().unwrap();
    run(kubectl().args(["-n", &ns.name, "exec", &pod, "--", "sh", "-c", ": > /tmp/stop"]));
    let restarts = eventually("the stopped container runs again", WITHIN, || {
        let status = kubectl_json(&["-n", &ns.name, "get", "pod", &pod]);
        let container = &status["status"]["containerStatuses"][0];
        let restarts = container["restartCount"].as_u64().unwrap_or(0);
        (restarts >= 1 && container["state"]["running"].is_object()).then_some(restarts)
    })
    .await;
    println!(
        "deferred, the guard at 0 replicas: the delete pending, a container restarted {restarts} time(s) reading the Secret"
    );

    scale("2");
    eventually("the guard back", WITHIN, || {
        let pods = crate::install::guard_pods("cds-secret-guard");
        (pods.len() == 2 && pods.iter().all(|(_, _, ready)| *ready)).then_some(())
    })
    .await;
    assert!(object(&ns.name, "secret", &secret).is_some(), "its pods still run");
    let started = Instant::now();
    run(kubectl().args(["-n", &ns.name, "scale", "deployment/web", "--replicas=0"]));
    eventually("the pending delete completes once the pods are gone", WITHIN, || {
        object(&ns.name, "secret", &secret).is_none().then_some(())
    })
    .await;
    println!(
        "deferred, the guard back: the pending delete completed {:?} after the scale to 0",
        started.elapsed()
    );

    // Every replica down again, and a delete waiting: docs/emergency.md's way out releases
    // it by hand, and it completes at once. The workload back first, its Secret made again.
    ns.apply(&json!({"apiVersion": "v1", "kind": "List", "items": manifests(&one, "one")}).to_string());
    run(kubectl().args(["-n", &ns.name, "rollout", "status", "deployment/web", "--timeout=120s"]));
    both_held(&ns.name, &one).await;
    scale("0");
    eventually("no guard pod left", WITHIN, || {
        crate::install::live_guard_pods("cds-secret-guard")
            .is_empty()
            .then_some(())
    })
    .await;
    let config_map = format!("app-config-{one}");
    run(kubectl().args(["-n", &ns.name, "delete", "configmap", &config_map, "--wait=false"]));
    assert!(object(&ns.name, "configmap", &config_map).is_some_and(|pending| held(&pending)));
    let way_out = pages::block("docs/emergency.md", "release-finalizers");
    run(Command::new("bash")
        .arg("-c")
        .arg(&way_out)
        .env("KUBECONFIG", crate::cluster::control_plane())
        .env("PATH", path_with_kubectl()));
    assert!(
        object(&ns.name, "configmap", &config_map).is_none(),
        "released by hand, it is gone"
    );
    let held = held_anywhere();
    assert!(held.is_empty(), "the page's command left {held:?}");
    println!("deferred, every replica down: docs/emergency.md's command released the waiting delete");
    scale("2");
    eventually("the guard back", WITHIN, || {
        let pods = crate::install::guard_pods("cds-secret-guard");
        (pods.len() == 2 && pods.iter().all(|(_, _, ready)| *ready)).then_some(())
    })
    .await;
}

/// Turned off by an upgrade, then uninstalled: nothing keeps the guard's finalizer, and a
/// namespace whose pods use what it held deletes.
async fn the_guard_turned_off_or_uninstalled_holds_nothing(release: &Release) {
    let ns = TestNamespace::new("deferred-off").await;
    default_service_account(&ns.name).await;
    run(kubectl().args(["label", "namespace", &ns.name, OPT_IN]));
    let one = hash_of("one");
    ns.apply(&json!({"apiVersion": "v1", "kind": "List", "items": manifests(&one, "one")}).to_string());
    run(kubectl().args(["-n", &ns.name, "rollout", "status", "deployment/web", "--timeout=120s"]));
    both_held(&ns.name, &one).await;

    release.upgrade_with(VERSION, &["inUse.enabled=false"]);
    let held = held_anywhere();
    assert!(held.is_empty(), "turned off, the guard still holds {held:?}");
    release.upgrade_with(VERSION, &["inUse.enabled=true"]);
    // The replicas without in-use protection refuse what its webhooks send them while
    // they drain (docs/in-use.md, "Turn it on").
    crate::install::drained(release.namespace).await;
    both_held(&ns.name, &one).await;
    // A delete deferred when the guard goes.
    run(kubectl().args([
        "-n",
        &ns.name,
        "delete",
        "configmap",
        &format!("app-config-{one}"),
        "--wait=false",
    ]));

    let started = Instant::now();
    run(Command::new(repo().join("target/tools/bin/helm"))
        .env("KUBECONFIG", crate::cluster::control_plane())
        .args([
            "-n",
            release.namespace,
            "uninstall",
            release.name,
            "--wait",
            "--timeout",
            "2m",
        ]));
    let held = held_anywhere();
    assert!(held.is_empty(), "uninstalled, the guard still holds {held:?}");
    println!(
        "deferred, helm uninstall of the guard: nothing held ({:?})",
        started.elapsed()
    );
    let started = Instant::now();
    run(kubectl().args(["delete", "namespace", &ns.name, "--timeout=60s"]));
    println!(
        "deferred, a namespace deleted after the guard went: {:?}",
        started.elapsed()
    );
}

/// `PATH` with the control plane's kubectl first.
fn path_with_kubectl() -> String {
    format!(
        "{}:{}",
        repo().join("target/controlplane/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
