//! The services behind the handlers: the secret-delete decision with its audit trail and
//! metrics, the pod mutation with its one read, and in-use protection's delete decision.
//! Nothing here knows about HTTP.

use std::collections::BTreeSet;

use futures::future::join_all;
use k8s_openapi::{apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp};
use kube::core::Status;
use tokio::time::Instant;

use super::AppState;
use crate::{
    api::audit::{self, Requester, Who},
    api::review::{Answer, ReviewRequest},
    cluster::references::Kind,
    observe::events,
    observe::metrics::{DecisionLabels, IN_USE_RULES, WORKER_RULES},
    rules::worker::mutation,
    rules::worker::pod::PodObject,
    rules::worker::reads::ClusterLookup,
    rules::worker::{self, Reason, SecretDelete, Verdict},
    rules::{
        self, Decision,
        in_use::{self, InUseLookup, ObjectDelete},
    },
    rules::{in_use::InUseObject, worker::SecretObject},
};

/// Every decision the services count, for `admission_decisions_total` to start at 0: a
/// delete's reason with the outcome it has in `mode`, and the pod mutation's outcomes.
pub fn possible_decisions(mode: rules::Mode) -> impl Iterator<Item = DecisionLabels> {
    let enforced = mode == rules::Mode::Enforce;
    let deletes = Reason::ALL.iter().map(move |&reason| DecisionLabels {
        rules: WORKER_RULES,
        operation: "DELETE",
        decision: audit::outcome(!reason.denies(), enforced),
        reason: reason.code(),
    });
    let creates = [
        (SKIPPED, NO_PROTECTED_SECRET),
        (PATCHED, PROTECTED_SECRET),
        (UNCHANGED, PROTECTED_SECRET),
    ]
    .map(|(decision, reason)| DecisionLabels {
        rules: WORKER_RULES,
        operation: "CREATE",
        decision,
        reason,
    });
    deletes.chain(creates)
}

/// Every decision in-use protection counts, each reason with the outcome it has in `mode`.
pub fn possible_in_use_decisions(mode: rules::Mode) -> impl Iterator<Item = DecisionLabels> {
    let enforced = mode == rules::Mode::Enforce;
    in_use::Reason::ALL.iter().map(move |&reason| DecisionLabels {
        rules: IN_USE_RULES,
        operation: "DELETE",
        decision: audit::outcome(!reason.denies(), enforced),
        reason: reason.code(),
    })
}

const SKIPPED: &str = "skip";
const PATCHED: &str = "patch";
const UNCHANGED: &str = "unchanged";
const NO_PROTECTED_SECRET: &str = "no-protected-secret";
const PROTECTED_SECRET: &str = "protected-secret";

/// Decides on a secret delete, audits the decision and counts it. A decision still
/// running at `deadline` is a denial like any other failed lookup, audited the same way.
pub async fn validate_delete<'a>(
    state: &AppState,
    request: &'a ReviewRequest<'a, SecretObject>,
    deadline: Instant,
) -> Answer<'a> {
    let old_object = request.old_object.as_ref().map(|secret| &secret.metadata);
    let delete = SecretDelete {
        namespace: request.namespace.as_deref().unwrap_or_default(),
        name: secret_name(request),
        secret: old_object,
        username: request.user_info.username.as_deref(),
        groups: request.user_info.groups.as_deref().unwrap_or_default(),
    };
    let lookup = state.lookup.within(state.rules.lookup_timeout);
    let decision = worker::decide(&state.rules, &state.worker, &delete, &lookup, Timestamp::now());
    let verdict = match tokio::time::timeout_at(deadline, decision).await {
        Ok(verdict) => verdict,
        Err(_) => {
            let worker = match old_object {
                Some(secret) => state.worker.worker_of_secret(secret),
                None => state.worker.worker_of_secret_name(delete.name),
            };
            let age = old_object.map(|secret| worker::secret_age(secret, Timestamp::now()));
            let message = format!(
                "cannot decide on secret {} within {:?}; refusing to delete it",
                delete.name, state.request_timeout
            );
            Verdict::deny(Reason::LookupFailed, worker, age, message)
        }
    };
    let deleted = events::DeletedRef {
        kind: "Secret",
        namespace: delete.namespace,
        name: delete.name,
        uid: old_object.and_then(|secret| secret.uid.as_deref()),
    };
    let who = Who {
        username: delete.username,
        groups: delete.groups,
    };
    finish(state, request, deleted, who, &verdict)
}

/// What every decision on a delete gets, whichever rule set made it: its audit line
/// (the rule set says which it audits), an Event on a denial or a deferral, its count,
/// and the answer, with the audit annotations and the message where it has them.
fn finish<'a, O, D: Decision>(
    state: &AppState,
    request: &'a ReviewRequest<'a, O>,
    deleted: events::DeletedRef<'_>,
    who: Who<'_>,
    decision: &D,
) -> Answer<'a> {
    let enforced = state.rules.enforced();
    let requester = Requester {
        uid: &request.uid,
        dry_run: request.dry_run,
    };
    state.audit.record(deleted, who, requester, decision, enforced);
    // A dry run has no side effect (the webhook says `sideEffects: NoneOnDryRun`).
    if !request.dry_run {
        if enforced && !decision.allowed() {
            state
                .events
                .delete_denied(deleted, decision.reason(), decision.message());
        } else if decision.deferred() {
            state.events.delete_deferred(deleted, decision.message());
        }
    }
    let outcome = audit::outcome(decision.allowed(), enforced);
    state.metrics.decision(D::RULES, "DELETE", outcome, decision.reason());

    let mut answer = Answer::allow(&request.uid);
    if !decision.annotated() {
        return answer;
    }
    answer.audit_annotations = audit::annotations(decision);
    if !decision.allowed() {
        refuse(&mut answer, decision.message().to_owned(), enforced);
    } else if decision.deferred() {
        // `kubectl` and Helm print it.
        answer.warnings = vec![decision.message().to_owned()];
    }
    answer
}

/// Refuses the request with `message`, or in warn mode lets it through with `message` as
/// a warning.
fn refuse(answer: &mut Answer<'_>, message: String, enforced: bool) {
    if enforced {
        answer.allowed = false;
        // Forbidden, not kube's default Bad Request: the request was fine, the delete is not allowed.
        answer.status = Some(Status {
            code: 403,
            message,
            reason: "Forbidden".to_owned(),
            ..Status::default()
        });
    } else {
        answer.warnings = vec![format!("cds-secret-guard would deny: {message}")];
    }
}

/// The secret's name (see [`object_name`]).
fn secret_name<'a>(request: &'a ReviewRequest<'a, SecretObject>) -> &'a str {
    let old_object = request.old_object.as_ref().map(|secret| &secret.metadata);
    object_name(&request.name, old_object)
}

/// The object's name. The per-item DELETEs of a deletecollection carry an empty
/// `request.name`: the name is then only in `oldObject`.
fn object_name<'a>(name: &'a str, old_object: Option<&'a ObjectMeta>) -> &'a str {
    match old_object.and_then(|object| object.name.as_deref()) {
        Some(old_name) if name.is_empty() => old_name,
        _ => name,
    }
}

/// Decides on the delete of an opted-in Secret or ConfigMap (the webhook's selectors and
/// match conditions sent only those), audits the decision, counts it and records an
/// Event on a denial, as for worker secrets. Reads that do not answer within the lookup
/// timeout, or the request's deadline, deny.
pub async fn validate_in_use_delete<'a>(
    state: &AppState,
    kind: Kind,
    request: &'a ReviewRequest<'a, InUseObject>,
    deadline: Instant,
) -> Answer<'a> {
    let object = request.old_object.as_ref().map(|object| &object.metadata);
    let who = Who {
        username: request.user_info.username.as_deref(),
        groups: request.user_info.groups.as_deref().unwrap_or_default(),
    };
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let namespace_labels = state
        .in_use
        .as_ref()
        .and_then(|lookup| lookup.namespace_labels(namespace));
    let object_labels = object.and_then(|object| object.labels.as_ref());
    // Sent here, the object was opted in; the caches may not know it yet.
    let mode =
        in_use::opted_in(object_labels, namespace_labels.as_ref(), state.in_use_mode).unwrap_or(state.in_use_mode);
    let delete = ObjectDelete {
        kind,
        namespace,
        name: object_name(&request.name, object),
        object,
        exempt: state.rules.is_exempt(who.username, who.groups),
        mode,
    };
    let verdict = match &state.in_use {
        Some(lookup) => {
            let deadline = deadline.min(Instant::now() + state.rules.lookup_timeout);
            match tokio::time::timeout_at(deadline, in_use::decide(&delete, lookup)).await {
                Ok(verdict) => verdict,
                Err(_) => in_use::Verdict::deny(
                    in_use::Reason::LookupFailed,
                    format!(
                        "cannot verify within {:?} that no pod uses {} {}; refusing to delete it",
                        state.rules.lookup_timeout,
                        kind.as_str().to_lowercase(),
                        delete.name
                    ),
                ),
            }
        }
        None => in_use::Verdict::deny(
            in_use::Reason::LookupFailed,
            "in-use protection is not enabled in this guard (serve --in-use-protection), yet its webhook \
             sent this delete; refusing it"
                .to_owned(),
        ),
    };
    let deleted = events::DeletedRef {
        kind: kind.as_str(),
        namespace: delete.namespace,
        name: delete.name,
        uid: object.and_then(|object| object.uid.as_deref()),
    };
    finish(state, request, deleted, who, &verdict)
}

/// The patch for a pod create, if it needs one. The secrets' hatchery label is read by
/// quorum read, all secrets at once, within `mutation_timeout`: a read that does not
/// answer in time only leaves that label out.
pub async fn mutate_pod(
    state: &AppState,
    request: &ReviewRequest<'_, PodObject<'_>>,
    deadline: Instant,
) -> Option<json_patch::Patch> {
    let Some(pod) = request.object.as_ref() else {
        tracing::warn!("pod create without an object, allowed unpatched");
        return None;
    };
    let policy = &state.worker;
    let facts = pod.facts();
    let (secrets, worker) = mutation::protected_secrets(policy, facts.secrets.iter().copied());
    if secrets.is_empty() {
        state
            .metrics
            .decision(WORKER_RULES, "CREATE", SKIPPED, NO_PROTECTED_SECRET);
        return None;
    }
    let hatchery = match (&worker, request.namespace.as_deref()) {
        (Some(_), Some(namespace)) if !pod.has_label(&policy.hatchery_label) => {
            let deadline = deadline.min(Instant::now() + state.mutation_timeout);
            let lookup = state.lookup.until(deadline);
            hatchery_of(state, &lookup, namespace, &secrets).await
        }
        _ => None,
    };
    let mutation = mutation::plan_protected(policy, &facts, secrets, worker, hatchery.as_deref());
    let changed = !mutation.patch.0.is_empty();
    let decision = if changed { PATCHED } else { UNCHANGED };
    state
        .metrics
        .decision(WORKER_RULES, "CREATE", decision, PROTECTED_SECRET);
    // Debug: the apiserver's audit log records every webhook patch already
    // (`patch.webhook.admission.k8s.io`); a line per pod here cost 13 % of a `/mutate`.
    tracing::debug!(
        worker = mutation.worker.as_deref(),
        secrets = %mutation.secrets.iter().cloned().collect::<Vec<_>>().join(","),
        hatchery = hatchery.as_deref(),
        operations = mutation.patch.0.len(),
        "worker pod {decision}"
    );
    changed.then_some(mutation.patch)
}

/// The hatchery label of the pod's protected secrets (the first secret, by name, that
/// has one). The pod may come before its secret: then it is simply not known.
async fn hatchery_of(
    state: &AppState,
    lookup: &dyn ClusterLookup,
    namespace: &str,
    secrets: &BTreeSet<String>,
) -> Option<String> {
    let reads = join_all(secrets.iter().map(|name| lookup.secret_metadata(namespace, name))).await;
    let mut found = None;
    for (name, read) in secrets.iter().zip(reads) {
        match read {
            Ok(Some(meta)) => {
                let label = meta
                    .labels
                    .and_then(|mut labels| labels.remove(&state.worker.hatchery_label));
                if found.is_none() {
                    found = label;
                }
            }
            Ok(None) => {}
            Err(error) => tracing::debug!(%error, secret = %name, "cannot read the secret's hatchery label"),
        }
    }
    found
}
