//! What a user runs: the image built from the Dockerfile (`make image`), the node of
//! `cluster.sh up --node`, and the guard installed on it with Helm or kustomize.

use std::{
    process::{Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::cluster::{self, TestNamespace, kubectl};

/// The guard's version: the image's tag and the chart's appVersion.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The image `make image` tags.
pub const IMAGE: &str = "cds-secret-guard";

use crate::repo;

/// Runs a command; fails the test with its output when it fails.
pub fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// `docker ARGS` on the repository's engine (hack/docker.sh starts and stops it).
pub fn docker() -> Command {
    Command::new(repo().join("hack/docker.sh"))
}

/// `make image`, once per test binary.
pub fn image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        run(Command::new("make").arg("-C").arg(repo()).arg("image"));
    });
}

/// The control plane with its node (`cluster.sh up --node`), once per test binary; the
/// shipped image loaded onto the node under both tags.
pub fn node() {
    static UP: OnceLock<()> = OnceLock::new();
    UP.get_or_init(|| {
        let cluster = repo().join("hack/controlplane/cluster.sh");
        let output = Command::new(&cluster).args(["up", "--node"]).output().unwrap();
        assert!(
            output.status.success(),
            "the control plane with its node did not come up (this test needs it; it never skips):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        image();
        for tag in [VERSION, "dev"] {
            run(Command::new(&cluster).args(["image-load", &format!("{IMAGE}:{tag}")]));
        }
        cluster::control_plane();
        clear_e2e_leftovers();
    });
}

/// The e2e suites run the guard on the host as its shipped role: they leave the base's
/// RBAC (applied with kubectl) and the `check` account behind, which a user's cluster
/// would not have and which Helm refuses to adopt. `make run` clears them the same way.
fn clear_e2e_leftovers() {
    run(Command::new(repo().join("hack/local.sh")).arg("clear"));
}

pub fn kubectl_json(args: &[&str]) -> Value {
    let output = run(kubectl().args(args).args(["-o", "json"]));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The nodes' taints and conditions: what a pod left Pending needs explained.
pub fn nodes_state() -> String {
    let jsonpath = r#"jsonpath={range .items[*]}{.metadata.name} taints: {.spec.taints}{"\n"}{range .status.conditions[*]}  {.type}={.status} {.reason}: {.message}{"\n"}{end}{end}"#;
    match kubectl().args(["get", "nodes", "-o", jsonpath]).output() {
        Ok(output) => format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => format!("kubectl get nodes: {e}"),
    }
}

/// Polls `check` every 200 ms until it returns `Some`, or fails after `within`
/// with the nodes' taints and conditions, which say why pods did not run.
pub async fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; nodes:\n{}",
            nodes_state()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The guard installed by Helm as the README says, from the chart's defaults but for
/// the image tag and pull policy. Uninstalled when dropped: a `failurePolicy: Fail`
/// webhook must not outlive its guard.
pub struct Release {
    pub name: &'static str,
    pub namespace: &'static str,
}

/// The guard's pods' label.
pub const GUARD_PODS: &str = "app.kubernetes.io/name=cds-secret-guard";

impl Release {
    fn helm(&self) -> Command {
        let mut command = Command::new(repo().join("target/tools/bin/helm"));
        command
            .env("KUBECONFIG", cluster::control_plane())
            .args(["-n", self.namespace]);
        command
    }

    /// `helm install` (or upgrade) with this image tag, `--wait`: the Deployment's pods
    /// are ready when it returns.
    pub fn install(tag: &str) -> Self {
        Self::install_with(tag, &[])
    }

    /// `helm install` with more values (`key=value`).
    pub fn install_with(tag: &str, values: &[&str]) -> Self {
        let release = Self {
            name: "cds-secret-guard",
            namespace: "cds-secret-guard",
        };
        let _ = release.helm().args(["uninstall", release.name, "--wait"]).output();
        release.upgrade_with(tag, values);
        release
    }

    /// `helm upgrade` to an image tag; waits for the rollout.
    pub fn upgrade(&self, tag: &str) {
        self.upgrade_with(tag, &[]);
    }

    /// `helm upgrade` to an image tag with more values (`key=value`); waits for the
    /// rollout.
    pub fn upgrade_with(&self, tag: &str, values: &[&str]) {
        self.upgrade_waiting(tag, values, true);
    }

    /// `helm upgrade` that takes over fields another manager holds, as docs/upgrade.md
    /// says to change `certificate.source` away from `guard` (the guard keeps the
    /// caBundle the chart then renders); waits for the rollout.
    pub fn upgrade_forcing_conflicts(&self, tag: &str, values: &[&str]) {
        let mut values = values.to_vec();
        values.push("--force-conflicts");
        self.upgrade_waiting(tag, &values, true);
    }

    /// `helm upgrade`, waiting for the rollout or not; a value starting with `--` is a flag.
    pub fn upgrade_waiting(&self, tag: &str, values: &[&str], wait: bool) {
        let mut command = self.helm();
        command
            .args(["upgrade", "--install", self.name])
            .arg(repo().join("manifests/helm/cds-secret-guard"))
            .arg("--create-namespace")
            .args(["--set", &format!("image.tag={tag}"), "--set", "image.pullPolicy=Never"]);
        if wait {
            command.args(["--wait", "--timeout", "3m"]);
        }
        for value in values {
            if value.starts_with("--") {
                command.arg(value);
            } else {
                command.args(["--set", value]);
            }
        }
        run(&mut command);
    }

    /// The guard's pods: name, node, ready.
    pub fn pods(&self) -> Vec<(String, String, bool)> {
        guard_pods(self.namespace)
    }

    /// Every guard pod's log.
    pub fn logs(&self) -> Vec<(String, String)> {
        guard_logs(self.namespace)
    }
}

/// The guard's pods in `namespace` as the apiserver has them, but those terminating (an
/// earlier install's, whose Deployment is gone).
pub fn live_guard_pods(namespace: &str) -> Vec<Value> {
    let pods = kubectl_json(&["-n", namespace, "get", "pods", "-l", GUARD_PODS]);
    pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pod| pod["metadata"]["deletionTimestamp"].is_null())
        .cloned()
        .collect()
}

/// Waits until `namespace` has guard replicas, every one ready and `on` it (those
/// terminating left out).
pub async fn every_replica(namespace: &str, on: &str, is_on: impl Fn(&Value) -> bool) {
    eventually(&format!("every replica on {on}"), Duration::from_secs(120), || {
        let pods = live_guard_pods(namespace);
        (!pods.is_empty() && pods.iter().all(|pod| is_on(pod) && is_ready(pod))).then_some(())
    })
    .await;
}

/// Waits until no replica of `namespace`'s guard is being deleted: while they drain,
/// the replicas of the revision before still answer, with its configuration.
pub async fn drained(namespace: &str) {
    eventually(
        "the previous revision's replicas gone",
        Duration::from_secs(120),
        || {
            let pods = kubectl_json(&["-n", namespace, "get", "pods", "-l", GUARD_PODS]);
            pods["items"]
                .as_array()
                .is_some_and(|pods| pods.iter().all(|pod| pod["metadata"]["deletionTimestamp"].is_null()))
                .then_some(())
        },
    )
    .await;
}

/// A pod's Ready condition is True.
pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The guard's live pods in `namespace`: name, node, ready.
pub fn guard_pods(namespace: &str) -> Vec<(String, String, bool)> {
    live_guard_pods(namespace)
        .iter()
        .map(|pod| {
            (
                pod["metadata"]["name"].as_str().unwrap().to_owned(),
                pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned(),
                is_ready(pod),
            )
        })
        .collect()
}

/// A fresh worker secret in a namespace of its own, whose delete the guard refuses for its
/// age (through the Service); the namespace lives as long as the value.
pub async fn a_young_worker_secret_is_refused(prefix: &str) -> TestNamespace {
    let probe = TestNamespace::new(prefix).await;
    probe.worker_secret("probe").await;
    let refusal = refused_by_the_guard(&probe, "cds-worker-config-probe").await;
    assert!(
        refusal.message.contains("cannot be deleted within 10m of creation"),
        "{}",
        refusal.message
    );
    probe
}

/// Every guard pod's log (`kubectl logs`: through the apiserver and the kubelet).
pub fn guard_logs(namespace: &str) -> Vec<(String, String)> {
    guard_pods(namespace)
        .into_iter()
        .map(|(pod, _, _)| {
            let output = run(kubectl().args(["-n", namespace, "logs", &pod, "--tail=-1"]));
            (pod, stdout(&output))
        })
        .collect()
}

impl Drop for Release {
    fn drop(&mut self) {
        let output = self
            .helm()
            .args(["uninstall", self.name, "--ignore-not-found", "--wait"])
            .output()
            .unwrap();
        if !output.status.success() && !std::thread::panicking() {
            panic!("helm uninstall: {}", String::from_utf8_lossy(&output.stderr));
        }
    }
}

/// Audit lines (JSON) in a guard pod's log about `secret`.
pub fn audit_lines(log: &str, secret: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["audit"] == true && line["secret"] == secret)
        .collect()
}

/// Waits until the namespace's `default` service account exists: with a node, pods are
/// admitted only once it does (the ServiceAccount admission plugin).
pub async fn default_service_account(namespace: &str) {
    eventually("the default service account", Duration::from_secs(30), || {
        let output = kubectl()
            .args(["-n", namespace, "get", "serviceaccount", "default", "-o", "name"])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        output.status.success().then_some(())
    })
    .await;
}

/// The guard installed with kustomize as the README says: `cds-secret-guard certs` into
/// the tls-secret overlay, then `kubectl apply -k` of an overlay of it that only sets the
/// image (`images:`) and its pull policy. Deleted when dropped, webhooks first.
pub struct Kustomized {
    overlay: std::path::PathBuf,
}

impl Kustomized {
    /// As docs/install.md gives it: the certificates made with `certs`, then an overlay
    /// of one's own, `my-overlay` (here under target/shipped), applied with kubectl.
    pub fn install(tag: &str) -> Self {
        crate::pages::Shell::new(repo()).run("docs/install.md", "kustomize-certs", &[]);
        let workspace = repo().join("target/shipped");
        let overlay = workspace.join("my-overlay");
        std::fs::create_dir_all(&overlay).unwrap();
        std::fs::write(
            overlay.join("kustomization.yaml"),
            format!(
                r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../../manifests/overlays/tls-secret
images:
  - name: cds-secret-guard
    newTag: "{tag}"
patches:
  - target: {{kind: Deployment, name: cds-secret-guard}}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/imagePullPolicy
        value: Never
"#
            ),
        )
        .unwrap();
        let installed = Self { overlay };
        crate::pages::Shell::new(&workspace).run("docs/install.md", "kustomize-apply", &[]);
        installed
    }
}

impl Drop for Kustomized {
    fn drop(&mut self) {
        // The webhooks fail closed: they go first (README, Uninstall).
        let _ = kubectl()
            .args([
                "delete",
                "validatingwebhookconfiguration,mutatingwebhookconfiguration",
                "cds-secret-guard",
            ])
            .args(["--ignore-not-found"])
            .output();
        let output = kubectl()
            .arg("delete")
            .arg("-k")
            .arg(&self.overlay)
            .args(["--ignore-not-found", "--wait"])
            .output()
            .unwrap();
        if !output.status.success() && !std::thread::panicking() {
            panic!("kubectl delete -k: {}", String::from_utf8_lossy(&output.stderr));
        }
    }
}

/// Deletes `secret` until the guard refuses it, and returns the refusal. The Service's
/// data path (kube-proxy's rules) follows the pods' readiness by a moment; until then the
/// apiserver cannot call the guard and, failing closed, refuses the delete itself.
pub async fn refused_by_the_guard(ns: &TestNamespace, secret: &str) -> Box<kube::core::Status> {
    let started = Instant::now();
    loop {
        let refusal = ns
            .delete_secret(secret, &kube::api::DeleteParams::default())
            .await
            .expect_err("the delete is refused");
        if !refusal.message.contains("failed calling webhook") {
            println!(
                "the guard answered through its Service {:?} after the first try",
                started.elapsed()
            );
            return refusal;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the guard is not reachable through its Service after 30 s: {}",
            refusal.message
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The CAs the secret webhook trusts (their PEM bodies).
pub fn held_cas(name: &str) -> std::collections::BTreeSet<String> {
    let webhook = kubectl_json(&["get", "validatingwebhookconfiguration", name]);
    let encoded = webhook["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .unwrap_or_default();
    let pem = String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap())
        .unwrap();
    pem.split("-----END CERTIFICATE-----")
        .map(|block| {
            block
                .replace("-----BEGIN CERTIFICATE-----", "")
                .split_whitespace()
                .collect::<String>()
        })
        .filter(|body| !body.is_empty())
        .collect()
}
