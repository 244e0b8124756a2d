//! Stamps the binary with the commit it was built from (`--version`, the build-info metric).
//! A build without the repository (the image's: `.git` is not in its context) gets it from
//! `CDS_GUARD_COMMIT`, which the Dockerfile's `GIT_COMMIT` argument sets.

use std::process::Command;

fn main() {
    println!("cargo::rerun-if-env-changed=CDS_GUARD_COMMIT");
    let commit = std::env::var("CDS_GUARD_COMMIT")
        .ok()
        .filter(|commit| !commit.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo::rustc-env=CDS_GUARD_COMMIT={commit}");
}

/// HEAD's short hash, watched through HEAD's reflog, which every commit and checkout
/// appends to.
fn git_commit() -> Option<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    };
    let git_dir = git(&["rev-parse", "--absolute-git-dir"])?;
    println!("cargo::rerun-if-changed={git_dir}/HEAD");
    println!("cargo::rerun-if-changed={git_dir}/logs/HEAD");
    git(&["rev-parse", "--short=12", "HEAD"])
}
