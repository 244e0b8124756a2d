//! End-to-end harness: the real control plane from `tests/controlplane/cluster.sh`, the
//! guard binary started with certificates from `cds-secret-guard certs` and registered
//! with the output of `cds-secret-guard webhooks`, and a namespace per test.
//!
//! Nothing here skips: when the control plane cannot start, the tests fail.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

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

/// The guard binary: cargo names it for tests; an example finds it beside its own
/// directory (`target/<profile>/examples/..`).
fn guard_binary() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_cds-secret-guard") {
        Some(path) => PathBuf::from(path),
        None => {
            let exe = std::env::current_exe().unwrap();
            exe.parent().and_then(Path::parent).unwrap().join("cds-secret-guard")
        }
    }
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The admin kubeconfig of the local control plane, brought up once per test binary.
pub fn control_plane() -> &'static Path {
    static KUBECONFIG: OnceLock<PathBuf> = OnceLock::new();
    KUBECONFIG.get_or_init(|| {
        // `cluster.sh up` starts the single-apiserver cluster, or the HA one with CDS_CP_HA=1.
        let script = repo().join("tests/controlplane/cluster.sh");
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

/// `kubectl` from the control plane, with its admin kubeconfig.
pub fn kubectl() -> Command {
    let mut command = Command::new(repo().join("target/controlplane/bin/kubectl"));
    command.env("KUBECONFIG", control_plane());
    command
}

/// A kube client for the local control plane, as admin.
pub async fn client() -> Client {
    client_for(control_plane()).await
}

/// A kube client from a kubeconfig file (in HA mode: one per apiserver).
pub async fn client_for(kubeconfig: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running guard process, registered with the apiserver. Dropping it stops the guard
/// and removes the webhook configurations.
pub struct Guard {
    dir: PathBuf,
    admission: SocketAddr,
    probes: SocketAddr,
    process: Mutex<Option<Child>>,
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

impl Guard {
    /// Makes certificates, starts `serve`, waits until it is ready, registers it.
    pub fn start() -> Self {
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
        };
        guard.run();
        guard.register();
        guard
    }

    /// Starts a guard that is not registered with the apiserver: only its reconciler
    /// does anything, beside the registered one.
    pub fn unregistered() -> Self {
        control_plane();
        let port = free_port();
        let dir = repo()
            .join("target/e2e")
            .join(format!("extra-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let certs = dir.join("certs");
        let status = Command::new(guard_binary())
            .args(["certs", "--out"])
            .arg(&certs)
            .args(["--host", "127.0.0.1"])
            .stdout(Stdio::null())
            .status();
        assert!(status.unwrap().success());
        let guard = Self {
            admission: SocketAddr::from(([127, 0, 0, 1], port)),
            probes: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir,
            process: Mutex::new(None),
        };
        guard.run();
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
            .env("KUBECONFIG", control_plane())
            .env("CDS_GUARD_LISTEN", self.admission.to_string())
            .env("CDS_GUARD_PROBE_LISTEN", self.probes.to_string())
            .env("CDS_GUARD_TLS_CERT", certs.join("tls.crt"))
            .env("CDS_GUARD_TLS_KEY", certs.join("tls.key"))
            .env("CDS_GUARD_GRACE_PERIOD", format!("{}s", GRACE.as_secs()))
            .env("RUST_LOG", "info")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start cds-secret-guard serve");
        *self.process.lock().unwrap() = Some(child);
        self.wait_ready();
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
    fn register(&self) {
        let output = Command::new(guard_binary())
            .args([
                "webhooks",
                "--url",
                &format!("https://{}", self.admission),
                "--ca-bundle",
            ])
            .arg(self.dir.join("certs/ca.crt"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "webhooks: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        fs::write(self.dir.join("webhooks.yaml"), &output.stdout).unwrap();
        let mut apply = kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        apply.stdin.take().unwrap().write_all(&output.stdout).unwrap();
        assert!(apply.wait().unwrap().success(), "kubectl apply of the webhooks failed");
        self.wait_registered();
    }

    /// The apiserver picks webhook configurations up asynchronously: wait until a dry-run
    /// delete of a worker secret reaches the guard (its audit line shows up).
    fn wait_registered(&self) {
        let probe = format!("cds-worker-config-probe-{}", self.admission.port());
        let _ = kubectl()
            .args(["create", "namespace", "e2e-probe"])
            .stderr(Stdio::null())
            .stdout(Stdio::null())
            .status();
        let created = kubectl()
            .args([
                "-n",
                "e2e-probe",
                "create",
                "secret",
                "generic",
                &probe,
                "--from-literal=k=v",
            ])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(created.success(), "cannot create the probe secret");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let output = kubectl()
                .args(["-n", "e2e-probe", "delete", "secret", &probe, "--dry-run=server"])
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

    /// The audit lines of the log.
    pub fn audit_lines(&self) -> Vec<Value> {
        self.log()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|line| line["audit"] == true)
            .collect()
    }

    /// Waits (briefly: the guard writes it before answering) for the audit line of a
    /// decision on `secret` in `namespace`.
    pub async fn audit_line(&self, namespace: &str, secret: &str, decision: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let found = self.audit_lines().into_iter().find(|line| {
                line["namespace"] == namespace && line["secret"] == secret && line["decision"] == decision
            });
            if let Some(line) = found {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no {decision} audit line for {namespace}/{secret}; log:\n{}",
                self.log()
            );
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

/// The secret value the tests store: it must never appear in the guard's log.
pub const SECRET_VALUE: &str = "top-secret-worker-token-e2e";
