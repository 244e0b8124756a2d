//! cds-secret-guard: a Kubernetes admission webhook that keeps a CDS worker's
//! configuration secret alive for as long as its pod may still need it.
//!
//! The library holds everything testable; `main.rs` only parses flags and calls in.
//! ARCHITECTURE.md maps the folders; from the top down:
//!
//! - [`cli`]: the commands, their flags and what they print;
//! - [`server`]: what runs, wired from the [`config::Config`], and the transport: TLS,
//!   connection bounds, probes, drain;
//! - [`api`]: the admission routes, the AdmissionReview codec and the one tail every
//!   decision goes through: audit line, Event, metric, answer;
//! - [`rules`]: the rule sets, [`rules::worker`] (CDS worker secrets) and
//!   [`rules::in_use`] (in-use protection), with what they share;
//! - [`certs`]: development certificates, the serving certificate's reload, and the
//!   certificates the guard makes and rotates itself;
//! - [`cluster`]: what every rule set reads of the cluster: references, revisions,
//!   namespaces, the Lease;
//! - [`observe`]: metrics, Events, the log.

pub mod api;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod observe;
pub mod rules;
pub mod server;

#[cfg(test)]
pub(crate) mod fixtures;

pub use config::Config;
pub use server::Server;

/// Everything that can go wrong outside of a single admission decision.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TLS certificate or key could not be read or used.
    #[error("TLS: {0}")]
    Tls(String),

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: std::path::PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },

    /// A socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },

    /// Generating certificates failed.
    #[error("generating certificates: {0}")]
    Certs(#[from] rcgen::Error),

    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),

    /// A Kubernetes API call did not answer in time.
    #[error("Kubernetes API did not answer within {0:?}")]
    Timeout(std::time::Duration),

    /// No Kubernetes client could be configured (no kubeconfig, not in a cluster).
    #[error("no Kubernetes client configuration: {0}")]
    KubeConfig(String),

    /// A write kept conflicting with other writers.
    #[error("conflict: {0}")]
    Conflict(String),

    /// A command-line value that cannot be used.
    #[error("{0}")]
    Usage(String),

    /// The guard could not be called through its Service in time (`wait`).
    #[error("the guard could not be called at {url} within {within:?}: {last}")]
    NotCallable {
        /// Where it was called.
        url: String,
        /// How long `wait` tried.
        within: std::time::Duration,
        /// What the last call met.
        last: String,
    },

    /// Serialising output failed.
    #[error("serialising: {0}")]
    Serialize(String),
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager of every write the guard makes: the apiserver's managedFields, and
/// a server-side apply that conflicts with the guard (a `helm upgrade` rendering the
/// caBundle the guard keeps), name it.
pub const FIELD_MANAGER: &str = "cds-secret-guard";
