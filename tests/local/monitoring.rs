//! Monitoring: the alerting rules (`manifests/monitoring/alerts.yaml`) pass `promtool check
//! rules`, and their unit tests (`alerts_test.yaml`) pass `promtool test rules` with every
//! alert shown firing and quiet; the chart ships the same rules; and every metric, label and
//! label value that the alerts and the Grafana dashboard (`dashboard.json`) query is one the
//! guard really exports, read from the `/metrics` of a guard served in-process.
//!
//! promtool comes from `hack/tools/build.sh` (`make test` runs it); without it the tests
//! fail, never skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use testkit::fake as common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
    sync::Arc,
    time::Duration,
};

use cds_secret_guard::{Server, certs};
use common::*;
use serde_json::Value;

const ALERTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/monitoring/alerts.yaml");
const ALERT_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/monitoring/alerts_test.yaml");
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/monitoring/dashboard.json");
const CHART_ALERTS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/manifests/helm/cds-secret-guard/files/alerts.yaml"
);

/// Labels a Prometheus scrape of the guard adds (ServiceMonitor: job, namespace, pod).
const SCRAPE_LABELS: [&str; 4] = ["job", "namespace", "pod", "instance"];
/// Series Prometheus makes itself for every target: `up` is 1 when the scrape worked.
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

fn promtool() -> Command {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/promtool");
    assert!(
        path.exists(),
        "{} is missing: run hack/tools/build.sh (make test does); this test never skips",
        path.display()
    );
    Command::new(path)
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn alert_rules() -> Vec<Value> {
    yaml(ALERTS)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|group| group["rules"].as_array().unwrap().clone())
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    let check = promtool()
        .args(["check", "rules", ALERTS, CHART_ALERTS])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "promtool check rules:\n{stdout}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        stdout.contains(&format!("SUCCESS: {} rules found", alert_rules().len())),
        "{stdout}"
    );

    // Run from the tests' folder: they name alerts.yaml relative to it.
    let test = promtool()
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(Path::new(ALERT_TESTS).parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "promtool test rules:\n{stdout}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(stdout.contains("SUCCESS"), "{stdout}");
}

#[test]
fn every_alert_is_tested_firing_and_quiet() {
    let tests = yaml(ALERT_TESTS);
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_array().unwrap())
        .collect();
    for rule in alert_rules() {
        let name = rule["alert"].as_str().unwrap();
        let of_this: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let fires = of_this
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()));
        let quiet = of_this
            .iter()
            .any(|c| c["exp_alerts"].as_array().is_some_and(Vec::is_empty));
        assert!(fires, "{name}: no test shows it firing");
        assert!(quiet, "{name}: no test shows it quiet");
        for field in ["summary", "description"] {
            assert!(rule["annotations"][field].is_string(), "{name} lacks a {field}");
        }
        assert!(rule["labels"]["severity"].is_string(), "{name} lacks a severity");
    }
}

#[test]
fn the_chart_ships_the_same_rules() {
    let same = std::fs::read_to_string(CHART_ALERTS).unwrap() == std::fs::read_to_string(ALERTS).unwrap();
    assert!(
        same,
        "the chart's rules differ: cp manifests/monitoring/alerts.yaml {CHART_ALERTS}"
    );
}

#[test]
fn dashboard_shows_decisions_latency_lookups_adoptions_and_the_certificate() {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let titles: Vec<String> = panels
        .iter()
        .map(|p| p["title"].as_str().unwrap().to_lowercase())
        .collect();
    for topic in ["decisions", "latency", "lookups", "adoption", "certificate"] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel on {topic}: {titles:?}"
        );
    }
    let mut ids = BTreeSet::new();
    for panel in panels {
        assert!(ids.insert(panel["id"].as_u64().unwrap()), "panel ids are unique");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            assert!(target["expr"].as_str().is_some_and(|e| !e.is_empty()));
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "queries use the chosen data source"
            );
        }
    }
}

// --- every queried metric is exported ---

/// A series selector in a query: `metric{label op "value", …}` or a bare `metric`.
#[derive(Debug)]
struct Selector {
    metric: String,
    matchers: Vec<(String, String, String)>,
}

/// What a PromQL expression reads: its selectors and the labels it groups by. A small
/// scanner, enough for our own queries: identifiers followed by `{` or `[`, or named
/// `cds_secret_guard_…`, are metrics; `by (…)` and `without (…)` list labels.
fn scan(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let chars: Vec<char> = expr.chars().collect();
    let (mut selectors, mut grouping) = (Vec::new(), Vec::new());
    let mut i = 0;
    let skip_string = |mut i: usize| {
        i += 1;
        while i < chars.len() && chars[i] != '"' {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i = skip_string(i);
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == '_') || (i > 0 && (chars[i - 1] == '$' || chars[i - 1].is_ascii_digit())) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
            i += 1;
        }
        let ident: String = chars[start..i].iter().collect();
        let mut next = i;
        while next < chars.len() && chars[next] == ' ' {
            next += 1;
        }
        let following = chars.get(next).copied();
        if (ident == "by" || ident == "without") && following == Some('(') {
            let close = next + chars[next..].iter().position(|&c| c == ')').unwrap();
            let list: String = chars[next + 1..close].iter().collect();
            grouping.extend(list.split(',').map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()));
            i = close + 1;
        } else if following == Some('{') {
            let mut end = next + 1;
            while chars[end] != '}' {
                end = if chars[end] == '"' { skip_string(end) } else { end + 1 };
            }
            let body: String = chars[next + 1..end].iter().collect();
            selectors.push(Selector {
                metric: ident,
                matchers: matchers(&body),
            });
            i = end + 1;
        } else if following == Some('[') || ident.starts_with("cds_secret_guard_") {
            selectors.push(Selector {
                metric: ident,
                matchers: Vec::new(),
            });
        }
    }
    (selectors, grouping)
}

/// `label="v", label=~"re"` → (label, op, value).
fn matchers(body: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let op_at = rest.find(['=', '!']).unwrap();
        let label = rest[..op_at].trim().to_owned();
        let op_len =
            if rest[op_at..].starts_with("=~") || rest[op_at..].starts_with("!~") || rest[op_at..].starts_with("!=") {
                2
            } else {
                1
            };
        let op = rest[op_at..op_at + op_len].to_owned();
        let value_start = op_at + op_len + rest[op_at + op_len..].find('"').unwrap() + 1;
        let value_len = rest[value_start..].find('"').unwrap();
        out.push((label, op, rest[value_start..value_start + value_len].to_owned()));
        rest = rest[value_start + value_len + 1..].trim_start_matches([',', ' ']);
    }
    out
}

#[test]
fn the_scanner_finds_selectors_and_grouping() {
    let (selectors, grouping) = scan(
        r#"histogram_quantile(0.99, sum by (endpoint, le) (rate(a_bucket{job="j", endpoint=~"v|m"}[$__rate_interval]))) > 3 or min by (pod) (cds_secret_guard_x) - time() + absent(up{job="j"} == 1) + rate(b_total[5m])"#,
    );
    let metrics: Vec<&str> = selectors.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(metrics, ["a_bucket", "cds_secret_guard_x", "up", "b_total"]);
    assert_eq!(
        selectors[0].matchers,
        [
            ("job".into(), "=".into(), "j".into()),
            ("endpoint".into(), "=~".into(), "v|m".into())
        ]
    );
    assert_eq!(grouping, ["endpoint", "le", "pod"]);
}

/// Every query of the alerts and the dashboard (panels and template variables).
fn queries() -> Vec<(String, String)> {
    let mut queries: Vec<(String, String)> = alert_rules()
        .iter()
        .map(|rule| {
            (
                format!("alert {}", rule["alert"]),
                rule["expr"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(definition) = variable["definition"].as_str() {
            queries.push((format!("variable {}", variable["name"]), definition.to_owned()));
        }
    }
    queries
}

/// Sample name → the label sets it was exported with.
fn samples(metrics: &str) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut samples: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, matchers(rest.rsplit_once('}').unwrap().0)),
            None => (line.split(' ').next().unwrap(), Vec::new()),
        };
        samples
            .entry(name.to_owned())
            .or_default()
            .push(labels.into_iter().map(|(k, _, v)| (k, v)).collect());
    }
    samples
}

/// The guard's `/metrics` after it has answered a secret delete it denies as too young,
/// one it denies because its lookups fail, a worker pod's creation, a certificate
/// rotation and a rotation to a broken file: every family then has samples.
async fn exported_metrics() -> String {
    let dir = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned()];
    certs::write(dir.path(), &hosts).unwrap();
    let server = Server::new(config(policy(), dir.path()), Arc::new(FakeCluster::failing()));
    let bound = server.bind().await.unwrap();
    let (admission, probes) = (bound.admission_addr(), bound.probe_addr());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(bound.serve(shutdown.clone()));

    let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .tls_built_in_root_certs(false)
        .build()
        .unwrap();
    let young = young_delete();
    for (path, body) in [
        ("/validate", young),
        ("/validate", review("secret-delete")),
        ("/mutate", review("pod-create")),
    ] {
        let response = client
            .post(format!("https://localhost:{}{path}", admission.port()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
    let metrics_url = format!("http://{probes}/metrics");
    let scrape = || async { reqwest::get(&metrics_url).await.unwrap().text().await.unwrap() };
    let reloaded = |text: &str, result: &str| {
        counter(
            text,
            "cds_secret_guard_certificate_reloads_total",
            &[("result", result)],
        ) > 0.0
    };

    // A rotation (same CA, new serving certificate), then a broken certificate file.
    certs::write(dir.path(), &hosts).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !reloaded(&scrape().await, "success") {
        assert!(tokio::time::Instant::now() < deadline, "no reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    let mut text = scrape().await;
    while !reloaded(&text, "error") {
        assert!(tokio::time::Instant::now() < deadline, "no failed reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
        text = scrape().await;
    }
    shutdown.cancel();
    task.await.unwrap().unwrap();
    text
}

#[tokio::test]
async fn alerts_and_dashboard_query_only_what_the_guard_exports() {
    let exported = samples(&exported_metrics().await);
    let guard_labels: BTreeSet<&str> = exported
        .values()
        .flatten()
        .flat_map(|labels| labels.keys().map(String::as_str))
        .collect();
    let mut used = BTreeSet::new();
    for (query, expr) in queries() {
        let (selectors, grouping) = scan(&expr);
        assert!(!selectors.is_empty(), "{query}: no series in {expr}");
        for selector in selectors {
            let metric = selector.metric.as_str();
            used.insert(metric.to_owned());
            if PROMETHEUS_SERIES.contains(&metric) {
                for (label, _, _) in &selector.matchers {
                    assert!(
                        SCRAPE_LABELS.contains(&label.as_str()),
                        "{query}: {metric} has no label {label}"
                    );
                }
                continue;
            }
            let series = exported
                .get(metric)
                .unwrap_or_else(|| panic!("{query}: the guard exports no {metric}; it has {:?}", exported.keys()));
            for (label, op, value) in &selector.matchers {
                if SCRAPE_LABELS.contains(&label.as_str()) {
                    continue;
                }
                assert!(
                    series.iter().any(|labels| labels.contains_key(label)),
                    "{query}: {metric} has no label {label}"
                );
                if op == "=" {
                    assert!(
                        series.iter().any(|labels| labels.get(label) == Some(value)),
                        "{query}: {metric} never has {label}=\"{value}\": {series:?}"
                    );
                }
            }
        }
        for label in grouping {
            assert!(
                guard_labels.contains(label.as_str()) || SCRAPE_LABELS.contains(&label.as_str()),
                "{query}: groups by {label}, which no series has"
            );
        }
    }
    // Not vacuous: the queries name (nearly) every family the guard exports.
    let families: BTreeSet<&str> = [
        "admission_decisions_total",
        "admission_duration_seconds_bucket",
        "lookup_duration_seconds_count",
        "lookup_errors_total",
        "certificate_reloads_total",
        "certificate_expiry_timestamp_seconds",
        "reconcile_errors_total",
        "owner_references_added_total",
        "owner_reference_conflicts_total",
        "adoption_latency_seconds_bucket",
        "build_info",
    ]
    .into();
    for family in families {
        assert!(
            used.contains(&format!("cds_secret_guard_{family}")),
            "nothing shows {family}"
        );
    }
}
