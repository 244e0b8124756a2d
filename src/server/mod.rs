//! The server's life: binding, the TLS accept loop with its bounds, the probe server
//! beside it, the reconciler, the Lease's elector and certificate reloads as background
//! tasks, and the drain on SIGTERM. What a request gets is in [`crate::api`].
//!
//! What a client of the admission port can hold is bounded: connections (a semaphore
//! before `accept`), the TLS handshake and each request's headers (`idle_timeout`), idle
//! keep-alive connections (closed after `idle_timeout`), each connection's buffers
//! ([`HEAD_LIMIT`], [`WINDOW`]), HTTP/2 streams per connection, and requests admitted and
//! in flight with their bodies (see [`crate::api`]). [`Limits`] adds up the memory.

use std::{
    future::IntoFuture,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::Request,
    http::{HeaderValue, Version, header::CONNECTION},
};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use tokio::{
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use crate::{
    Config, Error, Result,
    api::{self, AppState},
    certs::reload::CertStore,
    certs::renewal::Renewer,
    cluster::lease::{Elector, Leadership},
    cluster::namespaces::NamespaceCache,
    config::Limits,
    observe::events::Events,
    observe::metrics::Metrics,
    rules::Unavailable,
    rules::in_use::{InUseLookup, KubeInUse, finalizer::Holder},
    rules::worker::owners::Reconciler,
    rules::worker::reads::{ClusterLookup, KubeLookup},
    rules::worker::watch::PodCache,
};

/// The largest request head: HTTP/1.1's read buffer, HTTP/2's header list. An apiserver
/// sends a few hundred bytes.
pub const HEAD_LIMIT: usize = 16 * 1024;

/// HTTP/2 flow-control window, per stream and per connection: the body a client can make
/// a connection buffer before its request gets a slot. hyper's default is 1 MiB for each,
/// which would let every connection hold a megabyte.
pub const WINDOW: u32 = 64 * 1024;

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
        let bind = |addr: SocketAddr| listen(addr).map_err(|source| Error::Bind { addr, source });
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

/// The accept queue a listener asks the kernel for. Connections past `max_connections`
/// wait there and are served in turn. Tokio's default (128) drops the SYNs of a larger
/// burst, whose clients then retry after 1, 3, 7 … 63 s: a lottery in place of a queue.
/// Linux caps it at `net.core.somaxconn` (4096 by default), which Go servers such as the
/// apiserver ask for.
const ACCEPT_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind`: a restarted guard binds again at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
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
        let connections = Connections {
            acceptor,
            router: api::admission_router(state.clone()),
            limits: config.limits.clone(),
            draining,
            closing: CancellationToken::new(),
            tracker: TaskTracker::new(),
        };
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

/// The admission connections: how they are accepted, served and closed.
struct Connections {
    acceptor: TlsAcceptor,
    router: Router,
    limits: Limits,
    /// Cancelled when the drain starts: clients are told to take their next requests
    /// elsewhere while this server still answers (the Service's rules and the
    /// connections already open to this pod outlive its readiness by a moment).
    draining: CancellationToken,
    /// Cancelled when every connection should finish its requests and close.
    closing: CancellationToken,
    tracker: TaskTracker,
}

// === impl Connections ===

impl Connections {
    /// Accepts connections, at most `max_connections` at once, until `stop`.
    async fn accept_until(&self, listener: &TcpListener, stop: &CancellationToken) {
        let slots = Arc::new(Semaphore::new(self.limits.max_connections));
        let mut backoff = AcceptBackoff::default();
        loop {
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return,
                },
                () = stop.cancelled() => return,
            };
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, say: wait instead of spinning.
                        let pause = backoff.next();
                        tracing::warn!(%error, ?pause, "accept failed");
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                },
                () = stop.cancelled() => return,
            };
            backoff = AcceptBackoff::default();
            self.tracker.spawn(self.serve(tcp, peer, slot));
        }
    }

    /// Serves one connection until it ends, is idle for too long, or the server closes.
    fn serve(&self, tcp: TcpStream, peer: SocketAddr, slot: OwnedSemaphorePermit) -> impl Future<Output = ()> + use<> {
        let (acceptor, router, limits, draining, closing) = (
            self.acceptor.clone(),
            self.router.clone(),
            self.limits.clone(),
            self.draining.clone(),
            self.closing.clone(),
        );
        async move {
            let _slot = slot;
            // An answer written in more than one piece (the TLS records of an HTTP/2
            // response's frames) must not wait for the apiserver's delayed ACK (40 ms on
            // Linux): Go's servers and clients set it too.
            if let Err(error) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, %error, "cannot set TCP_NODELAY");
            }
            let tls = match tokio::time::timeout(limits.idle_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => return tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let activity = Arc::new(Activity::new());
            let service = {
                let (activity, draining) = (activity.clone(), draining.clone());
                tower::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let busy = activity.begin();
                    let http1 = request.version() < Version::HTTP_2;
                    if !http1 {
                        activity.http2.store(true, Ordering::SeqCst);
                    }
                    let (router, draining) = (router.clone(), draining.clone());
                    async move {
                        let mut response = router.oneshot(request.map(axum::body::Body::new)).await;
                        // While draining, an HTTP/1.1 client is told to open its next
                        // connection elsewhere: closing the connection ourselves later
                        // could cross its next request on the wire.
                        if let Ok(response) = &mut response
                            && http1
                            && draining.is_cancelled()
                        {
                            response
                                .headers_mut()
                                .insert(CONNECTION, HeaderValue::from_static("close"));
                        }
                        drop(busy);
                        response
                    }
                })
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                // Also closes a keep-alive connection that sends no new request in time.
                .header_read_timeout(limits.idle_timeout)
                .max_buf_size(HEAD_LIMIT);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.max_streams)
                .max_header_list_size(HEAD_LIMIT as u32)
                .initial_stream_window_size(WINDOW)
                .initial_connection_window_size(WINDOW)
                .keep_alive_interval(limits.idle_timeout)
                .keep_alive_timeout(limits.idle_timeout);
            let connection = builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(service));
            tokio::pin!(connection);
            let mut ticks = tokio::time::interval(limits.idle_timeout / 4);
            let mut closing_asked = false;
            let mut drain_seen = false;
            loop {
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%peer, %error, "connection ended with an error");
                        }
                        return;
                    }
                    // HTTP/2 has its own way to move a client: GOAWAY, sent by the
                    // graceful shutdown, with the streams in flight still answered.
                    () = draining.cancelled(), if !drain_seen && !closing_asked => {
                        drain_seen = true;
                        if activity.http2.load(Ordering::SeqCst) {
                            closing_asked = true;
                            connection.as_mut().graceful_shutdown();
                        }
                    }
                    () = closing.cancelled(), if !closing_asked => {
                        closing_asked = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    _ = ticks.tick(), if !closing_asked => {
                        if activity.idle_for() >= limits.idle_timeout {
                            tracing::debug!(%peer, "closing an idle connection");
                            closing_asked = true;
                            connection.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        }
    }

    /// Asks every connection to finish and waits up to `timeout`; true when all did.
    async fn close(&self, timeout: Duration) -> bool {
        self.closing.cancel();
        self.tracker.close();
        tokio::time::timeout(timeout, self.tracker.wait()).await.is_ok()
    }
}

/// Requests in flight on one connection, and when the last one ended.
struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds from `start` to the end of the last request.
    last: AtomicU64,
    /// Whether the connection speaks HTTP/2 (seen on its first request).
    http2: AtomicBool,
}

/// Marks a request in flight until dropped.
struct Busy(Arc<Activity>);

// === impl Activity ===

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last: AtomicU64::new(0),
            http2: AtomicBool::new(false),
        }
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// How long the connection has had no request in flight.
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last.load(Ordering::SeqCst));
        self.start.elapsed().saturating_sub(last)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last.store(now, Ordering::SeqCst);
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Pauses after failed accepts: 10 ms, doubling up to 1 s.
#[derive(Default)]
struct AcceptBackoff(u32);

impl AcceptBackoff {
    fn next(&mut self) -> Duration {
        let pause = Duration::from_millis(10) * 2u32.pow(self.0.min(7));
        self.0 += 1;
        pause.min(Duration::from_secs(1))
    }
}
