//! In-use protection's reads, in memory, and its AdmissionReview fixtures.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use cds_secret_guard::{
    Error, Result, Server,
    cluster::references::Kind,
    config::Config,
    rules::Mode,
    rules::in_use::{Dependent, FORCE_ANNOTATION, InUseLookup},
};
use serde_json::{Value, json};

use crate::fake::{FakeCluster, config, policy, review, set};

/// The pods of a namespace, as in-use protection reads them; slow when asked.
#[derive(Default)]
pub struct Pods {
    pub users: Vec<Dependent>,
    pub delay: Option<Duration>,
}

#[async_trait]
impl InUseLookup for Pods {
    async fn users(&self, _: &str, _: Kind, _: &str) -> Result<Vec<Dependent>> {
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        Ok(self.users.clone())
    }

    async fn object(&self, _: &str, _: &str, _: &str, name: &str) -> Result<Option<Dependent>> {
        Ok(self.users.iter().find(|pod| pod.name == name).cloned())
    }

    async fn namespace_terminating(&self, _: &str) -> Result<bool> {
        Err(Error::KubeConfig("not read in these tests".into()))
    }
}

pub fn user(name: &str) -> Dependent {
    Dependent {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        ..Dependent::default()
    }
}

pub fn in_use_config(mode: Mode) -> Config {
    Config {
        in_use_protection: true,
        ..config(
            policy().with(|p| p.rules.mode = mode),
            std::path::Path::new("/nonexistent"),
        )
    }
}

pub fn server(config: Config, pods: Pods) -> Server {
    Server::with_in_use(config, Arc::new(FakeCluster::default()), Arc::new(pods))
}

/// A delete of the ConfigMap `settings`, whose last-applied annotation holds its data.
pub fn configmap_delete() -> Value {
    let review = set(review("configmap-delete"), "/request/name", json!("settings"));
    set(
        review,
        "/request/oldObject/metadata",
        json!({
            "name": "settings", "namespace": "cds", "uid": "cm-uid",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"hunter2\"}}"},
        }),
    )
}

pub fn forced(review: Value, why: &str) -> Value {
    set(
        review,
        &format!(
            "/request/oldObject/metadata/annotations/{}",
            FORCE_ANNOTATION.replace('/', "~1")
        ),
        json!(why),
    )
}
