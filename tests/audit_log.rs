//! The audit trail as the log shows it. Capturing log lines needs the thread's own
//! subscriber, which tracing's callsite cache only honours reliably when no other test
//! runs at the same time: these tests live in a binary of their own, and run one by one.
#![allow(clippy::unwrap_used)]

mod common;

use std::{sync::Arc, time::Duration};

use cds_secret_guard::Server;
use common::*;
use serde_json::Value;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn secret_delete(age: Duration) -> Value {
    set(
        review("secret-delete"),
        "/request/oldObject/metadata/creationTimestamp",
        time_ago(age),
    )
}

/// A decision still running at the request deadline is a denial, audited like any other.
#[tokio::test]
async fn a_decision_past_the_request_deadline_is_denied_and_audited() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let server = Server::new(
        cds_secret_guard::Config {
            request_timeout: Duration::from_millis(300),
            ..config(policy(), std::path::Path::new("/nonexistent"))
        },
        Arc::new(FakeCluster::slow(Duration::from_secs(30))),
    );

    let (answer, logs) = capture_logs(post(
        &server.router(),
        "/validate",
        secret_delete(Duration::from_secs(3600)).to_string(),
    ))
    .await;

    let response = &answer.1["response"];
    assert_eq!(response["allowed"], false, "{}", answer.1);
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot decide on secret cds-worker-config-w1 within 300ms"),
        "{response}"
    );
    assert_eq!(response["auditAnnotations"]["reason"], "lookup-failed");
    let audit = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|line| line["audit"] == true)
        .unwrap_or_else(|| panic!("no audit line in:\n{logs}"));
    assert_eq!(audit["decision"], "deny");
    assert_eq!(audit["reason"], "lookup-failed");
    assert_eq!(audit["worker"], "w1");
}
