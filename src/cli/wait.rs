//! `wait`: until the guard can be called as the apiserver calls it. Ready replicas are
//! not enough: right after an install, the Service may still lead to the replicas of an
//! earlier install, draining with a certificate of a CA the webhooks no longer hold, and a
//! certificate manager may not have written the caBundle yet. The chart runs this after
//! an install, so that `helm install --wait` returns once the guard answers.

use std::{sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client};
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use tokio::{net::TcpStream, time::Instant};
use tokio_rustls::TlsConnector;

use crate::certs::renewal::{plan::Cert, state::Webhooks};

/// How long one call may take, reads included: the webhooks' longest timeout.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the guard is called, and for how long `wait` tries.
#[derive(Debug, Clone)]
pub struct Target {
    /// The Service.
    pub service: String,
    /// Its namespace.
    pub namespace: String,
    /// The Service's port.
    pub port: u16,
    /// The name of the webhook configurations whose caBundles must trust the guard.
    pub webhook_configuration: String,
    /// Calls answered in a row that count as callable.
    pub answers: u32,
    /// How long to try.
    pub timeout: Duration,
}

impl Target {
    /// The name the guard's certificate must hold, as the apiserver checks it:
    /// `<service>.<namespace>.svc`.
    pub fn host(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// Calls the guard through its Service, with the trust of every webhook's caBundle, until
/// it answers `target.answers` calls in a row; an error says what the last call met.
/// Returns how long that took.
pub async fn until_callable(client: &Client, target: &Target) -> crate::Result<Duration> {
    let start = Instant::now();
    let deadline = start + target.timeout;
    let mut in_a_row = 0;
    let mut last = String::new();
    loop {
        // A cluster IP that drops packets would hold a connect for minutes.
        let called = tokio::time::timeout(CALL_TIMEOUT, call(client, target))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {CALL_TIMEOUT:?}")));
        match called {
            Ok(()) => in_a_row += 1,
            Err(error) => {
                // A command's progress, on stderr: each new failure once.
                if in_a_row > 0 || error != last {
                    eprintln!("the guard cannot be called yet: {error}");
                }
                in_a_row = 0;
                last = error;
            }
        }
        if in_a_row >= target.answers {
            return Ok(start.elapsed());
        }
        if Instant::now() >= deadline {
            return Err(crate::Error::NotCallable {
                url: format!("https://{}:{}", target.host(), target.port),
                within: target.timeout,
                last,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One call, as the apiserver makes it: `/validate` at the Service's cluster IP (the
/// apiserver resolves a webhook's Service through the API, not DNS), verified against each
/// distinct caBundle of the webhooks, with a review the guard lets through untouched.
async fn call(client: &Client, target: &Target) -> Result<(), String> {
    let services: Api<Service> = Api::namespaced(client.clone(), &target.namespace);
    let service = services
        .get(&target.service)
        .await
        .map_err(|error| format!("cannot read the Service: {error}"))?;
    let address = service
        .spec
        .and_then(|spec| spec.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or_else(|| format!("the Service {} has no cluster IP", target.service))?;
    let webhooks = Webhooks::read(client, &target.webhook_configuration)
        .await
        .map_err(|error| format!("cannot read the webhook configurations: {error}"))?;
    let mut bundles = webhooks.held();
    if bundles.is_empty() {
        return Err(format!(
            "no webhook configuration named {}",
            target.webhook_configuration
        ));
    }
    bundles.dedup();
    for bundle in &bundles {
        if bundle.is_empty() {
            return Err("a webhook has no caBundle yet".to_owned());
        }
        review(target, &address, bundle).await?;
    }
    Ok(())
}

/// A DELETE of a ConfigMap posted to `/validate`, which that endpoint allows untouched.
async fn review(target: &Target, address: &str, bundle: &[Cert]) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    for cert in bundle {
        roots
            .add(cert.der.clone().into())
            .map_err(|error| format!("a caBundle certificate is unusable: {error}"))?;
    }
    let tls = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let host = target.host();
    let name = ServerName::try_from(host.clone()).map_err(|error| format!("{host}: {error}"))?;
    let tcp = TcpStream::connect((address, target.port))
        .await
        .map_err(|error| format!("cannot connect: {error}"))?;
    let stream = TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .map_err(|error| format!("TLS: {error}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|error| format!("HTTP: {error}"))?;
    tokio::spawn(connection);
    let uid = format!("cds-secret-guard-wait-{}", std::process::id());
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "name": "cds-secret-guard-wait",
            "namespace": "default",
            "operation": "DELETE",
            "userInfo": {"username": "cds-secret-guard-wait"},
            "dryRun": true,
        },
    });
    let request = hyper::Request::post("/validate?timeout=5s")
        .header("host", &host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|error| error.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| format!("HTTP: {error}"))?;
    let status = response.status();
    let answer = response
        .into_body()
        .collect()
        .await
        .map_err(|error| format!("HTTP: {error}"))?
        .to_bytes();
    let answer: serde_json::Value =
        serde_json::from_slice(&answer).map_err(|error| format!("{status}, not a review: {error}"))?;
    let allowed = answer["response"]["uid"] == uid.as_str() && answer["response"]["allowed"] == true;
    if !allowed {
        return Err(format!("{status}, answered {answer}"));
    }
    Ok(())
}
