//! The guard against its ceiling, over TLS, as the apiserver reaches it: `oha` loads
//! `cds-secret-guard serve` (default logging, no Kubernetes configuration, so any lookup
//! fails closed at once) and `examples/ceiling.rs` (the same TLS and HTTP stack answering
//! a constant AdmissionReview) alternately, round after round, over HTTP/1.1 and HTTP/2,
//! for `/mutate` (the CDS worker pod of `tests/data/pod-create-cds.json`) and `/validate`
//! (a secret delete denied by age: no lookup). Prints req/s, p50, p99 and CPU time per
//! request of each, and the guard's ratios to the ceiling beside their goals.
//!
//! `make bench` runs it; alone: `cargo build --release --bins --example ceiling --example
//! bench_tls && target/release/examples/bench_tls [--rounds N --duration D]`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bench_support;
use testkit::fake as common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use bench_support::{
    CeilingAnswer, Load, Measured, Process, Table, cpu_time, f2, free_port, goal, median, median_ratio, profile_dir,
    rps, start_ceiling, wait_listening,
};
use clap::Parser;
use common::{review, set, time_ago};

#[derive(Debug, Parser)]
#[command(about = "Load the guard and its ceiling alternately over TLS")]
struct Args {
    /// Rounds per (protocol, endpoint); each round runs the guard, then the ceiling.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Length of one run.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Connections (one request in flight on each).
    #[arg(long, default_value_t = 16)]
    connections: usize,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/`, beside this example's directory.
fn start_guard(certs: &Path, work: &Path) -> Process {
    let (addr, probes) = (free_port(), free_port());
    let log = std::fs::File::create(work.join("guard-tls.log")).unwrap();
    let mut child = Command::new(profile_dir().join("cds-secret-guard"))
        .arg("serve")
        // No Kubernetes configuration: the guard starts and fails closed.
        .env("KUBECONFIG", work.join("no-such-kubeconfig"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .env("CDS_GUARD_LISTEN", addr.to_string())
        .env("CDS_GUARD_PROBE_LISTEN", probes.to_string())
        .env("CDS_GUARD_TLS_CERT", certs.join("tls.crt"))
        .env("CDS_GUARD_TLS_KEY", certs.join("tls.key"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start cds-secret-guard serve (build it with --release)");
    wait_listening(addr, &mut child, "the guard");
    Process {
        name: "guard",
        child,
        addr,
    }
}

/// Writes the body of `endpoint` (compact JSON, as the apiserver sends it); the secret
/// of `/validate` is created now, so it is young for the guard's default 10 minutes.
fn write_body(work: &Path, endpoint: &str) -> PathBuf {
    let body = match endpoint {
        "validate" => set(
            review("secret-delete"),
            "/request/oldObject/metadata/creationTimestamp",
            time_ago(Duration::ZERO),
        ),
        _ => review("pod-create-cds"),
    };
    let path = work.join(format!("{endpoint}.json"));
    std::fs::write(&path, serde_json::to_vec(&body).unwrap()).unwrap();
    path
}

/// One request with curl: the guard must answer what the benchmark claims to measure.
fn check_answer(server: &Process, endpoint: &str, body: &Path, http2: bool, expect: &str) {
    let output = Command::new("curl")
        .args([
            "-sSk",
            "--fail",
            "-H",
            "content-type: application/json",
            "--data-binary",
        ])
        .arg(format!("@{}", body.display()))
        .arg(if http2 { "--http2" } else { "--http1.1" })
        .arg(format!("https://{}/{endpoint}", server.addr))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && text.contains(expect),
        "{} /{endpoint} answered {text} (want {expect})",
        server.name
    );
}

struct Run {
    measured: Measured,
    cpu_us_per_request: f64,
}

fn run(server: &Process, load: &Load) -> Run {
    let before = cpu_time(server.pid());
    let measured = load.run(200);
    let cpu = cpu_time(server.pid()).saturating_sub(before);
    assert!(
        measured.unexpected.is_empty(),
        "{} {}: unexpected answers {:?}",
        server.name,
        load.url,
        measured.unexpected
    );
    Run {
        cpu_us_per_request: cpu.as_secs_f64() * 1e6 / measured.requests,
        measured,
    }
}

fn main() {
    let args = Args::parse();
    let work = repo().join("target/bench/tls");
    std::fs::create_dir_all(&work).unwrap();
    let certs = work.join("certs");
    let made = Command::new(profile_dir().join("cds-secret-guard"))
        .args(["certs", "--out"])
        .arg(&certs)
        .args(["--host", "127.0.0.1", "--host", "localhost"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(made.success(), "cds-secret-guard certs failed");

    let guard = start_guard(&certs, &work);
    let ceiling = start_ceiling(&certs, CeilingAnswer::Constant);
    let servers = [&guard, &ceiling];

    let mut figures = Table::new(
        format!(
            "Guard vs ceiling over TLS: oha, {} connections, {} rounds of {:?} each, alternating (medians)",
            args.connections, args.rounds, args.duration
        ),
        &[
            "protocol",
            "endpoint",
            "server",
            "req/s",
            "p50 ms",
            "p99 ms",
            "server CPU µs/req",
        ],
    );
    let mut ratios = Table::new(
        "Guard / ceiling (median of the per-round ratios)",
        &[
            "protocol",
            "endpoint",
            "throughput ratio (goal ≥ 0.60)",
            "p99 ratio (goal ≤ 2)",
            "p50 ratio",
            "CPU/req ratio",
        ],
    );
    for (protocol, http2) in [("HTTP/1.1", false), ("HTTP/2", true)] {
        for endpoint in ["mutate", "validate"] {
            let body = write_body(&work, endpoint);
            let expect_guard = if endpoint == "validate" {
                "too-young"
            } else {
                "\"patch\""
            };
            check_answer(&guard, endpoint, &body, http2, expect_guard);
            check_answer(&ceiling, endpoint, &body, http2, "\"allowed\":true");
            let load = |server: &Process, duration: Duration| Load {
                url: format!("https://{}/{endpoint}", server.addr),
                method: "POST",
                body: Some(body.clone()),
                http2,
                connections: args.connections,
                duration,
                rate: None,
                client_cert: None,
                cacert: None,
            };
            for server in servers {
                run(server, &load(server, Duration::from_secs(1))); // warm-up
            }
            let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
            for round in 0..args.rounds {
                for (i, server) in servers.iter().enumerate() {
                    runs[i].push(run(server, &load(server, args.duration)));
                }
                eprintln!(
                    "bench_tls: {protocol} /{endpoint} round {}/{} done",
                    round + 1,
                    args.rounds
                );
            }
            let series = |i: usize, f: fn(&Run) -> f64| runs[i].iter().map(f).collect::<Vec<f64>>();
            let rps_of = |run: &Run| run.measured.rps;
            let p50_of = |run: &Run| run.measured.p50_ms;
            let p99_of = |run: &Run| run.measured.p99_ms;
            let cpu_of = |run: &Run| run.cpu_us_per_request;
            for (i, server) in servers.iter().enumerate() {
                figures.row(vec![
                    protocol.into(),
                    format!("/{endpoint}"),
                    server.name.into(),
                    rps(median(&series(i, rps_of))),
                    f2(median(&series(i, p50_of))),
                    f2(median(&series(i, p99_of))),
                    format!("{:.0}", median(&series(i, cpu_of))),
                ]);
            }
            let throughput = median_ratio(&series(0, rps_of), &series(1, rps_of));
            let p99 = median_ratio(&series(0, p99_of), &series(1, p99_of));
            ratios.row(vec![
                protocol.into(),
                format!("/{endpoint}"),
                goal(throughput, throughput >= 0.60, "≥ 0.60"),
                goal(p99, p99 <= 2.0, "≤ 2"),
                f2(median_ratio(&series(0, p50_of), &series(1, p50_of))),
                f2(median_ratio(&series(0, cpu_of), &series(1, cpu_of))),
            ]);
        }
    }
    figures.note(format!(
        "Bodies: /mutate {} bytes (tests/data/pod-create-cds.json, compact), /validate {} bytes. \
         The load generator runs on the same cores as the server.",
        std::fs::metadata(work.join("mutate.json")).map_or(0, |m| m.len()),
        std::fs::metadata(work.join("validate.json")).map_or(0, |m| m.len()),
    ));
    figures.print();
    ratios.print();
}
