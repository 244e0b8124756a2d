//! The guard's configuration, built once from the command line.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

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
    /// Certificates renewed by the guard itself, instead of the files.
    pub renewal: Option<crate::certs::renewal::Settings>,
    /// Deadline of one admission request, from its first byte to its answer.
    pub request_timeout: Duration,
    /// Deadline of a pod CREATE review (the pod webhook waits 2 s at most).
    pub mutation_timeout: Duration,
    /// Identical audit lines within this window are summarised in one line.
    pub audit_window: Duration,
    /// Grace given to in-flight requests on SIGTERM, once the drain delay is over.
    pub shutdown_timeout: Duration,
    /// How the admission server bounds what clients may hold.
    pub limits: Limits,
    /// What every rule set shares: exemptions, scope, mode, lookup deadline.
    pub rules: crate::rules::Settings,
    /// The worker-secret rules' own settings.
    pub worker: crate::rules::worker::Settings,
    /// The Lease that elects the one replica doing the adoption work; without one, every
    /// replica does it.
    pub lease: Option<crate::cluster::lease::LeaseConfig>,
    /// Whether `/validate-in-use` decides (in-use protection of opted-in Secrets and
    /// ConfigMaps); off, it denies what reaches it, saying so.
    pub in_use_protection: bool,
    /// What the delete of an object opted in with `enabled` gets while pods use it.
    pub in_use_mode: crate::rules::in_use::Mode,
}

/// What any client of the admission port may hold at once. Memory under abuse is bounded
/// by `max_requests × body_limit` for the bodies being read, plus per connection its TLS
/// buffers, a request head ([`HEAD_LIMIT`](crate::server::HEAD_LIMIT)) and an HTTP/2
/// window ([`WINDOW`](crate::server::WINDOW)), plus the head of each request waiting for
/// a slot. With the defaults: 32 MiB of bodies and under 100 KiB per connection (25 MiB)
/// over the process's own 27 MiB. In its pod on the node, `make soak` measures about
/// 90 MiB with all of it taken, under the Deployment's 128 MiB (docs/design/soak.md).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections; past it, new ones wait in the kernel's accept queue. Also the
    /// requests admitted at once (waiting for a slot or served): past it, 503 at once.
    pub max_connections: usize,
    /// Requests being read or answered at once, over all connections and streams.
    pub max_requests: usize,
    /// HTTP/2 streams open at once on one connection.
    pub max_streams: u32,
    /// Largest request body.
    pub body_limit: usize,
    /// Time a client has to finish its TLS handshake, and then to send a request's
    /// headers; a keep-alive connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// After SIGTERM: how long `/readyz` says 503 while requests are still served, so
    /// that endpoints stop sending traffic before the listener closes.
    pub drain_delay: Duration,
}

// === impl Limits ===

impl Default for Limits {
    fn default() -> Self {
        Self {
            // An apiserver multiplexes its calls over a few HTTP/2 connections.
            max_connections: 256,
            max_requests: 16,
            max_streams: 32,
            // The largest object etcd stores is 1.5 MiB; its review is a little larger.
            body_limit: 2 * 1024 * 1024,
            idle_timeout: Duration::from_secs(10),
            drain_delay: Duration::from_secs(5),
        }
    }
}

// === impl Config ===

impl Config {
    /// Checks what the flags cannot check one by one.
    pub fn validate(&self) -> crate::Result<()> {
        self.lease
            .as_ref()
            .map_or(Ok(()), crate::cluster::lease::LeaseConfig::validate)
    }
}
