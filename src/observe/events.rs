//! Kubernetes Events on the objects the guard keeps, so that `kubectl describe` says why
//! a worker secret (or an opted-in Secret or ConfigMap) is still there (`DeleteDenied`)
//! and which pod owns a worker secret (`Adopted`).
//!
//! An Event is a side effect, never part of the answer: the handlers and the reconciler
//! hand a note to a bounded queue and go on; one task publishes through kube's event
//! recorder, which folds repeats into an event series. A cleanup loop refused every few
//! seconds must not write to etcd every few seconds, so a note that repeats one published
//! less than [`REPEAT_INTERVAL`] ago is left out (the audit trail counts every one).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::mpsc;

use crate::observe::metrics::Metrics;

/// Notes waiting to be published at most; past it, new ones are dropped and counted.
const QUEUE: usize = 1024;

/// The least time between two publications of the same note.
pub const REPEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Where the guard's notes go: a queue to the publishing task, or nowhere when there is
/// no Kubernetes client.
#[derive(Debug, Clone, Default)]
pub struct Events {
    queue: Option<mpsc::Sender<Note>>,
    metrics: Option<Arc<Metrics>>,
}

/// The object a delete was asked of.
#[derive(Debug, Clone, Copy)]
pub struct DeletedRef<'a> {
    /// `Secret` or `ConfigMap`.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its uid, when the request carried it.
    pub uid: Option<&'a str>,
}

/// What happened to an object.
#[derive(Debug)]
struct Note {
    object: ObjectReference,
    reason: &'static str,
    /// Also the event series key: one series per kind of refusal.
    action: String,
    message: String,
    related: Option<ObjectReference>,
}

// === impl Events ===

impl Events {
    /// Starts the publishing task; it ends when the last handle is dropped.
    pub fn spawn(client: Client, metrics: Arc<Metrics>) -> Self {
        let (queue, notes) = mpsc::channel(QUEUE);
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok());
        let reporter = Reporter {
            controller: "cds-secret-guard".to_owned(),
            instance,
        };
        tokio::spawn(publish(Recorder::new(client, reporter), notes));
        Self {
            queue: Some(queue),
            metrics: Some(metrics),
        }
    }

    /// A delete of `object` was refused, for `reason` (a rule's code).
    pub fn delete_denied(&self, object: DeletedRef<'_>, reason: &str, message: &str) {
        self.on_delete(object, "DeleteDenied", || deny_action(reason), message);
    }

    /// A delete of `object` was accepted and deferred until no pod uses it.
    pub fn delete_deferred(&self, object: DeletedRef<'_>, message: &str) {
        self.on_delete(object, "DeleteDeferred", || "DeferDelete".to_owned(), message);
    }

    /// What became of a delete of `object`. Nothing is built when there is nowhere to
    /// send it.
    fn on_delete(&self, object: DeletedRef<'_>, reason: &'static str, action: impl FnOnce() -> String, message: &str) {
        if self.queue.is_none() {
            return;
        }
        self.send(Note {
            object: ObjectReference {
                kind: Some(object.kind.to_owned()),
                ..secret_reference(object.namespace, object.name, object.uid)
            },
            reason,
            action: action(),
            message: message.to_owned(),
            related: None,
        });
    }

    /// `object`, being deleted, is used by `pods` created after its delete: it stays while
    /// they run, and goes once none does.
    pub fn used_after_delete(&self, object: DeletedRef<'_>, pods: &[String]) {
        if self.queue.is_none() {
            return;
        }
        let what = format!("{} {}", object.kind.to_lowercase(), object.name);
        let message = format!(
            "{what} is being deleted, yet pod {} created since uses it: it stays while such pods run and \
             goes once none does (a scale to 0, a Recreate rollout); to keep it, create it again under another name",
            pods.join(", ")
        );
        self.send(Note {
            object: ObjectReference {
                kind: Some(object.kind.to_owned()),
                ..secret_reference(object.namespace, object.name, object.uid)
            },
            reason: "UsedAfterDelete",
            action: "WaitForPods".to_owned(),
            message,
            related: None,
        });
    }

    /// `secret` got an ownerReference to `pod`.
    pub fn adopted(&self, secret: ObjectReference, pod: ObjectReference) {
        let message = format!(
            "owned by pod {} (uid {}): deleted with it",
            pod.name.as_deref().unwrap_or_default(),
            pod.uid.as_deref().unwrap_or_default()
        );
        self.send(Note {
            object: secret,
            reason: "Adopted",
            action: "AddOwnerReference".to_owned(),
            message,
            related: Some(pod),
        });
    }

    fn send(&self, note: Note) {
        let Some(queue) = &self.queue else {
            return;
        };
        if queue.try_send(note).is_err()
            && let Some(metrics) = &self.metrics
        {
            metrics.event_dropped();
        }
    }
}

/// `TooYoung` for `too-young`: the action names the rule, so each kind of refusal is a
/// series of its own with its own message.
fn deny_action(reason: &str) -> String {
    reason
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Publishes the queued notes, each at most once per [`REPEAT_INTERVAL`].
async fn publish(recorder: Recorder, mut notes: mpsc::Receiver<Note>) {
    type Key = (Option<String>, Option<String>, Option<String>, String);
    let mut published: HashMap<Key, Instant> = HashMap::new();
    while let Some(note) = notes.recv().await {
        let now = Instant::now();
        let key = (
            note.object.kind.clone(),
            note.object.namespace.clone(),
            note.object.name.clone(),
            note.action.clone(),
        );
        if published
            .get(&key)
            .is_some_and(|last| now.duration_since(*last) < REPEAT_INTERVAL)
        {
            continue;
        }
        if published.len() > QUEUE {
            published.retain(|_, last| now.duration_since(*last) < REPEAT_INTERVAL);
        }
        published.insert(key, now);
        let event = Event {
            type_: if matches!(note.reason, "DeleteDenied" | "UsedAfterDelete") {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.to_owned(),
            note: Some(note.message),
            action: note.action,
            secondary: note.related,
        };
        if let Err(error) = recorder.publish(&event, &note.object).await {
            tracing::warn!(%error, kind = note.object.kind.as_deref(), object = note.object.name.as_deref(), "cannot record an event");
        }
    }
}

/// A reference to a secret, for an event about it.
pub fn secret_reference(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Secret".to_owned()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: uid.map(str::to_owned),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_name_the_rule() {
        assert_eq!(deny_action("too-young"), "TooYoung");
        assert_eq!(deny_action("pod-live"), "PodLive");
        assert_eq!(deny_action("lookup-failed"), "LookupFailed");
    }
}
