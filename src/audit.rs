//! The audit trail of secret-delete decisions: one structured log line per decision on
//! a worker secret, and the `auditAnnotations` the apiserver writes to its audit log.
//! Only metadata is ever recorded: secret data never reaches this module.

use std::collections::HashMap;

use crate::policy::{SecretDelete, Verdict};

/// Who asked, as the audit line records it.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    /// The AdmissionReview request uid.
    pub uid: &'a str,
    /// Whether the request is a dry run.
    pub dry_run: bool,
}

/// What the decision was, as written to the log and the metrics.
pub fn outcome(verdict: &Verdict, enforced: bool) -> &'static str {
    match (verdict.allowed, enforced) {
        (true, _) => "allow",
        (false, true) => "deny",
        (false, false) => "warn",
    }
}

/// Writes the audit line for a decision on a worker secret (and for any denial).
pub fn record(request: &SecretDelete<'_>, requester: Requester<'_>, verdict: &Verdict, enforced: bool) {
    if !verdict.is_protected() && verdict.allowed {
        return;
    }
    let pod = verdict.pod.as_ref();
    tracing::info!(
        target: "cds_secret_guard::audit",
        audit = true,
        namespace = request.namespace,
        secret = request.name,
        worker = verdict.worker.as_deref(),
        decision = outcome(verdict, enforced),
        reason = verdict.reason.code(),
        pod = pod.map(|pod| pod.name.as_str()),
        pod_uid = pod.map(|pod| pod.uid.as_str()),
        secret_age_seconds = verdict.age.map(|age| age.as_secs()),
        user = request.username,
        groups = %request.groups.join(","),
        request_uid = requester.uid,
        dry_run = requester.dry_run,
        detail = %verdict.message,
        "secret delete {}", outcome(verdict, enforced),
    );
}

/// The annotations a denial (or a warning) leaves in the apiserver's audit log. The
/// apiserver prefixes each key with the webhook's name.
pub fn annotations(verdict: &Verdict) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (
            "decision".to_owned(),
            if verdict.allowed { "allow" } else { "deny" }.to_owned(),
        ),
        ("reason".to_owned(), verdict.reason.code().to_owned()),
        ("message".to_owned(), verdict.message.clone()),
    ]);
    if let Some(worker) = &verdict.worker {
        annotations.insert("worker".to_owned(), worker.clone());
    }
    if let Some(pod) = &verdict.pod {
        annotations.insert("pod".to_owned(), format!("{} ({})", pod.name, pod.uid));
    }
    if let Some(age) = verdict.age {
        annotations.insert("secret-age".to_owned(), format!("{}s", age.as_secs()));
    }
    annotations
}
