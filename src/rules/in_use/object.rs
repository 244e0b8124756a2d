//! An opted-in Secret or ConfigMap as `/validate-in-use` decodes it.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{
    Deserialize, Deserializer,
    de::{self, IgnoredAny},
};

use crate::cluster::Text;

/// A Secret or ConfigMap as `/validate-in-use` reads it: its name, uid, finalizers, the
/// opt-in label and the force annotation. Its data and every other label and annotation
/// are skipped, never built: kubectl's `last-applied-configuration` holds a copy of the
/// data.
#[derive(Debug, Default, Deserialize)]
pub struct InUseObject {
    /// Name, uid, finalizers and, when set, the opt-in label and the force annotation alone.
    #[serde(default, deserialize_with = "in_use_metadata")]
    pub metadata: ObjectMeta,
}

#[derive(Deserialize)]
struct InUseMetadata {
    name: Option<String>,
    uid: Option<String>,
    #[serde(default, deserialize_with = "opt_in_label")]
    labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "force_annotation")]
    annotations: Option<std::collections::BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
}

fn in_use_metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let kept = InUseMetadata::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: kept.name,
        uid: kept.uid,
        labels: kept.labels,
        annotations: kept.annotations,
        finalizers: kept.finalizers,
        ..ObjectMeta::default()
    })
}

/// The labels with only [`OPT_IN_LABEL`](super::OPT_IN_LABEL) kept; `None`
/// without it.
fn opt_in_label<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::collections::BTreeMap<String, String>>, D::Error> {
    deserializer.deserialize_any(OneEntry(super::OPT_IN_LABEL))
}

/// The annotations with only [`FORCE_ANNOTATION`](super::FORCE_ANNOTATION) kept;
/// `None` without it.
fn force_annotation<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<std::collections::BTreeMap<String, String>>, D::Error> {
    deserializer.deserialize_any(OneEntry(super::FORCE_ANNOTATION))
}

/// A map of strings read for one key: the others are skipped, never built.
struct OneEntry(&'static str);

impl<'de> de::Visitor<'de> for OneEntry {
    type Value = Option<std::collections::BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a map holding {}", self.0)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            if *key == *self.0 {
                let value: String = map.next_value()?;
                kept = Some(std::collections::BTreeMap::from([(key.0.into_owned(), value)]));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(kept)
    }
}
