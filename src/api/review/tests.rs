use super::*;
use std::borrow::Cow;

use crate::rules::worker::pod::WorkerPod;
use crate::rules::{in_use::InUseObject, worker::SecretObject};
use rstest::rstest;
use serde_json::{Value, json};

fn secret_delete() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "requestKind": {"group": "", "version": "v1", "kind": "Secret"},
            "name": "cds-worker-config-w1",
            "namespace": "cds",
            "operation": "DELETE",
            "userInfo": {
                "username": "system:serviceaccount:cds:hatchery",
                "uid": "user-uid",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["hatchery-0"]}
            },
            "oldObject": {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {
                    "name": "cds-worker-config-w1", "namespace": "cds", "uid": "secret-uid",
                    "creationTimestamp": "2026-01-01T10:00:00Z",
                    "labels": {"CDS_WORKER_NAME": "w1"},
                    "annotations": {"note": "a user's text"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "w1", "uid": "pod-uid"}],
                    "managedFields": [{"manager": "hatchery", "fieldsV1": {"f:data": {}}}]
                },
                "data": {"CDS_CONFIG": "dG9wLXNlY3JldA=="},
                "type": "Opaque"
            },
            "dryRun": true,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        }
    })
}

fn set(mut review: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = review.pointer_mut(parent).unwrap().as_object_mut().unwrap();
    parent.insert(key.to_owned(), value);
    review
}

fn remove(mut review: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    review.pointer_mut(parent).unwrap().as_object_mut().unwrap().remove(key);
    review
}

fn bytes(review: &Value) -> Vec<u8> {
    serde_json::to_vec(review).unwrap()
}

#[test]
fn a_secret_delete_keeps_what_the_rules_read_borrowed_from_the_body() {
    let body = bytes(&secret_delete());
    let request = decode::<SecretObject>(&body).unwrap();

    assert!(matches!(request.uid.0, Cow::Borrowed("uid-1")), "{:?}", request.uid);
    assert_eq!(
        (&*request.kind.group, &*request.kind.version, &*request.kind.kind),
        ("", "v1", "Secret")
    );
    assert_eq!(&*request.name, "cds-worker-config-w1");
    assert_eq!(request.namespace.as_deref(), Some("cds"));
    assert_eq!(request.operation, Operation::Delete);
    assert!(matches!(
        request.user_info.username.as_ref().map(|user| &user.0),
        Some(Cow::Borrowed("system:serviceaccount:cds:hatchery"))
    ));
    assert_eq!(
        request.user_info.groups.as_deref(),
        Some(&["system:serviceaccounts".to_owned(), "system:authenticated".to_owned()][..])
    );
    assert!(request.dry_run);
    assert!(request.object.is_none());

    let secret = &request.old_object.as_ref().unwrap().metadata;
    assert_eq!(secret.name.as_deref(), Some("cds-worker-config-w1"));
    assert_eq!(secret.uid.as_deref(), Some("secret-uid"));
    assert_eq!(
        secret.labels.as_ref().and_then(|labels| labels.get("CDS_WORKER_NAME")),
        Some(&"w1".to_owned())
    );
    let owner = &secret.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Pod", "w1", "pod-uid")
    );
    assert_eq!(
        secret.creation_timestamp.as_ref().map(|time| time.0.to_string()),
        Some("2026-01-01T10:00:00Z".to_owned())
    );
    let kept = format!("{request:?}");
    for skipped in [
        "dG9wLXNlY3JldA==",
        "a user's text",
        "hatchery-0",
        "f:data",
        "Background",
    ] {
        assert!(!kept.contains(skipped), "{skipped} was kept: {kept}");
    }
}

#[test]
fn an_in_use_delete_keeps_the_force_annotation_the_opt_in_label_and_the_finalizers_alone() {
    let force = crate::rules::in_use::FORCE_ANNOTATION;
    let opt_in = crate::rules::in_use::OPT_IN_LABEL;
    let review = set(
        secret_delete(),
        "/request/oldObject/metadata/annotations",
        json!({
            "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"CDS_CONFIG\":\"dG9wLXNlY3JldA==\"}}",
            force: "INC-42",
            "note": {"not": "a string"},
        }),
    );
    let review = set(
        review,
        "/request/oldObject/metadata/labels",
        json!({"CDS_WORKER_NAME": "w1", opt_in: "defer"}),
    );
    let review = set(
        review,
        "/request/oldObject/metadata/finalizers",
        json!([crate::rules::in_use::FINALIZER]),
    );
    let body = bytes(&review);
    let request = decode::<InUseObject>(&body).unwrap();
    let object = &request.old_object.as_ref().unwrap().metadata;
    assert_eq!(
        (object.name.as_deref(), object.uid.as_deref()),
        (Some("cds-worker-config-w1"), Some("secret-uid"))
    );
    assert_eq!(
        object.annotations,
        Some([(force.to_owned(), "INC-42".to_owned())].into())
    );
    assert_eq!(object.labels, Some([(opt_in.to_owned(), "defer".to_owned())].into()));
    assert!(crate::rules::in_use::is_held(object));
    let kept = format!("{request:?}");
    for skipped in ["dG9wLXNlY3JldA==", "last-applied", "CDS_WORKER_NAME", "f:data"] {
        assert!(!kept.contains(skipped), "{skipped} was kept: {kept}");
    }

    let body = bytes(&remove(secret_delete(), "/request/oldObject/metadata/annotations"));
    let request = decode::<InUseObject>(&body).unwrap();
    assert_eq!(request.old_object.unwrap().metadata.annotations, None);
}

#[test]
fn an_escaped_string_is_unescaped_into_a_copy() {
    let body = br#"{"apiVersion": "admission.k8s.io\/v1", "kind": "AdmissionReview", "request": {
        "uid": "a\u0062c", "kind": {"group": "", "version": "v1", "kind": "Secret"},
        "resource": {"group": "", "version": "v1", "resource": "secrets"},
        "operation": "DELETE", "userInfo": {"username": "jane\"doe"}}}"#;
    let request = decode::<SecretObject>(body).unwrap();
    assert!(matches!(request.uid.0, Cow::Owned(ref uid) if uid == "abc"));
    assert_eq!(request.user_info.username.as_deref(), Some("jane\"doe"));
}

#[test]
fn fields_the_rules_read_may_be_missing() {
    let review = remove(secret_delete(), "/request/name");
    let review = remove(review, "/request/namespace");
    let review = remove(review, "/request/userInfo/username");
    let review = remove(review, "/request/userInfo/groups");
    let review = remove(review, "/request/dryRun");
    let review = remove(review, "/request/oldObject/metadata/labels");
    let review = remove(review, "/request/oldObject/metadata/creationTimestamp");
    let body = bytes(&review);
    let request = decode::<SecretObject>(&body).unwrap();

    assert_eq!(&*request.name, "");
    assert_eq!(request.namespace, None);
    assert_eq!(request.user_info.username, None);
    assert_eq!(request.user_info.groups, None);
    assert!(!request.dry_run);
    let secret = &request.old_object.as_ref().unwrap().metadata;
    assert_eq!(
        (secret.labels.as_ref(), secret.creation_timestamp.as_ref()),
        (None, None)
    );

    let body = bytes(&remove(secret_delete(), "/request/oldObject"));
    assert!(decode::<SecretObject>(&body).unwrap().old_object.is_none());
}

#[rstest]
#[case::labels_not_a_map("/request/oldObject/metadata/labels", json!(["w1"]))]
#[case::label_not_a_string("/request/oldObject/metadata/labels/CDS_WORKER_NAME", json!(1))]
#[case::creation_time_not_a_time("/request/oldObject/metadata/creationTimestamp", json!("yesterday"))]
#[case::owner_uid_not_a_string("/request/oldObject/metadata/ownerReferences", json!([{"apiVersion": "v1", "kind": "Pod", "name": "w1", "uid": 7}]))]
#[case::object_not_an_object("/request/oldObject", json!("a secret"))]
fn an_object_of_the_wrong_shape_is_left_out_of_a_review_still_answered(#[case] pointer: &str, #[case] value: Value) {
    let body = bytes(&set(secret_delete(), pointer, value));
    let request = decode::<SecretObject>(&body).unwrap();
    assert!(request.old_object.is_none());
    assert_eq!(&*request.uid, "uid-1");
    assert_eq!(&*request.name, "cds-worker-config-w1");
    // The pod endpoint reads the same body as the same review.
    let pod = decode::<WorkerPod>(&body).unwrap();
    assert_eq!((pod.uid, pod.operation), (request.uid, request.operation));
}

#[rstest]
#[case::no_uid(remove(secret_delete(), "/request/uid"), "missing field `uid`")]
#[case::no_user(remove(secret_delete(), "/request/userInfo"), "missing field `userInfo`")]
#[case::no_resource(remove(secret_delete(), "/request/resource"), "missing field `resource`")]
#[case::uid_not_a_string(set(secret_delete(), "/request/uid", json!(42)), "invalid type: integer `42`, expected a string")]
#[case::username_not_a_string(set(secret_delete(), "/request/userInfo/username", json!(["jane"])), "expected a string")]
#[case::groups_not_a_list(set(secret_delete(), "/request/userInfo/groups", json!("admins")), "expected a sequence")]
#[case::namespace_not_a_string(set(secret_delete(), "/request/namespace", json!({})), "expected a string")]
#[case::dry_run_not_a_boolean(set(secret_delete(), "/request/dryRun", json!("yes")), "expected a boolean")]
#[case::unknown_operation(set(secret_delete(), "/request/operation", json!("DESTROY")), "unknown variant `DESTROY`")]
#[case::kind_without_version(remove(secret_delete(), "/request/kind/version"), "missing field `version`")]
fn a_request_the_rules_cannot_read_is_not_a_review(#[case] review: Value, #[case] message: &str) {
    for error in [
        decode::<SecretObject>(&bytes(&review)).unwrap_err(),
        decode::<WorkerPod>(&bytes(&review)).unwrap_err(),
    ] {
        assert!(matches!(error, ApiError::NotAReview(_)), "{error:?}");
        let text = error.to_string();
        assert!(text.starts_with("request body is not an AdmissionReview: "), "{text}");
        assert!(text.contains(message), "{text} lacks {message}");
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
    }
}

#[rstest]
#[case::truncated(&b"{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\""[..], "request body is not JSON: EOF")]
#[case::garbage(&b"hello"[..], "request body is not JSON: expected value")]
#[case::not_utf8(&b"{\"apiVersion\": \"\xff\"}"[..], "request body is not JSON: invalid utf-8")]
#[case::wrong_version(
    &br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}"#[..],
    "unsupported AdmissionReview version \"admission.k8s.io/v1beta1\""
)]
#[case::wrong_kind(
    &br#"{"apiVersion": "admission.k8s.io/v1", "kind": "Review"}"#[..],
    "unsupported AdmissionReview version \"admission.k8s.io/v1/Review\""
)]
#[case::no_request(&br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#[..], "AdmissionReview has no request")]
fn a_body_that_is_not_a_review_gets_a_clear_error(#[case] body: &[u8], #[case] message: &str) {
    let error = decode::<SecretObject>(body).unwrap_err();
    assert!(error.to_string().starts_with(message), "{error} is not {message}");
    assert_eq!(error.status(), StatusCode::BAD_REQUEST);
}

#[rstest]
#[case::secret_delete(secret_delete(), true)]
#[case::other_kind(set(secret_delete(), "/request/kind/kind", json!("ConfigMap")), false)]
#[case::other_group(set(secret_delete(), "/request/kind/group", json!("apps")), false)]
#[case::other_version(set(secret_delete(), "/request/kind/version", json!("v2")), false)]
#[case::other_operation(set(secret_delete(), "/request/operation", json!("UPDATE")), false)]
#[case::subresource(set(secret_delete(), "/request/subResource", json!("status")), false)]
#[case::empty_subresource(set(secret_delete(), "/request/subResource", json!("")), true)]
fn only_the_handled_kind_and_operation_are_for_the_endpoint(#[case] review: Value, #[case] handled: bool) {
    let body = bytes(&review);
    let request = decode::<SecretObject>(&body).unwrap();
    assert_eq!(is_for(&request, "Secret", Operation::Delete), handled);
}

#[test]
fn an_answer_is_an_admission_review_that_echoes_the_uid() {
    let allow: Value = serde_json::from_slice(&encode(&Answer::allow("uid-1")).unwrap()).unwrap();
    assert_eq!(
        allow,
        json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": {"uid": "uid-1", "allowed": true}})
    );

    let deny = Answer {
        allowed: false,
        status: Some(Status {
            code: 403,
            message: "pod w1 still uses it".to_owned(),
            reason: "Forbidden".to_owned(),
            ..Status::default()
        }),
        audit_annotations: vec![("decision", "deny".to_owned()), ("reason", "pod-live".to_owned())],
        ..Answer::allow("uid-2")
    };
    let deny: Value = serde_json::from_slice(&encode(&deny).unwrap()).unwrap();
    assert_eq!(
        deny["response"],
        json!({
            "uid": "uid-2", "allowed": false,
            "status": {"code": 403, "message": "pod w1 still uses it", "reason": "Forbidden"},
            "auditAnnotations": {"decision": "deny", "reason": "pod-live"}
        })
    );

    let patched = Answer {
        patch: Some(br#"[{"op":"add"}]"#.to_vec()),
        warnings: vec!["careful".to_owned()],
        ..Answer::allow("uid-3")
    };
    let patched: Value = serde_json::from_slice(&encode(&patched).unwrap()).unwrap();
    assert_eq!(
        patched["response"],
        json!({
            "uid": "uid-3", "allowed": true, "patch": "W3sib3AiOiJhZGQifV0=", "patchType": "JSONPatch",
            "warnings": ["careful"]
        })
    );
}
