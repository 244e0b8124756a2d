//! End-to-end: the guard's pod watch lags behind its quorum reads, on purpose, and no
//! secret of a pod just created is let go on the watch's word.
//!
//! The guard answers a worker's label from its pod watch once the watch has caught up
//! with a revision read by quorum after the request (the revision gate, `src/rules/worker/watch.rs`).
//! Here every byte the apiserver sends the guard goes through toxiproxy (from
//! `hack/tools/build.sh`) with a latency toxic whose jitter differs chunk by chunk. A
//! response to one read waits for one draw of the delay; the watch, a stream of many
//! chunks in one connection, waits behind the longest draw of the chunks before it (the
//! toxic releases a connection's chunks in order): it runs about the largest delay behind
//! the reads, while its events still come often enough for the guard to count it busy.
//! Then, round after round, a pod labelled for a worker is created right before the
//! worker's secret is deleted: every delete must be denied, naming that pod. With the gate
//! removed, the watch's index, which does not show the pod yet, allows them.
//!
//! Nothing here skips: no control plane, no toxiproxy, or a proxy that cannot be reached
//! (the guard then fails closed, and its denials name no pod) fails the test.
#![allow(clippy::unwrap_used)]

use testkit::cluster;

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use cluster::*;
use kube::api::DeleteParams;
use serde_json::{Value, json};

/// Rounds of "create a labelled pod, then delete its worker's secret".
const ROUNDS: usize = 30;

/// The latency toxic on what the apiserver sends the guard: each chunk waits
/// `LATENCY_MS` ± `JITTER_MS`. The two reads of a decision on the watch's path (the
/// revision, then the label LIST when the watch is behind) stay well within the guard's
/// 2 s lookup deadline at the worst draws.
const LATENCY_MS: u64 = 300;
const JITTER_MS: u64 = 250;

/// A toxiproxy server, stopped when dropped.
struct Toxiproxy {
    process: Child,
    api: String,
    http: reqwest::Client,
}

impl Toxiproxy {
    /// Starts `target/tools/bin/toxiproxy` on a free port, with a fixed seed for the
    /// toxics' draws, and waits for its API.
    async fn start(log: PathBuf) -> Self {
        let binary = repo().join("target/tools/bin/toxiproxy");
        assert!(
            binary.exists(),
            "{} is missing: run hack/tools/build.sh (make test does); this test never skips",
            binary.display()
        );
        let port = free_port();
        let log = fs::File::create(log).unwrap();
        let process = Command::new(binary)
            .args(["-host", "127.0.0.1", "-port", &port.to_string(), "-seed", "21"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start toxiproxy");
        let proxy = Self {
            process,
            api: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.http.get(format!("{}/version", proxy.api)).send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "toxiproxy's API never answered on {}",
                proxy.api
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        proxy
    }

    /// POSTs `body` to the API; panics unless it succeeds; returns the answer.
    async fn post(&self, path: &str, body: Value) -> Value {
        let response = self
            .http
            .post(format!("{}{path}", self.api))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or_default();
        assert!(status.is_success(), "toxiproxy {path}: {status} {answer}");
        answer
    }

    /// A proxy to `upstream` on a free loopback port; returns the address it listens on.
    async fn proxy(&self, name: &str, upstream: &str) -> String {
        let created = self
            .post(
                "/proxies",
                json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true}),
            )
            .await;
        created["listen"].as_str().unwrap().to_owned()
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The address (host:port) of the apiserver the guard's service-account kubeconfig names.
fn apiserver() -> String {
    let kubeconfig = fs::read_to_string(guard_kubeconfig()).unwrap();
    kubeconfig
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("server: https://"))
        .expect("the guard's kubeconfig names a server")
        .to_owned()
}

/// The guard's service-account kubeconfig with its server moved to `server`: the
/// apiserver's certificate names 127.0.0.1, whatever the port, so TLS still verifies it.
fn kubeconfig_through(server: &str) -> PathBuf {
    let kubeconfig = fs::read_to_string(guard_kubeconfig()).unwrap();
    let path = repo()
        .join("target/e2e")
        .join(format!("lagging-watch.{}.kubeconfig", std::process::id()));
    fs::write(
        &path,
        kubeconfig.replace(
            &format!("server: https://{}", apiserver()),
            &format!("server: https://{server}"),
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn a_lagging_pod_watch_never_lets_the_secret_of_a_pod_just_created_go() {
    let started = Instant::now();
    control_plane();
    fs::create_dir_all(repo().join("target/e2e")).unwrap();
    let toxiproxy = Toxiproxy::start(repo().join(format!("target/e2e/toxiproxy.{}.log", std::process::id()))).await;
    let listen = toxiproxy.proxy("apiserver", &apiserver()).await;
    let guard = Guard::start_with(GuardOptions {
        kubeconfig: kubeconfig_through(&listen),
        ..GuardOptions::default()
    });

    let ns = TestNamespace::new("lag").await;
    let churn = churn_worker_pods(&ns).await;
    for round in 0..ROUNDS {
        ns.worker_secret(&format!("w-lag-{round}")).await;
    }
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;

    toxiproxy
        .post(
            "/proxies/apiserver/toxics",
            json!({
                "name": "lag", "type": "latency", "stream": "downstream", "toxicity": 1.0,
                "attributes": {"latency": LATENCY_MS, "jitter": JITTER_MS},
            }),
        )
        .await;
    // The watch falls behind and its events come again, each late.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut allowed = Vec::new();
    let mut denied = 0;
    for round in 0..ROUNDS {
        let worker = format!("w-lag-{round}");
        let racer = ns
            .pods()
            .create(&Default::default(), &labelled_pod(&format!("racer-{round}"), &worker))
            .await
            .unwrap();
        let uid = racer.metadata.uid.unwrap();
        match ns
            .delete_secret(&format!("cds-worker-config-{worker}"), &DeleteParams::default())
            .await
        {
            Ok(()) => allowed.push(round),
            Err(refused) => {
                assert_eq!(refused.code, 403, "round {round}: {refused:?}");
                let names = format!("pod racer-{round} (uid {uid}, Pending) still uses secret");
                assert!(
                    refused.message.contains(&names),
                    "round {round}: the denial does not name the pod ({names:?}): {}",
                    refused.message
                );
                denied += 1;
            }
        }
    }
    churn.abort();
    eprintln!(
        "{ROUNDS} rounds: {denied} denied, {} allowed {allowed:?}, in {:.1?}",
        allowed.len(),
        started.elapsed()
    );
    assert!(
        allowed.is_empty(),
        "rounds {allowed:?} let a secret go while a pod labelled for its worker had just been created"
    );

    // Not vacuous: the guard took the watch's path (it read the revision with a LIST of
    // the worker's name, not a GET), and in some rounds the watch had not caught up, so
    // the gate sent the label read to a LIST.
    let reads: Vec<String> = apiserver_audit()
        .into_iter()
        .filter(|event| {
            event["user"]["username"] == "system:serviceaccount:cds-secret-guard:cds-secret-guard"
                && event["verb"] == "list"
                && event["objectRef"]["resource"] == "pods"
                && event["objectRef"]["namespace"] == ns.name.as_str()
        })
        .filter_map(|event| event["requestURI"].as_str().map(|uri| uri.replace("%3D", "=")))
        .collect();
    let asked = |parameter: &str| {
        reads.iter().any(|uri| {
            let query = uri.split_once('?').map_or("", |(_, query)| query);
            query.split('&').any(|part| part == parameter)
        })
    };
    let on_watch_path: Vec<usize> = (0..ROUNDS)
        .filter(|round| asked(&format!("fieldSelector=metadata.name=w-lag-{round}")))
        .collect();
    let held_by_gate = on_watch_path
        .iter()
        .filter(|round| asked(&format!("labelSelector=CDS_WORKER_NAME=w-lag-{round}")))
        .count();
    eprintln!(
        "{} rounds on the watch's path, {held_by_gate} of them behind the revision and LISTed",
        on_watch_path.len()
    );
    assert!(
        held_by_gate > 0,
        "the watch was never busy and behind: the gate was not exercised; the guard's LISTs: {reads:#?}"
    );
    drop(guard);
}
