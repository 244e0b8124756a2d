//! The hatchery race, long: every mode of {no guard, guard} × {cleanup before upstream's
//! fix, after it}, on the local control plane (one apiserver, or two with `--ha`), with
//! optional faults during the guarded runs. Prints a table; exits 1 when a guarded run
//! lost a secret or left an orphan, or when an unguarded run lost nothing (then the
//! harness proved nothing). `make race` runs it (`make race CDS_CP_HA=1` on the HA
//! control plane); see docs/design/race.md.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use testkit::cluster as e2e;
use testkit::race as harness;

use std::{path::Path, process::Command, process::ExitCode, time::Duration};

use clap::{Parser, ValueEnum};
use e2e::{Guard, TestNamespace, client_for, control_plane, unregister_webhooks};
use harness::{Cleanup, Settings, TABLE_HEADER, row, run};

#[derive(Debug, Parser)]
#[command(about = "Replay the CDS hatchery race with and without cds-secret-guard")]
struct Args {
    /// Workers spawned per mode.
    #[arg(long, default_value_t = 10_000)]
    spawns: usize,
    /// Stop spawning after this long (e.g. 10m), even before --spawns.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Workers alive at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Delay between the cleanup's pod list and its secret list.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    list_lag: Duration,
    /// Age check of the after-fix cleanup (10m upstream, scaled to the workers' lives).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    client_grace: Duration,
    /// Create the pod before its secret.
    #[arg(long)]
    pod_first: bool,
    /// Also create a registry secret per worker.
    #[arg(long)]
    registry_secret: bool,
    /// Two apiservers on a 3-member etcd: the hatchery writes through A, the cleanup reads
    /// B. The same variable makes `cluster.sh up` start the HA control plane.
    #[arg(long, env = "CDS_CP_HA", value_parser = clap::builder::BoolishValueParser::new(), default_value = "false")]
    ha: bool,
    /// Run only these modes (default: all four).
    #[arg(long, value_delimiter = ',')]
    modes: Vec<Mode>,
    /// A fault injected during each guarded run.
    #[arg(long, value_enum)]
    fault: Option<Fault>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    OpenBefore,
    OpenAfter,
    GuardBefore,
    GuardAfter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// Kill etcd member 1, start it again 5 s later (needs the HA control plane).
    Etcd,
    /// Kill apiserver B, the cleanup's, and start it again (needs the HA control plane).
    Apiserver,
    /// Kill the guard for 5 s, then start it again.
    Guard,
}

fn cluster(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/controlplane/cluster.sh");
    let status = Command::new(script).args(args).status().expect("run cluster.sh");
    assert!(status.success(), "cluster.sh {args:?} failed");
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    assert!(
        args.fault.is_none_or(|f| f == Fault::Guard || args.ha),
        "--fault etcd|apiserver needs the HA control plane (CDS_CP_HA=1)"
    );
    let kubeconfig = control_plane().to_owned();
    let dir = kubeconfig.parent().unwrap().to_owned();
    let (a, b) = if args.ha {
        (
            client_for(&dir.join("kubeconfig-a")).await,
            client_for(&dir.join("kubeconfig-b")).await,
        )
    } else {
        (client_for(&kubeconfig).await, client_for(&kubeconfig).await)
    };
    let modes = if args.modes.is_empty() {
        vec![Mode::OpenBefore, Mode::OpenAfter, Mode::GuardBefore, Mode::GuardAfter]
    } else {
        args.modes.clone()
    };
    let settings = Settings {
        spawns: args.spawns,
        duration: args.duration,
        concurrency: args.concurrency,
        seed: args.seed,
        list_lag: args.list_lag,
        client_grace: args.client_grace,
        pod_first: args.pod_first,
        registry_secret: args.registry_secret,
        ..Settings::default()
    };
    let apiservers = if args.ha {
        "HA (2 apiservers, 3 etcd)"
    } else {
        "1 apiserver"
    };
    let mut table = vec![TABLE_HEADER.to_owned()];
    let mut failed = false;

    for mode in modes {
        let guarded = matches!(mode, Mode::GuardBefore | Mode::GuardAfter);
        let cleanup = if matches!(mode, Mode::OpenBefore | Mode::GuardBefore) {
            Cleanup::BeforeFix
        } else {
            Cleanup::AfterFix
        };
        let guard = if guarded {
            Some(Guard::start())
        } else {
            assert!(unregister_webhooks(), "cannot remove the webhooks");
            None
        };
        let ns = TestNamespace::new("race").await;
        let settings = Settings {
            cleanup,
            ..settings.clone()
        };
        let fault = match (args.fault, &guard) {
            (Some(fault), Some(_)) => Some(fault),
            _ => None,
        };
        let report = {
            let running = run(a.clone(), b.clone(), &ns.name, &settings);
            let injected = async {
                let Some(fault) = fault else { return };
                tokio::time::sleep(Duration::from_secs(10)).await;
                eprintln!("race: injecting fault {fault:?}");
                match fault {
                    Fault::Etcd => {
                        cluster(&["kill", "etcd-1"]);
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        cluster(&["start", "etcd-1"]);
                    }
                    Fault::Apiserver => {
                        cluster(&["kill", "kube-apiserver-b"]);
                        cluster(&["start", "kube-apiserver-b"]);
                    }
                    Fault::Guard => {
                        let guard = guard.as_ref().unwrap();
                        guard.kill();
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        guard.run();
                    }
                }
                eprintln!("race: fault {fault:?} over");
            };
            let (report, ()) = tokio::join!(running, injected);
            report
        };
        let label = format!(
            "{}, cleanup {}, {apiservers}{}",
            if guarded { "guard" } else { "no guard" },
            if cleanup == Cleanup::BeforeFix {
                "before fix"
            } else {
                "after fix"
            },
            fault.map(|f| format!(", fault: {f:?}")).unwrap_or_default(),
        );
        let line = row(&label, &report);
        eprintln!("{line}");
        table.push(line);
        if guarded && (!report.lost.is_empty() || report.orphans > 0) {
            eprintln!(
                "race: FAILED: {label} lost {:?}, {} orphans",
                report.lost, report.orphans
            );
            failed = true;
        }
        if !guarded && report.lost.is_empty() {
            eprintln!("race: FAILED: {label} lost nothing: the harness proves nothing with these settings");
            failed = true;
        }
        drop(guard);
    }
    println!("{}", table.join("\n"));
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
