//! What the tests, benchmarks, examples and fuzz targets share; never shipped.
//!
//! - [`fake`]: AdmissionReview fixtures from `tests/data`, an in-memory cluster behind the
//!   lookup trait, a configuration on loopback ports, requests through the router;
//! - [`in_use`]: the same for in-use protection;
//! - [`attack`]: raw TLS, HTTP/1.1 and HTTP/2 clients that a conforming client is not;
//! - [`fuzz`]: the fuzz targets' checks, replayed over the seed corpus by the tests;
//! - [`cluster`]: the real control plane, the guard binary registered with it, a
//!   namespace per test;
//! - [`install`], [`seed`]: the image and the chart on the node, and a hatchery's load;
//! - [`race`]: the hatchery race against CDS's cleanup;
//! - [`pages`]: the shell blocks of the operator pages, as the tests run them.

use std::path::{Path, PathBuf};

pub mod attack;
pub mod cluster;
pub mod fake;
pub mod fuzz;
pub mod in_use;
pub mod install;
pub mod pages;
pub mod race;
pub mod seed;

/// The repository's root.
pub fn repo() -> &'static Path {
    static REPO: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    REPO.get_or_init(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("testkit/ is a folder of the repository")
            .to_path_buf()
    })
}
