//! The Helm chart (`manifests/helm/cds-secret-guard`): `helm lint` and `helm template` for
//! every certificate source and scope, one source of truth for the webhook configurations
//! (the chart's, the kustomize manifests' and `cds-secret-guard webhooks`' must agree),
//! the same objects and security settings as the kustomize base, a generated certificate
//! the guard really serves, and `helm install`, `upgrade` and `uninstall` on the real
//! apiserver of the local control plane.
//!
//! helm comes from `hack/tools/build.sh` (`make test` runs it) and the control plane
//! from `hack/controlplane/cluster.sh`; when either is missing the tests fail, never skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use testkit::cluster;
use testkit::fake as common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::Arc,
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use cds_secret_guard::{Server, certs, cli::webhooks};
use serde_json::{Value, json};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/helm/cds-secret-guard");
const MATCH_CONDITIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/manifests/helm/cds-secret-guard/files/match-conditions.yaml"
);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `helm` from `hack/tools/build.sh`.
fn helm() -> Command {
    let path = repo().join("target/tools/bin/helm");
    assert!(
        path.exists(),
        "{} is missing: run hack/tools/build.sh (make test does); this test never skips",
        path.display()
    );
    Command::new(path)
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A values file (JSON is YAML) in a temporary directory that lives as long as it.
struct Values {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn values(values: &Value) -> Values {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("values.yaml");
    std::fs::write(&path, values.to_string()).unwrap();
    Values { _dir: dir, path }
}

/// YAML documents of a stream, as JSON; comment-only documents left out.
fn documents(yaml: &str) -> Vec<Value> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        if current
            .lines()
            .any(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#'))
        {
            docs.push(serde_saphyr::from_str::<Value>(current).unwrap_or_else(|e| panic!("{e}:\n{current}")));
        }
        current.clear();
    };
    for line in yaml.lines() {
        if line == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

/// `helm template RELEASE CHART -n NAMESPACE -f VALUES`, as JSON objects.
fn template(release: &str, namespace: &str, overrides: &Value) -> Vec<Value> {
    let file = values(overrides);
    let output = run(helm()
        .args(["template", release, CHART, "-n", namespace, "-f"])
        .arg(&file.path));
    documents(&String::from_utf8(output.stdout).unwrap())
}

/// Whether `object` is a Helm hook.
fn is_hook(object: &Value) -> bool {
    !object["metadata"]["annotations"]["helm.sh/hook"].is_null()
}

/// Whether `object` is the post-install check's Job.
fn is_wait(object: &Value) -> bool {
    object["metadata"]["name"]
        .as_str()
        .is_some_and(|name| name.ends_with("-wait"))
}

/// `helm template` that must fail; returns its error output.
fn template_error(overrides: &Value) -> String {
    let file = values(overrides);
    let output = helm()
        .args(["template", "g", CHART, "-n", "cds-secret-guard", "-f"])
        .arg(&file.path)
        .output()
        .unwrap();
    assert!(!output.status.success(), "helm template accepted {overrides}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", kinds(objects)))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    kinds
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The webhooks of both configurations, without what depends on how the certificate is
/// delivered (caBundle).
fn webhooks_of(objects: &[Value]) -> (Value, Value) {
    let strip = |kind: &str| {
        let configuration = objects
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"));
        let mut webhooks = configuration["webhooks"].clone();
        for webhook in webhooks.as_array_mut().unwrap() {
            webhook["clientConfig"].as_object_mut().unwrap().remove("caBundle");
        }
        webhooks
    };
    (
        strip("ValidatingWebhookConfiguration"),
        strip("MutatingWebhookConfiguration"),
    )
}

/// `cds-secret-guard webhooks --service NAMESPACE/NAME --guard-namespace NAMESPACE FLAGS`,
/// with only `env` of the guard's variables set.
fn printed_webhooks(namespace: &str, name: &str, flags: &[&str], env: &[(String, String)]) -> Vec<Value> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cds-secret-guard"));
    for (variable, _) in std::env::vars().filter(|(k, _)| k.starts_with("CDS_GUARD_")) {
        command.env_remove(variable);
    }
    let output = run(command
        .args(["webhooks", "--service", &format!("{namespace}/{name}")])
        .args(["--guard-namespace", namespace])
        .args(flags)
        .envs(env.iter().map(|(k, v)| (k, v))));
    documents(&String::from_utf8(output.stdout).unwrap())
}

/// The guard's environment in a rendered Deployment.
fn guard_env(objects: &[Value]) -> Vec<(String, String)> {
    let deployment = of_kind(objects, "Deployment")[0];
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            // A value from the downward API reads as its source, e.g. `metadata.name`.
            let value = match e["value"].as_str() {
                Some(value) => value.to_owned(),
                None => e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap().to_owned(),
            };
            (e["name"].as_str().unwrap().to_owned(), value)
        })
        .collect()
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// `kubectl kustomize manifests/overlays/OVERLAY` (kubectl of the control plane).
fn kustomize(overlay: &str) -> Vec<Value> {
    let output = run(cluster::kubectl().args(["kustomize", &format!("manifests/overlays/{overlay}")]));
    documents(&String::from_utf8(output.stdout).unwrap())
}

/// The tls-secret overlay needs certificates in its certs/ (git-ignored).
fn tls_secret_overlay() -> Vec<Value> {
    certs::write(
        &repo().join("manifests/overlays/tls-secret/certs"),
        &["cds-secret-guard.cds-secret-guard.svc".to_owned()],
    )
    .unwrap();
    kustomize("tls-secret")
}

// --- one source of truth for the webhook configurations ---

/// What `files/match-conditions.yaml` must hold: `cds-secret-guard webhooks`' match
/// conditions for the default protected secrets.
fn generated_match_conditions() -> String {
    use clap::Parser;
    let cli = cds_secret_guard::cli::Cli::parse_from(["cds-secret-guard", "webhooks", "--url", "https://x"]);
    let cds_secret_guard::cli::Command::Webhooks(args) = cli.command else {
        unreachable!("parsed webhooks")
    };
    let (prefixes, label) = (&args.secrets.secret_prefixes, &args.secrets.worker_label);
    format!(
        "# Generated: the match conditions of `cds-secret-guard webhooks` (src/webhooks.rs)\n\
         # for the default protected secrets: prefixes {}; label {label}.\n\
         # Do not edit; regenerate: UPDATE_GENERATED=1 cargo test --test helm match_conditions\n\
         protectedSecret: {}\nworkerPod: {}\nnotRootCa: {}\nheld: {}\n",
        prefixes.join(", "),
        serde_json::to_string(&webhooks::protected_secret_expression(prefixes, label)).unwrap(),
        serde_json::to_string(&webhooks::worker_pod_expression(prefixes, label)).unwrap(),
        serde_json::to_string(&webhooks::not_root_ca_expression()).unwrap(),
        serde_json::to_string(&webhooks::held_expression()).unwrap(),
    )
}

#[test]
fn chart_carries_the_binarys_match_conditions() {
    let generated = generated_match_conditions();
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::write(MATCH_CONDITIONS, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(MATCH_CONDITIONS).unwrap();
    assert_eq!(
        committed, generated,
        "stale {MATCH_CONDITIONS}: UPDATE_GENERATED=1 cargo test --test helm match_conditions"
    );
}

#[test]
fn default_chart_webhooks_are_the_kustomize_bases_and_the_binarys() {
    // Release and namespace named as the kustomize base names its objects.
    let chart = template("cds-secret-guard", "cds-secret-guard", &json!({}));
    let (validating, mutating) = webhooks_of(&chart);

    let base = documents(&std::fs::read_to_string(repo().join("manifests/base/webhooks.yaml")).unwrap());
    assert_eq!(
        (validating.clone(), mutating.clone()),
        webhooks_of(&base),
        "chart ≠ manifests/base"
    );
    let printed = printed_webhooks("cds-secret-guard", "cds-secret-guard", &[], &[]);
    assert_eq!(
        (validating, mutating),
        webhooks_of(&printed),
        "chart ≠ webhooks --service"
    );
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        assert_eq!(
            find(&chart, kind, "cds-secret-guard")["metadata"]["name"],
            "cds-secret-guard"
        );
    }
}

#[test]
fn chart_webhooks_follow_exemptions_namespaces_and_timeouts_as_the_binary_does() {
    let cases: [(Value, Vec<&str>); 6] = [
        (json!({}), vec![]),
        (
            // Quotes and backslashes survive both quotings.
            json!({"exemptions": {"users": ["system:serviceaccount:kube-system:namespace-controller", "ops'bot", r"dom\admin"],
                                  "groups": ["cds-admins", "it's"]},
                   "webhooks": {"validating": {"timeoutSeconds": 3}}}),
            vec![
                "--exempt-user",
                "system:serviceaccount:kube-system:namespace-controller",
                "--exempt-user",
                "ops'bot",
                "--exempt-user",
                r"dom\admin",
                "--exempt-group",
                "cds-admins",
                "--exempt-group",
                "it's",
                "--timeout-seconds",
                "3",
            ],
        ),
        (
            json!({"namespaces": ["cds", "ci"]}),
            vec!["--namespace", "cds", "--namespace", "ci"],
        ),
        (
            json!({"exemptions": {"users": ["alice"]}, "namespaces": ["cds"], "certificate": {"source": "cert-manager"}}),
            vec!["--exempt-user", "alice", "--namespace", "cds"],
        ),
        (json!({"inUse": {"enabled": true}}), vec!["--in-use-protection"]),
        (
            json!({"inUse": {"enabled": true}, "namespaces": ["cds", "ci"], "exemptions": {"groups": ["ops"]}}),
            vec![
                "--in-use-protection",
                "--namespace",
                "cds",
                "--namespace",
                "ci",
                "--exempt-group",
                "ops",
            ],
        ),
    ];
    for (overrides, flags) in cases {
        let chart = template("guard", "ci-tools", &overrides);
        let name = "guard-cds-secret-guard";
        let from_chart = webhooks_of(&chart);
        // The same settings given as flags…
        let printed = printed_webhooks("ci-tools", name, &flags, &[]);
        assert_eq!(
            from_chart,
            webhooks_of(&printed),
            "{overrides}: chart ≠ webhooks {flags:?}"
        );
        // …and as the chart's Deployment gives them to the guard: what the webhooks send
        // is what the guard is configured to check.
        let env = guard_env(&chart);
        let timeout = flags
            .iter()
            .position(|f| *f == "--timeout-seconds")
            .map(|i| flags[i + 1]);
        let timeout_flags: Vec<&str> = timeout.map(|t| vec!["--timeout-seconds", t]).unwrap_or_default();
        let from_env = printed_webhooks("ci-tools", name, &timeout_flags, &env);
        assert_eq!(
            from_chart,
            webhooks_of(&from_env),
            "{overrides}: chart ≠ webhooks with the guard's env"
        );
    }
}

#[test]
fn overlay_webhooks_are_the_charts_for_the_same_settings() {
    // cert-manager: same webhooks, same injection annotation.
    let overlay = kustomize("cert-manager");
    let chart = template(
        "cds-secret-guard",
        "cds-secret-guard",
        &json!({"certificate": {"source": "cert-manager"}}),
    );
    assert_eq!(webhooks_of(&overlay), webhooks_of(&chart));
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        assert_eq!(
            find(&chart, kind, "cds-secret-guard")["metadata"]["annotations"],
            find(&overlay, kind, "cds-secret-guard")["metadata"]["annotations"]
        );
    }
    // namespaced (protects `cds`): the same selector.
    let overlay = kustomize("namespaced");
    let chart = template(
        "cds-secret-guard",
        "cds-secret-guard",
        &json!({"namespaces": ["cds"], "certificate": {"source": "cert-manager"}}),
    );
    assert_eq!(webhooks_of(&overlay), webhooks_of(&chart));
    // tls-secret: the caBundle is the CA given.
    let overlay = tls_secret_overlay();
    let ca = std::fs::read_to_string(repo().join("manifests/overlays/tls-secret/certs/ca.crt")).unwrap();
    let chart = template(
        "cds-secret-guard",
        "cds-secret-guard",
        &json!({"certificate": {"source": "secret", "secret": {"name": "cds-secret-guard-tls", "caBundle": ca}}}),
    );
    assert_eq!(webhooks_of(&overlay), webhooks_of(&chart));
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let bundle = |objects: &[Value]| {
            let encoded = find(objects, kind, "cds-secret-guard")["webhooks"][0]["clientConfig"]["caBundle"]
                .as_str()
                .unwrap()
                .replace('\n', "");
            BASE64.decode(encoded).unwrap()
        };
        assert_eq!(bundle(&chart), ca.as_bytes());
        assert_eq!(bundle(&chart), bundle(&overlay));
    }
}

// --- the same objects as the kustomize manifests ---

#[test]
fn chart_objects_are_the_kustomize_bases() {
    let base = tls_secret_overlay();
    // The overlay's certificate: a secret of the same name, made by Helm here.
    let chart = template(
        "cds-secret-guard",
        "cds-secret-guard",
        &json!({"certificate": {"source": "generate"}}),
    );
    let name = "cds-secret-guard";

    // Every kind of the base but the Namespace (helm install --create-namespace) and the
    // CA secret the overlay keeps for kustomize's sake.
    let mut expected: Vec<String> = kinds(&base)
        .into_iter()
        .filter(|k| k != "Namespace/cds-secret-guard" && k != "Secret/cds-secret-guard-ca")
        .collect();
    expected.sort();
    // Hooks are Helm's alone (the post-install check).
    let chart: Vec<Value> = chart.into_iter().filter(|object| !is_hook(object)).collect();
    assert_eq!(kinds(&chart), expected);

    let pod = |objects: &[Value]| find(objects, "Deployment", name)["spec"]["template"]["spec"].clone();
    let (chart_pod, base_pod) = (pod(&chart), pod(&base));
    for field in [
        "securityContext",
        "serviceAccountName",
        "terminationGracePeriodSeconds",
        "volumes",
    ] {
        assert_eq!(chart_pod[field], base_pod[field], "pod {field}");
    }
    let spread = |pod: &Value| {
        let mut constraint = pod["topologySpreadConstraints"][0].clone();
        constraint.as_object_mut().unwrap().remove("labelSelector");
        constraint
    };
    assert_eq!(spread(&chart_pod), spread(&base_pod));
    assert_eq!(
        chart_pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["app.kubernetes.io/name"],
        name
    );
    let (chart_guard, base_guard) = (&chart_pod["containers"][0], &base_pod["containers"][0]);
    for field in [
        "name",
        "args",
        "ports",
        "readinessProbe",
        "livenessProbe",
        "resources",
        "securityContext",
        "volumeMounts",
    ] {
        assert_eq!(chart_guard[field], base_guard[field], "container {field}");
    }
    // The base's settings, and the defaults said out loud.
    let chart_env = guard_env(&chart);
    for (variable, value) in guard_env(&base) {
        assert_eq!(env_value(&chart_env, &variable), Some(value.as_str()), "{variable}");
    }
    assert_eq!(
        env_value(&chart_env, "CDS_GUARD_EXEMPT_USERS"),
        Some("system:serviceaccount:kube-system:namespace-controller")
    );
    assert_eq!(env_value(&chart_env, "CDS_GUARD_REQUEST_TIMEOUT"), Some("4s"));
    assert_eq!(env_value(&chart_env, "CDS_GUARD_MUTATION_TIMEOUT"), Some("1s"));
    assert_eq!(
        find(&chart, "Deployment", name)["spec"]["replicas"],
        find(&base, "Deployment", name)["spec"]["replicas"]
    );

    for (kind, object, field) in [
        ("ClusterRole", name, "rules"),
        ("ClusterRole", "cds-secret-guard-check", "rules"),
        ("ClusterRoleBinding", name, "subjects"),
        ("ClusterRoleBinding", name, "roleRef"),
        ("Role", "cds-secret-guard-lease", "rules"),
        ("RoleBinding", "cds-secret-guard-lease", "subjects"),
        ("RoleBinding", "cds-secret-guard-lease", "roleRef"),
        ("Lease", name, "spec"),
        ("Service", name, "spec"),
        ("PodDisruptionBudget", name, "spec"),
    ] {
        let strip_selector = |object: &Value| {
            let mut value = object[field].clone();
            // The chart's selectors also name the release (app.kubernetes.io/instance).
            if let Some(spec) = value.as_object_mut() {
                spec.remove("selector");
            }
            value
        };
        assert_eq!(
            strip_selector(find(&chart, kind, object)),
            strip_selector(find(&base, kind, object)),
            "{kind} {object} {field}"
        );
    }
    // The generated certificate's secret is the one the overlay makes, as the guard reads it.
    let secret = find(&chart, "Secret", "cds-secret-guard-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret["type"], find(&base, "Secret", "cds-secret-guard-tls")["type"]);
}

#[test]
fn namespaced_chart_is_the_namespaced_overlay() {
    let overlay = kustomize("namespaced");
    let chart = template(
        "cds-secret-guard",
        "cds-secret-guard",
        &json!({"namespaces": ["cds"], "certificate": {"source": "cert-manager"}}),
    );
    let name = "cds-secret-guard";
    for (kind, object, field) in [
        ("Role", name, "rules"),
        ("Role", name, "metadata"),
        ("RoleBinding", name, "subjects"),
        ("RoleBinding", name, "roleRef"),
        ("ClusterRole", "cds-secret-guard-namespaces", "rules"),
        ("ClusterRoleBinding", "cds-secret-guard-namespaces", "subjects"),
        ("ClusterRole", "cds-secret-guard-check", "rules"),
    ] {
        let pick = |object: &Value| match field {
            "metadata" => object["metadata"]["namespace"].clone(),
            _ => object[field].clone(),
        };
        assert_eq!(
            pick(find(&chart, kind, object)),
            pick(find(&overlay, kind, object)),
            "{kind} {object} {field}"
        );
    }
    // Cluster-wide, nothing but the watched namespaces (and the check role).
    let cluster_roles: Vec<String> = of_kind(&chart, "ClusterRole")
        .iter()
        .filter(|role| !is_hook(role))
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(cluster_roles.len(), 2, "{cluster_roles:?}");
    assert!(!cluster_roles.contains(&name.to_owned()));
    let env = guard_env(&chart);
    assert_eq!(env_value(&env, "CDS_GUARD_NAMESPACES"), Some("cds"));
    assert_eq!(
        env_value(&env, "CDS_GUARD_NAMESPACES"),
        env_value(&guard_env(&overlay), "CDS_GUARD_NAMESPACES")
    );
    // The cert-manager chain is the overlay's.
    for (kind, object) in [
        ("Issuer", "cds-secret-guard-selfsigned"),
        ("Certificate", "cds-secret-guard-ca"),
        ("Issuer", "cds-secret-guard-ca"),
        ("Certificate", "cds-secret-guard"),
    ] {
        assert_eq!(
            find(&chart, kind, object)["spec"],
            find(&overlay, kind, object)["spec"],
            "{kind} {object}"
        );
    }
}

// --- helm lint and template, per value set ---

/// The value sets the chart is linted and rendered with.
fn value_sets() -> Vec<(&'static str, Value)> {
    vec![
        ("default", json!({})),
        ("namespaced", json!({"namespaces": ["cds", "ci"]})),
        ("in-use protection", json!({"inUse": {"enabled": true}})),
        (
            "in-use protection, namespaced",
            json!({"inUse": {"enabled": true}, "namespaces": ["cds"]}),
        ),
        ("cert-manager", json!({"certificate": {"source": "cert-manager"}})),
        (
            "existing secret",
            json!({"certificate": {"source": "secret", "secret": {"name": "my-tls", "caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"}}}),
        ),
        (
            "generated certificate",
            json!({"certificate": {"source": "generate", "generate": {"days": 30}}}),
        ),
        (
            "monitoring",
            json!({"monitoring": {"serviceMonitor": {"enabled": true, "labels": {"release": "prometheus"}},
                                  "prometheusRule": {"enabled": true, "labels": {"release": "prometheus"}}}}),
        ),
        (
            "host network",
            json!({"hostNetwork": true, "ports": {"webhook": 9443, "probes": 9080},
                   "networkPolicy": {"enabled": true, "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}}),
        ),
        (
            "everything else",
            json!({"replicas": 3, "mode": "warn", "gracePeriod": "15m", "exemptions": {"groups": ["cds-admins"]},
                   "webhooks": {"validating": {"failurePolicy": "Ignore", "timeoutSeconds": 3}, "mutating": {"timeoutSeconds": 4}},
                   "extraEnv": [{"name": "RUST_LOG", "value": "debug"}], "podDisruptionBudget": {"enabled": false},
                   "checkRole": {"create": false}, "priorityClassName": "system-cluster-critical",
                   "image": {"repository": "registry.example/cds-secret-guard", "tag": "1.2.3"}}),
        ),
    ]
}

/// docs/security.md's `kubectl auth can-i --list` is what the chart's default roles grant
/// the guard's service account: the same resources, names and verbs, line for line.
#[test]
fn the_rights_security_md_quotes_are_the_charts() {
    use std::collections::{BTreeMap, BTreeSet};
    type Rights = BTreeMap<(String, Vec<String>), BTreeSet<String>>;
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .map(|items| items.iter().map(|item| item.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default()
    };
    let objects = template("cds-secret-guard", "cds-secret-guard", &json!({}));
    let mut granted = Rights::new();
    for binding in of_kind(&objects, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&objects, "RoleBinding"))
    {
        let to_the_guard = binding["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|subject| subject["kind"] == "ServiceAccount" && subject["name"] == "cds-secret-guard");
        if !to_the_guard {
            continue;
        }
        let role = find(
            &objects,
            binding["roleRef"]["kind"].as_str().unwrap(),
            binding["roleRef"]["name"].as_str().unwrap(),
        );
        for rule in role["rules"].as_array().unwrap() {
            let mut names = strings(&rule["resourceNames"]);
            names.sort();
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    let resource = if group.is_empty() {
                        resource
                    } else {
                        format!("{resource}.{group}")
                    };
                    granted
                        .entry((resource, names.clone()))
                        .or_default()
                        .extend(strings(&rule["verbs"]));
                }
            }
        }
    }

    let page = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    let mut quoted = Rights::new();
    for line in page
        .lines()
        .skip_while(|line| !line.starts_with("$ kubectl auth can-i --list"))
        .skip(2) // the command and the header
        .take_while(|line| !line.starts_with("```"))
        .filter(|line| !line.starts_with("selfsubject"))
    {
        let resource = line.split_whitespace().next().unwrap().to_owned();
        let lists: Vec<Vec<String>> = line
            .split('[')
            .skip(1)
            .map(|list| {
                list.split(']')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            })
            .collect();
        let [names, verbs] = <[Vec<String>; 2]>::try_from(lists).unwrap_or_else(|_| panic!("not a can-i line: {line}"));
        quoted.entry((resource, names)).or_default().extend(verbs);
    }
    assert!(
        quoted.len() >= 5,
        "docs/security.md's can-i list was not read: {quoted:?}"
    );
    assert_eq!(
        quoted, granted,
        "docs/security.md quotes other rights than the chart grants"
    );
}

/// Cargo.toml's version is the release's: the chart's version and appVersion (the image
/// tag it defaults to), the kustomize base's image, and a CHANGELOG entry.
#[test]
fn the_release_version_is_cargos_everywhere() {
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap();
    let chart: Value = serde_saphyr::from_str(&read("manifests/helm/cds-secret-guard/Chart.yaml")).unwrap();
    assert_eq!(chart["version"], version);
    assert_eq!(chart["appVersion"], version);
    let base: Value = serde_saphyr::from_str(&read("manifests/base/deployment.yaml")).unwrap();
    assert_eq!(
        base["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("cds-secret-guard:{version}")
    );
    assert!(
        read("CHANGELOG.md")
            .lines()
            .any(|line| line.starts_with(&format!("## [{version}] - "))),
        "CHANGELOG.md has no entry for {version}"
    );
    // What the operator pages install, push and verify is this release.
    let mut named = 0;
    for page in testkit::pages::operator_pages() {
        let text = read(&page);
        for marker in ["--version ", "cds-secret-guard:", "image.tag=", "newTag: \""] {
            for (at, _) in text.match_indices(marker) {
                let release: String = text[at + marker.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                if release.split('.').count() == 3 {
                    named += 1;
                    assert_eq!(release, version, "{page}: {marker}{release}");
                }
            }
        }
    }
    assert!(named >= 15, "the pages name a release {named} times");
}

#[test]
fn chart_lints_strictly_with_every_value_set() {
    for (name, overrides) in value_sets() {
        let file = values(&overrides);
        let output = helm()
            .args(["lint", "--strict", CHART, "-n", "cds-secret-guard", "-f"])
            .arg(&file.path)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm lint {name}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_value_set_renders_what_it_says() {
    for (name, overrides) in value_sets() {
        let objects = template("guard", "ci-tools", &overrides);
        let fullname = "guard-cds-secret-guard";
        let deployment = find(&objects, "Deployment", fullname);
        let volume = &deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"];
        let env = guard_env(&objects);
        let (validating, mutating) = webhooks_of(&objects);
        let bundle = |kind: &str| find(&objects, kind, fullname)["webhooks"][0]["clientConfig"]["caBundle"].clone();
        match name {
            "default" => {
                // The guard's own certificates: its state secret, created empty, rights on
                // it and on the two configurations by name, no volume, no caBundle.
                let state = find(&objects, "Secret", "guard-cds-secret-guard-certificate");
                assert!(state["data"].is_null(), "the guard writes the state");
                assert!(volume.is_null(), "nothing mounted");
                assert_eq!(
                    env_value(&env, "CDS_GUARD_CERTIFICATE_SECRET"),
                    Some("guard-cds-secret-guard-certificate")
                );
                assert_eq!(env_value(&env, "CDS_GUARD_WEBHOOK_CONFIGURATION"), Some(fullname));
                assert_eq!(
                    env_value(&env, "CDS_GUARD_CERTIFICATE_HOSTS"),
                    Some("guard-cds-secret-guard.ci-tools.svc,guard-cds-secret-guard.ci-tools.svc.cluster.local")
                );
                assert_eq!(env_value(&env, "CDS_GUARD_CA_VALIDITY"), Some("5y"));
                assert_eq!(env_value(&env, "CDS_GUARD_LEAF_VALIDITY"), Some("90d"));
                assert_eq!(env_value(&env, "CDS_GUARD_TLS_CERT"), None);
                let role = find(&objects, "Role", "guard-cds-secret-guard-certificate");
                assert_eq!(role["metadata"]["namespace"], "ci-tools");
                assert_eq!(
                    role["rules"],
                    json!([{"apiGroups": [""], "resources": ["secrets"],
                            "resourceNames": ["guard-cds-secret-guard-certificate"],
                            "verbs": ["get", "list", "watch", "update"]}])
                );
                let webhooks = find(&objects, "ClusterRole", "guard-cds-secret-guard-webhooks");
                assert_eq!(
                    webhooks["rules"],
                    json!([{"apiGroups": ["admissionregistration.k8s.io"],
                            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                            "resourceNames": [fullname], "verbs": ["get", "list", "watch", "update"]}])
                );
                for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
                    assert!(bundle(kind).is_null(), "{name}: the guard keeps the caBundle");
                }
                assert!(of_kind(&objects, "Certificate").is_empty());
                // Pod networking, reached on the usual ports, no policy of its own.
                let pod = &deployment["spec"]["template"]["spec"];
                assert!(pod["hostNetwork"].is_null() && deployment["spec"]["strategy"].is_null());
                assert_eq!(env_value(&env, "CDS_GUARD_LISTEN"), Some("0.0.0.0:8443"));
                assert_eq!(env_value(&env, "CDS_GUARD_PROBE_LISTEN"), Some("0.0.0.0:8080"));
                assert!(of_kind(&objects, "NetworkPolicy").is_empty());
                let jobs: Vec<_> = of_kind(&objects, "Job")
                    .into_iter()
                    .filter(|job| !is_wait(job))
                    .collect();
                assert!(jobs.is_empty(), "nothing to release");
                // The post-install check: `wait`, reading the webhooks and the Service by
                // name, from a pod that neither the Service nor the PDB takes for a replica.
                let wait = find(&objects, "Job", "guard-cds-secret-guard-wait");
                assert_eq!(wait["metadata"]["annotations"]["helm.sh/hook"], "post-install");
                let pod = &wait["spec"]["template"];
                assert_eq!(pod["spec"]["containers"][0]["args"][0], "wait");
                let service = find(&objects, "Service", fullname);
                let selected = service["spec"]["selector"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .all(|(label, value)| &pod["metadata"]["labels"][label] == value);
                assert!(!selected, "the Service selects the Job's pod");
                assert_eq!(
                    find(&objects, "ClusterRole", "guard-cds-secret-guard-wait")["rules"],
                    json!([{"apiGroups": ["admissionregistration.k8s.io"],
                            "resources": ["validatingwebhookconfigurations", "mutatingwebhookconfigurations"],
                            "resourceNames": [fullname], "verbs": ["get"]}])
                );
                assert_eq!(
                    find(&objects, "Role", "guard-cds-secret-guard-wait")["rules"],
                    json!([{"apiGroups": [""], "resources": ["services"], "resourceNames": [fullname], "verbs": ["get"]}])
                );
            }
            "host network" => {
                let pod = &deployment["spec"]["template"]["spec"];
                assert_eq!(pod["hostNetwork"], true);
                assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
                // Two replicas never want one node's port at once.
                assert_eq!(
                    deployment["spec"]["strategy"]["rollingUpdate"],
                    json!({"maxSurge": 0, "maxUnavailable": 1})
                );
                assert_eq!(env_value(&env, "CDS_GUARD_LISTEN"), Some("0.0.0.0:9443"));
                assert_eq!(env_value(&env, "CDS_GUARD_PROBE_LISTEN"), Some("0.0.0.0:9080"));
                assert_eq!(
                    pod["containers"][0]["ports"],
                    json!([{"name": "webhook", "containerPort": 9443}, {"name": "probes", "containerPort": 9080}])
                );
                // The Service still answers on 443, to the port by name.
                let service = find(&objects, "Service", fullname);
                assert_eq!(
                    service["spec"]["ports"][0],
                    json!({"name": "webhook", "port": 443, "targetPort": "webhook"})
                );
                let policy = find(&objects, "NetworkPolicy", fullname);
                assert_eq!(
                    policy["spec"]["podSelector"]["matchLabels"],
                    deployment["spec"]["selector"]["matchLabels"]
                );
                assert_eq!(
                    policy["spec"]["ingress"],
                    json!([{"ports": [{"protocol": "TCP", "port": 9443}, {"protocol": "TCP", "port": 9080}],
                            "from": [{"ipBlock": {"cidr": "10.0.0.0/8"}},
                                     // The post-install check calls the guard too.
                                     {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "cds-secret-guard-wait",
                                                                      "app.kubernetes.io/instance": "guard",
                                                                      "app.kubernetes.io/component": "wait"}}}]}])
                );
            }
            "generated certificate" => {
                let secret = find(&objects, "Secret", "guard-cds-secret-guard-tls");
                assert_eq!(volume, "guard-cds-secret-guard-tls");
                for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
                    assert_eq!(
                        bundle(kind),
                        secret["data"]["ca.crt"],
                        "{name}: caBundle is the generated CA"
                    );
                }
                assert!(of_kind(&objects, "ServiceMonitor").is_empty());
                assert!(of_kind(&objects, "PrometheusRule").is_empty());
                assert!(of_kind(&objects, "Certificate").is_empty());
            }
            "namespaced" => {
                let watched = |kind: &str| -> Vec<String> {
                    let mut namespaces: Vec<String> = of_kind(&objects, kind)
                        .iter()
                        .filter(|r| r["metadata"]["name"] == fullname)
                        .map(|r| r["metadata"]["namespace"].as_str().unwrap().to_owned())
                        .collect();
                    namespaces.sort();
                    namespaces
                };
                assert_eq!(watched("Role"), ["cds", "ci"]);
                assert_eq!(watched("RoleBinding"), ["cds", "ci"]);
                // And the Lease's, in the release namespace, whatever the scope.
                let lease = find(&objects, "Role", "guard-cds-secret-guard-lease");
                assert_eq!(lease["metadata"]["namespace"], "ci-tools");
                assert_eq!(
                    of_kind(&objects, "RoleBinding").iter().filter(|b| !is_hook(b)).count(),
                    4,
                    "two namespaces, the Lease and the certificate"
                );
                let names = find(&objects, "ClusterRole", "guard-cds-secret-guard-namespaces");
                assert_eq!(names["rules"][0]["resourceNames"], json!(["cds", "ci"]));
                assert_eq!(env_value(&env, "CDS_GUARD_NAMESPACES"), Some("cds,ci"));
                for webhooks in [&validating, &mutating] {
                    let selector = &webhooks[0]["namespaceSelector"]["matchExpressions"][0];
                    assert_eq!(selector["operator"], "In");
                    assert_eq!(selector["values"], json!(["cds", "ci"]));
                }
            }
            "cert-manager" => {
                assert_eq!(of_kind(&objects, "Certificate").len(), 2);
                assert_eq!(of_kind(&objects, "Issuer").len(), 2);
                assert!(of_kind(&objects, "Secret").is_empty(), "cert-manager makes the secret");
                let serving = find(&objects, "Certificate", fullname);
                assert_eq!(serving["spec"]["secretName"], *volume);
                assert_eq!(
                    serving["spec"]["dnsNames"][0], "guard-cds-secret-guard.ci-tools.svc",
                    "the Service's name"
                );
                for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
                    assert!(bundle(kind).is_null(), "cainjector fills the caBundle");
                    assert_eq!(
                        find(&objects, kind, fullname)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                        "ci-tools/guard-cds-secret-guard-ca"
                    );
                }
            }
            "existing secret" => {
                assert_eq!(volume, "my-tls");
                assert!(of_kind(&objects, "Secret").is_empty(), "the secret is yours");
                assert!(of_kind(&objects, "Certificate").is_empty());
                let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
                assert_eq!(bundle("ValidatingWebhookConfiguration"), BASE64.encode(pem));
            }
            "monitoring" => {
                let monitor = find(&objects, "ServiceMonitor", fullname);
                let service = find(&objects, "Service", fullname);
                assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
                assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
                assert!(
                    service["spec"]["ports"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == "metrics" && p["targetPort"] == "probes")
                );
                assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
                for (label, value) in monitor["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                    assert_eq!(&service["metadata"]["labels"][label], value, "selects the Service");
                }
                // The alerts expect job="cds-secret-guard" whatever the release is called.
                let job_label = monitor["spec"]["jobLabel"].as_str().unwrap();
                assert_eq!(service["metadata"]["labels"][job_label], "cds-secret-guard");
                let rule = find(&objects, "PrometheusRule", fullname);
                assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
                let alerts: Value = serde_saphyr::from_str(
                    &std::fs::read_to_string(repo().join("manifests/monitoring/alerts.yaml")).unwrap(),
                )
                .unwrap();
                assert_eq!(rule["spec"], alerts, "the PrometheusRule carries alerts.yaml");
            }
            "everything else" => {
                assert_eq!(deployment["spec"]["replicas"], 3);
                let container = &deployment["spec"]["template"]["spec"]["containers"][0];
                assert_eq!(container["image"], "registry.example/cds-secret-guard:1.2.3");
                assert_eq!(
                    deployment["spec"]["template"]["spec"]["priorityClassName"],
                    "system-cluster-critical"
                );
                assert_eq!(env_value(&env, "CDS_GUARD_MODE"), Some("warn"));
                assert_eq!(env_value(&env, "CDS_GUARD_GRACE_PERIOD"), Some("15m"));
                assert_eq!(env_value(&env, "CDS_GUARD_EXEMPT_GROUPS"), Some("cds-admins"));
                assert_eq!(env_value(&env, "RUST_LOG"), Some("debug"));
                // The guard answers a second before the apiserver gives up.
                assert_eq!(env_value(&env, "CDS_GUARD_REQUEST_TIMEOUT"), Some("2s"));
                assert_eq!(env_value(&env, "CDS_GUARD_MUTATION_TIMEOUT"), Some("3s"));
                assert_eq!(validating[0]["failurePolicy"], "Ignore");
                assert_eq!(validating[0]["timeoutSeconds"], 3);
                assert_eq!(mutating[0]["timeoutSeconds"], 4);
                assert!(of_kind(&objects, "PodDisruptionBudget").is_empty());
                assert!(
                    of_kind(&objects, "ClusterRole")
                        .iter()
                        .all(|role| role["metadata"]["name"] != "guard-cds-secret-guard-check"),
                    "no check role"
                );
            }
            "in-use protection" | "in-use protection, namespaced" => {
                assert_eq!(env_value(&env, "CDS_GUARD_IN_USE_PROTECTION"), Some("true"));
                assert_eq!(
                    env_value(&env, "CDS_GUARD_IN_USE_MODE"),
                    Some("defer"),
                    "the chart defers"
                );
                let names: Vec<&str> = validating
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|webhook| webhook["name"].as_str().unwrap())
                    .collect();
                assert_eq!(
                    names,
                    [
                        "secret-deletes.cds-secret-guard.io",
                        "in-use-namespaces.cds-secret-guard.io",
                        "in-use-objects.cds-secret-guard.io",
                        "in-use-deferred.cds-secret-guard.io"
                    ]
                );
                for webhook in &validating.as_array().unwrap()[1..] {
                    assert_eq!(webhook["clientConfig"]["service"]["path"], "/validate-in-use");
                    // A held object's delete waits for the guard on its finalizer.
                    let failure_policy = if webhook["name"] == names[3] { "Ignore" } else { "Fail" };
                    assert_eq!(webhook["failurePolicy"], failure_policy);
                }
                let (kind, namespace) = match name {
                    "in-use protection" => ("ClusterRole", None),
                    _ => ("Role", Some("cds")),
                };
                let role = of_kind(&objects, kind)
                    .into_iter()
                    .find(|role| {
                        role["metadata"]["name"] == fullname && role["metadata"]["namespace"].as_str() == namespace
                    })
                    .unwrap();
                let workloads = role["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|rule| rule["apiGroups"] == json!(["apps"]))
                    .unwrap_or_else(|| panic!("{name}: no rule on the workloads in {role}"));
                assert_eq!(workloads["verbs"], json!(["get"]), "{name}: read, never written");
                let config_maps = role["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|rule| rule["resources"] == json!(["configmaps"]))
                    .unwrap_or_else(|| panic!("{name}: no rule on the ConfigMaps in {role}"));
                assert_eq!(
                    config_maps["verbs"],
                    json!(["get", "list", "watch", "patch"]),
                    "{name}: the finalizer of deferred deletes"
                );
                // Once the guard is gone, a Job removes its finalizer, with rights of its
                // own: finding and patching Secrets and ConfigMaps, nothing else.
                let release = "guard-cds-secret-guard-release";
                let job = find(&objects, "Job", release);
                assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "post-delete");
                let pod = &job["spec"]["template"]["spec"];
                assert_eq!(pod["serviceAccountName"], release);
                assert_eq!(pod["containers"][0]["args"], json!(["release-finalizers"]));
                let rules =
                    json!([{"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["list", "patch"]}]);
                let hook_role = of_kind(&objects, kind)
                    .into_iter()
                    .find(|role| role["metadata"]["name"] == release)
                    .unwrap_or_else(|| panic!("{name}: no {kind} {release}"));
                assert_eq!(hook_role["metadata"]["namespace"].as_str(), namespace);
                assert_eq!(hook_role["rules"], rules);
                let scoped = pod["containers"][0]["env"][0]["value"].as_str();
                assert_eq!(scoped, namespace, "{name}: the Job releases where the guard held");
            }
            other => unreachable!("{other}"),
        }
    }
}

#[test]
fn chart_refuses_what_cannot_work() {
    for (overrides, says) in [
        (
            json!({"certificate": {"source": "secret", "secret": {"caBundle": "pem"}}}),
            "certificate.secret.name is required",
        ),
        (
            json!({"certificate": {"source": "secret", "secret": {"name": "tls"}}}),
            "certificate.secret.caBundle",
        ),
        (json!({"certificate": {"source": "vault"}}), "source"),
        (json!({"mode": "block"}), "mode"),
        (
            json!({"webhooks": {"validating": {"timeoutSeconds": 10}}}),
            "timeoutSeconds",
        ),
        (json!({"exemptions": {"users": []}}), "users"),
        // A key the chart does not define, at the top or in any object it defines: a
        // value of another release of the chart, or a typo, is refused, never ignored.
        (json!({"replica": 3}), "'replica' not allowed"),
        (json!({"inUse": {"enabeld": true}}), "'enabeld' not allowed"),
        (
            json!({"certificate": {"guard": {"caValidty": "5y"}}}),
            "'caValidty' not allowed",
        ),
        (
            json!({"monitoring": {"prometheusRule": {"enable": true}}}),
            "'enable' not allowed",
        ),
        (json!({"image": {"digest": "sha256:0"}}), "'digest' not allowed"),
        // Six months is `6months`: `6mo` is no duration the guard reads.
        (json!({"certificate": {"guard": {"caValidity": "6mo"}}}), "caValidity"),
    ] {
        let error = template_error(&overrides);
        assert!(error.contains(says), "{overrides}: {error}");
    }
}

#[tokio::test]
async fn the_guard_serves_the_generated_certificate() {
    let objects = template("guard", "ci-tools", &json!({"certificate": {"source": "generate"}}));
    let secret = find(&objects, "Secret", "guard-cds-secret-guard-tls");
    let dir = tempfile::tempdir().unwrap();
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        let pem = BASE64.decode(secret["data"][file].as_str().unwrap()).unwrap();
        std::fs::write(dir.path().join(file), pem).unwrap();
    }
    let server = Server::new(
        common::config(common::policy(), dir.path()),
        Arc::new(common::FakeCluster::default()),
    );
    let bound = server.bind().await.expect("the guard loads Helm's certificate and key");
    let admission = bound.admission_addr();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(bound.serve(shutdown.clone()));

    // As the apiserver calls it: by the Service's DNS name, trusting the caBundle only.
    let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .tls_built_in_root_certs(false)
        .resolve("guard-cds-secret-guard.ci-tools.svc", admission)
        .build()
        .unwrap();
    let answer: Value = client
        .post(format!(
            "https://guard-cds-secret-guard.ci-tools.svc:{}/validate",
            admission.port()
        ))
        .json(&common::review("secret-delete"))
        .send()
        .await
        .expect("TLS with the generated certificate")
        .json()
        .await
        .unwrap();
    assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");

    shutdown.cancel();
    task.await.unwrap().unwrap();
}

// --- helm install on the real apiserver ---

/// A release installed for a test, uninstalled when dropped (even when the test fails:
/// a `failurePolicy: Fail` webhook with no guard behind it must not outlive the test).
struct Release {
    name: &'static str,
    namespace: &'static str,
}

impl Release {
    fn helm(&self) -> Command {
        let mut command = helm();
        command
            .env("KUBECONFIG", cluster::control_plane())
            .args(["-n", self.namespace]);
        command
    }

    fn uninstall(&self) -> Output {
        self.helm()
            .args(["uninstall", self.name, "--ignore-not-found", "--wait"])
            .output()
            .unwrap()
    }

    /// Installs (or upgrades) with `overrides`; a leftover of an interrupted run goes first.
    fn install(name: &'static str, namespace: &'static str, overrides: &Value) -> Self {
        let release = Self { name, namespace };
        release.uninstall();
        release.upgrade(overrides);
        release
    }

    /// No node runs pods here: the post-install check, which waits for the replicas to
    /// answer, is left out (`tests/node/shipped` runs it).
    fn upgrade(&self, overrides: &Value) {
        let mut overrides = overrides.clone();
        overrides["installCheck"] = json!({"enabled": false});
        let file = values(&overrides);
        run(self
            .helm()
            .args(["upgrade", "--install", self.name, CHART, "--create-namespace", "-f"])
            .arg(&file.path));
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let output = self.uninstall();
        if !output.status.success() && !std::thread::panicking() {
            panic!(
                "helm uninstall {}: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

fn kubectl_json(args: &[&str]) -> Value {
    let output = run(cluster::kubectl().args(args).args(["-o", "json"]));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn exists(args: &[&str]) -> bool {
    let output = run(cluster::kubectl().args(args).args(["--ignore-not-found", "-o", "name"]));
    !output.stdout.is_empty()
}

#[test]
fn chart_installs_upgrades_and_uninstalls_on_the_real_apiserver() {
    let generated = json!({"certificate": {"source": "generate"}});
    let release = Release::install("guard-helm", "cds-secret-guard-helm", &generated);
    let (name, ns) = ("guard-helm-cds-secret-guard", "cds-secret-guard-helm");

    // Everything the apiserver accepted is there (no kubelet: the Deployment has no pods).
    for object in [
        "deployment",
        "service",
        "serviceaccount",
        "poddisruptionbudget",
        "lease",
        "role/guard-helm-cds-secret-guard-lease",
        "rolebinding/guard-helm-cds-secret-guard-lease",
        "secret/guard-helm-cds-secret-guard-tls",
    ] {
        let object = if object.contains('/') {
            object.to_owned()
        } else {
            format!("{object}/{name}")
        };
        assert!(exists(&["-n", ns, "get", &object]), "{object} missing");
    }
    for object in [
        "clusterrole/guard-helm-cds-secret-guard",
        "clusterrole/guard-helm-cds-secret-guard-check",
        "clusterrolebinding/guard-helm-cds-secret-guard",
        "validatingwebhookconfiguration/guard-helm-cds-secret-guard",
        "mutatingwebhookconfiguration/guard-helm-cds-secret-guard",
    ] {
        assert!(exists(&["get", object]), "{object} missing");
    }
    let secret = kubectl_json(&["-n", ns, "get", "secret", "guard-helm-cds-secret-guard-tls"]);
    let webhook = kubectl_json(&["get", "validatingwebhookconfiguration", name]);
    assert_eq!(
        webhook["webhooks"][0]["clientConfig"]["caBundle"],
        secret["data"]["ca.crt"]
    );
    assert_eq!(webhook["webhooks"][0]["failurePolicy"], "Fail");
    // The guard's service account may do what the ClusterRole says, cluster-wide.
    let sa = format!("system:serviceaccount:{ns}:{name}");
    for (verb, resource, allowed) in [
        ("patch", "secrets", "yes"),
        ("watch", "pods", "yes"),
        ("delete", "secrets", "no"),
    ] {
        let output = cluster::kubectl()
            .args(["auth", "can-i", verb, resource, "-n", "default", "--as", &sa])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            allowed,
            "{verb} {resource}"
        );
    }

    // And on its Lease, in the release namespace, what the elector does and nothing more:
    // RBAC cannot limit `create` to a name, so the chart creates the Lease, with no holder.
    for (verb, lease, allowed) in [
        ("get", name, "yes"),
        ("patch", name, "yes"),
        ("delete", name, "no"),
        ("get", "another-lease", "no"),
        ("patch", "another-lease", "no"),
    ] {
        let output = cluster::kubectl()
            .args(["auth", "can-i", verb, &format!("leases.coordination.k8s.io/{lease}")])
            .args(["-n", ns, "--as", &sa])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            allowed,
            "{verb} lease {lease}"
        );
    }
    let output = cluster::kubectl()
        .args([
            "auth",
            "can-i",
            "create",
            "leases.coordination.k8s.io",
            "-n",
            ns,
            "--as",
            &sa,
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "no", "create leases");
    let lease = kubectl_json(&["-n", ns, "get", "lease", name]);
    assert_eq!(
        lease["spec"]["holderIdentity"],
        Value::Null,
        "no holder until a replica runs"
    );

    // An upgrade keeps the generated certificate (read back with lookup): a new one would
    // change the caBundle before the replicas reload their files.
    release.upgrade(&json!({"replicas": 3, "certificate": {"source": "generate"}}));
    let upgraded = kubectl_json(&["-n", ns, "get", "secret", "guard-helm-cds-secret-guard-tls"]);
    assert_eq!(upgraded["data"], secret["data"], "certificate kept across upgrades");
    let deployment = kubectl_json(&["-n", ns, "get", "deployment", name]);
    assert_eq!(deployment["spec"]["replicas"], 3);

    // Uninstall leaves no webhook behind.
    let output = release.uninstall();
    assert!(output.status.success(), "{output:?}");
    for object in [
        "validatingwebhookconfiguration/guard-helm-cds-secret-guard",
        "mutatingwebhookconfiguration/guard-helm-cds-secret-guard",
        "clusterrole/guard-helm-cds-secret-guard",
    ] {
        assert!(!exists(&["get", object]), "{object} left behind");
    }
    for object in ["lease", "role", "rolebinding"] {
        let object = format!("{object}/{name}{}", if object == "lease" { "" } else { "-lease" });
        assert!(!exists(&["-n", ns, "get", &object]), "{object} left behind");
    }
}

/// With the default `certificate.source: guard`, what the guard writes (the caBundle of
/// both configurations, its state secret's data) survives `helm upgrade`: the chart
/// writes neither, so Helm's three-way merge leaves them alone. Uninstall removes the
/// state and the rights.
#[test]
fn an_upgrade_keeps_what_the_guard_wrote_and_uninstall_removes_its_state() {
    let release = Release::install("guard-renew", "cds-secret-guard-renew", &json!({}));
    let (name, ns) = ("guard-renew-cds-secret-guard", "cds-secret-guard-renew");
    let state = format!("{name}-certificate");
    let created = kubectl_json(&["-n", ns, "get", "secret", &state]);
    assert!(created["data"].is_null(), "created empty");

    // What the guard would write: a bundle into each webhook, its state into the secret.
    let bundle = BASE64.encode("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    for kind in ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"] {
        let patch = json!([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]);
        run(cluster::kubectl().args(["patch", kind, name, "--type", "json", "-p", &patch.to_string()]));
    }
    let data = json!({"data": {"ca.crt": BASE64.encode("ca"), "tls.crt": BASE64.encode("leaf")}});
    run(cluster::kubectl().args(["-n", ns, "patch", "secret", &state, "-p", &data.to_string()]));

    release.upgrade(&json!({"replicas": 3, "gracePeriod": "20m"}));
    for kind in ["validatingwebhookconfiguration", "mutatingwebhookconfiguration"] {
        let webhook = kubectl_json(&["get", kind, name]);
        assert_eq!(
            webhook["webhooks"][0]["clientConfig"]["caBundle"], bundle,
            "{kind} kept"
        );
    }
    let upgraded = kubectl_json(&["-n", ns, "get", "secret", &state]);
    assert_eq!(upgraded["data"], data["data"], "state kept across upgrades");
    let deployment = kubectl_json(&["-n", ns, "get", "deployment", name]);
    assert_eq!(deployment["spec"]["replicas"], 3, "the upgrade did happen");

    let output = release.uninstall();
    assert!(output.status.success(), "{output:?}");
    assert!(!exists(&["-n", ns, "get", "secret", &state]), "state left behind");
    assert!(!exists(&["-n", ns, "get", "role", &state]), "role left behind");
    assert!(
        !exists(&["get", "clusterrole", &format!("{name}-webhooks")]),
        "clusterrole left behind"
    );
}

#[test]
fn namespaced_chart_installs_with_roles_only() {
    for namespace in ["helm-watched-a", "helm-watched-b", "helm-unwatched"] {
        let _ = cluster::kubectl()
            .args(["create", "namespace", namespace])
            .output()
            .unwrap();
    }
    // An existing TLS secret and its CA (certificate.source=secret).
    let (ns, name) = ("cds-secret-guard-helm-ns", "guard-helm-ns-cds-secret-guard");
    let dir = tempfile::tempdir().unwrap();
    certs::write(dir.path(), &[format!("{name}.{ns}.svc")]).unwrap();
    let _ = cluster::kubectl().args(["create", "namespace", ns]).output().unwrap();
    let _ = cluster::kubectl()
        .args(["-n", ns, "delete", "secret", "my-guard-tls", "--ignore-not-found"])
        .output()
        .unwrap();
    run(cluster::kubectl()
        .args(["-n", ns, "create", "secret", "tls", "my-guard-tls", "--cert"])
        .arg(dir.path().join("tls.crt"))
        .arg("--key")
        .arg(dir.path().join("tls.key")));
    let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();

    let release = Release::install(
        "guard-helm-ns",
        ns,
        &json!({"namespaces": ["helm-watched-a", "helm-watched-b"],
                "certificate": {"source": "secret", "secret": {"name": "my-guard-tls", "caBundle": ca}}}),
    );
    let webhook = kubectl_json(&["get", "validatingwebhookconfiguration", name]);
    let bundle = webhook["webhooks"][0]["clientConfig"]["caBundle"].as_str().unwrap();
    assert_eq!(BASE64.decode(bundle).unwrap(), ca.as_bytes());
    let selector = &webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0];
    assert_eq!(selector["operator"], "In");
    assert!(
        !exists(&["get", &format!("clusterrole/{name}")]),
        "no cluster-wide role"
    );

    // What the apiserver's RBAC grants the guard's service account.
    let sa = format!("system:serviceaccount:{ns}:{name}");
    for (args, allowed) in [
        (vec!["patch", "secrets", "-n", "helm-watched-a"], "yes"),
        (vec!["watch", "pods", "-n", "helm-watched-b"], "yes"),
        (vec!["get", "namespace/helm-watched-a"], "yes"),
        (vec!["patch", "secrets", "-n", "helm-unwatched"], "no"),
        (vec!["list", "secrets", "--all-namespaces"], "no"),
        (vec!["get", "namespace/helm-unwatched"], "no"),
    ] {
        let output = cluster::kubectl()
            .args(["auth", "can-i"])
            .args(&args)
            .args(["--as", &sa])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            allowed,
            "can-i {args:?}"
        );
    }
    drop(release);
    assert!(!exists(&["get", &format!("validatingwebhookconfiguration/{name}")]));
    assert!(!exists(&["-n", "helm-watched-a", "get", &format!("role/{name}")]));
}
