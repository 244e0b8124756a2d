//! What a worker feels on the node (`make bench`, part `node`; see docs/design/benchmarks.md):
//! CDS-shaped workers spawned as the hatchery spawns them (the secret, then the pod that
//! reads it through `secretKeyRef`), run by the kubelet of `cluster.sh up --node`, with the
//! guard installed from the chart (the image of `make image`) and without any guard,
//! alternately (A B B A …). Per worker: the time from the pod's CREATE to the first sight
//! of it running (a watch sees phase `Running`, or `Succeeded` if the short worker was
//! quicker than the kubelet's status), and the CPU the apiserver and etcd spend on the
//! worker's whole life (secret, pod, its status, the pod's delete, the secret's delete by
//! the garbage collector or the hatchery, whichever comes first). Prints one table.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bench_support;
use testkit::cluster as harness;
use testkit::install;
use testkit::seed;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bench_support::{Table, cpu_time, f2, goal, median, median_ratio};
use clap::Parser;
use futures::StreamExt;
use harness::TestNamespace;
use install::{Release, VERSION, default_service_account};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, ListParams},
    runtime::{WatchStreamExt, watcher},
};

#[derive(Parser)]
struct Args {
    /// Pairs of rounds, one with the guard and one without.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Workers per round.
    #[arg(long, default_value_t = 40)]
    workers: usize,
    /// Milliseconds between two spawns.
    #[arg(long, default_value_t = 250)]
    every_ms: u64,
}

/// One round's figures.
struct Round {
    /// Pod CREATE → first seen running, in ms, one per worker.
    start_ms: Vec<f64>,
    /// Apiserver and etcd CPU per worker, in ms.
    cpu_ms: f64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    install::node();
    let every = Duration::from_millis(args.every_ms);
    let mut release: Option<Release> = None;
    let (mut plain, mut guarded) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        // A B, then B A: each variant goes first as often, and one install serves two rounds.
        let order = if r % 2 == 0 { [false, true] } else { [true, false] };
        for with_guard in order {
            if with_guard && release.is_none() {
                release = Some(install_guard().await);
            }
            if !with_guard {
                drop(release.take()); // helm uninstall --wait
            }
            let round = round(with_guard, args.workers, every).await;
            eprintln!(
                "bench_node: round {r}, guard {with_guard}: start p50 {:.0} ms, p99 {:.0} ms, {:.1} ms CPU a worker",
                percentile(&round.start_ms, 0.5),
                percentile(&round.start_ms, 0.99),
                round.cpu_ms
            );
            if with_guard { &mut guarded } else { &mut plain }.push(round);
        }
    }
    drop(release);
    report(&plain, &guarded, &args);
}

/// The guard from the chart, answering through its Service (kube-proxy's rules follow the
/// pods' readiness by a moment).
async fn install_guard() -> Release {
    let release = tokio::task::block_in_place(|| Release::install(VERSION));
    let probe = TestNamespace::new("bench-node-probe").await;
    probe.worker_secret("probe").await;
    install::refused_by_the_guard(&probe, "cds-worker-config-probe").await;
    release
}

async fn round(with_guard: bool, workers: usize, every: Duration) -> Round {
    let ns = TestNamespace::new(if with_guard {
        "bench-node-guard"
    } else {
        "bench-node-plain"
    })
    .await;
    default_service_account(&ns.name).await;
    let (pods, secrets) = (ns.pods(), ns.secrets());
    let running = watch_running(pods.clone());
    let pids = control_plane_pids();
    let cpu_before: Duration = pids.iter().map(|&pid| cpu_time(pid)).sum();

    let names: Vec<String> = (0..workers).map(|i| format!("w{i}")).collect();
    let mut created = BTreeMap::new();
    for name in &names {
        seed::create_secret(&secrets, name).await;
        created.insert(name.clone(), Instant::now());
        seed::create_pod(&pods, name).await;
        tokio::time::sleep(every).await;
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    while running.lock().unwrap().len() < workers {
        assert!(
            Instant::now() < deadline,
            "workers not running after 180 s: {:?}",
            running.lock().unwrap().keys()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let start_ms = names
        .iter()
        .map(|name| (running.lock().unwrap()[name] - created[name]).as_secs_f64() * 1000.0)
        .collect();

    // The hatchery's end of a worker: the pod, then the secret (with the guard, the
    // garbage collector may have deleted it first).
    for name in &names {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    gone(&pods, "pods").await;
    for name in &names {
        match secrets.delete(&seed::secret_name(name), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(other) => panic!("the secret of {name}, whose pod is gone: {other}"),
        }
    }
    gone(&secrets, "secrets").await;
    let cpu: Duration = pids.iter().map(|&pid| cpu_time(pid)).sum::<Duration>() - cpu_before;
    Round {
        start_ms,
        cpu_ms: cpu.as_secs_f64() * 1000.0 / workers as f64,
    }
}

/// When a watch first saw each pod running (or already done).
fn watch_running(pods: Api<Pod>) -> Arc<Mutex<BTreeMap<String, Instant>>> {
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).applied_objects().boxed();
        while let Some(Ok(pod)) = events.next().await {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Running" | "Succeeded")) {
                let name = pod.metadata.name.unwrap();
                record.lock().unwrap().entry(name).or_insert_with(Instant::now);
            }
        }
    });
    seen
}

async fn gone<K>(api: &Api<K>, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    while !api
        .list_metadata(&ListParams::default().labels("CDS_WORKER_NAME"))
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "{what} left after 120 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The apiserver's and etcd's pids, from `cluster.sh`'s pid files.
fn control_plane_pids() -> Vec<u32> {
    let run = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/controlplane/run");
    ["kube-apiserver", "etcd"]
        .iter()
        .map(|name| {
            let file = run.join(format!("{name}.pid"));
            let pid = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            pid.trim().parse().expect("a pid file holds a pid")
        })
        .collect()
}

fn percentile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn report(plain: &[Round], guarded: &[Round], args: &Args) {
    let per_round =
        |rounds: &[Round], q: f64| -> Vec<f64> { rounds.iter().map(|r| percentile(&r.start_ms, q)).collect() };
    let pooled = |rounds: &[Round]| -> Vec<f64> { rounds.iter().flat_map(|r| r.start_ms.clone()).collect() };
    let cpu = |rounds: &[Round]| -> Vec<f64> { rounds.iter().map(|r| r.cpu_ms).collect() };
    let p50_ratio = median_ratio(&per_round(guarded, 0.5), &per_round(plain, 0.5));
    let p99_ratio = median_ratio(&per_round(guarded, 0.99), &per_round(plain, 0.99));
    let added_cpu = median(&cpu(guarded)) - median(&cpu(plain));
    let mut table = Table::new(
        format!(
            "A worker's start on the node: pod CREATE → running, {} workers a round, one every {} ms, {} rounds each",
            args.workers, args.every_ms, args.rounds
        ),
        &["", "no guard", "the chart's guard", "ratio (median of paired rounds)"],
    );
    table.row(vec![
        "p50 (ms)".into(),
        f2(percentile(&pooled(plain), 0.5)),
        f2(percentile(&pooled(guarded), 0.5)),
        goal(p50_ratio, p50_ratio <= 1.05, "≤ 1.05"),
    ]);
    table.row(vec![
        "p99 (ms)".into(),
        f2(percentile(&pooled(plain), 0.99)),
        f2(percentile(&pooled(guarded), 0.99)),
        f2(p99_ratio),
    ]);
    table.row(vec![
        "apiserver + etcd CPU a worker (ms)".into(),
        f2(median(&cpu(plain))),
        f2(median(&cpu(guarded))),
        format!("+{} ms a worker", f2(added_cpu)),
    ]);
    table.note(
        "Start: from the pod's CREATE to a watch's first sight of it Running (or Succeeded). CPU: the \
         apiserver's and etcd's user + system time over the round (spawn, run, the pod's and the \
         secret's delete), divided by the workers.",
    );
    table.print();
}
