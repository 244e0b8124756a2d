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
    observe::{events::DeletedRef, telemetry::AUDIT_TARGET as TARGET},
    rules::{AuditFields, Decision},
};

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
    request: &'static str,
    rules: Option<&'static str>,
    namespace: String,
    secret: Option<String>,
    kind: Option<&'static str>,
    object: Option<String>,
    decision: &'static str,
    reason: &'static str,
    user: Option<String>,
    dry_run: bool,
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

    /// Records a decision (the rule set says which it audits): a line now, or a count
    /// for the summary when it repeats one written within the window.
    pub fn record<D: Decision>(
        &self,
        deleted: DeletedRef<'_>,
        who: Who<'_>,
        requester: Requester<'_>,
        decision: &D,
        enforced: bool,
    ) {
        if !decision.audited() {
            return;
        }
        let fields = decision.audit_fields(deleted.kind, deleted.name);
        let key = Key {
            request: D::REQUEST,
            rules: fields.rules,
            namespace: deleted.namespace.to_owned(),
            secret: fields.secret.map(str::to_owned),
            kind: fields.kind,
            object: fields.object.map(str::to_owned),
            decision: outcome(decision.allowed(), enforced),
            reason: decision.reason(),
            user: who.username.map(str::to_owned),
            dry_run: requester.dry_run,
        };
        self.once_per_window(key, || {
            line::<D>(deleted.namespace, &fields, who, requester, decision, enforced);
        });
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
fn line<D: Decision>(
    namespace: &str,
    fields: &AuditFields<'_>,
    who: Who<'_>,
    requester: Requester<'_>,
    decision: &D,
    enforced: bool,
) {
    let decided = outcome(decision.allowed(), enforced);
    tracing::info!(
        target: TARGET,
        audit = true,
        rules = fields.rules,
        namespace,
        secret = fields.secret,
        kind = fields.kind,
        object = fields.object,
        worker = fields.worker,
        decision = decided,
        reason = decision.reason(),
        pod = fields.pod.map(|(name, _)| name),
        pod_uid = fields.pod.map(|(_, uid)| uid),
        secret_age_seconds = fields.secret_age_seconds,
        pods = fields.pods.as_ref().map(tracing::field::display),
        user = who.username,
        groups = %who.groups.join(","),
        request_uid = requester.uid,
        dry_run = requester.dry_run,
        detail = %decision.message(),
        "{} {decided}", D::REQUEST,
    );
}

/// The line that accounts for the repeats of a decision, if there were any.
fn summary(key: &Key, repeats: &Repeats) {
    if repeats.count == 0 {
        return;
    }
    tracing::info!(
        target: TARGET,
        audit = true,
        rules = key.rules,
        namespace = key.namespace,
        secret = key.secret.as_deref(),
        kind = key.kind,
        object = key.object.as_deref(),
        decision = key.decision,
        reason = key.reason,
        user = key.user.as_deref(),
        dry_run = key.dry_run,
        repeated = repeats.count,
        first_seen = repeats.first.map(|t| t.to_string()),
        last_seen = repeats.last.map(|t| t.to_string()),
        "{} {} repeated {} times", key.request, key.decision, repeats.count,
    );
}

/// The annotations a decision leaves in the apiserver's audit log. The apiserver
/// prefixes each key with the webhook's name.
pub fn annotations<D: Decision>(decision: &D) -> Vec<(&'static str, String)> {
    let decided = if decision.allowed() { "allow" } else { "deny" };
    let mut annotations = vec![
        ("decision", decided.to_owned()),
        ("reason", decision.reason().to_owned()),
        ("message", decision.message().to_owned()),
    ];
    decision.annotate(&mut annotations);
    annotations
}
