//! The pod-CREATE mutation: a pod that references protected secrets gets the labels that
//! pair it with them, and an annotation listing them. The patch is minimal (only what is
//! missing), never overwrites a label, and is empty for a pod that is already right, so
//! reinvocation changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use json_patch::{AddOperation, Patch, PatchOperation};
use jsonptr::PointerBuf;
use serde_json::Value;

pub use crate::rules::worker::pod::PROTECTED_SECRETS_ANNOTATION;
use crate::{
    rules::worker::is_label_value,
    rules::worker::pod::{PodFacts, SecretReferences, WorkerPod},
};

/// What the mutation found and what it changes.
#[derive(Debug, Default, PartialEq)]
pub struct PodMutation {
    /// The protected secrets the pod references.
    pub secrets: BTreeSet<String>,
    /// The worker they name, when they agree on one.
    pub worker: Option<String>,
    /// The labels and annotations added.
    pub patch: Patch,
}

/// The protected secrets among a pod's secret references, and the worker they name.
pub fn protected_secrets<'s>(
    config: &super::Settings,
    names: impl IntoIterator<Item = &'s str>,
) -> (BTreeSet<String>, Option<String>) {
    let secrets: BTreeSet<String> = names
        .into_iter()
        .filter(|name| !name.is_empty() && config.worker_of_secret_name(name).is_some())
        .map(str::to_owned)
        .collect();
    let workers: BTreeSet<String> = secrets
        .iter()
        .filter_map(|name| config.worker_of_secret_name(name))
        .collect();
    // Secrets of two different workers in one pod: pairing is ambiguous, label nothing.
    let worker = (workers.len() == 1).then(|| workers.into_iter().next()).flatten();
    (secrets, worker)
}

/// Plans the patch for a pod. `hatchery` is the hatchery label of the pod's secret,
/// when it could be read.
pub fn mutate(config: &super::Settings, pod: &WorkerPod, hatchery: Option<&str>) -> PodMutation {
    let names = pod.spec.as_ref().map(SecretReferences::names).unwrap_or_default();
    let meta = &pod.metadata;
    let facts = PodFacts {
        secrets: names.iter().map(String::as_str).collect(),
        labels: meta
            .labels
            .as_ref()
            .map(|labels| labels.keys().map(String::as_str).collect()),
        has_annotations: meta.annotations.is_some(),
        listed: meta
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(PROTECTED_SECRETS_ANNOTATION))
            .map(String::as_str),
    };
    plan(config, &facts, hatchery)
}

/// Plans the patch for what the mutation reads of a pod. `hatchery` is the hatchery
/// label of the pod's secret, when it could be read.
pub fn plan(config: &super::Settings, pod: &PodFacts<'_>, hatchery: Option<&str>) -> PodMutation {
    let (secrets, worker) = protected_secrets(config, pod.secrets.iter().copied());
    plan_protected(config, pod, secrets, worker, hatchery)
}

/// [`plan`], once the pod's protected secrets and their worker are known
/// ([`protected_secrets`]): the server finds them first, to skip other pods.
pub fn plan_protected(
    config: &super::Settings,
    pod: &PodFacts<'_>,
    secrets: BTreeSet<String>,
    worker: Option<String>,
    hatchery: Option<&str>,
) -> PodMutation {
    if secrets.is_empty() {
        return PodMutation::default();
    }

    let mut labels = BTreeMap::new();
    let existing = pod.labels.as_ref();
    let missing = |key: &str| existing.is_none_or(|keys| !keys.contains(&key));
    if let Some(worker) = worker.as_deref().filter(|w| is_label_value(w)) {
        if missing(&config.worker_label) {
            labels.insert(config.worker_label.clone(), worker.to_owned());
        }
        if let Some(hatchery) = hatchery.filter(|h| is_label_value(h) && missing(&config.hatchery_label)) {
            labels.insert(config.hatchery_label.clone(), hatchery.to_owned());
        }
    }

    let listed = secrets.iter().map(String::as_str).collect::<Vec<_>>().join(",");
    let mut annotation = BTreeMap::new();
    if pod.listed != Some(listed.as_str()) {
        annotation.insert(PROTECTED_SECRETS_ANNOTATION.to_owned(), listed);
    }

    let mut operations = add_entries("labels", existing.is_some(), labels);
    operations.extend(add_entries("annotations", pod.has_annotations, annotation));
    PodMutation {
        secrets,
        worker,
        patch: Patch(operations),
    }
}

/// `add` operations for map entries under `/metadata/<field>`: one per key when the map
/// exists (keys escaped, `/` as `~1`), else one that creates the map.
fn add_entries(field: &str, map_exists: bool, entries: BTreeMap<String, String>) -> Vec<PatchOperation> {
    if entries.is_empty() {
        return Vec::new();
    }
    let add = |path: PointerBuf, value: Value| PatchOperation::Add(AddOperation { path, value });
    if map_exists {
        entries
            .into_iter()
            .map(|(key, value)| {
                add(
                    PointerBuf::from_tokens(["metadata", field, key.as_str()]),
                    Value::String(value),
                )
            })
            .collect()
    } else {
        let map = entries
            .into_iter()
            .map(|(key, value)| (key, Value::String(value)))
            .collect();
        vec![add(PointerBuf::from_tokens(["metadata", field]), Value::Object(map))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{policy, worker_pod};
    use rstest::rstest;

    fn apply(pod: &WorkerPod, patch: &Patch) -> WorkerPod {
        let mut doc = serde_json::to_value(pod).unwrap();
        json_patch::patch(&mut doc, patch).unwrap();
        serde_json::from_value(doc).unwrap()
    }

    fn labels(pod: &WorkerPod) -> BTreeMap<String, String> {
        pod.metadata.labels.clone().unwrap_or_default()
    }

    #[rstest]
    #[case::env_secret_key_ref(worker_pod("w1").env_secret("cds-worker-config-w1"))]
    #[case::env_from(worker_pod("w1").env_from_secret("cds-worker-config-w1"))]
    #[case::secret_volume(worker_pod("w1").secret_volume("cds-worker-config-w1"))]
    #[case::projected_volume(worker_pod("w1").projected_secret("cds-worker-config-w1"))]
    #[case::image_pull_secret(worker_pod("w1").image_pull_secret("cds-worker-registry-w1"))]
    #[case::init_container(worker_pod("w1").init_env_secret("cds-worker-config-w1"))]
    #[case::ephemeral_container(worker_pod("w1").ephemeral_env_secret("cds-worker-config-w1"))]
    fn finds_references_everywhere(#[case] pod: crate::fixtures::PodBuilder) {
        let pod = pod.build();
        let mutation = mutate(&policy(), &pod, None);
        assert_eq!(mutation.worker.as_deref(), Some("w1"));
        let patched = apply(&pod, &mutation.patch);
        assert_eq!(labels(&patched).get("CDS_WORKER_NAME").map(String::as_str), Some("w1"));
    }

    #[test]
    fn adds_missing_labels_keeping_the_others_and_is_idempotent() {
        let pod = worker_pod("w1")
            .label("app", "cds")
            .env_secret("cds-worker-config-w1")
            .build();
        let mutation = mutate(&policy(), &pod, Some("hatch-1"));
        let patched = apply(&pod, &mutation.patch);
        let labels = labels(&patched);
        assert_eq!(labels.get("app").map(String::as_str), Some("cds"));
        assert_eq!(labels.get("CDS_WORKER_NAME").map(String::as_str), Some("w1"));
        assert_eq!(labels.get("CDS_HATCHERY_NAME").map(String::as_str), Some("hatch-1"));
        let annotations = patched.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(PROTECTED_SECRETS_ANNOTATION).map(String::as_str),
            Some("cds-worker-config-w1")
        );

        // Reinvocation on the patched pod: nothing left to do.
        assert!(mutate(&policy(), &patched, Some("hatch-1")).patch.0.is_empty());
    }

    #[test]
    fn creates_the_label_map_when_there_is_none() {
        let pod = worker_pod("w1")
            .without_labels()
            .secret_volume("cds-worker-config-w1")
            .build();
        let mutation = mutate(&policy(), &pod, None);
        let patch = serde_json::to_value(&mutation.patch).unwrap();
        assert_eq!(patch[0]["path"], "/metadata/labels");
        assert_eq!(patch[0]["value"]["CDS_WORKER_NAME"], "w1");
    }

    #[test]
    fn escapes_slash_and_tilde_in_keys() {
        let mut config = policy();
        config.worker_label = "cds.ovh/worker~name".to_owned();
        let pod = worker_pod("w1")
            .label("app", "cds")
            .env_secret("cds-worker-config-w1")
            .build();
        let patch = serde_json::to_value(&mutate(&config, &pod, None).patch).unwrap();
        assert_eq!(patch[0]["path"], "/metadata/labels/cds.ovh~1worker~0name");
        let patched = apply(&pod, &mutate(&config, &pod, None).patch);
        assert_eq!(
            labels(&patched).get("cds.ovh/worker~name").map(String::as_str),
            Some("w1")
        );
    }

    #[test]
    fn never_overwrites_an_existing_worker_label() {
        let pod = worker_pod("w1")
            .label("CDS_WORKER_NAME", "other")
            .env_secret("cds-worker-config-w1")
            .build();
        let patched = apply(&pod, &mutate(&policy(), &pod, None).patch);
        assert_eq!(
            labels(&patched).get("CDS_WORKER_NAME").map(String::as_str),
            Some("other")
        );
    }

    #[rstest]
    #[case::no_protected_secret(worker_pod("w1").env_secret("database-password"))]
    #[case::no_secret_at_all(worker_pod("w1"))]
    fn leaves_other_pods_alone(#[case] pod: crate::fixtures::PodBuilder) {
        assert_eq!(mutate(&policy(), &pod.build(), None), PodMutation::default());
    }

    #[test]
    fn secrets_of_two_workers_get_no_worker_label() {
        let pod = worker_pod("w1")
            .env_secret("cds-worker-config-w1")
            .env_secret("cds-worker-config-w2")
            .build();
        let mutation = mutate(&policy(), &pod, None);
        assert_eq!(mutation.worker, None);
        assert!(!labels(&apply(&pod, &mutation.patch)).contains_key("CDS_WORKER_NAME"));
    }

    #[test]
    fn an_invalid_label_value_is_not_written() {
        let long = "w".repeat(64);
        let pod = worker_pod(&long)
            .env_secret(&format!("cds-worker-config-{long}"))
            .build();
        assert!(!labels(&apply(&pod, &mutate(&policy(), &pod, None).patch)).contains_key("CDS_WORKER_NAME"));
    }
}
