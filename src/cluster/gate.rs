//! The revision gate: an index fed by a watch that may stand in for a quorum read once it
//! has caught up with a revision read by quorum after the request ([`super::revision`]).
//! The worker rules' pod watch and in-use protection's pod index are two indexes of it.
//!
//! The gate keeps, with the index and under one lock, how far the watch has delivered:
//! the revision of its last event, or, once a relist is done, the newest revision among
//! the listed objects (the list's own is not in the events; its newest object's is no
//! newer, so the claim stays true, even when a relist is served from a lagging cache).
//! A relist is built apart and replaces the index whole when it is done: a read in the
//! middle of it sees the index before it, at the revision it had.

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use kube::{Resource, runtime::watcher::Event};
use tokio::sync::watch;

use super::revision::{Progress, once_caught_up, parse_revision};

/// What a gated watch indexes, and how.
pub trait Index: Send {
    /// The objects the watch delivers.
    type Object: Resource;
    /// What a relist builds before it replaces the index.
    type Relist: Default + Send;
    /// What the index reports of a change, for whoever listens (nothing, for an index no
    /// one subscribes to).
    type Change;

    /// Takes one object the watch delivered: applied, or `deleted`.
    fn apply(&mut self, object: &Self::Object, deleted: bool, changes: &mut Vec<Self::Change>);

    /// Adds one listed object to a relist in progress.
    fn relist(relist: &mut Self::Relist, object: &Self::Object);

    /// Takes a finished relist in place of what it held.
    fn replace(&mut self, relist: Self::Relist, changes: &mut Vec<Self::Change>);

    /// Follows every event once the index has taken it, under the same lock.
    fn observed(&mut self, _event: &Event<Self::Object>) {}
}

/// An index fed by a watch, and how far the watch has delivered.
pub struct Gated<I: Index> {
    state: Mutex<State<I>>,
    /// The revision, for the reads waiting for the watch to catch up.
    revision: watch::Sender<u64>,
}

struct State<I: Index> {
    index: I,
    /// A relist in progress and the newest revision among its objects, until it is done.
    relist: Option<(I::Relist, u64)>,
    /// Every change up to its revision is in the index.
    progress: Progress,
}

// === impl Gated ===

impl<I: Index> Gated<I> {
    /// `index`, before the watch's first event.
    pub fn new(index: I) -> Self {
        Self {
            state: Mutex::new(State {
                index,
                relist: None,
                progress: Progress::default(),
            }),
            revision: watch::Sender::new(0),
        }
    }

    /// Takes one event of the watch; returns what the index reports changed.
    pub fn observe(&self, event: &Event<I::Object>) -> Vec<I::Change> {
        let mut changes = Vec::new();
        let mut state = self.lock();
        let state = &mut *state;
        match event {
            Event::Apply(object) | Event::Delete(object) => {
                let deleted = matches!(event, Event::Delete(_));
                state.index.apply(object, deleted, &mut changes);
                state.progress.advance(revision_of(object));
            }
            Event::Init => state.relist = Some((I::Relist::default(), 0)),
            Event::InitApply(object) => {
                if let Some((relist, newest)) = state.relist.as_mut() {
                    I::relist(relist, object);
                    *newest = revision_of(object).map_or(*newest, |revision| revision.max(*newest));
                }
            }
            Event::InitDone => {
                if let Some((relist, newest)) = state.relist.take() {
                    state.progress.revision = newest;
                    state.index.replace(relist, &mut changes);
                }
            }
        }
        state.index.observed(event);
        // Waiting reads wake only when the revision moves, not for each object of a relist.
        let revision = state.progress.revision;
        self.revision
            .send_if_modified(|seen| std::mem::replace(seen, revision) != revision);
        changes
    }

    /// Whether the watch's events come often enough that waiting for the next is likely
    /// quicker than a LIST: the last two came within `within` of each other, the last one
    /// within `within` of now.
    pub fn is_busy(&self, within: Duration) -> bool {
        self.lock().progress.is_busy(within)
    }

    /// What `read` finds in the index now: a hint, never the proof of an absence.
    pub fn now<T>(&self, read: impl FnOnce(&I) -> T) -> T {
        read(&self.lock().index)
    }

    /// What `read` finds in the index once the watch has caught up with `revision`;
    /// `None` if it has not within `within`. This is the gate.
    pub async fn at<T>(&self, revision: u64, within: Duration, read: impl Fn(&I) -> T) -> Option<T> {
        once_caught_up(&self.revision, within, || {
            let state = self.lock();
            (state.progress.revision >= revision).then(|| read(&state.index))
        })
        .await
    }

    fn lock(&self) -> MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn revision_of(object: &impl Resource) -> Option<u64> {
    parse_revision(object.meta().resource_version.as_deref())
}
