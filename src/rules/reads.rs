//! What every rule set's reads share: one wrapper that times and counts them and bounds
//! them by a decision's deadline, and reads that always fail.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use crate::{Error, Result, observe::metrics::Metrics};

/// A rule set's reads, each timed and counted (`lookup_duration_seconds`, and the failed
/// ones), and failing with [`Error::Timeout`] once the decision's deadline has passed,
/// when it has one. Each rule set implements its reads for it by passing every read
/// through [`Bounded::read`].
pub struct Bounded<L: ?Sized> {
    inner: Arc<L>,
    metrics: Arc<Metrics>,
    /// When the reads must have answered, and the budget that deadline gave.
    deadline: Option<(Instant, Duration)>,
}

/// Reads that always fail: the guard without a Kubernetes client still starts, answers,
/// and fails closed. Each rule set's reads are implemented for it.
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

// === impl Bounded ===

impl<L: ?Sized> Bounded<L> {
    /// Times and counts the reads of `inner`, without a deadline.
    pub fn new(inner: Arc<L>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            metrics,
            deadline: None,
        }
    }

    /// The same reads, for at most `budget` from now.
    pub fn within(&self, budget: Duration) -> Self {
        self.bounded((Instant::now() + budget, budget))
    }

    /// The same reads, until `deadline`.
    pub fn until(&self, deadline: Instant) -> Self {
        self.bounded((deadline, deadline.saturating_duration_since(Instant::now())))
    }

    fn bounded(&self, deadline: (Instant, Duration)) -> Self {
        Self {
            inner: self.inner.clone(),
            metrics: self.metrics.clone(),
            deadline: Some(deadline),
        }
    }

    /// What is read through.
    pub fn inner(&self) -> &L {
        &self.inner
    }

    /// Runs one read: timed, counted when it fails, and cut at the deadline.
    pub async fn read<T>(&self, read: impl Future<Output = Result<T>>) -> Result<T> {
        let timer = self.metrics.time_lookup();
        let result = self.within_deadline(read, |budget| Err(Error::Timeout(budget))).await;
        timer.finish(result.is_err());
        result
    }

    /// Runs `read` until the deadline; past it, answers `late(budget)`.
    pub async fn within_deadline<T>(&self, read: impl Future<Output = T>, late: impl FnOnce(Duration) -> T) -> T {
        match self.deadline {
            Some((deadline, budget)) => tokio::time::timeout_at(deadline, read)
                .await
                .unwrap_or_else(|_| late(budget)),
            None => read.await,
        }
    }

    /// Starts the timer of a read that [`Bounded::read`] cannot run (one with two answers).
    pub fn time(&self) -> crate::observe::metrics::LookupTimer<'_> {
        self.metrics.time_lookup()
    }
}
