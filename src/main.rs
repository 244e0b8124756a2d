//! `cds-secret-guard`: parse flags, set up, and hand over to the library.

use anyhow::Context;
use cds_secret_guard::{
    Server, certs,
    cli::{Cli, Command},
    telemetry, webhooks,
};
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Both kube's client and the server use rustls; pick the provider once, before either
    // builds a configuration, so neither has to guess.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;

    match cli.command {
        Command::Serve(args) => {
            telemetry::init(args.log_format);
            let server = Server::from_config(args.into_config()).await;
            let bound = server.bind().await.context("cannot start the server")?;
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            bound.serve(shutdown).await?;
        }
        Command::Certs(args) => {
            let files = certs::write(&args.out, &args.hosts)?;
            println!(
                "wrote {}, {} and {}",
                files.ca_cert.display(),
                files.tls_cert.display(),
                files.tls_key.display()
            );
        }
        Command::Webhooks(args) => print!("{}", webhooks::render(&args)?),
    }
    Ok(())
}

/// Cancels `token` on SIGTERM (Kubernetes stopping the pod) or Ctrl-C.
async fn cancel_on_signal(token: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutdown signal received");
    token.cancel();
}
