//! Handler tests of `/validate-in-use`: AdmissionReviews of Secret and ConfigMap deletes
//! through the real router, with an in-memory cluster behind in-use protection's reads.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use std::{sync::Arc, time::Duration};

use axum::http::StatusCode;
use cds_secret_guard::{Server, config::Config, rules::Mode, rules::in_use::Dependent};
use serde_json::json;
use testkit::{fake::*, in_use::*};

#[tokio::test]
async fn a_pod_that_uses_it_denies_naming_it_in_the_answer_and_the_metrics() {
    let pods = Pods {
        users: vec![user("web-1"), user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    let (status, answer) = post(&server.router(), "/validate-in-use", configmap_delete().to_string()).await;

    assert_eq!(status, StatusCode::OK);
    let response = &answer["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("configmap settings is in use by pod web-0, web-1 in namespace cds"),
        "{message}"
    );
    let annotations = &response["auditAnnotations"];
    assert_eq!(annotations["decision"], "deny");
    assert_eq!(annotations["reason"], "in-use");
    assert_eq!(annotations["pods"], "web-0,web-1");

    let (_, metrics) = get_text(&server.probe_router(), "/metrics").await;
    let denied = [
        ("rules", "in-use"),
        ("operation", "DELETE"),
        ("decision", "deny"),
        ("reason", "in-use"),
    ];
    assert_eq!(
        counter(&metrics, "cds_secret_guard_admission_decisions_total", &denied),
        1.0
    );
}

#[tokio::test]
async fn no_user_allows_without_a_word_in_the_apiservers_audit_log() {
    let pods = Pods {
        users: vec![Dependent {
            terminal: true,
            ..user("job-x")
        }],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    let (_, answer) = post(&server.router(), "/validate-in-use", configmap_delete().to_string()).await;
    assert_eq!(
        answer["response"],
        json!({"uid": "b1c2d3e4-0000-4000-8000-000000000003", "allowed": true})
    );
}

#[tokio::test]
async fn the_force_annotation_lets_it_through_audited_as_forced() {
    let pods = Pods {
        users: vec![user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    let review = forced(configmap_delete(), "INC-42 rotate");
    let (_, answer) = post(&server.router(), "/validate-in-use", review.to_string()).await;

    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["auditAnnotations"]["reason"], "forced");
    assert!(
        response["auditAnnotations"]["message"]
            .as_str()
            .unwrap()
            .contains("INC-42 rotate"),
        "{response}"
    );
}

#[tokio::test]
async fn a_secret_is_judged_as_a_configmap_is() {
    let pods = Pods {
        users: vec![user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    let review = set(configmap_delete(), "/request/kind/kind", json!("Secret"));
    let review = set(review, "/request/resource/resource", json!("secrets"));
    let review = set(review, "/request/oldObject/data", json!({"password": "aHVudGVyMg=="}));
    let (_, answer) = post(&server.router(), "/validate-in-use", review.to_string()).await;
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("secret settings is in use by pod web-0"),
        "{message}"
    );
}

#[tokio::test]
async fn reads_past_the_lookup_timeout_deny() {
    let pods = Pods {
        delay: Some(Duration::from_secs(30)),
        ..Pods::default()
    };
    let mut config = in_use_config(Mode::Enforce);
    config.rules.lookup_timeout = Duration::from_millis(100);
    let server = server(config, pods);
    let (_, answer) = post(&server.router(), "/validate-in-use", configmap_delete().to_string()).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["auditAnnotations"]["reason"], "lookup-failed");
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot verify within 100ms that no pod uses configmap settings"),
        "{response}"
    );
}

#[tokio::test]
async fn a_guard_without_the_flag_refuses_what_its_webhook_sends() {
    let config = Config {
        in_use_protection: false,
        ..in_use_config(Mode::Enforce)
    };
    let server = Server::with_in_use(config, Arc::new(FakeCluster::default()), Arc::new(Pods::default()));
    let (_, answer) = post(&server.router(), "/validate-in-use", configmap_delete().to_string()).await;
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("serve --in-use-protection"), "{message}");
}

#[tokio::test]
async fn warn_mode_allows_with_the_denial_as_a_warning() {
    let pods = Pods {
        users: vec![user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Warn), pods);
    let (_, answer) = post(&server.router(), "/validate-in-use", configmap_delete().to_string()).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    let warning = response["warnings"][0].as_str().unwrap();
    assert!(
        warning.starts_with("cds-secret-guard would deny: configmap settings is in use by pod web-0"),
        "{warning}"
    );
}

#[tokio::test]
async fn other_requests_pass_untouched() {
    let pods = Pods {
        users: vec![user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    for (pointer, value) in [
        ("/request/operation", json!("UPDATE")),
        ("/request/kind/kind", json!("Pod")),
        ("/request/subResource", json!("status")),
    ] {
        let review = set(configmap_delete(), pointer, value);
        let (_, answer) = post(&server.router(), "/validate-in-use", review.to_string()).await;
        assert_eq!(answer["response"]["allowed"], true, "{pointer}");
    }
}

#[tokio::test]
async fn in_defer_a_held_object_goes_through_with_a_warning_and_no_read() {
    // Any read would take 30 s, past the lookup timeout: an answer at all proves none.
    let pods = Pods {
        users: vec![user("web-0")],
        delay: Some(Duration::from_secs(30)),
    };
    let mut config = in_use_config(Mode::Enforce);
    config.rules.lookup_timeout = Duration::from_millis(100);
    let guard = server(config, pods);
    let held = set(
        configmap_delete(),
        "/request/oldObject/metadata/finalizers",
        json!(["example.com/other", "cds-secret-guard.io/in-use"]),
    );
    // The object's own label asks for `defer`; the guard's default is `refuse`.
    let held = set(
        held,
        "/request/oldObject/metadata/labels",
        json!({"cds-secret-guard/in-use-protection": "defer"}),
    );
    let (_, answer) = post(&guard.router(), "/validate-in-use", held.to_string()).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        response["warnings"],
        json!(["configmap settings will be deleted once no pod of namespace cds uses it"])
    );
    assert_eq!(response["auditAnnotations"]["reason"], "deferred");

    // Not held yet: the safety net refuses, as `refuse` does, and says to retry.
    let pods = Pods {
        users: vec![user("web-0")],
        ..Pods::default()
    };
    let server = server(in_use_config(Mode::Enforce), pods);
    let unheld = set(
        configmap_delete(),
        "/request/oldObject/metadata/labels",
        json!({"cds-secret-guard/in-use-protection": "defer"}),
    );
    let (_, answer) = post(&server.router(), "/validate-in-use", unheld.to_string()).await;
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("not yet held for a deferred delete: try again"),
        "{message}"
    );
}
