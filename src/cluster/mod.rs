//! What the guard knows of the cluster, for every rule set: the objects a pod names, the
//! revisions that gate a watch, the namespaces' watch and the Lease that elects the one
//! replica doing background writes.

pub mod gate;
pub mod lease;
mod metadata;
pub mod namespaces;
pub mod references;
mod retries;
pub mod revision;
mod scope;
mod text;

pub use metadata::metadata_store;
pub use retries::Retries;
pub use scope::{api_in, scopes};
pub use text::Text;
