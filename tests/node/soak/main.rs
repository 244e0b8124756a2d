//! Operating the guard on the node, as shipped (the image, the chart), each step while a
//! hatchery spawns workers beside a stale cleanup and reaps them when they are done:
//! a rolling upgrade, a replica killed with SIGKILL, a drain's evictions against the
//! PodDisruptionBudget, the memory limit under 10,000 watched worker pods and the
//! admission port's abuse, certificates renewed in minutes through a SIGKILL and an
//! upgrade, and the same counts biting on a renewal in Gatekeeper's order. No step may
//! lose a secret; each prints its figures.
//!
//! Long: not in `make test` (`test = false`); `make soak` runs it.
#![allow(clippy::unwrap_used)]

use testkit::cluster;
use testkit::install;
use testkit::seed;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cds_secret_guard::config::Limits;
use cluster::{TestNamespace, kubectl};
use futures::StreamExt;
use install::{
    GUARD_PODS, Release, VERSION, default_service_account, eventually, guard_logs, guard_pods, held_cas, kubectl_json,
    run, stdout,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api,
    api::{EvictParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use testkit::{attack, fake::young_delete};

const GUARD_NAMESPACE: &str = "cds-secret-guard";
const WEBHOOKS: [&str; 2] = ["secret-deletes.cds-secret-guard.io", "worker-pods.cds-secret-guard.io"];

/// The apiserver's count of calls to the guard's webhooks, and of those that failed
/// (the guard could not be called, or did not answer: with `failurePolicy: Fail` a failed
/// delete, with `Ignore` an unlabelled pod).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct WebhookCalls {
    calls: f64,
    failed: f64,
}

impl WebhookCalls {
    fn now() -> Self {
        let metrics = stdout(&run(kubectl().args(["get", "--raw", "/metrics"])));
        let mut counts = Self::default();
        for line in metrics
            .lines()
            .filter(|line| WEBHOOKS.iter().any(|w| line.contains(&format!("name=\"{w}\""))))
        {
            let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            if line.starts_with("apiserver_admission_webhook_request_total{") {
                counts.calls += value;
            } else if line.starts_with("apiserver_admission_webhook_fail_open_count{")
                || (line.starts_with("apiserver_admission_webhook_rejection_count{")
                    && !line.contains("error_type=\"no_error\""))
            {
                counts.failed += value;
            }
        }
        counts
    }

    fn since(self) -> Self {
        let now = Self::now();
        Self {
            calls: now.calls - self.calls,
            failed: now.failed - self.failed,
        }
    }
}

/// A hatchery's load for `seconds`: a spawn every 250 ms, the cleanup's pod list 300 ms
/// older than its secret list, finished workers reaped.
fn load(seconds: u64) -> seed::Spawns {
    seed::Spawns {
        workers: usize::try_from(seconds * 4).unwrap(),
        every: Duration::from_millis(250),
        list_lag: Duration::from_millis(300),
    }
}

fn assert_nothing_lost(step: &str, outcome: &seed::Outcome) {
    println!(
        "{step}: {} workers, {} completed, {} without their secret; the cleanup's deletes: refused {}, failed closed (guard not called) {}, done (pod gone) {}",
        outcome.workers,
        outcome.completed.len(),
        outcome.config_errors.len(),
        outcome.refused,
        outcome.failed,
        outcome.deleted
    );
    assert!(
        outcome.config_errors.is_empty(),
        "{step}: secrets lost: {:?}",
        outcome.config_errors
    );
    assert_eq!(outcome.completed.len(), outcome.workers, "{step}");
}

/// Watches the guard's EndpointSlices: each endpoint's readiness, in the order the
/// apiserver's watch showed its changes, by pod; and the fewest ready endpoints any
/// change left the Service with (none: the apiserver could call no replica).
struct EndpointWatch {
    seen: Arc<Mutex<Endpoints>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Endpoints {
    readiness: BTreeMap<String, Vec<bool>>,
    fewest_ready: Option<usize>,
}

impl EndpointWatch {
    fn start(client: kube::Client) -> Self {
        let seen = Arc::new(Mutex::new(Endpoints::default()));
        let slices: Api<EndpointSlice> = Api::namespaced(client, GUARD_NAMESPACE);
        let config = watcher::Config::default().labels("kubernetes.io/service-name=cds-secret-guard");
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut events = std::pin::pin!(watcher(slices, config).applied_objects());
                while let Some(Ok(slice)) = events.next().await {
                    let mut seen = seen.lock().unwrap();
                    let mut ready_now = 0;
                    for endpoint in slice.endpoints.into_iter().flatten() {
                        let pod = endpoint.target_ref.and_then(|r| r.name).unwrap_or_default();
                        let ready = endpoint.conditions.and_then(|c| c.ready).unwrap_or(false);
                        ready_now += usize::from(ready);
                        let states = seen.readiness.entry(pod).or_default();
                        if states.last() != Some(&ready) {
                            states.push(ready);
                        }
                    }
                    seen.fewest_ready = Some(seen.fewest_ready.map_or(ready_now, |fewest| fewest.min(ready_now)));
                }
            })
        };
        Self { seen, task }
    }

    fn stop(self) -> Endpoints {
        self.task.abort();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// The guard pods' names.
fn guard_pod_names() -> BTreeSet<String> {
    guard_pods(GUARD_NAMESPACE)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect()
}

async fn both_replicas_ready() {
    eventually("two ready guard replicas", Duration::from_secs(120), || {
        let pods = guard_pods(GUARD_NAMESPACE);
        (pods.len() == 2 && pods.iter().all(|(_, _, ready)| *ready)).then_some(())
    })
    .await;
}

/// A rolling upgrade to a new image tag while workers spawn: zero failed webhook calls,
/// no secret lost, and every new replica is kept out of the Service until its readiness
/// probe passes.
async fn rolling_upgrade(release: &Release) {
    let ns = TestNamespace::new("soak-upgrade").await;
    default_service_account(&ns.name).await;
    let before = guard_pod_names();
    let calls = WebhookCalls::now();
    let endpoint_watch = EndpointWatch::start(ns.client.clone());
    let running = seed::start(&ns, &load(60), true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let started = Instant::now();
    tokio::task::block_in_place(|| release.upgrade("dev"));
    println!("upgrade: helm upgrade --wait took {:?}", started.elapsed());
    let outcome = running.finish(&ns).await;
    let endpoints = endpoint_watch.stop().readiness;
    let during = calls.since();
    println!("upgrade: {during:?} webhook calls during the load");
    assert_nothing_lost("upgrade", &outcome);
    assert_eq!(during.failed, 0.0, "webhook calls failed during the rolling upgrade");
    assert!(during.calls > 0.0);

    let after = guard_pod_names();
    assert!(
        after.is_disjoint(&before),
        "every replica was replaced: {before:?} -> {after:?}"
    );
    for pod in guard_pods(GUARD_NAMESPACE) {
        let image = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pod", &pod.0]);
        assert_eq!(image["spec"]["containers"][0]["image"], "cds-secret-guard:dev");
    }
    println!("upgrade: endpoint readiness as watched: {endpoints:?}");
    // The Service takes a replica once its pod is Ready, which the readiness probe makes
    // it only once the guard serves: never before its "serving admission" line.
    for pod in &after {
        let ready_at = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pod", pod])["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
            .unwrap();
        let log = guard_logs(GUARD_NAMESPACE)
            .into_iter()
            .find(|(name, _)| name == pod)
            .unwrap()
            .1;
        let serving_at = log
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["message"] == "serving admission")
            .and_then(|line| line["timestamp"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("{pod} never logged that it serves:\n{log}"));
        println!("upgrade: {pod} serving at {serving_at}, Ready at {ready_at}");
        // RFC 3339 in UTC, compared to the second (the condition's resolution).
        assert!(
            ready_at[..19] >= serving_at[..19],
            "{pod} Ready at {ready_at} before it served at {serving_at}"
        );
        assert!(
            endpoints.contains_key(pod),
            "{pod} never in the Service's EndpointSlice"
        );
    }
}

/// One replica's container killed with SIGKILL through containerd while workers spawn:
/// the kubelet restarts it, and the calls the apiserver made meanwhile are counted.
async fn sigkill_one_replica() {
    let ns = TestNamespace::new("soak-sigkill").await;
    default_service_account(&ns.name).await;
    let calls = WebhookCalls::now();
    let running = seed::start(&ns, &load(40), true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pod = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pods", "-l", GUARD_PODS])["items"][0].clone();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let restarts = pod["status"]["containerStatuses"][0]["restartCount"].as_i64().unwrap();
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let socket =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/controlplane/node/containerd/containerd.sock");
    let killed = Instant::now();
    run(std::process::Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &container]));
    let back = eventually(
        "the killed replica restarted and ready",
        Duration::from_secs(120),
        || {
            let pod = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pod", &name]);
            let status = &pod["status"]["containerStatuses"][0];
            (status["restartCount"].as_i64() > Some(restarts) && status["ready"] == true).then(|| killed.elapsed())
        },
    )
    .await;
    println!("sigkill: {name} killed; restarted by the kubelet and ready again after {back:?}");
    let outcome = running.finish(&ns).await;
    let during = calls.since();
    println!("sigkill: {during:?} webhook calls during the load");
    assert_nothing_lost("sigkill", &outcome);
    both_replicas_ready().await;
}

/// A drain of the guard's pods through the Eviction API while workers spawn, as `kubectl
/// drain` asks: both evictions at once, retried while refused (429). The
/// PodDisruptionBudget lets one go at once; the other is refused, or held by the apiserver
/// (it retries its budget update on conflict for up to 10 s), until the first one's
/// replacement is ready: the Service never runs out of ready replicas, no webhook call
/// fails, no secret is lost.
async fn evictions_respect_the_budget(client: kube::Client) {
    both_replicas_ready().await;
    eventually(
        "the PodDisruptionBudget allows one disruption",
        Duration::from_secs(60),
        || {
            let pdb = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pdb", "cds-secret-guard"]);
            (pdb["status"]["disruptionsAllowed"] == 1).then_some(())
        },
    )
    .await;
    let ns = TestNamespace::new("soak-evict").await;
    default_service_account(&ns.name).await;
    let calls = WebhookCalls::now();
    let running = seed::start(&ns, &load(30), true);
    tokio::time::sleep(Duration::from_secs(5)).await;

    let endpoint_watch = EndpointWatch::start(ns.client.clone());
    let pods: Api<Pod> = Api::namespaced(client, GUARD_NAMESPACE);
    let names: Vec<String> = guard_pod_names().into_iter().collect();
    let asked = Instant::now();
    let drain = |name: String| {
        let pods = pods.clone();
        async move {
            let mut refusals = 0;
            loop {
                match pods.evict(&name, &EvictParams::default()).await {
                    Ok(_) => return (name, refusals, asked.elapsed()),
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        refusals += 1;
                        assert!(
                            asked.elapsed() < Duration::from_secs(120),
                            "{name}'s eviction still refused after 120 s: {}",
                            status.message
                        );
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(other) => panic!("evicting {name}: {other}"),
                }
            }
        }
    };
    let (first, second) = tokio::join!(drain(names[0].clone()), drain(names[1].clone()));
    for (name, refusals, after) in [&first, &second] {
        println!("eviction: {name} evicted after {after:?}, refused {refusals} times before");
    }
    let (sooner, later) = if first.2 <= second.2 {
        (&first, &second)
    } else {
        (&second, &first)
    };
    both_replicas_ready().await;
    let endpoints = endpoint_watch.stop();
    println!("eviction: endpoint readiness as watched: {endpoints:?}");
    assert!(
        endpoints.fewest_ready >= Some(1),
        "the Service ran out of ready replicas during the drain"
    );
    assert!(
        later.1 > 0 || later.2 >= sooner.2 + Duration::from_secs(1),
        "the budget neither refused nor held {}: evicted {:?} after {}",
        later.0,
        later.2,
        sooner.0
    );
    let outcome = running.finish(&ns).await;
    let during = calls.since();
    println!("eviction: {during:?} webhook calls during the load");
    assert_nothing_lost("eviction", &outcome);
    assert_eq!(during.failed, 0.0, "webhook calls failed during the drain");
    assert!(
        names.iter().all(|name| !guard_pod_names().contains(name)),
        "both replicas were replaced"
    );
}

/// Worker pods no node takes: Pending, and watched by the guard like any worker pod. They
/// name a scheduler nobody runs, so the node's scheduler does not retry 10,000
/// unschedulable pods beside the workers it must place.
async fn pending_workers(ns: &TestNamespace, count: usize) {
    let pods = ns.pods();
    futures::stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let worker = format!("pending-{i}");
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": worker, "labels": {"CDS_HATCHERY_NAME": "hatchery-pending", "CDS_WORKER_NAME": worker}},
                    "spec": {
                        "schedulerName": "cds-secret-guard.io/no-such-scheduler",
                        "containers": [{"name": "worker", "image": seed::WORKER_IMAGE, "imagePullPolicy": "Never"}],
                    },
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// A container's memory as its cgroup (v1) counts it: what the kubelet's limit is
/// enforced on.
struct ContainerMemory {
    dir: std::path::PathBuf,
}

impl ContainerMemory {
    /// The cgroup of the pod's first container: `kubepods[/<qos>]/pod<uid>/<id>`.
    fn of(pod: &serde_json::Value) -> Self {
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let id = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .unwrap()
            .trim_start_matches("containerd://");
        let root = std::path::Path::new("/sys/fs/cgroup/memory/kubepods");
        let qos_dirs = ["", "burstable", "besteffort"];
        let dir = qos_dirs
            .iter()
            .map(|qos| root.join(qos).join(format!("pod{uid}")).join(id))
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| panic!("no memory cgroup for pod {uid} container {id} under {}", root.display()));
        Self { dir }
    }

    fn read(&self, file: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.trim().parse().unwrap()
    }

    /// Usage now, its peak, the limit, and how often the limit was hit, in MiB and times.
    fn figures(&self) -> String {
        let mib = |file| self.read(file) as f64 / (1024.0 * 1024.0);
        format!(
            "{:.1} MiB now, peak {:.1} MiB, limit {:.0} MiB, limit hit {} times",
            mib("memory.usage_in_bytes"),
            mib("memory.max_usage_in_bytes"),
            mib("memory.limit_in_bytes"),
            self.read("memory.failcnt")
        )
    }
}

/// The worst a client of the admission port can do to the guard's memory, as
/// tests/local/abuse.rs does it to the binary: every request slot holds a body just under the
/// body limit, every other connection is HTTP/2 filled to what the server allows. The
/// connections are returned, held.
async fn abuse(
    addr: std::net::SocketAddr,
    server_name: &str,
    ca_dir: &std::path::Path,
) -> Vec<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let limits = Limits::default();
    let http1 = attack::tls_config(ca_dir, rustls::DEFAULT_VERSIONS, &[b"http/1.1"]);
    let http2 = attack::tls_config(ca_dir, rustls::DEFAULT_VERSIONS, &[b"h2"]);
    let mut held = Vec::new();
    for _ in 0..limits.max_requests {
        let tls = attack::tls_connect_as(addr, server_name, http1.clone()).await.unwrap();
        held.push(attack::slow_body(tls, limits.body_limit).await);
    }
    let mut sent = 0;
    for _ in 0..limits.max_connections - limits.max_requests - 1 {
        let mut tls = attack::tls_connect_as(addr, server_name, http2.clone()).await.unwrap();
        sent += attack::fill_http2_connection(&mut tls, 8).await;
        held.push(tls);
    }
    println!(
        "memory: abuse: {} slow bodies of {} KiB, {} HTTP/2 connections filled ({} MiB sent)",
        limits.max_requests,
        (limits.body_limit - 4096) / 1024,
        limits.max_connections - limits.max_requests - 1,
        sent >> 20
    );
    held
}

/// A valid review sent straight to one guard pod is answered: kept, too young.
async fn answered_by(addr: std::net::SocketAddr, server_name: &str, ca: &[u8]) {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
        .tls_built_in_root_certs(false)
        .resolve(server_name, addr)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let answer: serde_json::Value = client
        .post(format!("https://{server_name}:{}/validate", addr.port()))
        .json(&young_delete())
        .send()
        .await
        .expect("the abused replica answers")
        .json()
        .await
        .unwrap();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
}

/// Under the kubelet's enforcement of the chart's memory limit, one replica with 10,000
/// worker pods in its watch and the admission port's worst abuse, while workers spawn:
/// it is not OOM-killed, it keeps answering, and no secret is lost.
async fn memory_under_the_limit(client: kube::Client) {
    const PENDING: usize = 10_000;
    both_replicas_ready().await;
    let pending = TestNamespace::new("soak-pending").await;
    default_service_account(&pending.name).await;
    let started = Instant::now();
    pending_workers(&pending, PENDING).await;
    println!(
        "memory: {PENDING} pending worker pods created in {:?}",
        started.elapsed()
    );

    let pods = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pods", "-l", GUARD_PODS]);
    let pod = pods["items"][0].clone();
    let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let restarts = pod["status"]["containerStatuses"][0]["restartCount"].as_i64().unwrap();
    let cgroup = ContainerMemory::of(&pod);
    // The pod's watch has the pods once it has seen the last one created.
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!(
        "memory: {name} with {PENDING} pending pods watched: {}",
        cgroup.figures()
    );

    let server_name = format!("cds-secret-guard.{GUARD_NAMESPACE}.svc");
    // The bundle the guard keeps beside its certificates (the chart's default source).
    let tls: Secret = Api::namespaced(client, GUARD_NAMESPACE)
        .get("cds-secret-guard-certificate")
        .await
        .unwrap();
    let ca = tls.data.unwrap()["ca.crt"].0.clone();
    let ca_dir = tempfile::tempdir().unwrap();
    std::fs::write(ca_dir.path().join("ca.crt"), &ca).unwrap();
    let addr = std::net::SocketAddr::new(pod["status"]["podIP"].as_str().unwrap().parse().unwrap(), 8443);

    let ns = TestNamespace::new("soak-memory").await;
    default_service_account(&ns.name).await;
    let running = seed::start(&ns, &load(30), true);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let held = abuse(addr, &server_name, ca_dir.path()).await;
    println!("memory: {name} abused: {}", cgroup.figures());
    drop(held);
    answered_by(addr, &server_name, &ca).await;
    let outcome = running.finish(&ns).await;
    assert_nothing_lost("memory", &outcome);

    let after = kubectl_json(&["-n", GUARD_NAMESPACE, "get", "pod", &name]);
    let status = &after["status"]["containerStatuses"][0];
    println!("memory: {name} after: {}", cgroup.figures());
    assert_ne!(
        status["lastState"]["terminated"]["reason"], "OOMKilled",
        "{name} was OOM-killed"
    );
    assert_eq!(
        status["restartCount"].as_i64(),
        Some(restarts),
        "{name} restarted: {status}"
    );
    assert!(
        cgroup.read("memory.max_usage_in_bytes") < cgroup.read("memory.limit_in_bytes"),
        "{name} reached its memory limit: {}",
        cgroup.figures()
    );
}

/// What the sampler saw of the guard's certificates: every CA the secret webhook held,
/// every leaf the state Secret held, and the next CA waiting in it now.
#[derive(Debug, Default)]
struct Rotations {
    cas: BTreeSet<String>,
    leaves: BTreeSet<String>,
    next: Option<String>,
}

/// Samples the webhook's bundle and the state Secret every 500 ms (a leaf lives 20 s
/// before its renewal, a next CA waits 5 s) until `stop`.
fn sample_rotations(release: &Release, stop: tokio_util::sync::CancellationToken) -> Arc<Mutex<Rotations>> {
    let seen = Arc::new(Mutex::new(Rotations::default()));
    let (name, namespace) = (release.name, release.namespace);
    let state = format!("{name}-certificate");
    tokio::spawn({
        let seen = seen.clone();
        async move {
            while !stop.is_cancelled() {
                let state = state.clone();
                let (cas, secret) = tokio::task::spawn_blocking(move || {
                    (
                        held_cas(name),
                        kubectl_json(&["-n", namespace, "get", "secret", &state]),
                    )
                })
                .await
                .unwrap();
                let key = |key: &str| secret["data"][key].as_str().map(str::to_owned);
                {
                    let mut seen = seen.lock().unwrap();
                    seen.cas.extend(cas);
                    seen.leaves.extend(key("tls.crt"));
                    seen.next = key("next-ca.crt");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    });
    seen
}

/// Waits for a CA rotation under way (a next CA in the bundle, not yet signing) other
/// than `not`, and returns that next CA.
async fn next_ca(seen: &Arc<Mutex<Rotations>>, not: Option<&str>) -> String {
    eventually("a CA rotation under way", Duration::from_secs(120), || {
        seen.lock()
            .unwrap()
            .next
            .clone()
            .filter(|next| Some(next.as_str()) != not)
    })
    .await
}

/// The apiserver's log from `offset` on: its lines about the guard's webhooks that name
/// a certificate error (an apiserver that does not trust the served leaf).
fn certificate_errors_since(offset: u64) -> Vec<String> {
    use std::io::{Read, Seek};
    let mut log = std::fs::File::open(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/controlplane/logs/kube-apiserver.log"),
    )
    .unwrap();
    log.seek(std::io::SeekFrom::Start(offset)).unwrap();
    let mut text = String::new();
    log.read_to_string(&mut text).unwrap();
    text.lines()
        .filter(|line| line.contains("cds-secret-guard.io") && (line.contains("x509") || line.contains("tls:")))
        .map(str::to_owned)
        .collect()
}

fn apiserver_log_length() -> u64 {
    std::fs::metadata(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/controlplane/logs/kube-apiserver.log"),
    )
    .unwrap()
    .len()
}

/// The guard's certificates compressed to a CA of 90 s and leaves of 30 s, renewed by
/// the chart's two replicas while workers spawn. Undisturbed first, for two CA rotations
/// and their leaves: not one webhook call fails (the apiserver's metrics). Then the Lease
/// holder (the replica that renews) is SIGKILLed while a next CA waits in the bundle, and
/// a `helm upgrade` that shortens the leaves rolls both replicas during the rotation
/// after: no call fails during the upgrade, those failing around the kill are the
/// connections the dead replica held (never a certificate the apiserver refused), and no
/// secret is lost.
async fn certificates_rotate_through_disruptions(release: &Release) {
    let compressed = ["certificate.guard.caValidity=90s", "certificate.guard.leafValidity=30s"];
    tokio::task::block_in_place(|| release.upgrade_with(VERSION, &compressed));
    let ns = TestNamespace::new("soak-rotation").await;
    default_service_account(&ns.name).await;
    let log_offset = apiserver_log_length();
    let calls = WebhookCalls::now();
    let sampling = tokio_util::sync::CancellationToken::new();
    let seen = sample_rotations(release, sampling.clone());
    let spawns = seed::Spawns {
        workers: 360,
        every: Duration::from_secs(1),
        list_lag: Duration::from_millis(300),
    };
    let running = seed::start(&ns, &spawns, true);

    // A rotation every 60 s (the soak's 5-year CA is replaced at once, being longer than
    // the new validity): two of them complete from the first next CA to the third.
    let first = next_ca(&seen, None).await;
    let second = next_ca(&seen, Some(&first)).await;
    let third = next_ca(&seen, Some(&second)).await;
    let undisturbed = calls.since();
    let (cas, leaves) = {
        let seen = seen.lock().unwrap();
        (seen.cas.len(), seen.leaves.len())
    };
    println!("rotation, undisturbed: {undisturbed:?} webhook calls; {cas} CAs and {leaves} leaves seen");
    assert_eq!(undisturbed.failed, 0.0, "webhook calls failed during the rotations");
    assert!(cas >= 4, "the soak's CA and three more: {cas}");
    assert!(leaves >= 6, "leaves seen: {leaves}");

    // The third rotation under way: kill the replica that renews.
    let killing = WebhookCalls::now();
    let holder = kubectl_json(&["-n", release.namespace, "get", "lease", release.name])["spec"]["holderIdentity"]
        .as_str()
        .unwrap()
        .to_owned();
    let pod = kubectl_json(&["-n", release.namespace, "get", "pod", &holder]);
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let socket =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/controlplane/node/containerd/containerd.sock");
    run(std::process::Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &container]));
    both_replicas_ready().await;

    // The next rotation: an upgrade that shortens the leaves rolls both replicas.
    next_ca(&seen, Some(&third)).await;
    let killed = killing.since();
    println!(
        "rotation: the Lease holder {holder} SIGKILLed during a rotation: {killed:?} webhook calls until the next"
    );
    let leaves_before = seen.lock().unwrap().leaves.len();
    let upgrading = WebhookCalls::now();
    let started = Instant::now();
    let shorter = ["certificate.guard.caValidity=90s", "certificate.guard.leafValidity=24s"];
    tokio::task::block_in_place(|| release.upgrade_with(VERSION, &shorter));
    println!(
        "rotation: helm upgrade (leaves 30s -> 24s) during a rotation took {:?}",
        started.elapsed()
    );

    let outcome = running.finish(&ns).await;
    sampling.cancel();
    let upgraded = upgrading.since();
    let (cas, leaves) = {
        let seen = seen.lock().unwrap();
        (seen.cas.len(), seen.leaves.len())
    };
    println!(
        "rotation: {upgraded:?} webhook calls from the upgrade to the load's end; {cas} CAs and {leaves} leaves seen in all"
    );
    assert_nothing_lost("rotation", &outcome);
    assert_eq!(
        upgraded.failed, 0.0,
        "webhook calls failed during and after the upgrade"
    );
    let refused = certificate_errors_since(log_offset);
    assert!(refused.is_empty(), "the apiserver refused a certificate: {refused:#?}");
    assert!(leaves > leaves_before, "no leaf signed after the upgrade");
    both_replicas_ready().await;
}

/// The renewal `certificate.source: generate` leaves to the operator (docs/upgrade.md, "Renewing a generated certificate":
/// delete the certificate's secret, `helm upgrade`) replaces the CA and the serving
/// certificate in one apply: Gatekeeper's order. The apiserver trusts the new CA at once;
/// the replicas serve the old certificate until the kubelet updates their mounted files.
/// The same load and the same counts as the guard's own renewal see those calls fail.
async fn renewing_by_hand_replaces_ca_and_leaf_together(release: &Release) {
    let generate = ["certificate.source=generate"];
    tokio::task::block_in_place(|| release.upgrade_forcing_conflicts(VERSION, &generate));
    both_replicas_ready().await;
    let ns = TestNamespace::new("soak-by-hand").await;
    default_service_account(&ns.name).await;
    let spawns = seed::Spawns {
        workers: 150,
        every: Duration::from_secs(1),
        list_lag: Duration::from_millis(300),
    };
    let running = seed::start(&ns, &spawns, true);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let log_offset = apiserver_log_length();
    let calls = WebhookCalls::now();
    let secret = format!("secret/{}-tls", release.name);
    run(kubectl().args(["-n", release.namespace, "delete", &secret]));
    // Forced again: the replicas that renewed until the switch may have written the
    // caBundle once more before they stopped (a steady `generate` install needs no force).
    tokio::task::block_in_place(|| release.upgrade_forcing_conflicts(VERSION, &generate));
    let outcome = running.finish(&ns).await;
    let during = calls.since();
    let refused = certificate_errors_since(log_offset);
    let window = refused
        .first()
        .zip(refused.last())
        .map(|(first, last)| format!("{} to {}", &first[6..21], &last[6..21]));
    println!(
        "by hand: {during:?} webhook calls after the CA and the leaf were replaced together; {} certificate errors in the apiserver's log ({window:?})",
        refused.len()
    );
    assert_nothing_lost("by hand", &outcome);
    assert!(during.failed > 0.0, "the counts miss the broken order's failures");
    assert!(!refused.is_empty(), "no certificate error in the apiserver's log");
}

#[tokio::test(flavor = "multi_thread")]
async fn operating_the_guard_on_the_node_loses_no_secret() {
    install::node();
    let release = Release::install(VERSION);
    both_replicas_ready().await;
    // Counting starts once the Service's data path (kube-proxy's rules, a moment behind
    // the pods' readiness) reaches the guard: a call before that fails whatever the guard.
    let probe = TestNamespace::new("soak-probe").await;
    probe.worker_secret("probe").await;
    install::refused_by_the_guard(&probe, "cds-worker-config-probe").await;
    rolling_upgrade(&release).await;
    sigkill_one_replica().await;
    memory_under_the_limit(cluster::client().await).await;
    evictions_respect_the_budget(cluster::client().await).await;
    certificates_rotate_through_disruptions(&release).await;
    renewing_by_hand_replaces_ca_and_leaf_together(&release).await;
}
