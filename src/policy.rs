//! The secret-DELETE rules. First match wins:
//!
//! 1. not a protected secret → allow (no lookup);
//! 2. the requester is exempt → allow;
//! 3. every Pod owner of the secret is gone by quorum read → allow (garbage collection);
//! 4. the secret is younger than the grace period → deny;
//! 5. a quorum read finds a live pod of the worker → deny;
//! 6. a lookup failed or ran past its deadline → deny (fail closed);
//! 7. otherwise → allow (a true orphan).
//!
//! The rules only read the cluster through [`ClusterLookup`], so they are tested with an
//! in-memory fake; this module knows nothing of HTTP.

use std::{fmt, time::Duration};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use tokio::time::Instant;

use crate::{
    Error,
    config::PolicyConfig,
    lookup::{ClusterLookup, PodState},
};

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

/// Which rule decided, as a stable code for logs, metrics and audit annotations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Rule 1: the secret is not protected.
    NotProtected,
    /// The secret no longer exists (no `oldObject` was sent and a read found nothing).
    NotFound,
    /// Rule 2: the requester is exempt.
    Exempt,
    /// Rule 3: the pod owning the secret is gone.
    OwnerGone,
    /// Rule 4: the secret is younger than the grace period.
    TooYoung,
    /// Rule 5: a live pod of the worker exists.
    PodLive,
    /// Rule 6: the pods could not be verified.
    LookupFailed,
    /// Rule 7: no pod needs the secret.
    Orphan,
}

/// The outcome of the rules for one delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Whether the delete may proceed.
    pub allowed: bool,
    /// The rule that decided.
    pub reason: Reason,
    /// What a `kubectl delete` user is told.
    pub message: String,
    /// The worker the secret belongs to, when it is protected.
    pub worker: Option<String>,
    /// The pod that protects the secret, if one does.
    pub pod: Option<PodState>,
    /// The secret's age, when known.
    pub age: Option<Duration>,
}

/// Applies the rules to one secret delete. Lookups share one deadline,
/// `config.lookup_timeout`, counted from the call.
pub async fn decide(
    config: &PolicyConfig,
    request: &SecretDelete<'_>,
    lookup: &dyn ClusterLookup,
    now: Timestamp,
) -> Verdict {
    let deadline = Instant::now() + config.lookup_timeout;
    let budget = config.lookup_timeout;
    let (namespace, name) = (request.namespace, request.name);

    // DELETE carries the secret in `oldObject`; should it be missing, read its metadata.
    let fetched;
    let secret = match request.secret {
        Some(secret) => secret,
        None => match within(deadline, budget, lookup.secret_metadata(namespace, name)).await {
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
    if config.is_exempt(request.username, request.groups) {
        let user = request.username.unwrap_or("?");
        return Verdict::allow(Reason::Exempt, Some(worker), Some(age), format!("{user} is exempt"));
    }

    // Rule 3: the owner pods, each by quorum read. A live owner is remembered for rule 5.
    let mut failure: Option<Error> = None;
    let mut live_owner = None;
    let owners: Vec<&OwnerReference> = pod_owners(secret).collect();
    if !owners.is_empty() {
        let mut all_gone = true;
        for owner in owners {
            match within(deadline, budget, lookup.pod(namespace, &owner.name)).await {
                Ok(Some(pod)) if pod.uid == owner.uid => {
                    all_gone = false;
                    if pod.is_live() {
                        live_owner.get_or_insert(pod);
                    }
                }
                // Gone, or a new pod under the same name: the owner itself is gone.
                Ok(_) => {}
                Err(error) => {
                    all_gone = false;
                    failure = Some(error);
                }
            }
        }
        if all_gone {
            let message = format!("the pod owning secret {name} is gone");
            return Verdict::allow(Reason::OwnerGone, Some(worker), Some(age), message);
        }
    }

    // Rule 4.
    if age < config.grace_period {
        let message = format!(
            "secret {name} is {} old; it cannot be deleted within {} of creation",
            human(age),
            human(config.grace_period)
        );
        return Verdict::deny(Reason::TooYoung, Some(worker), Some(age), message);
    }

    // Rule 5.
    let live = match live_owner {
        Some(pod) => Some(pod),
        None => match within(deadline, budget, worker_pods(lookup, config, namespace, &worker)).await {
            Ok(pods) => pods.into_iter().find(PodState::is_live),
            Err(error) => {
                failure = Some(error);
                None
            }
        },
    };
    if let Some(pod) = live {
        let phase = pod.phase.as_deref().unwrap_or("Pending");
        let message = format!(
            "pod {} (uid {}, {phase}) still uses secret {name}; delete the pod and the secret goes with it",
            pod.name, pod.uid
        );
        return Verdict {
            pod: Some(pod),
            ..Verdict::deny(Reason::PodLive, Some(worker), Some(age), message)
        };
    }

    // Rule 6.
    if let Some(error) = failure {
        let message =
            format!("cannot verify that no pod of worker {worker} uses secret {name} ({error}); refusing to delete it");
        return Verdict::deny(Reason::LookupFailed, Some(worker), Some(age), message);
    }

    // Rule 7.
    let message = format!("no pod of worker {worker} exists");
    Verdict::allow(Reason::Orphan, Some(worker), Some(age), message)
}

/// The pods of a worker: the pod named after it and the pods labelled with it.
async fn worker_pods(
    lookup: &dyn ClusterLookup,
    config: &PolicyConfig,
    namespace: &str,
    worker: &str,
) -> crate::Result<Vec<PodState>> {
    let (named, mut labelled) = futures::try_join!(
        lookup.pod(namespace, worker),
        lookup.pods_labelled(namespace, &config.worker_label, worker)
    )?;
    labelled.extend(named);
    Ok(labelled)
}

async fn within<T>(
    deadline: Instant,
    budget: Duration,
    future: impl Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    tokio::time::timeout_at(deadline, future)
        .await
        .unwrap_or(Err(Error::Timeout(budget)))
}

/// The secret's ownerReferences to Pods.
pub(crate) fn pod_owners(secret: &ObjectMeta) -> impl Iterator<Item = &OwnerReference> {
    secret
        .owner_references
        .iter()
        .flatten()
        .filter(|owner| owner.kind == "Pod" && owner.api_version == "v1")
}

/// Age of a secret; a missing or future creation time counts as brand new (the safe side).
pub(crate) fn secret_age(secret: &ObjectMeta, now: Timestamp) -> Duration {
    secret
        .creation_timestamp
        .as_ref()
        .and_then(|created| Duration::try_from(now.duration_since(created.0)).ok())
        .unwrap_or_default()
}

fn human(duration: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(duration.as_secs()))
}

// === impl Reason ===

impl Reason {
    /// The stable code of this reason.
    pub fn code(self) -> &'static str {
        match self {
            Self::NotProtected => "not-protected",
            Self::NotFound => "not-found",
            Self::Exempt => "exempt",
            Self::OwnerGone => "owner-gone",
            Self::TooYoung => "too-young",
            Self::PodLive => "pod-live",
            Self::LookupFailed => "lookup-failed",
            Self::Orphan => "orphan",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

// === impl Verdict ===

impl Verdict {
    fn allow(reason: Reason, worker: Option<String>, age: Option<Duration>, message: String) -> Self {
        Self {
            allowed: true,
            reason,
            message,
            worker,
            pod: None,
            age,
        }
    }

    fn deny(reason: Reason, worker: Option<String>, age: Option<Duration>, message: String) -> Self {
        Self {
            allowed: false,
            ..Self::allow(reason, worker, age, message)
        }
    }

    /// Whether the secret is a worker secret (every decision on one is audited).
    pub fn is_protected(&self) -> bool {
        self.worker.is_some()
    }
}
