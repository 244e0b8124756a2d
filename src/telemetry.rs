//! Logging: `RUST_LOG` filters (default `info`); JSON lines by default so that audit
//! lines are machine-readable, text on request.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::cli::LogFormat;

/// Installs the global subscriber. Logs go to stdout.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .init(),
        LogFormat::Text => registry.with(fmt::layer()).init(),
    }
}
