use super::*;

fn json_pod() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "w1", "namespace": "cds", "uid": "uid-1", "resourceVersion": "42",
            "labels": {"CDS_WORKER_NAME": "w1"},
            "annotations": {"note": "a user's text"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {
            "containers": [{
                "name": "worker", "image": "ubuntu",
                "env": [
                    {"name": "TOKEN", "value": "s3cr3t"},
                    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "from-env", "key": "k"}}},
                    {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "not-a-secret", "key": "k"}}}
                ],
                "envFrom": [{"secretRef": {"name": "from-env-from"}}, {"configMapRef": {"name": "cm"}}]
            }],
            "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "from-init"}}]}],
            "ephemeralContainers": [{"name": "debug", "env": null}],
            "volumes": [
                {"name": "a", "secret": {"secretName": "from-volume"}},
                {"name": "b", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"secret": {"name": "from-projection"}}
                ]}},
                {"name": "c", "emptyDir": {}}
            ],
            "imagePullSecrets": [{"name": "from-pull"}, {"name": ""}],
            "nodeName": "node-1"
        },
        "status": {"phase": "Succeeded", "podIP": "10.0.0.1"}
    })
}

#[test]
fn a_watched_pod_keeps_its_liveness_its_worker_label_and_nothing_of_its_spec() {
    let mut value = json_pod();
    value["metadata"]["labels"]["team"] = "ci".into();
    let mut pod: PodLiveness = serde_json::from_value(value).unwrap();
    pod.keep_worker("CDS_WORKER_NAME");

    let state = PodState::from(&pod);
    assert_eq!((state.name.as_str(), state.uid.as_str()), ("w1", "uid-1"));
    assert_eq!(pod.worker.as_deref(), Some("w1"));
    assert_eq!(pod.metadata.labels, None, "no label map is kept");
    assert_eq!(state.phase.as_deref(), Some("Succeeded"));
    assert_eq!(
        pod.metadata.resource_version.as_deref(),
        Some("42"),
        "the watch resumes from it"
    );
    assert!(!state.is_live(), "a finished pod is not live");
    assert_keeps_none(&pod, &["s3cr3t", "a user's text", "kubectl"]);
}

#[test]
fn a_worker_pod_keeps_its_labels_annotations_and_every_secret_its_spec_names() {
    let pod: WorkerPod = serde_json::from_value(json_pod()).unwrap();

    let names = pod.spec.as_ref().unwrap().names();
    let expected = [
        "from-env",
        "from-env-from",
        "from-init",
        "from-projection",
        "from-pull",
        "from-volume",
    ];
    assert_eq!(names, expected.map(String::from).into());
    assert_eq!(
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("note"))
            .map(String::as_str),
        Some("a user's text")
    );
    let state = PodState::from(&pod);
    assert_eq!(state.labels.get("CDS_WORKER_NAME").map(String::as_str), Some("w1"));
    assert_eq!(pod.phase().map(String::as_str), Some("Succeeded"));
    assert_keeps_none(&pod, &["s3cr3t", "kubectl", "node-1"]);
}

#[test]
fn a_worker_pod_reads_back_what_it_writes() {
    let whole: Pod = serde_json::from_value(json_pod()).unwrap();
    let lean: WorkerPod = serde_json::from_value(json_pod()).unwrap();
    let again: WorkerPod = serde_json::from_value(serde_json::to_value(&lean).unwrap()).unwrap();

    assert_eq!(again, lean, "what it writes, it reads back");
    assert_eq!(lean.metadata.labels, whole.metadata.labels);
    assert_eq!(lean.metadata.annotations, whole.metadata.annotations);
}

#[test]
fn an_object_of_another_kind_is_not_a_worker_pod() {
    for (field, value) in [("kind", "ReplicaSet"), ("apiVersion", "apps/v1")] {
        let mut json = json_pod();
        json[field] = value.into();
        let error = serde_json::from_value::<WorkerPod>(json.clone())
            .unwrap_err()
            .to_string();
        assert!(error.contains(value), "{error}");
        assert!(
            serde_json::from_value::<Pod>(json).is_err(),
            "k8s-openapi refuses it too"
        );
    }
    let mut json = json_pod();
    json["kind"] = serde_json::json!({});
    assert!(serde_json::from_value::<WorkerPod>(json).is_err());
}

fn pod_object(json: &serde_json::Value) -> std::result::Result<(), serde_json::Error> {
    PodObject::deserialize(json).map(drop)
}

#[test]
fn a_pod_create_reads_the_secrets_labels_and_annotations_a_worker_pod_reads() {
    let body = serde_json::to_string(&json_pod()).unwrap();
    let lean: PodObject<'_> = serde_json::from_str(&body).unwrap();
    let whole: WorkerPod = serde_json::from_str(&body).unwrap();

    let facts = lean.facts();
    let names: BTreeSet<String> = facts
        .secrets
        .iter()
        .filter(|name| !name.is_empty())
        .map(|name| (*name).to_owned())
        .collect();
    assert_eq!(names, whole.spec.as_ref().unwrap().names());
    assert_eq!(facts.labels, Some(vec!["CDS_WORKER_NAME"]));
    assert!(facts.has_annotations);
    assert_eq!(facts.listed, None);
    assert!(lean.has_label("CDS_WORKER_NAME") && !lean.has_label("CDS_HATCHERY_NAME"));
    let borrowed = lean
        .spec
        .as_ref()
        .unwrap()
        .0
        .iter()
        .all(|name| matches!(name.0, std::borrow::Cow::Borrowed(_)));
    assert!(borrowed, "the names are borrowed from the body");
    assert_keeps_none(&lean, &["s3cr3t", "kubectl", "node-1", "ubuntu"]);
}

#[test]
fn the_mutation_plans_the_same_patch_from_either_reading() {
    let mut json = json_pod();
    json["spec"]["volumes"][0]["secret"]["secretName"] = "cds-worker-config-w1".into();
    json["metadata"]["annotations"][crate::rules::worker::mutation::PROTECTED_SECRETS_ANNOTATION] = "stale".into();
    let lean = PodObject::deserialize(&json).unwrap();
    let whole: WorkerPod = serde_json::from_value(json.clone()).unwrap();
    let policy = crate::fixtures::policy();
    for hatchery in [None, Some("hatchery-1")] {
        let planned = crate::rules::worker::mutation::plan(&policy, &lean.facts(), hatchery);
        assert_eq!(
            planned,
            crate::rules::worker::mutation::mutate(&policy, &whole, hatchery)
        );
        assert!(!planned.patch.0.is_empty());
    }
}

#[test]
fn missing_parts_of_a_pod_are_empty() {
    for json in [
        serde_json::json!({}),
        serde_json::json!({"metadata": {}, "spec": null}),
        serde_json::json!({"spec": {"containers": [{"env": null, "envFrom": [{"configMapRef": {"name": "c"}}]}], "volumes": null}}),
    ] {
        let pod = PodObject::deserialize(&json).unwrap();
        assert_eq!(pod.facts(), PodFacts::default(), "{json}");
    }
}

#[rstest::rstest]
#[case::containers_not_a_list("/spec/containers", serde_json::json!("not a list"), "expected a sequence")]
#[case::label_not_a_string("/metadata/labels/CDS_WORKER_NAME", serde_json::json!(1), "expected a string")]
#[case::labels_not_a_map("/metadata/labels", serde_json::json!(["a"]), "expected a map of strings")]
#[case::secret_name_not_a_string(
    "/spec/containers/0/env/1/valueFrom/secretKeyRef/name",
    serde_json::json!(5),
    "expected a string"
)]
#[case::volume_name_not_a_string("/spec/volumes/0/secret/secretName", serde_json::json!({}), "expected a string")]
#[case::another_kind("/kind", serde_json::json!("ReplicaSet"), "invalid value: string \"ReplicaSet\", expected Pod")]
#[case::another_version("/apiVersion", serde_json::json!("apps/v1"), "expected v1")]
fn a_pod_of_the_wrong_shape_is_a_clear_error(
    #[case] pointer: &str,
    #[case] value: serde_json::Value,
    #[case] message: &str,
) {
    let mut json = json_pod();
    *json.pointer_mut(pointer).unwrap() = value;
    let error = pod_object(&json).unwrap_err().to_string();
    assert!(error.contains(message), "{error} lacks {message}");
}

/// `value` as it is kept holds none of `dropped`.
fn assert_keeps_none(value: &impl std::fmt::Debug, dropped: &[&str]) {
    let kept = format!("{value:?}");
    for text in dropped {
        assert!(!kept.contains(text), "{text} kept: {kept}");
    }
}
