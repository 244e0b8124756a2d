//! The secret-DELETE rules. First match wins:
//!
//! 1. not a protected secret → allow (no lookup);
//! 2. the requester is exempt → allow;
//! 3. the secret's Pod owners are all gone by quorum read → rule 4 is waived (the garbage
//!    collector's path; a live pod of the worker still denies, rule 5);
//! 4. the secret is younger than the grace period → deny;
//! 5. a quorum read finds a live pod of the worker → deny;
//! 6. a lookup failed or ran past its deadline → deny (fail closed);
//! 7. otherwise → allow (a true orphan, or an owner-gone secret).
//!
//! Before a denial stands, a namespace that a quorum read shows terminating turns it into
//! an allow: the namespace takes its pods and secrets with it. Deletes in namespaces the
//! guard does not watch (`--namespace`) are allowed.
//!
//! The rules only read the cluster through [`ClusterLookup`] and never look at a clock
//! other than `now`, so they run unchanged in handler tests (an in-memory fake), in the
//! model checker (a model store) and in the server (quorum reads with a deadline).

pub mod mutation;
pub mod owners;
pub mod pod;
pub mod reads;
mod secret;
pub mod watch;

pub use secret::SecretObject;

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};

use self::{pod::PodState, reads::ClusterLookup};
use crate::{observe::metrics::WORKER_RULES, rules};

/// The worker-secret rules' own settings; what they share with in-use protection is in
/// [`crate::rules::Settings`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// A worker secret younger than this is never deleted.
    pub grace_period: Duration,
    /// Name prefixes of protected secrets.
    pub secret_prefixes: Vec<String>,
    /// Label naming the worker.
    pub worker_label: String,
    /// Label naming the hatchery.
    pub hatchery_label: String,
}

/// A DELETE of a secret, as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct SecretDelete<'a> {
    /// Namespace of the secret.
    pub namespace: &'a str,
    /// Name of the secret.
    pub name: &'a str,
    /// The secret's metadata from `oldObject`, when the apiserver sent it.
    pub secret: Option<&'a ObjectMeta>,
    /// The requesting user.
    pub username: Option<&'a str>,
    /// The requesting user's groups.
    pub groups: &'a [String],
}

reasons! {
    /// Which rule decided, as a stable code for logs, metrics and audit annotations.
    pub enum Reason {
        /// Rule 1: the secret is not protected.
        NotProtected => "not-protected",
        /// The secret no longer exists (no `oldObject` was sent and a read found nothing).
        NotFound => "not-found",
        /// The secret is in a namespace the guard does not watch.
        OutOfScope => "out-of-scope",
        /// Rule 2: the requester is exempt.
        Exempt => "exempt",
        /// Rules 3 and 7: the pods owning the secret are gone and no live pod of the worker exists.
        OwnerGone => "owner-gone",
        /// Rule 4: the secret is younger than the grace period.
        TooYoung => "too-young",
        /// Rule 5: a live pod of the worker exists.
        PodLive => "pod-live",
        /// Rule 6: the pods could not be verified.
        LookupFailed => "lookup-failed",
        /// Rule 7: no pod needs the secret.
        Orphan => "orphan",
        /// A denial overridden: the namespace is being deleted.
        NamespaceTerminating => "namespace-terminating",
    }
}

/// The outcome of the rules for one delete.
pub type Verdict = rules::Verdict<Reason, Found>;

/// What the rules found of a secret, for the audit line and the annotations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The worker the secret belongs to, when it is protected.
    pub worker: Option<String>,
    /// The pod that protects the secret, if one does.
    pub pod: Option<PodState>,
    /// The secret's age, when known.
    pub age: Option<Duration>,
}

/// Applies the rules to one secret delete. Every read goes through `lookup`; its
/// deadline, if any, is the lookup's business (see [`crate::rules::worker::reads::Deadline`]).
pub async fn decide(
    shared: &rules::Settings,
    config: &Settings,
    request: &SecretDelete<'_>,
    lookup: &dyn ClusterLookup,
    now: Timestamp,
) -> Verdict {
    let (namespace, name) = (request.namespace, request.name);
    if !shared.watches(namespace) {
        let worker = request.secret.and_then(|secret| config.worker_of_secret(secret));
        let message = format!("namespace {namespace} is not watched by this guard");
        return Verdict::allow(Reason::OutOfScope, worker, None, message);
    }

    // DELETE carries the secret in `oldObject`; should it be missing, read its metadata.
    let fetched;
    let secret = match request.secret {
        Some(secret) => secret,
        None => match lookup.secret_metadata(namespace, name).await {
            Ok(Some(meta)) => {
                fetched = meta;
                &fetched
            }
            Ok(None) => return Verdict::allow(Reason::NotFound, None, None, format!("secret {name} does not exist")),
            Err(error) => {
                let message = format!(
                    "cannot read secret {name} to tell whether a worker needs it ({error}); refusing to delete it"
                );
                return Verdict::deny(Reason::LookupFailed, config.worker_of_secret_name(name), None, message);
            }
        },
    };

    // Rule 1.
    let Some(worker) = config.worker_of_secret(secret) else {
        return Verdict::allow(
            Reason::NotProtected,
            None,
            None,
            format!("secret {name} is not a worker secret"),
        );
    };
    let age = secret_age(secret, now);

    // Rule 2.
    if shared.is_exempt(request.username, request.groups) {
        let user = request.username.unwrap_or("?");
        return Verdict::allow(Reason::Exempt, Some(worker), Some(age), format!("{user} is exempt"));
    }

    let owners: Vec<&OwnerReference> = pod_owners(secret).collect();
    let verdict = if owners.is_empty() && age < config.grace_period {
        // Rule 4 without a read: no owner can waive it.
        too_young(config, name, worker, age)
    } else {
        pod_rules(lookup, config, namespace, name, worker, age, &owners).await
    };
    if verdict.allowed {
        return verdict;
    }
    // A namespace being deleted takes its pods and secrets with it; only a quorum read
    // that shows it terminating overrides the denial.
    match lookup.namespace_terminating(namespace).await {
        Ok(true) => {
            let message = format!("namespace {namespace} is being deleted");
            Verdict::allow(
                Reason::NamespaceTerminating,
                verdict.found.worker,
                verdict.found.age,
                message,
            )
        }
        Ok(false) | Err(_) => verdict,
    }
}

/// Rules 3 to 7. A live pod the reconciler's watch shows denies without a read; else
/// the pods are read by name (the owners and the worker's namesake) and by label, all at
/// once: past the watch, the reads are mostly on the way to an allow, which needs them all.
/// The worker's namesake and the pods labelled for it are read together
/// ([`ClusterLookup::namesake_and_labelled`]): on the pod watch's path, one read proves both.
async fn pod_rules(
    lookup: &dyn ClusterLookup,
    config: &Settings,
    namespace: &str,
    name: &str,
    worker: String,
    age: Duration,
    owners: &[&OwnerReference],
) -> Verdict {
    if let Some(verdict) = cached_denial(lookup, config, namespace, name, &worker, age, owners) {
        return verdict;
    }

    let mut names: Vec<&str> = owners
        .iter()
        .map(|owner| owner.name.as_str())
        .filter(|owner| *owner != worker)
        .collect();
    names.sort_unstable();
    names.dedup();
    let (mut named, (namesake, labelled)) = futures::join!(
        read_named(lookup, namespace, &names),
        read_worker(lookup, config, namespace, &worker)
    );
    named.push((worker.clone(), namesake));
    let read = |pod: &str| named.iter().find(|(n, _)| n == pod).map(|(_, read)| read);

    // Rule 3: every owner is gone, or replaced by a new pod under its name.
    let owner_gone = !owners.is_empty()
        && owners.iter().all(
            |owner| matches!(read(&owner.name), Some(Ok(pod)) if pod.as_ref().is_none_or(|pod| pod.uid != owner.uid)),
        );

    // Rule 4.
    if !owner_gone && age < config.grace_period {
        return too_young(config, name, worker, age);
    }

    // Rule 5, by name: a live owner, or the worker's live namesake.
    let live_owner = owners.iter().find_map(|owner| match read(&owner.name) {
        Some(Ok(Some(pod))) if pod.uid == owner.uid && pod.is_live() => Some(pod),
        _ => None,
    });
    let live_namesake = match read(&worker) {
        Some(Ok(Some(pod))) if pod.is_live() => Some(pod),
        _ => None,
    };
    if let Some(pod) = live_owner.or(live_namesake) {
        return pod_live(name, worker, age, pod);
    }

    // Rule 6, for the reads by name.
    if let Some(error) = named.iter().find_map(|(_, read)| read.as_ref().err()) {
        return lookup_failed(name, worker, age, error);
    }

    // Rule 5, by label; rule 6 for it.
    match labelled {
        Ok(pods) => {
            if let Some(pod) = pods.iter().find(|pod| pod.is_live()) {
                return pod_live(name, worker, age, pod);
            }
        }
        Err(error) => return lookup_failed(name, worker, age, &error),
    }

    // Rule 7.
    if owner_gone {
        let message = format!("the pod owning secret {name} is gone and no pod of worker {worker} is live");
        return Verdict::allow(Reason::OwnerGone, Some(worker), Some(age), message);
    }
    let message = format!("no pod of worker {worker} exists");
    Verdict::allow(Reason::Orphan, Some(worker), Some(age), message)
}

/// Rules 4 and 5 from the reconciler's watch, without a read: a live pod it shows as an
/// owner (same UID) or as the namesake of an unowned secret denies at once. The safe side
/// only: a stale cache keeps a secret a little longer, never loses one, and a pod the cache
/// lacks proves nothing. A namesake beside other owners falls through to the reads, which
/// alone can tell whether those owners are gone (rule 3).
fn cached_denial(
    lookup: &dyn ClusterLookup,
    config: &Settings,
    namespace: &str,
    name: &str,
    worker: &str,
    age: Duration,
    owners: &[&OwnerReference],
) -> Option<Verdict> {
    let live = |pod: &str| lookup.cached_pod(namespace, pod).filter(PodState::is_live);
    let pod = owners
        .iter()
        .find_map(|owner| live(&owner.name).filter(|pod| pod.uid == owner.uid))
        .or_else(|| live(worker).filter(|_| owners.is_empty()))?;
    let worker = worker.to_owned();
    Some(if age < config.grace_period {
        too_young(config, name, worker, age)
    } else {
        pod_live(name, worker, age, &pod)
    })
}

/// The pods of these names, by quorum read, all at once. A name no pod can have is
/// absent without a read.
async fn read_named(
    lookup: &dyn ClusterLookup,
    namespace: &str,
    names: &[&str],
) -> Vec<(String, crate::Result<Option<PodState>>)> {
    join_all(names.iter().map(|&name| async move {
        let pod = if is_object_name(name) {
            lookup.pod(namespace, name).await
        } else {
            Ok(None)
        };
        (name.to_owned(), pod)
    }))
    .await
}

/// The pod named after the worker and the pods carrying its label, by quorum reads. A
/// name no pod can have is absent, and a value that cannot be a label value is on no pod,
/// without a read (asking would get a 400).
async fn read_worker(
    lookup: &dyn ClusterLookup,
    config: &Settings,
    namespace: &str,
    worker: &str,
) -> (crate::Result<Option<PodState>>, crate::Result<Vec<PodState>>) {
    let label = config.worker_label.as_str();
    match (is_object_name(worker), is_label_value(worker)) {
        (true, true) => lookup.namesake_and_labelled(namespace, label, worker).await,
        (true, false) => (lookup.pod(namespace, worker).await, Ok(Vec::new())),
        (false, true) => (Ok(None), lookup.pods_labelled(namespace, label, worker).await),
        (false, false) => (Ok(None), Ok(Vec::new())),
    }
}

fn pod_live(name: &str, worker: String, age: Duration, pod: &PodState) -> Verdict {
    let phase = pod.phase.as_deref().unwrap_or("Pending");
    let message = format!(
        "pod {} (uid {}, {phase}) still uses secret {name}; delete the pod and the secret goes with it",
        pod.name, pod.uid
    );
    let mut verdict = Verdict::deny(Reason::PodLive, Some(worker), Some(age), message);
    verdict.found.pod = Some(pod.clone());
    verdict
}

fn lookup_failed(name: &str, worker: String, age: Duration, error: &crate::Error) -> Verdict {
    let message =
        format!("cannot verify that no pod of worker {worker} uses secret {name} ({error}); refusing to delete it");
    Verdict::deny(Reason::LookupFailed, Some(worker), Some(age), message)
}

/// The pods of a worker as rule 5 reads them, by quorum read: the pod named after it and
/// the pods labelled with it.
#[derive(Debug, Default)]
pub struct WorkerPods {
    /// The pod named after the worker.
    pub namesake: Option<PodState>,
    /// The pods carrying the worker label.
    pub labelled: Vec<PodState>,
}

impl WorkerPods {
    /// Reads them, both at once.
    pub async fn read(
        lookup: &dyn ClusterLookup,
        config: &Settings,
        namespace: &str,
        worker: &str,
    ) -> crate::Result<Self> {
        let (namesake, labelled) = read_worker(lookup, config, namespace, worker).await;
        Ok(Self {
            namesake: namesake?,
            labelled: labelled?,
        })
    }

    /// The live pod of the worker that rule 5 would name, if any.
    pub fn live(&self) -> Option<&PodState> {
        live_worker_pod(self.namesake.as_ref(), &self.labelled)
    }
}

/// A live pod among the worker's: its namesake first, then a labelled one.
fn live_worker_pod<'a>(namesake: Option<&'a PodState>, labelled: &'a [PodState]) -> Option<&'a PodState> {
    namesake
        .filter(|pod| pod.is_live())
        .or_else(|| labelled.iter().find(|pod| pod.is_live()))
}

fn too_young(config: &Settings, name: &str, worker: String, age: Duration) -> Verdict {
    let message = format!(
        "secret {name} is {} old; it cannot be deleted within {} of creation",
        human(age),
        human(config.grace_period)
    );
    Verdict::deny(Reason::TooYoung, Some(worker), Some(age), message)
}

/// The secret's ownerReferences to Pods.
pub fn pod_owners(secret: &ObjectMeta) -> impl Iterator<Item = &OwnerReference> {
    secret
        .owner_references
        .iter()
        .flatten()
        .filter(|owner| owner.kind == "Pod" && owner.api_version == "v1")
}

/// Age of a secret; a missing or future creation time counts as brand new (the safe side).
pub fn secret_age(secret: &ObjectMeta, now: Timestamp) -> Duration {
    secret
        .creation_timestamp
        .as_ref()
        .and_then(|created| Duration::try_from(now.duration_since(created.0)).ok())
        .unwrap_or_default()
}

fn human(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(duration.as_secs()))
}

/// Whether a string is a valid label value (at most 63 characters, alphanumerics with
/// `-`, `_` and `.` inside).
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    bytes.len() <= 63
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.iter().all(inner)
}

/// Whether a string is a valid object name (a DNS subdomain, as pod names are).
pub fn is_object_name(name: &str) -> bool {
    let label = |part: &str| {
        let bytes = part.as_bytes();
        let inner = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
        let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        edge(bytes.first()) && edge(bytes.last()) && bytes.iter().all(inner)
    };
    name.len() <= 253 && name.split('.').all(label)
}

// === impl Settings ===

impl Settings {
    /// The worker a secret belongs to, if it is protected: the worker label's value,
    /// else the name after a protected prefix.
    pub fn worker_of_secret(&self, meta: &ObjectMeta) -> Option<String> {
        let labelled = meta.labels.as_ref().and_then(|labels| labels.get(&self.worker_label));
        match labelled {
            Some(worker) if !worker.is_empty() => Some(worker.clone()),
            _ => self.worker_of_secret_name(meta.name.as_deref()?),
        }
    }

    /// The worker named by a protected secret name (`cds-worker-config-<worker>`).
    pub fn worker_of_secret_name(&self, name: &str) -> Option<String> {
        self.secret_prefixes
            .iter()
            .filter_map(|prefix| name.strip_prefix(prefix.as_str()))
            .find(|worker| !worker.is_empty())
            .map(str::to_owned)
    }
}

// === impl Reason ===

impl Reason {
    /// Whether a verdict for this reason refuses the delete (in warn mode: would).
    pub fn denies(self) -> bool {
        matches!(self, Self::TooYoung | Self::PodLive | Self::LookupFailed)
    }
}

// === impl Verdict ===

impl Verdict {
    /// An allow by `reason`.
    pub fn allow(reason: Reason, worker: Option<String>, age: Option<Duration>, message: String) -> Self {
        debug_assert!(!reason.denies(), "{reason} is a reason to deny");
        Self::new(true, reason, worker, age, message)
    }

    /// A denial by `reason`.
    pub fn deny(reason: Reason, worker: Option<String>, age: Option<Duration>, message: String) -> Self {
        debug_assert!(reason.denies(), "{reason} is a reason to allow");
        Self::new(false, reason, worker, age, message)
    }

    fn new(allowed: bool, reason: Reason, worker: Option<String>, age: Option<Duration>, message: String) -> Self {
        let found = Found { worker, pod: None, age };
        Self {
            allowed,
            reason,
            message,
            found,
        }
    }

    /// Whether the secret is a worker secret (every decision on one is audited).
    pub fn is_protected(&self) -> bool {
        self.found.worker.is_some()
    }
}

impl rules::Decision for Verdict {
    const RULES: &'static str = WORKER_RULES;
    const REQUEST: &'static str = "secret delete";

    fn outcome(&self) -> rules::Outcome<'_> {
        rules::Outcome {
            allowed: self.allowed,
            reason: self.reason.code(),
            message: &self.message,
        }
    }

    fn audited(&self) -> bool {
        self.is_protected() || !self.allowed
    }

    fn audit_fields<'a>(&'a self, _kind: &'static str, name: &'a str) -> rules::AuditFields<'a> {
        rules::AuditFields {
            secret: Some(name),
            worker: self.found.worker.as_deref(),
            pod: self.found.pod.as_ref().map(|pod| (pod.name.as_str(), pod.uid.as_str())),
            secret_age_seconds: self.found.age.map(|age| age.as_secs()),
            ..rules::AuditFields::default()
        }
    }

    fn annotate(&self, annotations: &mut Vec<(&'static str, String)>) {
        if let Some(worker) = &self.found.worker {
            annotations.push(("worker", worker.clone()));
        }
        if let Some(pod) = &self.found.pod {
            annotations.push(("pod", format!("{} ({})", pod.name, pod.uid)));
        }
        if let Some(age) = self.found.age {
            annotations.push(("secret-age", format!("{}s", age.as_secs())));
        }
    }
}

#[cfg(test)]
mod tests;
