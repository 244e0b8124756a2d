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

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::Resource as _;
use k8s_openapi::{
    api::core::v1::{
        LocalObjectReference, Pod, SecretEnvSource, SecretKeySelector, SecretProjection, SecretVolumeSource,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use serde::{Deserialize, Serialize, de::IgnoredAny};

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

mod object;
#[cfg(test)]
mod tests;

pub use object::{Pairs, PodObject, PodObjectMeta, SpecNames};
