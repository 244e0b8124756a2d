//! The checks shared by the fuzz targets (`fuzz/fuzz_targets/`) and by
//! `tests/local/fuzz_corpus.rs`, which replays the seed corpus through
//! them: one input in, a panic on any broken property out.
//!
//! A handler input is two control bytes, which choose what the fake cluster answers
//! ([`Scenario`]), followed by the HTTP body; a decode input is a body alone. The
//! handlers run through the real router, in a current-thread runtime built once, with
//! time paused so that a read that never answers costs nothing: the clock jumps to the
//! read's deadline.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use axum::{
    Router,
    body::{Body, to_bytes},
    http::{Request, StatusCode},
    response::IntoResponse,
};
use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use cds_secret_guard::{
    Config, Error, Result, Server,
    api::review::{self, API_VERSION, Answer, ReviewRequest},
    cli::{Cli, Command},
    rules::worker,
    rules::worker::SecretObject,
    rules::worker::mutation::PROTECTED_SECRETS_ANNOTATION,
    rules::worker::pod::{PodObject, PodState},
    rules::worker::reads::ClusterLookup,
    rules::{self, Mode},
};
use json_patch::{Patch, PatchOperation};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::{SignedDuration, Timestamp},
};
use kube::core::admission::Operation;
use serde::Deserialize;
use serde_json::Value;
use tower::ServiceExt;

/// The namespaces the fuzzed guard watches; a delete anywhere else is out of scope.
pub const WATCHED: [&str; 2] = ["cds", "cds-2"];
/// A group exempt from the checks, besides serve's default exempt user.
pub const EXEMPT_GROUP: &str = "cds-admins";
/// The uid of the pod the fake cluster answers with when bit 3 of byte 0 is clear.
pub const OWNER_UID: &str = "uid-1";

// === Scenario ===

/// What the fake cluster answers, chosen by the first two bytes of a handler input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scenario {
    /// Every read of a pod by name (byte 0, bits 0-2).
    pub pod: PodAnswer,
    /// That pod's uid is [`OWNER_UID`] (bit 3 clear) or another one (bit 3 set).
    pub other_uid: bool,
    /// The list of pods carrying the worker label (bits 4-5).
    pub labelled: ListAnswer,
    /// Every read of a secret's metadata (bits 6-7).
    pub secret: SecretAnswer,
    /// The namespace read (byte 1, bits 0-1).
    pub namespace: NamespaceAnswer,
    /// The guard runs in warn mode (bit 2).
    pub warn: bool,
    /// Secret reads never answer (bit 3).
    pub secret_hangs: bool,
}

/// The answer to a read of a pod by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum PodAnswer {
    /// No such pod.
    #[default]
    Absent,
    /// A pod with no phase yet.
    Pending,
    /// A running pod.
    Running,
    /// A pod that succeeded.
    Succeeded,
    /// A pod that failed.
    Failed,
    /// A running pod with a deletion timestamp.
    Terminating,
    /// The read fails.
    Fails,
    /// The read never answers.
    Hangs,
}

/// The answer to the list of a worker's labelled pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum ListAnswer {
    /// No pod.
    #[default]
    Empty,
    /// One running pod.
    Live,
    /// One succeeded pod.
    Finished,
    /// The list fails.
    Fails,
}

/// The answer to a read of a secret's metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum SecretAnswer {
    /// No such secret.
    #[default]
    Absent,
    /// A secret created an hour ago, labelled with its hatchery.
    Old,
    /// A secret created just now, labelled with its hatchery.
    Young,
    /// The read fails.
    Fails,
}

/// The answer to the namespace read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum NamespaceAnswer {
    /// Not being deleted.
    #[default]
    Active,
    /// Being deleted.
    Terminating,
    /// The read fails.
    Fails,
    /// The read never answers.
    Hangs,
}

const PODS: [PodAnswer; 8] = [
    PodAnswer::Absent,
    PodAnswer::Pending,
    PodAnswer::Running,
    PodAnswer::Succeeded,
    PodAnswer::Failed,
    PodAnswer::Terminating,
    PodAnswer::Fails,
    PodAnswer::Hangs,
];
const LISTS: [ListAnswer; 4] = [
    ListAnswer::Empty,
    ListAnswer::Live,
    ListAnswer::Finished,
    ListAnswer::Fails,
];
const SECRETS: [SecretAnswer; 4] = [
    SecretAnswer::Absent,
    SecretAnswer::Old,
    SecretAnswer::Young,
    SecretAnswer::Fails,
];
const NAMESPACES: [NamespaceAnswer; 4] = [
    NamespaceAnswer::Active,
    NamespaceAnswer::Terminating,
    NamespaceAnswer::Fails,
    NamespaceAnswer::Hangs,
];

impl Scenario {
    /// The scenario of a handler input and its body; missing control bytes read as 0.
    pub fn split(input: &[u8]) -> (Self, &[u8]) {
        let byte = |i: usize| input.get(i).copied().unwrap_or_default();
        let (b0, b1) = (byte(0), byte(1));
        let scenario = Self {
            pod: PODS[usize::from(b0 & 0b111)],
            other_uid: b0 & 0b1000 != 0,
            labelled: LISTS[usize::from((b0 >> 4) & 0b11)],
            secret: SECRETS[usize::from(b0 >> 6)],
            namespace: NAMESPACES[usize::from(b1 & 0b11)],
            warn: b1 & 0b100 != 0,
            secret_hangs: b1 & 0b1000 != 0,
        };
        (scenario, input.get(2..).unwrap_or_default())
    }

    /// The control bytes that [`Scenario::split`] reads back as this scenario.
    pub fn bytes(self) -> [u8; 2] {
        let b0 = self.pod as u8 | u8::from(self.other_uid) << 3 | (self.labelled as u8) << 4 | (self.secret as u8) << 6;
        let b1 = self.namespace as u8 | u8::from(self.warn) << 2 | u8::from(self.secret_hangs) << 3;
        [b0, b1]
    }

    /// A handler input: these control bytes, then `body`.
    pub fn input(self, body: &[u8]) -> Vec<u8> {
        [&self.bytes()[..], body].concat()
    }
}

// === The scripted cluster ===

/// One read the fake cluster answered, with what it answered.
#[derive(Debug, Clone)]
pub enum Read {
    /// A pod read by name.
    Pod {
        /// The name asked for.
        name: String,
        /// The pod answered.
        pod: Option<PodState>,
        /// The read failed or never answered.
        failed: bool,
    },
    /// The list of pods labelled with a worker.
    Labelled {
        /// The pods answered.
        pods: Vec<PodState>,
        /// The list failed.
        failed: bool,
    },
    /// A secret's metadata.
    Secret {
        /// The metadata answered.
        meta: Option<Box<ObjectMeta>>,
        /// The read failed or never answered.
        failed: bool,
    },
    /// The namespace read.
    Namespace {
        /// The namespace is being deleted.
        terminating: bool,
        /// The read failed or never answered.
        failed: bool,
    },
}

impl Read {
    fn failed(&self) -> bool {
        match self {
            Self::Pod { failed, .. }
            | Self::Labelled { failed, .. }
            | Self::Secret { failed, .. }
            | Self::Namespace { failed, .. } => *failed,
        }
    }
}

/// A [`ClusterLookup`] that answers as the current [`Scenario`] says and records every read.
struct ScriptedCluster {
    scenario: Mutex<Scenario>,
    reads: Mutex<Vec<Read>>,
    hatchery_label: String,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A failed check panics while no lock is held; a poisoned lock still holds good data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn scripted_failure() -> Error {
    Error::KubeConfig("scripted apiserver failure".to_owned())
}

impl ScriptedCluster {
    fn start(&self, scenario: Scenario) {
        *lock(&self.scenario) = scenario;
        lock(&self.reads).clear();
    }

    fn scenario(&self) -> Scenario {
        *lock(&self.scenario)
    }

    fn reads(&self) -> Vec<Read> {
        lock(&self.reads).clone()
    }

    fn record(&self, read: Read) {
        lock(&self.reads).push(read);
    }
}

fn pod_state(name: &str, uid: &str, phase: Option<&str>, terminating: bool) -> PodState {
    PodState {
        name: name.to_owned(),
        labels: Default::default(),
        uid: uid.to_owned(),
        phase: phase.map(str::to_owned),
        terminating,
    }
}

#[async_trait]
impl ClusterLookup for ScriptedCluster {
    async fn pod(&self, _: &str, name: &str) -> Result<Option<PodState>> {
        let scenario = self.scenario();
        let uid = if scenario.other_uid { "uid-2" } else { OWNER_UID };
        let answer = match scenario.pod {
            PodAnswer::Absent => Ok(None),
            PodAnswer::Pending => Ok(Some(pod_state(name, uid, None, false))),
            PodAnswer::Running => Ok(Some(pod_state(name, uid, Some("Running"), false))),
            PodAnswer::Succeeded => Ok(Some(pod_state(name, uid, Some("Succeeded"), false))),
            PodAnswer::Failed => Ok(Some(pod_state(name, uid, Some("Failed"), false))),
            PodAnswer::Terminating => Ok(Some(pod_state(name, uid, Some("Running"), true))),
            PodAnswer::Fails => Err(scripted_failure()),
            PodAnswer::Hangs => Err(scripted_failure()),
        };
        self.record(Read::Pod {
            name: name.to_owned(),
            pod: answer.as_ref().ok().cloned().flatten(),
            failed: answer.is_err(),
        });
        if scenario.pod == PodAnswer::Hangs {
            std::future::pending::<()>().await;
        }
        answer
    }

    async fn pods_labelled(&self, _: &str, label: &str, value: &str) -> Result<Vec<PodState>> {
        let labelled = |phase: &str| {
            let mut pod = pod_state(&format!("{value}-retry"), "uid-9", Some(phase), false);
            pod.labels.insert(label.to_owned(), value.to_owned());
            vec![pod]
        };
        let answer = match self.scenario().labelled {
            ListAnswer::Empty => Ok(Vec::new()),
            ListAnswer::Live => Ok(labelled("Running")),
            ListAnswer::Finished => Ok(labelled("Succeeded")),
            ListAnswer::Fails => Err(scripted_failure()),
        };
        self.record(Read::Labelled {
            pods: answer.as_ref().cloned().unwrap_or_default(),
            failed: answer.is_err(),
        });
        answer
    }

    async fn secret_metadata(&self, namespace: &str, name: &str) -> Result<Option<ObjectMeta>> {
        let scenario = self.scenario();
        let secret = |age: SignedDuration| ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            creation_timestamp: Some(Time(Timestamp::now() - age)),
            labels: Some([(self.hatchery_label.clone(), "hatchery-1".to_owned())].into()),
            ..ObjectMeta::default()
        };
        let answer = match scenario.secret {
            _ if scenario.secret_hangs => Err(scripted_failure()),
            SecretAnswer::Absent => Ok(None),
            SecretAnswer::Old => Ok(Some(secret(SignedDuration::from_hours(1)))),
            SecretAnswer::Young => Ok(Some(secret(SignedDuration::ZERO))),
            SecretAnswer::Fails => Err(scripted_failure()),
        };
        self.record(Read::Secret {
            meta: answer.as_ref().ok().cloned().flatten().map(Box::new),
            failed: answer.is_err(),
        });
        if scenario.secret_hangs {
            std::future::pending::<()>().await;
        }
        answer
    }

    async fn namespace_terminating(&self, _: &str) -> Result<bool> {
        let namespace = self.scenario().namespace;
        let answer = match namespace {
            NamespaceAnswer::Active => Ok(false),
            NamespaceAnswer::Terminating => Ok(true),
            NamespaceAnswer::Fails | NamespaceAnswer::Hangs => Err(scripted_failure()),
        };
        self.record(Read::Namespace {
            terminating: answer.as_ref().is_ok_and(|t| *t),
            failed: answer.is_err(),
        });
        if namespace == NamespaceAnswer::Hangs {
            std::future::pending::<()>().await;
        }
        answer
    }
}

// === Harness ===

/// What one handler input got, for the corpus test to check what the seeds reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The HTTP status.
    pub status: u16,
    /// `response.allowed` of a 200.
    pub allowed: Option<bool>,
    /// The reason of a denial (a would-be denial in warn mode).
    pub denied_by: Option<String>,
    /// A patch was returned.
    pub patched: bool,
    /// How many reads the fake cluster answered.
    pub reads: usize,
    /// One of them said the namespace is being deleted.
    pub namespace_terminating: bool,
}

/// The guard's admission router, in enforce and in warn mode, over a scripted cluster.
pub struct Harness {
    runtime: tokio::runtime::Runtime,
    enforce: Router,
    warn: Router,
    cluster: Arc<ScriptedCluster>,
    shared: rules::Settings,
    policy: rules::worker::Settings,
}

/// `serve`'s configuration as its flags make it, watching [`WATCHED`] only and
/// exempting [`EXEMPT_GROUP`] besides the namespace controller.
pub fn config(mode: Mode) -> Config {
    use clap::Parser;
    let Command::Serve(args) = Cli::parse_from(["cds-secret-guard", "serve"]).command else {
        unreachable!("parsed serve")
    };
    let mut config = args.into_config();
    config.rules.mode = mode;
    config.rules.namespaces = WATCHED.map(str::to_owned).to_vec();
    config.rules.exempt_groups = vec![EXEMPT_GROUP.to_owned()];
    config
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// Builds the runtime and both routers, once.
    pub fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime must build");
        let enforce = config(Mode::Enforce);
        let (shared, policy) = (enforce.rules.clone(), enforce.worker.clone());
        let cluster = Arc::new(ScriptedCluster {
            scenario: Mutex::default(),
            reads: Mutex::default(),
            hatchery_label: policy.hatchery_label.clone(),
        });
        let (enforce, warn) = {
            let _entered = runtime.enter();
            let warn = Server::new(config(Mode::Warn), cluster.clone()).router();
            (Server::new(enforce, cluster.clone()).router(), warn)
        };
        Self {
            runtime,
            enforce,
            warn,
            cluster,
            shared,
            policy,
        }
    }

    fn post(&self, scenario: Scenario, path: &str, body: &[u8]) -> (StatusCode, Vec<u8>, Vec<Read>) {
        self.cluster.start(scenario);
        let router = if scenario.warn { &self.warn } else { &self.enforce };
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()))
            .expect("a POST with a byte body must build");
        let (status, bytes) = self.runtime.block_on(async {
            let response = router
                .clone()
                .oneshot(request)
                .await
                .expect("axum routers are infallible");
            let status = response.status();
            let bytes = to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("a buffered body must read");
            (status, bytes.to_vec())
        });
        (status, bytes, self.cluster.reads())
    }

    /// `/validate` on a handler input: the HTTP contract, then the secret-delete rules.
    pub fn validate(&self, input: &[u8]) -> Outcome {
        let (scenario, body) = Scenario::split(input);
        let (status, bytes, reads) = self.post(scenario, "/validate", body);
        let mut outcome = Outcome::new(status, &reads);
        let Some((request, answer)) = answered::<SecretObject>(body, status, &bytes) else {
            assert!(reads.is_empty(), "a rejected body caused reads: {reads:?}");
            return outcome;
        };
        let response = &answer["response"];
        let allowed = response["allowed"].as_bool().expect("response.allowed is a boolean");
        outcome.allowed = Some(allowed);
        if !review::is_for(&request, "Secret", Operation::Delete) {
            assert!(allowed, "not a secret delete, yet denied: {answer}");
            assert!(reads.is_empty(), "not a secret delete, yet read the cluster: {reads:?}");
            return outcome;
        }

        // A denial, enforced or not, carries its reason in the audit annotations.
        let denied_by = response["auditAnnotations"]["reason"].as_str().map(str::to_owned);
        if let Some(reason) = &denied_by {
            assert!(
                ["too-young", "pod-live", "lookup-failed"].contains(&reason.as_str()),
                "denied by {reason:?}: {answer}"
            );
            assert_eq!(response["auditAnnotations"]["decision"], "deny", "{answer}");
        }
        if scenario.warn {
            assert!(allowed, "warn mode denied: {answer}");
            if denied_by.is_some() {
                let warning = response["warnings"][0].as_str().unwrap_or_default();
                assert!(warning.starts_with("cds-secret-guard would deny: "), "{answer}");
            }
        } else {
            assert_eq!(
                allowed,
                denied_by.is_none(),
                "allowed and audit annotations disagree: {answer}"
            );
            if !allowed {
                assert_eq!(response["status"]["code"], 403, "{answer}");
                let message = response["status"]["message"].as_str().unwrap_or_default();
                assert!(!message.is_empty(), "a denial without a message: {answer}");
            }
        }
        self.check_rules(&request, &reads, denied_by.is_none(), &answer);
        outcome.denied_by = denied_by;
        outcome
    }

    /// The rules, from what the request said and what the cluster answered, whatever
    /// the order in which the guard asked.
    fn check_rules(&self, request: &ReviewRequest<'_, SecretObject>, reads: &[Read], allowed: bool, answer: &Value) {
        let namespace = request.namespace.as_deref().unwrap_or_default();
        let old_object = request.old_object.as_ref().map(|secret| &secret.metadata);
        let exempt = self.shared.is_exempt(
            request.user_info.username.as_deref(),
            request.user_info.groups.as_deref().unwrap_or_default(),
        );
        let protected = old_object.and_then(|meta| self.policy.worker_of_secret(meta)).is_some();

        // The allow reasons that look at no pod: out of scope, not protected, exempt.
        if !self.shared.watches(namespace) || (old_object.is_some() && (!protected || exempt)) {
            assert!(allowed, "out of scope, unprotected or exempt, yet denied: {answer}");
            assert!(
                reads.is_empty(),
                "read the cluster for a decision that needs no read: {reads:?}"
            );
            return;
        }

        // A namespace being deleted is the only reason to allow what the pods forbid.
        let terminating = reads
            .iter()
            .any(|read| matches!(read, Read::Namespace { terminating: true, .. }));
        if !allowed || terminating {
            return;
        }
        let failed: Vec<&Read> = reads.iter().filter(|read| read.failed()).collect();
        assert!(
            failed.is_empty(),
            "allowed although a lookup failed: {failed:?}\n{answer}"
        );

        // The secret is the one sent, else the one read.
        let fetched = reads.iter().find_map(|read| match read {
            Read::Secret { meta, .. } => meta.as_deref(),
            _ => None,
        });
        let Some(secret) = old_object.or(fetched) else {
            return; // gone: nothing to protect
        };
        let Some(worker) = self.policy.worker_of_secret(secret) else {
            return;
        };
        let owners: Vec<_> = worker::pod_owners(secret).collect();
        let live = reads.iter().find_map(|read| match read {
            Read::Pod {
                name, pod: Some(pod), ..
            } if pod.is_live() && (*name == worker || owners.iter().any(|o| o.name == *name && o.uid == pod.uid)) => {
                Some(pod)
            }
            Read::Labelled { pods, .. } => pods.iter().find(|pod| pod.is_live()),
            _ => None,
        });
        assert!(
            live.is_none(),
            "allowed the delete of worker {worker}'s secret while its pod {live:?} is live\n{answer}"
        );
        if owners.is_empty() {
            let age = worker::secret_age(secret, Timestamp::now());
            assert!(
                age >= self.policy.grace_period,
                "allowed a young secret's delete: {answer}"
            );
        }
    }

    /// `/mutate` on a handler input: the HTTP contract, then the patch.
    pub fn mutate(&self, input: &[u8]) -> Outcome {
        let (scenario, body) = Scenario::split(input);
        let (status, bytes, reads) = self.post(scenario, "/mutate", body);
        let mut outcome = Outcome::new(status, &reads);
        let Some((request, answer)) = answered::<PodObject>(body, status, &bytes) else {
            assert!(reads.is_empty(), "a rejected body caused reads: {reads:?}");
            return outcome;
        };
        let response = &answer["response"];
        assert_eq!(response["allowed"], true, "a pod create was blocked: {answer}");
        outcome.allowed = Some(true);
        assert!(
            reads.iter().all(|read| matches!(read, Read::Secret { .. })),
            "the mutation reads only secrets: {reads:?}"
        );
        match &request.object {
            Some(_) if review::is_for(&request, "Pod", Operation::Create) => {}
            _ => {
                assert!(
                    response["patch"].is_null(),
                    "patched what is not a pod create: {answer}"
                );
                assert!(reads.is_empty(), "not a pod create, yet read the cluster: {reads:?}");
                return outcome;
            }
        }
        let Some(encoded) = response["patch"].as_str() else {
            assert!(response["patch"].is_null(), "the patch is not base64 text: {answer}");
            return outcome;
        };
        outcome.patched = true;
        assert_eq!(response["patchType"], "JSONPatch", "{answer}");
        let patch = BASE64.decode(encoded).expect("the patch is base64");
        let patch: Patch = serde_json::from_slice(&patch).expect("the patch is a JSON Patch");
        // The pod as the apiserver holds it, to apply the patch to; a body beyond what
        // serde_json reads as a `Value` (numbers past f64, nesting past 128) has none.
        let Ok(review) = serde_json::from_slice::<Value>(body) else {
            return outcome;
        };
        let patched = check_patch(&review["request"]["object"], &patch);

        // The apiserver reinvokes the webhook with the patched pod: nothing more to do.
        let again = serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "request": {
                "uid": &*request.uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "name": &*request.name,
                "namespace": request.namespace.as_deref(),
                "operation": "CREATE",
                "userInfo": {
                    "username": request.user_info.username.as_deref(),
                    "groups": request.user_info.groups,
                },
                "object": patched,
                "dryRun": request.dry_run,
            },
        });
        let again = serde_json::to_vec(&again).expect("a review serialises");
        let (status, bytes, _) = self.post(scenario, "/mutate", &again);
        let (_, answer) = answered::<PodObject>(&again, status, &bytes).expect("the reinvocation is a review");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(
            answer["response"]["patch"].is_null(),
            "a second patch on reinvocation: {answer}"
        );
        outcome
    }
}

impl Outcome {
    fn new(status: StatusCode, reads: &[Read]) -> Self {
        Self {
            status: status.as_u16(),
            reads: reads.len(),
            namespace_terminating: reads
                .iter()
                .any(|read| matches!(read, Read::Namespace { terminating: true, .. })),
            ..Self::default()
        }
    }
}

/// The HTTP contract of both endpoints: never a 5xx; a body that decodes as a review
/// gets a 200 with an AdmissionReview that echoes its uid; any other body gets a 4xx
/// with an error message. Returns the decoded request and the answer of a 200.
fn answered<'a, O: Deserialize<'a>>(
    body: &'a [u8],
    status: StatusCode,
    bytes: &[u8],
) -> Option<(ReviewRequest<'a, O>, Value)> {
    let shown = || String::from_utf8_lossy(&body[..body.len().min(2000)]).into_owned();
    assert!(!status.is_server_error(), "{status} for {}", shown());
    let answer: Value = serde_json::from_slice(bytes).expect("every answer is JSON");
    match review::decode::<O>(body) {
        Ok(request) => {
            assert_eq!(status, StatusCode::OK, "a review got {status}: {answer}\n{}", shown());
            assert_eq!(answer["apiVersion"], API_VERSION, "{answer}");
            assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
            assert_eq!(answer["response"]["uid"], &*request.uid, "uid not echoed: {answer}");
            Some((request, answer))
        }
        Err(error) => {
            assert!(
                status.is_client_error(),
                "{status} for a non-review ({error}): {}",
                shown()
            );
            let message = answer["error"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "a {status} without a message: {answer}");
            None
        }
    }
}

/// The patch applies to the pod as the apiserver sent it, only adds labels and
/// annotations, changes no existing label, and yields a pod. Returns the patched pod.
fn check_patch(pod: &Value, patch: &Patch) -> Value {
    assert!(!patch.0.is_empty(), "an empty patch was sent");
    for operation in &patch.0 {
        let PatchOperation::Add(add) = operation else {
            panic!("the mutation only adds: {operation:?}");
        };
        let path = add.path.as_str();
        assert!(
            path.starts_with("/metadata/labels") || path.starts_with("/metadata/annotations"),
            "the mutation only touches labels and annotations: {path}"
        );
    }
    let mut document = pod.clone();
    if let Err(error) = json_patch::patch(&mut document, patch) {
        panic!("the patch does not apply ({error}): {patch:?}\n{document}");
    }
    PodObject::deserialize(&document).expect("the patched pod is a pod");
    let map = |pod: &Value, field: &str| pod["metadata"][field].as_object().cloned().unwrap_or_default();
    let after = map(&document, "labels");
    for (key, value) in &map(pod, "labels") {
        assert_eq!(after.get(key), Some(value), "label {key} changed");
    }
    let after = map(&document, "annotations");
    for (key, value) in map(pod, "annotations")
        .iter()
        .filter(|(key, _)| *key != PROTECTED_SECRETS_ANNOTATION)
    {
        assert_eq!(after.get(key), Some(value), "annotation {key} changed");
    }
    document
}

// === Decoding ===

/// `review::decode` for both endpoints' types on any body: a review's uid is the
/// body's; a review can always be answered; anything else is a 4xx; and whether a JSON
/// body is a review does not depend on the endpoint.
///
/// "JSON" is what serde_json reads as a `Value`. Beyond it (numbers past f64, nesting
/// past 128), serde_json fails only where it buffers a field instead of skipping it, and
/// the endpoints' types skip different fields: such a body may be a review for one.
pub fn decode(body: &[u8]) {
    let secret = review::decode::<SecretObject>(body);
    let pod = review::decode::<PodObject>(body);
    let json = serde_json::from_slice::<Value>(body).ok();
    match (&secret, &pod, &json) {
        (Ok(secret), Ok(pod), _) => {
            assert_eq!(secret.uid, pod.uid);
            assert_eq!(secret.operation, pod.operation);
            assert_eq!(secret.name, pod.name);
            assert_eq!(secret.namespace, pod.namespace);
        }
        (Err(_), Err(_), _) | (_, _, None) => {}
        (secret, pod, Some(_)) => panic!(
            "a JSON review for one endpoint only: secret {:?}, pod {:?}",
            secret.as_ref().err(),
            pod.as_ref().err()
        ),
    }
    if let (Ok(request), Some(value)) = (&secret, &json) {
        assert_eq!(value["apiVersion"], API_VERSION);
        assert_eq!(value["kind"], "AdmissionReview");
        assert_eq!(value["request"]["uid"], &*request.uid, "the uid is the body's");
    }
    answerable(secret);
    answerable(pod);
}

/// A review can be answered, with its uid; anything else is a 4xx.
fn answerable<O>(decoded: std::result::Result<ReviewRequest<'_, O>, review::ApiError>) {
    match decoded {
        Ok(request) => {
            let encoded = review::encode(&Answer::allow(&request.uid)).expect("a response encodes");
            let review: serde_json::Value = serde_json::from_slice(&encoded).expect("the answer is JSON");
            assert_eq!(review["response"]["uid"], &*request.uid);
        }
        Err(error) => {
            let status = error.into_response().status();
            assert!(status.is_client_error(), "{status} for a body that is not a review");
        }
    }
}
