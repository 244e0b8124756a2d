//! In-use protection on the apiserver's path, on the local control plane (`make bench`
//! runs it on a control plane of its own; see docs/design/benchmarks.md):
//!
//! 1. **Deletes** of a ConfigMap in an opted-in namespace (`dryRun=All`, so nothing
//!    changes), one after the other as admin, with the guard's webhooks registered
//!    (`webhooks --in-use-protection`) and without any, alternately: the deny path (a pod
//!    uses the ConfigMap) and the allow path (no pod does), in a namespace of 10 pods and
//!    in one of `--pods`. Twice: with the cluster's pods quiet, and with a pod elsewhere
//!    written every `--churn-ms` (its events let the guard's pod index prove itself
//!    current, so that an allow reads the index in place of a LIST).
//! 2. **Deferred deletes** (`defer`): the same dry-run delete of a ConfigMap the guard holds
//!    (its finalizer on it), with the webhooks, with them pointed at a ceiling that allows
//!    at once (the floor), and without, 10 and `--pods` pods, with the
//!    cluster quiet and beside a writer creating `--writes-per-second` ConfigMaps in another
//!    namespace. Then what the guard writes to the apiserver, per object and per pod
//!    created, and what opting in a namespace of `--opt-in-pods` pods costs (time, writes,
//!    memory), against the same without protection.
//! 3. **`helm uninstall`** of a release of 100 ConfigMaps, 100 Secrets and a Deployment of
//!    two pods using some of them, in an opted-in namespace, with the guard and without.
//!
//! The guard runs as the service account `tests/controlplane/e2e_in_use.rs` gives it, `enabled` meaning
//! `refuse`; the deferred deletes' namespaces are labelled `defer`. Prints tables.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bench_support;
use testkit::cluster as e2e;

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use bench_support::{CeilingAnswer, Table, f2, goal, median, median_ratio, start_ceiling};
use clap::Parser;
use e2e::{
    Guard, TestNamespace, client, control_plane, in_use_guard_options, kubectl, metric, repo, unregister_webhooks,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// Alternating rounds of each case.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Deletes per run.
    #[arg(long, default_value_t = 100)]
    deletes: usize,
    /// Pods in the large namespace.
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// How often a pod elsewhere is written, in the second run of the delete paths; 0
    /// skips that run.
    #[arg(long, default_value_t = 10)]
    churn_ms: u64,
    /// Skip the `helm uninstall` runs.
    #[arg(long)]
    no_uninstall: bool,
    /// ConfigMaps the writer creates a second in another namespace, in the second run of
    /// the deferred deletes; 0 skips that run.
    #[arg(long, default_value_t = 50)]
    writes_per_second: u64,
    /// Pods (each using a ConfigMap of its own) in the namespace opted in at once.
    #[arg(long, default_value_t = 1_000)]
    opt_in_pods: usize,
    /// Skip the deferred deletes.
    #[arg(long)]
    no_defer: bool,
    /// Skip the refusals and allows (`enabled`, meaning `refuse`).
    #[arg(long)]
    no_refuse: bool,
}

const OPT_IN: &str = "cds-secret-guard/in-use-protection=enabled";
const DEFER: &str = "cds-secret-guard/in-use-protection=defer";
const FINALIZER: &str = "cds-secret-guard.io/in-use";

/// Whether the guard's webhooks are registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Webhook {
    None = 0,
    Guard = 1,
    /// The guard's webhooks pointed at `examples/ceiling --allow`, which allows at once
    /// with a warning: what calling any webhook that allows costs the apiserver.
    Floor = 2,
}

impl Webhook {
    /// Which goes first in `round`: each in turn, so that neither always runs on a warmer
    /// apiserver.
    fn order(round: usize) -> [Self; 2] {
        if round.is_multiple_of(2) {
            [Self::Guard, Self::None]
        } else {
            [Self::None, Self::Guard]
        }
    }

    /// [`Webhook::order`] with the floor: each of the three first in turn.
    fn order_with_floor(round: usize) -> [Self; 3] {
        match round % 3 {
            0 => [Self::Guard, Self::None, Self::Floor],
            1 => [Self::None, Self::Floor, Self::Guard],
            _ => [Self::Floor, Self::Guard, Self::None],
        }
    }
}

/// The floor's warning, as the probe's answer carries it.
const FLOOR_WARNING: &str = "allowed by the ceiling";

/// The webhook configurations of a running guard, registered or not at will, and of the
/// floor when it runs.
struct Registration<'a> {
    guard: &'a Guard,
    probe: Api<ConfigMap>,
    /// The guard's validating configuration pointed at the floor.
    floor_yaml: Option<PathBuf>,
}

impl Registration<'_> {
    /// Registers (or removes) the webhooks, and waits until a dry-run delete of the used
    /// ConfigMap of the probe namespace is answered by them: refused by the guard, let
    /// through with the floor's warning, or let through.
    async fn set(&self, webhook: Webhook) {
        let yaml = match webhook {
            Webhook::Guard => Some(self.guard.webhooks_yaml()),
            Webhook::Floor => Some(self.floor_yaml.clone().expect("a floor")),
            Webhook::None => None,
        };
        match yaml {
            Some(yaml) => {
                let applied = kubectl().args(["apply", "-f"]).arg(yaml).output().unwrap();
                assert!(applied.status.success(), "{applied:?}");
            }
            None => assert!(unregister_webhooks(), "unregister the webhooks"),
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answering().await != webhook {
            assert!(Instant::now() < deadline, "{webhook:?} never took effect");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Who answers a dry-run delete of the probe's used ConfigMap.
    async fn answering(&self) -> Webhook {
        let namespace = self.probe.namespace().expect("the probe is namespaced");
        let request = http::Request::delete(format!("/api/v1/namespaces/{namespace}/configmaps/used?dryRun=All"))
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
        match response.status().as_u16() {
            403 => Webhook::Guard,
            _ if warned => Webhook::Floor,
            _ => Webhook::None,
        }
    }
}

/// An opted-in namespace of `pods` pods naming nothing, the ConfigMap `used` and a pod
/// using it, and the ConfigMap `unused`.
async fn namespace(prefix: &str, pods: usize) -> TestNamespace {
    namespace_labelled(prefix, pods, OPT_IN).await
}

/// [`namespace`], opted in with `label`.
async fn namespace_labelled(prefix: &str, pods: usize, label: &str) -> TestNamespace {
    let ns = TestNamespace::new(prefix).await;
    let labelled = kubectl()
        .args(["label", "namespace", &ns.name, label])
        .output()
        .unwrap();
    assert!(labelled.status.success(), "{labelled:?}");
    let config_maps: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    for name in ["used", "unused"] {
        let config_map = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap();
        config_maps.create(&PostParams::default(), &config_map).await.unwrap();
    }
    let user = pod("user", Some("used"));
    ns.pods().create(&PostParams::default(), &user).await.unwrap();
    let started = Instant::now();
    stream::iter(0..pods.saturating_sub(1))
        .map(|i| {
            let pods = ns.pods();
            async move {
                pods.create(&PostParams::default(), &pod(&format!("filler-{i:05}"), None))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("create the pods");
    eprintln!("bench_in_use: {} pods in {} in {:?}", pods, ns.name, started.elapsed());
    ns
}

/// A pod, not scheduled (the control plane has no node), using `config_map` if given.
fn pod(name: &str, config_map: Option<&str>) -> Pod {
    let env_from = config_map.map(|name| json!([{"configMapRef": {"name": name}}]));
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "busybox", "envFrom": env_from.unwrap_or(json!([]))}]},
    }))
    .unwrap()
}

/// `count` dry-run deletes of `name`, one after the other: their latencies in ms.
async fn deletes(client: &Client, namespace: &str, name: &str, count: usize, refused: bool) -> Vec<f64> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        let answer = config_maps.delete(name, &DeleteParams::default().dry_run()).await;
        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(answer.is_err(), refused, "{name} in {namespace}: {:?}", answer.err());
    }
    latencies
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50 and p99 of each run, per case.
#[derive(Default)]
struct Runs {
    p50: Vec<f64>,
    p99: Vec<f64>,
}

impl Runs {
    fn add(&mut self, latencies: &[f64]) {
        self.p50.push(percentile(latencies, 0.5));
        self.p99.push(percentile(latencies, 0.99));
    }
}

/// Writes a pod of its own namespace every `every`, until dropped.
struct Churn {
    task: tokio::task::JoinHandle<()>,
    _ns: TestNamespace,
}

impl Churn {
    async fn start(every: Duration) -> Self {
        let ns = TestNamespace::new("in-use-bench-churn").await;
        let pods = ns.pods();
        pods.create(&PostParams::default(), &pod("busy", None)).await.unwrap();
        let task = tokio::spawn(async move {
            for i in 0u64.. {
                let patch = json!({"metadata": {"labels": {"tick": i.to_string()}}});
                let _ = pods.patch("busy", &PatchParams::default(), &Patch::Merge(&patch)).await;
                tokio::time::sleep(every).await;
            }
        });
        Self { task, _ns: ns }
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The guard's reads of the users of an opted-in object so far: (from its pod index, by a
/// LIST).
async fn user_reads(guard: &Guard) -> (u64, u64) {
    let text = guard.metrics().await;
    let count = |source: &str| {
        let series = format!("cds_secret_guard_in_use_user_reads_total{{source=\"{source}\"}}");
        metric(&text, &series).map_or(0, |count| count as u64)
    };
    (count("index"), count("list"))
}

/// The guard's resident memory, in MiB.
fn resident_mib(guard: &Guard) -> f64 {
    let pid = guard.pid().expect("the guard runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    kib / 1024.0
}

async fn delete_paths(args: &Args, guard: &Guard) {
    let before = resident_mib(guard);
    let small = namespace("in-use-bench-10", 10).await;
    let large = namespace("in-use-bench-large", args.pods).await;
    // The pod index takes the new pods from its watch.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut memory = Table::new(
        "In-use protection: the guard's resident memory, its pod index holding the benchmark's pods",
        &["pods", "MiB"],
    );
    memory.row(vec!["the cluster's own".to_owned(), f2(before)]);
    memory.row(vec![format!("+ {}", 10 + args.pods), f2(resident_mib(guard))]);
    memory.print();
    delete_paths_in(args, guard, &small, &large, None).await;
    if args.churn_ms > 0 {
        let every = Duration::from_millis(args.churn_ms);
        let _churn = Churn::start(every).await;
        delete_paths_in(args, guard, &small, &large, Some(every)).await;
    }
}

async fn delete_paths_in(
    args: &Args,
    guard: &Guard,
    small: &TestNamespace,
    large: &TestNamespace,
    churn: Option<Duration>,
) {
    let admin = client().await;
    let reads_before = user_reads(guard).await;
    let registration = Registration {
        guard,
        probe: Api::namespaced(admin.clone(), &small.name),
        floor_yaml: None,
    };
    // [namespace][path][webhook]
    let mut runs: Vec<Vec<[Runs; 2]>> = (0..2).map(|_| (0..2).map(|_| Default::default()).collect()).collect();
    for round in 0..args.rounds {
        for webhook in Webhook::order(round) {
            registration.set(webhook).await;
            for (n, ns) in [small, large].into_iter().enumerate() {
                for (p, (name, denied)) in [("used", true), ("unused", false)].into_iter().enumerate() {
                    let refused = denied && webhook == Webhook::Guard;
                    let latencies = deletes(&admin, &ns.name, name, args.deletes, refused).await;
                    runs[n][p][webhook as usize].add(&latencies);
                }
            }
        }
    }
    registration.set(Webhook::Guard).await;
    let reads_after = user_reads(guard).await;

    let mut table = Table::new(
        format!(
            "In-use protection: a ConfigMap delete (dry run), one at a time, {} rounds of {} deletes, {}",
            args.rounds,
            args.deletes,
            match churn {
                None => "the cluster's pods quiet".to_owned(),
                Some(every) => format!("a pod elsewhere written every {} ms", every.as_millis()),
            }
        ),
        &[
            "path",
            "pods",
            "guard p50 ms",
            "no webhook p50 ms",
            "ratio p50",
            "guard p99 ms",
            "no webhook p99 ms",
            "ratio p99",
        ],
    );
    let mut goals = Vec::new();
    for (p, path) in ["deny (a pod uses it)", "allow (no pod does)"].into_iter().enumerate() {
        for (n, pods) in [10, args.pods].into_iter().enumerate() {
            let [none, guarded] = &runs[n][p];
            let ratio = median_ratio(&guarded.p50, &none.p50);
            table.row(vec![
                path.to_owned(),
                pods.to_string(),
                f2(median(&guarded.p50)),
                f2(median(&none.p50)),
                goal(ratio, ratio <= 2.0, "≤ 2.0"),
                f2(median(&guarded.p99)),
                f2(median(&none.p99)),
                f2(median_ratio(&guarded.p99, &none.p99)),
            ]);
        }
        let scale = median(&runs[1][p][1].p50) / median(&runs[0][p][1].p50);
        goals.push(format!(
            "- {path}: guard p50 with {} pods / with 10: {}",
            args.pods,
            goal(scale, scale <= 1.5, "≤ 1.5")
        ));
    }
    for line in goals {
        table.note(line);
    }
    table.note(format!(
        "- the guard's reads of the users (allows; a denial reads its pod index): {} from the index caught up with the revision, {} by a LIST",
        reads_after.0 - reads_before.0,
        reads_after.1 - reads_before.1
    ));
    table.print();
}

// --- deferred deletes ---

/// Creates a ConfigMap of its own namespace `per_second` times a second (and deletes the
/// one created 100 before), until dropped.
struct Writer {
    task: tokio::task::JoinHandle<()>,
    _ns: TestNamespace,
}

impl Writer {
    async fn start(per_second: u64) -> Self {
        let ns = TestNamespace::new("in-use-bench-writer").await;
        let config_maps: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
        let every = Duration::from_secs(1) / u32::try_from(per_second).unwrap();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            for i in 0u64.. {
                ticks.tick().await;
                let config_map = serde_json::from_value(json!({"metadata": {"name": format!("w-{i}")}})).unwrap();
                let _ = config_maps.create(&PostParams::default(), &config_map).await;
                if i >= 100 {
                    let _ = config_maps
                        .delete(&format!("w-{}", i - 100), &DeleteParams::default())
                        .await;
                }
            }
        });
        Self { task, _ns: ns }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether the ConfigMap carries the guard's finalizer.
async fn held(config_maps: &Api<ConfigMap>, name: &str) -> bool {
    config_maps
        .get_metadata_opt(name)
        .await
        .unwrap()
        .and_then(|found| found.metadata.finalizers)
        .is_some_and(|finalizers| finalizers.iter().any(|finalizer| finalizer == FINALIZER))
}

/// Waits until the guard holds every ConfigMap of `names` in `namespace`; how long it took.
async fn all_held(namespace: &str, names: &[String]) -> Duration {
    let config_maps: Api<ConfigMap> = Api::namespaced(client().await, namespace);
    let started = Instant::now();
    loop {
        let listed = config_maps.list_metadata(&ListParams::default()).await.unwrap();
        let held = listed
            .items
            .iter()
            .filter(|found| {
                names.contains(found.metadata.name.as_ref().unwrap())
                    && found
                        .metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|finalizer| finalizer == FINALIZER)
            })
            .count();
        if held == names.len() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{held} of {} held",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The guard's finalizer writes so far: (added, removed).
async fn finalizer_writes(guard: &Guard) -> (u64, u64) {
    let text = guard.metrics().await;
    let count = |action: &str| {
        let series = format!("cds_secret_guard_in_use_finalizer_writes_total{{action=\"{action}\"}}");
        metric(&text, &series).map_or(0, |count| count as u64)
    };
    (count("add"), count("remove"))
}

async fn deferred(args: &Args, guard: &Guard) {
    // The registration's probe: a ConfigMap in use in a namespace that refuses.
    let probe = namespace("in-use-bench-probe", 0).await;
    // The floor: the guard's validating webhooks pointed at a ceiling that allows.
    let floor = start_ceiling(&guard.webhooks_yaml().with_file_name("certs"), CeilingAnswer::Allow);
    let yaml = std::fs::read_to_string(guard.webhooks_yaml()).unwrap();
    let validating = yaml
        .split("\n---")
        .find(|document| document.contains("kind: ValidatingWebhookConfiguration"))
        .expect("the guard's webhooks.yaml has a validating configuration");
    let guard_port = format!(":{}/", guard.admission_addr().port());
    let floor_yaml = guard.webhooks_yaml().with_file_name("floor-in-use-webhook.yaml");
    std::fs::write(
        &floor_yaml,
        validating.replace(&guard_port, &format!(":{}/", floor.addr.port())),
    )
    .unwrap();
    let registration = Registration {
        guard,
        probe: Api::namespaced(client().await, &probe.name),
        floor_yaml: Some(floor_yaml),
    };
    let small = namespace_labelled("in-use-bench-defer-10", 10, DEFER).await;
    let large = namespace_labelled("in-use-bench-defer-large", args.pods, DEFER).await;
    for ns in [&small, &large] {
        all_held(&ns.name, &["used".to_owned()]).await;
    }
    deferred_deletes_in(args, guard, &registration, &small, &large, None).await;
    if args.writes_per_second > 0 {
        let _writer = Writer::start(args.writes_per_second).await;
        deferred_deletes_in(args, guard, &registration, &small, &large, Some(args.writes_per_second)).await;
    }
    drop((small, large, floor));
    writes(guard).await;
    opt_in_cost(args, guard).await;
    drop(probe);
}

async fn deferred_deletes_in(
    args: &Args,
    guard: &Guard,
    registration: &Registration<'_>,
    small: &TestNamespace,
    large: &TestNamespace,
    writer: Option<u64>,
) {
    let admin = client().await;
    let reads_before = user_reads(guard).await;
    // [namespace][webhook]
    let mut runs: Vec<[Runs; 3]> = (0..2).map(|_| Default::default()).collect();
    for round in 0..args.rounds {
        for webhook in Webhook::order_with_floor(round) {
            registration.set(webhook).await;
            for (n, ns) in [small, large].into_iter().enumerate() {
                let latencies = deletes(&admin, &ns.name, "used", args.deletes, false).await;
                runs[n][webhook as usize].add(&latencies);
            }
        }
    }
    registration.set(Webhook::Guard).await;
    let reads_after = user_reads(guard).await;
    let mut table = Table::new(
        format!(
            "In-use protection, defer: a delete of a ConfigMap the guard holds (dry run), one at a time, {} rounds of {} deletes, {}",
            args.rounds,
            args.deletes,
            match writer {
                None => "the cluster quiet".to_owned(),
                Some(rate) => format!("beside a writer creating {rate} ConfigMaps a second in another namespace"),
            }
        ),
        &[
            "pods",
            "guard p50 ms",
            "floor p50 ms",
            "no webhook p50 ms",
            "guard / none p50",
            "floor / none p50",
            "guard / floor p50",
            "guard p99 ms",
            "floor p99 ms",
            "no webhook p99 ms",
        ],
    );
    for (n, pods) in [10, args.pods].into_iter().enumerate() {
        let [none, guarded, floor] = &runs[n];
        let ratio = median_ratio(&guarded.p50, &none.p50);
        table.row(vec![
            pods.to_string(),
            f2(median(&guarded.p50)),
            f2(median(&floor.p50)),
            f2(median(&none.p50)),
            goal(ratio, ratio <= 1.5, "≤ 1.5"),
            f2(median_ratio(&floor.p50, &none.p50)),
            f2(median_ratio(&guarded.p50, &floor.p50)),
            f2(median(&guarded.p99)),
            f2(median(&floor.p99)),
            f2(median(&none.p99)),
        ]);
    }
    table.note(
        "- the floor: the guard's webhooks pointed at `examples/ceiling --allow`, which allows at once with a warning on the same TLS and HTTP stack: what calling any webhook costs the apiserver"
            .to_owned(),
    );
    table.note(format!(
        "- the guard's reads of the users meanwhile: {} (a held object's delete reads nothing)",
        (reads_after.0 + reads_after.1) - (reads_before.0 + reads_before.1)
    ));
    table.print();
}

/// What the guard writes: per object a pod uses (held once, released once, one Event on
/// its deferred delete) and per pod created using objects already held, in a namespace
/// opted in to `defer` and in one that is not.
async fn writes(guard: &Guard) {
    const OBJECTS: usize = 100;
    let mut table = Table::new(
        format!(
            "In-use protection, defer: the guard's writes to the apiserver, {OBJECTS} ConfigMaps each used by 2 pods"
        ),
        &[
            "namespace",
            "finalizer adds",
            "finalizer removes",
            "Events",
            "writes per object",
            "writes per pod created",
        ],
    );
    for (opted_in, label) in [(true, Some(DEFER)), (false, None)] {
        let ns = TestNamespace::new("in-use-bench-writes").await;
        if let Some(label) = label {
            let labelled = kubectl()
                .args(["label", "namespace", &ns.name, label])
                .output()
                .unwrap();
            assert!(labelled.status.success(), "{labelled:?}");
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
        let names: Vec<String> = (0..OBJECTS).map(|i| format!("settings-{i}")).collect();
        for name in &names {
            let config_map = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            config_maps.create(&PostParams::default(), &config_map).await.unwrap();
        }
        let before = finalizer_writes(guard).await;
        // A first pod each: the objects held (once each).
        for (i, name) in names.iter().enumerate() {
            ns.pods()
                .create(&PostParams::default(), &pod(&format!("first-{i}"), Some(name)))
                .await
                .unwrap();
        }
        if opted_in {
            all_held(&ns.name, &names).await;
        } else {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let held_after_first = finalizer_writes(guard).await;
        // A second pod each: nothing to write.
        for (i, name) in names.iter().enumerate() {
            ns.pods()
                .create(&PostParams::default(), &pod(&format!("second-{i}"), Some(name)))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after_second = finalizer_writes(guard).await;
        // Deleted while in use (deferred), then the pods: released once each.
        for name in &names {
            config_maps.delete(name, &DeleteParams::default()).await.unwrap();
        }
        ns.pods()
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
        let started = Instant::now();
        while !config_maps
            .list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .all(|found| found.metadata.name.as_deref() == Some("kube-root-ca.crt"))
        {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the deferred deletes never completed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = finalizer_writes(guard).await;
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ns.client.clone(), &ns.name);
        let recorded = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|event| event.reporting_controller.as_deref() == Some("cds-secret-guard"))
            .count() as u64;
        let (adds, removes) = (after.0 - before.0, after.1 - before.1);
        let per_pod = (after_second.0 - held_after_first.0) + (after_second.1 - held_after_first.1);
        table.row(vec![
            if opted_in { "opted in to defer" } else { "not opted in" }.to_owned(),
            adds.to_string(),
            removes.to_string(),
            recorded.to_string(),
            f2((adds + removes + recorded) as f64 / OBJECTS as f64),
            f2(per_pod as f64 / OBJECTS as f64),
        ]);
    }
    table.note(
        "- each row's second pods use objects already held: what a pod created costs once its objects are".to_owned(),
    );
    table.print();
}

/// A namespace of `--opt-in-pods` pods, each using a ConfigMap of its own, opted in at
/// once: how long until the guard holds them all, its writes and its memory; without
/// the opt-in the guard writes nothing.
async fn opt_in_cost(args: &Args, guard: &Guard) {
    let ns = TestNamespace::new("in-use-bench-opt-in").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(ns.client.clone(), &ns.name);
    let names: Vec<String> = (0..args.opt_in_pods).map(|i| format!("settings-{i:05}")).collect();
    stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let (config_maps, pods) = (config_maps.clone(), ns.pods());
            async move {
                let config_map = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
                config_maps.create(&PostParams::default(), &config_map).await?;
                pods.create(&PostParams::default(), &pod(&format!("user-{i:05}"), Some(name)))
                    .await
                    .map(drop)
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .expect("create the pods and their ConfigMaps");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let unlabelled = finalizer_writes(guard).await;
    let memory_before = resident_mib(guard);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = finalizer_writes(guard).await;
    let labelled = kubectl()
        .args(["label", "namespace", &ns.name, DEFER])
        .output()
        .unwrap();
    assert!(labelled.status.success(), "{labelled:?}");
    let took = all_held(&ns.name, &names).await;
    let after = finalizer_writes(guard).await;
    let mut table = Table::new(
        format!(
            "In-use protection, defer: opting in a namespace of {} pods, each using a ConfigMap of its own",
            args.opt_in_pods
        ),
        &["", "until all held s", "finalizer writes", "guard MiB"],
    );
    table.row(vec![
        "not opted in".to_owned(),
        "-".to_owned(),
        (still.0 - unlabelled.0).to_string(),
        f2(memory_before),
    ]);
    table.row(vec![
        "opted in".to_owned(),
        f2(took.as_secs_f64()),
        (after.0 - still.0).to_string(),
        f2(resident_mib(guard)),
    ]);
    table.print();
    assert!(held(&config_maps, &names[0]).await);
}

// --- helm uninstall ---

/// A chart of 100 ConfigMaps, 100 Secrets and a Deployment of two pods using the first of
/// each, written under target/bench.
fn chart() -> PathBuf {
    let dir = repo().join("target/bench/in-use-chart");
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: in-use-bench\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("templates/objects.yaml"),
        r#"{{- range $i := until 100 }}
apiVersion: v1
kind: ConfigMap
metadata: {name: settings-{{ $i }}}
data: {mode: "on"}
---
apiVersion: v1
kind: Secret
metadata: {name: token-{{ $i }}}
stringData: {token: "t"}
---
{{- end }}
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: app
          image: busybox
          envFrom: [{configMapRef: {name: settings-0}}, {secretRef: {name: token-0}}]
"#,
    )
    .unwrap();
    dir
}

fn helm() -> Command {
    let mut command = Command::new(repo().join("target/tools/bin/helm"));
    command.env("KUBECONFIG", control_plane());
    command
}

/// Installs the release, waits for its two pods, and times `helm uninstall`.
async fn uninstall_once(chart: &PathBuf, namespace: &str) -> Duration {
    let installed = helm()
        .args(["install", "bench", "-n", namespace])
        .arg(chart)
        .output()
        .unwrap();
    assert!(installed.status.success(), "{installed:?}");
    let pods: Api<Pod> = Api::namespaced(client().await, namespace);
    let deadline = Instant::now() + Duration::from_secs(60);
    while pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .len()
        < 2
    {
        assert!(Instant::now() < deadline, "the Deployment's pods never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start = Instant::now();
    let uninstalled = helm().args(["uninstall", "bench", "-n", namespace]).output().unwrap();
    let took = start.elapsed();
    assert!(uninstalled.status.success(), "{uninstalled:?}");
    // Wait for the Deployment's pods to go before the next install.
    while !pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "the pods never went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    took
}

async fn uninstalls(args: &Args, guard: &Guard) {
    let chart = chart();
    let ns = namespace("in-use-bench-helm", 0).await;
    let registration = Registration {
        guard,
        probe: Api::namespaced(client().await, &ns.name),
        floor_yaml: None,
    };
    let mut times: [Vec<f64>; 2] = Default::default();
    for round in 0..args.rounds {
        for webhook in Webhook::order(round) {
            registration.set(webhook).await;
            let took = uninstall_once(&chart, &ns.name).await;
            times[webhook as usize].push(took.as_secs_f64());
        }
    }
    registration.set(Webhook::Guard).await;
    let mut table = Table::new(
        format!(
            "In-use protection: helm uninstall of 100 ConfigMaps, 100 Secrets and a Deployment of two pods using some, {} rounds",
            args.rounds
        ),
        &["guard s", "no webhook s", "ratio"],
    );
    let ratio = median_ratio(&times[1], &times[0]);
    table.row(vec![
        f2(median(&times[1])),
        f2(median(&times[0])),
        goal(ratio, ratio <= 1.5, "≤ 1.5"),
    ]);
    table.print();
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    control_plane();
    let guard = Guard::start_with(in_use_guard_options());
    if !args.no_refuse {
        delete_paths(&args, &guard).await;
    }
    if !args.no_defer {
        deferred(&args, &guard).await;
    }
    if !args.no_uninstall {
        uninstalls(&args, &guard).await;
    }
}
