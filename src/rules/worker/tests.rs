#![allow(clippy::unwrap_used)]

use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rstest::rstest;

use super::*;
use crate::fixtures::{policy, shared};

/// A cluster with no pod at all that writes down each read it is asked for.
#[derive(Default)]
struct Counted(Mutex<Vec<String>>);

#[async_trait]
impl ClusterLookup for Counted {
    async fn pod(&self, _: &str, name: &str) -> crate::Result<Option<PodState>> {
        self.0.lock().unwrap().push(format!("pod {name}"));
        Ok(None)
    }

    async fn pods_labelled(&self, _: &str, _: &str, value: &str) -> crate::Result<Vec<PodState>> {
        self.0.lock().unwrap().push(format!("labelled {value}"));
        Ok(Vec::new())
    }

    async fn namesake_and_labelled(
        &self,
        _: &str,
        _: &str,
        worker: &str,
    ) -> (crate::Result<Option<PodState>>, crate::Result<Vec<PodState>>) {
        self.0.lock().unwrap().push(format!("namesake and labelled {worker}"));
        (Ok(None), Ok(Vec::new()))
    }

    async fn secret_metadata(&self, _: &str, _: &str) -> crate::Result<Option<ObjectMeta>> {
        Ok(None)
    }

    async fn namespace_terminating(&self, _: &str) -> crate::Result<bool> {
        Ok(false)
    }
}

#[rstest]
#[case::orphan(&[], "orphan", &["namesake and labelled w1"])]
#[case::owned_by_the_namesake(&["w1"], "owner-gone", &["namesake and labelled w1"])]
#[case::owned_by_another_pod(&["other"], "owner-gone", &["namesake and labelled w1", "pod other"])]
fn an_allow_reads_the_worker_once_with_its_label(
    #[case] owners: &[&str],
    #[case] reason: &str,
    #[case] reads: &[&str],
) {
    let now = Timestamp::now();
    let secret = ObjectMeta {
        name: Some("cds-worker-config-w1".into()),
        creation_timestamp: Some(Time(now - Duration::from_secs(3600))),
        owner_references: Some(
            owners
                .iter()
                .map(|name| OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: (*name).into(),
                    uid: format!("uid-{name}"),
                    ..OwnerReference::default()
                })
                .collect(),
        ),
        ..ObjectMeta::default()
    };
    let request = SecretDelete {
        namespace: "cds",
        name: "cds-worker-config-w1",
        secret: Some(&secret),
        username: Some("hatchery"),
        groups: &[],
    };
    let lookup = Counted::default();

    let verdict = futures::executor::block_on(decide(&shared(), &policy(), &request, &lookup, now));

    assert!(verdict.allowed, "{verdict:?}");
    assert_eq!(verdict.reason.code(), reason);
    let mut asked = lookup.0.into_inner().unwrap();
    asked.sort();
    assert_eq!(asked, reads);
}

/// Whether `text` is a valid label value, and a valid object name (DNS subdomain).
#[rstest]
#[case("w1", true, true)]
#[case("a.b-c", true, true)]
#[case("a.b-c_d", true, false)]
#[case("", true, false)]
#[case("W1", true, false)]
#[case("a..b", true, false)]
#[case("-a", false, false)]
#[case(".a", false, false)]
#[case("..", false, false)]
#[case("a/b", false, false)]
#[case(&"w".repeat(64), false, true)]
#[case(&"w".repeat(254), false, false)]
fn label_values_and_object_names(#[case] text: &str, #[case] label_value: bool, #[case] object_name: bool) {
    assert_eq!((is_label_value(text), is_object_name(text)), (label_value, object_name));
}
