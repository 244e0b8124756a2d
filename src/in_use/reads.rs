//! In-use protection's reads against the apiserver. Every read here is sent without a
//! `resourceVersion`: a quorum read, served by etcd (the GETs) or by a watch cache proven
//! current (the LIST of pods).

use async_trait::async_trait;
use k8s_openapi::{
    api::core::v1::{Namespace, Pod},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
};

use super::{Dependent, InUseLookup, WORKLOAD_KINDS};
use crate::{Error, Result, references::Kind};

/// Pods per page of the namespace's LIST: a page's specs are held at once, never more.
const PAGE: u32 = 500;

/// [`InUseLookup`] against the apiserver, through kube.
#[derive(Clone)]
pub struct KubeInUse {
    client: Client,
}

impl KubeInUse {
    /// Reads through this client.
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

#[async_trait]
impl InUseLookup for KubeInUse {
    async fn users(&self, namespace: &str, kind: Kind, name: &str) -> Result<Vec<Dependent>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        // No resourceVersion: the most recent, a quorum read; the next pages continue it.
        let mut params = ListParams::default().limit(PAGE);
        let mut users = Vec::new();
        loop {
            let page = pods.list(&params).await?;
            for pod in page.items {
                let needs = pod
                    .spec
                    .as_ref()
                    .is_some_and(|spec| crate::references::needs(spec, kind, name));
                if needs {
                    let phase = pod.status.and_then(|status| status.phase);
                    let terminal = matches!(phase.as_deref(), Some("Succeeded" | "Failed"));
                    users.push(Dependent {
                        terminal,
                        ..dependent("v1", "Pod", pod.metadata)
                    });
                }
            }
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => return Ok(users),
            }
        }
    }

    async fn object(&self, namespace: &str, api_version: &str, kind: &str, name: &str) -> Result<Option<Dependent>> {
        let plural = match (api_version, kind) {
            ("v1", "Pod") => "pods",
            ("apps/v1", "ReplicaSet") => "replicasets",
            ("apps/v1", "Deployment") => "deployments",
            ("apps/v1", "StatefulSet") => "statefulsets",
            ("apps/v1", "DaemonSet") => "daemonsets",
            ("batch/v1", "Job") => "jobs",
            ("batch/v1", "CronJob") => "cronjobs",
            ("v1", "ReplicationController") => "replicationcontrollers",
            _ => {
                return Err(Error::Usage(format!(
                    "{api_version} {kind} is not read by in-use protection"
                )));
            }
        };
        debug_assert!(kind == "Pod" || WORKLOAD_KINDS.contains(&(api_version, kind)));
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = ApiResource {
            group: group.to_owned(),
            version: version.to_owned(),
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        };
        let objects: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &resource);
        let found = objects.get_metadata_opt(name).await?;
        Ok(found.map(|found| dependent(api_version, kind, found.metadata)))
    }

    async fn namespace_terminating(&self, namespace: &str) -> Result<bool> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let found = namespaces.get_metadata_opt(namespace).await?;
        Ok(found.is_some_and(|found| found.metadata.deletion_timestamp.is_some()))
    }
}

fn dependent(api_version: &str, kind: &str, metadata: ObjectMeta) -> Dependent {
    Dependent {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: metadata.name.unwrap_or_default(),
        uid: metadata.uid.unwrap_or_default(),
        deleting: metadata.deletion_timestamp.is_some(),
        finalizers: metadata.finalizers.unwrap_or_default(),
        terminal: false,
        owners: metadata.owner_references.unwrap_or_default(),
    }
}
