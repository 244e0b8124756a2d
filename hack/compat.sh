#!/usr/bin/env bash
# `make compat`: every suite that needs a control plane, on each Kubernetes release given
# (default: the Makefile's COMPAT_VERSIONS), then a summary table.
#
#   hack/compat.sh v1.30.14 v1.36.3 v1.37.2
#
# For each release, in turn: `down` whatever control plane this checkout runs, then
#   1. `K8S_VERSION=<release> cluster.sh up --no-node`, the apiserver's /version checked to
#      be that release, then the suites `make test` runs against the control plane
#      (COMPAT_SUITES: end to end, ownerReferences, outage, trust, the namespaced install,
#      the lagging watch, the race, the chart);
#   2. `cluster.sh up --node` and the shipped suite (`cargo test --test shipped`);
#   3. `cluster.sh down`.
# A release that fails goes on to the next; the exit status is non-zero if any failed.
# Logs: target/compat/<release>.{up,suites,node}.log; the table also goes to
# target/compat/summary.md.
#
# Env: CDS_NODE_LOCK, a file: step 2 and 3 run under `flock` on it, for a machine where
#   another checkout may want the node (there can be one node per machine: the bridge,
#   the kubelet's ports, iptables). CDS_CP_* ports as cluster.sh reads them.
#   COMPAT_SUITES overrides the list of step 1.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cluster="$repo/hack/controlplane/cluster.sh"
out="$repo/target/compat"
read -ra suites <<<"${COMPAT_SUITES:-e2e e2e_owners e2e_outage e2e_trust e2e_scoped e2e_lagging_watch race helm}"

log() { echo "compat.sh: $*" >&2; }
die() {
	log "ERROR: $*"
	exit 1
}

# minutes SECONDS: "m:ss".
minutes() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# step NAME LOG COMMAND...: runs it with its output in LOG; prints "pass" or "FAIL" and
# the seconds it took.
step() {
	local name=$1 file=$2 t=$SECONDS
	shift 2
	log "$name ($file)"
	if "$@" >"$file" 2>&1; then
		echo "pass $((SECONDS - t))"
	else
		tail -n 40 "$file" >&2
		log "$name failed; see $file"
		echo "FAIL $((SECONDS - t))"
	fi
}

# The control plane of RELEASE and its /version.
up() {
	K8S_VERSION=$1 "$cluster" up --no-node || return 1
	local served
	served="$("$repo/target/controlplane/bin/kubectl" --kubeconfig "$repo/target/controlplane/kubeconfig" \
		get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')"
	echo "the apiserver serves $served"
	[[ "$served" == "$1" ]] || {
		echo "asked for $1, the apiserver is $served"
		return 1
	}
}

# The node and the shipped suite, then down (under CDS_NODE_LOCK when set).
node_run() {
	local rc=0
	"$cluster" up --node && cargo test --locked --test shipped || rc=$?
	"$cluster" down || rc=$?
	return "$rc"
}

cd "$repo"
if [[ "${1:-}" == --node-run ]]; then # compat.sh itself, under flock
	node_run
	exit
fi
(($# > 0)) || die "usage: $0 VERSION... (e.g. v1.30.14 v1.36.3 v1.37.2)"
mkdir -p "$out"

# What every release shares, built once so the times below are the releases' own: the
# tools (helm, toxiproxy) and the test binaries.
hack/tools/build.sh
test_args=()
for suite in "${suites[@]}"; do test_args+=(--test "$suite"); done
cargo test --locked --no-run "${test_args[@]}" --test shipped

rows=()
failed=0
for version in "$@"; do
	t0=$SECONDS
	"$cluster" down >/dev/null 2>&1 || "$cluster" down
	read -r up_result up_time < <(step "$version: control plane" "$out/$version.up.log" up "$version")
	suites_result=skipped suites_time=0 node_result=skipped node_time=0
	if [[ "$up_result" == pass ]]; then
		read -r suites_result suites_time < <(step "$version: ${suites[*]}" "$out/$version.suites.log" \
			cargo test --locked "${test_args[@]}")
		if [[ -n "${CDS_NODE_LOCK:-}" ]]; then
			log "$version: waiting for the node lock $CDS_NODE_LOCK"
			read -r node_result node_time < <(step "$version: node, shipped" "$out/$version.node.log" \
				flock "$CDS_NODE_LOCK" "$0" --node-run)
		else
			read -r node_result node_time < <(step "$version: node, shipped" "$out/$version.node.log" node_run)
		fi
	fi
	"$cluster" down >/dev/null 2>&1 || "$cluster" down || true
	[[ "$up_result $suites_result $node_result" == "pass pass pass" ]] || failed=1
	rows+=("| $version | $up_result ($(minutes "$up_time")) | $suites_result ($(minutes "$suites_time")) | $node_result ($(minutes "$node_time")) | $(minutes $((SECONDS - t0))) |")
done

{
	echo "Kubernetes releases, $(date -u +%Y-%m-%d), commit $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD || echo ' (with uncommitted changes)'):"
	echo
	echo "| release | control plane up | suites on it: ${suites[*]} | node + shipped | total |"
	echo "|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
exit "$failed"
