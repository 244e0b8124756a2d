//! What operators see beside the admission answers: metrics, Events and the log.

pub mod events;
pub mod metrics;
pub mod telemetry;
