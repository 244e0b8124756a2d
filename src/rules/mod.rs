//! The rule sets: the CDS worker-secret rules ([`worker`]) and in-use protection
//! ([`in_use`]), and the settings they share.

use std::time::Duration;

/// Declares a rule set's reasons: the enum, `ALL` (for the counters to start at 0), the
/// stable code each is written as in logs, metrics and audit annotations, and `Display`
/// as that code.
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$doc:meta])* $variant:ident => $code:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$doc])* $variant,)+
        }

        impl $name {
            /// Every reason, for the decision counters to start at 0.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The stable code of this reason.
            pub fn code(self) -> &'static str {
                match self {
                    $(Self::$variant => $code,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.code())
            }
        }
    };
}

pub mod in_use;
mod reads;
pub mod worker;

pub use reads::{Bounded, Unavailable};

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

/// A rule set's decision on one delete, as the tail that answers sees it: the audit line,
/// the apiserver's audit annotations, the Event, the metric and the answer are all
/// written from it, the same way for every rule set.
pub trait Decision {
    /// The rule set, as the metrics' `rules` label names it.
    const RULES: &'static str;
    /// What the audit line calls the request: "<this> allow", "<this> deny".
    const REQUEST: &'static str;

    /// What every decision says.
    fn outcome(&self) -> Outcome<'_>;

    /// Whether the delete may proceed.
    fn allowed(&self) -> bool {
        self.outcome().allowed
    }

    /// The rule that decided, as a stable code.
    fn reason(&self) -> &'static str {
        self.outcome().reason
    }

    /// What the user is told.
    fn message(&self) -> &str {
        self.outcome().message
    }

    /// Whether the decision is audited; a delete of nothing the rules protect is not.
    fn audited(&self) -> bool {
        true
    }

    /// Whether the delete goes through but completes later: its answer warns, and an
    /// Event says so.
    fn deferred(&self) -> bool {
        false
    }

    /// Whether the answer carries the audit annotations: a denial always does.
    fn annotated(&self) -> bool {
        !self.allowed()
    }

    /// What the audit line records of the object `name` of `kind`, and of the decision,
    /// beyond what every line has.
    fn audit_fields<'a>(&'a self, kind: &'static str, name: &'a str) -> AuditFields<'a>;

    /// Adds the apiserver's audit annotations beyond `decision`, `reason` and `message`.
    fn annotate(&self, annotations: &mut Vec<(&'static str, String)>);
}

/// A rule set's decision on one delete: what every decision says, with what its rules
/// found (`F`) for the audit line and the annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict<R, F> {
    /// Whether the delete may proceed.
    pub allowed: bool,
    /// The rule that decided.
    pub reason: R,
    /// What a `kubectl delete` user is told.
    pub message: String,
    /// What the rules found.
    pub found: F,
}

/// What every decision says, whichever rule set made it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome<'a> {
    /// Whether the delete may proceed.
    pub allowed: bool,
    /// The rule that decided, as a stable code.
    pub reason: &'static str,
    /// What the user is told.
    pub message: &'a str,
}

/// The fields of an audit line that say what a decision was on and what it found; a
/// field left `None` is not written.
#[derive(Debug, Default)]
pub struct AuditFields<'a> {
    /// The rule set, when it is not the worker rules (whose lines predate the field).
    pub rules: Option<&'static str>,
    /// A worker secret's name.
    pub secret: Option<&'a str>,
    /// The object's kind, where the line names objects of several kinds.
    pub kind: Option<&'static str>,
    /// The object's name, with its kind.
    pub object: Option<&'a str>,
    /// The worker a secret belongs to.
    pub worker: Option<&'a str>,
    /// The pod that protects a worker secret, and its uid.
    pub pod: Option<(&'a str, &'a str)>,
    /// A worker secret's age.
    pub secret_age_seconds: Option<u64>,
    /// The pods found to keep an object.
    pub pods: Option<String>,
}

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
