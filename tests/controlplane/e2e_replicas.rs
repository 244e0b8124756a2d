//! End-to-end: replicas that do not fight. With `--lease`, the replica holding the Lease
//! adds the ownerReferences and the others only keep their pod watch (the decisions'
//! cache), so the apiserver pays about the same per worker for one, two or three replicas;
//! when the holder dies, another takes over within the lease's duration, and when it is
//! stopped (SIGTERM), at once.
//!
//! The requests are counted from the apiserver's audit log (who asked for what), never
//! from the guard: every request of the guard's service account between the replicas'
//! start and the last adoption, each request once (a watch is logged when it starts and
//! again when it ends). The guards are not registered as webhooks, so none of it is
//! admission work; each run has a namespace of its own, which its guards are scoped to,
//! so no earlier pod is reconciled again. The pods carry the worker label, as CDS's do.
//!
//! Nothing here skips: without the control plane, the tests fail.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    process::Stdio,
    time::{Duration, Instant},
};

use cluster::*;
use futures::StreamExt;
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{
    Api,
    core::PartialObjectMeta,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};

/// Workers per run: enough that what a replica costs by itself (its watches, its reads of
/// the Lease) is small beside what each worker costs.
const WORKERS: usize = 100;

/// Who the guards are to the apiserver: the shipped service account.
const GUARD_USER: &str = "system:serviceaccount:cds-secret-guard:cds-secret-guard";

/// The Lease the shipped role lets the guard read and patch, and where.
const LEASE: &str = "cds-secret-guard";
const LEASE_NAMESPACE: &str = "cds-secret-guard";

/// The guard's defaults (kube-controller-manager's): the tests run with them.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The tests count one service account's requests: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The shipped Lease, deleted when dropped: a replica killed by a test leaves it held, and
/// the next guard to use it (`make dashboard`'s) would wait for it to lapse.
struct ShippedLease;

impl Drop for ShippedLease {
    fn drop(&mut self) {
        let _ = kubectl()
            .args(["-n", LEASE_NAMESPACE, "delete", "lease", LEASE, "--ignore-not-found"])
            .stdout(Stdio::null())
            .status();
    }
}

/// The shipped Lease, fresh: no holder.
fn fresh_lease() -> ShippedLease {
    guard_kubeconfig();
    drop(ShippedLease);
    let applied = kubectl()
        .args(["-n", LEASE_NAMESPACE, "apply", "-f"])
        .arg(repo().join("manifests/base/lease.yaml"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(applied.success(), "apply manifests/base/lease.yaml");
    ShippedLease
}

async fn holder() -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client().await, LEASE_NAMESPACE);
    leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|spec| spec.holder_identity)
}

/// Waits until the Lease names a holder other than `not`, and returns it with the wait.
async fn new_holder(not: Option<&str>, within: Duration) -> (String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(holder) = holder().await
            && Some(holder.as_str()) != not
        {
            return (holder, start.elapsed());
        }
        assert!(start.elapsed() < within, "no new holder of the Lease within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A guard replica named `identity` in the Lease, scoped to `namespace`, not registered.
fn replica(identity: &str, namespace: &str, extra: &[(&str, &str)]) -> Guard {
    let mut env = vec![
        ("CDS_GUARD_LEASE".to_owned(), LEASE.to_owned()),
        ("CDS_GUARD_LEASE_IDENTITY".to_owned(), identity.to_owned()),
        ("CDS_GUARD_NAMESPACES".to_owned(), namespace.to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    Guard::start_with(GuardOptions {
        env,
        register: None,
        ..GuardOptions::default()
    })
}

/// What `cds_secret_guard_leader` says on a replica's `/metrics`.
async fn leader_gauge(guard: &Guard) -> f64 {
    let text = guard.metrics().await;
    metric(&text, "cds_secret_guard_leader").unwrap_or_else(|| panic!("no cds_secret_guard_leader in\n{text}"))
}

/// A CDS worker: its secret, then its pod, labelled as the hatchery labels both.
async fn spawn_worker(ns: &TestNamespace, worker: &str) {
    ns.worker_secret(worker).await;
    ns.worker_pod_labelled(
        worker,
        json!({"CDS_WORKER_NAME": worker, "CDS_HATCHERY_NAME": "hatchery-e2e"}),
    )
    .await;
}

/// When each worker secret of `namespace` first showed an ownerReference, as an admin's
/// watch sees it (the guard's requests are the ones counted; this one is not).
fn adoptions(
    namespace: &str,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::watch::Receiver<HashMap<String, Instant>>,
) {
    let (sender, receiver) = tokio::sync::watch::channel(HashMap::new());
    let namespace = namespace.to_owned();
    let task = tokio::spawn(async move {
        let secrets: Api<PartialObjectMeta<k8s_openapi::api::core::v1::Secret>> =
            Api::namespaced(client().await, &namespace);
        let mut events = watcher(secrets, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(secret)) = events.next().await {
            if secret
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|owners| !owners.is_empty())
                && let Some(name) = secret.metadata.name
            {
                sender.send_modify(|adopted| {
                    adopted.entry(name).or_insert_with(Instant::now);
                });
            }
        }
    });
    (task, receiver)
}

/// Waits until `count` secrets are adopted.
async fn all_adopted(
    adopted: &mut tokio::sync::watch::Receiver<HashMap<String, Instant>>,
    count: usize,
    within: Duration,
) {
    let waited = tokio::time::timeout(within, adopted.wait_for(|adopted| adopted.len() >= count))
        .await
        .is_ok();
    let done = adopted.borrow().len();
    assert!(waited, "{done} of {count} secrets adopted within {within:?}");
}

/// The guard's requests received in `[from, to]`, each once.
fn guard_requests(from: Timestamp, to: Timestamp) -> Vec<Value> {
    let mut seen = BTreeSet::new();
    apiserver_audit()
        .into_iter()
        .filter(|event| event["user"]["username"] == GUARD_USER)
        .filter(|event| {
            let received: Option<Timestamp> = event["requestReceivedTimestamp"].as_str().and_then(|t| t.parse().ok());
            received.is_some_and(|received| received >= from && received <= to)
        })
        .filter(|event| seen.insert(event["auditID"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Requests by resource and verb, e.g. `pods get`, and the conflicts among them, e.g.
/// `secrets patch 409`.
fn by_kind(requests: &[Value]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for request in requests {
        let kind = format!(
            "{} {}",
            request["objectRef"]["resource"].as_str().unwrap_or("?"),
            request["verb"].as_str().unwrap_or("?")
        );
        // Conflicts are counted twice: as requests, and apart.
        if request["responseStatus"]["code"] == 409 {
            *counts.entry(format!("{kind} 409")).or_default() += 1;
        }
        *counts.entry(kind).or_default() += 1;
    }
    counts
}

/// One run: `replicas` guards, with the Lease or without, `WORKERS` workers; what the
/// apiserver received from the guards, by resource and verb.
async fn run_with(replicas: usize, lease: bool) -> BTreeMap<String, usize> {
    let ns = TestNamespace::new(&format!("replicas-{replicas}")).await;
    // Dropped after the replicas (declared before them).
    let _lease = fresh_lease();
    let from = Timestamp::now();
    // No drain delay: a stopped run's replicas are gone before the next run starts.
    let drain = ("CDS_GUARD_DRAIN_DELAY", "0s");
    let guards: Vec<Guard> = (0..replicas)
        .map(|i| match lease {
            true => replica(&format!("replica-{i}"), &ns.name, &[drain]),
            false => Guard::start_with(GuardOptions {
                env: vec![
                    ("CDS_GUARD_NAMESPACES".to_owned(), ns.name.clone()),
                    (drain.0.to_owned(), drain.1.to_owned()),
                ],
                register: None,
                ..GuardOptions::default()
            }),
        })
        .collect();
    let leader = match lease {
        true => Some(new_holder(None, Duration::from_secs(10)).await.0),
        false => None,
    };
    let (watch, mut adopted) = adoptions(&ns.name);

    for i in 0..WORKERS {
        spawn_worker(&ns, &format!("w-{replicas}-{i}")).await;
    }
    all_adopted(&mut adopted, WORKERS, Duration::from_secs(30)).await;
    // The Adopted Events are sent after the writes, from a queue.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let to = Timestamp::now();

    let mut gauges = Vec::new();
    for guard in &guards {
        gauges.push(leader_gauge(guard).await);
    }
    match &leader {
        Some(leader) => {
            let leading: Vec<String> = (0..replicas)
                .filter(|i| gauges[*i] == 1.0)
                .map(|i| format!("replica-{i}"))
                .collect();
            assert_eq!(
                leading,
                [leader.as_str()],
                "one replica, the Lease's holder, says it leads: {gauges:?}"
            );
            assert_eq!(holder().await.as_deref(), Some(leader.as_str()), "one holder all along");
        }
        None => assert!(
            gauges.iter().all(|gauge| *gauge == 1.0),
            "without a Lease, all adopt: {gauges:?}"
        ),
    }
    for i in 0..WORKERS {
        let secret = ns
            .secrets()
            .get_metadata(&format!("cds-worker-config-w-{replicas}-{i}"))
            .await
            .unwrap();
        assert_eq!(secret.metadata.owner_references.unwrap().len(), 1, "one reference");
    }
    watch.abort();
    std::thread::scope(|scope| {
        for guard in &guards {
            scope.spawn(|| guard.terminate());
        }
    });

    let mut counts = by_kind(&guard_requests(from, to));
    if lease {
        assert_eq!(
            counts.get("secrets patch 409"),
            None,
            "{replicas} replicas, one holder: no conflicting secret write"
        );
    }
    counts.retain(|_, n| *n > 0);
    counts
}

#[tokio::test]
async fn requests_per_worker_stay_flat_from_one_to_three_replicas() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let per_worker = |counts: &BTreeMap<String, usize>| {
        let total: usize = counts
            .iter()
            .filter(|(k, _)| !k.ends_with(" 409"))
            .map(|(_, n)| n)
            .sum();
        total as f64 / WORKERS as f64
    };
    let mut figures = Vec::new();
    for replicas in 1..=3 {
        let counts = run_with(replicas, true).await;
        println!(
            "{replicas} replica(s) with the Lease, {WORKERS} workers: {:.2} requests per worker; {counts:?}",
            per_worker(&counts)
        );
        figures.push(per_worker(&counts));
    }
    // For the record, what the Lease saves: two replicas without it.
    let counts = run_with(2, false).await;
    println!(
        "2 replicas without a Lease, {WORKERS} workers: {:.2} requests per worker; {counts:?}",
        per_worker(&counts)
    );
    for (replicas, figure) in figures.iter().enumerate().skip(1) {
        assert!(
            *figure <= figures[0] * 1.1,
            "{} replicas: {figure:.2} requests per worker, more than 1.1 × {:.2} for one",
            replicas + 1,
            figures[0]
        );
    }
}

/// From each secret's pod's creation to its adoption, sorted.
fn adoption_latencies(created: &[(String, Instant)], adopted: &HashMap<String, Instant>) -> Vec<Duration> {
    let mut latencies: Vec<Duration> = created
        .iter()
        .map(|(secret, at)| adopted[secret].saturating_duration_since(*at))
        .collect();
    latencies.sort();
    latencies
}

/// Percentile `q` of sorted `values`.
fn percentile(values: &[Duration], q: f64) -> Duration {
    values[((values.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test]
async fn another_replica_adopts_when_the_holder_dies_or_stops() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let ns = TestNamespace::new("failover").await;
    let _lease = fresh_lease();
    let guards = [replica("replica-a", &ns.name, &[]), replica("replica-b", &ns.name, &[])];
    let (first, _) = new_holder(None, Duration::from_secs(10)).await;
    let index = |identity: &str| usize::from(identity == "replica-b");
    let (watch, mut adopted) = adoptions(&ns.name);

    // SIGKILL: the holder cannot release the Lease; the other waits for it to lapse.
    // Workers keep coming, one every 250 ms, from 2 s before the kill to 20 s after.
    let mut created = Vec::new();
    let start = Instant::now();
    let mut killed = None;
    let mut i = 0;
    while start.elapsed() < Duration::from_secs(22) {
        if killed.is_none() && start.elapsed() >= Duration::from_secs(2) {
            guards[index(&first)].kill();
            killed = Some(Instant::now());
        }
        let worker = format!("w-kill-{i}");
        spawn_worker(&ns, &worker).await;
        created.push((format!("cds-worker-config-{worker}"), Instant::now()));
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    all_adopted(&mut adopted, created.len(), Duration::from_secs(30)).await;
    let (second, _) = new_holder(Some(&first), Duration::ZERO).await;
    let latencies = adoption_latencies(&created, &adopted.borrow());
    let (p50, p99, max) = (
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0),
    );
    println!(
        "SIGKILL of the holder: {} workers from 2 s before to 20 s after, all adopted; adoption latency p50 {p50:?}, p99 {p99:?}, max {max:?}",
        created.len()
    );
    // The other replica sees the last renewal within a retry period, and finds the Lease
    // unchanged for its duration at a read, which comes every retry period.
    let bound = LEASE_DURATION + 2 * RETRY_PERIOD + Duration::from_secs(2);
    assert!(
        p99 < bound,
        "adoption latency p99 {p99:?} across a SIGKILL, past {bound:?}"
    );
    assert!(killed.is_some());

    // SIGTERM: the holder releases the Lease at once, and the other takes it at its next
    // read, while the stopped one still drains (5 s).
    guards[index(&first)].run();
    let stopping = &guards[index(&second)];
    let pid = stopping.pid().unwrap().to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(signalled.success());
    let (third, handover) = new_holder(Some(&second), Duration::from_secs(10)).await;
    assert_eq!(third, first, "the restarted replica holds the Lease");
    let mut after = Vec::new();
    for i in 0..10 {
        let worker = format!("w-term-{i}");
        spawn_worker(&ns, &worker).await;
        after.push((format!("cds-worker-config-{worker}"), Instant::now()));
    }
    all_adopted(&mut adopted, created.len() + after.len(), Duration::from_secs(10)).await;
    println!(
        "SIGTERM of the holder: the other replica held the Lease {handover:?} later; adoption latency after it, max {:?}",
        percentile(&adoption_latencies(&after, &adopted.borrow()), 1.0)
    );
    assert!(
        handover < RETRY_PERIOD + Duration::from_secs(1),
        "hand-over on SIGTERM took {handover:?}"
    );
    stopping.terminate();
    watch.abort();
}
