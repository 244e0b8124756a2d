//! Abuse of the admission port, against the real server over TLS: slow headers, slow
//! bodies, thousands of idle connections, an HTTP/2 stream flood, plain HTTP and TLS 1.1
//! on the TLS port, oversize bodies, memory under load and the drain on SIGTERM (the last
//! two against the real binary). Every test also checks that a valid AdmissionReview
//! keeps being answered, during the abuse and after it.
//!
//! The in-process servers run with small bounds (see [`limits`]) so that every timeout
//! fires within seconds; the binary runs with its defaults where memory is measured.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use cds_secret_guard::{Server, certs, config::Limits};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use serde_json::Value;
use testkit::{attack::*, fake::*};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
    time::{Instant, sleep, timeout},
};
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

/// Deadline of a whole request in the in-process servers.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Small bounds, so that abuse hits them quickly and every timeout fires within seconds.
/// The idle timeout (also the TLS handshake's) leaves a busy machine time to handshake;
/// the tests of idle connections shorten it.
fn limits() -> Limits {
    Limits {
        max_connections: 64,
        max_requests: 4,
        max_streams: 8,
        body_limit: 64 * 1024,
        idle_timeout: Duration::from_secs(5),
        drain_delay: Duration::from_secs(1),
    }
}

/// [`limits`] with a one-second idle timeout.
fn short_idle() -> Limits {
    Limits {
        idle_timeout: Duration::from_secs(1),
        ..limits()
    }
}

// === an in-process server ===

/// The server, in this process, with a fake cluster behind it.
struct Guard {
    admission: SocketAddr,
    certs: tempfile::TempDir,
    limits: Limits,
    shutdown: CancellationToken,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(limits: Limits) -> Guard {
    let certs = tempfile::tempdir().unwrap();
    certs::write(certs.path(), &["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let mut config = config(policy(), certs.path());
    config.request_timeout = REQUEST_TIMEOUT;
    config.limits = limits.clone();
    let bound = Server::new(config, Arc::new(FakeCluster::default()))
        .bind()
        .await
        .unwrap();
    let admission = bound.admission_addr();
    let shutdown = CancellationToken::new();
    tokio::spawn(bound.serve(shutdown.clone()));
    Guard {
        admission,
        certs,
        limits,
        shutdown,
    }
}

impl Guard {
    fn tls(&self, alpn: &[&[u8]]) -> Arc<ClientConfig> {
        tls_config(self.certs.path(), rustls::DEFAULT_VERSIONS, alpn)
    }

    async fn connect(&self, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
        tls_connect(self.admission, self.tls(alpn)).await.unwrap()
    }

    async fn assert_answered(&self) -> Duration {
        assert_answered(self.admission, self.certs.path()).await
    }
}

// === valid requests ===

/// Posts a valid review on a new connection with a real HTTPS client, checks that it is
/// answered with the right decision, and returns how long that took.
async fn assert_answered(addr: SocketAddr, ca_dir: &Path) -> Duration {
    let started = Instant::now();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca_dir.join("ca.crt")).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let response = client
        .post(format!("https://localhost:{}/validate", addr.port()))
        .json(&young_delete())
        .send()
        .await
        .expect("a valid review is answered");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["response"]["uid"], review("secret-delete")["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["auditAnnotations"]["reason"], "too-young",
        "{answer}"
    );
    started.elapsed()
}

// === raw TLS, HTTP/1.1 and HTTP/2 ===

/// An HTTP/2 connection made with the h2 crate; its driver runs in the returned task.
async fn h2_connect(
    guard: &Guard,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tls = guard.connect(&[b"h2"]).await;
    let (send, connection) = h2::client::handshake(tls).await.unwrap();
    (send, tokio::spawn(connection))
}

/// The head of an HTTP/2 POST to `/validate`.
fn h2_post(port: u16) -> http::Request<()> {
    http::Request::post(format!("https://localhost:{port}/validate"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
}

/// Reads until the peer closes the connection (end of stream or an error); returns what
/// it sent.
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status of an HTTP/1.1 response head, if `bytes` starts with a complete one.
fn status_of(bytes: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.find("\r\n\r\n")?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Reads one HTTP/1.1 response with a Content-Length; returns its status and body.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> (u16, Vec<u8>) {
    let mut bytes = Vec::new();
    let mut buf = [0; 4096];
    let head_end = loop {
        if let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a response: {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    while bytes.len() < head_end + length {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed in a response body");
        bytes.extend_from_slice(&buf[..n]);
    }
    (status_of(&bytes).unwrap(), bytes[head_end..head_end + length].to_vec())
}

/// Sends a valid review over an open HTTP/1.1 connection and checks the answer.
async fn assert_answered_on<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let body = young_delete().to_string();
    stream.write_all(post_head(body.len()).as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    stream.flush().await.unwrap();
    let (status, body) = read_response(stream).await;
    assert_eq!(status, 200);
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        answer["response"]["auditAnnotations"]["reason"], "too-young",
        "{answer}"
    );
}

/// Sends `bytes` one by one, one every 100 ms, until the server answers or closes; returns
/// the status it answered with (if any) and how long it took. Fails after `limit`.
async fn trickle(
    stream: &mut TlsStream<TcpStream>,
    bytes: impl IntoIterator<Item = u8>,
    limit: Duration,
) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let mut bytes = bytes.into_iter();
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    loop {
        assert!(started.elapsed() < limit, "the server still waits after {limit:?}");
        tokio::select! {
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return (status_of(&received), started.elapsed()),
                Ok(n) => {
                    received.extend_from_slice(&buf[..n]);
                    if let Some(status) = status_of(&received) {
                        return (Some(status), started.elapsed());
                    }
                }
            },
            () = sleep(Duration::from_millis(100)) => {
                let byte = [bytes.next().expect("enough bytes to trickle")];
                if stream.write_all(&byte).await.is_err() || stream.flush().await.is_err() {
                    return (status_of(&received), started.elapsed());
                }
            }
        }
    }
}

/// Waits for `condition`, checking every 10 ms; fails after `limit`.
async fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

// === 1. slow headers ===

/// Slowloris: TLS done, then a request's headers a byte every 100 ms, on new connections,
/// on a keep-alive connection after a first request, and over HTTP/2 (a header block
/// continued a byte at a time). The server closes each of them at the idle timeout
/// (HTTP/2: the client cannot answer the server's PING in the middle of a header block, so
/// the keep-alive timeout ends it by twice that), without answering, and serves valid
/// requests meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_at_the_idle_timeout() {
    const CLIENTS: usize = 10;
    let guard = start(short_idle()).await;
    let idle = guard.limits.idle_timeout;
    let started = Arc::new(AtomicUsize::new(0));
    let slow: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let http2 = i == CLIENTS - 1;
            let alpn: &[&[u8]] = if http2 { &[b"h2"] } else { &[b"http/1.1"] };
            let (addr, config, started) = (guard.admission, guard.tls(alpn), started.clone());
            tokio::spawn(async move {
                let mut tls = tls_connect(addr, config).await.unwrap();
                let head: Box<dyn Iterator<Item = u8> + Send> = if http2 {
                    // A header block that never ends: CONTINUATION frames of one byte.
                    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
                    tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
                    tls.write_all(&frame(HEADERS, 0, 1, &post_headers_block()))
                        .await
                        .unwrap();
                    tls.flush().await.unwrap();
                    let continuation = frame(CONTINUATION, 0, 1, &[0x40]);
                    Box::new(std::iter::repeat(continuation).flatten())
                } else {
                    if i == 0 {
                        assert_answered_on(&mut tls).await;
                    }
                    let head = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
                    Box::new(head.iter().copied().chain(std::iter::repeat(b'a')))
                };
                started.fetch_add(1, Ordering::SeqCst);
                trickle(&mut tls, head, idle * 10).await
            })
        })
        .collect();
    wait_until("slow clients", Duration::from_secs(10), || {
        started.load(Ordering::SeqCst) == CLIENTS
    })
    .await;
    let during = guard.assert_answered().await;

    for task in slow {
        let (status, lived) = task.await.unwrap();
        assert_eq!(status, None, "slow headers get no answer");
        assert!(
            lived >= idle * 9 / 10,
            "closed at {lived:?}, before the idle timeout {idle:?}"
        );
        assert!(
            lived < idle + Duration::from_secs(2),
            "closed at {lived:?}, long after {idle:?}"
        );
        println!("slow headers: closed after {lived:?}");
    }
    println!("valid request during slow headers answered in {during:?}");
    guard.assert_answered().await;
}

// === 2. slow bodies ===

/// Slow bodies fill every request slot: headers sent, then a byte every 100 ms, over
/// HTTP/1.1 and HTTP/2. Each is answered (408, or 503 if it never got a slot) or closed
/// at its request deadline; a valid request sent halfway through waits, and is answered
/// once slots free; afterwards every slot is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_end_at_the_request_deadline_and_free_their_slots() {
    let guard = start(limits()).await;
    let slots = guard.limits.max_requests;
    let sent = Arc::new(AtomicUsize::new(0));
    let mut slow: Vec<_> = (0..slots - 1)
        .map(|_| {
            let (addr, config, sent) = (guard.admission, guard.tls(&[b"http/1.1"]), sent.clone());
            tokio::spawn(async move {
                let mut tls = tls_connect(addr, config).await.unwrap();
                tls.write_all(post_head(10_000).as_bytes()).await.unwrap();
                tls.write_all(b"{\"apiVersion\":").await.unwrap();
                tls.flush().await.unwrap();
                sent.fetch_add(1, Ordering::SeqCst);
                trickle(&mut tls, std::iter::repeat(b' '), REQUEST_TIMEOUT * 5).await
            })
        })
        .collect();
    slow.push({
        let (sent, port, (mut h2, _)) = (sent.clone(), guard.admission.port(), h2_connect(&guard).await);
        tokio::spawn(async move {
            let started = Instant::now();
            let (response, mut body) = h2.send_request(h2_post(port), false).unwrap();
            sent.fetch_add(1, Ordering::SeqCst);
            let trickled = async {
                loop {
                    sleep(Duration::from_millis(100)).await;
                    if body.send_data(Bytes::from_static(b" "), false).is_err() {
                        return std::future::pending().await;
                    }
                }
            };
            let status = tokio::select! {
                response = response => response.ok().map(|r| r.status().as_u16()),
                () = trickled => unreachable!(),
                () = sleep(REQUEST_TIMEOUT * 5) => panic!("the server still waits for an HTTP/2 body"),
            };
            (status, started.elapsed())
        })
    });
    wait_until("slow bodies", Duration::from_secs(10), || {
        sent.load(Ordering::SeqCst) == slots
    })
    .await;
    // Halfway to their deadline, so that the valid request's own deadline comes well
    // after the slots free, however late a busy machine runs the timers.
    sleep(REQUEST_TIMEOUT / 2).await;
    let during = guard.assert_answered().await;

    for task in slow {
        let (status, took) = task.await.unwrap();
        assert!(
            matches!(status, None | Some(408 | 503)),
            "a slow body is answered {status:?}"
        );
        assert!(
            took >= REQUEST_TIMEOUT * 9 / 10,
            "answered at {took:?}, before the deadline"
        );
        assert!(
            took < REQUEST_TIMEOUT + Duration::from_secs(2),
            "answered at {took:?}, long after the deadline"
        );
        println!("slow body: {status:?} after {took:?}");
    }
    println!("valid request during slow bodies answered in {during:?}");

    // No slot leaked: as many valid requests as slots, and one more, all answered at once.
    let answered = futures::future::join_all((0..=slots).map(|_| guard.assert_answered())).await;
    let slowest = answered.into_iter().max().unwrap();
    assert!(slowest < REQUEST_TIMEOUT, "a request waited {slowest:?} for a slot");
}

// === 3. thousands of idle connections ===

/// What became of one idle connection.
enum Idle {
    /// The TCP connect or the TLS handshake failed.
    Refused,
    /// The client finished its handshake but the server did not (no session ticket came):
    /// the server cut it at its handshake timeout.
    CutInHandshake,
    /// Handshaken on both sides; `verified` is when the client checked the server's
    /// certificate, then the server closed it after `lived`.
    Held { verified: Duration, lived: Duration },
}

/// Checks the server's certificate like the default verifier, and notes when it did:
/// after the server took the connection (it sent its certificate) and before the server
/// can have finished the handshake (it waits for the client's Finished, sent after this).
/// So the server holds the connection from before this instant to at least the idle
/// timeout after it.
#[derive(Debug)]
struct NotingVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    at: Arc<std::sync::OnceLock<Instant>>,
}

impl rustls::client::danger::ServerCertVerifier for NotingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let _ = self.at.set(Instant::now());
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client configuration that notes when it verifies the server's certificate; without
/// resumption, so that it does so on every handshake.
fn noting_config(ca_dir: &Path) -> (Arc<ClientConfig>, Arc<std::sync::OnceLock<Instant>>) {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca_dir.join("ca.crt")).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .unwrap();
    let at = Arc::new(std::sync::OnceLock::new());
    let mut config = Arc::unwrap_or_clone(tls_config(ca_dir, rustls::DEFAULT_VERSIONS, &[b"http/1.1"]));
    config
        .dangerous()
        .set_certificate_verifier(Arc::new(NotingVerifier { inner, at: at.clone() }));
    config.resumption = rustls::client::Resumption::disabled();
    (Arc::new(config), at)
}

/// 2,000 TLS connections opened at once, far more than `max_connections`, each idle once
/// handshaken; the extra ones wait in the kernel's accept queue. The server holds each
/// handshaken connection from before the client checks its certificate to at least the
/// idle timeout after, so no more than `max_connections` of these intervals may overlap.
/// Each is closed at the idle timeout (a client too slow to finish its handshake is cut
/// at the handshake timeout); a valid request sent while they queue is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_wait_their_turn_and_are_closed() {
    const CLIENTS: usize = 2_000;
    let guard = start(Limits {
        max_connections: 250,
        ..short_idle()
    })
    .await;
    let (max, idle) = (guard.limits.max_connections, guard.limits.idle_timeout);
    let handshaken = Arc::new(AtomicUsize::new(0));
    let begin = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, handshaken) = (guard.admission, handshaken.clone());
            let (config, verified) = noting_config(guard.certs.path());
            tokio::spawn(async move {
                let Ok(mut tls) = tls_connect(addr, config).await else {
                    return Idle::Refused;
                };
                let verified = *verified.get().expect("a full handshake checks the certificate");
                handshaken.fetch_add(1, Ordering::SeqCst);
                let sent = read_until_closed(&mut tls).await;
                assert!(sent.is_empty(), "an idle connection gets no data");
                // rustls sends its session tickets once it has the client's Finished.
                if tls.get_ref().1.tls13_tickets_received() == 0 {
                    return Idle::CutInHandshake;
                }
                Idle::Held {
                    verified: verified - begin,
                    lived: verified.elapsed(),
                }
            })
        })
        .collect();
    wait_until("the first connections", Duration::from_secs(20), || {
        handshaken.load(Ordering::SeqCst) >= max / 2
    })
    .await;
    let during = guard.assert_answered().await;

    let (mut held, mut refused, mut cut) = (Vec::new(), 0, 0);
    for client in clients {
        match timeout(Duration::from_secs(60), client)
            .await
            .expect("every connection is served in turn")
            .unwrap()
        {
            Idle::Refused => refused += 1,
            Idle::CutInHandshake => cut += 1,
            Idle::Held { verified, lived } => held.push((verified, lived)),
        }
    }
    let total = begin.elapsed();
    // The intervals [verified, verified + idle] the server certainly held open, as events.
    let mut events: Vec<(Duration, i32)> = held
        .iter()
        .flat_map(|(verified, _)| [(*verified, 1), (*verified + idle, -1)])
        .collect();
    events.sort();
    let most_open = events
        .iter()
        .scan(0, |open, (_, delta)| {
            *open += delta;
            Some(*open)
        })
        .max()
        .map(|open| usize::try_from(open).unwrap())
        .unwrap();
    let mut lifetimes: Vec<Duration> = held.iter().map(|(_, lived)| *lived).collect();
    lifetimes.sort();
    let (shortest, median, longest) = (
        lifetimes[0],
        lifetimes[lifetimes.len() / 2],
        lifetimes[lifetimes.len() - 1],
    );
    println!(
        "{CLIENTS} idle connections: {} held, {cut} cut in the handshake, {refused} refused; at most {most_open} open at once (max {max}); held ones lived {shortest:?} to {longest:?}, median {median:?}; all done in {total:?}; a valid request meanwhile took {during:?}",
        held.len()
    );
    assert_eq!(refused, 0, "every connection waits in the accept queue");
    assert!(held.len() >= CLIENTS / 2, "most connections are served in turn");
    assert!(most_open <= max, "{most_open} connections open at once, max {max}");
    assert!(shortest >= idle, "an idle connection closed after {shortest:?}");
    // Every held connection was closed by the server, or this test would not have ended.
    // How long after the idle timeout depends on how late a busy machine runs the clients
    // (the slow-header test checks the timing with a few connections).
    guard.assert_answered().await;
}

// === 4. HTTP/2 streams ===

/// Opens far more streams than `max_streams` on one connection, by hand (a conforming
/// client would not): the server refuses every stream past the limit and answers the
/// others at their deadline. Other connections are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_past_the_limit_are_refused() {
    const STREAMS: u32 = 200;
    // More request slots than streams: this is about streams, and a valid request sent
    // meanwhile should not have to wait for a slot.
    let guard = start(Limits {
        max_requests: 16,
        ..limits()
    })
    .await;
    let max = guard.limits.max_streams;

    let mut tls = guard.connect(&[b"h2"]).await;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let mut flood = Vec::new();
    for stream in (0..STREAMS).map(|n| 2 * n + 1) {
        flood.extend(frame(HEADERS, END_HEADERS, stream, &post_headers_block()));
    }
    tls.write_all(&flood).await.unwrap();
    tls.flush().await.unwrap();

    let (mut advertised, mut refused, mut answered, mut goaway) = (None, 0, 0, None);
    let started = Instant::now();
    let (addr, ca) = (guard.admission, guard.certs.path().to_owned());
    let during = tokio::spawn(async move { assert_answered(addr, &ca).await });
    while refused + answered < STREAMS && goaway.is_none() {
        let (kind, flags, stream, payload) = timeout(REQUEST_TIMEOUT * 3, read_frame(&mut tls))
            .await
            .expect("the server answers every stream in time")
            .expect("the connection stays up");
        match kind {
            SETTINGS if flags & ACK == 0 => {
                advertised = payload
                    .chunks(6)
                    .find(|setting| setting[..2] == [0, 3])
                    .map(|setting| u32::from_be_bytes(setting[2..].try_into().unwrap()));
                tls.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
                tls.flush().await.unwrap();
            }
            PING if flags & ACK == 0 => {
                tls.write_all(&frame(PING, ACK, 0, &payload)).await.unwrap();
                tls.flush().await.unwrap();
            }
            RST_STREAM if u32::from_be_bytes(payload[..4].try_into().unwrap()) == REFUSED_STREAM => {
                assert!(stream > 2 * max - 1, "stream {stream} refused, below the limit {max}");
                refused += 1;
            }
            HEADERS => answered += 1,
            GOAWAY => goaway = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap())),
            _ => {}
        }
    }
    println!(
        "{STREAMS} streams opened at once: max_concurrent_streams {advertised:?}, {answered} answered, {refused} refused, goaway {goaway:?}, in {:?}",
        started.elapsed()
    );
    assert_eq!(advertised, Some(max), "the server advertises its stream limit");
    assert_eq!(goaway, None);
    assert_eq!(answered, max, "streams within the limit are served");
    assert_eq!(refused, STREAMS - max);
    println!(
        "valid request during the stream flood answered in {:?}",
        during.await.unwrap()
    );
    guard.assert_answered().await;
}

/// Requests past `max_connections` admitted at once, here as HTTP/2 streams on one
/// connection, are answered 503 at once instead of waiting for a slot with their headers
/// in memory; the admitted ones are answered at their deadline. A valid request sent
/// meanwhile is refused at once too (503); afterwards it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_max_connections_are_refused_at_once() {
    let guard = start(Limits {
        max_connections: 4,
        max_requests: 1,
        ..limits()
    })
    .await;
    let (max, streams) = (guard.limits.max_connections, guard.limits.max_streams as usize);
    let (mut h2, _connection) = h2_connect(&guard).await;
    let started = Instant::now();
    let answered = Arc::new(AtomicUsize::new(0));
    let mut answers = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..streams {
        h2 = h2.ready().await.unwrap();
        let (response, body) = h2.send_request(h2_post(guard.admission.port()), false).unwrap();
        bodies.push(body);
        let answered = answered.clone();
        answers.push(tokio::spawn(async move {
            let status = response.await.unwrap().status().as_u16();
            answered.fetch_add(1, Ordering::SeqCst);
            (status, started.elapsed())
        }));
    }
    wait_until("the refusals", REQUEST_TIMEOUT / 2, || {
        answered.load(Ordering::SeqCst) >= streams - max
    })
    .await;
    let refused_valid = Instant::now();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(guard.certs.path().join("ca.crt")).unwrap()).unwrap();
    let response = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap()
        .post(format!("https://localhost:{}/validate", guard.admission.port()))
        .json(&young_delete())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let refused_valid = refused_valid.elapsed();
    assert!(refused_valid < REQUEST_TIMEOUT / 2, "refused after {refused_valid:?}");

    let mut at_deadline = 0;
    for answer in answers {
        let (status, took) = answer.await.unwrap();
        if took < REQUEST_TIMEOUT / 2 {
            assert_eq!(status, 503, "answered at once");
        } else {
            assert!(matches!(status, 408 | 503), "answered {status} at the deadline");
            assert!(took >= REQUEST_TIMEOUT * 9 / 10, "answered after {took:?}");
            at_deadline += 1;
        }
    }
    println!(
        "{streams} streams, {max} admitted at most: {} refused at once, {at_deadline} answered at the deadline; a valid request meanwhile refused in {refused_valid:?}",
        streams - at_deadline
    );
    assert_eq!(at_deadline, max, "max_connections requests admitted");
    drop(bodies);
    guard.assert_answered().await;
}

/// Rapid reset (CVE-2023-44487) with the h2 crate: streams opened and cancelled at once,
/// so that none counts against the stream limit. The server closes the connection after
/// a few hundred; other connections are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_rapid_resets_end_the_connection() {
    const RESETS: usize = 10_000;
    let guard = start(limits()).await;
    let (mut h2, connection) = h2_connect(&guard).await;
    let port = guard.admission.port();
    let (addr, ca) = (guard.admission, guard.certs.path().to_owned());
    let during = tokio::spawn(async move { assert_answered(addr, &ca).await });
    let mut sent = 0;
    let started = Instant::now();
    while sent < RESETS {
        let Ok(ready) = h2.ready().await else { break };
        h2 = ready;
        let Ok((_, mut body)) = h2.send_request(h2_post(port), false) else {
            break;
        };
        body.send_reset(h2::Reason::CANCEL);
        sent += 1;
    }
    let ended = timeout(Duration::from_secs(10), connection)
        .await
        .expect("the server ends the connection")
        .unwrap();
    println!(
        "rapid reset: {sent} streams opened and reset before the connection ended ({ended:?}) after {:?}",
        started.elapsed()
    );
    // GOAWAY(ENHANCE_YOUR_CALM); or, if the client was still writing when the server
    // closed the socket, a broken pipe before it could read the GOAWAY.
    let error = ended.expect_err("the server ends the connection with an error");
    assert!(
        error.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) || error.is_io(),
        "{error}"
    );
    assert!(sent < RESETS, "all {sent} resets were taken");
    println!(
        "valid request during rapid resets answered in {:?}",
        during.await.unwrap()
    );
    guard.assert_answered().await;
}

/// An HTTP/2 connection that answers the server's pings but sends no request is closed
/// at the idle timeout, like an HTTP/1.1 one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    let guard = start(short_idle()).await;
    let idle = guard.limits.idle_timeout;
    let (mut h2, connection) = h2_connect(&guard).await;
    let (response, mut body) = h2.send_request(h2_post(guard.admission.port()), false).unwrap();
    body.send_data(Bytes::from(young_delete().to_string()), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.unwrap();
    }
    let answered = Instant::now();
    timeout(idle * 5, connection)
        .await
        .expect("the server closes an idle HTTP/2 connection")
        .unwrap()
        .unwrap();
    let lived = answered.elapsed();
    println!("idle HTTP/2 connection closed {lived:?} after its last answer");
    assert!(
        lived >= idle * 9 / 10,
        "closed after {lived:?}, before the idle timeout"
    );
    guard.assert_answered().await;
}

// === 5. plain HTTP on the TLS port ===

/// A plain-HTTP request on the TLS port gets a TLS alert or a closed connection at once,
/// never an HTTP answer; the server serves on.
#[tokio::test]
async fn plain_http_on_the_tls_port_is_refused() {
    let guard = start(limits()).await;
    let mut tcp = TcpStream::connect(guard.admission).await.unwrap();
    let body = young_delete().to_string();
    tcp.write_all(post_head(body.len()).as_bytes()).await.unwrap();
    let _ = tcp.write_all(body.as_bytes()).await;
    let started = Instant::now();
    let answer = timeout(guard.limits.idle_timeout, read_until_closed(&mut tcp))
        .await
        .expect("closed at once, not at the handshake timeout");
    println!(
        "plain HTTP: {} bytes back, closed after {:?}",
        answer.len(),
        started.elapsed()
    );
    assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));
    if let Some(&kind) = answer.first() {
        assert_eq!(kind, 0x15, "a TLS alert record: {answer:?}");
    }
    guard.assert_answered().await;
}

// === 6. TLS versions ===

/// A TLS 1.1 ClientHello (legacy_version 0x0302, no supported_versions extension), by hand.
fn tls11_client_hello() -> Vec<u8> {
    let mut hello = vec![0x03, 0x02]; // client_version: TLS 1.1
    hello.extend([0x5a; 32]); // random
    hello.push(0); // no session id
    // TLS 1.1 suites: ECDHE-ECDSA-AES128-SHA, ECDHE-RSA-AES128-SHA, RSA-AES128-SHA, RSA-AES256-SHA.
    let suites = [0xc0, 0x09, 0xc0, 0x13, 0x00, 0x2f, 0x00, 0x35];
    hello.extend(u16::try_from(suites.len()).unwrap().to_be_bytes());
    hello.extend(suites);
    hello.extend([1, 0]); // compression: null
    let mut extensions = Vec::new();
    let name = b"localhost";
    let mut server_name = vec![0x00]; // host_name
    server_name.extend(u16::try_from(name.len()).unwrap().to_be_bytes());
    server_name.extend(name);
    let mut list = u16::try_from(server_name.len()).unwrap().to_be_bytes().to_vec();
    list.extend(server_name);
    for (kind, data) in [
        (0x0000u16, list),                                  // server_name
        (0x000a, vec![0x00, 0x04, 0x00, 0x17, 0x00, 0x1d]), // supported_groups: P-256, x25519
        (0x000b, vec![0x01, 0x00]),                         // ec_point_formats: uncompressed
    ] {
        extensions.extend(kind.to_be_bytes());
        extensions.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
        extensions.extend(data);
    }
    hello.extend(u16::try_from(extensions.len()).unwrap().to_be_bytes());
    hello.extend(extensions);
    let mut handshake = vec![0x01]; // client_hello
    handshake.extend(&u32::try_from(hello.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend(hello);
    let mut record = vec![0x16, 0x03, 0x02]; // handshake record, TLS 1.1
    record.extend(u16::try_from(handshake.len()).unwrap().to_be_bytes());
    record.extend(handshake);
    record
}

/// TLS 1.1 is refused with an alert (or a close), never a ServerHello; TLS 1.2 and 1.3
/// are served.
#[tokio::test]
async fn tls_1_1_is_refused_and_tls_1_2_and_1_3_are_served() {
    let guard = start(limits()).await;
    let mut tcp = TcpStream::connect(guard.admission).await.unwrap();
    tcp.write_all(&tls11_client_hello()).await.unwrap();
    let answer = timeout(guard.limits.idle_timeout, read_until_closed(&mut tcp))
        .await
        .expect("closed at once, not at the handshake timeout");
    println!("TLS 1.1 ClientHello answered with {answer:02x?}");
    if let Some(&kind) = answer.first() {
        assert_ne!(kind, 0x16, "a handshake record (ServerHello) answers TLS 1.1");
        assert_eq!(kind, 0x15, "an alert record: {answer:02x?}");
        let description = *answer.get(6).expect("a whole alert record");
        assert!(
            description == 70 || description == 40,
            "alert {description}, not protocol_version (70) or handshake_failure (40)"
        );
    }
    guard.assert_answered().await;

    for (version, name) in [
        (&rustls::version::TLS12, "TLS 1.2"),
        (&rustls::version::TLS13, "TLS 1.3"),
    ] {
        let config = tls_config(guard.certs.path(), &[version], &[b"http/1.1"]);
        let mut tls = tls_connect(guard.admission, config)
            .await
            .unwrap_or_else(|e| panic!("{name} refused: {e}"));
        assert_eq!(tls.get_ref().1.protocol_version(), Some(version.version), "{name}");
        assert_answered_on(&mut tls).await;
    }
}

// === 7. oversize bodies ===

/// Bodies over the limit get 413: at once when Content-Length announces it, as soon as
/// the limit is passed when it is sent chunked. The server serves on.
#[tokio::test]
async fn oversize_bodies_get_413() {
    let guard = start(limits()).await;
    let limit = guard.limits.body_limit;

    // Announced: refused before any of the body is sent, not at the request deadline.
    let mut tls = guard.connect(&[b"http/1.1"]).await;
    tls.write_all(post_head(limit + 1).as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let (status, body) = timeout(REQUEST_TIMEOUT / 2, read_response(&mut tls))
        .await
        .expect("answered before the request deadline");
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert!(answer["error"].as_str().unwrap().contains("limit"), "{answer}");

    // Chunked: no length announced, so the server finds out while reading. The client
    // sends up to four times the limit, and never the last chunk.
    let tls = guard.connect(&[b"http/1.1"]).await;
    let (mut reader, mut writer) = tokio::io::split(tls);
    let mut response = tokio::spawn(async move { read_response(&mut reader).await });
    writer
        .write_all(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = format!("{:x}\r\n{}\r\n", 4096, "x".repeat(4096));
    let mut sent = 0;
    while sent < 4 * limit && !response.is_finished() {
        if writer.write_all(chunk.as_bytes()).await.is_err() || writer.flush().await.is_err() {
            break;
        }
        sent += 4096;
    }
    let answer = timeout(REQUEST_TIMEOUT, &mut response)
        .await
        .expect("an oversize chunked body is answered")
        .unwrap();
    println!("chunked body: 413 after {sent} bytes sent (limit {limit})");
    assert_eq!(answer.0, 413);
    guard.assert_answered().await;
}

// === the real binary ===

/// `cds-secret-guard serve` as a process, with certificates from its `certs` command and a
/// kubeconfig whose apiserver refuses connections (so deletes fail closed).
struct Process {
    child: Child,
    admission: SocketAddr,
    probes: SocketAddr,
    dir: tempfile::TempDir,
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Process {
    async fn start(env: &[(&str, &str)]) -> Self {
        let binary = env!("CARGO_BIN_EXE_cds-secret-guard");
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new(binary)
            .args(["certs", "--out"])
            .arg(dir.path())
            .args(["--host", "localhost", "--host", "127.0.0.1"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "cds-secret-guard certs failed");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\ncurrent-context: none\n\
             clusters: [{name: none, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
             contexts: [{name: none, context: {cluster: none, user: none}}]\n\
             users: [{name: none, user: {}}]\n",
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("guard.log")).unwrap();
        let (admission, probes) = (free_port(), free_port());
        let child = Command::new(binary)
            .arg("serve")
            .env("KUBECONFIG", &kubeconfig)
            .env("CDS_GUARD_LISTEN", admission.to_string())
            .env("CDS_GUARD_PROBE_LISTEN", probes.to_string())
            .env("CDS_GUARD_TLS_CERT", dir.path().join("tls.crt"))
            .env("CDS_GUARD_TLS_KEY", dir.path().join("tls.key"))
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let process = Self {
            child,
            admission,
            probes,
            dir,
        };
        let started = Instant::now();
        while process.readyz().await != Some(200) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "not ready: {}",
                process.log()
            );
            sleep(Duration::from_millis(50)).await;
        }
        process
    }

    async fn readyz(&self) -> Option<u16> {
        let response = reqwest::get(format!("http://{}/readyz", self.probes)).await.ok()?;
        Some(response.status().as_u16())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("guard.log")).unwrap_or_default()
    }

    fn certs(&self) -> &Path {
        self.dir.path()
    }

    /// The process's resident memory and its peak, in KiB.
    fn memory(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|line| line.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes sent to `port` over TCP that the server has not read yet: in the receive queues
/// of its sockets, or still in the send queues of the clients'.
fn unread_bytes(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let queued = |line: &str| -> Option<u64> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port_of = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
        let (tx, rx) = fields.get(4)?.split_once(':')?;
        let (tx, rx) = (u64::from_str_radix(tx, 16).ok()?, u64::from_str_radix(rx, 16).ok()?);
        if port_of(fields[1])? == port {
            Some(rx)
        } else if port_of(fields[2])? == port {
            Some(tx)
        } else {
            None
        }
    };
    table.lines().skip(1).filter_map(queued).sum()
}

// === 8. memory ===

/// The real binary with its default limits, under the worst a client can do to its
/// memory: every request slot holds a body just under the body limit, and every other
/// connection is HTTP/2 filled to what the server allows (windows, headers; 8 streams
/// each: were they all kept waiting for a slot, that would be 60 MiB more). Its resident
/// memory stays under the Deployment's limit (128 MiB): measured with the other
/// connections idle, and again once they are filled. A valid request is answered as soon
/// as a slow body gives up its slot, and after the abuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_under_the_limit_with_every_connection_and_slot_taken() {
    const MEMORY_LIMIT_KIB: u64 = 128 * 1024;
    let limits = Limits::default();
    let guard = Process::start(&[
        ("CDS_GUARD_REQUEST_TIMEOUT", "60s"),
        ("CDS_GUARD_IDLE_TIMEOUT", "60s"),
        ("RUST_LOG", "warn"),
    ])
    .await;
    let check = |when: &str| {
        let (rss, peak) = guard.memory();
        println!("memory {when}: {} MiB (peak {} MiB)", rss / 1024, peak / 1024);
        assert!(
            peak < MEMORY_LIMIT_KIB,
            "{when}: peak RSS {} MiB, over 128 MiB",
            peak / 1024
        );
    };
    let all_read = || async {
        wait_until("the server to read what was sent", Duration::from_secs(10), || {
            unread_bytes(guard.admission.port()) == 0
        })
        .await;
    };
    check("at start");

    // Slow bodies take every request slot; every other connection but one (for valid
    // requests) is open and idle.
    let http1 = tls_config(guard.certs(), rustls::DEFAULT_VERSIONS, &[b"http/1.1"]);
    let mut slow = futures::future::join_all((0..limits.max_requests).map(|_| async {
        slow_body(
            tls_connect(guard.admission, http1.clone()).await.unwrap(),
            limits.body_limit,
        )
        .await
    }))
    .await;
    let http2 = tls_config(guard.certs(), rustls::DEFAULT_VERSIONS, &[b"h2"]);
    let others = limits.max_connections - limits.max_requests - 1;
    let mut held: Vec<_> = futures::future::join_all((0..others).map(|_| tls_connect(guard.admission, http2.clone())))
        .await
        .into_iter()
        .map(|tls| tls.expect("a connection within max_connections is taken"))
        .collect();
    all_read().await;
    check(&format!(
        "with {} bodies of {} KiB and {others} idle connections",
        slow.len(),
        (limits.body_limit - 4096) / 1024
    ));

    // A valid request gets the slot a slow body gives up; another slow body takes it back.
    let (addr, ca) = (guard.admission, guard.certs().to_owned());
    let during = tokio::spawn(async move { assert_answered(addr, &ca).await });
    drop(slow.pop());
    let waited = timeout(Duration::from_secs(10), during)
        .await
        .expect("a freed slot goes to the waiting request")
        .unwrap();
    println!("valid request under full load answered in {waited:?}");
    slow.push(
        slow_body(
            tls_connect(guard.admission, http1.clone()).await.unwrap(),
            limits.body_limit,
        )
        .await,
    );

    let mut sent = 0;
    for (n, tls) in held.iter_mut().enumerate() {
        sent += fill_http2_connection(tls, 8).await;
        if n % 16 == 15 {
            check(&format!("with {} HTTP/2 connections filled", n + 1));
        }
    }
    all_read().await;
    check(&format!("with every connection filled ({} MiB sent)", sent >> 20));

    drop((held, slow));
    assert_answered(guard.admission, guard.certs()).await;
    check("after");
}

// === 9. drain ===

/// On SIGTERM the binary says not ready at once, answers admission requests for the drain
/// delay, then closes its listener and exits.
#[tokio::test]
async fn sigterm_drains_then_closes_the_listener() {
    let drain = Duration::from_secs(2);
    let guard = Process::start(&[("CDS_GUARD_DRAIN_DELAY", "2s")]).await;
    assert_answered(guard.admission, guard.certs()).await;

    let signalled = Instant::now();
    guard.terminate();
    while guard.readyz().await != Some(503) {
        assert!(
            signalled.elapsed() < Duration::from_millis(500),
            "still ready after SIGTERM"
        );
        sleep(Duration::from_millis(10)).await;
    }
    let not_ready = signalled.elapsed();

    let mut answered = 0;
    while signalled.elapsed() < drain / 2 {
        assert_answered(guard.admission, guard.certs()).await;
        answered += 1;
    }
    // An HTTP/1.1 client is told to take its next request elsewhere: the answer says
    // `Connection: close` and the server closes the connection after it.
    let http1 = tls_config(guard.certs(), rustls::DEFAULT_VERSIONS, &[b"http/1.1"]);
    let mut tls = tls_connect(guard.admission, http1).await.unwrap();
    let body = young_delete().to_string();
    tls.write_all(post_head(body.len()).as_bytes()).await.unwrap();
    tls.write_all(body.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let answer = timeout(Duration::from_secs(1), read_until_closed(&mut tls))
        .await
        .expect("the connection is closed after the answer, not kept alive");
    let status = status_of(&answer);
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert_eq!(status, Some(200), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(signalled.elapsed() < drain, "the requests took the whole drain delay");
    assert_eq!(guard.readyz().await, Some(503), "not ready for the whole drain");

    while TcpStream::connect(guard.admission).await.is_ok() {
        assert!(
            signalled.elapsed() < drain + Duration::from_secs(5),
            "the listener stays open"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let closed = signalled.elapsed();
    println!(
        "SIGTERM: not ready after {not_ready:?}, {answered} requests answered while draining, listener closed after {closed:?}"
    );
    assert!(
        closed >= drain,
        "the listener closed after {closed:?}, before the drain delay"
    );
    let mut guard = guard;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = guard.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still running: {}",
            guard.log()
        );
        sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}: {}", guard.log());
}
