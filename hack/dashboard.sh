#!/usr/bin/env bash
# `make dashboard`: draws docs/dashboard.png from a real Prometheus, and shows the
# guard-down alert firing in it.
#
#   hack/dashboard.sh [SECONDS]      load for SECONDS, default 180
#
# 1. Two guard replicas (debug build) run on the host against the local control plane, as
#    the guard's service account with the shipped role; the webhooks are registered at the
#    first replica's URL (a Service would do no better: the apiserver keeps one HTTP/2
#    connection); both run the reconciler's pod watch, and the holder of the shipped
#    Lease (manifests/base/lease.yaml) adds the ownerReferences, as in the chart.
# 2. A Prometheus built from the same module and version as promtool
#    (hack/tools/build.sh prometheus, cached) scrapes both replicas' /metrics every 5 s,
#    from a static scrape config: job cds-secret-guard, and the labels namespace and pod a
#    ServiceMonitor would give them. It loads manifests/monitoring/alerts.yaml as it ships
#    (rule_files) and evaluates it every 5 s.
# 3. hack/dashboard.py runs a CDS-like load for SECONDS (worker secrets and pods, cleanups
#    that delete too early, pods that end, orphans, two certificate renewals), then
#    asks Prometheus each panel's own query of manifests/monitoring/dashboard.json
#    (/api/v1/query_range) and draws the answers with matplotlib (from PyPI, in a venv
#    under target/dashboard). It fails if a query returns no data.
# 4. The webhooks are removed and every replica is stopped; the run waits until
#    /api/v1/alerts shows CdsSecretGuardDown firing (its `for: 5m` unchanged: about 5 min)
#    and fails if it does not.
#
# Prometheus's answers are kept in target/dashboard/answers.json, the alert in
# target/dashboard/alerts.json; to redraw from the answers:
#   target/dashboard/venv/bin/python hack/dashboard.py draw --replay --answers target/dashboard/answers.json \
#     --dashboard manifests/monitoring/dashboard.json --out docs/dashboard.png
#
# Ports (all on 127.0.0.1) are free ones picked by the OS, unless set:
#   CDS_DASHBOARD_GUARD_PORTS   four ports: replica 0's TLS and probe ports, then replica 1's
#   CDS_DASHBOARD_PROMETHEUS_PORT
# The control plane is started with `hack/controlplane/cluster.sh up` (its CDS_CP_* ports)
# unless it runs. The webhooks are registered under the usual name (cds-secret-guard), so
# the run refuses to start while another guard's are registered there (the Helm chart's,
# e.g. `make run`'s, or `hack/local.sh up --host`'s; it says which and how to stop it), and
# removes only the webhooks it registered.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="$repo/target/dashboard"
guard="$repo/target/debug/cds-secret-guard"
prometheus="$repo/target/tools/bin/prometheus"
cluster="$repo/hack/controlplane/cluster.sh"
seconds="${1:-180}"
scrape_interval=5
replicas=2
log() { echo "dashboard.sh: $*" >&2; }

mkdir -p "$state"
"$cluster" up
eval "$("$cluster" env)"

# Another guard registered under the usual name: this run would replace its webhooks, then
# delete them. Refuse, before the builds.
for kind in validatingwebhookconfiguration mutatingwebhookconfiguration; do
	found="$(kubectl get "$kind" cds-secret-guard --ignore-not-found -o name)"
	[[ -n "$found" ]] || continue
	owner="$(kubectl get "$kind" cds-secret-guard -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}|{.metadata.annotations.meta\.helm\.sh/release-name}|{.metadata.annotations.meta\.helm\.sh/release-namespace}')"
	IFS='|' read -r managed_by release release_ns <<<"$owner"
	if [[ "$managed_by" == Helm ]]; then
		log "$kind cds-secret-guard exists: a guard installed by the Helm chart (release ${release:-?} in namespace ${release_ns:-?}, e.g. make run's) is registered on this control plane"
		log "stop it first: helm uninstall ${release:-cds-secret-guard} -n ${release_ns:-cds-secret-guard}, or make down (which stops the control plane too)"
	else
		log "$kind cds-secret-guard exists: another guard (e.g. hack/local.sh up --host's, the kustomize install's, or a make dashboard that was killed) is registered on this control plane"
		log "stop it first: make down for hack/local.sh's (it stops the control plane too); else, once no guard uses them: kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard"
	fi
	exit 1
done

(cd "$repo" && cargo build --locked --quiet --bin cds-secret-guard)
"$repo/hack/tools/build.sh" prometheus

# matplotlib is not in the machine's Python: a venv of our own, made once.
if [[ ! -x "$state/venv/bin/python" ]] || ! "$state/venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
	log "installing matplotlib into $state/venv"
	python3 -m venv "$state/venv"
	"$state/venv/bin/pip" install --quiet 'matplotlib==3.10.*'
fi
python="$state/venv/bin/python"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
if [[ -n "${CDS_DASHBOARD_GUARD_PORTS:-}" ]]; then
	read -r -a ports <<<"$CDS_DASHBOARD_GUARD_PORTS"
	((${#ports[@]} == 2 * replicas)) || {
		log "CDS_DASHBOARD_GUARD_PORTS: $((2 * replicas)) ports, not '${CDS_DASHBOARD_GUARD_PORTS}'"
		exit 2
	}
else
	ports=()
	for _ in $(seq $((2 * replicas))); do ports+=("$(free_port)"); done
fi
prometheus_listen="127.0.0.1:${CDS_DASHBOARD_PROMETHEUS_PORT:-$(free_port)}"

"$guard" certs --out "$state/certs" --host 127.0.0.1 --host localhost >/dev/null
# As its service account, with the shipped role (as `hack/local.sh up --host` does).
kubectl create namespace cds-secret-guard --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n cds-secret-guard apply -f "$repo/manifests/base/rbac.yaml" >/dev/null
kubectl -n cds-secret-guard apply -f "$repo/manifests/base/lease.yaml" >/dev/null
"$cluster" sa-kubeconfig cds-secret-guard cds-secret-guard "$state/guard.kubeconfig"

guard_pids=()
prometheus_pid=""
registered=""
stop_guards() {
	local pid
	for pid in "${guard_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in "${guard_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
	guard_pids=()
}
cleanup() {
	if [[ -n "$registered" ]]; then
		kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard \
			--ignore-not-found >/dev/null 2>&1 || true
	fi
	stop_guards
	if [[ -n "$prometheus_pid" ]]; then
		kill -TERM "$prometheus_pid" 2>/dev/null || true
		wait "$prometheus_pid" 2>/dev/null || true
	fi
}
trap cleanup EXIT

# A short grace period, so that a few minutes show every decision.
targets=""
for i in $(seq 0 $((replicas - 1))); do
	listen="127.0.0.1:${ports[$((2 * i))]}"
	probes="127.0.0.1:${ports[$((2 * i + 1))]}"
	KUBECONFIG="$state/guard.kubeconfig" CDS_GUARD_LISTEN="$listen" CDS_GUARD_PROBE_LISTEN="$probes" \
		CDS_GUARD_TLS_CERT="$state/certs/tls.crt" CDS_GUARD_TLS_KEY="$state/certs/tls.key" \
		CDS_GUARD_GRACE_PERIOD=20s CDS_GUARD_LEASE=cds-secret-guard CDS_GUARD_LEASE_IDENTITY="cds-secret-guard-$i" \
		"$guard" serve >"$state/guard-$i.log" 2>&1 &
	guard_pids+=($!)
	for _ in $(seq 100); do
		curl -fsS "http://$probes/readyz" >/dev/null 2>&1 && break
		sleep 0.1
	done
	curl -fsS "http://$probes/readyz" >/dev/null || {
		log "replica $i is not ready; see $state/guard-$i.log"
		exit 1
	}
	if ((i == 0)); then first="$listen"; fi
	targets+="      - targets: ['$probes']
        labels: {namespace: cds-secret-guard, pod: cds-secret-guard-$i}
"
done
# create, not apply: a configuration registered since the check above is never taken over.
"$guard" webhooks --url "https://$first" --ca-bundle "$state/certs/ca.crt" | kubectl create -f - >/dev/null
registered=1

# Prometheus: a fresh TSDB each run.
rm -rf "$state/prometheus"
mkdir -p "$state/prometheus"
cat >"$state/prometheus/prometheus.yml" <<EOF
# Written by hack/dashboard.sh.
global:
  scrape_interval: ${scrape_interval}s
  scrape_timeout: ${scrape_interval}s
  evaluation_interval: 5s
rule_files:
  - $repo/manifests/monitoring/alerts.yaml
scrape_configs:
  - job_name: cds-secret-guard
    static_configs:
$targets
EOF
"$prometheus" --config.file="$state/prometheus/prometheus.yml" --storage.tsdb.path="$state/prometheus/data" \
	--web.listen-address="$prometheus_listen" >"$state/prometheus/prometheus.log" 2>&1 &
prometheus_pid=$!
for _ in $(seq 300); do
	curl -fsS "http://$prometheus_listen/-/ready" >/dev/null 2>&1 && break
	kill -0 "$prometheus_pid" 2>/dev/null || {
		tail -n 20 "$state/prometheus/prometheus.log" >&2
		log "prometheus exited"
		exit 1
	}
	sleep 0.1
done
curl -fsS "http://$prometheus_listen/-/ready" >/dev/null || {
	log "prometheus is not ready; see $state/prometheus/prometheus.log"
	exit 1
}
log "prometheus on http://$prometheus_listen scrapes ${replicas} replicas; load for ${seconds}s"

mkdir -p "$repo/docs"
"$python" "$repo/hack/dashboard.py" draw \
	--prometheus "http://$prometheus_listen" --seconds "$seconds" --scrape-interval "$scrape_interval" \
	--rotate "'$guard' certs --out '$state/certs' --host 127.0.0.1 --host localhost" \
	--dashboard "$repo/manifests/monitoring/dashboard.json" --out "$repo/docs/dashboard.png" \
	--answers "$state/answers.json"
log "wrote docs/dashboard.png"

# Every replica stopped: the webhooks first (they fail closed, and the load's namespace is
# still being deleted), then the guards.
kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard >/dev/null
registered=""
stop_guards
log "every replica stopped at $(date -u +%H:%M:%SZ); waiting for CdsSecretGuardDown (for: 5m)"
"$python" "$repo/hack/dashboard.py" alert --prometheus "http://$prometheus_listen" \
	--name CdsSecretGuardDown --timeout 420 >"$state/alerts.json"
cat "$state/alerts.json"
log "CdsSecretGuardDown fired; kept in target/dashboard/alerts.json"
