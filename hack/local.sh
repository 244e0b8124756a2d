#!/usr/bin/env bash
# Runs the guard against the local control plane, the way it runs outside a cluster:
#
#   hack/local.sh up     build what is missing, start the control plane and the guard,
#                        register the webhooks, print what to try
#   hack/local.sh down   unregister, stop the guard and the control plane
#
# Certificates go to certs/ (git-ignored); the rest lives in target/local/: guard.log,
# guard.pid, webhooks.yaml, and guard.kubeconfig (the guard's service account, bound to
# manifests/base/rbac.yaml; its token lasts 24 h: run `make run` again after that).
# Env: CDS_GUARD_GRACE_PERIOD (default 10m here too), CDS_GUARD_LISTEN (127.0.0.1:8443),
# CDS_GUARD_PROBE_LISTEN (127.0.0.1:8080).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="$repo/target/local"
certs="$repo/certs"
guard="$repo/target/release/cds-secret-guard"
cluster="$repo/tests/controlplane/cluster.sh"
listen="${CDS_GUARD_LISTEN:-127.0.0.1:8443}"
probes="${CDS_GUARD_PROBE_LISTEN:-127.0.0.1:8080}"

log() { echo "local.sh: $*" >&2; }

guard_pid() { # the recorded pid, if that process is alive and is our guard
	[[ -f "$state/guard.pid" ]] || return 1
	local pid
	pid="$(<"$state/guard.pid")"
	[[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n1)" == "$guard" ]] || return 1
	echo "$pid"
}

up() {
	mkdir -p "$state"
	log "building the guard (release)"
	(cd "$repo" && cargo build --release --locked --quiet)
	"$cluster" up
	eval "$("$cluster" env)"

	if pid="$(guard_pid)"; then
		log "guard already running (pid $pid), restarting it with this build"
		kill -TERM "$pid"
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
	fi
	"$guard" certs --out "$certs" --host 127.0.0.1 --host localhost >/dev/null
	# The guard runs as its service account, with the shipped role and nothing more.
	kubectl create namespace cds-secret-guard --dry-run=client -o yaml | kubectl apply -f - >/dev/null
	kubectl -n cds-secret-guard apply -f "$repo/manifests/base/rbac.yaml" >/dev/null
	"$cluster" sa-kubeconfig cds-secret-guard cds-secret-guard "$state/guard.kubeconfig"
	KUBECONFIG="$state/guard.kubeconfig" \
		CDS_GUARD_LISTEN="$listen" CDS_GUARD_PROBE_LISTEN="$probes" \
		CDS_GUARD_TLS_CERT="$certs/tls.crt" CDS_GUARD_TLS_KEY="$certs/tls.key" \
		setsid "$guard" serve >>"$state/guard.log" 2>&1 </dev/null &
	echo $! >"$state/guard.pid"
	for _ in $(seq 100); do
		curl -fsS "http://$probes/readyz" >/dev/null 2>&1 && break
		guard_pid >/dev/null || { tail -n 20 "$state/guard.log" >&2; log "the guard exited"; exit 1; }
		sleep 0.1
	done
	curl -fsS "http://$probes/readyz" >/dev/null || { log "the guard is not ready; see $state/guard.log"; exit 1; }

	"$guard" webhooks --url "https://$listen" --ca-bundle "$certs/ca.crt" >"$state/webhooks.yaml"
	kubectl apply -f "$state/webhooks.yaml" >/dev/null
	log "guard running (pid $(<"$state/guard.pid")), registered with the apiserver"

	cat <<TRY

The guard protects cds-worker-config-* secrets on the local control plane. Try:

  eval "\$($cluster env)"
  kubectl create namespace demo
  kubectl -n demo create secret generic cds-worker-config-w1 --from-literal=CDS_CONFIG=token
  kubectl -n demo delete secret cds-worker-config-w1        # refused: too young
  kubectl -n demo run w1 --image=ovhcom/cds-worker --restart=Never \\
      --overrides='{"spec":{"containers":[{"name":"w1","image":"ovhcom/cds-worker","envFrom":[{"secretRef":{"name":"cds-worker-config-w1"}}]}]}}'
  kubectl -n demo get pod w1 --show-labels                   # CDS_WORKER_NAME=w1 injected
  tail -f $state/guard.log                                   # JSON audit lines
  curl -s http://$probes/metrics

Stop everything with: hack/local.sh down   (or: make down)
TRY
}

down() {
	if [[ -f "$repo/target/controlplane/kubeconfig" ]] && "$cluster" status >/dev/null 2>&1; then
		eval "$("$cluster" env)"
		kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard \
			--ignore-not-found --wait=false >/dev/null 2>&1 || true
	fi
	if pid="$(guard_pid)"; then
		kill -TERM "$pid"
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
		log "guard stopped (pid $pid)"
	fi
	rm -f "$state/guard.pid"
	"$cluster" down
}

case "${1:-}" in
up) up ;;
down) down ;;
*)
	echo "usage: $0 up|down" >&2
	exit 2
	;;
esac
