//! The transport: TLS connections accepted and served within their bounds.
//!
//! What a client of the admission port can hold is bounded: connections (a semaphore
//! before `accept`), the TLS handshake and each request's headers (`idle_timeout`), idle
//! keep-alive connections (closed after `idle_timeout`), each connection's buffers
//! ([`HEAD_LIMIT`], [`WINDOW`]), HTTP/2 streams per connection, and requests admitted and
//! in flight with their bodies (see [`crate::api`]). [`Limits`] adds up the memory.

use std::{
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

use crate::config::Limits;

/// The largest request head: HTTP/1.1's read buffer, HTTP/2's header list. An apiserver
/// sends a few hundred bytes.
pub const HEAD_LIMIT: usize = 16 * 1024;

/// HTTP/2 flow-control window, per stream and per connection: the body a client can make
/// a connection buffer before its request gets a slot. hyper's default is 1 MiB for each,
/// which would let every connection hold a megabyte.
pub const WINDOW: u32 = 64 * 1024;

/// The accept queue a listener asks the kernel for. Connections past `max_connections`
/// wait there and are served in turn. Tokio's default (128) drops the SYNs of a larger
/// burst, whose clients then retry after 1, 3, 7 … 63 s: a lottery in place of a queue.
/// Linux caps it at `net.core.somaxconn` (4096 by default), which Go servers such as the
/// apiserver ask for.
const ACCEPT_BACKLOG: u32 = 4096;

pub(super) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
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

/// The admission connections: how they are accepted, served and closed.
pub(super) struct Connections {
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
    /// The connections `acceptor` and `router` serve within `limits`; `draining` is
    /// cancelled when the drain starts.
    pub(super) fn new(acceptor: TlsAcceptor, router: Router, limits: Limits, draining: CancellationToken) -> Self {
        Self {
            acceptor,
            router,
            limits,
            draining,
            closing: CancellationToken::new(),
            tracker: TaskTracker::new(),
        }
    }

    /// Accepts connections, at most `max_connections` at once, until `stop`.
    pub(super) async fn accept_until(&self, listener: &TcpListener, stop: &CancellationToken) {
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
    pub(super) async fn close(&self, timeout: Duration) -> bool {
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
