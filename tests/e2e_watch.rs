//! End-to-end: rule 5's label half answered from the guard's pod watch, on the real
//! control plane. While worker pods change, the watch catches up with the revision of the
//! read by name and answers for the labelled pods without a label LIST; a pod labelled
//! with the worker and created just before the delete keeps the secret every time; a
//! quiet watch is not trusted and the guard lists by label.
#![allow(clippy::unwrap_used)]

#[path = "e2e/harness.rs"]
mod harness;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use harness::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const FROM_WATCH: &str = r#"cds_secret_guard_worker_label_reads_total{source="watch"}"#;
const FROM_APISERVER: &str = r#"cds_secret_guard_worker_label_reads_total{source="apiserver"}"#;

/// Workers whose secrets are deleted while the watch moves: half of them have a pod,
/// labelled with the worker but named otherwise, created just before the delete.
const WORKERS: usize = 20;

fn labelled_pod(name: &str, worker: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"CDS_WORKER_NAME": worker}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_pod_watch_answers_for_labels_once_current_and_never_misses_a_new_pod() {
    let guard = shared_guard();
    let ns = TestNamespace::new("watch").await;
    ns.worker_secret("quiet").await;
    for i in 0..WORKERS {
        ns.worker_secret(&format!("wl-{i}")).await;
    }
    tokio::time::sleep(GRACE + Duration::from_secs(1)).await;

    // A quiet watch proves nothing: the label half is a LIST.
    let (watch_before, apiserver_before) = (guard.metric(FROM_WATCH).await, guard.metric(FROM_APISERVER).await);
    ns.delete_secret("cds-worker-config-quiet", &DeleteParams::default())
        .await
        .expect("an orphan's secret is deleted");
    assert_eq!(
        guard.metric(FROM_WATCH).await,
        watch_before,
        "a quiet watch is not trusted"
    );
    assert_eq!(guard.metric(FROM_APISERVER).await, apiserver_before + 1.0);

    // Worker pods changing: a labelled pod whose annotation changes every 5 ms.
    ns.pods()
        .create(&PostParams::default(), &labelled_pod("churn", "churn"))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = tokio::spawn({
        let (pods, stop) = (ns.pods(), stop.clone());
        async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let patch = json!({"metadata": {"annotations": {"churn": n.to_string()}}});
                pods.patch("churn", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let watch_before = guard.metric(FROM_WATCH).await;
    for i in 0..WORKERS {
        let (worker, secret) = (format!("wl-{i}"), format!("cds-worker-config-wl-{i}"));
        if i % 2 == 0 {
            // Created at once before the delete: the watch must have shown it.
            let helper = format!("helper-{i}");
            ns.pods()
                .create(&PostParams::default(), &labelled_pod(&helper, &worker))
                .await
                .unwrap();
            let refused = ns
                .delete_secret(&secret, &DeleteParams::default())
                .await
                .expect_err("a labelled pod keeps the secret");
            assert_eq!(refused.code, 403, "{refused:?}");
            assert!(
                refused.message.contains(&format!("pod {helper} (uid")),
                "{}",
                refused.message
            );
        } else {
            ns.delete_secret(&secret, &DeleteParams::default())
                .await
                .expect("an orphan's secret is deleted");
        }
    }
    let from_watch = guard.metric(FROM_WATCH).await - watch_before;
    stop.store(true, Ordering::Relaxed);
    let changes = churn.await.unwrap();
    eprintln!("{from_watch} of {WORKERS} label halves from the watch, {changes} pod changes meanwhile");

    for i in (0..WORKERS).step_by(2) {
        let audit = guard
            .audit_line(&ns.name, &format!("cds-worker-config-wl-{i}"), "deny")
            .await;
        assert_eq!(audit["reason"], "pod-live");
        assert_eq!(audit["pod"], format!("helper-{i}"));
    }
    // Every decision is right whichever way it read; most read from the watch (a slow
    // machine may leave the watch more than its catch-up wait behind now and then).
    assert!(
        from_watch >= (WORKERS / 2) as f64,
        "{from_watch} of {WORKERS} label halves from the watch ({changes} pod changes meanwhile)"
    );
}
