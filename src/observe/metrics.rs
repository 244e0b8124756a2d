//! Prometheus metrics, all in one registry under the `cds_secret_guard` prefix.

use std::time::Instant;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::{Registry, Unit},
};

/// Every metric the guard exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    admission_duration: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    lookup_duration: Histogram,
    lookup_errors: Counter,
    label_reads: Family<SourceLabels, Counter>,
    in_use_reads: Family<SourceLabels, Counter>,
    in_use_finalizer_writes: Family<ActionLabels, Counter>,
    in_use_finalizer_errors: Counter,
    certificate_reloads: Family<ResultLabels, Counter>,
    certificate_expiry: Gauge,
    ca_expiry: Gauge,
    reconcile_errors: Counter,
    events_dropped: Counter,
    references_added: Counter,
    adoption_conflicts: Counter,
    adoption_latency: Histogram,
    leader: Gauge,
}

/// The CDS rules: worker secrets' deletes and worker pods' creates.
pub const WORKER_RULES: &str = "worker";
/// In-use protection's rules: opted-in Secrets' and ConfigMaps' deletes.
pub const IN_USE_RULES: &str = "in-use";

/// Labels of `admission_decisions_total`. Static strings: counting a decision
/// allocates nothing.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The rules that decided: [`WORKER_RULES`] or [`IN_USE_RULES`].
    pub rules: &'static str,
    /// The admission operation (DELETE, CREATE).
    pub operation: &'static str,
    /// allow, deny, warn (denied in warn mode), patch, skip.
    pub decision: &'static str,
    /// The rule's reason code.
    pub reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// Records the duration of an admission request when dropped.
pub struct AdmissionTimer<'a> {
    histogram: &'a Family<EndpointLabels, Histogram, fn() -> Histogram>,
    endpoint: &'static str,
    start: Instant,
}

/// Records the duration and outcome of a quorum read when dropped.
pub struct LookupTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
    failed: bool,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. ~4 s: admission answers in well under a millisecond without lookups
    // and is bounded by the request deadline with them.
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

// === impl Metrics ===

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cds_secret_guard");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "admission_decisions",
            "Admission decisions by operation, decision and reason",
            decisions.clone(),
        );
        let admission_duration = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "admission_duration",
            "Time to answer an admission request",
            Unit::Seconds,
            admission_duration.clone(),
        );
        let lookup_duration = latency_histogram();
        registry.register_with_unit(
            "lookup_duration",
            "Time of the quorum reads behind one decision",
            Unit::Seconds,
            lookup_duration.clone(),
        );
        let lookup_errors = Counter::default();
        registry.register(
            "lookup_errors",
            "Quorum reads that failed or timed out",
            lookup_errors.clone(),
        );
        let label_reads = Family::<SourceLabels, Counter>::default();
        registry.register(
            "worker_label_reads",
            "Reads of the pods carrying a worker label, by source: the pod watch once caught up with a quorum revision, or a LIST",
            label_reads.clone(),
        );
        let in_use_reads = Family::<SourceLabels, Counter>::default();
        registry.register(
            "in_use_user_reads",
            "Reads of the pods that use an opted-in object, by source: the pod index once caught up with a quorum revision, or a LIST",
            in_use_reads.clone(),
        );
        let in_use_finalizer_writes = Family::<ActionLabels, Counter>::default();
        registry.register(
            "in_use_finalizer_writes",
            "Writes of deferred deletes' finalizer, by action: add (a pod uses an object opted in to defer), remove (its deferred delete completes, or it was opted out)",
            in_use_finalizer_writes.clone(),
        );
        for action in ["add", "remove"] {
            let _ = in_use_finalizer_writes.get_or_create(&ActionLabels { action });
        }
        let in_use_finalizer_errors = Counter::default();
        registry.register(
            "in_use_finalizer_errors",
            "Failed attempts at adding or removing deferred deletes' finalizer (each is retried)",
            in_use_finalizer_errors.clone(),
        );
        let certificate_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "certificate_reloads",
            "Serving certificate reloads by result",
            certificate_reloads.clone(),
        );
        // At 0 from the start: a series that first appears at 1 is no increase to
        // Prometheus, and the first rotation would not show.
        for result in ["success", "error"] {
            let _ = certificate_reloads.get_or_create(&ResultLabels { result });
        }
        let certificate_expiry = Gauge::default();
        registry.register_with_unit(
            "certificate_expiry_timestamp",
            "When the serving certificate in use expires (Unix time)",
            Unit::Seconds,
            certificate_expiry.clone(),
        );
        let ca_expiry = Gauge::default();
        registry.register_with_unit(
            "certificate_ca_expiry_timestamp",
            "When the CA signing the guard's serving certificates expires (Unix time; 0 unless the guard renews its certificates)",
            Unit::Seconds,
            ca_expiry.clone(),
        );
        let reconcile_errors = Counter::default();
        registry.register(
            "reconcile_errors",
            "Adoption attempts that failed and will be retried",
            reconcile_errors.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Kubernetes Events not recorded because the queue to the apiserver was full",
            events_dropped.clone(),
        );
        let references_added = Counter::default();
        registry.register(
            "owner_references_added",
            "ownerReferences written to worker secrets",
            references_added.clone(),
        );
        let adoption_conflicts = Counter::default();
        registry.register(
            "owner_reference_conflicts",
            "ownerReference writes that lost a race and were retried",
            adoption_conflicts.clone(),
        );
        let adoption_latency = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        registry.register_with_unit(
            "adoption_latency",
            "Time from a pod's creation to its secret's ownerReference",
            Unit::Seconds,
            adoption_latency.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica does the adoption work (it holds the lease, or runs without one), else 0",
            leader.clone(),
        );
        let build = Info::new(vec![
            ("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            ("commit".to_owned(), env!("CDS_GUARD_COMMIT").to_owned()),
        ]);
        registry.register("build", "Build information", build);
        Self {
            registry,
            decisions,
            admission_duration,
            lookup_duration,
            lookup_errors,
            label_reads,
            in_use_reads,
            in_use_finalizer_writes,
            in_use_finalizer_errors,
            certificate_reloads,
            certificate_expiry,
            ca_expiry,
            reconcile_errors,
            events_dropped,
            references_added,
            adoption_conflicts,
            adoption_latency,
            leader,
        }
    }
}

impl Metrics {
    /// Counts one admission decision.
    pub fn decision(&self, rules: &'static str, operation: &'static str, decision: &'static str, reason: &'static str) {
        let labels = DecisionLabels {
            rules,
            operation,
            decision,
            reason,
        };
        self.decisions.get_or_create(&labels).inc();
    }

    /// Creates these decisions' series at 0, so that the first of each is an increase
    /// Prometheus can see (a series that first appears at 1 is none).
    pub fn decisions_from_zero(&self, series: impl IntoIterator<Item = DecisionLabels>) {
        for labels in series {
            let _ = self.decisions.get_or_create(&labels);
        }
    }

    /// Starts timing an admission request on `endpoint`.
    pub fn time_admission(&self, endpoint: &'static str) -> AdmissionTimer<'_> {
        AdmissionTimer {
            histogram: &self.admission_duration,
            endpoint,
            start: Instant::now(),
        }
    }

    /// Starts timing one quorum read. A read dropped before it finished (its deadline
    /// passed) counts as an error.
    pub fn time_lookup(&self) -> LookupTimer<'_> {
        LookupTimer {
            metrics: self,
            start: Instant::now(),
            failed: true,
        }
    }

    /// Counts a read of a worker label's pods: from the caught-up pod watch, or a LIST.
    pub fn label_read(&self, from_watch: bool) {
        let source = if from_watch { "watch" } else { "list" };
        self.label_reads.get_or_create(&SourceLabels { source }).inc();
    }

    /// Counts a read of the pods that use an opted-in object, by where it was answered.
    pub fn in_use_read(&self, from_index: bool) {
        let source = if from_index { "index" } else { "list" };
        self.in_use_reads.get_or_create(&SourceLabels { source }).inc();
    }

    /// Counts a write of the deferred deletes' finalizer: `add` or `remove`.
    pub fn in_use_finalizer(&self, action: &'static str) {
        self.in_use_finalizer_writes
            .get_or_create(&ActionLabels { action })
            .inc();
    }

    /// Counts a failed attempt at adding or removing the finalizer.
    pub fn in_use_finalizer_error(&self) {
        self.in_use_finalizer_errors.inc();
    }

    /// Counts a certificate reload attempt.
    pub fn certificate_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.certificate_reloads.get_or_create(&ResultLabels { result }).inc();
    }

    /// Records when the serving certificate in use expires.
    pub fn certificate_expiry(&self, not_after: i64) {
        self.certificate_expiry.set(not_after);
    }

    /// Records when the CA signing serving certificates expires.
    pub fn ca_expiry(&self, not_after: i64) {
        self.ca_expiry.set(not_after);
    }

    /// Counts an adoption attempt that failed.
    pub fn reconcile_error(&self) {
        self.reconcile_errors.inc();
    }

    /// Counts an Event dropped for a full queue.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// Counts an ownerReference written.
    pub fn reference_added(&self) {
        self.references_added.inc();
    }

    /// Counts an ownerReference write that conflicted with another writer.
    pub fn adoption_conflict(&self) {
        self.adoption_conflicts.inc();
    }

    /// Records the time from a pod's creation to its secret's ownerReference.
    pub fn adoption_latency(&self, seconds: f64) {
        self.adoption_latency.observe(seconds);
    }

    /// Records whether this replica does the adoption work.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl Drop for AdmissionTimer<'_> {
    fn drop(&mut self) {
        let labels = EndpointLabels {
            endpoint: self.endpoint,
        };
        self.histogram
            .get_or_create(&labels)
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl LookupTimer<'_> {
    /// Marks the read finished, successfully or not.
    pub fn finish(mut self, failed: bool) {
        self.failed = failed;
    }
}

impl Drop for LookupTimer<'_> {
    fn drop(&mut self) {
        self.metrics.lookup_duration.observe(self.start.elapsed().as_secs_f64());
        if self.failed {
            self.metrics.lookup_errors.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_certificate_reload_series_start_at_zero() {
        let metrics = Metrics::default();
        let text = metrics.encode().expect("encodes");
        for result in ["success", "error"] {
            let line = format!("cds_secret_guard_certificate_reloads_total{{result=\"{result}\"}} 0\n");
            assert!(text.contains(&line), "no {line:?} in\n{text}");
        }
        metrics.certificate_reload(true);
        let text = metrics.encode().expect("encodes");
        assert!(text.contains("cds_secret_guard_certificate_reloads_total{result=\"success\"} 1\n"));
    }

    #[test]
    fn decisions_given_start_at_zero_and_count_on() {
        let metrics = Metrics::default();
        let labels = DecisionLabels {
            rules: WORKER_RULES,
            operation: "DELETE",
            decision: "deny",
            reason: "pod-live",
        };
        metrics.decisions_from_zero([labels.clone()]);
        let line = |n: u32| {
            format!(
                "cds_secret_guard_admission_decisions_total{{rules=\"worker\",operation=\"DELETE\",decision=\"deny\",reason=\"pod-live\"}} {n}\n"
            )
        };
        assert!(metrics.encode().expect("encodes").contains(&line(0)));
        metrics.decision(labels.rules, labels.operation, labels.decision, labels.reason);
        metrics.decisions_from_zero([labels]);
        assert!(metrics.encode().expect("encodes").contains(&line(1)));
    }
}
