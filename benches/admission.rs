//! In-process benchmarks of the decision and the mutation: `worker::decide` alone, and
//! whole `/validate` and `/mutate` reviews decoded and handled by the real router
//! (`Server::new(..).router()` with `tower::ServiceExt::oneshot`), with an in-memory
//! cluster behind the lookup trait.
//!
//! `make bench` runs it (`cargo bench --bench admission`). Three passes:
//!
//! 1. criterion, for each case on its own (its usual report);
//! 2. the same cases interleaved, round after round, so that every ratio compares
//!    figures measured side by side on the same noisy machine: the median over the
//!    rounds of each case's time per operation, and of its ratio to its baseline;
//! 3. allocations per operation, counted by the global allocator of this binary.
//!
//! Logging is on, as in `serve`: JSON lines at `info`, written to a sink, so the audit
//! line of each decision is part of the cost.
//!
//! Under `cargo test` (no `--bench` argument) it only says how to run it: benchmarks are
//! not tests.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use testkit::fake as common;

use std::{
    alloc::System,
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::{Body, to_bytes},
    http::{Request, StatusCode},
};
use cds_secret_guard::{
    Server,
    api::review,
    rules::worker::SecretObject,
    rules::worker::pod::PodObject,
    rules::worker::reads::ClusterLookup,
    rules::worker::{self, SecretDelete},
};
use common::{FakeCluster, Policy, config, pod, policy as default_policy, review, set, time_ago};
use criterion::Criterion;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp};
use serde_json::Value;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::runtime::Runtime;
use tower::ServiceExt;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Interleaved rounds of the second pass.
const ROUNDS: usize = 15;
/// Wall time one case gets in one round.
const BATCH: Duration = Duration::from_millis(40);
/// Operations counted per case in the allocation pass.
const ALLOC_OPS: u64 = 1000;

/// What one case runs, once per operation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    DecideYoung,
    DecidePodLive,
    DecideOrphan,
    ValidateDecode,
    ValidateRouter,
    MutateDecode,
    MutateRouter,
}

struct Case {
    name: &'static str,
    op: Op,
    /// The case this one is compared with, if any.
    baseline: Option<Op>,
    goal: Option<Goal>,
}

/// The most one operation may take: time, and allocations.
struct Goal {
    micros: f64,
    allocations: f64,
}

impl Goal {
    /// The goal beside the figures, and whether they meet it.
    fn judge(&self, nanos: f64, allocations: f64) -> String {
        let met = nanos <= self.micros * 1000.0 && allocations <= self.allocations;
        format!(
            "{} (≤ {} µs, ≤ {} allocations)",
            if met { "ok" } else { "MISSED" },
            self.micros,
            self.allocations
        )
    }
}

const CASES: &[Case] = &[
    Case {
        name: "decide/too-young (no lookup)",
        op: Op::DecideYoung,
        baseline: None,
        goal: None,
    },
    Case {
        name: "decide/pod-live (in-memory lookup)",
        op: Op::DecidePodLive,
        baseline: Some(Op::DecideYoung),
        goal: None,
    },
    Case {
        name: "decide/orphan (in-memory lookup)",
        op: Op::DecideOrphan,
        baseline: Some(Op::DecideYoung),
        goal: None,
    },
    Case {
        name: "validate/decode only (secret delete)",
        op: Op::ValidateDecode,
        baseline: None,
        goal: None,
    },
    Case {
        name: "validate/router (deny by age)",
        op: Op::ValidateRouter,
        baseline: Some(Op::ValidateDecode),
        goal: Some(Goal {
            micros: 7.0,
            allocations: 40.0,
        }),
    },
    Case {
        name: "mutate/decode only (CDS pod)",
        op: Op::MutateDecode,
        baseline: None,
        goal: None,
    },
    Case {
        name: "mutate/router (CDS pod, patched)",
        op: Op::MutateRouter,
        baseline: Some(Op::MutateDecode),
        goal: Some(Goal {
            micros: 10.0,
            allocations: 40.0,
        }),
    },
];

/// Everything the cases read, built once.
struct Fixtures {
    policy: Policy,
    young: ObjectMeta,
    old: ObjectMeta,
    empty: FakeCluster,
    live: FakeCluster,
    groups: Vec<String>,
    validate_body: Vec<u8>,
    mutate_body: Vec<u8>,
    router: Router,
}

impl Fixtures {
    fn new() -> Self {
        let young_review = set(
            review("secret-delete"),
            "/request/oldObject/metadata/creationTimestamp",
            time_ago(Duration::from_secs(5)),
        );
        let old_review = set(
            review("secret-delete"),
            "/request/oldObject/metadata/creationTimestamp",
            time_ago(Duration::from_secs(3600)),
        );
        let meta = |review: &Value| -> ObjectMeta {
            serde_json::from_value(review["request"]["oldObject"]["metadata"].clone()).unwrap()
        };
        let groups = serde_json::from_value(young_review["request"]["userInfo"]["groups"].clone()).unwrap();
        let server = Server::new(
            config(default_policy(), std::path::Path::new("/nonexistent")),
            Arc::new(FakeCluster::default()),
        );
        Self {
            policy: default_policy(),
            young: meta(&young_review),
            old: meta(&old_review),
            empty: FakeCluster::default(),
            live: FakeCluster::with_pods([pod("w1", "8d5e1c2a-0000-4000-8000-000000000042", "Pending", "w1")]),
            groups,
            validate_body: serde_json::to_vec(&young_review).unwrap(),
            mutate_body: serde_json::to_vec(&review("pod-create-cds")).unwrap(),
            router: server.router(),
        }
    }

    async fn decide(&self, secret: &ObjectMeta, lookup: &dyn ClusterLookup) -> worker::Verdict {
        let delete = SecretDelete {
            namespace: "cds",
            name: "cds-worker-config-w1",
            secret: Some(secret),
            username: Some("system:serviceaccount:cds:hatchery"),
            groups: &self.groups,
        };
        worker::decide(
            &self.policy.rules,
            &self.policy.worker,
            &delete,
            lookup,
            Timestamp::now(),
        )
        .await
    }

    async fn post(&self, path: &str, body: &[u8]) -> (StatusCode, axum::body::Bytes) {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        (status, to_bytes(response.into_body(), usize::MAX).await.unwrap())
    }

    /// One operation of `op`.
    async fn run(&self, op: Op) {
        match op {
            Op::DecideYoung => drop(black_box(self.decide(&self.young, &self.empty).await)),
            Op::DecidePodLive => drop(black_box(self.decide(&self.old, &self.live).await)),
            Op::DecideOrphan => drop(black_box(self.decide(&self.old, &self.empty).await)),
            Op::ValidateDecode => {
                let request = review::decode::<SecretObject>(black_box(&self.validate_body));
                drop(black_box(request.unwrap()));
            }
            Op::ValidateRouter => drop(black_box(self.post("/validate", &self.validate_body).await)),
            Op::MutateDecode => {
                let request = review::decode::<PodObject>(black_box(&self.mutate_body));
                drop(black_box(request.unwrap()));
            }
            Op::MutateRouter => drop(black_box(self.post("/mutate", &self.mutate_body).await)),
        }
    }

    /// Fails loudly when a case does not do what its name says: a benchmark of the wrong
    /// path is worse than none.
    async fn check(&self) {
        let young = self.decide(&self.young, &self.empty).await;
        assert_eq!((young.allowed, young.reason.code()), (false, "too-young"));
        let live = self.decide(&self.old, &self.live).await;
        assert_eq!((live.allowed, live.reason.code()), (false, "pod-live"));
        let orphan = self.decide(&self.old, &self.empty).await;
        assert_eq!((orphan.allowed, orphan.reason.code()), (true, "orphan"));

        let (status, body) = self.post("/validate", &self.validate_body).await;
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(
            answer["response"]["auditAnnotations"]["reason"], "too-young",
            "{answer}"
        );

        let (status, body) = self.post("/mutate", &self.mutate_body).await;
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert_eq!(
            answer["response"]["patchType"], "JSONPatch",
            "the CDS pod is patched: {answer}"
        );
    }
}

/// Logging as `serve` sets it up (JSON, `info`), into a sink.
fn logging() {
    use tracing_subscriber::{EnvFilter, fmt, prelude::*};
    tracing_subscriber::registry()
        .with(EnvFilter::new("info"))
        .with(
            fmt::layer()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .with_writer(std::io::sink),
        )
        .init();
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn criterion_pass(rt: &Runtime, fixtures: &Fixtures) {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        .configure_from_args();
    for case in CASES {
        criterion.bench_function(case.name, |b| b.to_async(rt).iter(|| fixtures.run(case.op)));
    }
    criterion.final_summary();
}

/// Nanoseconds per operation of each case, per round, cases interleaved in every round.
fn interleaved_pass(rt: &Runtime, fixtures: &Fixtures) -> Vec<Vec<f64>> {
    // Operations per batch, so that one batch takes about BATCH.
    let sizes: Vec<u64> = CASES
        .iter()
        .map(|case| {
            let start = Instant::now();
            let mut ops = 0u64;
            rt.block_on(async {
                while start.elapsed() < BATCH {
                    fixtures.run(case.op).await;
                    ops += 1;
                }
            });
            ops.max(1)
        })
        .collect();
    let mut times = vec![Vec::with_capacity(ROUNDS); CASES.len()];
    for round in 0..ROUNDS {
        // Alternate the order too, so no case always follows the same one.
        let order: Vec<usize> = if round % 2 == 0 {
            (0..CASES.len()).collect()
        } else {
            (0..CASES.len()).rev().collect()
        };
        for i in order {
            let (case, ops) = (&CASES[i], sizes[i]);
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..ops {
                    fixtures.run(case.op).await;
                }
            });
            times[i].push(start.elapsed().as_nanos() as f64 / ops as f64);
        }
    }
    times
}

/// Allocations and bytes allocated per operation.
fn allocation_pass(rt: &Runtime, fixtures: &Fixtures) -> Vec<(f64, f64)> {
    CASES
        .iter()
        .map(|case| {
            rt.block_on(async {
                for _ in 0..100 {
                    fixtures.run(case.op).await;
                }
                let region = Region::new(GLOBAL);
                for _ in 0..ALLOC_OPS {
                    fixtures.run(case.op).await;
                }
                let stats = region.change();
                let ops = ALLOC_OPS as f64;
                (
                    (stats.allocations + stats.reallocations) as f64 / ops,
                    stats.bytes_allocated as f64 / ops,
                )
            })
        })
        .collect()
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

fn table(times: &[Vec<f64>], allocations: &[(f64, f64)]) -> String {
    let index = |op: Op| CASES.iter().position(|case| case.op == op).unwrap();
    let mut out = format!(
        "\n## In-process: decision and mutation (median of {ROUNDS} interleaved rounds)\n\n\
         | case | time/op | ratio | vs | allocs/op | bytes/op | goal |\n|---|---|---|---|---|---|---|\n"
    );
    for (i, case) in CASES.iter().enumerate() {
        let time = median(&times[i]);
        let (ratio, versus) = match case.baseline {
            Some(baseline) => {
                let b = index(baseline);
                // The ratio of each round (side by side), then the median of those.
                let ratios: Vec<f64> = times[i].iter().zip(&times[b]).map(|(a, b)| a / b).collect();
                (format!("{:.2}", median(&ratios)), CASES[b].name)
            }
            None => ("1.00".to_owned(), "(baseline)"),
        };
        let (allocs, bytes) = allocations[i];
        let goal = case
            .goal
            .as_ref()
            .map_or_else(String::new, |goal| goal.judge(time, allocs));
        out += &format!(
            "| {} | {} | {ratio} | {versus} | {allocs:.1} | {bytes:.0} | {goal} |\n",
            case.name,
            human(time)
        );
    }
    out
}

fn human(nanos: f64) -> String {
    if nanos >= 1_000_000.0 {
        format!("{:.2} ms", nanos / 1_000_000.0)
    } else if nanos >= 1_000.0 {
        format!("{:.2} µs", nanos / 1_000.0)
    } else {
        format!("{nanos:.0} ns")
    }
}

/// The case named by `CDS_BENCH_PROFILE`, if set: only that case runs, for
/// `PROFILE_TIME`, so that `perf record` sees nothing else.
fn profiled_case() -> Option<String> {
    std::env::var("CDS_BENCH_PROFILE").ok()
}

/// How long the profiled case runs.
const PROFILE_TIME: Duration = Duration::from_secs(10);

/// Runs one case, alone, for `PROFILE_TIME` (`CDS_BENCH_PROFILE=validate/router perf
/// record -g … --bench`).
fn profile(rt: &Runtime, fixtures: &Fixtures, name: &str) {
    let Some(case) = CASES.iter().find(|case| case.name.starts_with(name)) else {
        let names: Vec<&str> = CASES.iter().map(|case| case.name).collect();
        panic!("no case {name:?}; the cases: {names:?}");
    };
    let start = Instant::now();
    let mut ops = 0u64;
    rt.block_on(async {
        while start.elapsed() < PROFILE_TIME {
            fixtures.run(case.op).await;
            ops += 1;
        }
    });
    let per_op = start.elapsed().as_nanos() as f64 / ops as f64;
    println!("{}: {ops} operations, {} each", case.name, human(per_op));
}

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!(
            "benches/admission.rs: a benchmark, not a test; run it with `make bench` or `cargo bench --bench admission`"
        );
        return;
    }
    logging();
    let rt = runtime();
    let fixtures = Fixtures::new();
    rt.block_on(fixtures.check());
    if let Some(name) = profiled_case() {
        return profile(&rt, &fixtures, &name);
    }
    println!(
        "bodies: /validate {} bytes, /mutate {} bytes",
        fixtures.validate_body.len(),
        fixtures.mutate_body.len()
    );

    criterion_pass(&rt, &fixtures);
    let times = interleaved_pass(&rt, &fixtures);
    let allocations = allocation_pass(&rt, &fixtures);
    let table = table(&times, &allocations);
    print!("{table}");
    if let Ok(path) = std::env::var("CDS_BENCH_REPORT") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        std::io::Write::write_all(&mut file, table.as_bytes()).unwrap();
    }
}
