//! Properties of the pod mutation and of the secret-delete rules over generated pods,
//! secrets and clusters (proptest): the patch applies, is idempotent and keeps every
//! label; a protected secret is never allowed to go while a lookup it needed failed or
//! a live pod of its worker exists, except by the reasons that look at no pod.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
    time::Duration,
};

use async_trait::async_trait;
use cds_secret_guard::{
    Error, Result,
    cli::{Cli, Command},
    rules,
    rules::worker::mutation::{self, PROTECTED_SECRETS_ANNOTATION},
    rules::worker::pod::{PodState, WorkerPod},
    rules::worker::reads::ClusterLookup,
    rules::worker::{self, Reason, SecretDelete, Verdict, is_label_value, is_object_name},
};
use k8s_openapi::{
    api::core::v1::{
        Container, EnvFromSource, EnvVar, EnvVarSource, EphemeralContainer, LocalObjectReference, Pod, PodSpec,
        ProjectedVolumeSource, SecretEnvSource, SecretKeySelector, SecretProjection, SecretVolumeSource, Volume,
        VolumeProjection,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time},
    jiff::{SignedDuration, Timestamp},
};
use proptest::{prelude::*, sample::select, strategy::ValueTree, test_runner::TestRunner};

const WORKER_LABEL: &str = "CDS_WORKER_NAME";
const HATCHERY_LABEL: &str = "CDS_HATCHERY_NAME";
const NAMESPACE_CONTROLLER: &str = "system:serviceaccount:kube-system:namespace-controller";

/// `serve`'s settings as its flags make them, exempting the group `cds-admins` too.
fn settings() -> (rules::Settings, worker::Settings) {
    use clap::Parser;
    let Command::Serve(args) = Cli::parse_from(["cds-secret-guard", "serve"]).command else {
        unreachable!("parsed serve")
    };
    let config = args.into_config();
    let shared = rules::Settings {
        exempt_groups: vec!["cds-admins".to_owned()],
        ..config.rules
    };
    (shared, config.worker)
}

/// The worker rules' settings of `serve`.
fn policy() -> worker::Settings {
    settings().1
}

// === Generators ===

/// Worker names: pod names, names that are only label values, only object names, neither.
fn worker() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec!["w1", "w2", "w1.retry"]).prop_map(str::to_owned),
        1 => select(vec!["W_1", "-x", ""]).prop_map(str::to_owned),
        1 => Just("w".repeat(64)),
    ]
}

/// Secret names: protected by either prefix, unprotected, a bare prefix.
fn secret_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (select(vec!["cds-worker-config-", "cds-worker-registry-"]), worker())
            .prop_map(|(prefix, worker)| format!("{prefix}{worker}")),
        1 => select(vec!["db-password", "cds-worker-config-", "my-config", "cds-worker-"]).prop_map(str::to_owned),
        1 => "[a-z0-9-]{1,12}",
    ]
}

/// Label maps: absent, empty, or some of the worker, hatchery and other keys.
fn labels() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let key = prop_oneof![
        select(vec![WORKER_LABEL, HATCHERY_LABEL, "app", "cds.ovh/x~y"]).prop_map(str::to_owned),
        "[a-z]{1,6}",
    ];
    let value = prop_oneof![worker(), select(vec!["hatchery-1", "other"]).prop_map(str::to_owned)];
    proptest::option::of(proptest::collection::btree_map(key, value, 0..4))
}

/// Annotation maps, sometimes with the guard's own, right or stale.
fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let key = select(vec![PROTECTED_SECRETS_ANNOTATION, "team", "a/b"]).prop_map(str::to_owned);
    let value = prop_oneof![
        secret_name(),
        Just("cds-worker-config-w1,cds-worker-registry-w1".to_owned()),
    ];
    proptest::option::of(proptest::collection::btree_map(key, value, 0..3))
}

/// Every kind of secret reference that `SecretReferences::names` knows.
#[derive(Debug, Clone, Copy)]
enum Reference {
    Env,
    EnvFrom,
    Volume,
    Projected,
    ImagePull,
    InitEnv,
    EphemeralEnv,
}

const REFERENCES: [Reference; 7] = [
    Reference::Env,
    Reference::EnvFrom,
    Reference::Volume,
    Reference::Projected,
    Reference::ImagePull,
    Reference::InitEnv,
    Reference::EphemeralEnv,
];

fn secret_env(secret: &str) -> Vec<EnvVar> {
    vec![EnvVar {
        name: "CDS_CONFIG".to_owned(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: "config".to_owned(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }]
}

/// Adds a reference of `kind` to `secret` to a spec.
fn reference(spec: &mut PodSpec, kind: Reference, secret: &str) {
    let name = secret.to_owned();
    let volume = |volume: Volume| Volume {
        name: format!("v{}", spec.volumes.as_ref().map_or(0, Vec::len)),
        ..volume
    };
    match kind {
        Reference::Env => spec.containers[0]
            .env
            .get_or_insert_default()
            .extend(secret_env(secret)),
        Reference::EnvFrom => spec.containers[0].env_from.get_or_insert_default().push(EnvFromSource {
            secret_ref: Some(SecretEnvSource { name, optional: None }),
            ..EnvFromSource::default()
        }),
        Reference::Volume => {
            let v = volume(Volume {
                secret: Some(SecretVolumeSource {
                    secret_name: Some(name),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            });
            spec.volumes.get_or_insert_default().push(v);
        }
        Reference::Projected => {
            let v = volume(Volume {
                projected: Some(ProjectedVolumeSource {
                    sources: Some(vec![VolumeProjection {
                        secret: Some(SecretProjection {
                            name,
                            ..SecretProjection::default()
                        }),
                        ..VolumeProjection::default()
                    }]),
                    ..ProjectedVolumeSource::default()
                }),
                ..Volume::default()
            });
            spec.volumes.get_or_insert_default().push(v);
        }
        Reference::ImagePull => spec
            .image_pull_secrets
            .get_or_insert_default()
            .push(LocalObjectReference { name }),
        Reference::InitEnv => spec.init_containers.get_or_insert_default().push(Container {
            name: "init".to_owned(),
            env: Some(secret_env(secret)),
            ..Container::default()
        }),
        Reference::EphemeralEnv => spec
            .ephemeral_containers
            .get_or_insert_default()
            .push(EphemeralContainer {
                name: "debug".to_owned(),
                env: Some(secret_env(secret)),
                ..EphemeralContainer::default()
            }),
    }
}

/// A pod and the secret names it references.
fn pod() -> impl Strategy<Value = (Pod, Vec<String>)> {
    let references = proptest::collection::vec((select(REFERENCES.to_vec()), secret_name()), 0..5);
    (worker(), labels(), annotations(), references).prop_map(|(name, labels, annotations, references)| {
        let mut spec = PodSpec {
            containers: vec![Container {
                name: "worker".to_owned(),
                ..Container::default()
            }],
            ..PodSpec::default()
        };
        for (kind, secret) in &references {
            reference(&mut spec, *kind, secret);
        }
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some("cds".to_owned()),
                labels,
                annotations,
                ..ObjectMeta::default()
            },
            spec: Some(spec),
            ..Pod::default()
        };
        (pod, references.into_iter().map(|(_, secret)| secret).collect())
    })
}

/// The policy, sometimes with a worker label that needs escaping in a JSON pointer.
fn mutation_policy() -> impl Strategy<Value = worker::Settings> {
    any::<bool>().prop_map(|escaped| worker::Settings {
        worker_label: if escaped { "cds.ovh/worker~name" } else { WORKER_LABEL }.to_owned(),
        ..policy()
    })
}

fn hatchery() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        3 => Just("hatchery-1".to_owned()),
        1 => select(vec!["", "not a label value!"]).prop_map(str::to_owned),
        1 => Just("h".repeat(64)),
    ])
}

// === Mutation properties ===

/// The pod as the guard decodes it from the apiserver's JSON.
fn as_read(pod: &Pod) -> WorkerPod {
    serde_json::from_value(serde_json::to_value(pod).unwrap()).unwrap()
}

fn apply(pod: &Pod, patch: &json_patch::Patch) -> std::result::Result<Pod, String> {
    let mut document = serde_json::to_value(pod).unwrap();
    json_patch::patch(&mut document, patch).map_err(|e| e.to_string())?;
    serde_json::from_value(document).map_err(|e| e.to_string())
}

/// The protected secrets among `references`, by the documented rule: a configured
/// prefix followed by a non-empty worker name.
fn protected(config: &worker::Settings, references: &[String]) -> BTreeSet<String> {
    references
        .iter()
        .filter(|name| {
            config
                .secret_prefixes
                .iter()
                .any(|prefix| name.len() > prefix.len() && name.starts_with(prefix.as_str()))
        })
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// (a) the patch applies to its pod, (b) is empty on the patched pod, (c) keeps every
    /// existing label; and the annotation lists exactly the protected secrets referenced.
    #[test]
    fn the_patch_applies_is_idempotent_and_keeps_labels(
        (pod, references) in pod(),
        config in mutation_policy(),
        hatchery in hatchery(),
    ) {
        let planned = mutation::mutate(&config, &as_read(&pod), hatchery.as_deref());
        let patched = apply(&pod, &planned.patch);
        prop_assert!(patched.is_ok(), "{:?} does not apply: {:?}", planned.patch, patched.err());
        let patched = patched.unwrap();

        // (b) Reinvocation, with the hatchery known again or not: nothing left to do.
        for again in [hatchery.as_deref(), None] {
            let second = mutation::mutate(&config, &as_read(&patched), again);
            prop_assert!(second.patch.0.is_empty(), "second patch {:?}", second.patch);
        }

        // (c) No label removed or changed; what was added is a valid label value.
        let before = pod.metadata.labels.clone().unwrap_or_default();
        let after = patched.metadata.labels.clone().unwrap_or_default();
        for (key, value) in &before {
            prop_assert_eq!(after.get(key), Some(value), "label {} changed", key);
        }
        for (key, value) in after.iter().filter(|(key, _)| !before.contains_key(*key)) {
            prop_assert!([&config.worker_label, &config.hatchery_label].contains(&key), "added {}", key);
            // The hatchery's value is copied from its secret, where it may be empty.
            prop_assert!(is_label_value(value), "{}={:?}", key, value);
            if *key == config.worker_label {
                prop_assert!(!value.is_empty());
            }
        }
        let notes = patched.metadata.annotations.clone().unwrap_or_default();
        for (key, value) in pod.metadata.annotations.iter().flatten() {
            if key != PROTECTED_SECRETS_ANNOTATION {
                prop_assert_eq!(notes.get(key), Some(value), "annotation {} changed", key);
            }
        }

        // The annotation records the protected secrets found in any kind of reference.
        let expected = protected(&config, &references);
        if expected.is_empty() {
            prop_assert!(planned.patch.0.is_empty(), "patched a pod without protected secrets");
        } else {
            let listed = expected.into_iter().collect::<Vec<_>>().join(",");
            prop_assert_eq!(notes.get(PROTECTED_SECRETS_ANNOTATION), Some(&listed));
        }
    }
}

// === The rules ===

/// How the namespace read answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NamespaceRead {
    Active,
    Terminating,
    Fails,
}

/// An in-memory cluster that fails the reads it is told to and records every read.
#[derive(Debug, Default)]
struct Cluster {
    pods: BTreeMap<String, PodState>,
    stored_secret: Option<ObjectMeta>,
    pod_reads_fail: bool,
    lists_fail: bool,
    secret_read_fails: bool,
    namespace: Option<NamespaceRead>,
    /// `(what, failed)` of every read.
    reads: Mutex<Vec<(&'static str, bool)>>,
}

fn failure() -> Error {
    Error::KubeConfig("generated apiserver failure".to_owned())
}

impl Cluster {
    fn answer<T>(&self, what: &'static str, fails: bool, answer: T) -> Result<T> {
        self.reads.lock().unwrap().push((what, fails));
        if fails { Err(failure()) } else { Ok(answer) }
    }

    fn reads(&self) -> Vec<(&'static str, bool)> {
        self.reads.lock().unwrap().clone()
    }

    /// Whether a pod may still need its secret, by the documented rule.
    fn live(pod: &PodState) -> bool {
        !pod.terminating && !matches!(pod.phase.as_deref(), Some("Succeeded" | "Failed"))
    }
}

#[async_trait]
impl ClusterLookup for Cluster {
    async fn pod(&self, _: &str, name: &str) -> Result<Option<PodState>> {
        self.answer("pod", self.pod_reads_fail, self.pods.get(name).cloned())
    }

    async fn pods_labelled(&self, _: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        let pods = self
            .pods
            .values()
            .filter(|pod| pod.labels.get(label).is_some_and(|v| v == value));
        self.answer("list", self.lists_fail, pods.cloned().collect())
    }

    async fn secret_metadata(&self, _: &str, _: &str) -> Result<Option<ObjectMeta>> {
        self.answer("secret", self.secret_read_fails, self.stored_secret.clone())
    }

    async fn namespace_terminating(&self, _: &str) -> Result<bool> {
        let namespace = self.namespace.unwrap_or(NamespaceRead::Active);
        self.answer(
            "namespace",
            namespace == NamespaceRead::Fails,
            namespace == NamespaceRead::Terminating,
        )
    }
}

/// One generated delete: the policy, the request, the cluster, and the clock.
#[derive(Debug)]
struct Case {
    shared: rules::Settings,
    config: worker::Settings,
    namespace: &'static str,
    name: String,
    secret: Option<ObjectMeta>,
    username: Option<&'static str>,
    groups: Vec<String>,
    cluster: Cluster,
    now: Timestamp,
}

/// Pods of the cluster: named after workers or not, labelled or not, in every state.
fn pod_state() -> impl Strategy<Value = PodState> {
    let name = select(vec!["w1", "w2", "w1-first", "w1-retry", "w1.retry"]);
    let uid = select(vec!["uid-1", "uid-2", "uid-3"]);
    let label = proptest::option::of(select(vec!["w1", "w2", "W_1", "w1.retry"]));
    let phase = proptest::option::of(select(vec!["Pending", "Running", "Succeeded", "Failed", "Unknown"]));
    (name, uid, label, phase, proptest::bool::weighted(0.2)).prop_map(|(name, uid, label, phase, terminating)| {
        PodState {
            name: name.to_owned(),
            labels: label
                .map(|w| [(WORKER_LABEL.to_owned(), w.to_owned())].into())
                .unwrap_or_default(),
            uid: uid.to_owned(),
            phase: phase.map(str::to_owned),
            terminating,
        }
    })
}

fn owner_reference() -> impl Strategy<Value = OwnerReference> {
    let kind = select(vec![("v1", "Pod"), ("v1", "Pod"), ("apps/v1", "ReplicaSet")]);
    let name = select(vec!["w1", "w2", "w1-first"]);
    let uid = select(vec!["uid-1", "uid-2"]);
    (kind, name, uid).prop_map(|((api_version, kind), name, uid)| OwnerReference {
        api_version: api_version.to_owned(),
        kind: kind.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        ..OwnerReference::default()
    })
}

/// Secret metadata, created around the grace period before `now` (or never, or later).
fn secret_meta(now: Timestamp, grace: Duration) -> impl Strategy<Value = ObjectMeta> {
    let grace = i64::try_from(grace.as_secs()).unwrap();
    let age = proptest::option::of(select(vec![-60, 0, grace - 1, grace, grace + 1, 3600]));
    let worker_label = proptest::option::of(worker());
    let owners = proptest::collection::vec(owner_reference(), 0..3);
    (secret_name(), worker_label, age, owners).prop_map(move |(name, worker, age, owners)| ObjectMeta {
        name: Some(name),
        namespace: Some("cds".to_owned()),
        labels: worker.map(|w| [(WORKER_LABEL.to_owned(), w)].into()),
        creation_timestamp: age.map(|secs| Time(now - SignedDuration::from_secs(secs))),
        owner_references: (!owners.is_empty()).then_some(owners),
        ..ObjectMeta::default()
    })
}

fn case() -> impl Strategy<Value = Case> {
    let now = Timestamp::from_second(1_790_000_000).unwrap();
    let (shared, base) = settings();
    let grace = base.grace_period;
    let scope = prop_oneof![3 => Just(Vec::new()), 1 => Just(vec!["cds".to_owned()])];
    let namespace = prop_oneof![5 => Just("cds"), 1 => Just("other")];
    let sent = proptest::option::weighted(0.8, secret_meta(now, grace));
    let stored = proptest::option::weighted(0.8, secret_meta(now, grace));
    let deletecollection_item = proptest::bool::weighted(0.2);
    let username = select(vec![None, Some("alice"), Some(NAMESPACE_CONTROLLER)]);
    let groups = select(vec![
        vec![],
        vec!["system:authenticated".to_owned()],
        vec!["cds-admins".to_owned()],
    ]);
    let pods = proptest::collection::vec(pod_state(), 0..4);
    let failures = (
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.2),
        proptest::bool::weighted(0.1),
    );
    let namespace_read = select(vec![
        NamespaceRead::Active,
        NamespaceRead::Active,
        NamespaceRead::Terminating,
        NamespaceRead::Fails,
    ]);
    (
        (scope, namespace, sent, stored, deletecollection_item),
        (username, groups, pods, failures, namespace_read),
    )
        .prop_map(
            move |(
                (scope, namespace, sent, stored, deletecollection_item),
                (username, groups, pods, (pod_reads_fail, lists_fail, secret_read_fails), namespace_read),
            )| {
                let name = if deletecollection_item {
                    String::new()
                } else {
                    let secret = sent.as_ref().or(stored.as_ref());
                    secret
                        .and_then(|s| s.name.clone())
                        .unwrap_or_else(|| "cds-worker-config-w1".to_owned())
                };
                let mut cluster = Cluster {
                    stored_secret: stored,
                    pod_reads_fail,
                    lists_fail,
                    secret_read_fails,
                    namespace: Some(namespace_read),
                    ..Cluster::default()
                };
                for pod in pods {
                    cluster.pods.entry(pod.name.clone()).or_insert(pod);
                }
                Case {
                    shared: rules::Settings {
                        namespaces: scope,
                        ..shared.clone()
                    },
                    config: base.clone(),
                    namespace,
                    name,
                    secret: sent,
                    username,
                    groups,
                    cluster,
                    now,
                }
            },
        )
}

impl Case {
    fn decide(&self) -> Verdict {
        let request = SecretDelete {
            namespace: self.namespace,
            name: &self.name,
            secret: self.secret.as_ref(),
            username: self.username,
            groups: &self.groups,
        };
        futures::executor::block_on(worker::decide(
            &self.shared,
            &self.config,
            &request,
            &self.cluster,
            self.now,
        ))
    }

    /// The worker of a secret, by the documented rule: its worker label when not empty,
    /// else its name after a protected prefix.
    fn worker(&self, secret: &ObjectMeta) -> Option<String> {
        let label = secret
            .labels
            .as_ref()
            .and_then(|l| l.get(WORKER_LABEL))
            .filter(|w| !w.is_empty());
        let from_name = || {
            let name = secret.name.as_deref()?;
            let prefixes = self.config.secret_prefixes.iter();
            prefixes
                .filter_map(|p| name.strip_prefix(p.as_str()))
                .find(|w| !w.is_empty())
                .map(str::to_owned)
        };
        label.cloned().or_else(from_name)
    }

    fn exempt(&self) -> bool {
        self.username == Some(NAMESPACE_CONTROLLER) || self.groups.iter().any(|g| g == "cds-admins")
    }

    fn watched(&self) -> bool {
        self.shared.namespaces.is_empty() || self.shared.namespaces.iter().any(|n| n == self.namespace)
    }

    /// A live pod of `worker`: named after it, labelled with it, or a live owner of `secret`.
    fn live_pod(&self, worker: &str, secret: &ObjectMeta) -> Option<&PodState> {
        let owners: Vec<&OwnerReference> = secret
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.kind == "Pod" && o.api_version == "v1")
            .collect();
        self.cluster.pods.values().filter(|pod| Cluster::live(pod)).find(|pod| {
            (pod.name == worker && is_object_name(worker))
                || pod.labels.get(WORKER_LABEL).is_some_and(|w| w == worker)
                || owners.iter().any(|o| o.name == pod.name && o.uid == pod.uid)
        })
    }
}

/// Checks one decision against the rules; returns its reason.
fn check(case: &Case) -> std::result::Result<Reason, TestCaseError> {
    let verdict = case.decide();
    let reads = case.cluster.reads();
    let (allowed, reason) = (verdict.allowed, verdict.reason);
    let allowing = [
        Reason::NotProtected,
        Reason::NotFound,
        Reason::OutOfScope,
        Reason::Exempt,
        Reason::OwnerGone,
        Reason::Orphan,
        Reason::NamespaceTerminating,
    ];
    prop_assert_eq!(allowed, allowing.contains(&reason), "{:?}", verdict);

    // Out of scope: allowed, nothing read.
    if !case.watched() {
        prop_assert_eq!(reason, Reason::OutOfScope);
        prop_assert!(allowed && reads.is_empty(), "{:?} {:?}", verdict, reads);
        return Ok(reason);
    }

    // The secret the rules see: the one sent, else the one read.
    let secret = match &case.secret {
        Some(secret) => secret,
        None if case.cluster.secret_read_fails => {
            prop_assert!(
                !allowed,
                "allowed a delete whose secret could not be read: {:?}",
                verdict
            );
            return Ok(reason);
        }
        None => match &case.cluster.stored_secret {
            Some(secret) => secret,
            None => {
                prop_assert_eq!(reason, Reason::NotFound);
                return Ok(reason);
            }
        },
    };
    let pod_reads = || {
        reads
            .iter()
            .filter(|(what, _)| *what == "pod" || *what == "list")
            .count()
    };
    let Some(worker) = case.worker(secret) else {
        prop_assert_eq!(reason, Reason::NotProtected);
        prop_assert_eq!(pod_reads(), 0);
        return Ok(reason);
    };
    prop_assert_eq!(verdict.found.worker.as_deref(), Some(worker.as_str()));
    if case.exempt() {
        prop_assert_eq!(reason, Reason::Exempt);
        prop_assert_eq!(pod_reads(), 0);
        return Ok(reason);
    }

    // A protected secret, neither exempt nor out of scope: only a terminating
    // namespace may allow what a failed lookup or a live pod forbids.
    let terminating = case.cluster.namespace == Some(NamespaceRead::Terminating);
    if terminating {
        prop_assert!(allowed, "a terminating namespace's secret kept: {:?}", verdict);
    }
    if reason == Reason::NamespaceTerminating {
        prop_assert!(terminating);
        return Ok(reason);
    }
    let failed: Vec<_> = reads
        .iter()
        .filter(|(what, failed)| *failed && *what != "namespace")
        .collect();
    if !failed.is_empty() {
        prop_assert!(!allowed, "allowed although {:?} failed: {:?}", failed, verdict);
    }
    if case.cluster.lists_fail && is_label_value(&worker) {
        prop_assert!(
            !allowed,
            "allowed although the labelled pods were not listed: {:?}",
            verdict
        );
    }
    if case.cluster.pod_reads_fail && is_object_name(&worker) {
        prop_assert!(
            !allowed,
            "allowed although the worker's pod was not read: {:?}",
            verdict
        );
    }
    if let Some(pod) = case.live_pod(&worker, secret) {
        prop_assert!(!allowed, "allowed while {:?} is live: {:?}", pod, verdict);
    }
    let young = worker::secret_age(secret, case.now) < case.config.grace_period;
    if young && reason != Reason::OwnerGone {
        prop_assert!(!allowed, "allowed a young secret's delete: {:?}", verdict);
    }
    if reason == Reason::OwnerGone {
        let owners: Vec<_> = worker::pod_owners(secret).collect();
        prop_assert!(!owners.is_empty());
        for owner in owners {
            let pod = case.cluster.pods.get(&owner.name);
            prop_assert!(pod.is_none_or(|pod| pod.uid != owner.uid), "owner {:?} is there", owner);
        }
    }
    Ok(reason)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// (d) A protected secret is never allowed to go when a lookup it needed failed or a
    /// live pod of its worker exists, except as exempt, out of scope, or with its
    /// namespace; and those reasons are given exactly when they apply.
    #[test]
    fn a_needed_secret_is_never_allowed_to_go(case in case()) {
        check(&case)?;
    }
}

/// The generator is no vacuous truth: a fixed run reaches every reason.
#[test]
fn the_generated_deletes_reach_every_reason() {
    let mut runner = TestRunner::deterministic();
    let strategy = case();
    let mut reached = BTreeSet::new();
    for _ in 0..4000 {
        let case = strategy.new_tree(&mut runner).unwrap().current();
        reached.insert(check(&case).unwrap().code());
    }
    let all = [
        "not-protected",
        "not-found",
        "out-of-scope",
        "exempt",
        "owner-gone",
        "too-young",
        "pod-live",
        "lookup-failed",
        "orphan",
        "namespace-terminating",
    ];
    assert_eq!(reached, BTreeSet::from(all));
}
