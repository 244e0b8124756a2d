//! The hatchery race on the real control plane, short: without the guard, CDS's cleanup
//! loses secrets of live workers; with it, none is lost and none is left behind.
#![allow(clippy::unwrap_used)]

use testkit::cluster;
use testkit::race;

use cluster::{Guard, TestNamespace, client, unregister_webhooks};
use race::{Cleanup, Settings, TABLE_HEADER, row, run};

#[tokio::test]
async fn the_guard_stops_the_race() {
    let settings = Settings {
        spawns: 200,
        concurrency: 24,
        ..Settings::default()
    };
    let mut table = vec![TABLE_HEADER.to_owned()];
    let mut guard = None;

    for (guarded, cleanup) in [
        (false, Cleanup::BeforeFix),
        (false, Cleanup::AfterFix),
        (true, Cleanup::BeforeFix),
        (true, Cleanup::AfterFix),
    ] {
        if !guarded {
            assert!(unregister_webhooks(), "cannot remove the webhooks");
        } else if guard.is_none() {
            guard = Some(Guard::start());
        }
        let ns = TestNamespace::new("race").await;
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
        let mode = format!("{}, {cleanup:?}", if guarded { "guard" } else { "no guard" });
        table.push(row(&mode, &report));
        if guarded {
            assert!(report.lost.is_empty(), "{mode}: lost {:?}", report.lost);
            assert_eq!(report.orphans, 0, "{mode}: orphans");
            assert!(
                report.denied.values().sum::<usize>() > 0,
                "{mode}: the guard refused the cleanup's deletes"
            );
        } else {
            assert!(
                !report.lost.is_empty(),
                "{mode}: the race must lose secrets without the guard: {report:?}"
            );
        }
    }
    println!("{}", table.join("\n"));
}
