//! End-to-end harness: the real control plane from `hack/controlplane/cluster.sh`, the
//! guard binary started with certificates from `cds-secret-guard certs` and registered
//! with the output of `cds-secret-guard webhooks`, and a namespace per test.
//!
//! Nothing here skips: when the control plane cannot start, the tests fail.

use std::{
    fs,
    io::Write,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, OnceLock, Weak},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Namespace, Pod, Secret},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::{Value, json};

/// Grace period the test guard runs with: short, so "after the grace period" is seconds.
pub const GRACE: Duration = Duration::from_secs(4);

/// The guard binary cargo built beside the test or example running
/// (`target/<profile>/deps/..`, `target/<profile>/examples/..`).
pub fn guard_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().join("cds-secret-guard")
}

pub use crate::repo;

/// `kubectl apply -f -` of `manifest` as admin, in `namespace` if given; whether it
/// succeeded.
pub fn kubectl_apply(namespace: Option<&str>, manifest: &[u8]) -> bool {
    let mut command = kubectl();
    if let Some(namespace) = namespace {
        command.args(["-n", namespace]);
    }
    let mut apply = command
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    apply.stdin.take().unwrap().write_all(manifest).unwrap();
    apply.wait().unwrap().success()
}

/// The admin kubeconfig of the local control plane, brought up once per test binary.
pub fn control_plane() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    started();
    KUBECONFIG.get_or_init(|| {
        // `cluster.sh up` starts the single-apiserver cluster, or the HA one with CDS_CP_HA=1.
        let script = repo().join("hack/controlplane/cluster.sh");
        let output = Command::new(&script).arg("up").output().expect("run cluster.sh up");
        assert!(
            output.status.success(),
            "the control plane did not come up (this test needs it; it never skips):\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let kubeconfig = repo().join("target/controlplane/kubeconfig");
        assert!(kubeconfig.exists(), "cluster.sh up wrote no kubeconfig");
        kubeconfig
    })
}

/// A kubeconfig acting as the guard's service account, bound to nothing but the shipped
/// ClusterRole of `manifests/base/rbac.yaml`: every end-to-end guard runs as it.
pub fn guard_kubeconfig() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        let _ = kubectl()
            .args(["create", "namespace", "cds-secret-guard"])
            .output()
            .unwrap();
        let applied = kubectl()
            .args(["-n", "cds-secret-guard", "apply", "-f"])
            .arg(repo().join("manifests/base/rbac.yaml"))
            .output()
            .unwrap();
        assert!(applied.status.success(), "apply rbac.yaml: {applied:?}");
        service_account_kubeconfig("cds-secret-guard", "cds-secret-guard")
    })
}

/// A kubeconfig for service account `namespace/name` (which must exist).
pub fn service_account_kubeconfig(namespace: &str, name: &str) -> PathBuf {
    let dir = repo().join("target/e2e");
    fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{namespace}.{name}.{}.kubeconfig", std::process::id()));
    let made = Command::new(repo().join("hack/controlplane/cluster.sh"))
        .args(["sa-kubeconfig", namespace, name])
        .arg(&out)
        .output()
        .unwrap();
    assert!(made.status.success(), "sa-kubeconfig: {made:?}");
    out
}

/// The apiserver's audit log since this test binary started (Metadata level: who asked
/// for what, and the answer), one JSON event per entry.
pub fn apiserver_audit() -> Vec<Value> {
    let since = started().to_string();
    let text = audit_log_files()
        .iter()
        .filter_map(|file| fs::read_to_string(file).ok())
        .collect::<String>();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        // RFC 3339 timestamps in UTC compare as strings.
        .filter(|event| event["requestReceivedTimestamp"].as_str() >= Some(since.as_str()))
        .collect()
}

/// The audit logs of every apiserver (one, or `-a` and `-b`), each with its rotated
/// backup first (200 MB a file: a benchmark fills more than one), in that order.
pub fn audit_log_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo().join("target/controlplane/logs"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name().and_then(|name| name.to_str()).is_some_and(|name| {
                name.starts_with("kube-apiserver") && name.contains(".audit") && name.ends_with(".log")
            })
        })
        .collect();
    // "….audit-<time>.log" sorts before "….audit.log": each backup before its current file.
    files.sort();
    files
}

/// When this test binary first asked for the control plane.
fn started() -> k8s_openapi::jiff::Timestamp {
    static STARTED: OnceLock<k8s_openapi::jiff::Timestamp> = OnceLock::new();
    *STARTED.get_or_init(k8s_openapi::jiff::Timestamp::now)
}

/// `kubectl` from the control plane, with its admin kubeconfig.
pub fn kubectl() -> Command {
    let mut command = Command::new(repo().join("target/controlplane/bin/kubectl"));
    command.env("KUBECONFIG", control_plane());
    command
}

/// `kubectl -n NAMESPACE delete KIND NAME`, not waiting for finalizers: `Err` with
/// kubectl's message when refused.
pub fn kubectl_delete(namespace: &str, kind: &str, name: &str) -> Result<(), String> {
    let output = kubectl()
        .args(["-n", namespace, "delete", kind, name, "--wait=false"])
        .output()
        .unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// The value of `series` (a metric's name and labels, as written) in OpenMetrics `text`.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

/// A kube client for the local control plane, as admin.
pub async fn client() -> Client {
    client_for(control_plane()).await
}

/// A kube client for the local control plane acting as `user` (admin impersonating it):
/// what that user's RBAC allows, nothing more.
pub async fn client_as(user: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(control_plane()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).unwrap()
}

/// A kube client from a kubeconfig file (in HA mode: one per apiserver).
pub async fn client_for(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running guard process, registered with the apiserver. Dropping it stops the guard
/// and removes the webhook configurations.
pub struct Guard {
    dir: PathBuf,
    admission: SocketAddr,
    probes: SocketAddr,
    process: Mutex<Option<Child>>,
    /// The kubeconfig it runs with, and extra `serve` environment.
    kubeconfig: PathBuf,
    env: Vec<(String, String)>,
}

/// The guard shared by the tests of one binary: started by the first test that asks,
/// stopped when the last one holding it is done.
pub fn shared_guard() -> Arc<Guard> {
    static SHARED: Mutex<Weak<Guard>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(guard) = shared.upgrade() {
        return guard;
    }
    let guard = Arc::new(Guard::start());
    *shared = Arc::downgrade(&guard);
    guard
}

/// How a test guard runs: as which service account, with which extra `serve`
/// environment, and whether (and with which extra `webhooks` flags) it is registered.
pub struct GuardOptions {
    pub kubeconfig: PathBuf,
    pub env: Vec<(String, String)>,
    pub register: Option<Vec<String>>,
}

impl Default for GuardOptions {
    fn default() -> Self {
        Self {
            kubeconfig: guard_kubeconfig().to_owned(),
            env: Vec::new(),
            register: Some(Vec::new()),
        }
    }
}

/// A guard with in-use protection on, registered with `webhooks --in-use-protection`,
/// running as the service account `cds-secret-guard-in-use`: bound to the shipped
/// ClusterRole and to the chart's in-use rules (`files/in-use-rules.yaml`), nothing else.
pub fn in_use_guard_options() -> GuardOptions {
    guard_kubeconfig(); // the guard's namespace and the shipped ClusterRole
    let rules = fs::read_to_string(repo().join("manifests/helm/cds-secret-guard/files/in-use-rules.yaml")).unwrap();
    let rules: Value = serde_saphyr::from_str(&rules).unwrap();
    let binding = |role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": format!("{role}-for-in-use")},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
               "subjects": [{"kind": "ServiceAccount", "name": "cds-secret-guard-in-use", "namespace": "cds-secret-guard"}]})
    };
    let roles = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "cds-secret-guard-in-use", "namespace": "cds-secret-guard"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "cds-secret-guard-in-use"}, "rules": rules},
        binding("cds-secret-guard-in-use"),
        binding("cds-secret-guard"),
    ]});
    assert!(
        kubectl_apply(None, roles.to_string().as_bytes()),
        "apply the in-use roles"
    );
    GuardOptions {
        kubeconfig: service_account_kubeconfig("cds-secret-guard", "cds-secret-guard-in-use"),
        env: vec![
            ("CDS_GUARD_IN_USE_PROTECTION".to_owned(), "true".to_owned()),
            ("CDS_GUARD_IN_USE_MODE".to_owned(), "refuse".to_owned()),
        ],
        register: Some(vec!["--in-use-protection".to_owned()]),
    }
}

impl Guard {
    /// Makes certificates, starts `serve` as the guard's service account, waits until it
    /// is ready, registers it.
    pub fn start() -> Self {
        Self::start_with(GuardOptions::default())
    }

    /// Starts a guard that is not registered with the apiserver: only its reconciler
    /// does anything, beside the registered one.
    pub fn unregistered() -> Self {
        Self::start_with(GuardOptions {
            register: None,
            ..GuardOptions::default()
        })
    }

    /// Starts a guard as `options` say.
    pub fn start_with(options: GuardOptions) -> Self {
        control_plane();
        let dir = repo()
            .join("target/e2e")
            .join(format!("guard-{}-{}", std::process::id(), free_port()));
        fs::create_dir_all(&dir).unwrap();
        let certs = dir.join("certs");
        let status = Command::new(guard_binary())
            .args(["certs", "--out"])
            .arg(&certs)
            .args(["--host", "127.0.0.1", "--host", "localhost"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "cds-secret-guard certs failed");

        let guard = Self {
            admission: SocketAddr::from(([127, 0, 0, 1], free_port())),
            probes: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir,
            process: Mutex::new(None),
            kubeconfig: options.kubeconfig,
            env: options.env,
        };
        guard.run();
        if let Some(flags) = options.register {
            guard.register(&flags);
        }
        guard
    }

    /// The guard's log (JSON lines).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("guard.log")
    }

    /// Starts (or restarts) the guard process on the same ports and certificates.
    pub fn run(&self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let certs = self.dir.join("certs");
        let child = Command::new(guard_binary())
            .arg("serve")
            .env("KUBECONFIG", &self.kubeconfig)
            .env("CDS_GUARD_LISTEN", self.admission.to_string())
            .env("CDS_GUARD_PROBE_LISTEN", self.probes.to_string())
            .env("CDS_GUARD_TLS_CERT", certs.join("tls.crt"))
            .env("CDS_GUARD_TLS_KEY", certs.join("tls.key"))
            .env("CDS_GUARD_GRACE_PERIOD", format!("{}s", GRACE.as_secs()))
            .env("RUST_LOG", "info")
            // The options come last: they may override the defaults above (the benchmarks
            // set the grace period).
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start cds-secret-guard serve");
        *self.process.lock().unwrap() = Some(child);
        self.wait_ready();
    }

    /// The guard process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.lock().unwrap().as_ref().map(Child::id)
    }

    /// Where the guard listens for admission requests (TLS).
    pub fn admission_addr(&self) -> SocketAddr {
        self.admission
    }

    /// The webhook configurations it was registered with (`webhooks.yaml`).
    pub fn webhooks_yaml(&self) -> PathBuf {
        self.dir.join("webhooks.yaml")
    }

    /// Where the guard serves its probes and `/metrics` (plain HTTP).
    pub fn probe_addr(&self) -> SocketAddr {
        self.probes
    }

    /// What the guard serves on `/metrics` (OpenMetrics text).
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.probes))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Stops the guard process as Kubernetes does (SIGTERM), and waits until it has exited.
    pub fn terminate(&self) {
        if let Some(mut child) = self.process.lock().unwrap().take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// Stops the guard process (SIGKILL: an outage, not a shutdown).
    pub fn kill(&self) {
        if let Some(mut child) = self.process.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new("curl")
                .args(["-fsS", "-o", "/dev/null"])
                .arg(format!("http://{}/readyz", self.probes))
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            if let Some(child) = self.process.lock().unwrap().as_mut() {
                assert!(
                    child.try_wait().unwrap().is_none(),
                    "the guard exited; log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the guard did not become ready; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Applies the output of `cds-secret-guard webhooks`, as a user would.
    fn register(&self, flags: &[String]) {
        let output = Command::new(guard_binary())
            .args([
                "webhooks",
                "--url",
                &format!("https://{}", self.admission),
                "--ca-bundle",
            ])
            .arg(self.dir.join("certs/ca.crt"))
            .args(flags)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "webhooks: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        fs::write(self.dir.join("webhooks.yaml"), &output.stdout).unwrap();
        assert!(
            kubectl_apply(None, &output.stdout),
            "kubectl apply of the webhooks failed"
        );
        // A guard for some namespaces only is probed in the first of them.
        let namespace = flags
            .iter()
            .position(|flag| flag == "--namespace")
            .and_then(|i| flags.get(i + 1))
            .map_or("e2e-probe", String::as_str);
        self.wait_registered(namespace);
    }

    /// The apiserver picks webhook configurations up asynchronously: wait until a dry-run
    /// delete of a worker secret reaches the guard (its audit line shows up).
    fn wait_registered(&self, namespace: &str) {
        let probe = format!("cds-worker-config-probe-{}", self.admission.port());
        let _ = kubectl()
            .args(["create", "namespace", namespace])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status();
        // A probe left by an earlier guard on the same port (a control plane kept up
        // between runs) serves as well as a new one.
        let created = kubectl()
            .args([
                "-n",
                namespace,
                "create",
                "secret",
                "generic",
                &probe,
                "--from-literal=k=v",
            ])
            .output()
            .unwrap();
        assert!(
            created.status.success() || String::from_utf8_lossy(&created.stderr).contains("already exists"),
            "cannot create the probe secret: {created:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let output = kubectl()
                .args(["-n", namespace, "delete", "secret", &probe, "--dry-run=server"])
                .output()
                .unwrap();
            if self.audit_lines().iter().any(|line| line["secret"] == probe.as_str()) {
                return;
            }
            assert!(Instant::now() < deadline, "the webhook never took effect: {output:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The guard's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The complete lines of the log that are JSON (all the guard writes): the last line,
    /// while the guard is still writing it, is left out.
    pub fn log_lines(&self) -> Vec<Value> {
        let log = self.log();
        let complete = log.rfind('\n').map_or("", |end| &log[..end]);
        complete
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Waits (briefly) for a log line with this message whose fields include `fields`.
    pub async fn log_line(&self, message: &str, fields: &[(&str, &str)]) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self
                .log_lines()
                .into_iter()
                .find(|line| line["message"] == message && fields.iter().all(|(field, value)| line[*field] == *value));
            if let Some(line) = found {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no {message:?} line with {fields:?}; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The audit lines of the log.
    pub fn audit_lines(&self) -> Vec<Value> {
        self.log()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["audit"] == true)
            .collect()
    }

    /// Waits (briefly) for the audit line of a decision on `secret` in `namespace`.
    pub async fn audit_line(&self, namespace: &str, secret: &str, decision: &str) -> Value {
        self.audit_line_where(&format!("{decision} audit line for {namespace}/{secret}"), |line| {
            line["namespace"] == namespace && line["secret"] == secret && line["decision"] == decision
        })
        .await
    }

    /// Waits (briefly) for the first audit line that `matches`; `what` names it when none
    /// comes. Waiting is needed: the guard queues the line before it answers, but its
    /// writer (non-blocking, telemetry.rs) may write it after the answer arrives.
    pub async fn audit_line_where(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(line) = self.audit_lines().into_iter().find(&matches) {
                return line;
            }
            assert!(Instant::now() < deadline, "no {what}; log:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
        let _ = unregister_webhooks();
    }
}

/// Removes the guard's webhook configurations, whoever registered them; true when done.
#[must_use]
pub fn unregister_webhooks() -> bool {
    let status = kubectl()
        .args([
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            "cds-secret-guard",
        ])
        .arg("--ignore-not-found")
        .stdout(Stdio::null())
        .status();
    status.is_ok_and(|s| s.success())
}

/// A pod (not created) with these labels and annotations, reading each of `secrets`
/// (optional references: the secrets need not exist).
pub fn pod(name: &str, labels: Value, annotations: Value, secrets: &[&str]) -> Pod {
    let env: Vec<Value> = secrets
        .iter()
        .enumerate()
        .map(|(i, secret)| {
            json!({"name": format!("S{i}"), "valueFrom": {"secretKeyRef": {"name": secret, "key": "k", "optional": true}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "env": env}]},
    }))
    .unwrap()
}

/// A pod (not created) named `name`, labelled for `worker` and nothing more: one that rule
/// 5 counts for the worker whatever its name.
pub fn labelled_pod(name: &str, worker: &str) -> Pod {
    pod(name, json!({"CDS_WORKER_NAME": worker}), json!({}), &[])
}

/// A namespace for one test, deleted (by the namespace controller) when dropped.
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    pub async fn new(prefix: &str) -> Self {
        let client = client().await;
        let name = format!("{prefix}-{}", free_port());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        Self { name, client }
    }

    pub fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates the worker secret `cds-worker-config-<worker>` as the CDS hatchery does.
    pub async fn worker_secret(&self, worker: &str) -> Secret {
        let secret = serde_json::from_value(json!({
            "metadata": {
                "name": format!("cds-worker-config-{worker}"),
                "labels": {"CDS_HATCHERY_NAME": "hatchery-e2e", "CDS_WORKER_NAME": worker},
            },
            "stringData": {"CDS_CONFIG": SECRET_VALUE},
        }))
        .unwrap();
        self.secrets().create(&PostParams::default(), &secret).await.unwrap()
    }

    /// Applies YAML (or JSON) objects as admin.
    pub fn apply(&self, manifest: &str) {
        assert!(
            kubectl_apply(Some(&self.name), manifest.as_bytes()),
            "kubectl apply failed:\n{manifest}"
        );
    }

    /// Lets `user` create, read and delete pods in the namespace, and nothing else.
    pub fn grant_pods_only(&self, user: &str) {
        self.apply(&format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pods-only}}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [create, delete, get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: pods-only-{user}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pods-only}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}
"#
        ));
    }

    /// Creates the worker pod `<worker>`, without labels, reading its secret.
    pub async fn worker_pod(&self, worker: &str) -> Pod {
        self.worker_pod_labelled(worker, json!({})).await
    }

    /// Creates the worker pod `<worker>` with `labels`, reading its secret.
    pub async fn worker_pod_labelled(&self, worker: &str, labels: Value) -> Pod {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": worker, "labels": labels},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "worker",
                    "image": "ovhcom/cds-worker:latest",
                    "env": [{"name": "CDS_CONFIG", "valueFrom": {"secretKeyRef": {"name": format!("cds-worker-config-{worker}"), "key": "CDS_CONFIG"}}}],
                }],
            },
        }))
        .unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap()
    }

    /// Waits until the secret has an ownerReference to a pod; returns the references.
    pub async fn owner_references(&self, secret: &str, within: Duration) -> Vec<OwnerReference> {
        let deadline = Instant::now() + within;
        loop {
            let found = self.secrets().get_metadata_opt(secret).await.unwrap();
            let owners = found.and_then(|s| s.metadata.owner_references).unwrap_or_default();
            if !owners.is_empty() {
                return owners;
            }
            assert!(
                Instant::now() < deadline,
                "no ownerReference on {secret} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the secret is gone.
    pub async fn gone(&self, secret: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.secrets().get_metadata_opt(secret).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "{secret} still there after {within:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes a secret and returns the apiserver's refusal, if any.
    pub async fn delete_secret(&self, name: &str, params: &DeleteParams) -> Result<(), Box<kube::core::Status>> {
        match self.secrets().delete(name, params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) => Err(status),
            Err(other) => panic!("delete {name}: {other}"),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let _ = kubectl()
            .args(["delete", "namespace", &self.name, "--wait=false", "--ignore-not-found"])
            .stdout(Stdio::null())
            .status();
    }
}

/// Keeps another worker's pod changing (until the task is aborted): the pod watch stays
/// busy, as in a cluster where workers come and go.
pub async fn churn_worker_pods(ns: &TestNamespace) -> tokio::task::JoinHandle<()> {
    ns.pods()
        .create(&Default::default(), &labelled_pod("churner", "w-other"))
        .await
        .unwrap();
    let pods = ns.pods();
    tokio::spawn(async move {
        for n in 0u64.. {
            let patch = serde_json::json!({"metadata": {"annotations": {"churn": n.to_string()}}});
            pods.patch("churner", &Default::default(), &kube::api::Patch::Merge(&patch))
                .await
                .unwrap();
            // As often as a busy cluster's workers change, well within the 50 ms a watch
            // must keep to count as busy.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// The secret value the tests store: it must never appear in the guard's log.
pub const SECRET_VALUE: &str = "top-secret-worker-token-e2e";
