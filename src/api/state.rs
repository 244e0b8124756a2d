//! What every handler shares: built once, passed as `Arc<AppState>`, cheap handles only.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use tokio::sync::Semaphore;

use crate::{
    Config,
    api::audit::AuditLog,
    config::Limits,
    observe::events::Events,
    observe::metrics::Metrics,
    rules::worker::reads::ClusterLookup,
    rules::{
        self, Bounded,
        in_use::{self, InUseLookup},
        worker,
    },
};

/// The state behind the admission and probe routes.
pub struct AppState {
    /// What the rule sets share.
    pub(crate) rules: rules::Settings,
    /// The worker-secret rules' own settings.
    pub(crate) worker: worker::Settings,
    /// Quorum reads, timed and counted.
    pub(crate) lookup: Bounded<dyn ClusterLookup>,
    /// In-use protection's reads, when it is on (`--in-use-protection`).
    pub(crate) in_use: Option<Bounded<dyn InUseLookup>>,
    /// What the opt-in label's `enabled` asks for (`--in-use-mode`).
    pub(crate) in_use_mode: in_use::Mode,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) audit: Arc<AuditLog>,
    /// Events on secrets; a side effect, never awaited.
    pub(crate) events: Events,
    pub(crate) request_timeout: Duration,
    pub(crate) mutation_timeout: Duration,
    pub(crate) limits: Limits,
    /// One permit per request admitted: waiting for a slot, read or answered.
    pub(crate) admitted: Semaphore,
    /// One permit (a slot) per request being read or answered.
    pub(crate) requests: Arc<Semaphore>,
    /// What `/readyz` says; false before serving and while draining.
    pub(crate) ready: AtomicBool,
    /// Whether the certificate served is one the webhooks trust: always, from files;
    /// as the renewer last checked, when the guard renews its certificates.
    pub(crate) certificate_trusted: Arc<AtomicBool>,
}

// === impl AppState ===

impl AppState {
    /// The state for `config`, reading the cluster through `lookup`, and through `in_use`
    /// for in-use protection when `config` turns it on.
    pub fn new(
        config: &Config,
        lookup: Arc<dyn ClusterLookup>,
        in_use: Arc<dyn InUseLookup>,
        metrics: Arc<Metrics>,
        events: Events,
    ) -> Self {
        metrics.decisions_from_zero(super::service::possible_decisions(config.rules.mode));
        if config.in_use_protection {
            metrics.decisions_from_zero(super::service::possible_in_use_decisions(config.rules.mode));
        }
        Self {
            rules: config.rules.clone(),
            worker: config.worker.clone(),
            lookup: Bounded::new(lookup, metrics.clone()),
            in_use: config.in_use_protection.then(|| Bounded::new(in_use, metrics.clone())),
            in_use_mode: config.in_use_mode,
            metrics,
            audit: Arc::new(AuditLog::new(config.audit_window)),
            events,
            request_timeout: config.request_timeout,
            mutation_timeout: config.mutation_timeout,
            limits: config.limits.clone(),
            admitted: Semaphore::new(config.limits.max_connections),
            requests: Arc::new(Semaphore::new(config.limits.max_requests)),
            ready: AtomicBool::new(false),
            certificate_trusted: Arc::new(AtomicBool::new(config.renewal.is_none())),
        }
    }
}
