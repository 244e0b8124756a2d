//! The server as the apiserver meets it: TLS with a certificate from `certs`, verified
//! by a real HTTPS client, over HTTP/1.1 and HTTP/2; rotation under load (including the
//! symlink swap of a secret volume); bad bodies; graceful shutdown; and the real kube
//! client failing closed against an unreachable apiserver.

#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use testkit::fake as common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cds_secret_guard::{
    Server, certs,
    rules::worker::reads::{ClusterLookup, KubeLookup},
    server::Bound,
};
use common::*;
use reqwest::{Certificate, Client, StatusCode, Version};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Running {
    admission: SocketAddr,
    probes: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<cds_secret_guard::Result<()>>,
}

async fn start(tls_dir: &Path, lookup: Arc<dyn ClusterLookup>) -> Running {
    let server = Server::new(config(policy(), tls_dir), lookup);
    let bound: Bound = server.bind().await.expect("server binds");
    let (admission, probes) = (bound.admission_addr(), bound.probe_addr());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(bound.serve(shutdown.clone()));
    Running {
        admission,
        probes,
        shutdown,
        task,
    }
}

fn client(ca_dir: &Path, version: Version) -> Client {
    let ca = Certificate::from_pem(&std::fs::read(ca_dir.join("ca.crt")).unwrap()).unwrap();
    let builder = Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .tls_info(true);
    let builder = if version == Version::HTTP_11 {
        builder.http1_only()
    } else {
        builder
    };
    builder.build().unwrap()
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://localhost:{}{path}", addr.port())
}

fn dev_certs(dir: &Path) {
    certs::write(dir, &["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
}

#[tokio::test]
async fn tls_round_trip_over_http1_and_http2() {
    let dir = tempfile::tempdir().unwrap();
    dev_certs(dir.path());
    let server = start(dir.path(), Arc::new(FakeCluster::default())).await;

    for version in [Version::HTTP_11, Version::HTTP_2] {
        let response = client(dir.path(), version)
            .post(url(server.admission, "/validate"))
            .json(&young_delete())
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), version, "ALPN negotiates {version:?}");
        assert_eq!(response.status(), StatusCode::OK);
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["auditAnnotations"]["reason"], "too-young");
    }

    // A client that does not trust the dev CA is refused.
    let untrusting = Client::builder().tls_built_in_root_certs(false).build().unwrap();
    assert!(untrusting.get(url(server.admission, "/validate")).send().await.is_err());

    server.shutdown.cancel();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_bad_certificate_pair_fails_at_start() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    dev_certs(a.path());
    dev_certs(b.path());
    std::fs::copy(b.path().join("tls.key"), a.path().join("tls.key")).unwrap();
    let server = Server::new(config(policy(), a.path()), Arc::new(FakeCluster::default()));
    let error = server.bind().await.err().expect("mismatched pair is refused");
    assert!(error.to_string().contains("TLS"), "{error}");
}

fn served_certificate(response: &reqwest::Response) -> Vec<u8> {
    let info = response.extensions().get::<reqwest::tls::TlsInfo>().expect("tls info");
    info.peer_certificate().expect("peer certificate").to_vec()
}

/// Lays out a directory the way the kubelet mounts a secret volume: the files are
/// symlinks through `..data`, which is swapped atomically on update.
fn secret_volume(mount: &Path, generation: &Path) {
    let data_dir = mount.join(format!("..{}", generation.file_name().unwrap().to_string_lossy()));
    std::fs::create_dir_all(&data_dir).unwrap();
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::copy(generation.join(file), data_dir.join(file)).unwrap();
    }
    let tmp_link = mount.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    std::os::unix::fs::symlink(data_dir.file_name().unwrap(), &tmp_link).unwrap();
    std::fs::rename(&tmp_link, mount.join("..data")).unwrap();
    for file in ["tls.crt", "tls.key"] {
        let link = mount.join(file);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(PathBuf::from("..data").join(file), &link).unwrap();
        }
    }
}

#[tokio::test]
async fn certificate_rotation_by_symlink_swap_under_load() {
    let work = tempfile::tempdir().unwrap();
    let (first, second, mount) = (
        work.path().join("gen1"),
        work.path().join("gen2"),
        work.path().join("mount"),
    );
    dev_certs(&first);
    // The same CA signs the next certificate, as cert-manager renewing would.
    std::fs::create_dir_all(&second).unwrap();
    for file in ["ca.crt", "ca.key"] {
        std::fs::copy(first.join(file), second.join(file)).unwrap();
    }
    dev_certs(&second);
    std::fs::create_dir_all(&mount).unwrap();
    secret_volume(&mount, &first);
    let server = start(&mount, Arc::new(FakeCluster::default())).await;
    let new_cert = rustls_der(&second.join("tls.crt"));
    let old_cert = rustls_der(&first.join("tls.crt"));

    // Keep requests flowing, each on a new connection, while the volume is swapped.
    let load = {
        let (ca, addr) = (first.clone(), server.admission);
        tokio::spawn(async move {
            let mut results = Vec::new();
            for _ in 0..60 {
                let response = client(&ca, Version::HTTP_2)
                    .post(url(addr, "/validate"))
                    .json(&young_delete())
                    .send()
                    .await
                    .expect("no request fails during rotation");
                results.push((response.status(), served_certificate(&response)));
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            results
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    secret_volume(&mount, &second);
    let results = load.await.unwrap();

    assert!(results.iter().all(|(status, _)| *status == StatusCode::OK));
    assert_eq!(
        results.first().unwrap().1,
        old_cert,
        "served the first certificate before the swap"
    );
    assert_eq!(
        results.last().unwrap().1,
        new_cert,
        "new connections get the new certificate"
    );
    let (_, metrics) = (
        0,
        reqwest::get(format!("http://{}/metrics", server.probes))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(
        counter(
            &metrics,
            "cds_secret_guard_certificate_reloads_total",
            &[("result", "success")]
        ),
        1.0
    );
    let (_, leaf) = x509_parser::parse_x509_certificate(&new_cert).unwrap();
    assert_eq!(
        counter(&metrics, "cds_secret_guard_certificate_expiry_timestamp_seconds", &[]),
        leaf.validity().not_after.timestamp() as f64,
        "the expiry of the certificate in service"
    );
    server.shutdown.cancel();
}

fn rustls_der(pem: &Path) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

#[tokio::test]
async fn bad_bodies_are_refused_and_the_server_stays_up() {
    let dir = tempfile::tempdir().unwrap();
    dev_certs(dir.path());
    let server = start(dir.path(), Arc::new(FakeCluster::default())).await;
    let https = client(dir.path(), Version::HTTP_2);

    let bodies = [
        ("garbage".to_owned(), StatusCode::BAD_REQUEST),
        (json!({"kind": "Pod"}).to_string(), StatusCode::BAD_REQUEST),
        (
            set(young_delete(), "/apiVersion", json!("admission.k8s.io/v1beta1")).to_string(),
            StatusCode::BAD_REQUEST,
        ),
        ("x".repeat(9 * 1024 * 1024), StatusCode::PAYLOAD_TOO_LARGE),
    ];
    for (body, status) in bodies {
        let response = https
            .post(url(server.admission, "/validate"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "{answer}");
        let health = reqwest::get(format!("http://{}/healthz", server.probes)).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
    }
    let response = https
        .post(url(server.admission, "/validate"))
        .json(&young_delete())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    server.shutdown.cancel();
}

#[tokio::test]
async fn shutdown_finishes_requests_in_flight_and_stops_accepting() {
    let dir = tempfile::tempdir().unwrap();
    dev_certs(dir.path());
    // Every lookup takes 0.6 s (an old secret's delete reads by name, then by label), so
    // the delete is in flight for a while.
    let server = start(dir.path(), Arc::new(FakeCluster::slow(Duration::from_millis(600)))).await;
    let old = set(
        review("secret-delete"),
        "/request/oldObject/metadata/creationTimestamp",
        time_ago(Duration::from_secs(3600)),
    );
    let in_flight = tokio::spawn(
        client(dir.path(), Version::HTTP_11)
            .post(url(server.admission, "/validate"))
            .json(&old)
            .send(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let readyz = reqwest::get(format!("http://{}/readyz", server.probes)).await.unwrap();
    assert_eq!(
        readyz.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready while draining"
    );
    let response = in_flight.await.unwrap().expect("the request in flight is answered");
    assert_eq!(response.status(), StatusCode::OK);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["response"]["allowed"], true, "no pod: an orphan");
    server.task.await.unwrap().unwrap();
    let refused = client(dir.path(), Version::HTTP_11)
        .post(url(server.admission, "/validate"))
        .json(&old)
        .send()
        .await;
    assert!(refused.is_err(), "no longer accepting");
}

/// The real kube client against an apiserver that refuses connections, and against one
/// that accepts but never answers: both deny, the second within the lookup timeout.
#[tokio::test]
async fn real_client_fails_closed_against_an_unreachable_apiserver() {
    let refused = "https://127.0.0.1:1".parse().unwrap();
    let blackhole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("https://{}", blackhole.local_addr().unwrap()).parse().unwrap();
    let _keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = blackhole.accept().await {
            held.push(socket);
        }
    });

    for (apiserver, reason_text) in [(refused, "Kubernetes API"), (silent, "did not answer within")] {
        let client = kube::Client::try_from(kube::Config::new(apiserver)).unwrap();
        let server = Server::new(
            config(
                policy().with(|p| p.rules.lookup_timeout = Duration::from_millis(500)),
                Path::new("/none"),
            ),
            Arc::new(KubeLookup::new(client)),
        );
        let old = set(
            review("secret-delete"),
            "/request/oldObject/metadata/creationTimestamp",
            time_ago(Duration::from_secs(3600)),
        );
        let started = std::time::Instant::now();
        let (status, answer) = post(&server.router(), "/validate", old.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(answer["response"]["auditAnnotations"]["reason"], "lookup-failed");
        let message = answer["response"]["status"]["message"].as_str().unwrap();
        assert!(message.contains(reason_text), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "bounded by the lookup timeout"
        );
    }
}
