//! What a published release holds to, through `make release` (hack/release.sh) and the
//! registry: the image and the chart signed with the release's cosign key and the image's
//! SBOM attested; releasing the same commit again changes nothing (`make reproduce` shows
//! that two builds from scratch give one digest); other content under a published version is refused, and nothing is
//! pushed. What an operator verifies before installing fails on an unsigned image and on
//! one signed by another key.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use base64::Engine;
use serde_json::Value;

use crate::{
    cluster,
    install::{VERSION, run, stdout},
    release::Registry,
};

/// The password of the test's keys, given to cosign as `COSIGN_PASSWORD`.
const PASSWORD: &str = "shipped-suite";

/// A cosign key pair under target/shipped/<name>: `cosign.key`, `cosign.pub`.
pub struct SigningKey {
    dir: PathBuf,
}

impl SigningKey {
    /// A new key pair, as `cosign generate-key-pair` makes one.
    pub fn generate(registry: &Registry, name: &str) -> Self {
        let dir = cluster::repo().join("target/shipped").join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        run(registry
            .tool("cosign")
            .current_dir(&dir)
            .env("COSIGN_PASSWORD", PASSWORD)
            .arg("generate-key-pair"));
        Self { dir }
    }

    pub fn private(&self) -> PathBuf {
        self.dir.join("cosign.key")
    }

    pub fn public(&self) -> PathBuf {
        self.dir.join("cosign.pub")
    }
}

/// `make release` with `COSIGN_KEY`.
fn release_signed(registry: &Registry, tree: Option<&Path>, key: &SigningKey) -> Output {
    let mut command = registry.release_command(tree);
    command
        .env("COSIGN_KEY", key.private())
        .env("COSIGN_PASSWORD", PASSWORD);
    let output = command.output().unwrap();
    println!(
        "published: release.sh{}: {}",
        tree.map(|tree| format!(" {}", tree.display())).unwrap_or_default(),
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|line| line.starts_with("release.sh:"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    output
}

/// `cosign verify` of `reference` against `key`'s public half, as docs/install.md has it.
fn verify(registry: &Registry, key: &SigningKey, reference: &str) -> Output {
    registry
        .tool("cosign")
        .arg("verify")
        .arg("--key")
        .arg(key.public())
        .args(["--insecure-ignore-tlog=true", reference])
        .output()
        .unwrap()
}

/// `cosign verify-attestation --type cyclonedx` of `reference`, as docs/install.md has it.
fn verify_sbom(registry: &Registry, key: &SigningKey, reference: &str) -> Output {
    registry
        .tool("cosign")
        .arg("verify-attestation")
        .arg("--key")
        .arg(key.public())
        .args(["--type", "cyclonedx", "--insecure-ignore-tlog=true", reference])
        .output()
        .unwrap()
}

/// A checkout of HEAD under target/shipped/<name>, changed by `change`.
fn variant(name: &str, change: impl FnOnce(&Path)) -> PathBuf {
    let repo = cluster::repo();
    let tree = repo.join("target/shipped").join(name);
    let git = |args: &[&str]| Command::new("git").current_dir(repo).args(args).output().unwrap();
    let _ = git(&["worktree", "remove", "--force", tree.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&tree);
    let added = git(&["worktree", "add", "--detach", tree.to_str().unwrap(), "HEAD"]);
    assert!(added.status.success(), "git worktree add: {added:?}");
    change(&tree);
    tree
}

fn append(file: &Path, text: &str) {
    let mut content = std::fs::read_to_string(file).unwrap();
    content.push_str(text);
    std::fs::write(file, content).unwrap();
}

/// This checkout released with a key: signed, attested, and never moved afterwards.
pub fn released_signed_and_immutable(registry: &Registry, key: &SigningKey) {
    let image = format!("{}/cds-secret-guard:{VERSION}", registry.address);
    let chart = format!("{}/charts/cds-secret-guard:{VERSION}", registry.address);
    let released = release_signed(registry, None, key);
    assert!(released.status.success(), "release: {released:?}");
    let digest = registry.digest(&image);
    let chart_digest = registry.digest(&chart);

    // What an operator runs before installing.
    for (reference, signed) in [(&image, &digest), (&chart, &chart_digest)] {
        let verified = verify(registry, key, reference);
        assert!(verified.status.success(), "cosign verify {reference}: {verified:?}");
        assert!(
            stdout(&verified).contains(signed.as_str()),
            "the signature is not {reference}'s: {}",
            stdout(&verified)
        );
    }
    let attested = verify_sbom(registry, key, &image);
    assert!(attested.status.success(), "cosign verify-attestation: {attested:?}");
    let envelope: Value = serde_json::from_str(stdout(&attested).lines().next().unwrap_or_default()).unwrap();
    let statement = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    let statement: Value = serde_json::from_slice(&statement).unwrap();
    assert_eq!(
        format!(
            "sha256:{}",
            statement["subject"][0]["digest"]["sha256"].as_str().unwrap()
        ),
        digest,
        "the SBOM is not the image's"
    );
    let sbom = &statement["predicate"];
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["metadata"]["component"]["name"], "cds-secret-guard");
    assert_eq!(sbom["metadata"]["component"]["version"], VERSION);
    let components: Vec<&str> = sbom["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|component| component["name"].as_str())
        .collect();
    for crate_name in ["kube", "rustls", "axum", "tokio"] {
        assert!(
            components.contains(&crate_name),
            "the SBOM lacks {crate_name}: {components:?}"
        );
    }
    for test_only in ["criterion", "proptest", "testkit"] {
        assert!(
            !components.contains(&test_only),
            "the SBOM lists {test_only}, which the binary does not hold"
        );
    }
    println!(
        "published: {image} {digest} signed, chart {chart_digest} signed, SBOM of {} crates attested",
        components.len()
    );

    // Released again: the same image (built again from the engine's cache; `make
    // reproduce` builds it twice from scratch), nothing pushed, nothing signed again.
    let tags_before = registry.tags("cds-secret-guard");
    let again = release_signed(registry, None, key);
    assert!(again.status.success(), "the same commit released again: {again:?}");
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains(&format!("{image} already holds {digest}: not pushed again")),
        "the rebuilt image is not the released one: {said}"
    );
    assert!(said.contains("already holds this chart"), "{said}");
    assert_eq!(registry.digest(&image), digest);
    assert_eq!(registry.digest(&chart), chart_digest);
    assert_eq!(registry.tags("cds-secret-guard"), tags_before, "a tag came or went");

    // Other content under the published version, in the image or in the chart alone:
    // refused before anything is pushed.
    let other_image = variant("variant-image", |tree| {
        append(
            &tree.join("Dockerfile"),
            "LABEL io.cds-secret-guard.variant=\"other image\"\n",
        )
    });
    let other_chart = variant("variant-chart", |tree| {
        append(
            &tree.join("manifests/helm/cds-secret-guard/values.yaml"),
            "# another chart\n",
        )
    });
    for tree in [&other_image, &other_chart] {
        let refused = release_signed(registry, Some(tree), key);
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success()
                && said.contains("a published version never changes")
                && said.contains("Nothing was pushed"),
            "other content released as {VERSION}: {refused:?}"
        );
        assert_eq!(registry.digest(&image), digest, "the image tag moved");
        assert_eq!(registry.digest(&chart), chart_digest, "the chart tag moved");
        assert_eq!(registry.tags("cds-secret-guard"), tags_before, "a tag came or went");
    }
    // The variants' builds took the local tag: this checkout's image again.
    run(&mut Command::new(cluster::repo().join("hack/image.sh")));
}

/// What fails verification: the previous release, pushed without a key, and the same
/// image signed by another key than the release's.
pub fn unsigned_and_foreign_signatures_fail(registry: &Registry, key: &SigningKey, previous_version: &str) {
    let previous = format!("{}/cds-secret-guard:{previous_version}", registry.address);
    let unsigned = verify(registry, key, &previous);
    assert!(!unsigned.status.success(), "an unsigned image verified: {unsigned:?}");
    let unattested = verify_sbom(registry, key, &previous);
    assert!(
        !unattested.status.success(),
        "an unattested image verified: {unattested:?}"
    );

    let foreign = SigningKey::generate(registry, "foreign-key");
    let reference = format!("{}/cds-secret-guard@{}", registry.address, registry.digest(&previous));
    run(registry
        .tool("cosign")
        .env("COSIGN_PASSWORD", PASSWORD)
        .arg("sign")
        .arg("--key")
        .arg(foreign.private())
        .args(["--use-signing-config=false", "--tlog-upload=false", "--yes", &reference]));
    assert!(
        verify(registry, &foreign, &previous).status.success(),
        "the foreign signature is not there"
    );
    let forged = verify(registry, key, &previous);
    assert!(!forged.status.success(), "another key's signature verified: {forged:?}");
    println!(
        "published: {previous} unsigned and signed by another key: {}",
        String::from_utf8_lossy(&forged.stderr)
            .lines()
            .last()
            .unwrap_or_default()
    );
}

/// The released image is one index of linux/amd64 and linux/arm64, each manifest's config
/// of its platform; the arm64 binary, run under qemu-user from its image's own files,
/// names the release and answers a `/validate` over TLS with the rules' verdict.
pub async fn both_platforms_are_released(registry: &Registry) {
    let image = format!("{}/cds-secret-guard:{VERSION}", registry.address);
    let index: Value = serde_json::from_str(&stdout(&run(registry.tool("crane").args(["manifest", &image])))).unwrap();
    assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json", "{index}");
    let mut platforms = Vec::new();
    for manifest in index["manifests"].as_array().unwrap() {
        let platform = format!(
            "{}/{}",
            manifest["platform"]["os"].as_str().unwrap(),
            manifest["platform"]["architecture"].as_str().unwrap()
        );
        let reference = format!(
            "{}/cds-secret-guard@{}",
            registry.address,
            manifest["digest"].as_str().unwrap()
        );
        let config: Value =
            serde_json::from_str(&stdout(&run(registry.tool("crane").args(["config", &reference])))).unwrap();
        assert_eq!(
            format!(
                "{}/{}",
                config["os"].as_str().unwrap(),
                config["architecture"].as_str().unwrap()
            ),
            platform
        );
        assert_eq!(config["config"]["User"], "65532:65532", "{platform}");
        platforms.push(platform);
    }
    platforms.sort();
    assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);

    // The arm64 image's files, as a node would unpack them.
    let root = cluster::repo().join("target/shipped/arm64-root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let crane = cluster::repo().join("target/tools/bin/crane");
    run(registry.logged_in(Command::new("bash")).args([
        "-c",
        &format!(
            "set -o pipefail; {} export --platform linux/arm64 {image} - | tar -C {} -x",
            crane.display(),
            root.display()
        ),
    ]));
    let qemu = stdout(&run(&mut Command::new(cluster::repo().join("hack/qemu-user.sh"))))
        .trim()
        .to_owned();
    let binary = root.join("usr/local/bin/cds-secret-guard");
    let arm64 = || {
        let mut command = Command::new(&qemu);
        command.arg("-L").arg(&root).arg(&binary);
        command
    };
    // Built in the image's build stage, it names none of that stage's paths.
    let bytes = std::fs::read(&binary).unwrap();
    for build_path in ["/usr/local/cargo/", "/usr/local/rustup/", "/src/target/"] {
        assert!(
            !bytes
                .windows(build_path.len())
                .any(|window| window == build_path.as_bytes()),
            "the arm64 binary names the build path {build_path}"
        );
    }
    let version = stdout(&run(arm64().arg("--version"))).trim().to_owned();
    assert!(version.contains(VERSION), "arm64 --version: {version}");

    let certs = tempfile::tempdir().unwrap();
    cds_secret_guard::certs::write(certs.path(), &["localhost".to_owned()]).unwrap();
    let port = |_| {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (admission, probes) = (port(()), port(()));
    let mut guard = arm64()
        .arg("serve")
        .env("KUBECONFIG", certs.path().join("none"))
        .env("CDS_GUARD_LISTEN", format!("127.0.0.1:{admission}"))
        .env("CDS_GUARD_PROBE_LISTEN", format!("127.0.0.1:{probes}"))
        .env("CDS_GUARD_TLS_CERT", certs.path().join("tls.crt"))
        .env("CDS_GUARD_TLS_KEY", certs.path().join("tls.key"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.path().join("ca.crt")).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while client
        .get(format!("https://localhost:{admission}/"))
        .send()
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < deadline, "the arm64 guard did not start");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // A worker secret 5 s old: refused as too young, before any read of the cluster.
    let review = testkit::fake::set(
        testkit::fake::review("secret-delete"),
        "/request/oldObject/metadata/creationTimestamp",
        testkit::fake::time_ago(std::time::Duration::from_secs(5)),
    );
    let answer: Value = client
        .post(format!("https://localhost:{admission}/validate"))
        .json(&review)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let _ = guard.kill();
    let _ = guard.wait();
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["auditAnnotations"]["reason"], "too-young",
        "{answer}"
    );
    println!(
        "published: linux/amd64 and linux/arm64 in one index; arm64 under qemu-user: {version}, /validate refused a 5 s old worker secret (too-young)"
    );
}
