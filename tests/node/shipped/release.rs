//! The guard as an operator gets it: `make release` pushes the image and the chart to the
//! node's registry (TLS, basic authentication), the chart is installed from `oci://`, and
//! the node pulls the image with the chart's `imagePullSecrets`. The previous release (the
//! commit `PREVIOUS_RELEASE` names: its chart, and its sources built with this checkout's
//! Dockerfile, whose compiled crates they share) is upgraded to this one, rolled back and
//! forward again under the hatchery's load; and an install with a tag that does not exist
//! leaves no webhook behind.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use serde_json::Value;

use crate::{
    cluster::{self, TestNamespace, kubectl},
    install::{self, Release, VERSION, eventually, kubectl_json, run, stdout},
    published::{self, SigningKey},
    seed, webhook_calls,
};

/// The release before this one: the commit that made 0.2.0 (its version and CHANGELOG
/// section).
pub const PREVIOUS_RELEASE: &str = "ed0bfa02966d067991ae168265864289210ba924";
/// Its version, as its Cargo.toml says.
pub const PREVIOUS_VERSION: &str = "0.2.0";
const NAMESPACE: &str = "cds-secret-guard";
const PULL_SECRET: &str = "registry-credentials";

/// The node's registry, as `cluster.sh registry` gives it, released to under a path
/// (`host:port/team-<run>`), as a team's project in a shared registry is: a path of its
/// own for each run, as the registry outlives the runs and a published version never
/// changes.
#[derive(Clone)]
pub struct Registry {
    /// `host:port/team-<run>`.
    pub address: String,
    /// `host:port`: what logins and pull secrets name.
    pub host: String,
    pub ca: PathBuf,
    pub user: String,
    pub password: String,
    docker_config: PathBuf,
}

impl Registry {
    pub fn of_the_node() -> Self {
        let output = run(Command::new(cluster::repo().join("hack/controlplane/cluster.sh")).arg("registry"));
        let vars: std::collections::BTreeMap<String, String> = stdout(&output)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        let var = |key: &str| {
            vars.get(key)
                .cloned()
                .unwrap_or_else(|| panic!("cluster.sh registry: no {key}"))
        };
        Self {
            address: format!("{}/team-{}", var("REGISTRY"), std::process::id()),
            host: var("REGISTRY"),
            ca: var("REGISTRY_CA").into(),
            user: var("REGISTRY_USER"),
            password: var("REGISTRY_PASSWORD"),
            docker_config: var("DOCKER_CONFIG").into(),
        }
    }

    /// `hack/release.sh` (what `make release` runs) for this checkout or another, as an
    /// operator with a login and the registry's CA; helm's logins kept under target/. More
    /// environment as the caller needs it (`COSIGN_KEY`, `DOCKERFILE`).
    pub fn release_command(&self, tree: Option<&Path>) -> Command {
        let mut command = Command::new(cluster::repo().join("hack/release.sh"));
        command
            .env("REGISTRY", &self.address)
            .env("REGISTRY_CA", &self.ca)
            .env("REGISTRY_USER", &self.user)
            .env("REGISTRY_PASSWORD", &self.password)
            .env("DOCKER_CONFIG", &self.docker_config)
            .env("HELM_REGISTRY_CONFIG", helm_registry_config());
        if let Some(tree) = tree {
            command.arg(tree);
        }
        command
    }

    /// A tool of `target/tools/bin` (crane, cosign) that trusts the registry's CA and
    /// holds its login.
    pub fn tool(&self, name: &str) -> Command {
        self.logged_in(Command::new(cluster::repo().join("target/tools/bin").join(name)))
    }

    /// `command`, trusting the registry's CA and holding its login.
    pub fn logged_in(&self, mut command: Command) -> Command {
        command
            .env("SSL_CERT_FILE", &self.ca)
            .env("DOCKER_CONFIG", &self.docker_config);
        command
    }

    /// The digest `reference`'s tag holds.
    pub fn digest(&self, reference: &str) -> String {
        stdout(&run(self.tool("crane").args(["digest", reference])))
            .trim()
            .to_owned()
    }

    /// The tags of `repository` (under the registry's path).
    pub fn tags(&self, repository: &str) -> Vec<String> {
        let listed = run(self
            .tool("crane")
            .args(["ls", &format!("{}/{repository}", self.address)]));
        let mut tags: Vec<String> = stdout(&listed).lines().map(str::to_owned).collect();
        tags.sort();
        tags
    }

    /// The same registry under another path, as another team's project.
    pub fn elsewhere(&self, team: &str) -> Self {
        Self {
            address: format!("{}/{team}-{}", self.host, std::process::id()),
            ..self.clone()
        }
    }

    /// The docker configuration holding the registry's login.
    pub fn docker_config(&self) -> &Path {
        &self.docker_config
    }

    pub fn chart(&self) -> String {
        format!("oci://{}/charts/cds-secret-guard", self.address)
    }
}

pub fn helm_registry_config() -> PathBuf {
    let dir = cluster::repo().join("target/shipped");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("helm-registry.json")
}

/// `helm` on the control plane, with the registry login `Registry::release` made.
pub fn helm() -> Command {
    let mut command = Command::new(cluster::repo().join("target/tools/bin/helm"));
    command
        .env("KUBECONFIG", cluster::control_plane())
        .env("HELM_REGISTRY_CONFIG", helm_registry_config())
        .args(["-n", NAMESPACE]);
    command
}

/// The commit `PREVIOUS_RELEASE` names, checked out under target/ (fetched first when
/// this clone is shallow).
fn previous_release_tree() -> PathBuf {
    let repo = cluster::repo();
    let tree = repo.join("target/shipped/previous-release");
    let git = |args: &[&str]| Command::new("git").current_dir(repo).args(args).output().unwrap();
    if !git(&["cat-file", "-e", &format!("{PREVIOUS_RELEASE}^{{commit}}")])
        .status
        .success()
    {
        let fetched = git(&["fetch", "--quiet", "origin", PREVIOUS_RELEASE]);
        assert!(
            fetched.status.success(),
            "the previous release's commit {PREVIOUS_RELEASE} is not in this clone and cannot be fetched: {}",
            String::from_utf8_lossy(&fetched.stderr)
        );
    }
    let _ = git(&["worktree", "remove", "--force", tree.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&tree);
    let added = git(&["worktree", "add", "--detach", tree.to_str().unwrap(), PREVIOUS_RELEASE]);
    assert!(added.status.success(), "git worktree add: {added:?}");
    let cargo = std::fs::read_to_string(tree.join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!("\nversion = \"{PREVIOUS_VERSION}\"\n")) && PREVIOUS_VERSION != VERSION,
        "{PREVIOUS_RELEASE} is not release {PREVIOUS_VERSION}, or that is this one"
    );
    tree
}

/// The release's replicas all run `version` from the registry, pulled by the node.
async fn running_from_the_registry(registry: &Registry, version: &str) {
    let image = format!("{}/cds-secret-guard:{version}", registry.address);
    install::every_replica(NAMESPACE, &image, |pod| {
        pod["spec"]["containers"][0]["image"] == image.as_str()
            && pod["status"]["containerStatuses"][0]["imageID"]
                .as_str()
                .is_some_and(|id| id.starts_with(&registry.address))
    })
    .await;
}

/// A webhook configuration of the release's name exists.
pub fn webhook_registered() -> bool {
    ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"]
        .iter()
        .any(|kind| {
            kubectl()
                .args(["get", kind, "cds-secret-guard", "-o", "name"])
                .output()
                .unwrap()
                .status
                .success()
        })
}

/// The pull secret the chart's `imagePullSecrets` names, in a fresh release namespace.
fn namespace_with_pull_secret(registry: &Registry) {
    let _ = kubectl()
        .args(["delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"])
        .output();
    run(kubectl().args(["create", "namespace", NAMESPACE]));
    run(kubectl().args([
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "docker-registry",
        PULL_SECRET,
        &format!("--docker-server={}", registry.host),
        &format!("--docker-username={}", registry.user),
        &format!("--docker-password={}", registry.password),
    ]));
}

/// `helm install` or `upgrade` from the registry as docs/install.md says, with the pull
/// secret in the values file `my-values.yaml`; its output.
fn from_the_registry(registry: &Registry, verb: &str, version: &str, values: &[&str], timeout: &str) -> Output {
    let my_values = std::env::temp_dir().join(format!("my-values-{}.yaml", std::process::id()));
    std::fs::write(&my_values, format!("imagePullSecrets:\n  - name: {PULL_SECRET}\n")).unwrap();
    let mut command = helm();
    command
        .args([verb, "cds-secret-guard", &registry.chart(), "--version", version])
        .arg("--ca-file")
        .arg(&registry.ca)
        .arg("-f")
        .arg(&my_values)
        .args(["--rollback-on-failure", "--wait", "--timeout", timeout]);
    for value in values {
        command.args(["--set", value]);
    }
    let started = std::time::Instant::now();
    let output = command.output().unwrap();
    println!("release: helm {verb} {version} took {:?}", started.elapsed());
    output
}

/// The release's revisions, as `helm history` gives them.
pub fn helm_history() -> Vec<Value> {
    let history = stdout(&run(helm().args(["history", "cds-secret-guard", "-o", "json"])));
    serde_json::from_str(&history).unwrap()
}

/// `helm rollback` to a revision, waiting for the rollout.
fn rollback(revision: &str) {
    let started = std::time::Instant::now();
    run(helm().args(["rollback", "cds-secret-guard", revision, "--wait", "--timeout", "3m"]));
    println!("release: helm rollback {revision} took {:?}", started.elapsed());
}

/// Both releases pushed, the previous one installed from `oci://` and pulled with the
/// pull secret, then upgraded, rolled back and forward again while the hatchery's race
/// runs: not one failed webhook call, no secret lost, every worker completed.
pub async fn released_chart_upgrades_and_rolls_back_under_load() {
    let registry = Registry::of_the_node();
    let previous = previous_release_tree();
    // Its sources built with this checkout's Dockerfile: the crates both share are
    // compiled once.
    run(registry
        .release_command(Some(&previous))
        .env("DOCKERFILE", cluster::repo().join("Dockerfile")));
    let key = SigningKey::generate(&registry, "release-key");
    published::released_signed_and_immutable(&registry, &key);
    published::unsigned_and_foreign_signatures_fail(&registry, &key, PREVIOUS_VERSION);
    published::both_platforms_are_released(&registry).await;

    // Without credentials, the registry turns the node away: the pulls below are the
    // pull secret's.
    let anonymous = TestNamespace::new("registry-anonymous").await;
    install::default_service_account(&anonymous.name).await;
    run(kubectl().args([
        "-n",
        &anonymous.name,
        "run",
        "anonymous",
        &format!("--image={}/cds-secret-guard:{VERSION}", registry.address),
        "--restart=Never",
        "--",
        "--version",
    ]));
    eventually("an anonymous pull refused", Duration::from_secs(60), || {
        let pod = kubectl_json(&["-n", &anonymous.name, "get", "pod", "anonymous"]);
        let reason = pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        matches!(reason.as_str(), "ErrImagePull" | "ImagePullBackOff").then_some(())
    })
    .await;

    namespace_with_pull_secret(&registry);
    let installed = from_the_registry(&registry, "install", PREVIOUS_VERSION, &[], "3m");
    assert!(installed.status.success(), "install {PREVIOUS_VERSION}: {installed:?}");
    // Uninstalled when dropped.
    let release = Release {
        name: "cds-secret-guard",
        namespace: NAMESPACE,
    };
    running_from_the_registry(&registry, PREVIOUS_VERSION).await;
    let probe = TestNamespace::new("release-probe").await;
    probe.worker_secret("probe").await;
    install::refused_by_the_guard(&probe, "cds-worker-config-probe").await;

    let ns = TestNamespace::new("seed-release").await;
    install::default_service_account(&ns.name).await;
    let (calls_before, failed_before) = webhook_calls();
    let load = seed::start(
        &ns,
        &seed::Spawns {
            workers: 120,
            every: Duration::from_millis(500),
            list_lag: Duration::from_millis(500),
        },
        true,
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let upgraded = tokio::task::block_in_place(|| from_the_registry(&registry, "upgrade", VERSION, &[], "3m"));
    assert!(upgraded.status.success(), "upgrade to {VERSION}: {upgraded:?}");
    running_from_the_registry(&registry, VERSION).await;
    tokio::task::block_in_place(|| rollback("1"));
    running_from_the_registry(&registry, PREVIOUS_VERSION).await;
    tokio::task::block_in_place(|| rollback("2"));
    running_from_the_registry(&registry, VERSION).await;
    let outcome = load.finish(&ns).await;
    let (calls_after, failed_after) = webhook_calls();
    println!(
        "release: upgrade {PREVIOUS_VERSION} -> {VERSION}, rollback, forward under load: {outcome:?}; {} webhook calls, {} failed",
        calls_after - calls_before,
        failed_after - failed_before
    );
    assert_eq!(failed_after - failed_before, 0.0, "failed webhook calls");
    assert!(calls_after > calls_before);
    assert!(
        outcome.config_errors.is_empty(),
        "workers lost their secret: {:?}",
        outcome.config_errors
    );
    assert_eq!(outcome.completed.len(), outcome.workers);
    let charts: Vec<String> = helm_history()
        .iter()
        .map(|revision| revision["chart"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        charts,
        [PREVIOUS_VERSION, VERSION, PREVIOUS_VERSION, VERSION].map(|v| format!("cds-secret-guard-{v}")),
        "install, upgrade, rollback, rollback"
    );
    drop(release);
    eventually("the release's webhooks gone", Duration::from_secs(60), || {
        (!webhook_registered()).then_some(())
    })
    .await;

    a_bad_tag_leaves_no_webhook(&registry).await;

    crate::operator_pages::the_operator_pages_run_as_written(&registry).await;
}

/// The install docs/install.md gives, with an image tag the registry does not have: the
/// replicas never become ready, and `--rollback-on-failure` takes everything away again,
/// the fail-closed webhook first among it.
async fn a_bad_tag_leaves_no_webhook(registry: &Registry) {
    namespace_with_pull_secret(registry);
    let installed = from_the_registry(registry, "install", VERSION, &["image.tag=does-not-exist"], "20s");
    println!(
        "release: install with a missing tag: {}",
        String::from_utf8_lossy(&installed.stderr).trim()
    );
    assert!(!installed.status.success(), "the install with a missing tag succeeded");
    assert!(!webhook_registered(), "a webhook outlived the failed install");
    let status = helm().args(["status", "cds-secret-guard"]).output().unwrap();
    assert!(
        !status.status.success() && String::from_utf8_lossy(&status.stderr).contains("not found"),
        "the failed release is still there: {status:?}"
    );
    run(kubectl().args(["delete", "namespace", NAMESPACE, "--wait"]));
}
