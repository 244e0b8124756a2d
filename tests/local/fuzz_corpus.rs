//! The fuzz targets' checks, short and deterministic: every committed seed of
//! `fuzz/corpus/<target>/` through the same checks as `cargo fuzz` runs them
//! (`testkit::fuzz`), then a few thousand mutations of the seeds from a fixed seed.
//!
//! The seeds are built here from `tests/data/*.json`: `UPDATE_SEEDS=1 cargo test --test
//! fuzz_corpus` rewrites them, and the test fails when the committed ones differ.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use testkit::fake as common;
use testkit::fuzz as fuzz_checks;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use common::{remove, review, set};
use fuzz_checks::{Harness, ListAnswer, NamespaceAnswer, Outcome, PodAnswer, Scenario, SecretAnswer};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

/// Mutations per target.
const MUTATIONS: usize = 2000;
/// The mutations' seed: the same inputs on every run.
const SEED: u64 = 20_261_202;

const YOUNG: &str = "2999-01-01T00:00:00Z";

// === Seeds ===

fn secret_delete() -> Value {
    review("secret-delete")
}

fn owners(review: Value, owners: Value) -> Value {
    set(review, "/request/oldObject/metadata/ownerReferences", owners)
}

fn pod_owner(name: &str, uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid})
}

fn young(review: Value) -> Value {
    set(review, "/request/oldObject/metadata/creationTimestamp", json!(YOUNG))
}

fn renamed(review: Value, name: &str, labels: Value) -> Value {
    let review = set(review, "/request/name", json!(name));
    let review = set(review, "/request/oldObject/metadata/name", json!(name));
    set(review, "/request/oldObject/metadata/labels", labels)
}

/// Bodies that are not reviews, for both endpoints.
fn bad_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let text = |name, body: &str| (name, body.as_bytes().to_vec());
    vec![
        text("bad.empty", ""),
        text("bad.not-json", "{\"apiVersion\": "),
        text("bad.null", "null"),
        text("bad.array", "[]"),
        text("bad.not-a-review", "{\"hello\": \"world\"}"),
        text(
            "bad.wrong-version",
            "{\"apiVersion\": \"admission.k8s.io/v1beta1\", \"kind\": \"AdmissionReview\", \"request\": null}",
        ),
        text(
            "bad.no-request",
            "{\"apiVersion\": \"admission.k8s.io/v1\", \"kind\": \"AdmissionReview\"}",
        ),
        (
            "bad.object-of-no-shape",
            serde_json::to_vec(&set(secret_delete(), "/request/oldObject/metadata/labels", json!("x"))).unwrap(),
        ),
        (
            "bad.no-uid",
            serde_json::to_vec(&remove(secret_delete(), "/request/uid")).unwrap(),
        ),
    ]
}

/// The `/validate` bodies, by name.
fn validate_bodies() -> Vec<(&'static str, Value)> {
    let w1 = || json!({"CDS_HATCHERY_NAME": "hatchery-1", "CDS_WORKER_NAME": "w1"});
    vec![
        ("delete.old", secret_delete()),
        ("delete.young", young(secret_delete())),
        (
            "delete.no-creation-time",
            remove(secret_delete(), "/request/oldObject/metadata/creationTimestamp"),
        ),
        (
            "delete.deletecollection-item",
            set(secret_delete(), "/request/name", json!("")),
        ),
        ("delete.no-old-object", remove(secret_delete(), "/request/oldObject")),
        (
            "delete.deletecollection-item-no-old-object",
            remove(set(secret_delete(), "/request/name", json!("")), "/request/oldObject"),
        ),
        (
            "delete.owned",
            owners(secret_delete(), json!([pod_owner("w1", "uid-1")])),
        ),
        (
            "delete.owned-young",
            owners(young(secret_delete()), json!([pod_owner("w1", "uid-1")])),
        ),
        (
            "delete.owned-by-another-pod-young",
            owners(young(secret_delete()), json!([pod_owner("w1-first", "uid-1")])),
        ),
        (
            "delete.owned-by-two-pods",
            owners(
                young(secret_delete()),
                json!([pod_owner("w1", "uid-1"), pod_owner("w1-first", "uid-1")]),
            ),
        ),
        (
            "delete.owned-by-a-replicaset",
            owners(
                young(secret_delete()),
                json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w1", "uid": "uid-1"}]),
            ),
        ),
        ("delete.dry-run", set(secret_delete(), "/request/dryRun", json!(true))),
        ("delete.label-protected", renamed(secret_delete(), "my-config", w1())),
        (
            "delete.registry-secret",
            renamed(secret_delete(), "cds-worker-registry-w1", json!({})),
        ),
        (
            "delete.unprotected",
            renamed(secret_delete(), "db-password", json!({"app": "db"})),
        ),
        (
            "delete.empty-worker-label",
            renamed(secret_delete(), "cds-worker-config-w1", json!({"CDS_WORKER_NAME": ""})),
        ),
        (
            "delete.worker-not-a-pod-name",
            renamed(secret_delete(), "cds-worker-config-W_1", json!({})),
        ),
        (
            "delete.worker-not-a-label-value",
            renamed(
                secret_delete(),
                &format!("cds-worker-config-{}", "w".repeat(64)),
                json!({}),
            ),
        ),
        (
            "delete.exempt-user",
            set(
                secret_delete(),
                "/request/userInfo/username",
                json!("system:serviceaccount:kube-system:namespace-controller"),
            ),
        ),
        (
            "delete.exempt-group",
            set(
                secret_delete(),
                "/request/userInfo/groups",
                json!([fuzz_checks::EXEMPT_GROUP]),
            ),
        ),
        (
            "delete.out-of-scope",
            set(secret_delete(), "/request/namespace", json!("other")),
        ),
        ("delete.no-namespace", remove(secret_delete(), "/request/namespace")),
        ("other.configmap-delete", review("configmap-delete")),
        (
            "other.secret-update",
            set(secret_delete(), "/request/operation", json!("UPDATE")),
        ),
        (
            "other.secret-subresource",
            set(secret_delete(), "/request/subResource", json!("status")),
        ),
        ("other.pod-create", review("pod-create")),
    ]
}

/// A pod named `w1` with one container and the fixture's labels.
fn pod() -> Value {
    review("pod-create")["request"]["object"].clone()
}

fn pod_create(pod: Value) -> Value {
    set(review("pod-create"), "/request/object", pod)
}

fn env_secret_key_ref(secret: &str) -> Value {
    json!([{"name": "CDS_CONFIG", "valueFrom": {"secretKeyRef": {"name": secret, "key": "config"}}}])
}

/// A pod whose only secret reference is `reference`, at `pointer` of its spec.
fn referencing(pointer: &str, reference: Value) -> Value {
    let pod = remove(remove(pod(), "/spec/imagePullSecrets"), "/spec/containers/0/env");
    let mut review = pod_create(pod);
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = review.pointer_mut(&format!("/request/object/spec{parent}")).unwrap();
    parent.as_object_mut().unwrap().insert(key.to_owned(), reference);
    review
}

/// The `/mutate` bodies, by name.
fn mutate_bodies() -> Vec<(&'static str, Value)> {
    let config = "cds-worker-config-w1";
    let secret_volume = json!([{"name": "config", "secret": {"secretName": config}}]);
    let projected = json!([{"name": "p", "projected": {"sources": [{"secret": {"name": config}}]}}]);
    let init = json!([{"name": "init", "image": "i", "env": env_secret_key_ref(config)}]);
    let ephemeral = json!([{"name": "debug", "image": "d", "env": env_secret_key_ref(config)}]);
    let two_workers =
        json!([{"name": "CDS_CONFIG", "valueFrom": {"secretKeyRef": {"name": "cds-worker-config-w2", "key": "k"}}}]);
    let long = "w".repeat(64);
    vec![
        ("create.worker-pod", review("pod-create")),
        (
            "create.env-secret-key-ref",
            referencing("/containers/0/env", env_secret_key_ref(config)),
        ),
        (
            "create.env-from",
            referencing("/containers/0/envFrom", json!([{"secretRef": {"name": config}}])),
        ),
        ("create.secret-volume", referencing("/volumes", secret_volume)),
        ("create.projected-secret", referencing("/volumes", projected)),
        (
            "create.image-pull-secret",
            referencing("/imagePullSecrets", json!([{"name": "cds-worker-registry-w1"}])),
        ),
        ("create.init-container", referencing("/initContainers", init)),
        (
            "create.ephemeral-container",
            referencing("/ephemeralContainers", ephemeral),
        ),
        (
            "create.already-labelled",
            pod_create(set(
                set(
                    pod(),
                    "/metadata/labels",
                    json!({"app": "cds-worker", "CDS_WORKER_NAME": "w1", "CDS_HATCHERY_NAME": "hatchery-1"}),
                ),
                "/metadata/annotations",
                json!({"cds-secret-guard/protected-secrets": "cds-worker-config-w1,cds-worker-registry-w1"}),
            )),
        ),
        (
            "create.labelled-with-another-worker",
            pod_create(set(pod(), "/metadata/labels/CDS_WORKER_NAME", json!("other"))),
        ),
        (
            "create.stale-annotation",
            pod_create(set(
                pod(),
                "/metadata/annotations",
                json!({"cds-secret-guard/protected-secrets": "cds-worker-config-w0", "team": "ci"}),
            )),
        ),
        ("create.no-labels", pod_create(remove(pod(), "/metadata/labels"))),
        (
            "create.empty-labels",
            pod_create(set(pod(), "/metadata/labels", json!({}))),
        ),
        (
            "create.two-workers",
            pod_create(set(
                pod(),
                "/spec/initContainers",
                json!([{"name": "i", "env": two_workers}]),
            )),
        ),
        (
            "create.no-protected-secret",
            referencing("/containers/0/env", env_secret_key_ref("database-password")),
        ),
        (
            "create.worker-not-a-label-value",
            referencing(
                "/containers/0/env",
                env_secret_key_ref(&format!("cds-worker-config-{long}")),
            ),
        ),
        ("create.no-spec", pod_create(remove(pod(), "/spec"))),
        (
            "create.spec-of-no-shape",
            pod_create(set(pod(), "/spec/containers", json!("not a list"))),
        ),
        (
            "create.no-object",
            set(review("pod-create"), "/request/object", Value::Null),
        ),
        (
            "create.no-namespace",
            remove(review("pod-create"), "/request/namespace"),
        ),
        (
            "other.pod-update",
            set(review("pod-create"), "/request/operation", json!("UPDATE")),
        ),
        (
            "other.pod-subresource",
            set(
                review("pod-create"),
                "/request/subResource",
                json!("ephemeralcontainers"),
            ),
        ),
        ("other.secret-delete", secret_delete()),
    ]
}

/// The scenarios tried on a body: the quiet cluster, plus `extra`.
fn with(extra: &[Scenario]) -> Vec<Scenario> {
    [Scenario::default()].into_iter().chain(extra.iter().copied()).collect()
}

fn scenario_name(scenario: Scenario) -> String {
    let default = Scenario::default();
    let mut parts = Vec::new();
    if scenario.pod != default.pod {
        parts.push(format!("pod-{:?}", scenario.pod));
    }
    if scenario.other_uid {
        parts.push("other-uid".to_owned());
    }
    if scenario.labelled != default.labelled {
        parts.push(format!("list-{:?}", scenario.labelled));
    }
    if scenario.secret != default.secret {
        parts.push(format!("secret-{:?}", scenario.secret));
    }
    if scenario.secret_hangs {
        parts.push("secret-hangs".to_owned());
    }
    if scenario.namespace != default.namespace {
        parts.push(format!("ns-{:?}", scenario.namespace));
    }
    if scenario.warn {
        parts.push("warn".to_owned());
    }
    if parts.is_empty() {
        "quiet".to_owned()
    } else {
        parts.join(".").to_lowercase()
    }
}

fn pods(answers: &[PodAnswer]) -> Vec<Scenario> {
    answers
        .iter()
        .map(|&pod| Scenario {
            pod,
            ..Scenario::default()
        })
        .collect()
}

/// Which scenarios each `/validate` body is tried with.
fn validate_scenarios(name: &str) -> Vec<Scenario> {
    use {ListAnswer as L, NamespaceAnswer as N, PodAnswer as P, SecretAnswer as S};
    let s = Scenario::default;
    match name {
        "delete.old" => {
            let mut all = pods(&[
                P::Pending,
                P::Running,
                P::Succeeded,
                P::Failed,
                P::Terminating,
                P::Fails,
                P::Hangs,
            ]);
            all.extend([L::Live, L::Finished, L::Fails].map(|labelled| Scenario { labelled, ..s() }));
            all.extend([
                Scenario {
                    pod: P::Fails,
                    namespace: N::Terminating,
                    ..s()
                },
                Scenario {
                    pod: P::Running,
                    namespace: N::Fails,
                    ..s()
                },
                Scenario {
                    pod: P::Running,
                    namespace: N::Hangs,
                    ..s()
                },
                Scenario {
                    labelled: L::Live,
                    warn: true,
                    ..s()
                },
                Scenario { warn: true, ..s() },
            ]);
            with(&all)
        }
        "delete.young" | "delete.no-creation-time" => with(&[Scenario {
            namespace: N::Terminating,
            ..s()
        }]),
        "delete.owned" | "delete.owned-young" | "delete.owned-by-two-pods" => with(
            &[
                pods(&[P::Running, P::Succeeded, P::Fails]),
                vec![
                    Scenario {
                        pod: P::Running,
                        other_uid: true,
                        ..s()
                    },
                    Scenario {
                        pod: P::Absent,
                        labelled: L::Live,
                        ..s()
                    },
                    Scenario {
                        labelled: L::Fails,
                        ..s()
                    },
                ],
            ]
            .concat(),
        ),
        "delete.owned-by-another-pod-young" => with(&pods(&[P::Running, P::Succeeded])),
        "delete.no-old-object" | "delete.deletecollection-item-no-old-object" => with(
            &[S::Old, S::Young, S::Fails]
                .map(|secret| Scenario { secret, ..s() })
                .into_iter()
                .chain([
                    Scenario {
                        secret: S::Old,
                        pod: P::Running,
                        ..s()
                    },
                    Scenario {
                        secret_hangs: true,
                        ..s()
                    },
                ])
                .collect::<Vec<_>>(),
        ),
        "delete.label-protected" | "delete.registry-secret" | "delete.worker-not-a-pod-name" => {
            with(&pods(&[P::Running]))
        }
        "delete.worker-not-a-label-value" | "delete.empty-worker-label" => with(&[Scenario {
            labelled: L::Live,
            ..s()
        }]),
        "delete.exempt-user" | "delete.exempt-group" | "delete.out-of-scope" => with(&[Scenario {
            pod: P::Fails,
            labelled: L::Fails,
            ..s()
        }]),
        _ => with(&[]),
    }
}

/// Which scenarios each `/mutate` body is tried with.
fn mutate_scenarios(name: &str) -> Vec<Scenario> {
    let s = Scenario::default;
    match name {
        "create.worker-pod" | "create.no-labels" => with(&[
            Scenario {
                secret: SecretAnswer::Old,
                ..s()
            },
            Scenario {
                secret: SecretAnswer::Fails,
                ..s()
            },
            Scenario {
                secret: SecretAnswer::Old,
                secret_hangs: true,
                ..s()
            },
        ]),
        name if name.starts_with("create.") => with(&[Scenario {
            secret: SecretAnswer::Old,
            ..s()
        }]),
        _ => with(&[]),
    }
}

/// Which scenarios a body of a target is tried with.
type ScenariosOf = fn(&str) -> Vec<Scenario>;

/// Every seed, as `(target, file name, bytes)`.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut seeds = Vec::new();
    let mut decode = BTreeMap::new();
    let bodies = |named: Vec<(&'static str, Value)>| -> Vec<(&'static str, Vec<u8>)> {
        let json = named
            .into_iter()
            .map(|(name, body)| (name, serde_json::to_vec(&body).unwrap()));
        json.chain(bad_bodies()).collect()
    };
    let targets: [(&str, _, ScenariosOf); 2] = [
        ("validate", bodies(validate_bodies()), validate_scenarios),
        ("mutate", bodies(mutate_bodies()), mutate_scenarios),
    ];
    for (target, bodies, scenarios) in targets {
        for (name, body) in bodies {
            for scenario in scenarios(name) {
                let file = format!("{name}.{}", scenario_name(scenario));
                seeds.push((target, file, scenario.input(&body)));
            }
            decode.insert(name.to_owned(), body);
        }
    }
    seeds.extend(decode.into_iter().map(|(name, body)| ("decode", name, body)));
    seeds
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

#[test]
fn committed_seeds_are_the_generated_ones() {
    let update = std::env::var_os("UPDATE_SEEDS").is_some();
    let mut names = BTreeSet::new();
    for (target, name, bytes) in seeds() {
        let path = corpus_dir(target).join(&name);
        assert!(names.insert((target, name.clone())), "two seeds named {target}/{name}");
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let committed = std::fs::read(&path).unwrap_or_default();
            assert!(
                committed == bytes,
                "{} differs from its generated seed; run UPDATE_SEEDS=1 cargo test --test fuzz_corpus",
                path.display()
            );
        }
    }
}

// === Replays ===

/// Every committed file of a target's corpus (seeds and any committed finding).
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() > 10, "{}: the seed corpus is missing", dir.display());
    files
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect()
}

/// Values a mutation puts in a JSON document.
fn random_value(rng: &mut StdRng) -> Value {
    let names = [
        "",
        "w1",
        "cds-worker-config-w1",
        "cds-worker-registry-w2",
        "W_1",
        "a/b~c",
    ];
    match rng.random_range(0..10) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => json!(rng.random_range(-2i64..3)),
        3 => json!(1e308),
        4 => json!({}),
        5 => json!([]),
        6 => json!("x".repeat(rng.random_range(0..300))),
        7 => json!(["DELETE", "CREATE", "UPDATE", "Pod", "Secret", "v1", "uid-1"][rng.random_range(0..7)]),
        _ => json!(names[rng.random_range(0..names.len())]),
    }
}

/// Replaces, removes or empties one node of a document, found by a random walk.
fn mutate_json(value: &mut Value, rng: &mut StdRng) {
    let children = match value {
        Value::Object(map) => map.len(),
        Value::Array(items) => items.len(),
        _ => 0,
    };
    if children == 0 || rng.random_ratio(1, 6) {
        *value = random_value(rng);
        return;
    }
    let index = rng.random_range(0..children);
    let remove = rng.random_ratio(1, 8);
    match value {
        Value::Object(map) if remove => {
            let key = map.keys().nth(index).cloned().unwrap();
            map.remove(&key);
        }
        Value::Array(items) if remove => {
            items.remove(index);
        }
        Value::Object(map) => mutate_json(map.values_mut().nth(index).unwrap(), rng),
        Value::Array(items) => mutate_json(&mut items[index], rng),
        _ => unreachable!("a node with children is an object or an array"),
    }
}

/// One mutation of a body: structural when it is JSON (most of the time), else bytes.
fn mutate_body(body: &[u8], rng: &mut StdRng) -> Vec<u8> {
    if let Ok(mut value) = serde_json::from_slice::<Value>(body)
        && rng.random_ratio(4, 5)
    {
        for _ in 0..rng.random_range(1..4) {
            mutate_json(&mut value, rng);
        }
        return serde_json::to_vec(&value).unwrap();
    }
    let mut bytes = body.to_vec();
    for _ in 0..rng.random_range(1..5) {
        let at = rng.random_range(0..=bytes.len());
        match rng.random_range(0..4) {
            0 if at < bytes.len() => bytes[at] ^= 1 << rng.random_range(0..8),
            1 => bytes.insert(at, b"{}[]\",:0\\\xff"[rng.random_range(0..10)]),
            2 => bytes.truncate(at),
            _ => bytes
                .drain(at..(at + rng.random_range(0..16)).min(bytes.len()))
                .for_each(drop),
        }
    }
    bytes
}

/// A mutation of a handler input: its body mutated, or its scenario redrawn.
fn mutate_input(input: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let (scenario, body) = Scenario::split(input);
    if rng.random_ratio(1, 4) {
        let control: [u8; 2] = rng.random();
        return [&control[..], body].concat();
    }
    scenario.input(&mutate_body(body, rng))
}

/// The corpus, then `MUTATIONS` mutations of it, through `check`.
fn replay<T>(target: &str, mutate: fn(&[u8], &mut StdRng) -> Vec<u8>, mut check: impl FnMut(&[u8]) -> T) -> Vec<T> {
    let corpus = corpus(target);
    let mut outcomes = Vec::new();
    for (name, input) in &corpus {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(input)));
        outcomes.push(outcome.unwrap_or_else(|_| panic!("{target} seed {name} broke a property")));
    }
    let mut rng = StdRng::seed_from_u64(SEED);
    for i in 0..MUTATIONS {
        let (name, input) = &corpus[rng.random_range(0..corpus.len())];
        let mutated = mutate(input, &mut rng);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&mutated)));
        outcomes.push(outcome.unwrap_or_else(|_| {
            let path = std::env::temp_dir().join(format!("fuzz-corpus-{target}-{i}"));
            std::fs::write(&path, &mutated).unwrap();
            panic!(
                "mutation {i} of {target} seed {name} broke a property; input in {}",
                path.display()
            )
        }));
    }
    outcomes
}

#[test]
fn decode_corpus_and_mutations() {
    let outcomes = replay("decode", mutate_body, |body| {
        fuzz_checks::decode(body);
    });
    assert_eq!(outcomes.len(), corpus("decode").len() + MUTATIONS);
}

#[test]
fn validate_corpus_and_mutations() {
    let harness = Harness::new();
    let seeds = corpus("validate").len();
    let outcomes = replay("validate", mutate_input, |input| harness.validate(input));

    // The seeds alone reach every kind of answer the checks tell apart.
    let seeded: &[Outcome] = &outcomes[..seeds];
    let reached = |what: &str, test: &dyn Fn(&Outcome) -> bool| {
        assert!(seeded.iter().any(test), "no seed reaches {what}");
    };
    reached("a 400", &|o| o.status == 400);
    for reason in ["too-young", "pod-live", "lookup-failed"] {
        reached(reason, &|o| {
            o.denied_by.as_deref() == Some(reason) && o.allowed == Some(false)
        });
    }
    reached("a warn-mode denial", &|o| {
        o.denied_by.is_some() && o.allowed == Some(true)
    });
    reached("an allow without reads", &|o| o.allowed == Some(true) && o.reads == 0);
    reached("an orphan", &|o| {
        o.allowed == Some(true) && o.denied_by.is_none() && o.reads > 0 && !o.namespace_terminating
    });
    reached("a terminating namespace's allow", &|o| {
        o.allowed == Some(true) && o.denied_by.is_none() && o.namespace_terminating
    });
}

#[test]
fn mutate_corpus_and_mutations() {
    let harness = Harness::new();
    let seeds = corpus("mutate").len();
    let outcomes = replay("mutate", mutate_input, |input| harness.mutate(input));

    let seeded = &outcomes[..seeds];
    assert!(seeded.iter().any(|o| o.status == 400), "no seed reaches a 400");
    assert!(seeded.iter().any(|o| o.patched), "no seed is patched");
    assert!(
        seeded.iter().any(|o| o.status == 200 && !o.patched),
        "every seed is patched"
    );
    let patched = outcomes.iter().filter(|o| o.patched).count();
    assert!(patched > MUTATIONS / 10, "only {patched} mutated pods were patched");
}
