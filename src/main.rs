//! `cds-secret-guard`: parse flags, set up, and hand over to the library.

use std::process::ExitCode;

use anyhow::Context;
use cds_secret_guard::{
    Server, certs,
    cli::check,
    cli::wait,
    cli::webhooks,
    cli::{Cli, Command, OutputFormat},
    observe::telemetry,
    rules::in_use::finalizer,
};
use tokio_util::sync::CancellationToken;

/// jemalloc, by measurement (docs/design/benchmarks.md): against glibc's allocator, side by side, 6 to
/// 16 % less CPU per admission request over TLS, and 33 MiB resident against 38 with 10,000
/// worker pods watched (mimalloc saved CPU too, but held more memory than glibc).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse_args();
    // Both kube's client and the server use rustls; pick the provider once, before either
    // builds a configuration, so neither has to guess.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;

    match cli.command {
        Command::Serve(args) => {
            // Held until exit: dropping it flushes the buffered log lines.
            let _logs = telemetry::init(args.log_format);
            let config = args.into_config();
            config.validate()?;
            let server = Server::from_config(config).await;
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
        Command::ReleaseFinalizers(args) => {
            let client = args.cluster.client().await.context("no Kubernetes client")?;
            let released = finalizer::release_all(&client, &args.namespaces).await?;
            for object in &released.objects {
                println!("released {object}");
            }
            let count = match released.objects.len() {
                1 => "1 object".to_owned(),
                n => format!("{n} objects"),
            };
            println!("{count} released from {}", cds_secret_guard::rules::in_use::FINALIZER);
        }
        Command::Wait(args) => {
            let client = args.cluster.client().await.context("no Kubernetes client")?;
            let namespace = args.namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let target = wait::Target {
                service: args.service,
                namespace,
                port: args.port,
                webhook_configuration: args.webhook_configuration,
                answers: args.answers,
                timeout: args.timeout,
            };
            let took = wait::until_callable(&client, &target).await?;
            println!(
                "the guard answered {} calls in a row at https://{}:{} after {took:.1?}",
                target.answers,
                target.host(),
                target.port
            );
        }
        Command::Check(args) => {
            let client = args.cluster.client().await.context("no Kubernetes client")?;
            let namespace = match (&args.namespace, args.all_namespaces) {
                (_, true) => None,
                (Some(namespace), false) => Some(namespace.clone()),
                (None, false) => Some(client.default_namespace().to_owned()),
            };
            let policy = args.secrets.policy();
            let reports = check::run(client, &policy, namespace.as_deref()).await?;
            match args.output {
                OutputFormat::Table => print!("{}", check::table(&reports)),
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
            }
            if reports
                .iter()
                .any(|report| report.verdict == check::Verdict::Mismatched)
            {
                std::process::exit(1);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
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
