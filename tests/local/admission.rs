//! Handler tests: AdmissionReview fixtures through the real router, one case per rule
//! and reason, with an in-memory cluster behind the lookup trait.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use testkit::fake as common;

use std::{sync::Arc, time::Duration};

use axum::http::StatusCode;
use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use cds_secret_guard::{Server, config::Limits, rules::Mode};
use common::*;
use rstest::rstest;
use serde_json::{Value, json};

const YOUNG: Duration = Duration::from_secs(12);
const OLD: Duration = Duration::from_secs(3600);

fn server(cluster: Arc<FakeCluster>, policy: Policy) -> Server {
    Server::new(config(policy, std::path::Path::new("/nonexistent")), cluster)
}

/// The worker-secret delete fixture, created `age` ago.
fn secret_delete(age: Duration) -> Value {
    set(
        review("secret-delete"),
        "/request/oldObject/metadata/creationTimestamp",
        time_ago(age),
    )
}

fn owned_by(review: Value, pod: &str, uid: &str) -> Value {
    let owner = json!([{ "apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid }]);
    set(review, "/request/oldObject/metadata/ownerReferences", owner)
}

fn terminating(mut pod: FakePod) -> FakePod {
    pod.terminating = true;
    pod
}

fn exempt_group_policy() -> Policy {
    policy().with(|p| p.rules.exempt_groups = vec!["cds-admins".into()])
}

struct Expect {
    allowed: bool,
    reason: &'static str,
    message: &'static str,
}

const fn allow(reason: &'static str) -> Expect {
    Expect {
        allowed: true,
        reason,
        message: "",
    }
}

const fn deny(reason: &'static str, message: &'static str) -> Expect {
    Expect {
        allowed: false,
        reason,
        message,
    }
}

#[rstest]
#[case::unprotected_secret_is_allowed_without_lookup(
    set(set(secret_delete(YOUNG), "/request/name", json!("db-password")), "/request/oldObject/metadata", json!({"name": "db-password", "namespace": "cds", "creationTimestamp": "2026-11-30T10:00:00Z"})),
    FakeCluster::failing(), policy(), allow("not-protected"))]
#[case::labelled_secret_without_prefix_is_protected(
    set(set(secret_delete(YOUNG), "/request/name", json!("my-config")), "/request/oldObject/metadata/name", json!("my-config")),
    FakeCluster::default(), policy(), deny("too-young", "secret my-config is 12s old; it cannot be deleted within 10m of creation"))]
#[case::exempt_user(
    set(secret_delete(YOUNG), "/request/userInfo/username", json!("system:serviceaccount:kube-system:namespace-controller")),
    FakeCluster::failing(), policy(), allow("exempt"))]
#[case::exempt_group(
    set(secret_delete(YOUNG), "/request/userInfo/groups", json!(["cds-admins"])),
    FakeCluster::failing(), exempt_group_policy(), allow("exempt"))]
#[case::owner_gone_even_when_young(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"),
    FakeCluster::default(),
    policy(),
    allow("owner-gone")
)]
#[case::owner_replaced_by_a_finished_pod_of_the_same_name(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"),
    FakeCluster::with_pods([pod("w1", "uid-2", "Succeeded", "other")]), policy(), allow("owner-gone"))]
#[case::owner_gone_but_a_new_pod_of_the_worker_lives(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"),
    FakeCluster::with_pods([pod("w1", "uid-2", "Pending", "other")]), policy(), deny("pod-live", "pod w1 (uid uid-2, Pending) still uses secret cds-worker-config-w1"))]
#[case::owner_gone_but_a_labelled_pod_of_the_worker_lives(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"),
    FakeCluster::with_pods([pod("w1-retry", "uid-3", "Running", "w1")]), policy(), deny("pod-live", "pod w1-retry (uid uid-3, Running)"))]
#[case::owner_gone_and_the_labelled_pods_unverifiable(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"),
    FakeCluster { failing_lists: true, ..FakeCluster::default() }, policy(), deny("lookup-failed", "cannot verify that no pod of worker w1 uses secret"))]
#[case::live_owner_protects(
    owned_by(secret_delete(OLD), "w1", "uid-1"),
    FakeCluster::with_pods([pod("w1", "uid-1", "Running", "w1")]), policy(), deny("pod-live", "pod w1 (uid uid-1, Running) still uses secret cds-worker-config-w1"))]
#[case::young_secret(
    secret_delete(YOUNG),
    FakeCluster::default(),
    policy(),
    deny(
        "too-young",
        "secret cds-worker-config-w1 is 12s old; it cannot be deleted within 10m of creation"
    )
)]
#[case::young_secret_dry_run(
    set(secret_delete(YOUNG), "/request/dryRun", json!(true)),
    FakeCluster::default(), policy(), deny("too-young", "cannot be deleted within 10m of creation"))]
#[case::pod_named_after_the_worker(
    secret_delete(OLD),
    FakeCluster::with_pods([pod("w1", "uid-1", "Pending", "w1")]), policy(), deny("pod-live", "pod w1 (uid uid-1, Pending) still uses secret cds-worker-config-w1"))]
#[case::pod_labelled_with_the_worker(
    secret_delete(OLD),
    FakeCluster::with_pods([pod("worker-pod-x", "uid-9", "Running", "w1")]), policy(), deny("pod-live", "pod worker-pod-x (uid uid-9, Running)"))]
#[case::terminating_pod_does_not_protect(
    secret_delete(OLD),
    FakeCluster::with_pods([terminating(pod("w1", "uid-1", "Running", "w1"))]), policy(), allow("orphan"))]
#[case::succeeded_pod_does_not_protect(
    secret_delete(OLD),
    FakeCluster::with_pods([pod("w1", "uid-1", "Succeeded", "w1")]), policy(), allow("orphan"))]
#[case::failed_pod_does_not_protect(
    secret_delete(OLD),
    FakeCluster::with_pods([pod("w1", "uid-1", "Failed", "w1")]), policy(), allow("orphan"))]
#[case::another_workers_pod_does_not_protect(
    secret_delete(OLD),
    FakeCluster::with_pods([pod("w2", "uid-2", "Running", "w2")]), policy(), allow("orphan"))]
#[case::orphan(secret_delete(OLD), FakeCluster::default(), policy(), allow("orphan"))]
#[case::lookup_failure_fails_closed(
    secret_delete(OLD),
    FakeCluster::failing(),
    policy(),
    deny(
        "lookup-failed",
        "cannot verify that no pod of worker w1 uses secret cds-worker-config-w1"
    )
)]
#[case::owner_lookup_failure_fails_closed(
    owned_by(secret_delete(OLD), "w1", "uid-1"),
    FakeCluster::failing(),
    policy(),
    deny("lookup-failed", "refusing to delete it")
)]
#[case::slow_lookup_fails_closed(
    secret_delete(OLD),
    FakeCluster::slow(Duration::from_secs(30)), policy().with(|p| p.rules.lookup_timeout = Duration::from_millis(200)),
    deny("lookup-failed", "did not answer within 200ms"))]
#[case::per_item_delete_of_a_deletecollection(
    set(secret_delete(YOUNG), "/request/name", json!("")),
    FakeCluster::default(), policy(), deny("too-young", "secret cds-worker-config-w1 is 12s old"))]
#[tokio::test]
async fn secret_delete_rules(
    #[case] review: Value,
    #[case] cluster: FakeCluster,
    #[case] policy: Policy,
    #[case] expect: Expect,
) {
    let cluster = Arc::new(cluster);
    let server = server(cluster.clone(), policy);
    let uid = review["request"]["uid"].clone();

    let (status, answer) = post(&server.router(), "/validate", review.to_string()).await;

    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], uid, "uid is echoed");
    assert_eq!(response["allowed"], expect.allowed, "{answer}");
    if expect.allowed {
        assert!(response["auditAnnotations"].is_null(), "{answer}");
    } else {
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(expect.message),
            "{message:?} lacks {:?}",
            expect.message
        );
        assert_eq!(response["auditAnnotations"]["reason"], expect.reason);
        assert_eq!(response["auditAnnotations"]["decision"], "deny");
        assert!(
            !message.contains("dG9wLXNlY3JldC13b3JrZXItdG9rZW4"),
            "secret data in the message"
        );
    }
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    let labels = [("operation", "DELETE"), ("reason", expect.reason)];
    assert_eq!(
        counter(&metrics, "cds_secret_guard_admission_decisions_total", &labels),
        1.0,
        "{metrics}"
    );
    if expect.reason == "not-protected" || expect.reason == "exempt" {
        assert_eq!(cluster.reads(), 0, "no lookup for rules 1 and 2");
    }
}

#[rstest]
#[case::secret_is_read_when_old_object_is_missing(
    Some(json!({"name": "cds-worker-config-w1", "creationTimestamp": "2026-01-01T10:00:00Z", "labels": {"CDS_WORKER_NAME": "w1"}})),
    false, allow("orphan"))]
#[case::young_secret_read_by_name(
    Some(json!({"name": "cds-worker-config-w1", "creationTimestamp": time_ago(YOUNG)})),
    false, deny("too-young", "12s old"))]
#[case::secret_already_gone(None, false, allow("not-found"))]
#[case::secret_unreadable(None, true, deny("lookup-failed", "cannot read secret cds-worker-config-w1"))]
#[tokio::test]
async fn delete_without_old_object(#[case] stored: Option<Value>, #[case] failing: bool, #[case] expect: Expect) {
    let cluster = FakeCluster {
        failing,
        ..FakeCluster::default()
    };
    if let Some(meta) = stored {
        cluster
            .secrets
            .lock()
            .unwrap()
            .push(serde_json::from_value(meta).unwrap());
    }
    let server = server(Arc::new(cluster), policy());
    let review = remove(review("secret-delete"), "/request/oldObject");

    let (status, answer) = post(&server.router(), "/validate", review.to_string()).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], expect.allowed, "{answer}");
    if !expect.allowed {
        assert_eq!(answer["response"]["auditAnnotations"]["reason"], expect.reason);
        assert!(
            answer["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains(expect.message),
            "{answer}"
        );
    }
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    assert_eq!(
        counter(
            &metrics,
            "cds_secret_guard_admission_decisions_total",
            &[("reason", expect.reason)]
        ),
        1.0
    );
}

#[tokio::test]
async fn warn_mode_allows_with_the_same_reasons() {
    let server = server(
        Arc::new(FakeCluster::default()),
        policy().with(|p| p.rules.mode = Mode::Warn),
    );

    let (status, answer) = post(&server.router(), "/validate", secret_delete(YOUNG).to_string()).await;

    assert_eq!(status, StatusCode::OK);
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["auditAnnotations"]["reason"], "too-young");
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("cannot be deleted within 10m of creation"),
        "{warning}"
    );
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    assert_eq!(
        counter(
            &metrics,
            "cds_secret_guard_admission_decisions_total",
            &[("decision", "warn")]
        ),
        1.0
    );
}

#[rstest]
#[case::other_kind(review("configmap-delete"), "/validate")]
#[case::secret_update(set(secret_delete(YOUNG), "/request/operation", json!("UPDATE")), "/validate")]
#[case::secret_subresource(set(secret_delete(YOUNG), "/request/subResource", json!("status")), "/validate")]
#[case::pod_update(set(review("pod-create"), "/request/operation", json!("UPDATE")), "/mutate")]
#[case::pod_subresource(set(review("pod-create"), "/request/subResource", json!("ephemeralcontainers")), "/mutate")]
#[case::secret_create_to_mutate(set(secret_delete(YOUNG), "/request/operation", json!("CREATE")), "/mutate")]
#[tokio::test]
async fn other_requests_pass_untouched(#[case] review: Value, #[case] path: &str) {
    let cluster = Arc::new(FakeCluster::failing());
    let server = server(cluster.clone(), policy());

    let (status, answer) = post(&server.router(), path, review.to_string()).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"]["patch"].is_null(), "{answer}");
    assert_eq!(cluster.reads(), 0);
}

fn decoded_patch(answer: &Value) -> Value {
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");
    let encoded = answer["response"]["patch"]
        .as_str()
        .expect("the patch is a base64 string");
    serde_json::from_slice(&BASE64.decode(encoded).unwrap()).unwrap()
}

#[tokio::test]
async fn worker_pod_gets_its_labels_once() {
    let cluster = FakeCluster::default();
    cluster.secrets.lock().unwrap().push(
        serde_json::from_value(json!({"name": "cds-worker-config-w1", "labels": {"CDS_HATCHERY_NAME": "hatchery-1"}}))
            .unwrap(),
    );
    let server = server(Arc::new(cluster), policy());
    let review = review("pod-create");

    let (status, answer) = post(&server.router(), "/mutate", review.to_string()).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], true);
    let patch = decoded_patch(&answer);
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/metadata/labels/CDS_HATCHERY_NAME", "value": "hatchery-1"},
            {"op": "add", "path": "/metadata/labels/CDS_WORKER_NAME", "value": "w1"},
            {"op": "add", "path": "/metadata/annotations", "value": {"cds-secret-guard/protected-secrets": "cds-worker-config-w1,cds-worker-registry-w1"}},
        ])
    );

    // The apiserver reinvokes with the patched pod: nothing more to do.
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &serde_json::from_value::<json_patch::Patch>(patch).unwrap()).unwrap();
    assert_eq!(
        pod["metadata"]["labels"]["app"], "cds-worker",
        "existing labels are kept"
    );
    let again = set(review, "/request/object", pod);
    let (status, answer) = post(&server.router(), "/mutate", again.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"]["patch"].is_null(), "{answer}");
}

#[tokio::test]
async fn mutation_never_denies() {
    // Hatchery unknown (apiserver down): still labelled with the worker.
    let server = server(Arc::new(FakeCluster::failing()), policy());
    let (_, answer) = post(&server.router(), "/mutate", review("pod-create").to_string()).await;
    assert_eq!(answer["response"]["allowed"], true);
    let patch = decoded_patch(&answer);
    assert_eq!(
        patch[0],
        json!({"op": "add", "path": "/metadata/labels/CDS_WORKER_NAME", "value": "w1"})
    );

    // A pod that does not parse: allowed, unpatched.
    let broken = set(
        review("pod-create"),
        "/request/object/spec/containers",
        json!("not a list"),
    );
    let (status, answer) = post(&server.router(), "/mutate", broken.to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"]["patch"].is_null());
}

#[rstest]
#[case::not_json("{\"apiVersion\": ", StatusCode::BAD_REQUEST, "not JSON")]
#[case::garbage("\u{1}\u{2}garbage", StatusCode::BAD_REQUEST, "not JSON")]
#[case::not_a_review("{\"hello\": \"world\"}", StatusCode::BAD_REQUEST, "not an AdmissionReview")]
#[case::wrong_version(
    "{\"apiVersion\": \"admission.k8s.io/v1beta1\", \"kind\": \"AdmissionReview\", \"request\": null}",
    StatusCode::BAD_REQUEST,
    "unsupported AdmissionReview version"
)]
#[case::no_request(
    "{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\"}",
    StatusCode::BAD_REQUEST,
    "no request"
)]
#[tokio::test]
async fn bad_bodies_get_a_clear_4xx(#[case] body: &str, #[case] status: StatusCode, #[case] message: &str) {
    let server = server(Arc::new(FakeCluster::default()), policy());
    for path in ["/validate", "/mutate"] {
        let (got, answer) = post(&server.router(), path, body.to_owned()).await;
        assert_eq!(got, status, "{path}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains(message), "{error:?} lacks {message:?}");
    }
}

/// Regression (found by `make fuzz`): serde_json does not check the UTF-8 of the fields
/// a type skips, so a pod create with invalid UTF-8 in an unknown field got a 200 from
/// `/mutate` and a 400 from `/validate`. A body that is not UTF-8 is not JSON: 400 on both.
#[tokio::test]
async fn invalid_utf8_is_not_json_on_either_endpoint() {
    let server = server(Arc::new(FakeCluster::default()), policy());
    let review = set(review("pod-create"), "/request/object/spec/unknownField", json!("@@"));
    let review = review.to_string();
    let (head, tail) = review.split_once("@@").unwrap();
    let body = [head.as_bytes(), &[0xf7, 0xbf, 0xbf, 0xbf], tail.as_bytes()].concat();
    for path in ["/validate", "/mutate"] {
        let (status, answer) = post(&server.router(), path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        let error = answer["error"].as_str().unwrap();
        assert!(error.contains("not JSON"), "{path}: {error}");
    }
}

#[tokio::test]
async fn oversize_body_is_413_and_a_1mib_secret_fits() {
    let server = server(Arc::new(FakeCluster::default()), policy());
    // A DELETE of the largest secret there can be: 1 MiB of data, 1.33 MiB in base64.
    let data = BASE64.encode(vec![7u8; 1024 * 1024]);
    let big = set(secret_delete(YOUNG), "/request/oldObject/data/CDS_CONFIG", json!(data));
    let (status, answer) = post(&server.router(), "/validate", big.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["response"]["allowed"], false);

    let oversize = format!("{{\"padding\": \"{}\"}}", "x".repeat(Limits::default().body_limit));
    let (status, answer) = post(&server.router(), "/validate", oversize).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("cannot read request body"));
}

/// The reconciler's watch may deny without a read, never allow: a live pod it shows as
/// the owner, or as the namesake of an unowned secret, denies even when the apiserver
/// cannot be read; a pod it does not show, or shows finished, leaves it to the reads.
#[rstest]
#[case::live_owner_with_the_apiserver_down(
    owned_by(secret_delete(OLD), "w1", "uid-1"), vec![pod("w1", "uid-1", "Running", "w1")], true,
    deny("pod-live", "pod w1 (uid uid-1, Running) still uses secret"))]
#[case::live_owner_in_the_grace_period(
    owned_by(secret_delete(YOUNG), "w1", "uid-1"), vec![pod("w1", "uid-1", "Pending", "w1")], true,
    deny("too-young", "12s old"))]
#[case::live_namesake_of_an_unowned_secret(
    secret_delete(OLD), vec![pod("w1", "uid-1", "Running", "w1")], true,
    deny("pod-live", "pod w1 (uid uid-1, Running)"))]
#[case::a_stale_cache_keeps_a_secret_a_little_longer(
    secret_delete(OLD), vec![pod("w1", "uid-1", "Running", "w1")], false,
    deny("pod-live", "pod w1"))]
#[case::finished_pod_proves_nothing(
    secret_delete(OLD), vec![pod("w1", "uid-1", "Succeeded", "w1")], true,
    deny("lookup-failed", "refusing to delete it"))]
#[case::other_uid_than_the_owner_is_left_to_the_reads(
    owned_by(secret_delete(OLD), "w1", "uid-1"), vec![pod("w1", "uid-2", "Running", "w1")], false,
    allow("owner-gone"))]
#[case::namesake_beside_another_owner_is_left_to_the_reads(
    owned_by(secret_delete(OLD), "w1-old", "uid-0"), vec![pod("w1", "uid-1", "Running", "w1")], true,
    deny("lookup-failed", "refusing to delete it"))]
#[tokio::test]
async fn the_pod_cache_only_ever_denies(
    #[case] review: Value,
    #[case] cached: Vec<FakePod>,
    #[case] apiserver_down: bool,
    #[case] expect: Expect,
) {
    let cluster = FakeCluster {
        cached,
        failing: apiserver_down,
        ..FakeCluster::default()
    };
    let server = server(Arc::new(cluster), policy());

    let (status, answer) = post(&server.router(), "/validate", review.to_string()).await;

    assert_eq!(status, StatusCode::OK);
    let response = &answer["response"];
    assert_eq!(response["allowed"], expect.allowed, "{answer}");
    if !expect.allowed {
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains(expect.message),
            "{message:?} lacks {:?}",
            expect.message
        );
        assert_eq!(response["auditAnnotations"]["reason"], expect.reason, "{answer}");
    }
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    let labels = [("reason", expect.reason)];
    assert_eq!(
        counter(&metrics, "cds_secret_guard_admission_decisions_total", &labels),
        1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_denial_in_a_terminating_namespace_is_an_allow() {
    let cluster = FakeCluster::with_pods([pod("w1", "uid-1", "Running", "w1")]);
    cluster.terminating_namespaces.lock().unwrap().push("cds".into());
    let server = server(Arc::new(cluster), policy());

    for review in [secret_delete(YOUNG), secret_delete(OLD)] {
        let (status, answer) = post(&server.router(), "/validate", review.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
    }
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    let labels = [("decision", "allow"), ("reason", "namespace-terminating")];
    assert_eq!(
        counter(&metrics, "cds_secret_guard_admission_decisions_total", &labels),
        2.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_namespace_that_is_not_watched_is_not_judged() {
    let cluster = Arc::new(FakeCluster::failing());
    let scoped = policy().with(|p| p.rules.namespaces = vec!["ci".into()]);
    let server = server(cluster.clone(), scoped);

    let (_, answer) = post(&server.router(), "/validate", secret_delete(YOUNG).to_string()).await;

    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(cluster.reads(), 0);
    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    assert_eq!(
        counter(
            &metrics,
            "cds_secret_guard_admission_decisions_total",
            &[("reason", "out-of-scope")]
        ),
        1.0
    );
}

/// The hatchery-label reads share one deadline and run at once: a slow apiserver costs
/// the pod its hatchery label, never its worker label.
#[tokio::test]
async fn slow_secret_reads_leave_only_the_hatchery_label_out() {
    let server = Server::new(
        cds_secret_guard::Config {
            mutation_timeout: Duration::from_millis(300),
            ..config(policy(), std::path::Path::new("/nonexistent"))
        },
        Arc::new(FakeCluster::slow(Duration::from_secs(30))),
    );
    let started = std::time::Instant::now();

    let (status, answer) = post(&server.router(), "/mutate", review("pod-create").to_string()).await;

    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    let patch = decoded_patch(&answer);
    assert_eq!(
        patch[0],
        json!({"op": "add", "path": "/metadata/labels/CDS_WORKER_NAME", "value": "w1"})
    );
    assert!(!patch.to_string().contains("CDS_HATCHERY_NAME"), "{patch}");
}

/// A series that first appears at 1 is no increase to Prometheus: the first denial of a
/// kind would not show on a dashboard or fire an alert. Every decision the guard can
/// make is exported at 0 before any review, with the outcome the mode gives it.
#[rstest]
#[case::enforce(Mode::Enforce, "deny")]
#[case::warn(Mode::Warn, "warn")]
#[tokio::test]
async fn every_decision_is_exported_at_zero_before_the_first(#[case] mode: Mode, #[case] refused: &str) {
    let server = server(Arc::new(FakeCluster::default()), policy().with(|p| p.rules.mode = mode));

    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;

    let series: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("cds_secret_guard_admission_decisions_total{"))
        .collect();
    let at_zero = |operation: &str, decision: &str, reason: &str| {
        let labels =
            format!("{{rules=\"worker\",operation=\"{operation}\",decision=\"{decision}\",reason=\"{reason}\"}} 0");
        series.iter().any(|line| line.ends_with(&labels))
    };
    for reason in ["too-young", "pod-live", "lookup-failed"] {
        assert!(
            at_zero("DELETE", refused, reason),
            "no {refused} {reason} at 0: {series:#?}"
        );
    }
    for reason in [
        "not-protected",
        "not-found",
        "out-of-scope",
        "exempt",
        "owner-gone",
        "orphan",
        "namespace-terminating",
    ] {
        assert!(
            at_zero("DELETE", "allow", reason),
            "no allow {reason} at 0: {series:#?}"
        );
    }
    for (decision, reason) in [
        ("patch", "protected-secret"),
        ("unchanged", "protected-secret"),
        ("skip", "no-protected-secret"),
    ] {
        assert!(
            at_zero("CREATE", decision, reason),
            "no {decision} {reason} at 0: {series:#?}"
        );
    }
    assert_eq!(series.len(), 13, "only the decisions the guard can make: {series:#?}");
}
