//! A worker secret as `/validate` decodes it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer};

/// A secret as `/validate` reads it: the metadata the rules read. Its data and the rest
/// of its metadata are skipped, never built.
#[derive(Debug, Default, Deserialize)]
pub struct SecretObject {
    /// Name, uid, creation time, labels and owner references.
    #[serde(default, deserialize_with = "secret_metadata")]
    pub metadata: ObjectMeta,
}

/// The fields of a secret's metadata the rules read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SecretMetadata {
    name: Option<String>,
    uid: Option<String>,
    creation_timestamp: Option<Time>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

fn secret_metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let kept = SecretMetadata::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: kept.name,
        uid: kept.uid,
        creation_timestamp: kept.creation_timestamp,
        labels: kept.labels,
        owner_references: kept.owner_references,
        ..ObjectMeta::default()
    })
}
