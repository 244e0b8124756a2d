//! cds-secret-guard: a Kubernetes admission webhook that keeps a CDS worker's
//! configuration secret alive for as long as its pod may still need it.
//!
//! The library holds everything testable; `main.rs` only parses flags and calls in.
//! One module per concern:
//!
//! - [`cli`]: flags and environment variables, turned into a [`config::Config`];
//! - [`server`]: the server's life: TLS accept loop, connection bounds, drain;
//! - [`api`]: the admission and probe routes, their handlers and the services they call;
//! - [`admission`]: decoding AdmissionReviews and encoding responses;
//! - [`policy`]: the secret-DELETE rules (pure, apart from the lookups they ask for);
//! - [`mutation`]: the pod-CREATE patch (pure);
//! - [`in_use`]: the DELETE rules of opted-in Secrets and ConfigMaps (in-use protection);
//! - [`pod`]: what the guard reads of a pod, decoded into lean types, and the state the
//!   decisions need of it;
//! - [`references`]: the Secrets and ConfigMaps a pod names, as Kubernetes counts them;
//! - [`lookup`]: quorum reads of pods and secrets from the apiserver;
//! - [`pod_cache`]: the reconciler's pod watches as the decisions' cache, and when it
//!   may stand in for a quorum read ([`revision`]);
//! - [`namespaces`]: a watch of the namespaces, which lets a denial stand without a read;
//! - [`owner_refs`]: the reconciler that makes worker secrets owned by their pods;
//! - [`lease`]: the Lease that elects the one replica doing that work;
//! - [`audit`], [`events`], [`metrics`], [`telemetry`]: what operators see;
//! - [`tls`], [`certs`], [`webhooks`]: serving certificates and registration;
//! - [`renewal`]: certificates the guard makes, publishes and rotates itself;
//! - [`check`]: the report on protected secrets in a running system.

pub mod admission;
pub mod api;
pub mod audit;
pub mod certs;
pub mod check;
pub mod cli;
pub mod config;
pub mod events;
pub mod in_use;
pub mod lease;
pub mod lookup;
pub mod metrics;
pub mod mutation;
pub mod namespaces;
pub mod owner_refs;
pub mod pod;
pub mod pod_cache;
pub mod policy;
pub mod references;
pub mod renewal;
pub mod revision;
pub mod server;
pub mod telemetry;
pub mod tls;
pub mod webhooks;

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
