//! The guard on the apiserver's path, on the local control plane (`make bench` starts one
//! of its own; see docs/design/benchmarks.md):
//!
//! 1. **Secret DELETEs** (`dryRun=All`, so nothing changes) loaded by `oha` as admin
//!    (client certificate from `target/controlplane/pki/`), with and without the guard
//!    registered, alternately, on each of its paths: deny by age (a young secret), deny by
//!    live pod (an old secret whose worker's pod exists), allow orphan (an old secret, no
//!    pod), and allow orphan again while a worker pod changes every 5 ms; each in a
//!    namespace with 10 pods and in one with 10,000. Latency, and the CPU the apiserver,
//!    etcd and the webhook spend per delete; with `--apiserver-profiles`, the apiserver's
//!    own CPU profile (Go's pprof) of each path's first guarded run.
//! 2. **Memory**: the guard's VmRSS with 10 worker pods, then with 10,000.
//! 3. **Reconciler load**: workers spawned as the hatchery does (secret, pod, status
//!    updates as a kubelet would make them, pod delete, the garbage collector deletes the
//!    secret), with one guard replica and with two; the guard's apiserver requests per
//!    worker and replica from the apiserver's audit log, and the latency from a pod's
//!    creation to the ownerReference on its secret.
//!
//! Every guard runs as its service account, as `tests/controlplane/e2e` runs it. Prints tables.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bench_support;
use testkit::cluster as e2e;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use bench_support::{
    CeilingAnswer, Load, Measured, Process, Table, cpu_time, f2, goal, median, median_ratio, rps, rss_mib,
    start_ceiling,
};
use clap::Parser;
use e2e::{
    Guard, GuardOptions, TestNamespace, audit_log_files, client, control_plane, guard_kubeconfig, kubectl,
    service_account_kubeconfig, unregister_webhooks,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::{
    api::core::v1::{ConfigMap, Event, Pod, Secret},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, VersionMatch},
    config::Kubeconfig,
    core::PartialObjectMeta,
    runtime::{watcher, watcher::watcher as watch_stream},
};
use serde_json::{Value, json};

/// The guard's user in the audit log.
const GUARD_USER: &str = "system:serviceaccount:cds-secret-guard:cds-secret-guard";

#[derive(Debug, Parser)]
#[command(about = "The guard on the apiserver's path: deletes, memory, reconciler load")]
struct Args {
    /// Rounds per path; each runs with the guard registered, then without.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Length of one load run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Connections of the delete load.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Pods in the large namespace.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Worker spawns per second of the reconciler run.
    #[arg(long, default_value_t = 50.0)]
    spawn_rate: f64,
    /// How long workers are spawned.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    spawn_duration: Duration,
    /// Pod status updates per worker (as its kubelet would make them).
    #[arg(long, default_value_t = 5)]
    status_updates: usize,
    /// Only the reconciler runs (beside the --pods worker pods), not the delete paths.
    #[arg(long)]
    reconciler_only: bool,
    /// The delete paths to measure, by key (`young`, `live`, `orphan`, `orphan-churn`,
    /// `orphan-writer-1`, `orphan-writer-5`, `orphan-writer-50`, `orphan-writer-50-paced`),
    /// comma-separated; all when not given.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(PATHS.map(|path| path.key)))]
    paths: Vec<String>,
    /// Skips the reconciler runs after the delete paths.
    #[arg(long, conflicts_with = "reconciler_only")]
    no_reconciler: bool,
    /// Skips timing the reads that could prove a worker has no pod, alone, after the
    /// delete paths.
    #[arg(long, conflicts_with = "reconciler_only")]
    no_reads: bool,
    /// Writes a CPU profile of the apiserver (Go's pprof, `/debug/pprof/profile`) taken
    /// during the first guarded run of each path and namespace into this directory; read
    /// them with `go tool pprof -top`.
    #[arg(long)]
    apiserver_profiles: Option<PathBuf>,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn pki(file: &str) -> PathBuf {
    repo().join("target/controlplane/pki").join(file)
}

/// The apiserver's URL, from the admin kubeconfig.
fn apiserver_url() -> String {
    let kubeconfig = Kubeconfig::read_from(control_plane()).unwrap();
    kubeconfig.clusters[0].cluster.as_ref().unwrap().server.clone().unwrap()
}

// === objects ===

fn worker_secret(worker: &str, hatchery: &str) -> Secret {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("cds-worker-config-{worker}"),
            "labels": {"CDS_HATCHERY_NAME": hatchery, "CDS_WORKER_NAME": worker},
        },
        "stringData": {"CDS_CONFIG": "bench-worker-token"},
    }))
    .unwrap()
}

/// A worker pod as the CDS hatchery makes it: labelled, reading its secret.
fn worker_pod(worker: &str, hatchery: &str) -> Pod {
    let secret = format!("cds-worker-config-{worker}");
    serde_json::from_value(json!({
        "metadata": {"name": worker, "labels": {"CDS_HATCHERY_NAME": hatchery, "CDS_WORKER_NAME": worker}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "worker",
                "image": "ovhcom/cds-worker:latest",
                "env": [{"name": "CDS_CONFIG", "valueFrom": {"secretKeyRef": {"name": secret, "key": "CDS_CONFIG"}}}],
                "envFrom": [{"secretRef": {"name": secret}, "prefix": "CDS_"}],
            }],
        },
    }))
    .unwrap()
}

/// A pod labelled as a worker's, using no secret: it fills a namespace.
fn filler_pod(i: usize) -> Pod {
    labelled_pod(&format!("filler-{i:05}"))
}

/// A pod labelled as the worker of its name, using no secret.
fn labelled_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"CDS_HATCHERY_NAME": "bench-filler", "CDS_WORKER_NAME": name}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "worker", "image": "ovhcom/cds-worker:latest"}]},
    }))
    .unwrap()
}

async fn create_fillers(client: &Client, namespace: &str, count: usize) -> Duration {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &filler_pod(i)).await.map(drop) }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("create filler pods");
    start.elapsed()
}

// === registration, toggled ===

/// Who answers the secret deletes' admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Webhook {
    None = 0,
    Guard = 1,
    /// The ceiling answering at once what the guard answers on the path, echoing the
    /// uid (`examples/ceiling --deny` or `--allow`): what calling any webhook costs the
    /// apiserver.
    Floor = 2,
}

/// The denying floor's refusal, as the probe sees it.
const FLOOR_MESSAGE: &str = "denied by the ceiling";
/// The allowing floor's warning, in the `Warning` header of the probe's answer.
const FLOOR_WARNING: &str = "allowed by the ceiling";

/// The webhook registrations to toggle between.
struct Registrations<'a> {
    guard: &'a Guard,
    /// The floor's validating webhook: the guard's, pointed at the floor's port.
    floor_yaml: PathBuf,
    floor_pid: u32,
    probe: &'a Api<Secret>,
    probe_secret: &'a str,
}

impl<'a> Registrations<'a> {
    /// The guard's registration, and the floor's: `floor`, a ceiling answering `answer`.
    fn new(
        guard: &'a Guard,
        floor: &Process,
        answer: CeilingAnswer,
        probe: &'a Api<Secret>,
        probe_secret: &'a str,
    ) -> Self {
        let yaml = std::fs::read_to_string(guard.webhooks_yaml()).unwrap();
        let validating = yaml
            .split("\n---")
            .find(|document| document.contains("kind: ValidatingWebhookConfiguration"))
            .expect("the guard's webhooks.yaml has a validating webhook");
        let guard_port = format!(":{}/", guard.admission_addr().port());
        assert!(validating.contains(&guard_port), "the webhook calls the guard's port");
        let floor_yaml = guard
            .webhooks_yaml()
            .with_file_name(format!("floor-{answer:?}-webhook.yaml").to_lowercase());
        let floor_port = format!(":{}/", floor.addr.port());
        std::fs::write(&floor_yaml, validating.replace(&guard_port, &floor_port)).unwrap();
        Self {
            guard,
            floor_yaml,
            floor_pid: floor.pid(),
            probe,
            probe_secret,
        }
    }

    /// Registers `webhook` alone, and waits until the apiserver acts on it: a dry-run
    /// delete of a secret whose pod is live is answered by it.
    async fn set(&self, webhook: Webhook) {
        let yaml = match webhook {
            Webhook::None => None,
            Webhook::Guard => Some(self.guard.webhooks_yaml()),
            Webhook::Floor => Some(self.floor_yaml.clone()),
        };
        match yaml {
            Some(yaml) => {
                let applied = kubectl()
                    .args(["apply", "-f"])
                    .arg(yaml)
                    .stdout(Stdio::null())
                    .status()
                    .unwrap();
                assert!(applied.success(), "kubectl apply of the webhooks failed");
            }
            None => assert!(unregister_webhooks(), "cannot unregister the webhooks"),
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.answering().await == webhook {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "registration of {webhook:?} never took effect"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Who answers a dry-run delete of the probe secret (whose pod is live): the guard
    /// refuses it, each floor says it was the one, and nobody allows it silently.
    async fn answering(&self) -> Webhook {
        let namespace = self.probe.namespace().expect("the probe is namespaced");
        let request = http::Request::delete(format!(
            "/api/v1/namespaces/{namespace}/secrets/{}?dryRun=All",
            self.probe_secret
        ))
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
        let Ok(response) = self.probe.clone().into_client().send(request).await else {
            return Webhook::None;
        };
        let warned = response
            .headers()
            .get_all("warning")
            .iter()
            .any(|warning| warning.to_str().is_ok_and(|text| text.contains(FLOOR_WARNING)));
        let status = response.status().as_u16();
        let body = response.into_body().collect_bytes().await.unwrap_or_default();
        match status {
            403 if String::from_utf8_lossy(&body).contains(FLOOR_MESSAGE) => Webhook::Floor,
            403 => Webhook::Guard,
            200 if warned => Webhook::Floor,
            _ => Webhook::None,
        }
    }
}

/// The registrations of a path: the guard, and the floor answering as the guard does.
struct PathRegistrations<'a> {
    deny: Registrations<'a>,
    allow: Registrations<'a>,
}

impl PathRegistrations<'_> {
    fn for_path(&self, path: &Path4) -> &Registrations<'_> {
        if path.guarded == 403 { &self.deny } else { &self.allow }
    }
}

/// Both floors beside `guard`, serving its certificate (the apiserver trusts them with
/// the same CA), and the registrations to toggle; the floors stop when dropped.
fn both_floors<'a>(guard: &'a Guard, probe: &'a Api<Secret>) -> ([Process; 2], PathRegistrations<'a>) {
    let certs = guard.webhooks_yaml().with_file_name("certs");
    let floors = [CeilingAnswer::Deny, CeilingAnswer::Allow].map(|answer| start_ceiling(&certs, answer));
    let probe_secret = "cds-worker-config-live";
    let registrations = PathRegistrations {
        deny: Registrations::new(guard, &floors[0], CeilingAnswer::Deny, probe, probe_secret),
        allow: Registrations::new(guard, &floors[1], CeilingAnswer::Allow, probe, probe_secret),
    };
    (floors, registrations)
}

// === the delete paths ===

struct Path4 {
    /// What `--paths` calls it.
    key: &'static str,
    name: &'static str,
    worker: &'static str,
    /// HTTP status with the guard registered.
    guarded: u16,
    /// Who else writes meanwhile, with and without the guard alike.
    writer: Writer,
    /// Deletes a second in all, open loop; back to back on `--connections` when `None`.
    paced: Option<f64>,
    /// The goals of the p50 and the p99 of the guarded delete over the unguarded one.
    p50_goal: f64,
    p99_goal: Option<f64>,
}

/// Another client writing while a path is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    Quiet,
    /// A labelled pod of each measured namespace changes every [`CHURN_EVERY`], as worker
    /// pods do where the hatchery is busy: the pods watch cache moves with it.
    WorkerPods,
    /// ConfigMaps are created in a namespace of their own, this many a second: what node
    /// leases, Events, controllers and other tenants do on any real cluster. The pods
    /// watch cache sees none of it, and etcd's revision moves on.
    ConfigMapsElsewhere(u32),
}

/// How often the churning pod changes (an annotation), with and without the guard alike.
const CHURN_EVERY: Duration = Duration::from_millis(5);

const fn orphan_path(key: &'static str, name: &'static str, writer: Writer, paced: Option<f64>) -> Path4 {
    let (p50_goal, p99_goal) = match writer {
        Writer::Quiet => (1.5, None),
        Writer::WorkerPods => (2.0, None),
        Writer::ConfigMapsElsewhere(_) => (2.3, Some(5.0)),
    };
    Path4 {
        key,
        name,
        worker: "orphan",
        guarded: 200,
        writer,
        paced,
        p50_goal,
        p99_goal,
    }
}

const PATHS: [Path4; 8] = [
    Path4 {
        key: "young",
        name: "deny by age (young secret)",
        worker: "young",
        guarded: 403,
        writer: Writer::Quiet,
        paced: None,
        p50_goal: 1.5,
        p99_goal: None,
    },
    Path4 {
        key: "live",
        name: "deny by live pod",
        worker: "live",
        guarded: 403,
        writer: Writer::Quiet,
        paced: None,
        p50_goal: 1.5,
        p99_goal: None,
    },
    orphan_path("orphan", "allow orphan", Writer::Quiet, None),
    orphan_path(
        "orphan-churn",
        "allow orphan, worker pods changing",
        Writer::WorkerPods,
        None,
    ),
    orphan_path(
        "orphan-writer-1",
        "allow orphan, 1 ConfigMap/s written elsewhere",
        Writer::ConfigMapsElsewhere(1),
        None,
    ),
    orphan_path(
        "orphan-writer-5",
        "allow orphan, 5 ConfigMaps/s written elsewhere",
        Writer::ConfigMapsElsewhere(5),
        None,
    ),
    orphan_path(
        "orphan-writer-50",
        "allow orphan, 50 ConfigMaps/s written elsewhere",
        Writer::ConfigMapsElsewhere(50),
        None,
    ),
    orphan_path(
        "orphan-writer-50-paced",
        "allow orphan, 50 ConfigMaps/s written elsewhere, deletes paced at 5/s",
        Writer::ConfigMapsElsewhere(50),
        Some(5.0),
    ),
];

/// The writer of a path, running until dropped.
struct Writing(Vec<tokio::task::JoinHandle<()>>);

impl Writing {
    /// Starts `writer` on `namespaces` (the measured ones), or on `elsewhere`.
    fn start(admin: &Client, namespaces: [&str; 2], elsewhere: &str, writer: Writer) -> Self {
        let tasks = match writer {
            Writer::Quiet => Vec::new(),
            Writer::WorkerPods => namespaces
                .iter()
                .map(|namespace| {
                    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
                    tokio::spawn(async move {
                        for n in 0u64.. {
                            let patch = json!({"metadata": {"annotations": {"churn": n.to_string()}}});
                            let _ = pods
                                .patch("churn", &PatchParams::default(), &Patch::Merge(&patch))
                                .await;
                            tokio::time::sleep(CHURN_EVERY).await;
                        }
                    })
                })
                .collect(),
            Writer::ConfigMapsElsewhere(per_second) => {
                let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), elsewhere);
                let every = Duration::from_secs(1) / per_second;
                vec![tokio::spawn(async move {
                    let mut ticks = tokio::time::interval(every);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    for n in 0u64.. {
                        ticks.tick().await;
                        let config_map = ConfigMap {
                            metadata: ObjectMeta {
                                generate_name: Some("written-".into()),
                                ..ObjectMeta::default()
                            },
                            data: Some([("n".to_owned(), n.to_string())].into()),
                            ..ConfigMap::default()
                        };
                        // Each on its own: a slow answer must not slow the rate down.
                        let config_maps = config_maps.clone();
                        tokio::spawn(async move {
                            let _ = config_maps.create(&PostParams::default(), &config_map).await;
                        });
                    }
                })]
            }
        };
        Self(tasks)
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.iter().for_each(tokio::task::JoinHandle::abort);
    }
}

/// The apiserver's waits for its pods watch cache to catch up with etcd before serving a
/// consistent read (`apiserver_watch_cache_read_wait_seconds{resource="pods"}`):
/// cumulative, so a run takes a difference.
#[derive(Debug, Default, Clone, Copy)]
struct ReadWaits {
    reads: f64,
    seconds: f64,
}

impl ReadWaits {
    async fn read(admin: &Client) -> Self {
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = admin.request_text(request).await.unwrap();
        let sample = |name: &str| -> f64 {
            text.lines()
                .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
                .filter(|line| line.contains("resource=\"pods\"") && line.contains("group=\"\""))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Self {
            reads: sample("apiserver_watch_cache_read_wait_seconds_count"),
            seconds: sample("apiserver_watch_cache_read_wait_seconds_sum"),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            reads: self.reads - before.reads,
            seconds: self.seconds - before.seconds,
        }
    }
}

/// One load run: what the client measured and the CPU the servers spent on it.
struct Run {
    load: Measured,
    /// CPU of the apiserver and etcd per request beyond their idle rate, in µs.
    control_plane_us: f64,
    /// CPU of the webhook server (the guard or the floor) per request, in µs.
    webhook_us: f64,
    /// The apiserver's waits for its pods watch cache during the run.
    read_waits: ReadWaits,
}

/// `results[webhook][namespace]`: one `Run` per round.
type PathResults = [[Vec<Run>; 2]; 3];

/// The pids of the control plane's apiserver and etcd (single mode, as `make bench` starts
/// it), from `cluster.sh`'s pid files.
fn control_plane_pids() -> Vec<u32> {
    ["kube-apiserver", "etcd"]
        .iter()
        .map(|name| {
            let file = repo().join("target/controlplane/run").join(format!("{name}.pid"));
            let pid = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            pid.trim().parse().expect("a pid file holds a pid")
        })
        .collect()
}

/// CPU time of several processes together.
fn cpu_of(pids: &[u32]) -> Duration {
    pids.iter().map(|&pid| cpu_time(pid)).sum()
}

/// Fetches a CPU profile of the apiserver over `seconds` (Go's pprof, which the
/// apiserver serves to admins with `--profiling`, its default) into `file`.
fn profile_apiserver(seconds: u64, file: PathBuf) {
    let output = kubectl()
        .args(["get", "--raw"])
        .arg(format!("/debug/pprof/profile?seconds={seconds}"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "apiserver profile: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(&file, output.stdout).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    eprintln!("bench_apiserver: apiserver profile in {}", file.display());
}

async fn measure_path(
    args: &Args,
    admin: &Client,
    registrations: &Registrations<'_>,
    namespaces: [&str; 2],
    elsewhere: &str,
    path: &Path4,
) -> PathResults {
    let _writing = Writing::start(admin, namespaces, elsewhere, path.writer);
    let base = apiserver_url();
    let load = |namespace: &str| Load {
        url: format!(
            "{base}/api/v1/namespaces/{namespace}/secrets/cds-worker-config-{}?dryRun=All",
            path.worker
        ),
        method: "DELETE",
        body: None,
        http2: false,
        connections: args.connections,
        duration: args.duration,
        rate: path.paced,
        client_cert: Some((pki("admin.crt"), pki("admin.key"))),
        cacert: Some(pki("ca.crt")),
    };
    // What the control plane spends meanwhile without deletes (leases, watches, the churn):
    // subtracted from each run, so that a slower run is not charged more of it per delete.
    let pids = control_plane_pids();
    let before = cpu_of(&pids);
    tokio::time::sleep(args.duration).await;
    let idle = cpu_of(&pids).saturating_sub(before).as_secs_f64() / args.duration.as_secs_f64();
    let mut results: PathResults = Default::default();
    for round in 0..args.rounds {
        for webhook in [Webhook::Guard, Webhook::None, Webhook::Floor] {
            registrations.set(webhook).await;
            for (i, namespace) in namespaces.iter().enumerate() {
                let expect = match webhook {
                    Webhook::None => 200,
                    Webhook::Guard | Webhook::Floor => path.guarded,
                };
                let profile = match (&args.apiserver_profiles, webhook) {
                    (Some(dir), Webhook::Guard) if round == 0 => {
                        let file = dir.join(format!("{}-{namespace}.pprof", path.key));
                        let seconds = args.duration.as_secs().max(1);
                        Some(std::thread::spawn(move || profile_apiserver(seconds, file)))
                    }
                    _ => None,
                };
                let webhook_pid = match webhook {
                    Webhook::None => None,
                    Webhook::Guard => registrations.guard.pid(),
                    Webhook::Floor => Some(registrations.floor_pid),
                };
                let webhook_before = webhook_pid.map(cpu_time).unwrap_or_default();
                let waits_before = ReadWaits::read(admin).await;
                let (before, started) = (cpu_of(&pids), Instant::now());
                let measured = tokio::task::block_in_place(|| load(namespace).run(expect));
                let read_waits = ReadWaits::read(admin).await.since(waits_before);
                let control_plane = cpu_of(&pids)
                    .saturating_sub(before)
                    .saturating_sub(started.elapsed().mul_f64(idle));
                let webhook_cpu = webhook_pid
                    .map(cpu_time)
                    .unwrap_or_default()
                    .saturating_sub(webhook_before);
                if let Some(profile) = profile {
                    profile.join().expect("apiserver profile");
                }
                assert!(
                    measured.unexpected.is_empty(),
                    "{} in {namespace}, {webhook:?}: unexpected answers {:?}",
                    path.name,
                    measured.unexpected
                );
                let per_request = |cpu: Duration| cpu.as_secs_f64() * 1e6 / measured.requests.max(1.0);
                results[webhook as usize][i].push(Run {
                    control_plane_us: per_request(control_plane),
                    webhook_us: per_request(webhook_cpu),
                    read_waits,
                    load: measured,
                });
            }
        }
        eprintln!(
            "bench_apiserver: {} round {}/{} done",
            path.name,
            round + 1,
            args.rounds
        );
    }
    results
}

fn path_rows(path: &Path4, pods: [usize; 2], results: &PathResults, tables: &mut PathTables) {
    let PathTables {
        latency,
        scaling,
        floor,
        cpu,
        waits,
    } = tables;
    let p50 = |r: &[Run]| r.iter().map(|m| m.load.p50_ms).collect::<Vec<_>>();
    let p99 = |r: &[Run]| r.iter().map(|m| m.load.p99_ms).collect::<Vec<_>>();
    let rate = |r: &[Run]| r.iter().map(|m| m.load.rps).collect::<Vec<_>>();
    let control_plane = |r: &[Run]| r.iter().map(|m| m.control_plane_us).collect::<Vec<_>>();
    let all_servers = |r: &[Run]| r.iter().map(|m| m.control_plane_us + m.webhook_us).collect::<Vec<_>>();
    for (i, count) in pods.iter().enumerate() {
        let (on, off) = (
            &results[Webhook::Guard as usize][i],
            &results[Webhook::None as usize][i],
        );
        let ratio = median_ratio(&p50(on), &p50(off));
        latency.row(vec![
            path.name.into(),
            count.to_string(),
            f2(median(&p50(off))),
            f2(median(&p50(on))),
            f2(median(&p99(off))),
            f2(median(&p99(on))),
            format!("{} / {}", rps(median(&rate(off))), rps(median(&rate(on)))),
            goal(ratio, ratio <= path.p50_goal, &format!("≤ {}", path.p50_goal)),
            match path.p99_goal {
                Some(bound) => {
                    let ratio = median_ratio(&p99(on), &p99(off));
                    goal(ratio, ratio <= bound, &format!("≤ {bound}"))
                }
                None => f2(median_ratio(&p99(on), &p99(off))),
            },
        ]);
        let floored = &results[Webhook::Floor as usize][i];
        let webhook = |r: &[Run]| r.iter().map(|m| m.webhook_us).collect::<Vec<_>>();
        let or_dash = |r: &[Run], figure: &dyn Fn(&[Run]) -> Vec<f64>| {
            if r.is_empty() {
                "–".to_owned()
            } else {
                format!("{:.0}", median(&figure(r)))
            }
        };
        cpu.row(vec![
            path.name.into(),
            count.to_string(),
            format!("{:.0}", median(&control_plane(off))),
            or_dash(floored, &control_plane),
            format!("{:.0}", median(&control_plane(on))),
            or_dash(floored, &webhook),
            format!("{:.0}", median(&webhook(on))),
            f2(median_ratio(&all_servers(on), &control_plane(off))),
            f2(ratio),
        ]);
    }
    for (i, count) in pods.iter().enumerate() {
        for (webhook, who) in [(Webhook::Guard, "guard"), (Webhook::None, "no webhook")] {
            let runs = &results[webhook as usize][i];
            let per_delete = |r: &Run| r.read_waits.reads / r.load.requests.max(1.0);
            let mean_wait_ms = |r: &Run| 1e3 * r.read_waits.seconds / r.read_waits.reads.max(1.0);
            waits.row(vec![
                path.name.into(),
                count.to_string(),
                who.into(),
                f2(median(&runs.iter().map(per_delete).collect::<Vec<_>>())),
                f2(median(&runs.iter().map(mean_wait_ms).collect::<Vec<_>>())),
                f2(median(&p50(runs))),
            ]);
        }
    }
    for (webhook, who) in [(Webhook::Guard, "guard"), (Webhook::None, "no webhook")] {
        let (large, small) = (&results[webhook as usize][1], &results[webhook as usize][0]);
        let ratio = median_ratio(&p50(large), &p50(small));
        scaling.row(vec![
            path.name.into(),
            who.into(),
            f2(median(&p50(small))),
            f2(median(&p50(large))),
            goal(ratio, ratio <= 1.2, "≤ 1.2"),
            f2(median_ratio(&p99(large), &p99(small))),
        ]);
    }
    let floor_runs = &results[Webhook::Floor as usize];
    for (i, count) in pods.iter().enumerate().filter(|(i, _)| !floor_runs[*i].is_empty()) {
        let [none, guard, floored] =
            [Webhook::None, Webhook::Guard, Webhook::Floor].map(|w| p50(&results[w as usize][i]));
        floor.row(vec![
            path.name.into(),
            count.to_string(),
            f2(median(&none)),
            f2(median(&floored)),
            f2(median(&guard)),
            f2(median_ratio(&floored, &none)),
            f2(median_ratio(&guard, &none)),
            f2(median_ratio(&guard, &floored)),
        ]);
    }
}

/// The tables the delete paths fill.
struct PathTables {
    latency: Table,
    scaling: Table,
    floor: Table,
    cpu: Table,
    waits: Table,
}

// === reconciler load ===

/// The `jti` of the service-account token in a kubeconfig: the audit log names each
/// token's requests by it (`authentication.kubernetes.io/credential-id`).
fn token_id(kubeconfig: &Path) -> Option<String> {
    let text = std::fs::read_to_string(kubeconfig).ok()?;
    let token = text.lines().find_map(|line| line.trim().strip_prefix("token: "))?;
    let claims = URL_SAFE_NO_PAD.decode(token.split('.').nth(1)?).ok()?;
    let claims: Value = serde_json::from_slice(&claims).ok()?;
    Some(format!("JTI={}", claims["jti"].as_str()?))
}

struct Spawned {
    workers: usize,
    failed: usize,
    /// From the first spawn to the last.
    spawning: Duration,
    latencies_ms: Vec<f64>,
    not_adopted: usize,
    secrets_left: usize,
    /// Requests of the guard's user: per credential, per "verb resource".
    requests: BTreeMap<String, BTreeMap<String, usize>>,
    /// What the apiserver's priority and fairness did with the guard's requests.
    flow: FlowStats,
}

/// The apiserver's priority-and-fairness figures for the guard's requests (its service
/// account's flow schema), from `/metrics`: cumulative, so a run takes a difference.
#[derive(Debug, Default, Clone, Copy)]
struct FlowStats {
    /// Requests admitted to run.
    requests: f64,
    /// Of those, estimated at more than one seat.
    wide: f64,
    /// Of those, queued for more than 0.1 s and more than 1 s before running.
    waited_100ms: f64,
    waited_1s: f64,
    /// Seconds spent queued, in all.
    wait_seconds: f64,
    /// Requests rejected (queue full or queued too long: a 429 for the guard).
    rejected: f64,
}

/// The flow schema that matches the guard's service account (Kubernetes' default set).
const GUARD_FLOW: &str = "flow_schema=\"service-accounts\"";

impl FlowStats {
    async fn read(admin: &Client) -> Self {
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = admin.request_text(request).await.unwrap();
        // The sum of a metric's samples in the guard's flow whose labels include all of `with`.
        let sum = |name: &str, with: &[&str]| -> f64 {
            text.lines()
                .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
                .filter(|line| line.contains(GUARD_FLOW) && with.iter().all(|label| line.contains(label)))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        let (wait, seats, ran) = (
            "apiserver_flowcontrol_request_wait_duration_seconds",
            "apiserver_flowcontrol_work_estimated_seats",
            "execute=\"true\"",
        );
        let admitted = sum(&format!("{wait}_count"), &[ran]);
        Self {
            requests: admitted,
            wide: sum(&format!("{seats}_count"), &[]) - sum(&format!("{seats}_bucket"), &["le=\"1\""]),
            waited_100ms: admitted - sum(&format!("{wait}_bucket"), &[ran, "le=\"0.1\""]),
            waited_1s: admitted - sum(&format!("{wait}_bucket"), &[ran, "le=\"1\""]),
            wait_seconds: sum(&format!("{wait}_sum"), &[ran]),
            rejected: sum("apiserver_flowcontrol_rejected_requests_total", &[]),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            requests: self.requests - before.requests,
            wide: self.wide - before.wide,
            waited_100ms: self.waited_100ms - before.waited_100ms,
            waited_1s: self.waited_1s - before.waited_1s,
            wait_seconds: self.wait_seconds - before.wait_seconds,
            rejected: self.rejected - before.rejected,
        }
    }
}

async fn spawn_workers(args: &Args, admin: &Client, namespace: &str) -> Spawned {
    let hatchery = "bench-hatchery";
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);

    // When each secret was first seen with an ownerReference.
    let adopted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = tokio::spawn({
        let adopted = adopted.clone();
        let metadata: Api<PartialObjectMeta<Secret>> = Api::namespaced(admin.clone(), namespace);
        let config = watcher::Config::default().labels(&format!("CDS_HATCHERY_NAME={hatchery}"));
        async move {
            let mut events = std::pin::pin!(watch_stream(metadata, config));
            while let Some(event) = events.next().await {
                let secret = match event {
                    Ok(watcher::Event::Apply(secret) | watcher::Event::InitApply(secret)) => secret,
                    _ => continue,
                };
                if secret.metadata.owner_references.as_ref().is_some_and(|o| !o.is_empty()) {
                    let name = secret.metadata.name.unwrap_or_default();
                    adopted.lock().unwrap().entry(name).or_insert_with(Instant::now);
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    let flow_before = FlowStats::read(admin).await;
    let start_ts = Timestamp::now();
    let start = Instant::now();
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut tasks = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / args.spawn_rate));
    let mut n = 0usize;
    let mut spawning = Duration::ZERO;
    while start.elapsed() < args.spawn_duration {
        ticks.tick().await;
        spawning = start.elapsed();
        let worker = format!("w-{n:05}");
        n += 1;
        let (secrets, pods, created, updates) = (secrets.clone(), pods.clone(), created.clone(), args.status_updates);
        tasks.push(tokio::spawn(async move {
            secrets
                .create(&PostParams::default(), &worker_secret(&worker, hatchery))
                .await?;
            pods.create(&PostParams::default(), &worker_pod(&worker, hatchery))
                .await?;
            created
                .lock()
                .unwrap()
                .insert(format!("cds-worker-config-{worker}"), Instant::now());
            for i in 0..updates {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let phase = if i + 1 == updates { "Succeeded" } else { "Running" };
                let status = json!({"status": {
                    "phase": phase,
                    "message": format!("status update {}", i + 1),
                    "conditions": [{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" },
                                    "lastTransitionTime": Timestamp::now().to_string()}],
                }});
                pods.patch_status(&worker, &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
            }
            pods.delete(&worker, &DeleteParams::default()).await?;
            Ok::<_, kube::Error>(())
        }));
    }
    let mut failed = 0;
    for task in tasks {
        let error = match task.await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        failed += 1;
        if failed <= 3 {
            eprintln!("bench_apiserver: a worker failed: {error}");
        }
    }

    // The garbage collector deletes each secret once its pod is gone.
    let selector = ListParams::default().labels(&format!("CDS_HATCHERY_NAME={hatchery}"));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut secrets_left;
    loop {
        secrets_left = secrets.list_metadata(&selector).await.unwrap().items.len();
        if secrets_left == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Let the guards finish what the last deletions started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end_ts = Timestamp::now();
    let flow = FlowStats::read(admin).await.since(flow_before);
    watch.abort();

    let created = created.lock().unwrap().clone();
    let adopted = adopted.lock().unwrap().clone();
    let latencies_ms: Vec<f64> = created
        .iter()
        .filter_map(|(secret, at)| {
            let owned = adopted.get(secret)?;
            Some(owned.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    Spawned {
        workers: n,
        failed,
        spawning,
        not_adopted: created.len() - latencies_ms.len(),
        latencies_ms,
        secrets_left,
        requests: guard_requests(namespace, start_ts, end_ts),
        flow,
    }
}

/// The guard's requests on the objects of `namespace` between two times, from the
/// apiserver's audit log: per token (`credential-id`), per "verb resource[/subresource]",
/// each request once. Only that namespace: a guard that starts also reconciles the pods
/// already in the cluster (the 10,000 of the memory run: one GET each), which is not the
/// cost of a spawned worker.
fn guard_requests(namespace: &str, from: Timestamp, to: Timestamp) -> BTreeMap<String, BTreeMap<String, usize>> {
    let (from, to) = (format!("{from:.6}"), format!("{to:.6}"));
    // Not `apiserver_audit()`: it keeps every event of the run, and a run logs 400 MB.
    let text: String = audit_log_files()
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .collect();
    let mut seen = BTreeSet::new();
    let mut counts: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for event in text.lines().filter_map(|line| serde_json::from_str::<Value>(line).ok()) {
        if event["user"]["username"] != GUARD_USER || event["objectRef"]["namespace"] != namespace {
            continue;
        }
        let at = event["requestReceivedTimestamp"].as_str().unwrap_or_default();
        // RFC 3339 in UTC: compares as a string (microseconds in the log, and in ours).
        if at < from.as_str() || at > to.as_str() || !seen.insert(event["auditID"].to_string()) {
            continue;
        }
        let credential = event["user"]["extra"]["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .unwrap_or("all")
            .to_owned();
        let object = &event["objectRef"];
        let mut resource = object["resource"].as_str().unwrap_or("?").to_owned();
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let mut verb = event["verb"].as_str().unwrap_or("?").to_owned();
        let uri = event["requestURI"].as_str().unwrap_or_default();
        if verb == "list" && uri.contains("labelSelector") {
            verb = "list (label)".to_owned();
        }
        *counts
            .entry(credential)
            .or_default()
            .entry(format!("{verb} {resource}"))
            .or_default() += 1;
    }
    counts
}

fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One reconciler run: how many replicas, what they did, and each replica's name and token id.
struct ReconcilerRun {
    replicas: usize,
    spawned: Spawned,
    names: Vec<(String, Option<String>)>,
}

async fn reconciler_run(args: &Args, admin: &Client, replicas: usize) -> ReconcilerRun {
    // Replica 1 is registered (its webhooks see the pod creates and the GC's deletes);
    // replica 2 only reconciles. Each has its own token, so the audit log tells them apart.
    let first = Guard::start();
    let mut names = vec![(
        "replica 1 (webhooks + reconciler)".to_owned(),
        token_id(guard_kubeconfig()),
    )];
    let second = (replicas > 1).then(|| {
        let kubeconfig = service_account_kubeconfig("cds-secret-guard", "cds-secret-guard");
        names.push(("replica 2 (reconciler only)".to_owned(), token_id(&kubeconfig)));
        Guard::start_with(GuardOptions {
            kubeconfig,
            env: Vec::new(),
            register: None,
        })
    });
    let namespace = TestNamespace::new("bench-spawn").await;
    // A guard that starts reconciles every worker pod present (the --pods fillers: a
    // quorum GET each); spawning before that is done measures the start-up, not a worker.
    for guard in std::iter::once(&first).chain(&second) {
        settle(guard.pid().unwrap()).await;
    }
    let spawned = spawn_workers(args, admin, &namespace.name).await;
    drop(second);
    drop(first);
    ReconcilerRun {
        replicas,
        spawned,
        names,
    }
}

/// Waits until the process has used under 20 ms of CPU in a second (at most 2 minutes).
async fn settle(pid: u32) {
    let started = Instant::now();
    let mut before = cpu_time(pid);
    while started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_time(pid);
        if now.saturating_sub(before) < Duration::from_millis(20) {
            eprintln!("bench_apiserver: guard {pid} settled after {:?}", started.elapsed());
            return;
        }
        before = now;
    }
    eprintln!("bench_apiserver: guard {pid} still busy after {:?}", started.elapsed());
}

fn reconciler_tables(args: &Args, runs: &[ReconcilerRun]) {
    let mut load = Table::new(
        format!(
            "Reconciler load: the guard's apiserver requests per spawned worker ({} spawns/s for {:?}, {} status updates each; audit log)",
            args.spawn_rate, args.spawn_duration, args.status_updates
        ),
        &[
            "replicas",
            "replica",
            "requests/worker",
            "ratio to 1 replica",
            "breakdown per worker",
        ],
    );
    let mut latency = Table::new(
        "Ownership latency: pod created → ownerReference on its secret (seen by a watch)",
        &[
            "replicas",
            "workers",
            "spawns/s achieved",
            "failed",
            "p50 ms",
            "p99 ms",
            "p50 ratio to 1 replica",
            "not adopted",
            "secrets left after GC",
        ],
    );
    let mut fairness = Table::new(
        "Priority and fairness: the guard's requests in the apiserver's queues while workers were spawned (apiserver /metrics)",
        &[
            "replicas",
            "requests",
            "estimated > 1 seat",
            "queued > 0.1 s",
            "queued > 1 s",
            "mean queued ms",
            "rejected (429)",
        ],
    );
    let mut single_per_worker = f64::NAN;
    let mut single_p50 = f64::NAN;
    for ReconcilerRun {
        replicas,
        spawned,
        names,
    } in runs
    {
        let workers = spawned.workers.max(1) as f64;
        // Replicas in the order they were started; a log without credential ids counts
        // all of them together.
        let mut rows: Vec<(String, &BTreeMap<String, usize>, f64)> = Vec::new();
        for (name, id) in names {
            if let Some(counts) = id.as_ref().and_then(|id| spawned.requests.get(id)) {
                rows.push((name.clone(), counts, 1.0));
            }
        }
        if rows.is_empty()
            && let Some(all) = spawned.requests.get("all")
        {
            rows.push((
                format!("all {replicas} (no credential ids in the log)"),
                all,
                *replicas as f64,
            ));
        }
        for (name, counts, share) in rows {
            let total = counts.values().sum::<usize>() as f64 / workers / share;
            if *replicas == 1 {
                single_per_worker = total;
            }
            let breakdown = counts
                .iter()
                .map(|(what, n)| format!("{what} {:.2}", *n as f64 / workers / share))
                .collect::<Vec<_>>()
                .join(", ");
            load.row(vec![
                replicas.to_string(),
                name,
                f2(total),
                f2(total / single_per_worker),
                breakdown,
            ]);
        }
        let p50 = percentile(&spawned.latencies_ms, 50.0);
        if *replicas == 1 {
            single_p50 = p50;
        }
        latency.row(vec![
            replicas.to_string(),
            spawned.workers.to_string(),
            format!(
                "{:.1}",
                spawned.workers as f64 / spawned.spawning.as_secs_f64().max(1e-3)
            ),
            spawned.failed.to_string(),
            f2(p50),
            f2(percentile(&spawned.latencies_ms, 99.0)),
            f2(p50 / single_p50),
            spawned.not_adopted.to_string(),
            spawned.secrets_left.to_string(),
        ]);
        let flow = spawned.flow;
        fairness.row(vec![
            replicas.to_string(),
            format!("{:.0}", flow.requests),
            format!("{:.0}", flow.wide),
            format!("{:.0}", flow.waited_100ms),
            format!("{:.0}", flow.waited_1s),
            f2(flow.wait_seconds * 1000.0 / flow.requests.max(1.0)),
            format!("{:.0}", flow.rejected),
        ]);
    }
    load.note(
        "Counted: every request of system:serviceaccount:cds-secret-guard:cds-secret-guard on an object of \
         the spawn namespace received while workers were spawned and until their secrets were collected \
         (+3 s), each audit ID once (the cluster-wide watches, and the start-up reconcile of the pods already \
         present, are not a spawned worker's cost: spawning starts once each guard's CPU has settled after \
         that start-up reconcile). Replica 1 is the registered one: its lines include the webhooks' lookups.",
    );
    fairness.note(
        "All replicas together (flow schema service-accounts, priority level workload-low), cluster-wide. \
         A LIST is charged by the memory it may load: a LIST of pods without a limit, with thousands of pods \
         stored, costs up to 10 seats, held while it waits for the watch cache to catch up.",
    );
    load.print();
    latency.print();
    fairness.print();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("no rustls crypto provider installed yet");
    control_plane();
    let admin = client().await;
    let _ = unregister_webhooks();
    eprintln!("bench_apiserver: apiserver {}", apiserver_url());

    // Two namespaces: --pods, and 10 pods (the reconciler alone needs only the first).
    let large = TestNamespace::new("bench-10k").await;
    if args.reconciler_only {
        create_fillers(&admin, &large.name, args.pods).await;
        reconciler_runs(&args, &admin).await;
        return;
    }
    let small = TestNamespace::new("bench-10").await;
    create_fillers(&admin, &small.name, 10).await;
    let elsewhere = TestNamespace::new("bench-elsewhere").await;

    // A guard with the default grace period, for the young path; registered once (the
    // harness checks it works), then toggled.
    let grace = |period: &str| GuardOptions {
        env: vec![("CDS_GUARD_GRACE_PERIOD".into(), period.into())],
        ..GuardOptions::default()
    };
    let guard = Guard::start_with(grace("10m"));
    assert!(unregister_webhooks());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_small = rss_mib(guard.pid().unwrap());
    let took = create_fillers(&admin, &large.name, args.pods).await;
    eprintln!("bench_apiserver: {} pods created in {took:?}", args.pods);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_large_grown = rss_mib(guard.pid().unwrap());

    // The secrets of the three paths in both namespaces; the live one's pod.
    for namespace in [&small, &large] {
        for worker in ["live", "orphan", "young"] {
            namespace
                .secrets()
                .create(&PostParams::default(), &worker_secret(worker, "bench-paths"))
                .await
                .unwrap();
        }
        for pod in [worker_pod("live", "bench-paths"), labelled_pod("churn")] {
            namespace.pods().create(&PostParams::default(), &pod).await.unwrap();
        }
    }
    let namespaces = [small.name.as_str(), large.name.as_str()];
    let pods = [10, args.pods];
    let probe = small.secrets();

    let latency = Table::new(
        format!(
            "Apiserver path: secret DELETE ?dryRun=All as admin, oha {} connections (HTTP/1.1), {} rounds of {:?}, with/without the guard alternating (medians)",
            args.connections, args.rounds, args.duration
        ),
        &[
            "path",
            "pods in namespace",
            "p50 ms no webhook",
            "p50 ms guard",
            "p99 ms no webhook",
            "p99 ms guard",
            "req/s no webhook / guard",
            "p50 guard / no webhook (goal)",
            "p99 guard / no webhook (goal, where set)",
        ],
    );
    let scaling = Table::new(
        format!(
            "Apiserver path: {} pods in the namespace vs 10 (same rounds)",
            args.pods
        ),
        &[
            "path",
            "webhook",
            "p50 ms 10 pods",
            format!("p50 ms {} pods", args.pods).as_str(),
            "p50 ratio (goal ≤ 1.2)",
            "p99 ratio",
        ],
    );

    let floor = Table::new(
        "Apiserver path: the floor, the cheapest webhook that answers as the guard does on the path (`examples/ceiling --deny` or `--allow`: the guard's TLS and HTTP stack, echoing the uid at once) registered in the guard's place (same rounds)",
        &[
            "path",
            "pods in namespace",
            "p50 ms no webhook",
            "p50 ms floor",
            "p50 ms guard",
            "p50 floor / no webhook",
            "p50 guard / no webhook",
            "p50 guard / floor",
        ],
    );
    let cpu = Table::new(
        "Apiserver path: CPU per delete (same rounds; /proc times of the apiserver and etcd over each run less their idle rate measured before the path, and of the webhook's server, divided by the run's requests)",
        &[
            "path",
            "pods in namespace",
            "µs apiserver + etcd: no webhook",
            "floor",
            "guard",
            "µs webhook server: floor",
            "guard",
            "CPU with the guard (all) / no webhook",
            "p50 guard / no webhook",
        ],
    );
    if let Some(dir) = &args.apiserver_profiles {
        std::fs::create_dir_all(dir).unwrap();
    }
    let waits = Table::new(
        "Apiserver path: the apiserver's waits for its pods watch cache to catch up with etcd before a consistent read (`apiserver_watch_cache_read_wait_seconds{resource=\"pods\"}`, differences over each run; same rounds, medians)",
        &[
            "path",
            "pods in namespace",
            "webhook",
            "pod cache reads per delete",
            "mean wait ms per read",
            "p50 ms of the delete",
        ],
    );
    let mut tables = PathTables {
        latency,
        scaling,
        floor,
        cpu,
        waits,
    };
    let measured = |path: &Path4| args.paths.is_empty() || args.paths.iter().any(|key| key == path.key);
    let (floors, registrations) = both_floors(&guard, &probe);
    if measured(&PATHS[0]) {
        let young = measure_path(
            &args,
            &admin,
            registrations.for_path(&PATHS[0]),
            namespaces,
            &elsewhere.name,
            &PATHS[0],
        )
        .await;
        path_rows(&PATHS[0], pods, &young, &mut tables);
    }
    drop(registrations);
    drop((guard, floors));

    // Old secrets from here on: a guard with a 1 s grace period.
    let guard = Guard::start_with(grace("1s"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss_large_fresh = rss_mib(guard.pid().unwrap());
    let (floors, registrations) = both_floors(&guard, &probe);
    for path in PATHS[1..].iter().filter(|path| measured(path)) {
        let results = measure_path(
            &args,
            &admin,
            registrations.for_path(path),
            namespaces,
            &elsewhere.name,
            path,
        )
        .await;
        path_rows(path, pods, &results, &mut tables);
    }
    drop(registrations);
    drop((guard, floors));
    let PathTables {
        mut latency,
        scaling,
        floor,
        mut cpu,
        mut waits,
    } = tables;
    latency.note(
        "Each path's secret is protected; the live pod is named after its worker (one more pod in each namespace, \
         and the `churn` pod). Deny by age runs a guard with the default grace period (10m), the others one with 1s. \
         \"Worker pods changing\": the `churn` pod of each namespace is patched every 5 ms during the measurements, \
         with and without the guard alike: the label LIST under a moving pod watch cache. \
         \"ConfigMaps written elsewhere\": another client creates ConfigMaps in a namespace of its own at that rate, \
         with and without the guard alike; \"paced\": the deletes come at that rate in all (open loop), not back to back.",
    );
    latency.print();
    scaling.print();
    floor.print();
    cpu.note(
        "On a machine whose cores the load saturates, latency follows the CPU each request costs: \
         compare the last two columns.",
    );
    cpu.print();
    waits.note(
        "Since 1.31 the apiserver serves a consistent LIST from its watch cache once that cache has caught up with \
         etcd's current revision. Writes to other resources move the revision, not the pods cache: it learns it is \
         current from a progress notification, which the apiserver asks etcd for at most every 100 ms while reads wait \
         (k8s.io/apiserver storage/cacher/progress, `progressRequestPeriod`).",
    );
    waits.print();

    let mut memory = Table::new(
        "Guard memory (VmRSS) with worker pods present",
        &["guard", "VmRSS MiB", "ratio to 10 pods"],
    );
    memory.row(vec!["started with 10 worker pods".into(), f2(rss_small), "1.00".into()]);
    memory.row(vec![
        format!("same process after {} more were created", args.pods),
        f2(rss_large_grown),
        f2(rss_large_grown / rss_small),
    ]);
    memory.row(vec![
        format!("started with {} worker pods present", args.pods),
        f2(rss_large_fresh),
        f2(rss_large_fresh / rss_small),
    ]);
    memory.print();

    if !args.no_reads {
        candidate_reads(&args, &admin, &small.name, &elsewhere.name).await;
    }
    if !args.no_reconciler {
        reconciler_runs(&args, &admin).await;
    }
    // Deleting 10,000 pods is the namespace controller's work: only once all is measured.
    drop((small, large, elsewhere));
}

// === the reads that could prove a worker has no pod ===

/// A read the guard could make to learn, after a delete arrived, that its worker has no
/// pod: each timed alone, against the apiserver, as the guard's service account would.
#[derive(Debug, Clone, Copy)]
enum Read {
    /// GET of the pod by name (no resourceVersion): served by etcd.
    GetByName,
    /// LIST by the worker label (no resourceVersion), what the guard sends.
    LabelList,
    /// LIST of the one name (no resourceVersion): the guard's namesake and revision read.
    NameList,
    /// The current revision from a LIST of Events (which have no watch cache, so etcd
    /// answers), then the label LIST at exactly that revision.
    ExactAfterRevision,
    /// The label LIST at any age (`resourceVersion=0`): what the cache answers without
    /// waiting. It may miss a pod: never a proof of absence, only the cache's own cost.
    AnyAge,
}

const READS: [(Read, &str, &str); 5] = [
    (Read::GetByName, "GET pod by name", "the name only"),
    (Read::LabelList, "LIST by label (the guard's)", "yes"),
    (Read::NameList, "LIST of the one name", "the name only"),
    (
        Read::ExactAfterRevision,
        "revision from Events (etcd), then LIST by label at exactly it",
        "yes",
    ),
    (Read::AnyAge, "LIST by label, resourceVersion=0", "no: may miss a pod"),
];

impl Read {
    async fn once(self, pods: &Api<PartialObjectMeta<Pod>>, events: &Api<Event>, worker: &str) {
        let label = ListParams::default()
            .labels(&format!("CDS_WORKER_NAME={worker}"))
            .limit(10);
        match self {
            Self::GetByName => drop(pods.get_metadata_opt(worker).await.unwrap()),
            Self::LabelList => drop(pods.list_metadata(&label).await.unwrap()),
            Self::NameList => {
                let named = ListParams::default().fields(&format!("metadata.name={worker}"));
                drop(pods.list_metadata(&named).await.unwrap());
            }
            Self::ExactAfterRevision => {
                let revision = events.list_metadata(&ListParams::default().limit(1)).await.unwrap();
                let revision = revision.metadata.resource_version.expect("a list has a revision");
                let exact = label.at(&revision).matching(VersionMatch::Exact);
                drop(pods.list_metadata(&exact).await.unwrap());
            }
            Self::AnyAge => drop(pods.list_metadata(&label.match_any()).await.unwrap()),
        }
    }

    /// Latencies in ms: `readers` back to back for `duration`, or one reader every
    /// `every` when paced.
    async fn timed(
        self,
        admin: &Client,
        namespace: &str,
        readers: usize,
        every: Option<Duration>,
        duration: Duration,
    ) -> Vec<f64> {
        let (pods, events) = (
            Api::namespaced(admin.clone(), namespace),
            Api::namespaced(admin.clone(), namespace),
        );
        let deadline = Instant::now() + duration;
        let reader = |pods: Api<PartialObjectMeta<Pod>>, events: Api<Event>| async move {
            let mut ticks = every.map(tokio::time::interval);
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                if let Some(ticks) = &mut ticks {
                    ticks.tick().await;
                }
                let started = Instant::now();
                self.once(&pods, &events, "orphan").await;
                latencies.push(started.elapsed().as_secs_f64() * 1e3);
            }
            latencies
        };
        futures::future::join_all((0..readers).map(|_| reader(pods.clone(), events.clone())))
            .await
            .concat()
    }
}

/// Times each [`Read`] in `namespace` quiet, then beside the ConfigMap writer at 50/s in
/// `elsewhere`, back to back on `--connections` readers and paced at 5 reads a second.
async fn candidate_reads(args: &Args, admin: &Client, namespace: &str, elsewhere: &str) {
    let mut table = Table::new(
        format!(
            "Reads that could show a worker has no pod, timed alone against the apiserver: quiet, and while 50 ConfigMaps/s are written elsewhere; {} readers back to back, or one reader paced at 5/s; {:?} each (p50 / p99 ms)",
            args.connections, args.duration
        ),
        &[
            "read",
            "shows every pod of the worker",
            "quiet, back to back",
            "writer, back to back",
            "writer, paced",
            "writer, back to back: mean pod cache wait ms",
        ],
    );
    for (read, name, proves) in READS {
        let mut cells = vec![name.to_owned(), proves.to_owned()];
        let mut wait = String::new();
        for (writer, readers, every) in [
            (Writer::Quiet, args.connections, None),
            (Writer::ConfigMapsElsewhere(50), args.connections, None),
            (Writer::ConfigMapsElsewhere(50), 1, Some(Duration::from_millis(200))),
        ] {
            let _writing = Writing::start(admin, [namespace, namespace], elsewhere, writer);
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = ReadWaits::read(admin).await;
            let latencies = read.timed(admin, namespace, readers, every, args.duration).await;
            let waits = ReadWaits::read(admin).await.since(before);
            cells.push(format!(
                "{} / {}",
                f2(percentile(&latencies, 50.0)),
                f2(percentile(&latencies, 99.0))
            ));
            if writer != Writer::Quiet && every.is_none() {
                wait = f2(1e3 * waits.seconds / waits.reads.max(1.0));
            }
        }
        cells.push(wait);
        table.row(cells);
        eprintln!("bench_apiserver: read {name} timed");
    }
    table.note(
        "Only a GET (and a LIST of one name at a past revision) goes to etcd; since 1.34 even a LIST at an exact \
         revision newer than the pods cache waits for the cache (`ListFromCacheSnapshot`). A paced reader finds the \
         apiserver's progress requester idle and is answered after one progress notification; readers back to back \
         arrive just after one and wait for the next, up to 100 ms later.",
    );
    table.print();
}

async fn reconciler_runs(args: &Args, admin: &Client) {
    let mut runs = Vec::new();
    for replicas in [1, 2] {
        let run = reconciler_run(args, admin, replicas).await;
        eprintln!(
            "bench_apiserver: reconciler with {replicas} replica(s): {} workers, {} failed",
            run.spawned.workers, run.spawned.failed
        );
        runs.push(run);
    }
    reconciler_tables(args, &runs);
}
