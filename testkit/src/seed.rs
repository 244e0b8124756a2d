//! The seed's failure on running pods. A hatchery spawns workers as CDS does: the secret
//! `cds-worker-config-<w>` (labels `CDS_HATCHERY_NAME`, `CDS_WORKER_NAME`), then the pod
//! `<w>` with the same labels, reading `CDS_CONFIG` through `env.valueFrom.secretKeyRef`
//! (not optional). Beside it, CDS's cleanup (`deleteSecrets`) runs on a stale pod list:
//! it lists the hatchery's pods, then, a moment later, the secrets, and deletes every
//! worker secret whose worker was in no listed pod. A worker whose secret goes before
//! the kubelet has read it never starts: `CreateContainerConfigError`.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

use crate::cluster::{SECRET_VALUE, TestNamespace};

const HATCHERY: &str = "hatchery-seed";
/// The worker image: Debian's static busybox, imported onto the node by `cluster.sh`.
pub const WORKER_IMAGE: &str = "local/busybox:1.35.0";

/// How a run is shaped.
pub struct Spawns {
    pub workers: usize,
    /// Time between two spawns.
    pub every: Duration,
    /// How much older the cleanup's pod list is than its secret list.
    pub list_lag: Duration,
}

/// What happened to the workers of one run.
#[derive(Debug, Default)]
pub struct Outcome {
    pub workers: usize,
    /// Workers whose pod ran to `Succeeded`.
    pub completed: BTreeSet<String>,
    /// Workers whose pod waits in `CreateContainerConfigError`.
    pub config_errors: BTreeSet<String>,
    /// The kubelet's events naming a worker's missing secret, by worker.
    pub missing_secret_events: BTreeMap<String, String>,
    /// The cleanup's deletes: done, refused by the guard, and failed because the
    /// apiserver could not call the guard (`failurePolicy: Fail`: refused too).
    pub deleted: usize,
    pub refused: usize,
    pub failed: usize,
}

pub fn secret_name(worker: &str) -> String {
    format!("cds-worker-config-{worker}")
}

async fn spawn(secrets: &Api<Secret>, pods: &Api<Pod>, worker: &str) {
    create_secret(secrets, worker).await;
    create_pod(pods, worker).await;
}

/// The hatchery's first step: the worker's secret, with the worker's labels.
pub async fn create_secret(secrets: &Api<Secret>, worker: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret_name(worker), "labels": labels(worker)},
        "stringData": {"CDS_CONFIG": SECRET_VALUE},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
}

/// The hatchery's second step: the worker's pod, which reads its secret and fails
/// without it.
pub async fn create_pod(pods: &Api<Pod>, worker: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": worker, "labels": labels(worker)},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "worker",
                "image": WORKER_IMAGE,
                "imagePullPolicy": "Never",
                // The worker needs its config: without it, it fails.
                "command": ["sh", "-c", "test -n \"$CDS_CONFIG\" && sleep 2"],
                "env": [{"name": "CDS_CONFIG", "valueFrom": {"secretKeyRef": {"name": secret_name(worker), "key": "CDS_CONFIG"}}}],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

fn labels(worker: &str) -> serde_json::Value {
    json!({"CDS_HATCHERY_NAME": HATCHERY, "CDS_WORKER_NAME": worker})
}

/// The cleanup's deletes so far, by how they ended.
#[derive(Default)]
struct DeleteCounts {
    deleted: AtomicUsize,
    refused: AtomicUsize,
    failed: AtomicUsize,
}

/// One round of CDS's `deleteSecrets` on a pod list `lag` older than its secret list.
async fn cleanup_round(pods: &Api<Pod>, secrets: &Api<Secret>, lag: Duration, counts: &DeleteCounts) {
    let hatchery = ListParams::default().labels(&format!("CDS_HATCHERY_NAME={HATCHERY}"));
    let listed: BTreeSet<String> = pods
        .list_metadata(&hatchery)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.labels?.get("CDS_WORKER_NAME").cloned())
        .collect();
    tokio::time::sleep(lag).await;
    let listed_secrets = secrets
        .list_metadata(&ListParams::default().labels("CDS_HATCHERY_NAME"))
        .await
        .unwrap();
    for secret in listed_secrets.items {
        let worker = secret.metadata.labels.as_ref().and_then(|l| l.get("CDS_WORKER_NAME"));
        if worker.is_some_and(|w| !listed.contains(w)) {
            let name = secret.metadata.name.unwrap();
            match secrets.delete(&name, &DeleteParams::default()).await {
                Ok(_) => counts.deleted.fetch_add(1, Ordering::Relaxed),
                Err(kube::Error::Api(status)) if status.code == 403 => counts.refused.fetch_add(1, Ordering::Relaxed),
                Err(kube::Error::Api(status)) if status.code >= 500 => counts.failed.fetch_add(1, Ordering::Relaxed),
                Err(kube::Error::Api(status)) if status.code == 404 => 0,
                Err(other) => panic!("cleanup: delete {name}: {other}"),
            };
        }
    }
}

/// A run in progress: the hatchery spawning, the stale cleanup, and (when asked) the
/// hatchery's reaper, which deletes each worker's pod once it has completed, as CDS's
/// `killAwolWorkers` does: the garbage collector then deletes the secret, through the
/// guard when it is installed.
pub struct Load {
    workers: Vec<String>,
    spawner: tokio::task::JoinHandle<()>,
    cleanup: tokio::task::JoinHandle<()>,
    reaper: Option<tokio::task::JoinHandle<()>>,
    spawning: Arc<AtomicBool>,
    reaping: Arc<AtomicBool>,
    counts: Arc<DeleteCounts>,
    reaped: Arc<std::sync::Mutex<BTreeSet<String>>>,
}

/// Starts spawning `spawns.workers` workers, with the stale cleanup beside them.
pub fn start(ns: &TestNamespace, spawns: &Spawns, reap: bool) -> Load {
    let workers: Vec<String> = (0..spawns.workers).map(|i| format!("w{i}")).collect();
    let spawning = Arc::new(AtomicBool::new(true));
    let reaping = Arc::new(AtomicBool::new(true));
    let counts = Arc::new(DeleteCounts::default());
    let reaped = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let spawner = {
        let (secrets, pods, workers, every, spawning) =
            (ns.secrets(), ns.pods(), workers.clone(), spawns.every, spawning.clone());
        tokio::spawn(async move {
            for worker in &workers {
                spawn(&secrets, &pods, worker).await;
                tokio::time::sleep(every).await;
            }
            spawning.store(false, Ordering::Relaxed);
        })
    };
    let cleanup = {
        let (pods, secrets) = (ns.pods(), ns.secrets());
        let (spawning, counts) = (spawning.clone(), counts.clone());
        let lag = spawns.list_lag;
        tokio::spawn(async move {
            while spawning.load(Ordering::Relaxed) {
                cleanup_round(&pods, &secrets, lag, &counts).await;
            }
        })
    };
    let reaper = reap.then(|| {
        let (pods, reaping, reaped) = (ns.pods(), reaping.clone(), reaped.clone());
        tokio::spawn(async move {
            while reaping.load(Ordering::Relaxed) {
                for pod in pods.list(&ListParams::default()).await.unwrap().items {
                    if pod.status.and_then(|s| s.phase).as_deref() == Some("Succeeded") {
                        let name = pod.metadata.name.unwrap();
                        let _ = pods.delete(&name, &DeleteParams::default()).await;
                        reaped.lock().unwrap().insert(name);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    Load {
        workers,
        spawner,
        cleanup,
        reaper,
        spawning,
        reaping,
        counts,
        reaped,
    }
}

impl Load {
    /// Waits for the last spawn, stops the cleanup, then waits until every worker has
    /// either run to completion or is stuck without its config, and says which.
    pub async fn finish(self, ns: &TestNamespace) -> Outcome {
        self.spawner.await.unwrap();
        self.spawning.store(false, Ordering::Relaxed);
        self.cleanup.await.unwrap();
        let mut outcome = Outcome {
            workers: self.workers.len(),
            deleted: self.counts.deleted.load(Ordering::Relaxed),
            refused: self.counts.refused.load(Ordering::Relaxed),
            failed: self.counts.failed.load(Ordering::Relaxed),
            ..Outcome::default()
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let pods = ns.pods().list(&ListParams::default()).await.unwrap();
            outcome.completed = self.reaped.lock().unwrap().clone();
            outcome.config_errors.clear();
            for pod in &pods.items {
                let name = pod.metadata.name.clone().unwrap();
                let status = pod.status.as_ref();
                if status.and_then(|s| s.phase.as_deref()) == Some("Succeeded") {
                    outcome.completed.insert(name);
                } else if status
                    .and_then(|s| s.container_statuses.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.waiting.as_ref())
                            .and_then(|w| w.reason.as_deref())
                            == Some("CreateContainerConfigError")
                    })
                {
                    outcome.config_errors.insert(name);
                }
            }
            if outcome.completed.len() + outcome.config_errors.len() == self.workers.len() {
                break;
            }
            if Instant::now() >= deadline {
                let others: Vec<String> = pods
                    .items
                    .iter()
                    .filter(|pod| {
                        let name = pod.metadata.name.as_ref().unwrap();
                        !outcome.completed.contains(name) && !outcome.config_errors.contains(name)
                    })
                    .map(|pod| {
                        let status = pod.status.clone().unwrap_or_default();
                        format!(
                            "{}: {:?} {:?} {:?}",
                            pod.metadata.name.as_ref().unwrap(),
                            status.phase,
                            status.conditions,
                            status
                                .container_statuses
                                .map(|c| c.into_iter().map(|c| c.state).collect::<Vec<_>>())
                        )
                    })
                    .collect();
                panic!(
                    "workers neither completed nor stuck after 180 s: {} completed, {} without config, of {}; the others:\n{}\nnodes:\n{}",
                    outcome.completed.len(),
                    outcome.config_errors.len(),
                    self.workers.len(),
                    others.join("\n"),
                    crate::install::nodes_state()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.reaping.store(false, Ordering::Relaxed);
        if let Some(reaper) = self.reaper {
            reaper.await.unwrap();
        }

        // The kubelet says why: `Error: secret "cds-worker-config-<w>" not found`.
        let events: Api<Event> = Api::namespaced(ns.client.clone(), &ns.name);
        for event in events.list(&ListParams::default()).await.unwrap().items {
            let message = event.message.unwrap_or_default();
            let worker = event.involved_object.name.unwrap_or_default();
            if event.reason.as_deref() == Some("Failed")
                && message.contains(&format!("secret \"{}\" not found", secret_name(&worker)))
            {
                outcome.missing_secret_events.insert(worker, message);
            }
        }
        outcome
    }
}

/// Spawns the workers while the stale cleanup runs, and waits for the outcome.
pub async fn run(ns: &TestNamespace, spawns: &Spawns) -> Outcome {
    start(ns, spawns, false).finish(ns).await
}

/// Deletes the workers' pods, as the hatchery does once they are done.
pub async fn delete_pods(ns: &TestNamespace) {
    ns.pods()
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("CDS_HATCHERY_NAME={HATCHERY}")),
        )
        .await
        .unwrap();
}
