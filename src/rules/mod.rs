//! The rule sets: the CDS worker-secret rules ([`worker`]) and in-use protection
//! ([`in_use`]), and the settings they share.

use std::time::Duration;

pub mod in_use;
pub mod worker;

/// What every rule set shares: who is exempt, which namespaces are protected, whether
/// denials are enforced, and how long the reads behind one decision may take.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Deadline of the apiserver reads behind one decision.
    pub lookup_timeout: Duration,
    /// Users whose deletes are not checked.
    pub exempt_users: Vec<String>,
    /// Groups whose deletes are not checked.
    pub exempt_groups: Vec<String>,
    /// The namespaces the guard watches and protects; empty means all.
    pub namespaces: Vec<String>,
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

/// Reads that always fail: the guard without a Kubernetes client still starts, answers,
/// and fails closed. Each rule set's reads are implemented for it.
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

// === impl Settings ===

impl Settings {
    /// Whether the guard protects objects in `namespace`.
    pub fn watches(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Whether the requester may delete protected objects without checks.
    pub fn is_exempt(&self, username: Option<&str>, groups: &[String]) -> bool {
        username.is_some_and(|user| self.exempt_users.iter().any(|u| u == user))
            || groups.iter().any(|g| self.exempt_groups.contains(g))
    }

    /// Whether a denial is enforced, or only warned of.
    pub fn enforced(&self) -> bool {
        self.mode == Mode::Enforce
    }
}
