//! Certificates: the development CA and serving certificate (`cds-secret-guard certs`),
//! the serving certificate reloaded from files, and the certificates the guard makes,
//! publishes and rotates itself.

mod dev;
pub mod reload;
pub mod renewal;

pub use dev::{CertFiles, write};
