use super::*;
use crate::fixtures::{policy, worker_pod};
use kube::runtime::reflector;
use rstest::rstest;

fn secret(name: &str, worker_label: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some("cds".to_owned()),
        labels: worker_label.map(|w| [("CDS_WORKER_NAME".to_owned(), w.to_owned())].into()),
        ..Default::default()
    }
}

#[test]
fn a_cached_copy_behind_an_own_write_is_not_written_from() {
    let writes = OwnWrites::default();
    let at = |revision: &str| ObjectMeta {
        resource_version: Some(revision.to_owned()),
        ..secret("cds-worker-config-w1", Some("w1"))
    };
    assert!(
        !writes.ahead_of("cds", "cds-worker-config-w1", &at("10")),
        "nothing written"
    );
    writes.record("cds", "cds-worker-config-w1", &at("12"));
    assert!(writes.ahead_of("cds", "cds-worker-config-w1", &at("10")));
    assert!(!writes.ahead_of("cds", "cds-worker-config-w1", &at("12")), "caught up");
    assert!(!writes.ahead_of("cds", "cds-worker-config-w1", &at("15")));
    assert!(!writes.ahead_of("other", "cds-worker-config-w1", &at("10")));
}

fn live(builder: crate::fixtures::PodBuilder) -> WorkerPod {
    let mut pod = builder.build();
    pod.metadata.uid = Some("uid-1".to_owned());
    pod
}

#[rstest]
#[case::its_worker_pod_using_it(secret("cds-worker-config-w1", None), live(worker_pod("w1").env_secret("cds-worker-config-w1")), true)]
#[case::labelled_secret_any_name(secret("my-config", Some("w1")), live(worker_pod("w1").secret_volume("my-config")), true)]
#[case::pod_of_another_name(secret("cds-worker-config-w1", None), live(worker_pod("x").env_secret("cds-worker-config-w1")), false)]
#[case::pod_labelled_with_the_worker_but_named_otherwise(secret("cds-worker-config-w1", None), live(worker_pod("x").label("CDS_WORKER_NAME", "w1").env_secret("cds-worker-config-w1")), false)]
#[case::spec_does_not_use_it(secret("cds-worker-config-w1", None), live(worker_pod("w1")), false)]
#[case::annotation_is_no_proof(secret("cds-worker-config-w1", None), live(worker_pod("w1").annotation("cds-secret-guard/protected-secrets", "cds-worker-config-w1")), false)]
#[case::unprotected_secret(secret("db-password", None), live(worker_pod("w1").env_secret("db-password")), false)]
#[case::label_names_another_worker(secret("cds-worker-config-w1", Some("w2")), live(worker_pod("w1").env_secret("cds-worker-config-w1")), false)]
#[case::finished_pod(secret("cds-worker-config-w1", None), live(worker_pod("w1").phase("Succeeded").env_secret("cds-worker-config-w1")), false)]
fn adoption_rests_on_facts(#[case] secret: ObjectMeta, #[case] pod: WorkerPod, #[case] allowed: bool) {
    assert_eq!(may_adopt(&policy(), &secret, &pod), allowed);
}

#[test]
fn a_pod_without_uid_adopts_nothing() {
    let pod = worker_pod("w1").env_secret("cds-worker-config-w1").build();
    assert!(!may_adopt(&policy(), &secret("cds-worker-config-w1", None), &pod));
}

#[test]
fn a_secret_owned_by_its_watched_pod_maps_to_no_pod() {
    let (pods, mut writer) = reflector::store::<PodLiveness>();
    let mut watched = PodLiveness::default();
    watched.metadata.name = Some("w1".to_owned());
    watched.metadata.namespace = Some("cds".to_owned());
    watched.metadata.uid = Some("uid-1".to_owned());
    writer.apply_watcher_event(&watcher::Event::Apply(watched));

    let mut secret = secret("cds-worker-config-w1", Some("w1"));
    let of = |secret: &ObjectMeta| pod_of(&policy(), secret, &pods).map(|pod| pod.name);
    assert_eq!(of(&secret).as_deref(), Some("w1"), "not owned yet");
    secret.owner_references = Some(vec![pod_reference("w1", "uid-dead")]);
    assert_eq!(of(&secret).as_deref(), Some("w1"), "owned by a pod that is gone");
    secret.owner_references = Some(vec![pod_reference("w1", "uid-dead"), pod_reference("w1", "uid-1")]);
    assert_eq!(of(&secret), None, "owned by the pod the watch shows");
}
