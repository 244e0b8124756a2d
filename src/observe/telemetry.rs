//! Logging: `RUST_LOG` filters (default `info`); JSON lines by default so that audit
//! lines are machine-readable, text on request.
//!
//! Audit lines (target [`AUDIT_TARGET`]) have a layer of their own that
//! `RUST_LOG` does not filter: an operator who quiets a busy guard with `RUST_LOG=warn`
//! keeps the audit trail. Lines go through a non-blocking writer (a request never waits
//! for stdout) that is not lossy: when the buffer is full, writers wait rather than drop.

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::{
    EnvFilter, Layer,
    filter::{FilterExt, filter_fn},
    fmt,
    prelude::*,
};

/// The log target of audit lines; `RUST_LOG` does not filter it. Operators' log
/// pipelines select audit lines by it: it stays this whatever module writes them.
pub const AUDIT_TARGET: &str = "cds_secret_guard::audit";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (the default: audit lines are meant for machines).
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber; logs go to stdout. Keep the guard until exit: dropping
/// it flushes the lines still buffered.
pub fn init(format: LogFormat) -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default().lossy(false).finish(std::io::stdout());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let is_audit = || filter_fn(|meta| meta.target() == AUDIT_TARGET);
    let (logs, audit) = match format {
        LogFormat::Json => {
            let layer = || {
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(writer.clone())
            };
            (layer().boxed(), layer().boxed())
        }
        LogFormat::Text => {
            let layer = || fmt::layer().with_writer(writer.clone());
            (layer().boxed(), layer().boxed())
        }
    };
    tracing_subscriber::registry()
        .with(vec![
            logs.with_filter(filter.and(is_audit().not())).boxed(),
            audit.with_filter(is_audit()).boxed(),
        ])
        .init();
    guard
}
