//! The audit trail as the log shows it. Capturing log lines needs the thread's own
//! subscriber, which tracing's callsite cache only honours reliably when no other test
//! runs at the same time: these tests live in a binary of their own, and run one by one.
#![allow(clippy::unwrap_used)]

use testkit::fake as common;

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

/// The real binary, quieted with `RUST_LOG=warn`, still writes every decision: the first
/// of a run of identical denials at once, the rest as one summary line with their count.
#[tokio::test]
async fn the_audit_trail_ignores_rust_log_and_summarises_repeats() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = tempfile::tempdir().unwrap();
    cds_secret_guard::certs::write(dir.path(), &["localhost".to_owned()]).unwrap();
    let port = |_| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (admission, probes) = (port(()), port(()));
    let guard = std::process::Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"))
        .arg("serve")
        .env("KUBECONFIG", dir.path().join("none"))
        .env("RUST_LOG", "warn")
        .env("CDS_GUARD_LISTEN", format!("127.0.0.1:{admission}"))
        .env("CDS_GUARD_PROBE_LISTEN", format!("127.0.0.1:{probes}"))
        .env("CDS_GUARD_TLS_CERT", dir.path().join("tls.crt"))
        .env("CDS_GUARD_TLS_KEY", dir.path().join("tls.key"))
        .env("CDS_GUARD_AUDIT_SUMMARY_WINDOW", "1s")
        .env("CDS_GUARD_DRAIN_DELAY", "0s")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("ca.crt")).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let url = format!("https://localhost:{admission}/validate");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client
        .get(format!("https://localhost:{admission}/"))
        .send()
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < deadline, "the guard did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A cleanup loop asking 50 times, then another secret once.
    for _ in 0..50 {
        let answer: Value = client
            .post(&url)
            .json(&secret_delete(Duration::from_secs(5)))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["response"]["allowed"], false);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let other = set(
        secret_delete(Duration::from_secs(5)),
        "/request/name",
        "cds-worker-config-w2".into(),
    );
    let other = set(other, "/request/oldObject/metadata/name", "cds-worker-config-w2".into());
    let other = set(other, "/request/oldObject/metadata/labels/CDS_WORKER_NAME", "w2".into());
    client.post(&url).json(&other).send().await.unwrap();

    let stopping = std::time::Instant::now();
    nix_kill_term(guard.id());
    // Waited for off the runtime, whose client connection must answer the server's goodbye.
    let output = tokio::task::spawn_blocking(move || guard.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "an idle client held the shutdown for {:?}",
        stopping.elapsed()
    );
    let lines: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|line: &Value| line["audit"] == true)
        .collect();
    let of = |secret: &str| lines.iter().filter(|l| l["secret"] == secret).collect::<Vec<_>>();
    let first = of("cds-worker-config-w1");
    assert_eq!(first.len(), 2, "one line, then one summary: {first:?}");
    assert_eq!(first[0]["reason"], "too-young");
    assert!(first[0]["repeated"].is_null());
    assert_eq!(first[1]["repeated"], 49, "{}", first[1]);
    assert!(first[1]["first_seen"].is_string() && first[1]["last_seen"].is_string());
    assert_eq!(of("cds-worker-config-w2").len(), 1);
}

/// An in-use decision has its own line: the object's kind and name, the pods that keep
/// it, the requester; never the object's data, nor its other annotations (kubectl's
/// last-applied copy of the data). A forced delete is a line of its own.
#[tokio::test]
async fn an_in_use_decision_names_the_object_and_its_pods_never_its_data() {
    use testkit::in_use::*;
    let _serial = ONE_AT_A_TIME.lock().await;
    let pods = Pods {
        users: vec![user("web-1"), user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(cds_secret_guard::rules::Mode::Enforce), pods);
    let router = server.router();

    let (_, logs) = capture_logs(async {
        post(&router, "/validate-in-use", configmap_delete().to_string()).await;
        let forced = forced(configmap_delete(), "INC-42 rotate");
        post(&router, "/validate-in-use", forced.to_string()).await;
    })
    .await;

    let audit: Vec<Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["audit"] == true)
        .collect();
    assert_eq!(audit.len(), 2, "{logs}");
    let (denied, forced) = (&audit[0], &audit[1]);
    assert_eq!(denied["message"], "in-use delete deny");
    assert_eq!(
        [
            &denied["rules"],
            &denied["kind"],
            &denied["object"],
            &denied["namespace"]
        ],
        ["in-use", "ConfigMap", "settings", "cds"]
    );
    assert_eq!(
        (&denied["reason"], &denied["pods"]),
        (&"in-use".into(), &"web-0,web-1".into())
    );
    assert_eq!(denied["user"], "alice");
    assert_eq!(forced["message"], "in-use delete allow");
    assert_eq!(forced["reason"], "forced");
    assert!(forced["detail"].as_str().unwrap().contains("INC-42 rotate"), "{forced}");
    assert!(!logs.contains("hunter2"), "the data reached the log: {logs}");
    assert!(
        !logs.contains("last-applied"),
        "another annotation reached the log: {logs}"
    );
}

/// SIGTERM, as Kubernetes stops a pod.
fn nix_kill_term(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
