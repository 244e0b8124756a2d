//! What the guard reads of a pod, decoded into types that keep only that. The rest of a
//! pod (images, probes, resources, status, managed fields) is skipped while parsing and
//! never allocated: decoding whole k8s-openapi `Pod`s was the largest cost of a `/mutate`
//! and doubled the memory of the watches.
//!
//! - [`PodState`]: what the decisions need to know of a pod, whoever read it;
//! - [`PodLiveness`]: what the watches keep of every worker pod;
//! - [`WorkerPod`]: a pod as the adoption and the quorum reads see it: its metadata, the
//!   secrets its spec names, its phase;
//! - [`PodObject`]: a pod create's pod as `/mutate` reads it, borrowing from the review's
//!   body: its label keys, its protected-secrets annotation, the secret names of its spec.

use std::{
    collections::{BTreeMap, BTreeSet},
    marker::PhantomData,
};

use k8s_openapi::Resource as _;
use k8s_openapi::{
    api::core::v1::{
        LocalObjectReference, Pod, SecretEnvSource, SecretKeySelector, SecretProjection, SecretVolumeSource,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use serde::{
    Deserialize, Deserializer, Serialize,
    de::{self, IgnoredAny},
};

use crate::cluster::Text;

/// Annotation listing the protected secrets a pod uses.
pub const PROTECTED_SECRETS_ANNOTATION: &str = "cds-secret-guard/protected-secrets";

/// What the mutation reads of a pod: the secret names its spec references, its label
/// keys and its protected-secrets annotation. The server reads it straight from the
/// review's body ([`PodObject`]); [`crate::rules::worker::mutation::mutate`] from a [`WorkerPod`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PodFacts<'p> {
    /// Every secret name the spec references, in any order, repeats allowed.
    pub secrets: Vec<&'p str>,
    /// The keys of the pod's labels; `None` when it has no label map.
    pub labels: Option<Vec<&'p str>>,
    /// Whether the pod has an annotation map.
    pub has_annotations: bool,
    /// The value of [`PROTECTED_SECRETS_ANNOTATION`], if set.
    pub listed: Option<&'p str>,
}

/// What the policy needs to know about a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodState {
    /// Pod name.
    pub name: String,
    /// Pod labels (`check` compares them with the secret's).
    pub labels: BTreeMap<String, String>,
    /// Pod UID.
    pub uid: String,
    /// `status.phase`, when known.
    pub phase: Option<String>,
    /// Whether the pod has a deletion timestamp.
    pub terminating: bool,
}

/// A pod as the watches decode it: the metadata liveness and adoption need, and the
/// phase. With 10,000 pods, decoding whole pods and dropping their specs doubled the
/// guard's memory (allocator fragmentation), and a label map costs a node of eleven
/// entries per pod: the watch keeps the worker label's value alone
/// ([`PodLiveness::keep_worker`]).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodLiveness {
    /// Name, namespace, uid, resourceVersion, creation and deletion timestamps (and the
    /// labels, until [`PodLiveness::keep_worker`] takes them).
    #[serde(deserialize_with = "liveness_metadata")]
    pub metadata: ObjectMeta,
    /// Its phase only.
    #[serde(default)]
    pub status: Option<PhasePart>,
    /// The value of the worker label, once [`PodLiveness::keep_worker`] has set it.
    #[serde(skip)]
    pub worker: Option<String>,
}

/// A pod as the mutation, the adoption and the quorum reads see it: [`PodLiveness`]'s
/// metadata with the labels and annotations, the secret references of its spec, its
/// phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerPod {
    /// `apiVersion`, checked to be `v1` (as k8s-openapi's `Pod` checks it), not kept.
    #[serde(default, rename = "apiVersion", deserialize_with = "expect_v1", skip_serializing)]
    pub api_version: (),
    /// `kind`, checked to be `Pod`, not kept.
    #[serde(default, deserialize_with = "expect_pod", skip_serializing)]
    pub kind: (),
    /// What [`PodLiveness`] keeps, and the labels and annotations.
    #[serde(default, deserialize_with = "worker_metadata")]
    pub metadata: ObjectMeta,
    /// The parts of the spec that can name a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SecretReferences>,
    /// Its phase only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PhasePart>,
}

/// `status.phase` of a pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhasePart {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    pub phase: Option<String>,
}

/// The parts of a pod spec that can name a secret, with k8s-openapi's field names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)] // the pod spec's own fields
pub struct SecretReferences {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<ContainerReferences>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<ContainerReferences>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_containers: Option<Vec<ContainerReferences>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<VolumeReferences>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
}

/// A container's `env` and `envFrom`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct ContainerReferences {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVarReference>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_from: Option<Vec<EnvFromReference>>,
}

/// `env[].valueFrom`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct EnvVarReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSourceReference>,
}

/// `env[].valueFrom.secretKeyRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct EnvVarSourceReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeySelector>,
}

/// `envFrom[].secretRef`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct EnvFromReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretEnvSource>,
}

/// `volumes[].secret` and `volumes[].projected`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct VolumeReferences {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected: Option<ProjectedReferences>,
}

/// `volumes[].projected.sources`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ProjectedReferences {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<ProjectionReference>>,
}

/// `volumes[].projected.sources[].secret`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ProjectionReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretProjection>,
}

/// A pod create's pod as `/mutate` reads it, borrowing from the review's body: its label
/// keys, its annotations' keys and values, and the secret names of its spec. Everything
/// else (images, probes, plain env values, managed fields) is skipped, never built.
#[derive(Debug, Default, Deserialize)]
pub struct PodObject<'a> {
    /// `apiVersion`, checked to be `v1`, as [`WorkerPod`] checks it.
    #[serde(default, rename = "apiVersion", deserialize_with = "expect_v1")]
    _api_version: (),
    /// `kind`, checked to be `Pod`.
    #[serde(default, rename = "kind", deserialize_with = "expect_pod")]
    _kind: (),
    /// Its labels and annotations.
    #[serde(default, borrow)]
    pub metadata: PodObjectMeta<'a>,
    /// The secret names its spec references.
    #[serde(default, borrow)]
    pub spec: Option<SpecNames<'a>>,
}

/// The labels and annotations of a [`PodObject`], in the order of the body.
#[derive(Debug, Default, Deserialize)]
pub struct PodObjectMeta<'a> {
    /// The labels, when the pod has a label map.
    #[serde(default, borrow)]
    pub labels: Option<Pairs<'a>>,
    /// The annotations, when the pod has an annotation map.
    #[serde(default, borrow)]
    pub annotations: Option<Pairs<'a>>,
}

/// A map of strings as the entries of the body, without building a map.
#[derive(Debug, Default)]
pub struct Pairs<'a>(pub Vec<(Text<'a>, Text<'a>)>);

/// The secret names a pod spec references: env `secretKeyRef`, `envFrom.secretRef`,
/// secret and projected volumes, imagePullSecrets, in containers, init containers and
/// ephemeral containers.
#[derive(Debug, Default)]
pub struct SpecNames<'a>(pub Vec<Text<'a>>);

/// The parts of a spec that can name a secret, each list read as the names it holds.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecIn<'a> {
    #[serde(default, borrow)]
    containers: Option<NamesOf<'a, ContainerIn<'a>>>,
    #[serde(default, borrow)]
    init_containers: Option<NamesOf<'a, ContainerIn<'a>>>,
    #[serde(default, borrow)]
    ephemeral_containers: Option<NamesOf<'a, ContainerIn<'a>>>,
    #[serde(default, borrow)]
    volumes: Option<NamesOf<'a, VolumeIn<'a>>>,
    #[serde(default, borrow)]
    image_pull_secrets: Option<NamesOf<'a, NameIn<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerIn<'a> {
    #[serde(default, borrow)]
    env: Option<NamesOf<'a, EnvVarIn<'a>>>,
    #[serde(default, borrow)]
    env_from: Option<NamesOf<'a, EnvFromIn<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvVarIn<'a> {
    #[serde(default, borrow)]
    value_from: Option<EnvVarSourceIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvVarSourceIn<'a> {
    #[serde(default, borrow)]
    secret_key_ref: Option<NameIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvFromIn<'a> {
    #[serde(default, borrow)]
    secret_ref: Option<NameIn<'a>>,
}

#[derive(Deserialize)]
struct VolumeIn<'a> {
    #[serde(default, borrow)]
    secret: Option<SecretVolumeIn<'a>>,
    #[serde(default, borrow)]
    projected: Option<ProjectedIn<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SecretVolumeIn<'a> {
    #[serde(default, borrow)]
    secret_name: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct ProjectedIn<'a> {
    #[serde(default, borrow)]
    sources: Option<NamesOf<'a, ProjectionIn<'a>>>,
}

#[derive(Deserialize)]
struct ProjectionIn<'a> {
    #[serde(default, borrow)]
    secret: Option<NameIn<'a>>,
}

/// `{"name": ...}`: a secret key selector, env source, projection or pull secret.
#[derive(Deserialize)]
struct NameIn<'a> {
    #[serde(default, borrow)]
    name: Text<'a>,
}

/// A list read as the secret names its items hold, without keeping the items.
struct NamesOf<'a, T>(Vec<Text<'a>>, PhantomData<T>);

/// An item of a list that can name secrets.
trait Names<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>);
}

macro_rules! pod_resource {
    ($($ty:ty),*) => {$(
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = Pod::API_VERSION;
            const GROUP: &'static str = Pod::GROUP;
            const KIND: &'static str = Pod::KIND;
            const VERSION: &'static str = Pod::VERSION;
            const URL_PATH_SEGMENT: &'static str = Pod::URL_PATH_SEGMENT;
            type Scope = k8s_openapi::NamespaceResourceScope;
        }

        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    )*};
}

pod_resource!(PodLiveness, WorkerPod);

// === impl PodLiveness ===

impl PodLiveness {
    /// Keeps the value of `label` as [`PodLiveness::worker`] and drops the labels.
    pub fn keep_worker(&mut self, label: &str) {
        self.worker = self.metadata.labels.take().and_then(|mut labels| labels.remove(label));
    }
}

// === impl WorkerPod ===

impl WorkerPod {
    /// The phase, when known.
    pub fn phase(&self) -> Option<&String> {
        self.status.as_ref()?.phase.as_ref()
    }

    /// Whether the pod carries `label`, whatever its value.
    pub fn has_label(&self, label: &str) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(label))
    }
}

// === impl SecretReferences ===

impl SecretReferences {
    /// Every secret name the spec references: env, envFrom, volumes (plain and
    /// projected) and imagePullSecrets, in containers, init containers and ephemeral
    /// containers.
    pub fn names(&self) -> BTreeSet<String> {
        let containers = [&self.containers, &self.init_containers, &self.ephemeral_containers]
            .into_iter()
            .flatten()
            .flatten();
        let env = containers
            .clone()
            .flat_map(|c| c.env.iter().flatten())
            .filter_map(|var| {
                let selector = var.value_from.as_ref()?.secret_key_ref.as_ref()?;
                Some(&selector.name)
            });
        let env_from = containers
            .flat_map(|c| c.env_from.iter().flatten())
            .filter_map(|source| Some(&source.secret_ref.as_ref()?.name));
        let volumes = self.volumes.iter().flatten();
        let plain = volumes
            .clone()
            .filter_map(|volume| volume.secret.as_ref()?.secret_name.as_ref());
        let projected = volumes
            .filter_map(|volume| volume.projected.as_ref()?.sources.as_ref())
            .flatten()
            .filter_map(|source| Some(&source.secret.as_ref()?.name));
        let pull = self
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|reference| &reference.name);
        env.chain(env_from)
            .chain(plain)
            .chain(projected)
            .chain(pull)
            .filter(|name| !name.is_empty())
            .cloned()
            .collect()
    }
}

// === impl PodState ===

impl PodState {
    /// Whether the pod may still need its secret: not terminating and not finished.
    pub fn is_live(&self) -> bool {
        !self.terminating && !matches!(self.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    fn new(metadata: &ObjectMeta, phase: Option<&String>) -> Self {
        Self {
            name: metadata.name.clone().unwrap_or_default(),
            labels: metadata.labels.clone().unwrap_or_default(),
            uid: metadata.uid.clone().unwrap_or_default(),
            phase: phase.cloned(),
            terminating: metadata.deletion_timestamp.is_some(),
        }
    }
}

impl From<&PodLiveness> for PodState {
    fn from(pod: &PodLiveness) -> Self {
        Self::new(
            &pod.metadata,
            pod.status.as_ref().and_then(|status| status.phase.as_ref()),
        )
    }
}

impl From<&WorkerPod> for PodState {
    fn from(pod: &WorkerPod) -> Self {
        Self::new(&pod.metadata, pod.phase())
    }
}

impl From<&Pod> for PodState {
    fn from(pod: &Pod) -> Self {
        Self::new(
            &pod.metadata,
            pod.status.as_ref().and_then(|status| status.phase.as_ref()),
        )
    }
}

// === impl PodObject ===

impl PodObject<'_> {
    /// What the mutation reads of this pod.
    pub fn facts(&self) -> PodFacts<'_> {
        let meta = &self.metadata;
        PodFacts {
            secrets: self
                .spec
                .iter()
                .flat_map(|spec| spec.0.iter())
                .map(|name| &**name)
                .collect(),
            labels: meta
                .labels
                .as_ref()
                .map(|labels| labels.0.iter().map(|(key, _)| &**key).collect()),
            has_annotations: meta.annotations.is_some(),
            listed: meta
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(PROTECTED_SECRETS_ANNOTATION)),
        }
    }

    /// Whether the pod carries `label`, whatever its value.
    pub fn has_label(&self, label: &str) -> bool {
        self.metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.get(label).is_some())
    }
}

impl Pairs<'_> {
    /// The value of `key`; the last one when the body repeats it, as a map keeps it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| **k == *key)
            .map(|(_, value)| &**value)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Pairs<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(PhantomData<&'a ()>);

        impl<'de: 'a, 'a> de::Visitor<'de> for Visitor<'a> {
            type Value = Pairs<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }

            fn visit_map<M: de::MapAccess<'de>>(self, mut map: M) -> Result<Pairs<'a>, M::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(8).min(32));
                while let Some(pair) = map.next_entry::<Text<'a>, Text<'a>>()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }

        deserializer.deserialize_map(Visitor(PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for SpecNames<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = SpecIn::deserialize(deserializer)?;
        let mut names = Vec::new();
        for containers in [spec.containers, spec.init_containers, spec.ephemeral_containers] {
            NamesOf::into_names(containers, &mut names);
        }
        NamesOf::into_names(spec.volumes, &mut names);
        NamesOf::into_names(spec.image_pull_secrets, &mut names);
        Ok(Self(names))
    }
}

impl<'de: 'a, 'a, T: Deserialize<'de> + Names<'a>> Deserialize<'de> for NamesOf<'a, T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a, T>(PhantomData<(&'a (), T)>);

        impl<'de: 'a, 'a, T: Deserialize<'de> + Names<'a>> de::Visitor<'de> for Visitor<'a, T> {
            type Value = NamesOf<'a, T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<S: de::SeqAccess<'de>>(self, mut seq: S) -> Result<NamesOf<'a, T>, S::Error> {
                let mut names = Vec::new();
                while let Some(item) = seq.next_element::<T>()? {
                    item.names_into(&mut names);
                }
                Ok(NamesOf(names, PhantomData))
            }
        }

        deserializer.deserialize_seq(Visitor(PhantomData))
    }
}

impl<'a, T> NamesOf<'a, T> {
    fn into_names(list: Option<Self>, names: &mut Vec<Text<'a>>) {
        if let Some(list) = list {
            names.extend(list.0);
        }
    }
}

impl<'a> Names<'a> for ContainerIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        NamesOf::into_names(self.env, names);
        NamesOf::into_names(self.env_from, names);
    }
}

impl<'a> Names<'a> for EnvVarIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        if let Some(selector) = self.value_from.and_then(|source| source.secret_key_ref) {
            names.push(selector.name);
        }
    }
}

impl<'a> Names<'a> for EnvFromIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        if let Some(source) = self.secret_ref {
            names.push(source.name);
        }
    }
}

impl<'a> Names<'a> for VolumeIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        if let Some(name) = self.secret.and_then(|secret| secret.secret_name) {
            names.push(name);
        }
        if let Some(projected) = self.projected {
            NamesOf::into_names(projected.sources, names);
        }
    }
}

impl<'a> Names<'a> for ProjectionIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        if let Some(secret) = self.secret {
            names.push(secret.name);
        }
    }
}

impl<'a> Names<'a> for NameIn<'a> {
    fn names_into(self, names: &mut Vec<Text<'a>>) {
        names.push(self.name);
    }
}

/// The fields of a pod's metadata the guard keeps; `A` is how the annotations are read:
/// kept ([`Maps`]) or skipped while parsing ([`IgnoredAny`]).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeptMetadata<A> {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    labels: Maps,
    #[serde(default)]
    annotations: A,
}

/// Labels or annotations, kept.
type Maps = Option<BTreeMap<String, String>>;

impl<A> KeptMetadata<A> {
    fn into_meta(self, annotations: Maps) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            uid: self.uid,
            resource_version: self.resource_version,
            labels: self.labels,
            annotations,
            creation_timestamp: self.creation_timestamp,
            deletion_timestamp: self.deletion_timestamp,
            ..ObjectMeta::default()
        }
    }
}

/// Checks a type field: an object that says it is something else is not a pod.
fn expect<'de, D: serde::Deserializer<'de>>(deserializer: D, expected: &str) -> Result<(), D::Error> {
    let value = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
    if value != expected {
        return Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&value),
            &expected,
        ));
    }
    Ok(())
}

fn expect_v1<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    expect(deserializer, Pod::API_VERSION)
}

fn expect_pod<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<(), D::Error> {
    expect(deserializer, Pod::KIND)
}

fn liveness_metadata<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    Ok(KeptMetadata::<IgnoredAny>::deserialize(deserializer)?.into_meta(None))
}

fn worker_metadata<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let mut kept = KeptMetadata::<Maps>::deserialize(deserializer)?;
    let annotations = kept.annotations.take();
    Ok(kept.into_meta(annotations))
}

#[cfg(test)]
mod tests {
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
        let kept = format!("{pod:?}");
        assert!(
            !kept.contains("s3cr3t") && !kept.contains("a user's text") && !kept.contains("kubectl"),
            "{kept}"
        );
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
        let kept = format!("{pod:?}");
        assert!(
            !kept.contains("s3cr3t") && !kept.contains("kubectl") && !kept.contains("node-1"),
            "{kept}"
        );
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
        let kept = format!("{lean:?}");
        assert!(
            !kept.contains("s3cr3t")
                && !kept.contains("kubectl")
                && !kept.contains("node-1")
                && !kept.contains("ubuntu"),
            "{kept}"
        );
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
}
