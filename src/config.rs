//! The guard's configuration, built once from the command line.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// TLS admission address.
    pub listen: SocketAddr,
    /// Plain-HTTP probe and metrics address.
    pub probe_listen: SocketAddr,
    /// Serving certificate file.
    pub tls_cert: PathBuf,
    /// Serving key file.
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Deadline of one admission request.
    pub request_timeout: Duration,
    /// Grace given to in-flight requests on SIGTERM.
    pub shutdown_timeout: Duration,
    /// The admission policy.
    pub policy: PolicyConfig,
}

/// What the admission rules depend on.
#[derive(Debug, Clone)]
pub struct PolicyConfig {
    /// A worker secret younger than this is never deleted.
    pub grace_period: Duration,
    /// Deadline of the apiserver reads behind one decision.
    pub lookup_timeout: Duration,
    /// Name prefixes of protected secrets.
    pub secret_prefixes: Vec<String>,
    /// Label naming the worker.
    pub worker_label: String,
    /// Label naming the hatchery.
    pub hatchery_label: String,
    /// Users whose deletes are not checked.
    pub exempt_users: Vec<String>,
    /// Groups whose deletes are not checked.
    pub exempt_groups: Vec<String>,
    /// Enforce or only warn.
    pub mode: Mode,
}

/// Whether denials are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Deny what the rules deny.
    Enforce,
    /// Allow everything, but return the denials as warnings and audit annotations.
    Warn,
}

// === impl PolicyConfig ===

impl PolicyConfig {
    /// The worker a secret belongs to, if it is protected: the worker label's value,
    /// else the name after a protected prefix.
    pub fn worker_of_secret(&self, meta: &ObjectMeta) -> Option<String> {
        let labelled = meta.labels.as_ref().and_then(|labels| labels.get(&self.worker_label));
        match labelled {
            Some(worker) if !worker.is_empty() => Some(worker.clone()),
            _ => self.worker_of_secret_name(meta.name.as_deref()?),
        }
    }

    /// The worker named by a protected secret name (`cds-worker-config-<worker>`).
    pub fn worker_of_secret_name(&self, name: &str) -> Option<String> {
        self.secret_prefixes
            .iter()
            .filter_map(|prefix| name.strip_prefix(prefix.as_str()))
            .find(|worker| !worker.is_empty())
            .map(str::to_owned)
    }

    /// Whether the requester may delete protected secrets without checks.
    pub fn is_exempt(&self, username: Option<&str>, groups: &[String]) -> bool {
        username.is_some_and(|user| self.exempt_users.iter().any(|u| u == user))
            || groups.iter().any(|g| self.exempt_groups.contains(g))
    }
}
