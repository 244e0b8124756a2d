//! The hatchery race, replayed against a real control plane.
//!
//! - The **hatchery** spawns workers through apiserver A exactly like CDS: secret
//!   `cds-worker-config-<worker>` (labels `CDS_HATCHERY_NAME`, `CDS_WORKER_NAME`), then
//!   pod `<worker>` (or pod first). A worker "runs" for a while, then its pod is marked
//!   `Succeeded`. A share of the workers belongs to a second hatchery in the namespace.
//! - The **cleanup** replays CDS's `deleteSecrets` through apiserver B: list the pods of
//!   its own hatchery from B's watch cache (`resourceVersion=0`), wait `list_lag`, list
//!   every secret carrying a hatchery label (quorum), delete each secret whose worker is
//!   in no listed pod. After upstream's fix, it skips secrets younger than `client_grace`.
//! - The **killer** replays `killAwolWorkers`: deletes finished pods, then their secrets.
//! - The **watcher** records every secret deletion and, at that moment, reads the
//!   worker's pod by quorum read: a live pod whose secret is gone is a **lost** secret.
//!   Each worker also checks its secret at the end of its life.
//!
//! After the last spawn, the run waits for the killer, the cleanup and the garbage
//! collector to settle; the secrets left are **orphans**.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Pod, Secret},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const HATCHERY: &str = "race-h1";
pub const OTHER_HATCHERY: &str = "race-h2";

/// Which version of CDS's cleanup runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// No age check.
    BeforeFix,
    /// Skips secrets younger than `client_grace` (upstream's fix).
    AfterFix,
}

/// Knobs of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub spawns: usize,
    /// Stop spawning after this long, even before `spawns` (the report counts what ran).
    pub duration: Option<Duration>,
    pub concurrency: usize,
    pub seed: u64,
    /// Life of a worker of the cleanup's own hatchery, in milliseconds.
    pub life_ms: (u64, u64),
    /// Life of a worker of the other hatchery, in milliseconds.
    pub other_life_ms: (u64, u64),
    /// Share of workers spawned by the other hatchery.
    pub other_share: f64,
    pub cleanup: Cleanup,
    pub cleanup_interval: Duration,
    /// Delay between the cleanup's pod list and its secret list.
    pub list_lag: Duration,
    /// The after-fix cleanup's age check (10 minutes upstream; scaled down here).
    pub client_grace: Duration,
    pub pod_first: bool,
    pub registry_secret: bool,
    /// How long to wait for everything to settle after the last spawn.
    pub settle: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            spawns: 200,
            duration: None,
            concurrency: 8,
            seed: 1,
            life_ms: (300, 1500),
            other_life_ms: (2500, 5000),
            other_share: 0.25,
            cleanup: Cleanup::BeforeFix,
            cleanup_interval: Duration::from_millis(100),
            list_lag: Duration::from_millis(300),
            client_grace: Duration::from_secs(2),
            pod_first: false,
            registry_secret: false,
            settle: Duration::from_secs(30),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub spawns: usize,
    pub spawns_per_second: f64,
    /// Workers whose secret was deleted while their pod was live.
    pub lost: BTreeSet<String>,
    /// Worker secrets left once everything settled.
    pub orphans: usize,
    /// Refused deletes (cleanup and killer) by the guard's reason.
    pub denied: BTreeMap<String, usize>,
    /// Other failed deletes by status code.
    pub errors: BTreeMap<u16, usize>,
}

#[derive(Default)]
struct Shared {
    lost: Mutex<BTreeSet<String>>,
    denied: Mutex<BTreeMap<String, usize>>,
    errors: Mutex<BTreeMap<u16, usize>>,
}

impl Shared {
    /// Deletes a secret, counting a refusal by reason.
    async fn delete_secret(&self, secrets: &Api<Secret>, name: &str) {
        match secrets.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                *self
                    .denied
                    .lock()
                    .unwrap()
                    .entry(reason_of(&status.message).to_owned())
                    .or_default() += 1;
            }
            Err(kube::Error::Api(status)) => *self.errors.lock().unwrap().entry(status.code).or_default() += 1,
            Err(_) => *self.errors.lock().unwrap().entry(0).or_default() += 1,
        }
    }
}

/// The guard's reason, from the message a client sees.
fn reason_of(message: &str) -> &'static str {
    if message.contains("cannot be deleted within") {
        "too-young"
    } else if message.contains("still uses secret") {
        "pod-live"
    } else if message.contains("refusing to delete") {
        "lookup-failed"
    } else {
        "other"
    }
}

fn is_live(pod: &Pod) -> bool {
    cds_secret_guard::rules::worker::pod::PodState::from(pod).is_live()
}

fn secret_names(worker: &str, registry: bool) -> Vec<String> {
    let mut names = vec![format!("cds-worker-config-{worker}")];
    if registry {
        names.push(format!("cds-worker-registry-{worker}"));
    }
    names
}

/// Runs the race in `namespace`: the hatchery and the killer through `a`, the cleanup
/// through `b`.
pub async fn run(a: Client, b: Client, namespace: &str, settings: &Settings) -> Report {
    let shared = Arc::new(Shared::default());
    let stop = CancellationToken::new();
    let watch = tokio::spawn(watch_deletions(
        a.clone(),
        namespace.to_owned(),
        shared.clone(),
        stop.clone(),
    ));
    let cleanup = tokio::spawn(cleanup(
        b,
        namespace.to_owned(),
        settings.clone(),
        shared.clone(),
        stop.clone(),
    ));
    let killer = tokio::spawn(killer(
        a.clone(),
        namespace.to_owned(),
        settings.registry_secret,
        shared.clone(),
        stop.clone(),
    ));

    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let workers: Vec<(String, &str, Duration)> = (0..settings.spawns)
        .map(|i| {
            let other = rng.random_bool(settings.other_share);
            let (hatchery, (low, high)) = if other {
                (OTHER_HATCHERY, settings.other_life_ms)
            } else {
                (HATCHERY, settings.life_ms)
            };
            (
                format!("w-{}-{i}", settings.seed),
                hatchery,
                Duration::from_millis(rng.random_range(low..=high)),
            )
        })
        .collect();
    let time_up = async {
        match settings.duration {
            Some(duration) => tokio::time::sleep(duration).await,
            None => std::future::pending().await,
        }
    };
    let spawned = std::sync::atomic::AtomicUsize::new(0);
    futures::stream::iter(workers)
        .take_until(time_up)
        .for_each_concurrent(settings.concurrency, |(worker, hatchery, life)| {
            let (a, shared, spawned) = (a.clone(), shared.clone(), &spawned);
            async move {
                spawned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                spawn_worker(a, namespace, &worker, hatchery, life, settings, &shared).await
            }
        })
        .await;
    let spawning = started.elapsed();
    let spawns = spawned.into_inner();

    // Settle: the killer removes the finished pods; then the cleanup and the garbage
    // collector get `settle` to deal with the secrets left.
    let secrets: Api<PartialObjectMeta<Secret>> = Api::namespaced(a.clone(), namespace);
    let pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(a.clone(), namespace);
    let labelled = ListParams::default().labels("CDS_HATCHERY_NAME");
    let pods_deadline = Instant::now() + Duration::from_secs(600);
    while pods.list(&labelled).await.map_or(true, |l| !l.items.is_empty()) && Instant::now() < pods_deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let deadline = Instant::now() + settings.settle;
    let orphans = loop {
        let left = secrets.list(&labelled).await.map_or(usize::MAX, |l| l.items.len());
        if left == 0 || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    stop.cancel();
    let _ = tokio::join!(watch, cleanup, killer);

    let lost = shared.lost.lock().unwrap().clone();
    let denied = shared.denied.lock().unwrap().clone();
    let errors = shared.errors.lock().unwrap().clone();
    Report {
        spawns,
        spawns_per_second: spawns as f64 / spawning.as_secs_f64(),
        lost,
        orphans,
        denied,
        errors,
    }
}

/// One worker's life: secret then pod (or pod first), run, check the secret, finish.
async fn spawn_worker(
    a: Client,
    namespace: &str,
    worker: &str,
    hatchery: &str,
    life: Duration,
    settings: &Settings,
    shared: &Shared,
) {
    let secrets: Api<Secret> = Api::namespaced(a.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(a, namespace);
    let labels = json!({"CDS_HATCHERY_NAME": hatchery, "CDS_WORKER_NAME": worker});
    let names = secret_names(worker, settings.registry_secret);
    let (post, patch) = (PostParams::default(), PatchParams::default());
    let create_secrets = async {
        for name in &names {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": labels},
                "stringData": {"CDS_CONFIG": "token"},
            }))
            .unwrap();
            retry("create secret", true, || secrets.create(&post, &secret)).await;
        }
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": worker, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "worker", "image": "ovhcom/cds-worker",
            "envFrom": [{"secretRef": {"name": names[0]}}],
        }]},
    }))
    .unwrap();
    let create_pod = || retry("create pod", true, || pods.create(&post, &pod));
    if settings.pod_first {
        create_pod().await;
        create_secrets.await;
    } else {
        create_secrets.await;
        create_pod().await;
    }

    tokio::time::sleep(life).await;

    // Still running: its secret must still be there (quorum read).
    for name in &names {
        let present = retry("read secret", false, || secrets.get_metadata_opt(name)).await;
        if present.flatten().is_none() {
            shared.lost.lock().unwrap().insert(worker.to_owned());
        }
    }
    let finished = Patch::Merge(json!({"status": {"phase": "Succeeded"}}));
    retry("finish pod", false, || pods.patch_status(worker, &patch, &finished)).await;
}

/// Calls the apiserver until it answers, through the transient errors of an etcd member
/// or an apiserver restarting, as the hatchery's client would retry. With `create`, an
/// AlreadyExists after a failed attempt means that attempt went through: `None`.
async fn retry<T, F, Fut>(what: &str, create: bool, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    const ATTEMPTS: usize = 120;
    for attempt in 1..=ATTEMPTS {
        match call().await {
            Ok(value) => return Some(value),
            Err(kube::Error::Api(status)) if create && status.code == 409 && attempt > 1 => return None,
            Err(error) if attempt < ATTEMPTS => {
                eprintln!("race: {what}: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("{what}: still failing after {ATTEMPTS} attempts: {error}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// CDS's `deleteSecrets`, through apiserver B.
async fn cleanup(b: Client, namespace: String, settings: Settings, shared: Arc<Shared>, stop: CancellationToken) {
    let pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(b.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(b.clone(), &namespace);
    let secret_meta: Api<PartialObjectMeta<Secret>> = Api::namespaced(b, &namespace);
    while !stop.is_cancelled() {
        // The pod list as CDS gets it through an informer-backed client: B's watch cache.
        let own = ListParams::default()
            .labels(&format!("CDS_HATCHERY_NAME={HATCHERY}"))
            .match_any();
        let Ok(listed) = pods.list(&own).await else {
            tokio::time::sleep(settings.cleanup_interval).await;
            continue;
        };
        let workers: BTreeSet<String> = listed
            .items
            .iter()
            .filter_map(|p| p.metadata.labels.as_ref()?.get("CDS_WORKER_NAME").cloned())
            .collect();
        tokio::time::sleep(settings.list_lag).await;
        // Every secret with a hatchery label, whichever hatchery.
        let Ok(all) = secret_meta
            .list(&ListParams::default().labels("CDS_HATCHERY_NAME"))
            .await
        else {
            continue;
        };
        let now = Timestamp::now();
        for secret in all.items {
            let meta = secret.metadata;
            let Some(worker) = meta.labels.as_ref().and_then(|l| l.get("CDS_WORKER_NAME")) else {
                continue;
            };
            if workers.contains(worker) || meta.deletion_timestamp.is_some() {
                continue;
            }
            if settings.cleanup == Cleanup::AfterFix {
                let age = meta
                    .creation_timestamp
                    .as_ref()
                    .map(|t| now.duration_since(t.0).as_secs_f64())
                    .unwrap_or(0.0);
                if age < settings.client_grace.as_secs_f64() {
                    continue;
                }
            }
            shared
                .delete_secret(&secrets, meta.name.as_deref().unwrap_or_default())
                .await;
        }
        tokio::time::sleep(settings.cleanup_interval).await;
    }
}

/// CDS's `killAwolWorkers`: delete finished pods, then their secrets.
async fn killer(a: Client, namespace: String, registry: bool, shared: Arc<Shared>, stop: CancellationToken) {
    let pods: Api<Pod> = Api::namespaced(a.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(a, &namespace);
    while !stop.is_cancelled() {
        if let Ok(listed) = pods.list(&ListParams::default().labels("CDS_HATCHERY_NAME")).await {
            // A pod left terminating by a delete that failed half-way (an etcd member dying
            // under it) is deleted again: with no kubelet, nothing else would.
            let finished = listed.items.into_iter().filter(|p| !is_live(p));
            futures::stream::iter(finished)
                .for_each_concurrent(16, |pod| {
                    let (pods, secrets, shared) = (&pods, &secrets, &shared);
                    async move {
                        let Some(worker) = pod.metadata.name.as_deref() else {
                            return;
                        };
                        if pods.delete(worker, &DeleteParams::default()).await.is_err() {
                            return;
                        }
                        for name in secret_names(worker, registry) {
                            shared.delete_secret(secrets, &name).await;
                        }
                    }
                })
                .await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Records each secret deletion and whether the worker's pod was live at that moment.
async fn watch_deletions(a: Client, namespace: String, shared: Arc<Shared>, stop: CancellationToken) {
    let secrets: Api<PartialObjectMeta<Secret>> = Api::namespaced(a.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(a, &namespace);
    let config = watcher::Config::default().labels("CDS_HATCHERY_NAME");
    let mut events = std::pin::pin!(
        watcher(secrets, config)
            .default_backoff()
            .take_until(stop.cancelled_owned())
    );
    while let Some(event) = events.next().await {
        let Ok(watcher::Event::Delete(secret)) = event else {
            continue;
        };
        let Some(worker) = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("CDS_WORKER_NAME"))
            .cloned()
        else {
            continue;
        };
        if let Ok(Some(pod)) = pods.get_opt(&worker).await
            && is_live(&pod)
        {
            shared.lost.lock().unwrap().insert(worker);
        }
    }
}

/// The run's line of the results table.
pub fn row(mode: &str, report: &Report) -> String {
    let denied = if report.denied.is_empty() {
        "-".to_owned()
    } else {
        report
            .denied
            .iter()
            .map(|(reason, n)| format!("{reason}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "| {mode} | {} | {:.1} | {} | {} | {} |",
        report.spawns,
        report.spawns_per_second,
        report.lost.len(),
        report.orphans,
        denied
    )
}

/// The header of the results table.
pub const TABLE_HEADER: &str =
    "| mode | spawns | spawns/s | lost | orphans | denied deletes |\n|---|---|---|---|---|---|";
