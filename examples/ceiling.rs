//! The ceiling: the guard's TLS and HTTP stack with nothing behind it. It accepts TLS
//! with the guard's `CertStore` (same certificate, same rustls configuration, ALPN h2 and
//! http/1.1), serves each connection with the same hyper-util auto builder and settings
//! as `src/server/`, reads every request's whole body, and answers one constant
//! AdmissionReview. Whatever the guard does beyond this is its own cost: `make bench`
//! loads both, alternately, and prints the guard's figures as ratios of these.
//!
//! With `--deny`, it is the cheapest webhook that denies: it echoes each review's uid
//! (the apiserver checks it) in a refusal; with `--allow`, the cheapest that allows, the
//! uid echoed in an allow with a warning that says who answered. `make bench` registers
//! them in the guard's place to measure what calling any webhook costs the apiserver:
//! the floor of the guard's deny and allow paths.
//!
//!     cargo run --release --example ceiling -- --listen 127.0.0.1:9444 \
//!         --tls-cert certs/tls.crt --tls-key certs/tls.key [--deny | --allow]

#![allow(missing_docs)]

use std::{convert::Infallible, net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::Context;
use axum::body::{Body, to_bytes};
use cds_secret_guard::{certs::reload::CertStore, config::Limits};
use clap::Parser;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// What every request gets.
const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"00000000-0000-4000-8000-000000000000","allowed":true}}"#;

/// The only field of a review that `--deny` and `--allow` read.
#[derive(Deserialize)]
struct Review<'a> {
    #[serde(borrow)]
    request: ReviewRequest<'a>,
}

#[derive(Deserialize)]
struct ReviewRequest<'a> {
    uid: &'a str,
}

/// The response of `--deny`: a refusal.
const DENIAL: &str = r#""allowed":false,"status":{"code":403,"reason":"Forbidden","message":"denied by the ceiling"}"#;
/// The response of `--allow`: an allow with a warning naming the ceiling (the apiserver
/// passes it to the client in a `Warning` header).
const ALLOWANCE: &str = r#""allowed":true,"warnings":["allowed by the ceiling"]"#;

/// The review in `body` answered with its uid and `response` (the fields after the
/// uid); `None` for a body that is not a review.
fn echo(body: &[u8], response: &str) -> Option<String> {
    let review: Review<'_> = serde_json::from_slice(body).ok()?;
    Some(format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{{"uid":"{}",{response}}}}}"#,
        review.request.uid
    ))
}

#[derive(Debug, Parser)]
#[command(about = "The guard's TLS + HTTP stack answering a constant AdmissionReview")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:9444")]
    listen: SocketAddr,
    #[arg(long)]
    tls_cert: PathBuf,
    #[arg(long)]
    tls_key: PathBuf,
    /// Deny every review, echoing its uid, instead of the constant answer.
    #[arg(long, conflicts_with = "allow")]
    deny: bool,
    /// Allow every review, echoing its uid, with a warning, instead of the constant answer.
    #[arg(long)]
    allow: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let certs = CertStore::load(&args.tls_cert, &args.tls_key)?;
    let acceptor = TlsAcceptor::from(Arc::new(certs.server_config()?));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let limits = Limits::default();
    println!("ceiling listening on {}", args.listen);
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("accept: {error}");
                continue;
            }
        };
        // As the guard's server does (src/server/).
        let _ = tcp.set_nodelay(true);
        let (acceptor, limits, deny, allow) = (acceptor.clone(), limits.clone(), args.deny, args.allow);
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let body_limit = limits.body_limit;
            let service = service_fn(move |request: Request<Incoming>| async move {
                let read = to_bytes(Body::new(request.into_body()), body_limit).await;
                let answer = match read {
                    Ok(body) if deny => echo(&body, DENIAL).map(Body::from),
                    Ok(body) if allow => echo(&body, ALLOWANCE).map(Body::from),
                    Ok(_) => Some(Body::from(REVIEW)),
                    Err(_) => None,
                };
                let response = match answer {
                    Some(answer) => Response::builder()
                        .header("content-type", "application/json")
                        .body(answer),
                    None => Response::builder().status(400).body(Body::empty()),
                };
                Ok::<_, Infallible>(response.unwrap_or_default())
            });
            // The same builder settings as the guard's (src/server/).
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.idle_timeout)
                .max_buf_size(64 * 1024);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(limits.max_streams)
                .max_header_list_size(64 * 1024)
                .keep_alive_interval(limits.idle_timeout)
                .keep_alive_timeout(limits.idle_timeout);
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        });
    }
}
