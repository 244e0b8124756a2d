#!/usr/bin/env bash
# Draws docs/dashboard.png: the panels of manifests/monitoring/dashboard.json, from a real
# run. It starts a guard (debug build) against the local control plane, registers it,
# runs a small CDS-like load for a few minutes (hack/dashboard.py: worker secrets and
# pods, cleanups that delete too early, pods that end, orphans), scrapes the guard's
# /metrics every 2 s, and plots the same queries with matplotlib (from PyPI, in a venv
# under target/dashboard).
#
#   hack/dashboard.sh [SECONDS]      default 180
#
# The scrapes are kept in target/dashboard/scrapes.json; to redraw from them:
#   target/dashboard/venv/bin/python hack/dashboard.py --replay --scrapes target/dashboard/scrapes.json \
#     --metrics - --dashboard manifests/monitoring/dashboard.json --out docs/dashboard.png
#
# It registers the webhooks under the usual name (cds-secret-guard), so it replaces
# `make run`'s registration, and removes it at the end: run `make run` again after it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="$repo/target/dashboard"
guard="$repo/target/debug/cds-secret-guard"
cluster="$repo/tests/controlplane/cluster.sh"
seconds="${1:-180}"
log() { echo "dashboard.sh: $*" >&2; }

mkdir -p "$state"
(cd "$repo" && cargo build --locked --quiet --bin cds-secret-guard)
"$cluster" up
eval "$("$cluster" env)"

# matplotlib is not in the machine's Python: a venv of our own, made once.
if [[ ! -x "$state/venv/bin/python" ]] || ! "$state/venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
	log "installing matplotlib into $state/venv"
	python3 -m venv "$state/venv"
	"$state/venv/bin/pip" install --quiet 'matplotlib==3.10.*'
fi

# Free loopback ports for the guard (the OS picks them; we release and reuse them).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
listen="127.0.0.1:$(free_port)"
probes="127.0.0.1:$(free_port)"

"$guard" certs --out "$state/certs" --host 127.0.0.1 --host localhost >/dev/null
# As its service account, with the shipped role (as `make run` does).
kubectl create namespace cds-secret-guard --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n cds-secret-guard apply -f "$repo/manifests/base/rbac.yaml" >/dev/null
"$cluster" sa-kubeconfig cds-secret-guard cds-secret-guard "$state/guard.kubeconfig"
# A short grace period, so that a few minutes show every decision.
KUBECONFIG="$state/guard.kubeconfig" CDS_GUARD_LISTEN="$listen" CDS_GUARD_PROBE_LISTEN="$probes" \
	CDS_GUARD_TLS_CERT="$state/certs/tls.crt" CDS_GUARD_TLS_KEY="$state/certs/tls.key" \
	CDS_GUARD_GRACE_PERIOD=20s \
	"$guard" serve >"$state/guard.log" 2>&1 &
guard_pid=$!
cleanup() {
	kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard \
		--ignore-not-found >/dev/null 2>&1 || true
	kill -TERM "$guard_pid" 2>/dev/null || true
	wait "$guard_pid" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 100); do
	curl -fsS "http://$probes/readyz" >/dev/null 2>&1 && break
	sleep 0.1
done
"$guard" webhooks --url "https://$listen" --ca-bundle "$state/certs/ca.crt" | kubectl apply -f - >/dev/null

log "load for ${seconds}s, scraping http://$probes/metrics"
mkdir -p "$repo/docs"
"$state/venv/bin/python" "$repo/hack/dashboard.py" \
	--metrics "http://$probes/metrics" --seconds "$seconds" \
	--dashboard "$repo/manifests/monitoring/dashboard.json" --out "$repo/docs/dashboard.png" \
	--scrapes "$state/scrapes.json"
log "wrote docs/dashboard.png"
