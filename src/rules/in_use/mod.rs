//! In-use protection: the DELETE rules for a Secret or ConfigMap that was opted in. First
//! match wins:
//!
//! 1. `kube-root-ca.crt` (every pod projects it, and its controller replaces it) → allow;
//! 2. the requester is exempt (the namespace controller by default) → allow;
//! 3. the object carries the [`FORCE_ANNOTATION`] → allow, audited as forced;
//! 4. in [`Mode::Defer`], the object carries the guard's [`FINALIZER`] → allow: the object
//!    stays, terminating, until no pod uses it ([`finalizer`] removes the finalizer then);
//!    no read is made, the pods the watch shows are named;
//! 5. a pod of its namespace uses it and stays → deny, naming the pods;
//! 6. a read failed or ran past its deadline → deny (fail closed);
//! 7. otherwise → allow.
//!
//! Before a denial stands, a namespace a quorum read shows terminating turns it into an
//! allow: the namespace takes its pods with it.
//!
//! In [`Mode::Defer`], rules 5 and 6 are the safety net for a used object the finalizer does
//! not hold yet: the guard adds it to every object a pod uses within moments, and a
//! delete of the version that carries it is the only one deferred. The finalizer is
//! removed once a quorum read made after the delete shows no pod that is not terminal
//! needing the object, not even one on its way out ([`may_release`]): the same reads as
//! rules 5 to 7, without their judgement of which pods are leaving.
//!
//! A pod **uses** the object while its spec names it without `optional: true`
//! ([`crate::cluster::references::needs`]) and it is not terminal (Succeeded, Failed). A pod not yet
//! scheduled uses it: it needs it to start. A pod created while the object is being
//! deleted uses it too: nothing refuses such a pod, and it would not start without it. A
//! pod **stays** unless it is being deleted
//! or the garbage collector will delete it, which is judged as the garbage collector
//! judges it: every one of the pod's owners is gone (read by UID, then the pod read again
//! still naming it), or waits for its dependents' deletion (`foregroundDeletion`), or
//! will itself be gone soon: deleted with no finalizer holding it, or leaving the same
//! way. An owner held by another finalizer (`orphan`, or anyone's) keeps its pods: it may
//! hold them for good. Only the built-in workload kinds are followed
//! ([`WORKLOAD_KINDS`]); any other owner keeps its pod. That is how `helm uninstall`
//! completes: it deletes a Deployment, then the ConfigMap its pods use; the Deployment is
//! gone, so its ReplicaSet and their pods are on their way out.
//!
//! What a user may write only narrows a denial: a pod's own ownerReferences can make the
//! pod leave (the garbage collector then deletes it), never make another pod leave.
//! Absence is proved only by reads made after the request arrived: the pods that use the
//! object ([`InUseLookup::users`]), and GETs (served by etcd) along the owner chains. The
//! server reads the users from its pod watch's index ([`UserIndex`]) once the watch has
//! caught up with a revision read by quorum after the request, else by a quorum LIST of
//! the namespace's pods. Pods the index shows ([`InUseLookup::cached_users`]) may deny
//! without either, never allow.

use std::{collections::BTreeMap, fmt};

use async_trait::async_trait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::{cluster::references::Kind, observe::metrics::IN_USE_RULES};

pub mod finalizer;
mod index;
mod object;
mod reads;
mod staying;

pub use index::UserIndex;
pub use object::InUseObject;
pub use reads::KubeInUse;
use staying::{NAMED_PODS, Staying, staying_users};

/// The label that opts a namespace (all its Secrets and ConfigMaps) or one object in.
pub const OPT_IN_LABEL: &str = "cds-secret-guard/in-use-protection";
/// The opt-in label's value that asks for the guard's default [`Mode`]; `defer` and
/// `refuse` ask for that mode.
pub const OPT_IN_VALUE: &str = "enabled";
/// Every value of the opt-in label that opts in.
pub const OPT_IN_VALUES: [&str; 3] = [OPT_IN_VALUE, "defer", "refuse"];
/// The finalizer that holds an object deleted in [`Mode::Defer`] while pods use it.
pub const FINALIZER: &str = "cds-secret-guard.io/in-use";
/// The annotation that lets the next delete through whatever uses the object; its value
/// says why, and is audited.
pub const FORCE_ANNOTATION: &str = "cds-secret-guard/force-delete";
/// The ConfigMap every pod projects; kube-controller-manager replaces it.
pub const ROOT_CA: &str = "kube-root-ca.crt";
/// The owner kinds the garbage collector's cascades are followed through, by
/// `apiVersion` and `kind`.
pub const WORKLOAD_KINDS: [(&str, &str); 7] = [
    ("apps/v1", "ReplicaSet"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
    ("v1", "ReplicationController"),
];
/// What the delete of an opted-in object that pods use gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// Accepted: the object stays, held by the [`FINALIZER`], and goes once no pod uses it.
    Defer,
    /// Refused, naming the pods.
    Refuse,
}

/// A DELETE of an opted-in Secret or ConfigMap, as the rules see it.
#[derive(Debug, Clone, Copy)]
pub struct ObjectDelete<'a> {
    /// Secret or ConfigMap.
    pub kind: Kind,
    /// Namespace of the object.
    pub namespace: &'a str,
    /// Name of the object.
    pub name: &'a str,
    /// The object's metadata from `oldObject`.
    pub object: Option<&'a ObjectMeta>,
    /// Whether the requester is exempt.
    pub exempt: bool,
    /// What a delete of the object in use gets.
    pub mode: Mode,
}

/// A pod, or an owner up its chain, as the rules read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dependent {
    /// `apiVersion`, to read it again.
    pub api_version: String,
    /// `kind`, to read it again.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// It has a deletion timestamp.
    pub deleting: bool,
    /// Its finalizers (`orphan`: its dependents survive it; `foregroundDeletion`: the
    /// garbage collector is deleting them).
    pub finalizers: Vec<String>,
    /// A pod in phase Succeeded or Failed.
    pub terminal: bool,
    /// Its ownerReferences.
    pub owners: Vec<OwnerReference>,
    /// When it was created.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

/// The reads behind the rules, behind a narrow trait so that they can be tested with an
/// in-memory fake and model-checked.
#[async_trait]
pub trait InUseLookup: Send + Sync {
    /// The pods of `namespace` whose spec needs the `kind` named `name`, as a quorum read
    /// made after the request shows them.
    async fn users(&self, namespace: &str, kind: Kind, name: &str) -> crate::Result<Vec<Dependent>>;

    /// The object of this `apiVersion`, `kind` and name (a pod, or a [`WORKLOAD_KINDS`]
    /// owner), by quorum read; `None` when absent.
    async fn object(
        &self,
        namespace: &str,
        api_version: &str,
        kind: &str,
        name: &str,
    ) -> crate::Result<Option<Dependent>>;

    /// Whether the namespace is being deleted, by quorum read.
    async fn namespace_terminating(&self, namespace: &str) -> crate::Result<bool>;

    /// The pods a watch shows needing the object: a hint that may justify a denial,
    /// never an allow.
    fn cached_users(&self, _namespace: &str, _kind: Kind, _name: &str) -> Vec<Dependent> {
        Vec::new()
    }

    /// The namespace's labels as a watch shows them, which say whether it is opted in and
    /// in which [`Mode`]; `None` when unknown.
    fn namespace_labels(&self, _namespace: &str) -> Option<BTreeMap<String, String>> {
        None
    }
}

reasons! {
    /// Which rule decided, as a stable code for logs, metrics and audit annotations.
    pub enum Reason {
        /// Rule 1: an object never protected.
        NotProtected => "not-protected",
        /// Rule 2: the requester is exempt.
        Exempt => "exempt",
        /// Rule 3: forced by the annotation.
        Forced => "forced",
        /// Rule 4: held by the finalizer until no pod uses it.
        Deferred => "deferred",
        /// Rule 5: pods use it.
        InUse => "in-use",
        /// Rule 6: the pods could not be verified.
        LookupFailed => "lookup-failed",
        /// Rule 7: no pod uses it.
        Unused => "unused",
        /// A denial overridden: the namespace is being deleted.
        NamespaceTerminating => "namespace-terminating",
    }
}

/// The outcome of the rules for one delete.
pub type Verdict = crate::rules::Verdict<Reason, Found>;

/// What the rules found, for the audit line and the annotations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    /// The pods found to keep the object (the first few by name), when some do.
    pub pods: Vec<String>,
}

/// Applies the rules to one delete. Every read goes through `lookup`; its deadline, if
/// any, is the lookup's business.
pub async fn decide(request: &ObjectDelete<'_>, lookup: &dyn InUseLookup) -> Verdict {
    let what = Subject(request.kind, request.name);
    // Rule 1.
    if request.kind == Kind::ConfigMap && request.name == ROOT_CA {
        return Verdict::allow(Reason::NotProtected, format!("{what} is never protected"));
    }
    // Rule 2.
    if request.exempt {
        return Verdict::allow(Reason::Exempt, "the requester is exempt".to_owned());
    }
    // Rule 3.
    if let Some(forced) = forced(request) {
        return forced;
    }
    // Rule 4.
    if request.mode == Mode::Defer && request.object.is_some_and(is_held) {
        return deferred(request, lookup);
    }

    let verdict = match staying_users(request, lookup).await {
        Ok(staying) if staying.names.is_empty() => Verdict::allow(Reason::Unused, format!("no pod uses {what}")),
        Ok(staying) => in_use(request, staying),
        Err(error) => Verdict::deny(
            Reason::LookupFailed,
            format!("cannot verify that no pod uses {what} ({error}); refusing to delete it"),
        ),
    };
    unless_the_namespace_goes(request.namespace, verdict, lookup).await
}

/// Whether an object held for a deferred delete may go, its finalizer removed: it is
/// forced, or no pod that is not terminal needs it any more, as a quorum read made now
/// shows, or its namespace is being deleted. Stricter than rules 5 to 7: a pod on its way
/// out still counts until it is gone (its containers still run, and a kubelet restarted
/// meanwhile mounts its volumes again), so no owner is read. Waiting costs nothing once
/// the delete has been accepted.
pub async fn may_release(object: &ObjectDelete<'_>, lookup: &dyn InUseLookup) -> Verdict {
    let what = Subject(object.kind, object.name);
    if let Some(forced) = forced(object) {
        return forced;
    }
    let verdict = match remaining_users(object, lookup).await {
        Ok(pods) if pods.is_empty() => Verdict::allow(Reason::Unused, format!("no pod uses {what} any more")),
        Ok(mut pods) => {
            let more = pods.len().saturating_sub(NAMED_PODS);
            pods.truncate(NAMED_PODS);
            let message = format!(
                "{what} waits for pod {}{} in namespace {}",
                pods.join(", "),
                more_pods(more),
                object.namespace
            );
            Verdict::deny(Reason::InUse, message).naming(pods)
        }
        Err(error) => Verdict::deny(
            Reason::LookupFailed,
            format!("cannot verify that no pod uses {what} ({error})"),
        ),
    };
    unless_the_namespace_goes(object.namespace, verdict, lookup).await
}

/// Rule 3: the force annotation, with a reason.
fn forced(request: &ObjectDelete<'_>) -> Option<Verdict> {
    let why = request
        .object
        .and_then(|object| object.annotations.as_ref()?.get(FORCE_ANNOTATION))
        .filter(|why| !why.trim().is_empty())?;
    let what = Subject(request.kind, request.name);
    Some(Verdict::allow(
        Reason::Forced,
        format!("{what} deleted by force ({FORCE_ANNOTATION}: {why})"),
    ))
}

/// A denial turned into an allow when a quorum read shows the namespace being deleted.
async fn unless_the_namespace_goes(namespace: &str, verdict: Verdict, lookup: &dyn InUseLookup) -> Verdict {
    if verdict.allowed {
        return verdict;
    }
    match lookup.namespace_terminating(namespace).await {
        Ok(true) => Verdict::allow(
            Reason::NamespaceTerminating,
            format!("namespace {namespace} is being deleted"),
        ),
        Ok(false) | Err(_) => verdict,
    }
}

/// The names of the pods that are not terminal and need the object: those the watch
/// shows if any (no read), else those of one quorum read.
async fn remaining_users(request: &ObjectDelete<'_>, lookup: &dyn InUseLookup) -> crate::Result<Vec<String>> {
    let (kind, namespace, name) = (request.kind, request.namespace, request.name);
    let cached = not_terminal(lookup.cached_users(namespace, kind, name));
    if !cached.is_empty() {
        return Ok(cached);
    }
    Ok(not_terminal(lookup.users(namespace, kind, name).await?))
}

/// The names of the `pods` that are not terminal, sorted, each once.
fn not_terminal(pods: Vec<Dependent>) -> Vec<String> {
    let mut names: Vec<String> = pods
        .into_iter()
        .filter(|pod| !pod.terminal)
        .map(|pod| pod.name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Whether the object carries the [`FINALIZER`].
pub fn is_held(object: &ObjectMeta) -> bool {
    object
        .finalizers
        .as_ref()
        .is_some_and(|finalizers| finalizers.iter().any(|finalizer| finalizer == FINALIZER))
}

/// The mode an object is opted in with: its own label's, else its namespace's; `None`
/// when neither opts it in. `default` is the mode `enabled` asks for.
pub fn opted_in(
    object: Option<&BTreeMap<String, String>>,
    namespace: Option<&BTreeMap<String, String>>,
    default: Mode,
) -> Option<Mode> {
    let mode = |labels: Option<&BTreeMap<String, String>>| {
        labels
            .and_then(|labels| labels.get(OPT_IN_LABEL))
            .and_then(|value| Mode::from_label(value, default))
    };
    mode(object).or_else(|| mode(namespace))
}

/// Rule 4: the delete goes through and the finalizer holds the object. The pods the
/// watch shows are named, unread: the proof waits for the finalizer's removal.
fn deferred(request: &ObjectDelete<'_>, lookup: &dyn InUseLookup) -> Verdict {
    let what = Subject(request.kind, request.name);
    let mut pods = not_terminal(lookup.cached_users(request.namespace, request.kind, request.name));
    let more = pods.len().saturating_sub(NAMED_PODS);
    pods.truncate(NAMED_PODS);
    let message = if pods.is_empty() {
        format!(
            "{what} will be deleted once no pod of namespace {} uses it",
            request.namespace
        )
    } else {
        format!(
            "{what} is in use by pod {}{} in namespace {}; it will be deleted once they are gone",
            pods.join(", "),
            more_pods(more),
            request.namespace
        )
    };
    Verdict::allow(Reason::Deferred, message).naming(pods)
}

fn in_use(request: &ObjectDelete<'_>, staying: Staying) -> Verdict {
    let what = Subject(request.kind, request.name);
    let named = staying.names.join(", ");
    let more = more_pods(staying.more);
    // In defer, only an object the finalizer does not hold yet is refused: the guard
    // holds every used object within moments of its first pod.
    let retry = match request.mode {
        Mode::Defer => "it is not yet held for a deferred delete: try again in a few seconds, ",
        Mode::Refuse => "",
    };
    let message = format!(
        "{what} is in use by pod {named}{more} in namespace {}; {retry}delete or scale down what uses it \
         first, or annotate it {FORCE_ANNOTATION}=<why> to force the delete",
        request.namespace
    );
    Verdict::deny(Reason::InUse, message).naming(staying.names)
}

/// " (and N more pods name it)", or nothing.
fn more_pods(more: usize) -> String {
    match more {
        0 => String::new(),
        1 => " (and 1 more pod names it)".to_owned(),
        more => format!(" (and {more} more pods name it)"),
    }
}

/// "secret NAME" or "configmap NAME", as messages name the object.
struct Subject<'a>(Kind, &'a str);

impl fmt::Display for Subject<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
        };
        write!(f, "{kind} {}", self.1)
    }
}

// === impl Dependent ===

impl Dependent {
    /// An object as the rules read it, from its metadata.
    pub(crate) fn from_metadata(api_version: &str, kind: &str, metadata: &ObjectMeta) -> Self {
        Self {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            name: metadata.name.clone().unwrap_or_default(),
            uid: metadata.uid.clone().unwrap_or_default(),
            deleting: metadata.deletion_timestamp.is_some(),
            finalizers: metadata.finalizers.clone().unwrap_or_default(),
            terminal: false,
            owners: metadata.owner_references.clone().unwrap_or_default(),
            created: metadata.creation_timestamp.as_ref().map(|time| time.0),
        }
    }
}

// === impl Reason ===

impl Reason {
    /// Whether a verdict for this reason refuses the delete.
    pub fn denies(self) -> bool {
        matches!(self, Self::InUse | Self::LookupFailed)
    }
}

// === impl Mode ===

impl Mode {
    /// The mode a value of the opt-in label asks for (`enabled`: `default`); `None` for a
    /// value that does not opt in.
    pub fn from_label(value: &str, default: Self) -> Option<Self> {
        match value {
            OPT_IN_VALUE => Some(default),
            "defer" => Some(Self::Defer),
            "refuse" => Some(Self::Refuse),
            _ => None,
        }
    }

    /// The mode's name, as the label and the flag write it.
    pub fn code(self) -> &'static str {
        match self {
            Self::Defer => "defer",
            Self::Refuse => "refuse",
        }
    }
}

// === impl Verdict ===

impl Verdict {
    pub(crate) fn allow(reason: Reason, message: String) -> Self {
        Self::new(true, reason, message)
    }

    pub(crate) fn deny(reason: Reason, message: String) -> Self {
        Self::new(false, reason, message)
    }

    fn new(allowed: bool, reason: Reason, message: String) -> Self {
        let found = Found::default();
        Self {
            allowed,
            reason,
            message,
            found,
        }
    }

    /// The same decision, naming the pods that keep the object.
    fn naming(mut self, pods: Vec<String>) -> Self {
        self.found.pods = pods;
        self
    }
}

impl crate::rules::Decision for Verdict {
    const RULES: &'static str = IN_USE_RULES;
    const REQUEST: &'static str = "in-use delete";

    fn outcome(&self) -> crate::rules::Outcome<'_> {
        crate::rules::Outcome {
            allowed: self.allowed,
            reason: self.reason.code(),
            message: &self.message,
        }
    }

    fn deferred(&self) -> bool {
        self.reason == Reason::Deferred
    }

    /// A forced or deferred delete goes through, and the apiserver's audit log says so.
    fn annotated(&self) -> bool {
        !self.allowed || matches!(self.reason, Reason::Forced | Reason::Deferred)
    }

    fn audit_fields<'a>(&'a self, kind: &'static str, name: &'a str) -> crate::rules::AuditFields<'a> {
        crate::rules::AuditFields {
            rules: Some(IN_USE_RULES),
            kind: Some(kind),
            object: Some(name),
            pods: Some(self.found.pods.join(",")),
            ..crate::rules::AuditFields::default()
        }
    }

    fn annotate(&self, annotations: &mut Vec<(&'static str, String)>) {
        if !self.found.pods.is_empty() {
            annotations.push(("pods", self.found.pods.join(",")));
        }
    }
}

#[cfg(test)]
mod tests;
