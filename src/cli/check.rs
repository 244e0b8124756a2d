//! `cds-secret-guard check`: the state of every protected secret in a running system,
//! the report's "check the CDS_WORKER_NAME label" step. For each secret: its worker and
//! age, the worker's pod by quorum read and its phase, the ownerReference, the labels
//! where pod and secret disagree, and a verdict.

use std::{fmt::Write as _, time::Duration};

use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp};
use kube::{Api, Client, api::ListParams};
use serde::Serialize;

use crate::{
    Result, cluster,
    rules::worker::pod::PodState,
    rules::worker::reads::KubeLookup,
    rules::worker::{Settings, WorkerPods, pod_owners, secret_age},
};

/// What `check` concludes about one secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// A live pod of the worker uses it, and they agree.
    Protected,
    /// No live pod of the worker exists.
    Orphan,
    /// A pod of the worker exists, but labels or the ownerReference disagree with it.
    Mismatched,
}

/// The ownerReference of a secret, compared with its worker's pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerState {
    /// No Pod ownerReference (yet).
    None,
    /// It names the worker's pod and its UID.
    Ok,
    /// It names a pod UID that is not the worker's pod.
    Stale,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Protected => "protected",
            Self::Orphan => "orphan",
            Self::Mismatched => "mismatched",
        }
    }
}

impl OwnerState {
    fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ok => "ok",
            Self::Stale => "stale",
        }
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Namespace.
    pub namespace: String,
    /// Secret name.
    pub secret: String,
    /// The worker it belongs to.
    pub worker: String,
    /// Age in seconds.
    pub age_seconds: u64,
    /// The worker's pod, if found.
    pub pod: Option<String>,
    /// That pod's phase (`Terminating` when it is being deleted).
    pub phase: Option<String>,
    /// The ownerReference state.
    pub owner: OwnerState,
    /// Labels that differ between secret and pod, as `LABEL: secret≠pod`.
    pub mismatches: Vec<String>,
    /// The conclusion.
    pub verdict: Verdict,
}

/// Checks the protected secrets of one namespace, or of all when `namespace` is `None`.
/// The worker's pods are found by the same quorum reads and judged live by the same
/// rule as the policy's rule 5.
pub async fn run(client: Client, policy: &Settings, namespace: Option<&str>) -> Result<Vec<Report>> {
    let secrets: Api<Secret> = cluster::api_in(client.clone(), namespace);
    // Quorum reads (no resourceVersion), metadata only: no secret data is fetched.
    let listed = secrets.list_metadata(&ListParams::default()).await?;
    let lookup = KubeLookup::new(client);
    let now = Timestamp::now();
    let mut reports = Vec::new();
    for secret in listed.items.into_iter().map(|partial| partial.metadata) {
        let Some(worker) = policy.worker_of_secret(&secret) else {
            continue;
        };
        let namespace = secret.namespace.clone().unwrap_or_default();
        let pods = WorkerPods::read(&lookup, policy, &namespace, &worker).await?;
        reports.push(classify(policy, &secret, &worker, &pods, now));
    }
    reports.sort_by(|a, b| (&a.namespace, &a.secret).cmp(&(&b.namespace, &b.secret)));
    Ok(reports)
}

/// The report for one secret and its worker's pods: the live one if any (as rule 5 sees
/// it), else the one named after the worker.
pub fn classify(policy: &Settings, secret: &ObjectMeta, worker: &str, pods: &WorkerPods, now: Timestamp) -> Report {
    let age = secret_age(secret, now);
    let live = pods.live();
    let shown = live.or(pods.namesake.as_ref());
    let owner_uids: Vec<&str> = pod_owners(secret).map(|owner| owner.uid.as_str()).collect();
    let owner = match (owner_uids.is_empty(), live) {
        (true, _) => OwnerState::None,
        (false, Some(pod)) if owner_uids.contains(&pod.uid.as_str()) => OwnerState::Ok,
        _ => OwnerState::Stale,
    };

    let mut mismatches = Vec::new();
    if let Some(pod) = live {
        let label = |labels: Option<&std::collections::BTreeMap<String, String>>, key: &str| {
            labels.and_then(|l| l.get(key)).cloned()
        };
        let pod_worker = label(Some(&pod.labels), &policy.worker_label);
        if pod_worker.as_deref() != Some(worker) {
            mismatches.push(format!(
                "{}: {worker}≠{}",
                policy.worker_label,
                pod_worker.as_deref().unwrap_or("(none)")
            ));
        }
        let (secret_hatchery, pod_hatchery) = (
            label(secret.labels.as_ref(), &policy.hatchery_label),
            label(Some(&pod.labels), &policy.hatchery_label),
        );
        if secret_hatchery.is_some() && secret_hatchery != pod_hatchery {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".to_owned());
            mismatches.push(format!(
                "{}: {}≠{}",
                policy.hatchery_label,
                show(&secret_hatchery),
                show(&pod_hatchery)
            ));
        }
    }

    let verdict = match live {
        None => Verdict::Orphan,
        Some(_) if !mismatches.is_empty() || owner == OwnerState::Stale => Verdict::Mismatched,
        Some(_) => Verdict::Protected,
    };
    let phase = shown.map(|pod: &PodState| match (pod.terminating, &pod.phase) {
        (true, _) => "Terminating".to_owned(),
        (false, phase) => phase.clone().unwrap_or_else(|| "Pending".to_owned()),
    });
    Report {
        namespace: secret.namespace.clone().unwrap_or_default(),
        secret: secret.name.clone().unwrap_or_default(),
        worker: worker.to_owned(),
        age_seconds: age.as_secs(),
        pod: shown.map(|pod| pod.name.clone()),
        phase,
        owner,
        mismatches,
        verdict,
    }
}

/// The report as aligned columns.
pub fn table(reports: &[Report]) -> String {
    let header = [
        "NAMESPACE",
        "SECRET",
        "WORKER",
        "AGE",
        "POD",
        "PHASE",
        "OWNER",
        "MISMATCH",
        "VERDICT",
    ];
    let rows: Vec<[String; 9]> = reports
        .iter()
        .map(|r| {
            [
                r.namespace.clone(),
                r.secret.clone(),
                r.worker.clone(),
                humantime::format_duration(Duration::from_secs(r.age_seconds))
                    .to_string()
                    .replace(' ', ""),
                r.pod.clone().unwrap_or_else(|| "-".to_owned()),
                r.phase.clone().unwrap_or_else(|| "-".to_owned()),
                r.owner.as_str().to_owned(),
                if r.mismatches.is_empty() {
                    "-".to_owned()
                } else {
                    r.mismatches.join(", ")
                },
                r.verdict.as_str().to_owned(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header.map(str::to_owned)).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    use super::*;
    use crate::{
        fixtures::{policy, worker_pod},
        rules::worker::pod::PodState,
    };

    fn secret(labels: &[(&str, &str)], owner_uid: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("cds-worker-config-w1".to_owned()),
            namespace: Some("cds".to_owned()),
            creation_timestamp: Some(Time(Timestamp::now() - Duration::from_secs(90))),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            owner_references: owner_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: "w1".into(),
                    uid: uid.into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    fn pod(labels: &[(&str, &str)]) -> PodState {
        let mut pod = labels
            .iter()
            .fold(worker_pod("w1"), |pod, (k, v)| pod.label(k, v))
            .build();
        pod.metadata.uid = Some("uid-1".to_owned());
        PodState::from(&pod)
    }

    fn check(secret: ObjectMeta, namesake: Option<PodState>) -> Report {
        let pods = WorkerPods {
            namesake,
            labelled: Vec::new(),
        };
        classify(&policy(), &secret, "w1", &pods, Timestamp::now())
    }

    #[test]
    fn verdicts() {
        let labels = [("CDS_WORKER_NAME", "w1"), ("CDS_HATCHERY_NAME", "h1")];

        let protected = check(secret(&labels, Some("uid-1")), Some(pod(&labels)));
        assert_eq!(
            (protected.verdict, protected.owner),
            (Verdict::Protected, OwnerState::Ok)
        );
        assert_eq!(protected.age_seconds, 90);

        let not_yet_owned = check(secret(&labels, None), Some(pod(&labels)));
        assert_eq!(
            (not_yet_owned.verdict, not_yet_owned.owner),
            (Verdict::Protected, OwnerState::None)
        );

        let orphan = check(secret(&labels, None), None);
        assert_eq!((orphan.verdict, orphan.pod.clone()), (Verdict::Orphan, None));

        let unlabelled = check(secret(&labels, None), Some(pod(&[])));
        assert_eq!(unlabelled.verdict, Verdict::Mismatched);
        assert_eq!(
            unlabelled.mismatches,
            ["CDS_WORKER_NAME: w1≠(none)", "CDS_HATCHERY_NAME: h1≠(none)"]
        );

        let stale_owner = check(secret(&labels, Some("uid-old")), Some(pod(&labels)));
        assert_eq!(
            (stale_owner.verdict, stale_owner.owner),
            (Verdict::Mismatched, OwnerState::Stale)
        );

        let finished = check(
            secret(&labels, None),
            Some(PodState {
                phase: Some("Succeeded".into()),
                ..pod(&labels)
            }),
        );
        assert_eq!(
            (finished.verdict, finished.phase.as_deref()),
            (Verdict::Orphan, Some("Succeeded"))
        );

        let table = table(&[protected, orphan]);
        assert!(table.starts_with("NAMESPACE"), "{table}");
        assert!(
            table.lines().nth(2).is_some_and(|line| line.ends_with("orphan")),
            "{table}"
        );
    }

    /// The same choice as rule 5: a live labelled pod counts, a finished namesake does not.
    #[test]
    fn a_live_labelled_pod_beats_a_finished_namesake() {
        let labels = [("CDS_WORKER_NAME", "w1")];
        let mut other = pod(&labels);
        other.name = "w1-retry".into();
        other.uid = "uid-2".into();
        let pods = WorkerPods {
            namesake: Some(PodState {
                phase: Some("Failed".into()),
                ..pod(&labels)
            }),
            labelled: vec![
                PodState {
                    phase: Some("Succeeded".into()),
                    ..other.clone()
                },
                other,
            ],
        };
        let report = classify(&policy(), &secret(&labels, None), "w1", &pods, Timestamp::now());
        assert_eq!(
            (report.verdict, report.pod.as_deref()),
            (Verdict::Protected, Some("w1-retry"))
        );
    }
}
