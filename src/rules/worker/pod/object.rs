//! A pod create's pod as `/mutate` decodes it, borrowing its strings from the review.

use std::marker::PhantomData;

use serde::{
    Deserialize, Deserializer,
    de::{self},
};

use super::{PROTECTED_SECRETS_ANNOTATION, PodFacts, expect_pod, expect_v1};
use crate::cluster::Text;

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
