//! The composition root: what runs, wired from the [`Config`] (the reads, the watches,
//! the reconciler, the holder of deferred deletes, the Lease's elector, the certificate's
//! reload or renewal), and the server's life: binding, serving, and the drain on SIGTERM.
//! How connections are accepted and bounded is in `transport`; what a request gets is
//! in [`crate::api`].

mod transport;

pub use transport::{HEAD_LIMIT, WINDOW};

use std::{
    future::IntoFuture,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::Router;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use self::transport::Connections;
use crate::{
    Config, Error, Result,
    api::{self, AppState},
    certs::reload::CertStore,
    certs::renewal::Renewer,
    cluster::lease::{Elector, Leadership},
    cluster::namespaces::NamespaceCache,
    observe::events::Events,
    observe::metrics::Metrics,
    rules::Unavailable,
    rules::in_use::{InUseLookup, KubeInUse, finalizer::Holder},
    rules::worker::owners::Reconciler,
    rules::worker::reads::{ClusterLookup, KubeLookup},
    rules::worker::watch::PodCache,
};

/// The guard's server.
pub struct Server {
    config: Config,
    state: Arc<AppState>,
    adoption: Option<Adoption>,
    /// The client certificate renewal uses (`--certificate-secret`).
    client: Option<kube::Client>,
}

/// The Lease holder's work: the reconciler, the finalizer of deferred deletes, and when
/// this replica runs them.
struct Adoption {
    reconciler: Arc<Reconciler>,
    /// With in-use protection on.
    holder: Option<Arc<Holder>>,
    leadership: Leadership,
    /// The Lease's elector (`--lease`); without one, this replica always adopts.
    elector: Option<Elector>,
}

/// A server whose sockets are bound, ready to serve.
pub struct Bound {
    server: Server,
    admission: TcpListener,
    probes: TcpListener,
    certs: Arc<CertStore>,
}

// === impl Server ===

impl Server {
    /// Builds the server with a Kubernetes client from the standard places (`KUBECONFIG`,
    /// in-cluster): quorum reads, the ownerReference reconciler and Events. Without any
    /// configuration it still starts, and fails closed.
    pub async fn from_config(config: Config) -> Self {
        match kube::Client::try_default().await {
            Ok(client) => {
                let metrics = Arc::new(Metrics::default());
                let events = Events::spawn(client.clone(), metrics.clone());
                let pods = PodCache::default();
                let reconciler = Reconciler::new(
                    client.clone(),
                    config.worker.clone(),
                    config.rules.namespaces.clone(),
                    metrics.clone(),
                    events.clone(),
                    pods.clone(),
                );
                let client_for_renewal = client.clone();
                let (elector, leadership) = match config.lease.clone() {
                    Some(lease) => {
                        let (elector, leadership) = Elector::new(client.clone(), lease, metrics.clone());
                        (Some(elector), leadership)
                    }
                    None => {
                        metrics.leader(true);
                        (None, Leadership::always())
                    }
                };
                let (namespaces, namespace_watches) = NamespaceCache::watching(&client, &config.rules.namespaces);
                tokio::spawn(namespace_watches);
                let in_use = KubeInUse::new(client.clone());
                let (in_use, holder) = if config.in_use_protection {
                    let (in_use, pod_watches) =
                        in_use.watching(&config.rules.namespaces, namespaces.clone(), metrics.clone());
                    tokio::spawn(pod_watches);
                    let holder = Holder::new(
                        client.clone(),
                        in_use.clone(),
                        namespaces.clone(),
                        config.in_use_mode,
                        config.rules.namespaces.clone(),
                        metrics.clone(),
                        events.clone(),
                    );
                    (in_use, Some(holder))
                } else {
                    (in_use, None)
                };
                let adoption = Adoption {
                    reconciler,
                    holder,
                    leadership,
                    elector,
                };
                let lookup = KubeLookup::new(client)
                    .with_pod_cache(pods, metrics.clone())
                    .with_namespaces(namespaces);
                let in_use = Arc::new(in_use);
                let mut server = Self::build(config, Arc::new(lookup), in_use, metrics, events, Some(adoption));
                server.client = Some(client_for_renewal);
                server
            }
            Err(error) => {
                tracing::error!(%error, "no Kubernetes client: every worker-secret delete will be denied");
                let unavailable = Arc::new(Unavailable(error.to_string()));
                Self::with_in_use(config, unavailable.clone(), unavailable)
            }
        }
    }

    /// Builds the server with the given cluster reads (tests pass a fake), without a
    /// reconciler or Events.
    pub fn new(config: Config, lookup: Arc<dyn ClusterLookup>) -> Self {
        let in_use = Arc::new(Unavailable("no in-use reads given".to_owned()));
        Self::with_in_use(config, lookup, in_use)
    }

    /// Builds the server with the given cluster reads and in-use protection's reads.
    pub fn with_in_use(config: Config, lookup: Arc<dyn ClusterLookup>, in_use: Arc<dyn InUseLookup>) -> Self {
        Self::build(
            config,
            lookup,
            in_use,
            Arc::new(Metrics::default()),
            Events::default(),
            None,
        )
    }

    fn build(
        config: Config,
        lookup: Arc<dyn ClusterLookup>,
        in_use: Arc<dyn InUseLookup>,
        metrics: Arc<Metrics>,
        events: Events,
        adoption: Option<Adoption>,
    ) -> Self {
        let state = Arc::new(AppState::new(&config, lookup, in_use, metrics, events));
        Self {
            config,
            state,
            adoption,
            client: None,
        }
    }

    /// The admission routes, without TLS.
    pub fn router(&self) -> Router {
        api::admission_router(self.state.clone())
    }

    /// The probe and metrics routes.
    pub fn probe_router(&self) -> Router {
        api::probe_router(self.state.clone())
    }

    /// Loads the certificate (a bad pair fails here; renewed, it comes later) and binds
    /// both sockets.
    pub async fn bind(self) -> Result<Bound> {
        let certs = match &self.config.renewal {
            Some(settings) => {
                settings.validate()?;
                CertStore::empty()
            }
            None => CertStore::load(&self.config.tls_cert, &self.config.tls_key)?,
        };
        let bind = |addr: SocketAddr| transport::listen(addr).map_err(|source| Error::Bind { addr, source });
        let admission = bind(self.config.listen)?;
        let probes = bind(self.config.probe_listen)?;
        Ok(Bound {
            server: self,
            admission,
            probes,
            certs,
        })
    }
}

// === impl Bound ===

impl Bound {
    /// The admission (TLS) address.
    pub fn admission_addr(&self) -> SocketAddr {
        self.admission.local_addr().unwrap_or(self.server.config.listen)
    }

    /// The probe address.
    pub fn probe_addr(&self) -> SocketAddr {
        self.probes.local_addr().unwrap_or(self.server.config.probe_listen)
    }

    /// Serves until `shutdown` is cancelled. Then `/readyz` says 503 while requests are
    /// still served for the drain delay, each client told to go elsewhere (HTTP/1.1
    /// answers say `Connection: close`, HTTP/2 connections get GOAWAY); then the listener
    /// closes, connections are asked to finish, and requests in flight get up to the
    /// shutdown timeout.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let Self {
            server,
            admission,
            probes,
            certs,
        } = self;
        let Server {
            config,
            state,
            adoption,
            client,
        } = server;
        let acceptor = TlsAcceptor::from(Arc::new(certs.server_config()?));
        // Renewal, like adoption, is the Lease holder's work; every replica serves.
        let leadership = adoption
            .as_ref()
            .map_or_else(Leadership::always, |adoption| adoption.leadership.clone());
        match (&config.renewal, client) {
            (Some(settings), Some(client)) => {
                let trusted = state.certificate_trusted.clone();
                let renewer = Renewer::new(client, settings.clone(), certs, trusted, state.metrics.clone());
                tokio::spawn(renewer.run(leadership, shutdown.clone()));
            }
            // Without a client nothing can be renewed: nothing is served, not ready.
            (Some(_), None) => tracing::error!("no Kubernetes client: no certificate to serve"),
            (None, _) => {
                tokio::spawn(certs.watch(config.tls_reload_interval, state.metrics.clone(), shutdown.clone()));
            }
        }
        // The elector releases the Lease as soon as `shutdown` comes, so that another
        // replica takes over while this one drains; it is waited for before the end.
        let mut elector = None;
        if let Some(Adoption {
            reconciler,
            holder,
            leadership,
            elector: lease,
        }) = adoption
        {
            elector = lease.map(|lease| tokio::spawn(lease.run(shutdown.clone())));
            if let Some(holder) = holder {
                tokio::spawn(holder.run(leadership.clone(), shutdown.clone()));
            }
            tokio::spawn(reconciler.run(leadership, shutdown.clone()));
        }
        let audit_done = CancellationToken::new();
        tokio::spawn(state.audit.clone().run(audit_done.clone()));

        // The probes outlive the admission server: /readyz says 503 while it drains.
        let probes_done = CancellationToken::new();
        let probe_task = tokio::spawn(
            axum::serve(probes, api::probe_router(state.clone()))
                .with_graceful_shutdown(probes_done.clone().cancelled_owned())
                .into_future(),
        );

        let stop_accepting = CancellationToken::new();
        let draining = CancellationToken::new();
        tokio::spawn({
            let (state, stop_accepting, drain) = (state.clone(), stop_accepting.clone(), config.limits.drain_delay);
            let (shutdown, draining) = (shutdown.clone(), draining.clone());
            async move {
                shutdown.cancelled().await;
                state.ready.store(false, Ordering::SeqCst);
                draining.cancel();
                tracing::info!(?drain, "shutdown: not ready, still serving while endpoints drain");
                tokio::time::sleep(drain).await;
                stop_accepting.cancel();
            }
        });

        if let Ok(addr) = admission.local_addr() {
            tracing::info!(%addr, "serving admission");
        }
        state.ready.store(true, Ordering::SeqCst);
        let connections = Connections::new(
            acceptor,
            api::admission_router(state.clone()),
            config.limits.clone(),
            draining,
        );
        connections.accept_until(&admission, &stop_accepting).await;
        drop(admission);

        tracing::info!("shutting down: finishing requests in flight");
        if !connections.close(config.shutdown_timeout).await {
            tracing::warn!("requests still in flight after the shutdown timeout");
        }
        if let Some(elector) = elector
            && tokio::time::timeout(Duration::from_secs(2), elector).await.is_err()
        {
            tracing::warn!("the lease was not released in time; it lapses");
        }
        audit_done.cancel();
        state.audit.flush_all();
        probes_done.cancel();
        match probe_task.await {
            Ok(result) => result.map_err(|source| Error::Bind {
                addr: config.probe_listen,
                source,
            }),
            Err(error) => Err(Error::Tls(format!("probe server task: {error}"))),
        }
    }
}
