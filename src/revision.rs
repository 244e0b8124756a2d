//! Revisions: etcd's, as resourceVersions carry them, and the current one read by quorum.
//!
//! A watch delivers its events in revision order, so a watch that has delivered an event
//! at revision R or later shows every change to its objects up to R. A cache fed by a
//! watch may then stand in for a quorum read made after a request arrived, once it has
//! caught up with the revision that read was served at: the technique the apiserver uses
//! for consistent reads from its own watch cache.

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams, core::PartialObjectMeta};

use crate::Result;

/// A resourceVersion as the revision it is (etcd's); `None` if it is not one.
pub fn parse_revision(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

/// The current revision, read by quorum: a LIST of pods of `namespace` named `name`,
/// metadata only (a single-key read in the apiserver, whatever the namespace holds).
/// `None` if the apiserver gave no revision.
pub async fn current(client: &Client, namespace: &str, name: &str) -> Result<Option<u64>> {
    let pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    debug_assert!(params.resource_version.is_none(), "the revision must be read by quorum");
    let current = pods.list_metadata(&params).await?;
    Ok(parse_revision(current.metadata.resource_version.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_are_etcd_revisions_or_nothing() {
        assert_eq!(parse_revision(Some("1234")), Some(1234));
        assert_eq!(parse_revision(Some("not-a-number")), None);
        assert_eq!(parse_revision(None), None);
    }
}
