//! End-to-end: while the guard is down, worker-secret deletes fail (failurePolicy Fail)
//! and nothing is lost; once it is back, deletes are decided again.
#![allow(clippy::unwrap_used)]

#[path = "e2e/harness.rs"]
mod harness;

use std::time::Duration;

use harness::*;
use kube::api::DeleteParams;

#[tokio::test]
async fn worker_secrets_survive_a_guard_outage() {
    let guard = Guard::start();
    let ns = TestNamespace::new("outage").await;
    ns.worker_secret("w-outage").await;
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;

    guard.kill();
    let refused = ns
        .delete_secret("cds-worker-config-w-outage", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code, 500, "{refused:?}");
    assert!(
        refused.message.contains("failed calling webhook"),
        "{}",
        refused.message
    );
    assert!(
        ns.secrets()
            .get_opt("cds-worker-config-w-outage")
            .await
            .unwrap()
            .is_some(),
        "nothing lost"
    );

    guard.run();
    ns.delete_secret("cds-worker-config-w-outage", &DeleteParams::default())
        .await
        .expect("an orphan, deleted once the guard is back");
}
