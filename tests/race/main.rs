//! The hatchery race on the real control plane, short: without the guard, CDS's cleanup
//! loses secrets of live workers; with it, none is lost and none is left behind.
#![allow(clippy::unwrap_used)]

#[path = "../e2e/harness.rs"]
mod e2e;
mod harness;

use e2e::{Guard, TestNamespace, client, kubectl};
use harness::{Cleanup, Settings, TABLE_HEADER, row, run};

fn unregister_guard() {
    let status = kubectl()
        .args([
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            "cds-secret-guard",
        ])
        .args(["--ignore-not-found"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn the_guard_stops_the_race() {
    let settings = Settings {
        spawns: 200,
        concurrency: 24,
        ..Settings::default()
    };
    let mut table = vec![TABLE_HEADER.to_owned()];

    unregister_guard();
    for cleanup in [Cleanup::BeforeFix, Cleanup::AfterFix] {
        let ns = TestNamespace::new("race-open").await;
        let report = run(
            client().await,
            client().await,
            &ns.name,
            &Settings {
                cleanup,
                ..settings.clone()
            },
        )
        .await;
        table.push(row(&format!("no guard, {cleanup:?}"), &report));
        assert!(
            !report.lost.is_empty(),
            "without the guard the race must lose secrets ({cleanup:?}): {report:?}"
        );
    }

    let guard = Guard::start();
    for cleanup in [Cleanup::BeforeFix, Cleanup::AfterFix] {
        let ns = TestNamespace::new("race-guarded").await;
        let report = run(
            client().await,
            client().await,
            &ns.name,
            &Settings {
                cleanup,
                ..settings.clone()
            },
        )
        .await;
        table.push(row(&format!("guard, {cleanup:?}"), &report));
        assert!(
            report.lost.is_empty(),
            "lost with the guard ({cleanup:?}): {:?}",
            report.lost
        );
        assert_eq!(
            report.orphans,
            0,
            "orphans with the guard ({cleanup:?}); log: {}",
            guard.log_path().display()
        );
        assert!(
            report.denied.values().sum::<usize>() > 0,
            "the guard refused the cleanup's deletes"
        );
    }
    println!("{}", table.join("\n"));
}
