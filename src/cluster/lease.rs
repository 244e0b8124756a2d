//! Which replica does the adoption work: the holder of a Lease (`coordination.k8s.io/v1`),
//! elected as Kubernetes' own controllers elect theirs (client-go's `leaderelection`, with
//! kube-controller-manager's 15 s lease, 10 s renew deadline and 2 s retry period).
//!
//! Every replica reads the Lease once per retry period. A Lease that names no holder is
//! taken at once; one that names another replica is taken only once it has not changed for
//! its duration, measured from when this replica saw it change, by this replica's own clock
//! (the `renewTime` in it was written by another clock). The holder renews it every retry
//! period and steps down once it could not for the renew deadline, which is shorter than the
//! duration: it stops before any other replica may start. Every write carries the
//! resourceVersion it read, so of two replicas trying at once one gets a 409 Conflict and
//! stays a follower. On a graceful stop the holder clears the holder field, and another
//! replica takes over at its next read, within a retry period.
//!
//! Correctness never rests on there being one holder. A holder that stalls (a long pause,
//! a partition) may act beside the next one until its next read shows it lost the Lease;
//! every write of the adoption work is conditional on the resourceVersion it read, so two
//! replicas acting at once cost a 409 and a re-read, nothing else.
//!
//! The guard reads and patches the Lease but never creates it: the chart does, so the
//! guard's role is `get` and `patch` on that one name. The crate kube-lease-manager was
//! the candidate: its followers sleep until the lease they last read expires, so a Lease
//! released on SIGTERM waited up to its duration minus its grace before anyone took it.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime, jiff::Timestamp};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{Result, observe::metrics::Metrics};

/// The Lease that elects the replica doing the adoption work, and its timing (as
/// kube-controller-manager's `--leader-elect-*` flags, whose defaults it shares).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// The Lease's name, in the namespace of the guard's kube client (its own, in a pod).
    pub name: String,
    /// This replica's name in the Lease's `holderIdentity`.
    pub identity: String,
    /// How long the other replicas wait, after the Lease last changed, before they take it.
    pub duration: Duration,
    /// How long the holder keeps acting without a successful renewal before it steps down.
    pub renew_deadline: Duration,
    /// How often every replica reads (or the holder renews) the Lease.
    pub retry_period: Duration,
}

/// Whether this replica does the adoption work now, as its [`Elector`] decides.
#[derive(Clone, Debug)]
pub struct Leadership(watch::Receiver<bool>);

/// Takes, keeps and releases the Lease, and tells [`Leadership`] what it holds.
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    config: LeaseConfig,
    metrics: Arc<Metrics>,
    leading: watch::Sender<bool>,
    /// The Lease as last read or written, and when its holder or times last changed.
    seen: Option<Seen>,
    /// When this replica last took or renewed the Lease.
    renewed: Option<Instant>,
    /// Consecutive failed attempts: the first one is logged as a warning.
    failures: u32,
}

struct Seen {
    lease: Lease,
    changed: Instant,
}

// === impl LeaseConfig ===

impl LeaseConfig {
    /// The Lease holds its duration in whole seconds; a holder must step down before anyone
    /// may take over, and try to renew more than once before it does.
    pub fn validate(&self) -> crate::Result<()> {
        let usage = |message: String| Err(crate::Error::Usage(message));
        if self.name.is_empty() || self.identity.is_empty() {
            return usage("--lease and --lease-identity cannot be empty".to_owned());
        }
        if self.duration.subsec_nanos() != 0
            || self.duration.as_secs() == 0
            || self.duration.as_secs() > i32::MAX as u64
        {
            return usage(format!(
                "--lease-duration must be a whole number of seconds, at least 1s: {:?}",
                self.duration
            ));
        }
        if !(self.retry_period < self.renew_deadline && self.renew_deadline < self.duration)
            || self.retry_period.is_zero()
        {
            return usage(format!(
                "the lease needs 0 < --lease-retry-period ({:?}) < --lease-renew-deadline ({:?}) < --lease-duration ({:?})",
                self.retry_period, self.renew_deadline, self.duration
            ));
        }
        Ok(())
    }
}

// === impl Leadership ===

impl Leadership {
    /// Leading always: every replica does the work (no `--lease`).
    pub fn always() -> Self {
        Self(watch::channel(true).1)
    }

    /// Whether this replica leads now.
    pub fn is_leading(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until this replica leads; false if it never will (the elector has stopped).
    pub async fn gained(&mut self) -> bool {
        self.0.wait_for(|leading| *leading).await.is_ok()
    }

    /// Waits until leadership changes either way; never returns if it cannot.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Waits until this replica no longer leads; never returns if that cannot happen.
    pub async fn lost(&mut self) {
        if self.0.wait_for(|leading| !*leading).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A term of leadership, begun now: it ends when this replica stops leading, when
    /// `shutdown` is cancelled, or when [`Term::end`] is called.
    pub fn term(&self, shutdown: &CancellationToken) -> Term {
        let ended = shutdown.child_token();
        let lost = tokio::spawn({
            let (ended, mut leadership) = (ended.clone(), self.clone());
            async move {
                tokio::select! {
                    () = leadership.lost() => ended.cancel(),
                    () = ended.cancelled() => {}
                }
            }
        });
        Term { ended, lost }
    }
}

/// One term of leadership ([`Leadership::term`]).
pub struct Term {
    ended: CancellationToken,
    lost: tokio::task::JoinHandle<()>,
}

// === impl Term ===

impl Term {
    /// Cancelled when the term ends.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// Ends the term, once the work done in it has stopped.
    pub async fn end(self) {
        self.ended.cancel();
        let _ = self.lost.await;
    }
}

// === impl Elector ===

impl Elector {
    /// An elector for the Lease `config.name` in the client's default namespace (the guard's
    /// own, in a pod), and the [`Leadership`] it drives.
    pub fn new(client: Client, config: LeaseConfig, metrics: Arc<Metrics>) -> (Self, Leadership) {
        let namespace = client.default_namespace().to_owned();
        let (leading, leadership) = watch::channel(false);
        metrics.leader(false);
        let elector = Self {
            api: Api::namespaced(client, &namespace),
            namespace,
            config,
            metrics,
            leading,
            seen: None,
            renewed: None,
            failures: 0,
        };
        (elector, Leadership(leadership))
    }

    /// Tries to take or renew the Lease every retry period until `shutdown`, then releases
    /// it if this replica holds it.
    pub async fn run(mut self, shutdown: CancellationToken) {
        tracing::info!(lease = %self.config.name, namespace = %self.namespace, identity = %self.config.identity, "lease: electing");
        loop {
            let attempt = tokio::select! {
                () = shutdown.cancelled() => break,
                attempt = tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()) => attempt,
            };
            let holds = match attempt {
                Ok(Ok(holds)) => {
                    if self.failures > 0 {
                        tracing::info!(lease = %self.config.name, failures = self.failures, "lease: reachable again");
                    }
                    self.failures = 0;
                    holds
                }
                Ok(Err(error)) => self.failed(&error.to_string()),
                Err(_) => self.failed("timed out"),
            };
            self.set_leading(holds);
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        if self.is_leading() {
            self.leading.send_replace(false);
            self.metrics.leader(false);
            self.release().await;
        }
    }

    fn is_leading(&self) -> bool {
        *self.leading.borrow()
    }

    /// After a failed attempt: whether this replica may still act as the holder (it renewed
    /// within the renew deadline).
    fn failed(&mut self, error: &str) -> bool {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(lease = %self.config.name, namespace = %self.namespace, %error, "lease: cannot read or write it");
        } else {
            tracing::debug!(lease = %self.config.name, %error, failures = self.failures, "lease: still failing");
        }
        self.is_leading()
            && self
                .renewed
                .is_some_and(|renewed| renewed.elapsed() < self.config.renew_deadline)
    }

    fn set_leading(&mut self, leading: bool) {
        let was = self.leading.send_replace(leading);
        if was == leading {
            return;
        }
        self.metrics.leader(leading);
        let holder = self.seen.as_ref().and_then(|seen| holder(&seen.lease));
        if leading {
            tracing::info!(lease = %self.config.name, identity = %self.config.identity, "lease: acquired, adopting");
        } else {
            tracing::info!(lease = %self.config.name, identity = %self.config.identity, holder, "lease: lost, no longer adopting");
        }
    }

    /// One round: renew what this replica holds, or take the Lease if it is free or its
    /// holder has let it lapse. Returns whether this replica holds it now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool> {
        // The holder writes over its own last write without reading first; a conflict
        // means someone else wrote since, and the read below says who.
        if self.is_leading()
            && let Some(seen) = &self.seen
            && holder(&seen.lease) == Some(self.config.identity.as_str())
        {
            let lease = seen.lease.clone();
            if let Some(written) = self.write(&lease).await? {
                self.observe(written);
                self.renewed = Some(Instant::now());
                return Ok(true);
            }
        }
        let lease = self.api.get(&self.config.name).await?;
        self.observe(lease.clone());
        if let Some(holder) = holder(&lease)
            && holder != self.config.identity
            && !self.lapsed(&lease)
        {
            return Ok(false);
        }
        match self.write(&lease).await? {
            Some(written) => {
                self.observe(written);
                self.renewed = Some(Instant::now());
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Whether another replica's hold on `lease` has lapsed: unchanged for its duration
    /// since this replica saw it change.
    fn lapsed(&self, lease: &Lease) -> bool {
        let duration = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.lease_duration_seconds)
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|seconds| *seconds > 0)
            .map_or(self.config.duration, Duration::from_secs);
        self.seen
            .as_ref()
            .is_some_and(|seen| seen.changed.elapsed() >= duration)
    }

    /// Remembers `lease`, and when its record changed.
    fn observe(&mut self, lease: Lease) {
        let changed = match self.seen.take() {
            Some(seen) if seen.lease.spec == lease.spec => seen.changed,
            previous => {
                let before = previous
                    .as_ref()
                    .and_then(|seen| holder(&seen.lease).map(str::to_owned));
                let after = holder(&lease);
                if before.as_deref() != after && after != Some(self.config.identity.as_str()) {
                    tracing::info!(lease = %self.config.name, holder = after, "lease: holder changed");
                }
                Instant::now()
            }
        };
        self.seen = Some(Seen { lease, changed });
    }

    /// Writes this replica as the holder of `lease` as read, renewed now; `None` when it
    /// changed since it was read (409 Conflict).
    async fn write(&self, lease: &Lease) -> Result<Option<Lease>> {
        let spec = lease.spec.clone().unwrap_or_default();
        let renewal = holder(lease) == Some(self.config.identity.as_str());
        let now = MicroTime(Timestamp::now());
        let acquired = if renewal {
            spec.acquire_time.unwrap_or(now.clone())
        } else {
            now.clone()
        };
        let transitions = spec.lease_transitions.unwrap_or(0);
        let transitions = if renewal {
            transitions
        } else {
            transitions.saturating_add(1)
        };
        let patch = json!({
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {
                "holderIdentity": self.config.identity,
                "leaseDurationSeconds": i32::try_from(self.config.duration.as_secs()).unwrap_or(i32::MAX),
                "acquireTime": acquired,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        });
        self.patch(&patch).await
    }

    /// Clears the holder, so that another replica takes the Lease at its next read.
    async fn release(&mut self) {
        let Some(seen) = self.seen.take() else { return };
        let patch = json!({
            "metadata": {"resourceVersion": seen.lease.metadata.resource_version},
            "spec": {"holderIdentity": null, "acquireTime": null, "renewTime": null, "leaseDurationSeconds": null},
        });
        match self.patch(&patch).await {
            Ok(Some(_)) => {
                tracing::info!(lease = %self.config.name, identity = %self.config.identity, "lease: released")
            }
            Ok(None) => tracing::info!(lease = %self.config.name, "lease: changed by another replica, not released"),
            Err(error) => tracing::warn!(lease = %self.config.name, %error, "lease: cannot release it; it lapses"),
        }
    }

    /// A merge patch conditional on the resourceVersion it carries; `None` on a conflict.
    async fn patch(&self, patch: &serde_json::Value) -> Result<Option<Lease>> {
        match self
            .api
            .patch(
                &self.config.name,
                &PatchParams {
                    field_manager: Some(crate::FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(lease) => Ok(Some(lease)),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(error) => Err(error.into()),
        }
    }
}

/// The Lease's holder, if it names one.
fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .filter(|holder| !holder.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_lease_every_replica_leads_for_good() {
        let mut leadership = Leadership::always();
        assert!(leadership.is_leading());
        assert!(leadership.gained().await);
        let lost = tokio::time::timeout(Duration::from_millis(50), leadership.lost()).await;
        assert!(lost.is_err(), "leadership without a lease is never lost");
    }

    #[tokio::test]
    async fn leadership_follows_the_elector() {
        let (sender, receiver) = watch::channel(false);
        let mut leadership = Leadership(receiver);
        assert!(!leadership.is_leading());
        sender.send_replace(true);
        assert!(leadership.gained().await);
        sender.send_replace(false);
        leadership.lost().await;
        drop(sender);
        assert!(!leadership.gained().await, "an elector that stopped leads no more");
    }
}
