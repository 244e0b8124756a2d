//! Shared helpers for the integration tests: AdmissionReview fixtures from `tests/data`,
//! an in-memory cluster behind the lookup trait, and requests through the router.

use std::{collections::BTreeMap, net::SocketAddr, path::Path, sync::Mutex, time::Duration};

use async_trait::async_trait;
use axum::{
    Router,
    body::{Body, to_bytes},
    http::{Request, StatusCode},
};
use cds_secret_guard::{
    Config, Error, Result,
    config::Limits,
    rules::worker::pod::PodState,
    rules::worker::reads::ClusterLookup,
    rules::{self, worker},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tower::ServiceExt;

/// An AdmissionReview fixture from `tests/data/<name>.json`.
pub fn review(name: &str) -> Value {
    let path = crate::repo().join("tests/data").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Sets the value at a JSON pointer (creating objects on the way).
pub fn set(mut doc: Value, pointer: &str, value: Value) -> Value {
    let mut target = &mut doc;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        if !target.is_object() {
            *target = Value::Object(Default::default());
        }
        target = target.as_object_mut().unwrap().entry(token).or_insert(Value::Null);
    }
    *target = value;
    doc
}

/// Removes the value at a JSON pointer.
pub fn remove(mut doc: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    if let Some(Value::Object(map)) = doc.pointer_mut(parent) {
        map.remove(key);
    }
    doc
}

/// An RFC 3339 time `ago` before now, to the millisecond: truncated to the second, the
/// age a test reads would be a second more whenever the truncation and the test's own
/// time add up to one.
pub fn time_ago(ago: Duration) -> Value {
    let at = k8s_openapi::jiff::Timestamp::now() - ago;
    Value::String(at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

/// A delete of a worker secret 5 s old: kept (too young), without any cluster read.
pub fn young_delete() -> Value {
    set(
        review("secret-delete"),
        "/request/oldObject/metadata/creationTimestamp",
        time_ago(Duration::from_secs(5)),
    )
}

/// The rules' settings: what the rule sets share, and the worker rules' own.
#[derive(Debug, Clone)]
pub struct Policy {
    pub rules: rules::Settings,
    pub worker: worker::Settings,
}

impl Policy {
    /// This policy, changed by `change`.
    pub fn with(mut self, change: impl FnOnce(&mut Self)) -> Self {
        change(&mut self);
        self
    }
}

/// The policy `serve` uses by default, as its flags make it.
pub fn policy() -> Policy {
    use clap::Parser;
    let cli = cds_secret_guard::cli::Cli::parse_from(["cds-secret-guard", "serve"]);
    let cds_secret_guard::cli::Command::Serve(args) = cli.command else {
        unreachable!("parsed serve")
    };
    let config = args.into_config();
    Policy {
        rules: config.rules,
        worker: config.worker,
    }
}

/// A server configuration on ephemeral loopback ports with the given certificate files.
pub fn config(policy: Policy, tls_dir: &Path) -> Config {
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Config {
        listen: any_port,
        probe_listen: any_port,
        tls_cert: tls_dir.join("tls.crt"),
        tls_key: tls_dir.join("tls.key"),
        tls_reload_interval: Duration::from_millis(100),
        renewal: None,
        request_timeout: Duration::from_secs(4),
        mutation_timeout: Duration::from_secs(1),
        audit_window: Duration::from_secs(60),
        shutdown_timeout: Duration::from_secs(10),
        limits: Limits {
            drain_delay: Duration::from_millis(200),
            ..Limits::default()
        },
        rules: policy.rules,
        worker: policy.worker,
        lease: None,
        in_use_protection: false,
        // Today's handler tests refuse; the deferred deletes' own say `defer`.
        in_use_mode: cds_secret_guard::rules::in_use::Mode::Refuse,
    }
}

/// A pod in the fake cluster.
pub type FakePod = PodState;

/// An in-memory cluster: pods, secret metadata and terminating namespaces, optionally
/// failing or slow.
#[derive(Default)]
pub struct FakeCluster {
    pub pods: Mutex<Vec<FakePod>>,
    pub secrets: Mutex<Vec<ObjectMeta>>,
    pub terminating_namespaces: Mutex<Vec<String>>,
    /// What a watch shows, which may differ from `pods` (a stale cache).
    pub cached: Vec<FakePod>,
    pub failing: bool,
    /// Only the label-selected lists fail.
    pub failing_lists: bool,
    pub delay: Option<Duration>,
    pub reads: Mutex<usize>,
}

/// A pod named `name` with `uid`, in `phase`, labelled `CDS_WORKER_NAME=worker`.
pub fn pod(name: &str, uid: &str, phase: &str, worker: &str) -> FakePod {
    PodState {
        name: name.into(),
        labels: BTreeMap::from([("CDS_WORKER_NAME".into(), worker.into())]),
        uid: uid.into(),
        phase: Some(phase.into()),
        terminating: false,
    }
}

impl FakeCluster {
    pub fn with_pods(pods: impl IntoIterator<Item = FakePod>) -> Self {
        Self {
            pods: Mutex::new(pods.into_iter().collect()),
            ..Self::default()
        }
    }

    pub fn failing() -> Self {
        Self {
            failing: true,
            ..Self::default()
        }
    }

    pub fn slow(delay: Duration) -> Self {
        Self {
            delay: Some(delay),
            ..Self::default()
        }
    }

    pub fn reads(&self) -> usize {
        *self.reads.lock().unwrap()
    }

    async fn read(&self) -> Result<()> {
        *self.reads.lock().unwrap() += 1;
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        if self.failing {
            Err(Error::KubeConfig("fake apiserver is down".into()))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl ClusterLookup for FakeCluster {
    async fn pod(&self, _: &str, name: &str) -> Result<Option<PodState>> {
        self.read().await?;
        Ok(self.pods.lock().unwrap().iter().find(|p| p.name == name).cloned())
    }

    async fn pods_labelled(&self, _: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        self.read().await?;
        if self.failing_lists {
            return Err(Error::KubeConfig("fake apiserver cannot list".into()));
        }
        let pods = self.pods.lock().unwrap();
        Ok(pods
            .iter()
            .filter(|p| p.labels.get(label).is_some_and(|v| v == value))
            .cloned()
            .collect())
    }

    async fn secret_metadata(&self, _: &str, name: &str) -> Result<Option<ObjectMeta>> {
        self.read().await?;
        Ok(self
            .secrets
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name.as_deref() == Some(name))
            .cloned())
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        self.read().await?;
        Ok(self
            .terminating_namespaces
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == namespace))
    }

    fn cached_pod(&self, _: &str, name: &str) -> Option<PodState> {
        self.cached.iter().find(|p| p.name == name).cloned()
    }
}

/// POSTs a body to a router and returns the status and the JSON answer.
pub async fn post(router: &Router, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, json)
}

/// GETs a path of a router as text.
pub async fn get_text(router: &Router, path: &str) -> (StatusCode, String) {
    let response = router
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The value of a counter line of `/metrics` whose labels include all of `labels`.
pub fn counter(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(name))
        .filter(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `future` with the JSON log lines it writes (on this thread) captured; returns its
/// output and the lines.
pub async fn capture_logs<T>(future: impl Future<Output = T>) -> (T, String) {
    use std::sync::Arc;
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_writer(move || writer.clone())
        .finish();
    let output = {
        let _default = tracing::subscriber::set_default(subscriber);
        future.await
    };
    let lines = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    (output, lines)
}
