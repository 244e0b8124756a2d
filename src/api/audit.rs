//! The audit trail of delete decisions: one structured log line per decision on a worker
//! secret or on an opted-in Secret or ConfigMap, and the `auditAnnotations` the apiserver
//! writes to its audit log. Only metadata is ever recorded: object data never reaches
//! this module.
//!
//! A cleanup loop can ask for the same refused delete thousands of times. The first of a
//! run of identical decisions (same object, decision, reason, requester, dry run) is
//! written at once; the repeats within the window are counted and written as one summary
//! line (`repeated`, `first_seen`, `last_seen`) when the window closes. Nothing is
//! dropped without a line that counts it.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::{
    cluster::references::Kind,
    rules::in_use::{self, ObjectDelete},
    rules::worker::{SecretDelete, Verdict},
};

use crate::observe::telemetry::AUDIT_TARGET as TARGET;

/// The requesting user, as the audit line records it.
#[derive(Debug, Clone, Copy)]
pub struct Who<'a> {
    /// The user name.
    pub username: Option<&'a str>,
    /// The user's groups.
    pub groups: &'a [String],
}

/// Which request asked, as the audit line records it.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    /// The AdmissionReview request uid.
    pub uid: &'a str,
    /// Whether the request is a dry run.
    pub dry_run: bool,
}

/// The audit trail, with its memory of recent decisions for summarising repeats.
#[derive(Debug)]
pub struct AuditLog {
    window: Duration,
    recent: Mutex<HashMap<Key, Repeats>>,
}

/// What makes two decisions identical.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    object: Subject,
    decision: &'static str,
    reason: &'static str,
    user: Option<String>,
    dry_run: bool,
}

/// What a decision was on, by which rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Subject {
    /// A worker secret, under the CDS rules.
    WorkerSecret(String),
    /// An opted-in Secret or ConfigMap, under in-use protection.
    InUse(Kind, String),
}

/// The repeats of a decision since its last line.
#[derive(Debug)]
struct Repeats {
    opened: Instant,
    count: u64,
    first: Option<Timestamp>,
    last: Option<Timestamp>,
}

/// What a decision that `allowed` the delete or not was, as written to the log and the
/// metrics.
pub fn outcome(allowed: bool, enforced: bool) -> &'static str {
    match (allowed, enforced) {
        (true, _) => "allow",
        (false, true) => "deny",
        (false, false) => "warn",
    }
}

// === impl AuditLog ===

impl AuditLog {
    /// An audit trail summarising identical decisions over `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            recent: Mutex::default(),
        }
    }

    /// Records a decision on a worker secret (and any denial): a line now, or a count
    /// for the summary when it repeats one written within the window.
    pub fn record(&self, request: &SecretDelete<'_>, requester: Requester<'_>, verdict: &Verdict, enforced: bool) {
        if !verdict.is_protected() && verdict.allowed {
            return;
        }
        let key = Key {
            namespace: request.namespace.to_owned(),
            object: Subject::WorkerSecret(request.name.to_owned()),
            decision: outcome(verdict.allowed, enforced),
            reason: verdict.reason.code(),
            user: request.username.map(str::to_owned),
            dry_run: requester.dry_run,
        };
        self.once_per_window(key, || line(request, requester, verdict, enforced));
    }

    /// Records a decision on an opted-in Secret or ConfigMap, allowed or not (everything
    /// sent to in-use protection was opted in), as [`AuditLog::record`] does.
    pub fn record_in_use(
        &self,
        request: &ObjectDelete<'_>,
        who: Who<'_>,
        requester: Requester<'_>,
        verdict: &in_use::Verdict,
        enforced: bool,
    ) {
        let key = Key {
            namespace: request.namespace.to_owned(),
            object: Subject::InUse(request.kind, request.name.to_owned()),
            decision: outcome(verdict.allowed, enforced),
            reason: verdict.reason.code(),
            user: who.username.map(str::to_owned),
            dry_run: requester.dry_run,
        };
        self.once_per_window(key, || in_use_line(request, who, requester, verdict, enforced));
    }

    /// Writes the line of a decision through `write`, unless it repeats one written within
    /// the window: then it is counted, for the summary.
    fn once_per_window(&self, key: Key, write: impl FnOnce()) {
        let now = Instant::now();
        let previous = {
            let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match recent.get_mut(&key) {
                Some(repeats) if now.duration_since(repeats.opened) < self.window => {
                    let at = Timestamp::now();
                    repeats.first.get_or_insert(at);
                    repeats.last = Some(at);
                    repeats.count += 1;
                    return;
                }
                _ => recent.insert(
                    key.clone(),
                    Repeats {
                        opened: now,
                        count: 0,
                        first: None,
                        last: None,
                    },
                ),
            }
        };
        if let Some(previous) = previous {
            summary(&key, &previous);
        }
        write();
    }

    /// Writes the summaries of the windows that have closed.
    pub fn flush_expired(&self) {
        let now = Instant::now();
        let closed: Vec<(Key, Repeats)> = {
            let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let keys: Vec<Key> = recent
                .iter()
                .filter(|(_, repeats)| now.duration_since(repeats.opened) >= self.window)
                .map(|(key, _)| key.clone())
                .collect();
            keys.into_iter()
                .filter_map(|key| recent.remove(&key).map(|repeats| (key, repeats)))
                .collect()
        };
        for (key, repeats) in closed {
            summary(&key, &repeats);
        }
    }

    /// Writes every pending summary (at shutdown).
    pub fn flush_all(&self) {
        let all: Vec<(Key, Repeats)> = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .drain()
            .collect();
        for (key, repeats) in all {
            summary(&key, &repeats);
        }
    }

    /// Closes windows as they expire, until `stop` (the server then calls
    /// [`AuditLog::flush_all`] once the last request is answered).
    pub async fn run(self: std::sync::Arc<Self>, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(self.window.max(Duration::from_millis(10)) / 2);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.flush_expired(),
                () = stop.cancelled() => return,
            }
        }
    }
}

/// The line of one decision.
fn line(request: &SecretDelete<'_>, requester: Requester<'_>, verdict: &Verdict, enforced: bool) {
    let pod = verdict.pod.as_ref();
    tracing::info!(
        target: TARGET,
        audit = true,
        namespace = request.namespace,
        secret = request.name,
        worker = verdict.worker.as_deref(),
        decision = outcome(verdict.allowed, enforced),
        reason = verdict.reason.code(),
        pod = pod.map(|pod| pod.name.as_str()),
        pod_uid = pod.map(|pod| pod.uid.as_str()),
        secret_age_seconds = verdict.age.map(|age| age.as_secs()),
        user = request.username,
        groups = %request.groups.join(","),
        request_uid = requester.uid,
        dry_run = requester.dry_run,
        detail = %verdict.message,
        "secret delete {}", outcome(verdict.allowed, enforced),
    );
}

/// The line of one in-use decision.
fn in_use_line(
    request: &ObjectDelete<'_>,
    who: Who<'_>,
    requester: Requester<'_>,
    verdict: &in_use::Verdict,
    enforced: bool,
) {
    tracing::info!(
        target: TARGET,
        audit = true,
        rules = "in-use",
        namespace = request.namespace,
        kind = request.kind.as_str(),
        object = request.name,
        decision = outcome(verdict.allowed, enforced),
        reason = verdict.reason.code(),
        pods = %verdict.pods.join(","),
        user = who.username,
        groups = %who.groups.join(","),
        request_uid = requester.uid,
        dry_run = requester.dry_run,
        detail = %verdict.message,
        "in-use delete {}", outcome(verdict.allowed, enforced),
    );
}

/// The line that accounts for the repeats of a decision, if there were any.
fn summary(key: &Key, repeats: &Repeats) {
    if repeats.count == 0 {
        return;
    }
    let first_seen = repeats.first.map(|t| t.to_string());
    let last_seen = repeats.last.map(|t| t.to_string());
    match &key.object {
        Subject::WorkerSecret(secret) => tracing::info!(
            target: TARGET,
            audit = true,
            namespace = key.namespace,
            secret,
            decision = key.decision,
            reason = key.reason,
            user = key.user.as_deref(),
            dry_run = key.dry_run,
            repeated = repeats.count,
            first_seen,
            last_seen,
            "secret delete {} repeated {} times", key.decision, repeats.count,
        ),
        Subject::InUse(kind, object) => tracing::info!(
            target: TARGET,
            audit = true,
            rules = "in-use",
            namespace = key.namespace,
            kind = kind.as_str(),
            object,
            decision = key.decision,
            reason = key.reason,
            user = key.user.as_deref(),
            dry_run = key.dry_run,
            repeated = repeats.count,
            first_seen,
            last_seen,
            "in-use delete {} repeated {} times", key.decision, repeats.count,
        ),
    }
}

/// The annotations a denial (or a warning) leaves in the apiserver's audit log. The
/// apiserver prefixes each key with the webhook's name.
pub fn annotations(verdict: &Verdict) -> Vec<(&'static str, String)> {
    let decision = if verdict.allowed { "allow" } else { "deny" };
    let mut annotations = vec![
        ("decision", decision.to_owned()),
        ("reason", verdict.reason.code().to_owned()),
        ("message", verdict.message.clone()),
    ];
    if let Some(worker) = &verdict.worker {
        annotations.push(("worker", worker.clone()));
    }
    if let Some(pod) = &verdict.pod {
        annotations.push(("pod", format!("{} ({})", pod.name, pod.uid)));
    }
    if let Some(age) = verdict.age {
        annotations.push(("secret-age", format!("{}s", age.as_secs())));
    }
    annotations
}

/// The annotations an in-use denial, or a forced delete, leaves in the apiserver's audit
/// log.
pub fn in_use_annotations(verdict: &in_use::Verdict) -> Vec<(&'static str, String)> {
    let decision = if verdict.allowed { "allow" } else { "deny" };
    let mut annotations = vec![
        ("decision", decision.to_owned()),
        ("reason", verdict.reason.code().to_owned()),
        ("message", verdict.message.clone()),
    ];
    if !verdict.pods.is_empty() {
        annotations.push(("pods", verdict.pods.join(",")));
    }
    annotations
}
