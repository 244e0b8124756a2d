#!/usr/bin/env bash
# `make run`: the guard as users run it, on the local control plane with its node.
#
#   hack/local.sh up          the control plane and its node (cluster.sh up --node), the
#                             image (make image) loaded onto the node, the Helm chart
#                             installed from it (two replicas behind their Service), then
#                             what to try
#   hack/local.sh up --host   the guard as a process on the host instead (no node, no
#                             image: faster), registered by URL, as a service account
#                             bound to manifests/base/rbac.yaml (its token lasts 24 h)
#   hack/local.sh down        the webhooks first (they fail closed), then the guard and
#                             the control plane
#   hack/local.sh clear       what holds the chart's names outside a release: the e2e
#                             suites' shipped role, an `up --host` guard's (both `up`s
#                             start with it)
#
# Host mode: certificates in certs/ (git-ignored), the rest in target/local/ (guard.log,
# guard.pid, webhooks.yaml, guard.kubeconfig). Env: CDS_GUARD_GRACE_PERIOD (default 10m
# here too), CDS_GUARD_LISTEN (127.0.0.1:8443), CDS_GUARD_PROBE_LISTEN (127.0.0.1:8080).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="$repo/target/local"
certs="$repo/certs"
guard="$repo/target/release/cds-secret-guard"
cluster="$repo/hack/controlplane/cluster.sh"
helm="$repo/target/tools/bin/helm"
listen="${CDS_GUARD_LISTEN:-127.0.0.1:8443}"
probes="${CDS_GUARD_PROBE_LISTEN:-127.0.0.1:8080}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)"

log() { echo "local.sh: $*" >&2; }

guard_pid() { # the recorded pid, if that process is alive and is our guard
	[[ -f "$state/guard.pid" ]] || return 1
	local pid
	pid="$(<"$state/guard.pid")"
	[[ "$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n1)" == "$guard" ]] || return 1
	echo "$pid"
}

stop_host_guard() {
	local pid
	if pid="$(guard_pid)"; then
		kill -TERM "$pid"
		while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
		log "guard stopped (pid $pid)"
	fi
	rm -f "$state/guard.pid"
}

# The e2e suites run the guard as its shipped role under the chart's own names (namespace
# and service account cds-secret-guard), and so does `up --host`: Helm refuses to adopt
# those objects. Without a release, they and their webhooks go; a release is left alone.
clear_unreleased() {
	if [[ -x "$helm" ]] && "$helm" status cds-secret-guard -n cds-secret-guard >/dev/null 2>&1; then
		return 0
	fi
	kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard \
		--ignore-not-found >/dev/null
	kubectl -n cds-secret-guard delete --ignore-not-found --wait -f "$repo/manifests/base/rbac.yaml" >/dev/null
	# tests/controlplane/e2e_renewal.rs applies the chart's renewal rights (and removes them itself).
	kubectl delete --ignore-not-found --wait clusterrolebinding/cds-secret-guard-check \
		clusterrolebinding/cds-secret-guard-webhooks clusterrole/cds-secret-guard-webhooks \
		namespace/cds-secret-guard >/dev/null
}

# The real thing: node, image, chart.
up() {
	local t0=$SECONDS
	"$cluster" up --node
	eval "$("$cluster" env)"
	stop_host_guard
	# helm: not the release's tools (cosign, cargo-cyclonedx), which `make run` never uses.
	"$repo/hack/tools/build.sh" test >/dev/null
	clear_unreleased
	"$repo/hack/image.sh"
	"$cluster" image-load "cds-secret-guard:$version"
	log "installing the chart (image cds-secret-guard:$version, two replicas)"
	"$helm" upgrade --install cds-secret-guard "$repo/manifests/helm/cds-secret-guard" \
		--namespace cds-secret-guard --create-namespace \
		--set image.tag="$version" --set image.pullPolicy=Never --wait --timeout 3m >/dev/null
	kubectl -n cds-secret-guard get pods -o wide
	log "ready in $((SECONDS - t0))s"

	cat <<TRY

The guard runs as two pods on the local node and protects cds-worker-config-* secrets.
Try:

  eval "\$($cluster env)"
  kubectl create namespace demo
  kubectl -n demo create secret generic cds-worker-config-w1 --from-literal=CDS_CONFIG=token
  kubectl -n demo delete secret cds-worker-config-w1        # refused: too young
  kubectl -n demo run w1 --image=local/busybox:1.35.0 --image-pull-policy=Never --restart=Never \\
      --overrides='{"spec":{"containers":[{"name":"w1","image":"local/busybox:1.35.0","imagePullPolicy":"Never","command":["sh","-c","echo \$CDS_CONFIG; sleep 600"],"envFrom":[{"secretRef":{"name":"cds-worker-config-w1"}}]}]}}'
  kubectl -n demo get pod w1 --show-labels                   # Running, CDS_WORKER_NAME=w1 injected
  kubectl -n demo get secret cds-worker-config-w1 -o jsonpath='{.metadata.ownerReferences}'
  kubectl -n cds-secret-guard logs -l app.kubernetes.io/name=cds-secret-guard   # JSON audit lines
  curl -s http://\$(kubectl -n cds-secret-guard get pod -l app.kubernetes.io/name=cds-secret-guard -o jsonpath='{.items[0].status.podIP}'):8080/metrics

Stop everything with: hack/local.sh down   (or: make down)
TRY
}

# A guard process on the host, registered by URL.
up_host() {
	mkdir -p "$state"
	log "building the guard (release)"
	(cd "$repo" && cargo build --release --locked --quiet)
	"$cluster" up
	eval "$("$cluster" env)"
	stop_host_guard
	# A chart-installed guard holds the names this one takes.
	if [[ -x "$helm" ]]; then
		"$helm" uninstall cds-secret-guard -n cds-secret-guard --ignore-not-found --wait >/dev/null
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

The guard protects cds-worker-config-* secrets on the local control plane (no node: pods
stay Pending). Try:

  eval "\$($cluster env)"
  kubectl create namespace demo
  kubectl -n demo create secret generic cds-worker-config-w1 --from-literal=CDS_CONFIG=token
  kubectl -n demo delete secret cds-worker-config-w1        # refused: too young
  tail -f $state/guard.log                                   # JSON audit lines
  curl -s http://$probes/metrics

Stop everything with: hack/local.sh down   (or: make down)
TRY
}

down() {
	if [[ -f "$repo/target/controlplane/kubeconfig" ]] && "$cluster" status >/dev/null 2>&1; then
		eval "$("$cluster" env)"
		# The webhooks fail closed: they go before the guard does.
		if [[ -x "$helm" ]]; then
			"$helm" uninstall cds-secret-guard -n cds-secret-guard --ignore-not-found --wait >/dev/null 2>&1 || true
		fi
		kubectl delete validatingwebhookconfiguration,mutatingwebhookconfiguration cds-secret-guard \
			--ignore-not-found --wait=false >/dev/null 2>&1 || true
	fi
	stop_host_guard
	"$cluster" down
}

case "${1:-} ${2:-}" in
"up ") up ;;
"up --host") up_host ;;
"down ") down ;;
"clear ")
	eval "$("$cluster" env)"
	clear_unreleased
	;;
*)
	echo "usage: $0 up [--host] | down" >&2
	exit 2
	;;
esac
