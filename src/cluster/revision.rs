//! Revisions: etcd's, as resourceVersions carry them, and the current one read by quorum.
//!
//! A watch delivers its events in revision order, so a watch that has delivered an event
//! at revision R or later shows every change to its objects up to R. A cache fed by a
//! watch may then stand in for a quorum read made after a request arrived, once it has
//! caught up with the revision that read was served at: the technique the apiserver uses
//! for consistent reads from its own watch cache.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::ListParams, core::PartialObjectMeta};
use tokio::{sync::watch, time::Instant};

use crate::Result;

/// How long a read waits for a watch to catch up with a revision read after the request
/// before it LISTs instead; and how often the watch's events must come for the wait to be
/// tried at all. A LIST scans every pod of the namespace in the apiserver; on a cluster
/// whose pods come and go the next event is milliseconds away.
pub const CATCH_UP: Duration = Duration::from_millis(50);

/// How far a watch has delivered, and how fast its events come.
#[derive(Debug, Default)]
pub struct Progress {
    /// Every change up to this revision has been delivered.
    pub revision: u64,
    /// When the last two events came: how soon the next may come.
    last_event: Option<Instant>,
    gap: Option<Duration>,
}

impl Progress {
    /// An event was delivered, at `revision` if it carries one.
    pub fn advance(&mut self, revision: Option<u64>) {
        if let Some(revision) = revision {
            self.revision = self.revision.max(revision);
        }
        let now = Instant::now();
        self.gap = self.last_event.map(|last| now - last);
        self.last_event = Some(now);
    }

    /// Whether the events come often enough that waiting for the next is likely quicker
    /// than a LIST: the last two came within `within` of each other, the last one within
    /// `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        self.last_event
            .is_some_and(|last| last.elapsed() <= within && self.gap.is_some_and(|gap| gap <= within))
    }
}

/// `read`'s answer once it gives one, tried again each time `revisions` moves; `None` if
/// it gives none within `within`. `read` answers once the watch whose revision
/// `revisions` publishes has caught up with the revision it needs.
pub async fn once_caught_up<T>(
    revisions: &watch::Sender<u64>,
    within: Duration,
    mut read: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + within;
    // Subscribed before the first look: no change between the two is missed.
    let mut changes = revisions.subscribe();
    loop {
        if let Some(answer) = read() {
            return Some(answer);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::timeout_at(deadline, changes.changed()).await.ok()?.ok()?;
    }
}

/// A resourceVersion as the revision it is (etcd's); `None` if it is not one.
pub fn parse_revision(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

/// The current revision, read by quorum: a LIST of pods of `namespace` named `name`,
/// metadata only (a single-key read in the apiserver, whatever the namespace holds).
/// `None` if the apiserver gave no revision.
pub async fn current(client: &Client, namespace: &str, name: &str) -> Result<Option<u64>> {
    let pods: Api<PartialObjectMeta<Pod>> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("metadata.name={name}"));
    debug_assert!(params.resource_version.is_none(), "the revision must be read by quorum");
    let current = pods.list_metadata(&params).await?;
    Ok(parse_revision(current.metadata.resource_version.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_only_while_events_come_close_together() {
        let mut progress = Progress::default();
        let within = Duration::from_secs(60);
        assert!(!progress.is_busy(within), "no event yet");
        progress.advance(Some(1));
        assert!(!progress.is_busy(within), "one event: no pace yet");
        progress.advance(None);
        assert!(progress.is_busy(within));
        assert_eq!(progress.revision, 1, "an event without a revision keeps it");
        std::thread::sleep(Duration::from_millis(5));
        assert!(!progress.is_busy(Duration::from_millis(1)), "the last event is too old");
    }

    #[test]
    fn revisions_are_etcd_revisions_or_nothing() {
        assert_eq!(parse_revision(Some("1234")), Some(1234));
        assert_eq!(parse_revision(Some("not-a-number")), None);
        assert_eq!(parse_revision(None), None);
    }
}
